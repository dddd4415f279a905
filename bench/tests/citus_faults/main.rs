//! Faults of a Citus cluster under load, each on a cluster of its own (the
//! Citus harness's private cluster: a coordinator and two workers): a
//! worker stopped and started, a worker cut off (its packets dropped) and
//! let back, a shard moved between workers, and a third
//! worker added and the shards rebalanced onto it. The server runs
//! in-process on the coordinator's database; clients record every call,
//! and the history checker (`idempotency_bench::history`) reads the
//! history after a final read of every key. Skipped, loudly, where Citus
//! is not installed (`bash .ci/citus`); CI fails instead. Run with
//! `cargo test -p idempotency-bench --test citus_faults -- --nocapture`
//! to see what each fault looked like to callers.

#[allow(dead_code)]
#[path = "../faults/client.rs"]
mod client;
mod cut_off;
// Shared with the server's Citus tests; each uses part of it.
#[allow(dead_code)]
#[path = "../../../tests/citus/harness.rs"]
mod harness;
mod listening;
mod load;
#[allow(dead_code)]
#[path = "../../../tests/citus/placement.rs"]
mod placement;
// The proxy of the single-node fault tests, here in front of one worker.
#[allow(dead_code)]
#[path = "../faults/proxy.rs"]
mod proxy;
mod rebalance;
mod server_log;
mod setup;
#[path = "../../../tests/api/helpers/skip.rs"]
mod skip;
mod worker_down;

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

mod cut_off;
mod listening;
mod load;
mod rebalance;
mod server_log;
mod setup;
mod worker_down;

// Shared with the server's Citus tests and the single-node fault tests.
use test_support::citus::{harness, placement};
use test_support::faults::{client, proxy};

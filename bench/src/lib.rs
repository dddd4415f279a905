//! The coordinator's benchmark and its history checker, beside the server
//! (which knows nothing of them): they use the server's library as any
//! program built on it would.
//!
//! # Layout
//!
//! - [`history`]: histories of calls (JSON lines) and the checker that holds
//!   them to the coordinator's promises (results kept, one result per
//!   record, fencing tokens growing, one live lease per key, every PROCEED
//!   accounted for). Pure: it parses and checks, and does no I/O.
//! - [`recorder`]: calls and their answers as history entries, and the final
//!   read of a key straight from the database.
//! - `src/bin/idempotency-bench/`: the load generator, `idempotency-bench`
//!   (its `//!` documentation says what each scenario measures); with
//!   `--record-history` it writes a history, and `check-history` checks one.
//! - `tests/faults/`: the fault suite. Real server processes on a
//!   PostgreSQL of their own behind a proxy that breaks the network, under
//!   load that records a history, which the checker then reads.
//! - `tests/citus_faults/`: the same on a Citus cluster of the test's own
//!   (the server's Citus harness): a worker stopped, a shard moved, a
//!   worker added and the shards rebalanced.
//! - `limit/`: the SQL limit the benchmark's `cycle` is held against, and
//!   `scaling-figures.sql`, the script of `docs/scaling.md`'s figures.
//! - `wal/`: what a cycle's SQL costs on a private PostgreSQL, without a
//!   server: `breakdown.sh` (WAL by record type, and CPU time),
//!   `instructions.sh` (instructions, counted by callgrind: the same on
//!   every run), and the cycles they run (`cycles.sql`, `mixed.sql`).

pub mod history;
pub mod recorder;

//! Fault tests: the coordinator keeps its promises while PostgreSQL stops,
//! crashes or loses its network, and while a replica dies. Each test owns a
//! PostgreSQL (`cluster`) behind a proxy that can break the network
//! (`proxy`), runs real server processes on it (`binary`: which one),
//! drives load that records a history (`client`, `harness`), and checks
//! that history with the history checker (`idempotency_bench::history`)
//! after a final read of the table. Run with
//! `cargo test -p idempotency-bench --test faults -- --nocapture` to see
//! what each fault measured.

mod cluster;
mod harness;
mod regressions;
mod scenarios;

use test_support::faults::{binary, client, proxy};
use test_support::helpers::process;

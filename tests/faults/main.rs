//! Fault tests: the coordinator keeps its promises while PostgreSQL stops,
//! crashes or loses its network, and while a replica dies. Each test owns a
//! PostgreSQL (`cluster`) behind a proxy that can break the network
//! (`proxy`), runs real server processes on it, drives load that records a
//! history (`client`, `harness`), and checks that history with the
//! library's checker (`idempotency_coordinator::history`) after a final
//! read of the table. Run with `cargo test --test faults -- --nocapture` to
//! see what each fault measured.

mod client;
mod cluster;
mod harness;
#[allow(dead_code)]
#[path = "../api/helpers/process.rs"]
mod process;
mod proxy;
#[path = "../../src/bin/idempotency-bench/recorder.rs"]
mod recorder;
mod regressions;
mod scenarios;

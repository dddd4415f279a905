//! The sidecar against clients that hold what they can and send little:
//! silent connections, waiters by the hundred on one connection, bodies
//! that trickle. Each test runs the coordinator binary on a fresh database,
//! a real upstream and the sidecar, and checks that a legitimate keyed POST
//! is still answered, and how fast (docs/sidecar.md, "Limits and defaults
//! against strangers").

// The fixtures of the proxy suite, shared as they are; not every helper
// in them is used here.
#[path = "../../../bench/tests/faults/binary.rs"]
mod binary;
#[path = "../../../tests/api/helpers/database.rs"]
#[allow(dead_code)]
mod database;
#[path = "../../../tests/api/helpers/polling.rs"]
mod polling;
#[path = "../../../tests/api/helpers/process.rs"]
#[allow(dead_code)]
mod process;
#[path = "../proxy/support.rs"]
#[allow(dead_code)]
mod support;
#[path = "../proxy/upstream.rs"]
#[allow(dead_code)]
mod upstream;

mod answers;
mod bodies;
mod connections;
mod raw;
mod waiters;

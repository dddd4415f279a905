//! The sidecar against clients that hold what they can and send little:
//! silent connections, waiters by the hundred on one connection, bodies
//! that trickle. Each test runs the coordinator binary on a fresh database,
//! a real upstream and the sidecar, and checks that a legitimate keyed POST
//! is still answered, and how fast (docs/sidecar.md, "Limits and defaults
//! against strangers").

// The fixtures of the proxy suite (test-support).
use test_support::helpers::polling;
use test_support::sidecar::{support, upstream};

mod answers;
mod bodies;
mod connections;
mod raw;
mod waiters;

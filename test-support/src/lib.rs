//! Harnesses that several test suites share, so that no suite includes
//! another's files: a dev-dependency of the server, the benchmark and the
//! sidecar.
//!
//! - [`helpers`]: the API tests' fixtures, all re-exported (`use
//!   test_support::helpers::*`): a fresh database per test, the server in
//!   process or as a process, requests, certificates, polling with a
//!   deadline, skipping loudly where a tool is missing.
//! - [`faults`]: the server binary the suites of other packages run, a TCP
//!   proxy that breaks the database's network, and (feature `bench`) the
//!   fault suites' recording clients.
//! - [`citus`]: a Citus cluster for the tests, and where its shards are.
//! - [`conformance`]: the conformance matrix, generic over the database it
//!   runs on, so the API suite and the Citus suite run the same one.
//! - [`sidecar`]: a counting upstream, and (feature `sidecar`) a
//!   coordinator, upstream and sidecar started together.

pub mod citus;
pub mod conformance;
pub mod faults;
pub mod helpers;
pub mod sidecar;

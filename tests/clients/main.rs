//! The Rust client library (`clients/rust`) against the real server binary,
//! each test on a fresh PostgreSQL database of its own: the acceptance list
//! of `clients/README.md`, plus errors, credentials and TLS.

// The server-process and database fixtures of the API tests, shared as
// they are; not every helper in them is used here.
use test_support::helpers::{database, pki, polling, process};

// The benchmark's history checker and recorder (the idempotency-bench
// crate): the in-transaction tests hold their histories to it.
use idempotency_bench::{history, recorder};
mod recording;

mod errors;
mod in_transaction;
mod lost_reply;
mod run_once;
mod support;
mod takeover;
mod tls;

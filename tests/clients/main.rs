//! The Rust client library (`clients/rust`) against the real server binary,
//! each test on a fresh PostgreSQL database of its own: the acceptance list
//! of `clients/README.md`, plus errors, credentials and TLS.

// The server-process and database fixtures of the API tests, shared as
// they are; not every helper in them is used here.
#[path = "../api/helpers/database.rs"]
#[allow(dead_code)]
mod database;
#[path = "../api/helpers/pki.rs"]
mod pki;
#[path = "../api/helpers/polling.rs"]
mod polling;
#[path = "../api/helpers/process.rs"]
#[allow(dead_code)]
mod process;

mod errors;
mod in_transaction;
mod lost_reply;
mod run_once;
mod support;
mod takeover;
mod tls;

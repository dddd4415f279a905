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

// The benchmark's history checker and recorder (bench/src), pure code
// shared as it is: the in-transaction tests hold their histories to it.
#[allow(dead_code)]
mod history;
#[path = "../../bench/src/recorder.rs"]
#[allow(dead_code)]
mod recorder;
mod recording;

mod errors;
mod in_transaction;
mod lost_reply;
mod run_once;
mod support;
mod takeover;
mod tls;

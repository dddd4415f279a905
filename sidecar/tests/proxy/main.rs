//! The sidecar against a real coordinator (its binary, on a fresh database
//! per test) and a real upstream that counts its side effects: the
//! acceptance list of docs/sidecar.md.

// The server-process and database fixtures of the server's API tests,
// shared as they are; not every helper in them is used here.
#[path = "../../../bench/tests/faults/binary.rs"]
mod binary;
#[path = "../../../tests/api/helpers/database.rs"]
#[allow(dead_code)]
mod database;
#[path = "../../../bench/tests/faults/proxy.rs"]
#[allow(dead_code)]
mod faults_proxy;
#[path = "../../../tests/api/helpers/pki.rs"]
mod pki;
#[path = "../../../tests/api/helpers/polling.rs"]
mod polling;
#[path = "../../../tests/api/helpers/process.rs"]
#[allow(dead_code)]
mod process;

mod built_alone;
mod callers;
mod concurrency;
mod failures;
mod latency;
mod logs;
mod operations;
mod outage;
mod paths;
mod refusals;
mod replays;
mod support;
mod unix_socket;
mod upstream;

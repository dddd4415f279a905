//! The sidecar against a real coordinator (its binary, on a fresh database
//! per test) and a real upstream that counts its side effects: the
//! acceptance list of docs/sidecar.md.

// The server-process and database fixtures the suites share
// (test-support).
use test_support::faults::{binary, proxy as faults_proxy};
use test_support::helpers::{database, pki, polling, process};
use test_support::sidecar::{support, upstream};

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
mod unix_socket;

//! All integration tests in one binary (one link step), each against the real
//! server and a fresh PostgreSQL database of its own.

mod acquire;
mod admin;
mod auth;
#[path = "conformance/backend.rs"]
mod backend;
mod batch_statement;
mod batches;
mod complete;
mod concurrency;
mod conformance;
mod connect_stream;
mod console;
mod console_hardening;
mod database_tls;
mod deadlines;
mod door;
mod due;
mod edge;
mod embedded;
mod extend_lease;
mod get;
mod grpcurl;
mod health;
use test_support::helpers;
mod hostile;
mod http;
mod in_transaction;
mod large_results;
mod metrics;
mod metrics_apart;
mod migrations;
mod pipelining;
mod replays;
mod replicas;
mod startup;
mod sweep;
mod table_changes;
mod tls;
mod traces;
mod validation;
mod waiting;
mod watch;
mod webhook;

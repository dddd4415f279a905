//! The idempotency coordinator: a stateless gRPC server in front of
//! PostgreSQL that lets services in any language run each side-effecting
//! operation exactly once.
//!
//! # Layout
//!
//! Where each decision is made:
//!
//! - [`proto`]: the generated code of `proto/idempotency/v1/coordinator.proto`
//!   (the public contract), fenced here and never edited.
//! - [`domain`]: validated request values (scope, key, fingerprint, token), the
//!   policy of defaults and limits, records and decisions. No I/O.
//! - [`store`]: the database seam. One method per SQL function in `sql/functions/`
//!   (where the Acquire/Complete/ExtendLease decisions really live, under row
//!   locks and the database clock), split by job: `store::setup` (pool and
//!   configuration), `store::postgres` with `store::tls` (how every
//!   connection is opened: the URL's `sslmode` and `sslrootcert` read as
//!   libpq reads them), `store::run` (how a statement reaches the database:
//!   pipelined on a few shared connections, `store::mux`, and prepared
//!   anew when PostgreSQL refuses it as prepared before the table changed,
//!   `mux::prepared_anew_if_stale`, or batched so that
//!   Acquires and Completes that arrive together share one statement and one
//!   commit, `store::batch` with arguments bound in `store::calls` and
//!   the moment each batch goes out decided in `batch::take`, and
//!   whether two go pipelined, by the replicas counted on the database,
//!   in `batch::company`; on
//!   Citus one statement per node, by `store::shards`' map of the shards,
//!   which also holds the shared connections straight to each node),
//!   `store::maintenance` (sweeps, due records; on Citus per shard and per
//!   key, `sql/citus/maintenance.sql`),
//!   `store::admin` (the admin RPCs' actions, lists and summaries,
//!   `sql/functions/admin.sql`), `store::row` and
//!   [`store::names`] (rows and the SQL functions' names into domain values;
//!   `store::row_type` reads records by the table's current columns when it
//!   changed while connections were open),
//!   `store::replays` (SUCCEEDED records answered from memory until shortly
//!   before they expire), [`store::listener`] (the LISTEN connection and the
//!   database's clock; on Citus one session per node, each followed on its
//!   own), [`store::probe`] (whether the connections calls use
//!   answer: readiness, and replacing one that silently stopped),
//!   [`store::migrate`] (applies `sql/`: the schema's numbered migrations
//!   once each, then each function file that changed), [`store::citus`]
//!   (a Citus coordinator recognised, and what migrating one adds: the
//!   table distributed by key, the single-key functions delegated to the
//!   worker holding the key) and
//!   [`store::connect_error`] (every failed connection said once: where it
//!   went, `connect_error::target`; why, `connect_error::cause`; the
//!   sentence with what to check, `connect_error::message`; the database
//!   URLs refused up front, `connect_error::url`; and the one-connection
//!   probe start-up waits with, `connect_error::probe`).
//! - [`service`]: the gRPC `Coordinator` trait: decode into domain commands,
//!   call the store, encode the answer; `service::admin` the admin RPCs; `service::wait` holds Acquire's wait
//!   window and the Watch stream; an Acquire that waits is parked in a task
//!   of its own and answered later through admission (`transport::later`),
//!   so that it keeps no handler's future.
//! - [`error`]: the one error type and its exhaustive mapping to gRPC status
//!   codes with rich error details.
//! - [`sweeper`]: Sweep and the background sweeper: expired records out, dead
//!   leases reclaimed, in small batches, one replica at a time; on a Citus
//!   coordinator in rounds on every shard, one replica at a time per shard.
//! - [`recovery`]: the recovery webhook that POSTs due records (the feed's
//!   stream form, WatchDue, lives in `service::due`).
//! - [`auth`]: who the caller is (bearer tokens to tenant and admin); the
//!   only source of a request's tenant. `transport` asks it on the headers
//!   and hands the caller to `service` in the request's extensions.
//! - [`config`]: flags with environment fallbacks and their defaults, a
//!   file per thing configured: `config::database` (URL, pool, statements),
//!   `config::auth`, `config::tls`, `config::policy` (request defaults and
//!   limits), `config::limits` (waiters, requests, connections),
//!   `config::recovery` (sweeper, WatchDue feed, webhook),
//!   `config::lifecycle` (start, readiness, shutdown) and `config::health`
//!   (the `health` command); `config::serve` groups them into the `serve`
//!   command's flags and resolves them into a `ServeConfig`.
//! - [`embedded`]: the private PostgreSQL that `serve` and `migrate` start in
//!   `--data-dir` when no database URL is given (local development), with
//!   the machine's PostgreSQL programs or ones downloaded once
//!   (`embedded::binaries`).
//! - [`transport`]: the network edge, where no caller is trusted yet: the
//!   one accept loop (connection cap, handshake time limit, back-off when
//!   descriptors run out) for both ports, HTTP/2 connections (keepalive,
//!   idle timeout; a batch's answers written together) and the HTTP port's
//!   HTTP/1.1-or-HTTP/2 ones, and
//!   admission, which answers each call from its headers (credentials, the
//!   readiness gate, room in the in-flight byte budget and its tenant's
//!   share, deadline) before a
//!   byte of its body is read, holds the body to size and time limits while
//!   it arrives, and counts every refusal.
//! - [`http`]: the HTTP/JSON door (`--http-listen`) for callers without
//!   gRPC: `http::workflow` (the n8n idempotency service's `/acquire`,
//!   `/complete` and `/health`, read as n8n renders them), `http::connect`
//!   (every unary RPC in the Connect protocol's shape, canonical proto3
//!   JSON), `http::events` (Watch and WatchDue as Server-Sent Events) and
//!   `http::json` (that JSON, by reflection over the embedded descriptors),
//!   `http::console` (the operator console at `/console/`, `--console`:
//!   server-rendered pages over the admin RPCs, `console::session` for the
//!   admin token's cookie and CSRF, `console::pages` the templates,
//!   `console::actions` what each request does),
//!   with `http::inprocess` (how the door makes a Coordinator call) and
//!   `http::refusal` (why it refused a request: status, body, log, metric).
//!   The door checks a request's headers (framing, cross-site, credentials,
//!   content type) before it reads its body under admission's budget; each
//!   request then enters `transport`'s admission as a typed call (a stream
//!   as an in-process gRPC call), so nothing about callers is decided twice.
//! - [`startup`]: builds the server exactly as production and tests run it;
//!   binds the ports first and waits for the database (and migrates it)
//!   while serving, Coordinator calls answered UNAVAILABLE until it is
//!   ready. In named parts: [`startup::commands`] (what `serve`, `migrate`
//!   and `health` do; `main.rs` only parses the arguments and dispatches),
//!   `ports` (binding, the connection cap, the client ports served),
//!   `database` (the wait, and the Coordinator's gate meanwhile), `routes`
//!   (Coordinator, health, and reflection in both versions from one
//!   builder), `http_door`, `metrics_exporter`, `credentials` (reloaded on
//!   SIGHUP), `database_work` (the listener, the probe, readiness following
//!   both, each Citus node's health, and the sweeper, once the database is
//!   ready), `lifecycle` (the
//!   wait, serving until shutdown, the drain) and `background`: one
//!   supervisor for every background task, which all end on one
//!   cancellation token, awaited within a bound, any that dies early logged
//!   by name.
//! - [`notify`]: the hub: waiting without a database connection. The
//!   listener's changes fanned out to this process's waiters, the waiter
//!   limits, and one shared read per record for the waiters a change wakes.
//! - [`tls`]: TLS and mutual TLS on the gRPC and HTTP ports, reloadable.
//! - [`shutdown`]: the signals that start a graceful shutdown.
//! - [`health`]: the `health` command, which asks a server's health service
//!   as a container's health check does (same address and TLS flags as
//!   `serve`).
//! - [`telemetry`]: logging and traces: the set-up (log format, the OTLP
//!   span exporter) and each Coordinator call's span (method, tenant, scope,
//!   hashed key, decision or error reason, duration; the caller's W3C trace
//!   context as its parent), which `transport` opens and `service` fills.
//! - [`metrics`]: Prometheus metrics in one process-wide registry, a file
//!   per area, each with its metrics' definitions and the functions that
//!   record them (`metrics::calls`, `metrics::edge`, `metrics::store`,
//!   `metrics::waiters`, `metrics::readiness`, `metrics::sweeper`, and
//!   `metrics::snapshot` for the state read at scrape time), and
//!   `metrics::exporter`, the plain HTTP listener that serves them
//!   (`--metrics-listen`). Of ours it uses only `domain`'s names of
//!   Acquire's decisions, so that every layer may count what it sees.
//!
//! Dependencies point one way: `service` uses `domain`, `store`, `notify`,
//! `error` and `telemetry` (and the caller's deadline as `transport` read
//! it); `notify` uses `domain` and `store`; `transport` uses `auth`,
//! `error`, `tls` and `telemetry`, and reaches the services only as the
//! routes `startup` hands it; `telemetry` uses `domain` (it defines the
//! log format `config` reads);
//! `http` uses `transport` (admission, and the HTTP port it is served on),
//! `auth`, `service` (only the names of what an in-process call may ask,
//! such as a Get's lease token), `domain`, `error` and the generated types;
//! `error` uses `domain`, `auth` and `store`; `store` uses `domain` only;
//! `domain` uses nothing of ours. `metrics` uses only `domain` and every
//! module may call it. Only `startup` and `config` see everything.

pub mod auth;
pub mod config;
pub mod domain;
pub mod embedded;
pub mod error;
pub mod health;
pub mod http;
pub mod metrics;
pub mod notify;
pub mod recovery;
pub mod service;
pub mod shutdown;
pub mod startup;
pub mod store;
pub mod sweeper;
pub mod telemetry;
pub mod tls;
pub mod transport;

/// Generated from the proto; the only place that includes generated code.
#[allow(clippy::all, clippy::pedantic, missing_docs)]
pub mod proto {
    tonic::include_proto!("idempotency.v1");

    /// The encoded descriptors of the contract (and the well-known types it
    /// imports), served by reflection.
    pub const FILE_DESCRIPTOR_SET: &[u8] =
        include_bytes!(concat!(env!("OUT_DIR"), "/coordinator_descriptor.bin"));

    #[cfg(test)]
    mod tests {
        use prost::Message as _;

        #[test]
        fn the_embedded_descriptor_set_decodes_and_holds_the_service() {
            let set = prost_types::FileDescriptorSet::decode(super::FILE_DESCRIPTOR_SET).unwrap();
            let ours = set
                .file
                .iter()
                .find(|f| f.package() == "idempotency.v1")
                .expect("our file");
            assert_eq!(ours.service[0].name(), "Coordinator");
        }
    }
}

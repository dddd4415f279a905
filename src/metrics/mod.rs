//! Prometheus metrics for operators: what every layer counts, and the plain
//! HTTP listener (`--metrics-listen`) that serves them at `GET /metrics`.
//!
//! Nearly a leaf: of ours it uses only `domain`'s names of Acquire's
//! decisions (and `domain` uses nothing of ours), so every layer may call
//! it. The metrics live in one process-wide registry (a `LazyLock` static),
//! so that recording a value needs no handle threaded through constructors:
//! a call such as `metrics::replay_lookup(true)` is all a layer adds. The
//! price is that servers sharing a process (the in-process test servers)
//! share counters; tests that read exact values start a server process of
//! their own.
//!
//! Labels are bounded: methods and gRPC codes come from fixed tables (a path
//! no service answers is `unknown`), kinds and reasons are enumerations.
//! Scopes are chosen by callers, so a scope label appears only on one
//! family, and only when the operator asks for it (`--metrics-scope-labels`).
//! No key, token, tenant or request field is ever a label: tenants are
//! bounded by the credentials file, but their names identify customers, and
//! the per-tenant waiter limit has its own refusal label.
//!
//! Values that are state rather than events (the pool, the shared
//! connections, waiters, the replay cache's bytes) are read when a scrape
//! arrives, from a [`Snapshot`] that `startup` builds from the store and the
//! hub.
//!
//! One file per area, each with its metrics' definitions (names, help,
//! labels, the series created at zero) and the functions that record them:
//! `calls` (every call's status and duration, Acquire's decisions,
//! refusals on a lease or record), `edge` (requests refused before a
//! service saw them), `store` (database errors, batches and whether they
//! are pipelined, the replay cache),
//! `waiters` (waiters, their limits, open streams), `readiness` (readiness
//! and the LISTEN connection), `sweeper` (sweeping rounds and records
//! swept) and `snapshot` (the state read at scrape time, and the pool's and
//! shared connections' gauges). `exporter` encodes the registry and serves
//! it.
//!
//! `docs/operations.md` lists every metric, its labels and the alerts on it.

use std::sync::LazyLock;

use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::Registry;

mod calls;
mod edge;
mod exporter;
mod readiness;
mod snapshot;
mod store;
mod sweeper;
mod waiters;

pub use calls::{Rpc, acquired, refused, set_scope_labels};
pub use edge::{Port, request_refused};
pub use exporter::{Format, MAX_SCRAPE_CONNECTIONS, SnapshotFn, render, serve};
pub use readiness::{listener_connected, ready};
pub use snapshot::Snapshot;
pub use store::{
    BatchKind, DatabaseError, batch_ran, batches_pipelined, database_error, replay_lookup,
};
pub use sweeper::{SweepOutcome, sweep_round, swept};
pub use waiters::{OpenStream, Stream, Waiter, stream_opened, waiter_refused};

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

/// `family`'s series for `labels`, created if new, as a handle of its own
/// that shares the family's value: kept by a hot path, it spares every
/// call the family's hashed lookup under its lock.
fn series<L, M, C>(family: &Family<L, M, C>, labels: &L) -> M
where
    L: Clone + std::hash::Hash + Eq,
    M: Clone,
    C: prometheus_client::metrics::family::MetricConstructor<M>,
{
    family.get_or_create(labels).clone()
}

/// Every metric of the process, by area, and the registry that encodes
/// them.
struct Metrics {
    registry: Registry,
    calls: calls::Calls,
    edge: edge::Edge,
    store: store::Store,
    waiters: waiters::Waiters,
    readiness: readiness::Readiness,
    sweeper: sweeper::Sweeper,
    connections: snapshot::Connections,
}

impl Metrics {
    /// Every area's metrics, registered in the order a scrape lists them.
    fn new() -> Self {
        let mut registry = Registry::with_prefix("idempotency");
        registry.register(
            "build",
            "The server's version",
            Info::new([("version", env!("CARGO_PKG_VERSION"))]),
        );
        let r = &mut registry;
        let calls = calls::Calls::new(r);
        let edge = edge::Edge::new(r);
        let store = store::Store::new(r);
        let waiters = waiters::Waiters::new(r);
        let readiness = readiness::Readiness::new(r);
        let sweeper = sweeper::Sweeper::new(r);
        let connections = snapshot::Connections::new(r);
        Metrics {
            registry,
            calls,
            edge,
            store,
            waiters,
            readiness,
            sweeper,
            connections,
        }
    }
}

static METRICS: LazyLock<Metrics> = LazyLock::new(Metrics::new);

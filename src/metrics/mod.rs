//! Prometheus metrics for operators: what every layer counts, and the plain
//! HTTP listener (`--metrics-listen`) that serves them at `GET /metrics`.
//!
//! Nearly a leaf: of ours it uses only `domain`'s names of Acquire's
//! decisions (and `domain` uses nothing of ours), so every layer may use
//! it. There is no process-wide registry: a server's [`Metrics`] (one
//! registry, cheap to clone) is handed to what records, like the store and
//! the hub are: the store gets it in its `StoreConfig` and hands it on
//! (`Store::metrics`), so two servers in one process count apart.
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

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

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

pub use calls::Rpc;
pub use edge::Port;
pub use exporter::{Format, MAX_SCRAPE_CONNECTIONS, SnapshotFn};
pub use snapshot::Snapshot;
pub use store::{BatchKind, DatabaseError};
pub use sweeper::SweepOutcome;
pub use waiters::{OpenStream, Stream, Waiter};

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

/// A server's metrics: what every layer records into, and the registry
/// that encodes them. Clones share the same registry and counters.
#[derive(Clone)]
pub struct Metrics(Arc<Registered>);

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    /// A registry of its own, with every series created at zero.
    pub fn new() -> Self {
        Metrics(Arc::new(Registered::new()))
    }
}

/// Every metric of one server, by area, and the registry that encodes
/// them.
struct Registered {
    /// Whether Acquire decisions are also counted by scope
    /// (`--metrics-scope-labels`).
    scope_labels: AtomicBool,
    registry: Registry,
    calls: calls::Calls,
    edge: edge::Edge,
    store: store::Store,
    waiters: waiters::Waiters,
    readiness: readiness::Readiness,
    sweeper: sweeper::Sweeper,
    connections: snapshot::Connections,
}

impl Registered {
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
        Registered {
            registry,
            scope_labels: AtomicBool::new(false),
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

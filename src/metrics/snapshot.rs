//! The state read when a scrape arrives rather than counted as it happens:
//! the pool and the shared connections (kept here), and the batch queue,
//! the replay cache and the waiters (kept with their areas).

use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::Registered;

/// The state read when a scrape arrives.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// Pooled connections allowed at most (`--pool-size`).
    pub pool_max_size: usize,
    /// Pooled connections open now.
    pub pool_size: usize,
    /// Pooled connections open and idle.
    pub pool_available: usize,
    /// Calls waiting for a pooled connection.
    pub pool_waiting: usize,
    /// Shared connections configured (`--shared-connections`).
    pub shared_connections: usize,
    /// Shared connections connected now.
    pub shared_connected: usize,
    /// Calls waiting for a batch worker.
    pub queued_calls: usize,
    /// What the replay cache holds, in bytes.
    pub replay_cache_bytes: u64,
    /// Calls waiting on this server (Acquire with wait, Watch, WatchDue).
    pub waiters: usize,
    /// Waiters asleep until their record changes.
    pub waiters_parked: usize,
    /// Records at least one call on this server waits on.
    pub watched_records: usize,
}

/// A count as a gauge's value.
pub(super) fn count(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// Sets every gauge read from state to what `snapshot` holds.
pub(super) fn apply(m: &Registered, snapshot: &Snapshot) {
    m.connections.apply(snapshot);
    m.store.apply(snapshot);
    m.waiters.apply(snapshot);
}

/// The database connections' metrics: the pool and the shared connections.
pub(super) struct Connections {
    pool_max: Gauge,
    pool_size: Gauge,
    pool_available: Gauge,
    pool_waiting: Gauge,
    shared_connections: Gauge,
    shared_connected: Gauge,
}

impl Connections {
    /// The connections' metrics, registered in `r`.
    pub(super) fn new(r: &mut Registry) -> Self {
        let m = Connections {
            pool_max: Gauge::default(),
            pool_size: Gauge::default(),
            pool_available: Gauge::default(),
            pool_waiting: Gauge::default(),
            shared_connections: Gauge::default(),
            shared_connected: Gauge::default(),
        };
        r.register(
            "db_pool_max_size",
            "Pooled database connections allowed (--pool-size)",
            m.pool_max.clone(),
        );
        r.register(
            "db_pool_size",
            "Pooled database connections open",
            m.pool_size.clone(),
        );
        r.register(
            "db_pool_available",
            "Pooled database connections open and idle",
            m.pool_available.clone(),
        );
        r.register(
            "db_pool_waiting",
            "Calls waiting for a pooled database connection",
            m.pool_waiting.clone(),
        );
        r.register(
            "db_shared_connections",
            "Shared, pipelined database connections configured (--shared-connections)",
            m.shared_connections.clone(),
        );
        r.register(
            "db_shared_connections_connected",
            "Shared database connections connected now",
            m.shared_connected.clone(),
        );
        m
    }

    fn apply(&self, snapshot: &Snapshot) {
        self.pool_max.set(count(snapshot.pool_max_size));
        self.pool_size.set(count(snapshot.pool_size));
        self.pool_available.set(count(snapshot.pool_available));
        self.pool_waiting.set(count(snapshot.pool_waiting));
        self.shared_connections
            .set(count(snapshot.shared_connections));
        self.shared_connected.set(count(snapshot.shared_connected));
    }
}

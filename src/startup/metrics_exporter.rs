//! The metrics port's wiring (`--metrics-listen`): the exporter
//! (`Metrics::serve`, of the store's metrics) run under the supervisor until the ports have
//! closed, reading the store's and the hub's state at each scrape.

use std::sync::Arc;

use tokio::net::TcpListener;

use super::background::{Supervisor, Until};
use crate::metrics;
use crate::notify::Hub;
use crate::store::Store;

/// Serves metrics on `listener`, when there is one, until the ports have
/// closed, so that the drain can be watched to its end.
pub(super) fn start(
    background: &mut Supervisor,
    listener: Option<TcpListener>,
    store: Store,
    hub: Arc<Hub>,
) {
    let Some(listener) = listener else {
        return;
    };
    if let Ok(addr) = listener.local_addr() {
        tracing::info!(%addr, "serving metrics at /metrics");
    }
    let metrics = store.metrics().clone();
    let snapshot = snapshot(store, hub);
    background.spawn("metrics port", Until::Closed, |stop| async move {
        // The exporter serves until dropped: it stops here, between two
        // awaits, once asked to.
        tokio::select! {
            () = stop.cancelled() => {}
            () = metrics.serve(listener, snapshot) => {}
        }
    });
}

/// Reads, at each scrape, the state metrics show: the store's connections
/// and queue, and the hub's waiters.
fn snapshot(store: Store, hub: Arc<Hub>) -> metrics::SnapshotFn {
    Arc::new(move || {
        let pool = store.pool_status();
        let (shared_connections, shared_connected) = store.shared_connections();
        metrics::Snapshot {
            pool_max_size: pool.max_size,
            pool_size: pool.size,
            pool_available: pool.available,
            pool_waiting: pool.waiting,
            shared_connections,
            shared_connected,
            queued_calls: store.queued_calls(),
            replay_cache_bytes: store.replay_cache_bytes(),
            waiters: hub.waiters(),
            waiters_parked: hub.parked(),
            watched_records: hub.watched_records(),
        }
    })
}

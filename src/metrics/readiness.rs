//! Readiness: whether the server is SERVING, and the LISTEN connection it
//! needs.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::Metrics;

/// Readiness's metrics.
pub(super) struct Readiness {
    ready: Gauge,
    listener_connected: Gauge,
    listener_connections: Counter,
}

impl Readiness {
    /// Readiness's metrics, registered in `r`.
    pub(super) fn new(r: &mut Registry) -> Self {
        let m = Readiness {
            ready: Gauge::default(),
            listener_connected: Gauge::default(),
            listener_connections: Counter::default(),
        };
        r.register(
            "ready",
            "1 while readiness (health service idempotency.v1.Coordinator) is SERVING: the listener is connected and the calls' connections answer",
            m.ready.clone(),
        );
        r.register(
            "listener_connected",
            "1 while the LISTEN connection is up and reading the database's clock on time (readiness needs it; waiters poll without it)",
            m.listener_connected.clone(),
        );
        r.register(
            "listener_connections",
            "LISTEN sessions established: the first, and one per reconnect",
            m.listener_connections.clone(),
        );
        m
    }
}

impl Metrics {
    /// Readiness turned SERVING (`true`) or NOT_SERVING.
    pub fn ready(&self, up: bool) {
        self.0.readiness.ready.set(i64::from(up));
    }
}

impl Metrics {
    /// The LISTEN connection went up (a new session) or down.
    pub fn listener_connected(&self, up: bool) {
        let m = &self.0.readiness;
        m.listener_connected.set(i64::from(up));
        if up {
            m.listener_connections.inc();
        }
    }
}

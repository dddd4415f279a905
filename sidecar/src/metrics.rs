//! Prometheus metrics: requests by route and outcome (409s and 422s are
//! outcomes `in-progress` and `fingerprint-mismatch`), replays, answers too
//! large to store, upstream latency, and whether the coordinator is ready.
//! Served as text on the metrics listener ([`crate::ops`]).

use std::sync::Arc;
use std::sync::atomic::AtomicI64;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    route: String,
    outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RouteLabels {
    route: String,
}

/// The sidecar's metrics. Cheap to clone: clones share the values.
#[derive(Clone)]
pub struct Metrics {
    registry: Arc<Registry>,
    requests: Family<RequestLabels, Counter>,
    replays: Family<RouteLabels, Counter>,
    too_large: Family<RouteLabels, Counter>,
    upstream_latency: Histogram,
    /// 1 while the coordinator answers its health check as serving.
    pub coordinator_ready: Gauge<i64, AtomicI64>,
    /// Client connections open.
    pub connections: Gauge<i64, AtomicI64>,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("idempotency_sidecar");
        let requests = Family::<RequestLabels, Counter>::default();
        registry.register(
            "requests",
            "Client requests by route and outcome",
            requests.clone(),
        );
        let replays = Family::<RouteLabels, Counter>::default();
        registry.register(
            "replays",
            "Answers replayed from the store",
            replays.clone(),
        );
        let too_large = Family::<RouteLabels, Counter>::default();
        registry.register(
            "too_large_responses",
            "Upstream answers too large to store: passed through, key released",
            too_large.clone(),
        );
        let upstream_latency = Histogram::new(exponential_buckets(0.001, 2.0, 16));
        registry.register(
            "upstream_latency_seconds",
            "Time from sending a request upstream to its whole answer (head only when streamed)",
            upstream_latency.clone(),
        );
        let coordinator_ready = Gauge::default();
        registry.register(
            "coordinator_ready",
            "1 while the coordinator reports itself serving",
            coordinator_ready.clone(),
        );
        let connections = Gauge::default();
        registry.register(
            "connections",
            "Client connections open",
            connections.clone(),
        );
        Metrics {
            registry: Arc::new(registry),
            requests,
            replays,
            too_large,
            upstream_latency,
            coordinator_ready,
            connections,
        }
    }
}

impl Metrics {
    /// One request of `route` ended as `outcome`.
    pub fn request(&self, route: &str, outcome: &str) {
        self.requests
            .get_or_create(&RequestLabels {
                route: route.to_owned(),
                outcome: outcome.to_owned(),
            })
            .inc();
    }

    /// One replay on `route`.
    pub fn replay(&self, route: &str) {
        self.replays
            .get_or_create(&RouteLabels {
                route: route.to_owned(),
            })
            .inc();
    }

    /// One answer too large to store on `route`.
    pub fn too_large(&self, route: &str) {
        self.too_large
            .get_or_create(&RouteLabels {
                route: route.to_owned(),
            })
            .inc();
    }

    /// The upstream took `elapsed`.
    pub fn upstream_latency(&self, elapsed: Duration) {
        self.upstream_latency.observe(elapsed.as_secs_f64());
    }

    /// The text exposition format.
    pub fn encode(&self) -> String {
        let mut text = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut text, &self.registry);
        text
    }
}

//! The edge: requests refused on either port before a service saw them.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

use super::Metrics;

/// The reasons a request is refused at the edge that both ports share,
/// created at zero.
const EDGE_REFUSALS: [&str; 6] = [
    "unauthenticated",
    "overloaded",
    "tenant_share",
    "too_large",
    "too_slow",
    "connection_share",
];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PortReasonLabels {
    port: &'static str,
    reason: &'static str,
}

/// The edge's metrics.
pub(super) struct Edge {
    requests_refused: Family<PortReasonLabels, Counter>,
}

impl Edge {
    /// The edge's metrics, registered in `r`, their shared reasons at zero.
    pub(super) fn new(r: &mut Registry) -> Self {
        let m = Edge {
            requests_refused: Family::default(),
        };
        r.register(
            "requests_refused",
            "Requests refused at the edge before a service saw them, by port (grpc, http) and reason (unauthenticated; overloaded, tenant_share, connection_share: no room in the in-flight byte budget or its tenant's or connection's share; too_large, too_slow, too_many_values, media_type, cross_site, malformed, invalid, not_found, method)",
            m.requests_refused.clone(),
        );
        for port in [Port::Grpc, Port::Http] {
            for reason in EDGE_REFUSALS {
                let _ = m.requests_refused.get_or_create(&PortReasonLabels {
                    port: port.label(),
                    reason,
                });
            }
        }
        m
    }
}

/// The port a request came in on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Port {
    /// The gRPC port (`--listen`).
    Grpc,
    /// The HTTP/JSON port (`--http-listen`).
    Http,
}

impl Port {
    fn label(self) -> &'static str {
        match self {
            Port::Grpc => "grpc",
            Port::Http => "http",
        }
    }
}

impl Metrics {
    /// A request was refused at the edge (admission, or the HTTP/JSON door)
    /// before any service saw it; `reason` is one of a fixed set (see the
    /// metric's help).
    pub fn request_refused(&self, port: Port, reason: &'static str) {
        self.0
            .edge
            .requests_refused
            .get_or_create(&PortReasonLabels {
                port: port.label(),
                reason,
            })
            .inc();
    }
}

//! The proxy's state: what every request needs (routes, upstream,
//! coordinator, limits, budgets, metrics); how a request is answered is
//! [`crate::request`].

use std::sync::Arc;
use std::time::Duration;

use http::{HeaderName, Response};

use crate::body::ProxyBody;
use crate::metrics::Metrics;
use crate::problem::{Problem, Problems};
use crate::routes::Routes;
use crate::upstream::{Upstream, UpstreamError};

/// Limits and defaults of coordinated requests.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The longest key accepted.
    pub max_key_len: usize,
    /// The largest request body a coordinated request may have (it is
    /// held whole, for the fingerprint).
    pub max_request_body: usize,
    /// The largest response stored (status, headers and body encoded);
    /// larger ones are passed through and the key released.
    pub max_stored_bytes: usize,
    /// How long a coordinated request's body may take to arrive.
    pub request_body_timeout: Duration,
    /// The client header whose value namespaces keys (e.g. an API key).
    pub tenant_header: Option<HeaderName>,
    /// The lease on a key while the upstream works (extended as it does).
    pub lease_ttl: Duration,
    /// How long an answer the coordinator did not store is held while the
    /// sidecar keeps storing it (its client waits meanwhile).
    pub store_patience: Duration,
    /// The longest `Prefer: wait` honoured.
    pub max_wait: Duration,
    /// Attempts a key allows (0: the coordinator's default).
    pub max_attempts: u32,
    /// How long a key's record and answer are kept (`None`: the
    /// coordinator's default).
    pub retention: Option<Duration>,
    /// The body budget's size, in KiB.
    pub body_budget_kib: u32,
    /// How soon a key whose upstream call failed may run again, when the
    /// upstream does not say (`Retry-After`).
    pub failure_retry_after: Duration,
}

/// The proxy: everything a request needs.
pub struct Proxy {
    /// Which requests are coordinated, and how.
    pub routes: Routes,
    /// Where requests go.
    pub upstream: Upstream,
    /// The coordinator, through the client library.
    pub coordinator: idempotency_client::Client,
    /// Limits and defaults.
    pub settings: Settings,
    /// Where problem types point.
    pub problems: Problems,
    /// Requests by route and outcome, and the rest.
    pub metrics: Metrics,
    /// The bodies of requests with a key held at once, charged as they
    /// arrive and shared by client: a body that would pass it is refused
    /// (503) rather than read.
    pub body_budget: Arc<crate::budget::BodyBudget>,
    /// Requests that wait (`Prefer: wait`), bounded, on a coordinator
    /// channel of their own.
    pub waiters: crate::waiters::Waiters,
    /// Upstream answers read whole, held at once until sent.
    pub answers: crate::answers::AnswerBudget,
}

/// What a request ended as, for the metrics.
pub type Outcome = &'static str;

impl Proxy {
    /// The problem answering an upstream that gave no answer.
    pub fn upstream_problem(&self, error: &UpstreamError) -> (Response<ProxyBody>, Outcome) {
        let problem = match error {
            UpstreamError::Unreachable(_) => Problem::UpstreamUnavailable,
            UpstreamError::Timeout(_) => Problem::UpstreamTimeout,
        };
        tracing::warn!(%error, "upstream gave no answer");
        (
            self.problems.respond(problem, &error.to_string(), None),
            problem.anchor(),
        )
    }
}

/// The most a single body reserves, in KiB (the semaphore's own limit is
/// far above any budget).
pub const MAX_BUDGET_KIB: u32 = 1 << 30;

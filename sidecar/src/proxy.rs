//! One request, start to end: its route decides whether it is coordinated;
//! a coordinated one has its key and body read (bounded), is fingerprinted,
//! and goes to [`crate::coordinate`]; every other one streams to the
//! upstream untouched. The outcome label of the request metric is decided
//! here.

use std::sync::Arc;
use std::time::{Duration, Instant};

use http::{HeaderName, Request, Response};
use hyper::body::Incoming;

use crate::body::{self, ProxyBody};
use crate::key::{self, IdempotencyKey, KeyError};
use crate::metrics::Metrics;
use crate::normalise::{self, PathError};
use crate::problem::{Problem, Problems};
use crate::routes::{Mode, Route, Routes};
use crate::upstream::{Upstream, UpstreamError, strip_hop_by_hop};

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
    /// Answers one client request.
    pub async fn handle(self: Arc<Self>, request: Request<Incoming>) -> Response<ProxyBody> {
        let request = match self.normalised(request) {
            Ok(request) => request,
            Err(error) => {
                let kind = Problem::InvalidPath;
                let response = self.problems.respond(kind, &error.to_string(), None);
                // No route was decided: the label is the problem's.
                self.metrics.request(kind.anchor(), kind.anchor());
                return response;
            }
        };
        let route = self.routes.route(request.method(), request.uri().path());
        let (response, outcome) = match self.key_of(&route, &request) {
            Err(problem) => {
                let detail = problem.to_string();
                let kind = match problem {
                    KeyError::Missing => Problem::MissingKey,
                    _ => Problem::InvalidKey,
                };
                (self.problems.respond(kind, &detail, None), kind.anchor())
            }
            Ok(None) => self.pass(request).await,
            Ok(Some(key)) => self.coordinated(&route, key, request).await,
        };
        self.metrics.request(&route.name, outcome);
        response
    }

    /// The request with its method and path as the upstream reads them
    /// ([`normalise`]); a path that cannot be normalised is refused when a
    /// route may coordinate the method, else passed on as it came.
    fn normalised(&self, mut request: Request<Incoming>) -> Result<Request<Incoming>, PathError> {
        let method = normalise::method(request.method());
        let path = match normalise::path(request.uri().path()) {
            Ok(path) => path,
            Err(error) if self.routes.may_coordinate(&method) => return Err(error),
            Err(_) => return Ok(request),
        };
        *request.method_mut() = method;
        if path != request.uri().path() {
            let mut parts = request.uri().clone().into_parts();
            let query = request.uri().query().map(|q| format!("?{q}"));
            let rebuilt = format!("{path}{}", query.unwrap_or_default());
            // Decoding unreserved characters and dropping dot segments
            // keep a valid path valid.
            if let Ok(path_and_query) = rebuilt.parse() {
                parts.path_and_query = Some(path_and_query);
            }
            if let Ok(uri) = http::Uri::from_parts(parts) {
                *request.uri_mut() = uri;
            }
        }
        Ok(request)
    }

    /// The request's key, when its route coordinates it.
    fn key_of(
        &self,
        route: &Route,
        request: &Request<Incoming>,
    ) -> Result<Option<IdempotencyKey>, KeyError> {
        if route.mode == Mode::Pass {
            return Ok(None);
        }
        match key::from_headers(request.headers(), self.settings.max_key_len)? {
            None if route.mode == Mode::Require => Err(KeyError::Missing),
            found => Ok(found),
        }
    }

    /// Streams the request to the upstream and its answer back.
    async fn pass(&self, request: Request<Incoming>) -> (Response<ProxyBody>, Outcome) {
        let started = Instant::now();
        match self
            .upstream
            .send(request.map(body::stream), Vec::new())
            .await
        {
            Ok(response) => {
                self.metrics.upstream_latency(started.elapsed());
                let (mut head, incoming) = response.into_parts();
                strip_hop_by_hop(&mut head.headers);
                (Response::from_parts(head, body::stream(incoming)), "passed")
            }
            Err(error) => self.upstream_problem(&error),
        }
    }

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

    /// Reads the body (bounded in size and time, charged to the budget),
    /// then coordinates.
    async fn coordinated(
        self: &Arc<Self>,
        route: &Route,
        key: IdempotencyKey,
        request: Request<Incoming>,
    ) -> (Response<ProxyBody>, Outcome) {
        let (head, incoming) = request.into_parts();
        let limit = route.max_body.unwrap_or(self.settings.max_request_body);
        match crate::budget::read(self, &head, incoming, limit).await {
            Ok((bytes, held)) => {
                let (proxy, route) = (Arc::clone(self), route.clone());
                crate::coordinate::run(proxy, route, key, head, bytes, held).await
            }
            Err((kind, detail, retry)) => {
                (self.problems.respond(kind, &detail, retry), kind.anchor())
            }
        }
    }
}

/// The most a single body reserves, in KiB (the semaphore's own limit is
/// far above any budget).
pub const MAX_BUDGET_KIB: u32 = 1 << 30;

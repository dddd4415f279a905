//! One request, start to end: its route decides whether it is coordinated;
//! a coordinated one has its key and body read (bounded), is fingerprinted,
//! and goes to [`crate::coordinate`]; every other one streams to the
//! upstream untouched. The outcome label of the request metric is decided
//! here.

use std::sync::Arc;
use std::time::Instant;

use http::{Request, Response};
use hyper::body::Incoming;

use crate::body::{self, ProxyBody};
use crate::budget::{self, ReadLimits};
use crate::coordinate;
use crate::key::{self, IdempotencyKey, KeyError};
use crate::normalise::{self, PathError};
use crate::problem::Problem;
use crate::proxy::{Outcome, Proxy};
use crate::routes::{Mode, Route};
use crate::upstream::strip_hop_by_hop;

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
        let limits = ReadLimits {
            tenant_header: self.settings.tenant_header.as_ref(),
            timeout: self.settings.request_body_timeout,
            limit,
        };
        match budget::read(&self.body_budget, &head, incoming, limits).await {
            Ok((bytes, held)) => {
                let (proxy, route) = (Arc::clone(self), route.clone());
                coordinate::run(proxy, route, key, head, bytes, held).await
            }
            Err((kind, detail, retry)) => {
                (self.problems.respond(kind, &detail, retry), kind.anchor())
            }
        }
    }
}

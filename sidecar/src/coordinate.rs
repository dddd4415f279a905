//! A coordinated request: the coordinator decides (through the client
//! library's `run_once`) whether this request runs, waits, is refused, or
//! is answered from the stored response; when it runs, the upstream call
//! and the recording of its outcome happen in a task of their own, so a
//! client that hangs up abandons neither. Which upstream answers are
//! stored, recorded as failures, or released is decided in
//! [`crate::attempt`]; how each decision is answered, in [`answer`].

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::request::Parts;
use http::{HeaderValue, Response};
use http_body_util::BodyExt as _;
use idempotency_client::{Lease, RunOnceError, RunOptions, WhenLeaseLost};

use crate::attempt::{Answer, Decided, Failure, Slot, attempt};
use crate::body::{self, ProxyBody};
use crate::conn::OnConn;
use crate::fingerprint;
use crate::key::{self, IdempotencyKey};
use crate::problem::Problem;
use crate::proxy::{Outcome, Proxy};
use crate::recording;
use crate::routes::Route;
use crate::stored::{ResponseCodec, StoredResponse};
use crate::waiters::Waiting;

pub use crate::upstream::REPLAYED;

/// Coordinates one request whose body is `body`.
pub async fn run(
    proxy: Arc<Proxy>,
    route: Route,
    key: IdempotencyKey,
    head: Parts,
    body: Bytes,
    held: crate::budget::Held,
) -> (Response<ProxyBody>, Outcome) {
    let fingerprint = fingerprint::of(&fingerprint::Request {
        method: &head.method,
        path_and_query: head.uri.path_and_query().map_or("/", |p| p.as_str()),
        headers: &head.headers,
        named: &route.fingerprint_headers,
        body: &body,
        canonical_json: route.canonical_json,
    });
    let tenant = proxy.settings.tenant_header.as_ref();
    let namespace = key::namespace(&head.headers, tenant, &route.credentials);
    let coordinator_key = key.coordinator_key(&namespace);
    let settings = &proxy.settings;
    let wait = key::prefer_wait(&head.headers)
        .map(Duration::from_secs)
        .map_or(Duration::ZERO, |w| w.min(settings.max_wait));
    let options = RunOptions {
        lease_ttl: settings.lease_ttl,
        wait,
        max_attempts: settings.max_attempts,
        retention: settings.retention,
        // A request already sent upstream is not cut off: its answer still
        // reaches the client that caused it.
        when_lease_lost: WhenLeaseLost::LetFinish,
        ..RunOptions::default()
    };
    let Ok(waiting) = admit_waiter(&proxy, &head, wait) else {
        let detail = "too many requests are waiting (Prefer: wait) at once; retry";
        let retry = Some(Duration::from_secs(1));
        return problem(&proxy, Problem::Busy, detail, retry);
    };
    let slot: Slot = Arc::default();
    let task = {
        let (proxy, route, slot) = (Arc::clone(&proxy), route.clone(), Arc::clone(&slot));
        // Its own task: the client hanging up drops this handler, not the
        // upstream call nor the recording of its outcome.
        tokio::spawn(async move {
            let mut token = None;
            let work = |lease: Lease| {
                token = Some(lease.token().to_owned());
                attempt(&proxy, &route, lease, head, body, &slot)
            };
            let coordinator = if waiting.is_some() {
                &proxy.waiters.coordinator
            } else {
                &proxy.coordinator
            };
            let decided = coordinator
                .run_once_with_codec(
                    &ResponseCodec,
                    &route.scope,
                    &coordinator_key,
                    fingerprint,
                    &options,
                    work,
                )
                .await;
            let ids = (route.scope.as_str(), coordinator_key.as_str());
            let decided = recording::settle(&proxy, ids, token, &slot, decided).await;
            // The body's room in the budget, held as long as the body.
            drop((held, waiting));
            decided
        })
    };
    let decided = match task.await {
        Ok(decided) => decided,
        Err(error) => {
            tracing::error!(%error, "a coordinated request's task failed");
            return problem(
                &proxy,
                Problem::CoordinatorUnavailable,
                "internal error",
                None,
            );
        }
    };
    let kept = slot.lock().ok().and_then(|mut s| s.take());
    answer(&proxy, &route, decided, kept)
}

/// Every waiter slot (of the sidecar's, or of the request's connection)
/// is taken.
struct TooManyWaiters;

/// A request that waits does so on the waiters' channel, within their
/// bounds (503 busy past them); one that does not (`None`) decides on the
/// deciders' channel.
fn admit_waiter(
    proxy: &Proxy,
    head: &Parts,
    wait: Duration,
) -> Result<Option<Waiting>, TooManyWaiters> {
    if wait.is_zero() {
        return Ok(None);
    }
    let conn = head.extensions.get::<OnConn>();
    proxy.waiters.admit(conn).map(Some).ok_or(TooManyWaiters)
}

/// The client's answer to what the coordinator decided.
fn answer(
    proxy: &Proxy,
    route: &Route,
    decided: Decided,
    kept: Option<Answer>,
) -> (Response<ProxyBody>, Outcome) {
    let retry = |after: Option<Duration>| Some(after.unwrap_or(Duration::from_secs(1)));
    match decided {
        Ok(done) if done.replayed => {
            proxy.metrics.replay(&route.name);
            (replay(done.value), "replayed")
        }
        Ok(done) => {
            let answer = kept.unwrap_or_else(|| Answer {
                status: done.value.status,
                headers: done.value.header_map(),
                body: done.value.body,
                charge: None,
            });
            (respond(answer), "stored")
        }
        Err(RunOnceError::Work(failure)) => failed(proxy, route, failure),
        Err(RunOnceError::InProgress { retry_after, .. }) => {
            let detail = "another request with this key is being answered; retry later, or send Prefer: wait=N";
            problem(proxy, Problem::InProgress, detail, retry(retry_after))
        }
        Err(RunOnceError::RetryLater { retry_after, .. }) => {
            let detail = "the last attempt with this key failed and may be retried later";
            problem(proxy, Problem::RetryLater, detail, retry(retry_after))
        }
        Err(RunOnceError::Conflict { .. }) => {
            let detail = "this key was first used with a different request (method, path, body or named headers)";
            problem(proxy, Problem::FingerprintMismatch, detail, None)
        }
        Err(RunOnceError::Exhausted { last_error, .. }) => {
            let detail = format!("no attempts left for this key; last error: {last_error}");
            problem(proxy, Problem::AttemptsExhausted, &detail, None)
        }
        // LeaseLost, NotRecorded, Codec, Call, Database, and whatever
        // the client library adds (its error is non-exhaustive).
        Err(error) => unrecorded(proxy, &error, kept),
    }
}

/// The coordinator did not record this request's outcome: the upstream's
/// answer when there is one (the key will run again), else a problem.
fn unrecorded(
    proxy: &Proxy,
    error: &RunOnceError<Failure, StoredResponse>,
    kept: Option<Answer>,
) -> (Response<ProxyBody>, Outcome) {
    tracing::warn!(%error, answered = kept.is_some(), "an outcome was not recorded");
    if let Some(answer) = kept {
        return (respond(answer), "unrecorded");
    }
    let lease_lost = match error {
        RunOnceError::LeaseLost => true,
        RunOnceError::NotRecorded { error, .. } => error.is_lease_lost(),
        _ => false,
    };
    let (kind, detail) = if lease_lost {
        let detail = "the lease on this key ran out before the answer was stored; retry";
        (Problem::LeaseLost, detail.to_owned())
    } else {
        (Problem::CoordinatorUnavailable, error.to_string())
    };
    problem(proxy, kind, &detail, Some(Duration::from_secs(1)))
}

/// The answer to an attempt that stored nothing.
fn failed(proxy: &Proxy, route: &Route, failure: Failure) -> (Response<ProxyBody>, Outcome) {
    match failure {
        Failure::Status(answer) => (respond(answer), "upstream_failure"),
        Failure::Unstored(answer) => (respond(answer), "not_stored"),
        Failure::Upstream(error) => proxy.upstream_problem(&error),
        Failure::TooLarge {
            head,
            prefix,
            rest,
            limit,
        } => {
            tracing::warn!(
                route = %route.name,
                status = head.status.as_u16(),
                limit,
                "an answer too large to store was passed through and its key released"
            );
            proxy.metrics.too_large(&route.name);
            let response = Response::from_parts(head, body::chain(prefix, rest));
            (response, "too_large")
        }
    }
}

fn problem(
    proxy: &Proxy,
    kind: Problem,
    detail: &str,
    retry_after: Option<Duration>,
) -> (Response<ProxyBody>, Outcome) {
    (
        proxy.problems.respond(kind, detail, retry_after),
        kind.anchor(),
    )
}

fn respond(answer: Answer) -> Response<ProxyBody> {
    let mut body = body::full(answer.body);
    if let Some(charge) = answer.charge {
        // The answer's room in the budget is held until it has been sent.
        body = body
            .map_frame(move |frame| {
                let _held = &charge;
                frame
            })
            .boxed_unsync();
    }
    let mut response = Response::new(body);
    *response.status_mut() = answer.status;
    *response.headers_mut() = answer.headers;
    response
}

/// A stored answer, byte for byte, marked as a replay.
fn replay(stored: StoredResponse) -> Response<ProxyBody> {
    let mut headers = stored.header_map();
    headers.insert(REPLAYED, HeaderValue::from_static("true"));
    let mut response = Response::new(body::full(stored.body));
    *response.status_mut() = stored.status;
    *response.headers_mut() = headers;
    response
}

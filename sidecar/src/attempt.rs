//! One attempt of a coordinated request: the upstream called under the
//! lease, and what it produced: the answer to store, or why there is none
//! ([`Failure`]: recorded as a failure, or the key released). The answer
//! the client that caused it gets is kept in a [`Slot`], stored or not.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::request::Parts;
use http::{HeaderMap, HeaderValue, Request, StatusCode};
use hyper::body::Incoming;
use idempotency_client::{Done, Lease, RunOnceError, WorkError};

use crate::answers::Charge;
use crate::body::{self, Read};
use crate::key;
use crate::proxy::Proxy;
use crate::routes::Route;
use crate::stored::StoredResponse;
use crate::upstream::{
    ATTEMPT, FENCING_TOKEN, Upstream, UpstreamError, is_hop_by_hop, strip_hop_by_hop,
};

/// The upstream's answer as the client that caused it gets it: every
/// end-to-end header, not only those stored.
#[derive(Debug, Clone)]
pub struct Answer {
    pub(crate) status: StatusCode,
    pub(crate) headers: HeaderMap,
    pub(crate) body: Bytes,
    /// Its room in the answer budget, held until it has been sent.
    pub(crate) charge: Option<Arc<Charge>>,
}

/// Why an attempt produced no answer to store.
#[derive(Debug, thiserror::Error)]
pub enum Failure {
    /// The upstream answered with a status recorded as a failure.
    #[error("the upstream answered {}", .0.status)]
    Status(Answer),
    /// The upstream answered with a status never stored (401, 403): the
    /// key is released.
    #[error("the upstream answered {}, which is not stored", .0.status)]
    Unstored(Answer),
    /// The upstream gave no answer.
    #[error("{0}")]
    Upstream(UpstreamError),
    /// The answer is too large to store: what was read, and the rest.
    #[error("the upstream's answer is larger than the {limit} bytes stored")]
    TooLarge {
        /// The answer's head.
        head: http::response::Parts,
        /// What was read of the body.
        prefix: Bytes,
        /// The rest of the body, streamed to the client.
        rest: Incoming,
        /// The limit passed.
        limit: usize,
    },
}

/// The answer the attempt got, kept for the client that caused it even
/// when it cannot be stored.
pub type Slot = Arc<Mutex<Option<Answer>>>;

/// What the coordinator decided, through `run_once`.
pub type Decided = Result<Done<StoredResponse>, RunOnceError<Failure, StoredResponse>>;

/// One run of the upstream under `lease`: the answer to store, or why
/// there is none.
pub async fn attempt(
    proxy: &Proxy,
    route: &Route,
    lease: Lease,
    head: Parts,
    body: Bytes,
    slot: &Slot,
) -> Result<StoredResponse, WorkError<Failure>> {
    let started = Instant::now();
    let extra = vec![
        (FENCING_TOKEN, HeaderValue::from(lease.fencing_token())),
        (ATTEMPT, HeaderValue::from(lease.attempt())),
    ];
    let mut request = Request::from_parts(head, body::full(body));
    // The body is already here: the upstream need not ask for it.
    request.headers_mut().remove(http::header::EXPECT);
    let upstream = &proxy.upstream;
    let response = upstream
        .send(request, extra)
        .await
        .map_err(|e| proxy.retryable(Failure::Upstream(e)))?;
    let (mut head, incoming) = response.into_parts();
    strip_hop_by_hop(&mut head.headers);
    let stored_headers: Vec<_> = head
        .headers
        .iter()
        .filter(|(name, _)| !is_hop_by_hop(name) && route.store_headers.allows(name))
        .map(|(name, value)| (name.clone(), value.clone()))
        .collect();
    let limit = proxy.settings.max_stored_bytes;
    let budget = limit.saturating_sub(StoredResponse::encoded_len(&stored_headers, 0));
    let left = upstream.timeout.saturating_sub(started.elapsed());
    let mut charge = proxy.answers.charge();
    let declared = http_body::Body::size_hint(&incoming).upper();
    let expected = declared.map_or(budget, |bytes| usize::try_from(bytes).unwrap_or(budget));
    let reading = async {
        charge.reserve(expected.min(budget)).await;
        body::read_limited(incoming, budget).await
    };
    let read = match tokio::time::timeout(left, reading).await {
        Ok(Ok(read)) => read,
        Ok(Err(e)) => {
            let error = UpstreamError::Unreachable(format!("the body broke off: {e}"));
            return Err(proxy.retryable(Failure::Upstream(error)));
        }
        Err(_) => {
            let error = UpstreamError::Timeout(upstream.timeout);
            return Err(proxy.retryable(Failure::Upstream(error)));
        }
    };
    proxy.metrics.upstream_latency(started.elapsed());
    let body = match read {
        Read::Whole(body) => body,
        Read::Over(prefix, rest) => {
            let failure = Failure::TooLarge {
                head,
                prefix,
                rest,
                limit,
            };
            return Err(WorkError::Release(failure));
        }
    };
    let answer = Answer {
        status: head.status,
        headers: head.headers,
        body: body.clone(),
        charge: Some(Arc::new(charge)),
    };
    if upstream.is_retryable(answer.status) {
        let after = key::retry_after_seconds(&answer.headers)
            .map_or(proxy.settings.failure_retry_after, Duration::from_secs);
        return Err(WorkError::RetryAfter(Failure::Status(answer), after));
    }
    if Upstream::is_unstored(answer.status) {
        return Err(WorkError::Release(Failure::Unstored(answer)));
    }
    let status = answer.status;
    if let Ok(mut kept) = slot.lock() {
        *kept = Some(answer);
    }
    Ok(StoredResponse {
        status,
        headers: stored_headers,
        body,
    })
}

impl Proxy {
    /// A failure the key's next request retries, after
    /// `--failure-retry-after`.
    fn retryable(&self, failure: Failure) -> WorkError<Failure> {
        WorkError::RetryAfter(failure, self.settings.failure_retry_after)
    }
}

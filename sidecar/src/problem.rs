//! Every answer the sidecar makes itself rather than the upstream: an RFC
//! 9457 `application/problem+json` body whose `type` links to the problem's
//! anchor in docs/sidecar.md. The status of each problem is decided here.

use std::time::Duration;

use http::{HeaderValue, Response, StatusCode};

use crate::body::{self, ProxyBody};

/// A problem the sidecar answers with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Problem {
    /// 400: the route requires a key and none was sent.
    MissingKey,
    /// 400: the key is not an sf-string or token, or too long.
    InvalidKey,
    /// 400: the path cannot be read as the upstream would read it.
    InvalidPath,
    /// 413: the request body is over the limit.
    BodyTooLarge,
    /// 408: the request body did not arrive in time.
    BodyTimeout,
    /// 422: the key was first used with a different request.
    FingerprintMismatch,
    /// 409: another request with the key is being answered.
    InProgress,
    /// 503: the last attempt failed and its retry is not due yet.
    RetryLater,
    /// 409: the key's attempts are used up; use a new key.
    AttemptsExhausted,
    /// 502: the upstream could not be reached or broke off.
    UpstreamUnavailable,
    /// 504: the upstream did not answer in time.
    UpstreamTimeout,
    /// 503: the coordinator could not decide.
    CoordinatorUnavailable,
    /// 503: the lease ran out before the answer was stored.
    LeaseLost,
    /// 503: too many request bodies are held at once.
    Busy,
}

impl Problem {
    /// The anchor in docs/sidecar.md, also the metric's outcome label.
    pub fn anchor(self) -> &'static str {
        match self {
            Problem::MissingKey => "missing-key",
            Problem::InvalidKey => "invalid-key",
            Problem::InvalidPath => "invalid-path",
            Problem::BodyTooLarge => "body-too-large",
            Problem::BodyTimeout => "body-timeout",
            Problem::FingerprintMismatch => "fingerprint-mismatch",
            Problem::InProgress => "in-progress",
            Problem::RetryLater => "retry-later",
            Problem::AttemptsExhausted => "attempts-exhausted",
            Problem::UpstreamUnavailable => "upstream-unavailable",
            Problem::UpstreamTimeout => "upstream-timeout",
            Problem::CoordinatorUnavailable => "coordinator-unavailable",
            Problem::LeaseLost => "lease-lost",
            Problem::Busy => "busy",
        }
    }

    /// The HTTP status.
    pub fn status(self) -> StatusCode {
        match self {
            Problem::MissingKey | Problem::InvalidKey | Problem::InvalidPath => {
                StatusCode::BAD_REQUEST
            }
            Problem::BodyTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            Problem::BodyTimeout => StatusCode::REQUEST_TIMEOUT,
            Problem::FingerprintMismatch => StatusCode::UNPROCESSABLE_ENTITY,
            Problem::InProgress | Problem::AttemptsExhausted => StatusCode::CONFLICT,
            Problem::UpstreamUnavailable => StatusCode::BAD_GATEWAY,
            Problem::UpstreamTimeout => StatusCode::GATEWAY_TIMEOUT,
            Problem::RetryLater
            | Problem::CoordinatorUnavailable
            | Problem::LeaseLost
            | Problem::Busy => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    fn title(self) -> &'static str {
        match self {
            Problem::MissingKey => "Idempotency-Key required",
            Problem::InvalidKey => "Invalid Idempotency-Key",
            Problem::InvalidPath => "Ambiguous request path",
            Problem::BodyTooLarge => "Request body too large",
            Problem::BodyTimeout => "Request body too slow",
            Problem::FingerprintMismatch => "Idempotency-Key reused for a different request",
            Problem::InProgress => "A request with this Idempotency-Key is in progress",
            Problem::RetryLater => "Retry later",
            Problem::AttemptsExhausted => "No attempts left for this Idempotency-Key",
            Problem::UpstreamUnavailable => "Upstream unavailable",
            Problem::UpstreamTimeout => "Upstream timed out",
            Problem::CoordinatorUnavailable => "Coordinator unavailable",
            Problem::LeaseLost => "The answer could not be stored",
            Problem::Busy => "Too busy",
        }
    }
}

/// Where problem types point: `<base>#<anchor>`.
#[derive(Debug, Clone)]
pub struct Problems {
    /// The URL of docs/sidecar.md as published.
    pub base: String,
}

impl Problems {
    /// The problem's response, with `detail` and, when given, `Retry-After`.
    pub fn respond(
        &self,
        problem: Problem,
        detail: &str,
        retry_after: Option<Duration>,
    ) -> Response<ProxyBody> {
        let status = problem.status();
        let body = serde_json::json!({
            "type": format!("{}#{}", self.base, problem.anchor()),
            "title": problem.title(),
            "status": status.as_u16(),
            "detail": detail,
        });
        let mut response = Response::new(body::full(body.to_string()));
        *response.status_mut() = status;
        response.headers_mut().insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        if let Some(after) = retry_after {
            // Whole seconds, rounded up, at least one.
            let secs = after.as_secs() + u64::from(after.subsec_nanos() > 0);
            response
                .headers_mut()
                .insert(http::header::RETRY_AFTER, HeaderValue::from(secs.max(1)));
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_problem_links_to_its_anchor_and_says_when_to_retry() {
        let problems = Problems {
            base: "https://example.test/docs/sidecar.md".into(),
        };
        let r = problems.respond(Problem::InProgress, "d", Some(Duration::from_millis(1500)));
        assert_eq!(r.status(), StatusCode::CONFLICT);
        assert_eq!(r.headers()["retry-after"], "2");
        assert_eq!(r.headers()["content-type"], "application/problem+json");
    }
}

//! The upstream: the HTTP client (HTTP/1.1, or h2c with prior knowledge),
//! how a client's request becomes the upstream's (hop-by-hop headers
//! dropped, the key's lease in headers), and which upstream answers are
//! failures to retry rather than answers to keep, and which are neither.
//! Those decisions are made here ([`Upstream::is_retryable`],
//! [`Upstream::is_unstored`]).

use std::time::Duration;

use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Request, Response, StatusCode, Uri};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

use crate::body::ProxyBody;

/// The headers the upstream gets with a coordinated request.
pub const FENCING_TOKEN: HeaderName = HeaderName::from_static("idempotency-fencing-token");
/// The attempt, counting from 1.
pub const ATTEMPT: HeaderName = HeaderName::from_static("idempotency-attempt");
/// Marks a replayed answer; the sidecar's alone, never the upstream's.
pub const REPLAYED: HeaderName = HeaderName::from_static("idempotent-replayed");

/// Why the upstream gave no answer.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    /// Connecting or sending failed, or the connection broke.
    #[error("the upstream could not be reached: {0}")]
    Unreachable(String),
    /// No answer within the timeout.
    #[error("the upstream did not answer within {0:?}")]
    Timeout(Duration),
}

/// The upstream and how to talk to it.
#[derive(Clone)]
pub struct Upstream {
    client: Client<HttpConnector, ProxyBody>,
    /// Scheme and authority (and a path prefix, if any) of the upstream.
    base: Uri,
    /// How long the upstream may take to answer (headers and body).
    pub timeout: Duration,
    /// The statuses recorded as retryable failures.
    retry_statuses: RetryStatuses,
}

/// Which upstream statuses are failures the next request retries.
#[derive(Debug, Clone)]
pub struct RetryStatuses {
    /// Every 5xx.
    pub server_errors: bool,
    /// And these (408 and 429 by default).
    pub also: Vec<StatusCode>,
}

impl Upstream {
    /// A client of `base` (`http://host:port`); `h2c` speaks HTTP/2 with
    /// prior knowledge.
    pub fn new(base: Uri, h2c: bool, timeout: Duration, retry_statuses: RetryStatuses) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(timeout));
        let client = Client::builder(TokioExecutor::new())
            .http2_only(h2c)
            .pool_idle_timeout(Duration::from_secs(30))
            .build(connector);
        Upstream {
            client,
            base,
            timeout,
            retry_statuses,
        }
    }

    /// Whether an upstream answer with `status` is a failure to retry.
    pub fn is_retryable(&self, status: StatusCode) -> bool {
        (self.retry_statuses.server_errors && status.is_server_error())
            || self.retry_statuses.also.contains(&status)
    }

    /// Whether an upstream answer with `status` is neither stored nor
    /// recorded as a failure: 401 and 403 say who the caller is, not what
    /// the request did, so the key is released and the caller's next
    /// request (with credentials, say) runs.
    pub fn is_unstored(status: StatusCode) -> bool {
        status == StatusCode::UNAUTHORIZED || status == StatusCode::FORBIDDEN
    }

    /// Sends `request` (its URI's path and query kept, the rest the
    /// upstream's) with `extra` headers; the answer's head within the
    /// timeout.
    pub async fn send(
        &self,
        mut request: Request<ProxyBody>,
        extra: Vec<(HeaderName, HeaderValue)>,
    ) -> Result<Response<Incoming>, UpstreamError> {
        let path_and_query = request
            .uri()
            .path_and_query()
            .map_or("/", http::uri::PathAndQuery::as_str)
            .to_owned();
        *request.uri_mut() = self.uri(&path_and_query)?;
        *request.version_mut() = http::Version::HTTP_11;
        let headers = request.headers_mut();
        strip_hop_by_hop(headers);
        headers.remove(&FENCING_TOKEN);
        headers.remove(&ATTEMPT);
        if let Some(host) = headers.remove(header::HOST) {
            headers.insert(HeaderName::from_static("x-forwarded-host"), host);
        }
        for (name, value) in extra {
            headers.insert(name, value);
        }
        match tokio::time::timeout(self.timeout, self.client.request(request)).await {
            Ok(Ok(mut response)) => {
                // Only the sidecar says what is a replay: an upstream's own
                // marker would tell a client its first answer was one.
                response.headers_mut().remove(&REPLAYED);
                Ok(response)
            }
            Ok(Err(error)) => Err(UpstreamError::Unreachable(error_chain(&error))),
            Err(_) => Err(UpstreamError::Timeout(self.timeout)),
        }
    }

    fn uri(&self, path_and_query: &str) -> Result<Uri, UpstreamError> {
        let prefix = self.base.path().trim_end_matches('/');
        let mut parts = self.base.clone().into_parts();
        parts.path_and_query = Some(
            format!("{prefix}{path_and_query}")
                .parse()
                .map_err(|e| UpstreamError::Unreachable(format!("bad path: {e}")))?,
        );
        Uri::from_parts(parts).map_err(|e| UpstreamError::Unreachable(format!("bad URI: {e}")))
    }
}

fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// The hop-by-hop headers of RFC 9110 section 7.6.1, and those the
/// `Connection` header names: a proxy never forwards nor stores them.
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| HeaderName::from_bytes(n.trim().as_bytes()).ok())
        .collect();
    for name in named {
        headers.remove(name);
    }
    for name in HOP_BY_HOP {
        headers.remove(name);
    }
}

/// Whether `name` is hop-by-hop (never stored).
pub fn is_hop_by_hop(name: &HeaderName) -> bool {
    HOP_BY_HOP.contains(&name.as_str()) || name == header::CONTENT_LENGTH
}

const HOP_BY_HOP: [&str; 9] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hop_by_hop_headers_are_dropped() {
        let mut headers = HeaderMap::new();
        headers.insert("connection", "close, x-private".parse().unwrap());
        headers.insert("x-private", "1".parse().unwrap());
        headers.insert("keep-alive", "5".parse().unwrap());
        headers.insert("content-type", "text/plain".parse().unwrap());
        strip_hop_by_hop(&mut headers);
        assert_eq!(headers.len(), 1);
        assert!(is_hop_by_hop(&header::TRANSFER_ENCODING));
        assert!(!is_hop_by_hop(&header::CONTENT_TYPE));
    }
}

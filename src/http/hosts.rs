//! Which `Host` the HTTP port answers to, against DNS rebinding: a web page
//! whose name the attacker points at this server afterwards is, to the
//! browser, still of its own origin, and its requests carry its own name as
//! `Host`. IP addresses (a page at an address is that address's own),
//! `localhost` (and `*.localhost`, which browsers resolve locally) and the
//! names of `--http-allowed-hosts` are answered; another name is refused
//! with 421 Misdirected Request on the console, and on every route when the
//! server runs without credentials (with credentials a rebound page holds
//! no token to call with).

use std::net::IpAddr;

use bytes::Bytes;
use http::{HeaderValue, Request, Response, StatusCode, header};
use http_body_util::{BodyExt as _, Full};

use crate::metrics::{self, Metrics};
use crate::transport::HttpBody;

/// The host names answered besides IP addresses and localhost.
#[derive(Debug, Clone, Default)]
pub struct AllowedHosts(Vec<String>);

impl AllowedHosts {
    /// `names` as `--http-allowed-hosts` gives them: any case, a port and
    /// a final dot ignored.
    pub fn new(names: &[String]) -> Self {
        AllowedHosts(
            names
                .iter()
                .map(|n| normal(name_of(n.trim())))
                .filter(|n| !n.is_empty())
                .collect(),
        )
    }

    /// Whether `request`'s host (its URI's authority, else its `Host`
    /// header) is one this server answers to. A request without one (HTTP/1.0)
    /// is answered: browsers always send it.
    pub fn allow<B>(&self, request: &Request<B>) -> bool {
        let host = match request.uri().authority() {
            Some(authority) => Some(authority.as_str()),
            None => request
                .headers()
                .get(header::HOST)
                .and_then(|v| v.to_str().ok()),
        };
        host.is_none_or(|host| self.allows(host))
    }

    fn allows(&self, authority: &str) -> bool {
        // A userinfo@ prefix is no part of the host.
        let authority = authority.rsplit('@').next().unwrap_or(authority);
        let name = name_of(authority);
        if name.parse::<IpAddr>().is_ok() {
            return true;
        }
        let name = normal(name);
        name == "localhost" || name.ends_with(".localhost") || self.0.contains(&name)
    }
}

/// The host of `host[:port]` or `[v6]:port`.
fn name_of(authority: &str) -> &str {
    if let Some(rest) = authority.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    match authority.rsplit_once(':') {
        Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => authority,
    }
}

fn normal(name: &str) -> String {
    name.trim_end_matches('.').to_ascii_lowercase()
}

/// The answer to a request for another host, counted as refused
/// (`reason="unknown_host"`); the host is not echoed.
pub fn misdirected(metrics: &Metrics) -> Response<HttpBody> {
    metrics.request_refused(metrics::Port::Http, "unknown_host");
    tracing::debug!("HTTP request for a host not answered to refused");
    let text = "this server does not answer to this Host: add the name to --http-allowed-hosts\n";
    let mut response = Response::new(Full::new(Bytes::from_static(text.as_bytes())).boxed_unsync());
    *response.status_mut() = StatusCode::MISDIRECTED_REQUEST;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_localhost_and_listed_names_are_answered() {
        let hosts = AllowedHosts::new(&["Coordinator.Internal.".into(), "idem:8080".into()]);
        for host in [
            "127.0.0.1:8080",
            "[::1]:8080",
            "10.1.2.3",
            "localhost:9000",
            "app.localhost",
            "coordinator.internal:8081",
            "COORDINATOR.internal.",
            "idem",
        ] {
            assert!(hosts.allows(host), "{host}");
        }
        for host in [
            "rebind.evil.example",
            "rebind.evil.example:8080",
            "localhost.evil.example",
            "127.0.0.1.evil.example",
            "internal",
        ] {
            assert!(!hosts.allows(host), "{host}");
        }
    }
}

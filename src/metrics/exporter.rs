//! The metrics listener (`--metrics-listen`): `GET /metrics` over plain
//! HTTP/1.1, in the format the scraper asks for, with a cap on scrape
//! connections that a peer holding connections open cannot use to keep a
//! scraper out.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method as HttpMethod, Request, Response, StatusCode, header};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;

use super::Metrics;
use super::snapshot::{Snapshot, apply};

/// Scrape connections open at once; past it, a new one closes the one idle
/// longest (if idle for `SCRAPE_EVICTABLE_AFTER`), or waits for one to end.
pub const MAX_SCRAPE_CONNECTIONS: usize = 128;

/// How long a scrape connection must have gone without a request before a
/// new connection may close it: a scraper's connection sends its request
/// at once, and is never closed before the server has read it.
const SCRAPE_EVICTABLE_AFTER: Duration = Duration::from_millis(250);

/// How long a scraper may take to send its request's headers.
const SCRAPE_HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// The text format a scraper asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// OpenMetrics 1.0 text (what Prometheus asks for first).
    OpenMetrics,
    /// The Prometheus text format 0.0.4 (anything else, curl included).
    Prometheus,
}

impl Format {
    /// The format a request's `Accept` header prefers.
    fn accepted(accept: Option<&str>) -> Format {
        match accept {
            Some(accept) if accept.contains("application/openmetrics-text") => Format::OpenMetrics,
            _ => Format::Prometheus,
        }
    }

    fn content_type(self) -> &'static str {
        match self {
            Format::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
            Format::Prometheus => "text/plain; version=0.0.4; charset=utf-8",
        }
    }
}

impl Metrics {
    /// Every metric, with the state in `snapshot`, in `format`.
    pub fn render(&self, format: Format, snapshot: &Snapshot) -> String {
        render(&self.0, format, snapshot)
    }

    /// Serves `GET /metrics` on `listener` until the future is dropped or
    /// aborted, reading the state from `snapshot` at each scrape.
    pub async fn serve(&self, listener: TcpListener, snapshot: SnapshotFn) {
        serve(self.clone(), listener, snapshot).await;
    }
}

fn render(m: &super::Registered, format: Format, snapshot: &Snapshot) -> String {
    apply(m, snapshot);
    let mut text = String::with_capacity(16 * 1024);
    let encoded = match format {
        Format::OpenMetrics => prometheus_client::encoding::text::encode(&mut text, &m.registry),
        Format::Prometheus => {
            prometheus_client::encoding::prometheus_text::encode(&mut text, &m.registry)
        }
    };
    // Writing into a String cannot fail; a metric that could not encode
    // would be a bug in this module.
    encoded.expect("metrics encode into a String");
    text
}

/// What reads the state at scrape time.
pub type SnapshotFn = Arc<dyn Fn() -> Snapshot + Send + Sync>;

fn answer(
    metrics: &Metrics,
    request: &Request<Incoming>,
    snapshot: &SnapshotFn,
) -> Response<String> {
    let plain = |status: StatusCode, text: &str| {
        let mut response = Response::new(format!("{text}\n"));
        *response.status_mut() = status;
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            header::HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        response
    };
    if request.uri().path() != "/metrics" {
        return plain(StatusCode::NOT_FOUND, "not found; metrics are at /metrics");
    }
    if request.method() != HttpMethod::GET && request.method() != HttpMethod::HEAD {
        let mut response = plain(StatusCode::METHOD_NOT_ALLOWED, "GET /metrics");
        response
            .headers_mut()
            .insert(header::ALLOW, header::HeaderValue::from_static("GET, HEAD"));
        return response;
    }
    let format = Format::accepted(
        request
            .headers()
            .get(header::ACCEPT)
            .and_then(|v| v.to_str().ok()),
    );
    let mut response = Response::new(metrics.render(format, &snapshot()));
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static(format.content_type()),
    );
    response
}

/// The scrape connections open, each with the moment it was accepted or
/// last began a request. When all [`MAX_SCRAPE_CONNECTIONS`] are open, a new
/// connection closes the one that has gone longest without a request: a
/// peer that opens connections and sends half a request head (or nothing)
/// cannot keep a scraper out, since a scraper sends its request as soon as
/// it connects.
#[derive(Default)]
struct Scrapers {
    open: std::sync::Mutex<OpenScrapes>,
}

/// Each open scrape connection, by number: when it last began a request
/// (or was accepted), and its task.
type OpenScrapes = std::collections::HashMap<u64, (Instant, tokio::task::AbortHandle)>;

impl Scrapers {
    fn lock(&self) -> std::sync::MutexGuard<'_, OpenScrapes> {
        self.open.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether there is room for one more connection, closing the one that
    /// has gone longest without a request if all the room is taken and it
    /// has been idle long enough.
    fn make_room(&self) -> bool {
        let mut open = self.lock();
        if open.len() < MAX_SCRAPE_CONNECTIONS {
            return true;
        }
        let Some((id, at)) = open
            .iter()
            .min_by_key(|(_, (at, _))| *at)
            .map(|(id, (at, _))| (*id, *at))
        else {
            return true;
        };
        if at.elapsed() < SCRAPE_EVICTABLE_AFTER {
            return false;
        }
        if let Some((_, task)) = open.remove(&id) {
            task.abort();
            tracing::debug!("metrics listener: closed the scrape connection idle longest");
        }
        true
    }

    fn active(&self, id: u64) {
        if let Some((at, _)) = self.lock().get_mut(&id) {
            *at = Instant::now();
        }
    }
}

/// Takes a connection out of [`Scrapers`] when its task ends or is aborted.
struct Open {
    scrapers: Arc<Scrapers>,
    id: u64,
}

impl Drop for Open {
    fn drop(&mut self) {
        self.scrapers.lock().remove(&self.id);
    }
}

/// Serves `metrics` at `GET /metrics` over plain HTTP/1.1 on `listener`
/// until the task is aborted, reading the state from `snapshot` at each
/// scrape. At most
/// `MAX_SCRAPE_CONNECTIONS` connections are open at once, each given at
/// most `SCRAPE_HEADER_TIMEOUT` for a request head; past the cap a new
/// connection takes the place of the one idle longest.
async fn serve(metrics: Metrics, listener: TcpListener, snapshot: SnapshotFn) {
    let scrapers = Arc::new(Scrapers::default());
    let mut http = http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(SCRAPE_HEADER_TIMEOUT);
    for id in 0u64.. {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                // Out of descriptors, most likely: let some close first.
                tracing::warn!(error = %e, "metrics listener: cannot accept a connection");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        while !scrapers.make_room() {
            tokio::time::sleep(SCRAPE_EVICTABLE_AFTER / 5).await;
        }
        let snapshot = Arc::clone(&snapshot);
        let metrics = metrics.clone();
        let seen = Arc::clone(&scrapers);
        let connection = http.serve_connection(
            TokioIo::new(stream),
            service_fn(move |request| {
                seen.active(id);
                let response = answer(&metrics, &request, &snapshot);
                async move { Ok::<_, Infallible>(response) }
            }),
        );
        let open = Open {
            scrapers: Arc::clone(&scrapers),
            id,
        };
        // Registered before the task can end (it takes the same lock to
        // leave).
        let mut registry = scrapers.lock();
        let task = tokio::spawn(async move {
            let _open = open;
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "metrics connection ended");
            }
        });
        registry.insert(id, (Instant::now(), task.abort_handle()));
    }
}

#[cfg(test)]
mod tests {
    use tonic::Code;

    use super::*;
    use crate::metrics::Rpc;

    #[test]
    fn scrapers_get_the_format_they_ask_for() {
        assert_eq!(
            Format::accepted(Some(
                "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"
            )),
            Format::OpenMetrics
        );
        assert_eq!(Format::accepted(Some("*/*")), Format::Prometheus);
        assert_eq!(Format::accepted(None), Format::Prometheus);
    }

    #[test]
    fn both_formats_carry_the_metrics_and_openmetrics_ends_with_eof() {
        let metrics = Metrics::new();
        Rpc::start(&metrics, "/idempotency.v1.Coordinator/Get").finish(Code::NotFound);
        let snapshot = Snapshot {
            pool_max_size: 7,
            ..Snapshot::default()
        };
        let open = metrics.render(Format::OpenMetrics, &snapshot);
        assert!(open.ends_with("# EOF\n"), "{open}");
        assert!(open.contains("idempotency_db_pool_max_size 7\n"), "{open}");
        assert!(open.contains(
            "idempotency_rpcs_total{service=\"idempotency.v1.Coordinator\",method=\"Get\",code=\"NOT_FOUND\"}"
        ));
        let prom = metrics.render(Format::Prometheus, &snapshot);
        assert!(!prom.contains("# EOF"));
        assert!(
            prom.contains("# TYPE idempotency_rpcs_total counter"),
            "{prom}"
        );
        assert!(
            prom.contains("idempotency_rpc_duration_seconds_count{"),
            "{prom}"
        );
    }
}

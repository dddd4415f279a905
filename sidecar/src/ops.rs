//! Operations: readiness that follows the coordinator's own (the standard
//! gRPC health check of its `idempotency.v1.Coordinator` service, which is
//! serving only while its database is), and the metrics listener serving
//! `/metrics`, `/healthz` (liveness: the process answers) and `/readyz`.
//! Whether the sidecar is ready is decided here.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

use crate::body::{self, ProxyBody};
use crate::metrics::Metrics;

/// The coordinator's service whose health is followed.
pub const COORDINATOR_SERVICE: &str = "idempotency.v1.Coordinator";

/// Whether the coordinator last answered as serving.
#[derive(Clone, Default)]
pub struct Readiness(Arc<AtomicBool>);

impl Readiness {
    /// Whether requests can be coordinated now.
    pub fn is_ready(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

/// Asks the coordinator for its health every `interval` until `stop`.
pub async fn follow_health(
    channel: Channel,
    interval: Duration,
    readiness: Readiness,
    metrics: Metrics,
    stop: CancellationToken,
) {
    let mut client = HealthClient::new(channel);
    loop {
        let mut request = tonic::Request::new(HealthCheckRequest {
            service: COORDINATOR_SERVICE.to_owned(),
        });
        request.set_timeout(interval.max(Duration::from_secs(1)));
        let serving = match client.check(request).await {
            Ok(answer) => answer.into_inner().status() == ServingStatus::Serving,
            Err(status) => {
                tracing::debug!(%status, "coordinator health check failed");
                false
            }
        };
        if serving != readiness.0.swap(serving, Ordering::Relaxed) {
            tracing::info!(serving, "coordinator readiness changed");
        }
        metrics.coordinator_ready.set(i64::from(serving));
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(interval) => {}
        }
    }
}

/// Serves the metrics listener until `stop`.
pub async fn serve(
    listener: TcpListener,
    metrics: Metrics,
    readiness: Readiness,
    draining: CancellationToken,
    stop: CancellationToken,
) {
    loop {
        let stream = tokio::select! {
            () = stop.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(error) => {
                    tracing::warn!(%error, "metrics listener accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let (metrics, readiness, draining) = (metrics.clone(), readiness.clone(), draining.clone());
        let service = service_fn(move |request: Request<Incoming>| {
            let response = answer(request.uri().path(), &metrics, &readiness, &draining);
            async move { Ok::<_, Infallible>(response) }
        });
        tokio::spawn(async move {
            let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
            let _ = builder
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

fn answer(
    path: &str,
    metrics: &Metrics,
    readiness: &Readiness,
    draining: &CancellationToken,
) -> Response<ProxyBody> {
    let (status, content_type, text) = match path {
        "/metrics" => (
            StatusCode::OK,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
            metrics.encode(),
        ),
        "/healthz" => (StatusCode::OK, "text/plain", "ok\n".to_owned()),
        "/readyz" if draining.is_cancelled() => (
            StatusCode::SERVICE_UNAVAILABLE,
            "text/plain",
            "draining\n".to_owned(),
        ),
        "/readyz" if readiness.is_ready() => (StatusCode::OK, "text/plain", "ready\n".to_owned()),
        "/readyz" => (
            StatusCode::SERVICE_UNAVAILABLE,
            "text/plain",
            "the coordinator is not serving\n".to_owned(),
        ),
        _ => (
            StatusCode::NOT_FOUND,
            "text/plain",
            "not found\n".to_owned(),
        ),
    };
    let mut response = Response::new(body::full(text));
    *response.status_mut() = status;
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static(content_type),
    );
    response
}

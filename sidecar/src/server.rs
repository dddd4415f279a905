//! The client-facing listener: HTTP/1.1 and h2c on one port, at most
//! `max_connections` connections at once (more wait to be accepted), a
//! deadline on each request head, and a graceful drain: on shutdown no new
//! connection is accepted and those open finish their requests, within the
//! drain timeout.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use crate::proxy::Proxy;

/// The listener's limits.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Connections served at once.
    pub max_connections: usize,
    /// Concurrent HTTP/2 streams per connection.
    pub max_streams: u32,
    /// How long a request head may take (HTTP/1.1).
    pub header_read_timeout: Duration,
    /// How long open connections have to finish once draining.
    pub drain_timeout: Duration,
}

/// Serves `listener` until `draining` is cancelled, then drains.
pub async fn serve(
    listener: TcpListener,
    proxy: Arc<Proxy>,
    limits: Limits,
    draining: CancellationToken,
) {
    let mut builder = Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(limits.max_streams)
        .keep_alive_interval(Duration::from_secs(30));
    let builder = Arc::new(builder);
    let graceful = GracefulShutdown::new();
    let permits = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    loop {
        let permit = tokio::select! {
            () = draining.cancelled() => break,
            permit = Arc::clone(&permits).acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => break,
            },
        };
        let stream = tokio::select! {
            () = draining.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(error) => {
                    // Out of file descriptors, say: back off, do not spin.
                    tracing::warn!(%error, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
        let proxy_for_conn = Arc::clone(&proxy);
        let service = service_fn(move |request: hyper::Request<Incoming>| {
            let proxy = Arc::clone(&proxy_for_conn);
            async move { Ok::<_, Infallible>(proxy.handle(request).await) }
        });
        let connection = builder
            .serve_connection(TokioIo::new(stream), service)
            .into_owned();
        let watched = graceful.watch(connection);
        let metrics = proxy.metrics.clone();
        metrics.connections.inc();
        tokio::spawn(async move {
            if let Err(error) = watched.await {
                tracing::debug!(%error, "client connection ended with an error");
            }
            metrics.connections.dec();
            drop(permit);
        });
    }
    drop(listener);
    tracing::info!(open = graceful.count(), "draining client connections");
    if tokio::time::timeout(limits.drain_timeout, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!(timeout = ?limits.drain_timeout, "connections still open after the drain timeout");
    }
}

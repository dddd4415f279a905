//! One client connection, served over HTTP/2: its calls go through
//! [`Admission`]; it is closed gracefully (GOAWAY, calls in flight finish)
//! when it has had no call for the idle timeout or when the server drains,
//! and dropped when its peer stops answering keepalive pings.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper::body::Incoming;
use hyper::server::conn::http2;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::watch;
use tracing::Instrument as _;

use super::ConnectionLimits;
use super::activity::Activity;
use super::admission::Admission;
use crate::error::cause_chain;

/// Resolves once the connection has had no open call for `timeout`.
async fn idle(activity: &Activity, timeout: Duration) {
    // While calls are open, look again every quarter of the timeout; once
    // none is, sleep until the timeout would run out and check again.
    let tick = (timeout / 4).max(Duration::from_millis(10));
    loop {
        match activity.idle_for() {
            Some(idle) if idle >= timeout => return,
            Some(idle) => tokio::time::sleep(timeout - idle).await,
            None => tokio::time::sleep(tick).await,
        }
    }
}

/// The HTTP/2 settings every connection is served with.
pub fn http2_builder(limits: &ConnectionLimits) -> http2::Builder<TokioExecutor> {
    let mut builder = http2::Builder::new(TokioExecutor::new());
    builder
        .timer(TokioTimer::new())
        .max_concurrent_streams(limits.max_concurrent_streams)
        .max_header_list_size(limits.max_header_list_bytes)
        .initial_stream_window_size(limits.window_bytes)
        .initial_connection_window_size(limits.window_bytes)
        .keep_alive_interval(limits.keepalive_interval)
        .keep_alive_timeout(limits.keepalive_timeout);
    builder
}

/// Serves `io` until the peer goes, the connection idles out, or `drain`
/// turns true and its calls have finished.
pub async fn serve<IO>(
    io: IO,
    peer: SocketAddr,
    builder: http2::Builder<TokioExecutor>,
    admission: Arc<Admission>,
    idle_timeout: Option<Duration>,
    mut drain: watch::Receiver<bool>,
) where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let activity = Activity::new();
    let service = {
        let activity = Arc::clone(&activity);
        hyper::service::service_fn(move |request: http::Request<Incoming>| {
            admission.call(request, activity.start())
        })
    };
    let span = tracing::info_span!("connection", %peer);
    async move {
        let connection = builder.serve_connection(TokioIo::new(io), service);
        tokio::pin!(connection);
        let mut closing = false;
        loop {
            tokio::select! {
                served = &mut connection => {
                    if let Err(e) = served {
                        tracing::debug!(error = %cause_chain(&e), "connection closed with an error");
                    }
                    return;
                }
                () = async {
                    match idle_timeout {
                        Some(timeout) => idle(&activity, timeout).await,
                        None => std::future::pending().await,
                    }
                }, if !closing => {
                    tracing::debug!("closing an idle connection");
                    connection.as_mut().graceful_shutdown();
                    closing = true;
                }
                _ = drain.wait_for(|draining| *draining), if !closing => {
                    connection.as_mut().graceful_shutdown();
                    closing = true;
                }
            }
        }
    }
    .instrument(span)
    .await;
}

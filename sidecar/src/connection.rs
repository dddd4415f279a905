//! Serving one client connection. Its first byte must arrive within the
//! header read timeout, so a connection that sends nothing is closed then;
//! after it HTTP/1.1's header read timeout bounds each request head. The
//! connection is closed gracefully once it has had no request open for the
//! idle timeout, when the table sheds it, or when the sidecar drains; a
//! closing connection with no request open is dropped after a short grace,
//! so that an HTTP/2 peer that never acknowledges GOAWAY cannot hold it.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::BodyExt as _;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto::Builder;
use tokio::net::TcpStream;
use tokio::sync::watch;

use crate::body::ProxyBody;
use crate::conn::{Busy, Conn, OnConn};
use crate::proxy::Proxy;

/// How long a closing connection with no request open is given to close
/// by itself before it is dropped.
const CLOSE_GRACE: Duration = Duration::from_secs(1);

/// The time limits of one connection.
#[derive(Debug, Clone, Copy)]
pub struct Timeouts {
    /// How long the connection's first byte, and then each request head
    /// (HTTP/1.1), may take.
    pub header_read: Duration,
    /// A connection with no request open for this long is closed.
    pub idle: Duration,
}

/// Serves `stream` until it ends, idles out, is shed, or drains.
pub async fn serve(
    stream: TcpStream,
    conn: Arc<Conn>,
    builder: Arc<Builder<TokioExecutor>>,
    proxy: Arc<Proxy>,
    timeouts: Timeouts,
    mut draining: watch::Receiver<bool>,
) {
    let mut first = [0u8; 1];
    let started = tokio::select! {
        peeked = tokio::time::timeout(timeouts.header_read, stream.peek(&mut first)) => {
            matches!(peeked, Ok(Ok(n)) if n > 0)
        }
        () = conn.closed() => false,
        _ = draining.wait_for(|draining| *draining) => false,
    };
    if !started {
        tracing::debug!(peer = %conn.peer, "a connection closed before its first byte");
        return;
    }
    let service = {
        let conn = Arc::clone(&conn);
        service_fn(move |mut request: hyper::Request<Incoming>| {
            let busy = conn.start();
            request.extensions_mut().insert(OnConn(Arc::clone(&conn)));
            let proxy = Arc::clone(&proxy);
            async move {
                let response = proxy.handle(request).await;
                Ok::<_, Infallible>(response.map(|body| held_by(body, busy)))
            }
        })
    };
    let connection = builder.serve_connection(TokioIo::new(stream), service);
    tokio::pin!(connection);
    let mut closing = false;
    loop {
        tokio::select! {
            served = &mut connection => {
                if let Err(error) = served {
                    tracing::debug!(%error, "client connection ended with an error");
                }
                return;
            }
            () = idle(&conn, timeouts.idle), if !closing => {
                tracing::debug!(peer = %conn.peer, "closing an idle connection");
                connection.as_mut().graceful_shutdown();
                closing = true;
            }
            () = conn.closed(), if !closing => {
                connection.as_mut().graceful_shutdown();
                closing = true;
            }
            _ = draining.wait_for(|draining| *draining), if !closing => {
                connection.as_mut().graceful_shutdown();
                closing = true;
            }
            () = idle(&conn, CLOSE_GRACE), if closing => return,
        }
    }
}

/// A response body that keeps its request open on the connection until it
/// has been sent (or dropped).
fn held_by(body: ProxyBody, busy: Busy) -> ProxyBody {
    body.map_frame(move |frame| {
        let _open = &busy;
        frame
    })
    .boxed_unsync()
}

/// Resolves once the connection has had no request open for `timeout`.
async fn idle(conn: &Conn, timeout: Duration) {
    // While requests are open, look again every quarter of the timeout;
    // once none is, sleep until the timeout would run out and look again.
    let tick = (timeout / 4).max(Duration::from_millis(10));
    loop {
        match conn.idle_for() {
            Some(idle) if idle >= timeout => return,
            Some(idle) => tokio::time::sleep(timeout - idle).await,
            None => tokio::time::sleep(tick).await,
        }
    }
}

//! The client-facing listener: HTTP/1.1 and h2c on one port, and a
//! connection table of at most `max_connections` connections. A newcomer to
//! a full table displaces the connection idle the longest (told to close);
//! when every connection is busy it waits to be accepted. Each connection is
//! served by [`crate::connection`] (first-byte and header deadlines, idle
//! timeout). On drain no new connection is accepted and those open finish
//! their requests, within the drain timeout.

use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::{TokioExecutor, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tokio_util::sync::CancellationToken;

use crate::conn::Conn;
use crate::connection::{self, Timeouts};
use crate::proxy::Proxy;
use crate::table::Table;

/// How often a newcomer waiting for room in a full table of busy
/// connections looks again for one that has gone idle.
const SHED_RETRY: Duration = Duration::from_millis(100);

/// The listener's limits.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Connections served at once.
    pub max_connections: usize,
    /// Concurrent HTTP/2 streams per connection.
    pub max_streams: u32,
    /// How long a connection's first byte, and each request head
    /// (HTTP/1.1), may take.
    pub header_read_timeout: Duration,
    /// A connection with no request open for this long is closed.
    pub idle_timeout: Duration,
    /// `Prefer: wait` requests one connection may have waiting at once.
    pub max_waiters_per_connection: usize,
    /// How long open connections have to finish once draining.
    pub drain_timeout: Duration,
}

fn builder(limits: &Limits) -> Builder<TokioExecutor> {
    let mut builder = Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(limits.max_streams)
        .keep_alive_interval(Duration::from_secs(30))
        .keep_alive_timeout(Duration::from_secs(20));
    builder
}

/// Serves `listener` until `draining` is cancelled, then drains.
pub async fn serve(
    listener: TcpListener,
    proxy: Arc<Proxy>,
    limits: Limits,
    draining: CancellationToken,
) {
    let builder = Arc::new(builder(&limits));
    let timeouts = Timeouts {
        header_read: limits.header_read_timeout,
        idle: limits.idle_timeout,
    };
    let table = Arc::new(Table::default());
    let permits = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let (drain, drained) = watch::channel(false);
    loop {
        let (stream, peer) = tokio::select! {
            () = draining.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    // Out of file descriptors, say: back off, do not spin.
                    tracing::warn!(%error, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let Some(permit) = room(&permits, &table, &draining).await else {
            break;
        };
        let conn = Conn::new(peer, limits.max_waiters_per_connection);
        let entry = table.enter(Arc::clone(&conn));
        let metrics = proxy.metrics.clone();
        metrics.connections.inc();
        let served = connection::serve(
            configured(stream),
            conn,
            Arc::clone(&builder),
            Arc::clone(&proxy),
            timeouts,
            drained.clone(),
        );
        tokio::spawn(async move {
            served.await;
            metrics.connections.dec();
            drop((entry, permit));
        });
    }
    drop(listener);
    tracing::info!(open = table.len(), "draining client connections");
    let _ = drain.send(true);
    drop(drained);
    if tokio::time::timeout(limits.drain_timeout, drain.closed())
        .await
        .is_err()
    {
        tracing::warn!(timeout = ?limits.drain_timeout, "connections still open after the drain timeout");
    }
}

fn configured(stream: TcpStream) -> TcpStream {
    let _ = stream.set_nodelay(true);
    stream
}

/// A place in the table for a newcomer: free now, or freed by shedding
/// the connection idle the longest, or (every connection busy) the first
/// to free up; `None` once draining.
async fn room(
    permits: &Arc<Semaphore>,
    table: &Table,
    draining: &CancellationToken,
) -> Option<OwnedSemaphorePermit> {
    loop {
        if let Ok(permit) = Arc::clone(permits).try_acquire_owned() {
            return Some(permit);
        }
        let shed = table.shed_oldest_idle();
        let wait = if shed { SHED_RETRY * 10 } else { SHED_RETRY };
        tokio::select! {
            () = draining.cancelled() => return None,
            permit = Arc::clone(permits).acquire_owned() => return permit.ok(),
            () = tokio::time::sleep(wait) => {}
        }
    }
}

//! One client connection's state, shared by its task, the connection table
//! and its requests: how many requests are open on it and when the last one
//! ended (so whether it is idle, and since when), the signal that tells it
//! to close, the `Prefer: wait` requests it may have waiting at once, and
//! the client's address. Each request finds it in its extensions.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::Semaphore;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// One client connection, as its requests and the table see it.
pub struct Conn {
    /// Requests open on the connection now: a connection with none is idle.
    open: AtomicUsize,
    /// When the connection was accepted: idle times count from it.
    born: Instant,
    /// Milliseconds from `born` to the end of the last request.
    last_end_ms: AtomicU64,
    /// Cancelled when the connection is to close (shed from a full table).
    close: CancellationToken,
    /// Room for this connection's waiting requests (`Prefer: wait`), so that
    /// one connection cannot take every waiter slot.
    pub waiters: Arc<Semaphore>,
    /// The client's address: whose share of the body budget its bodies
    /// take when no tenant header names one.
    pub peer: SocketAddr,
}

impl Conn {
    /// A connection just accepted from `peer`, allowed `waiters` waiting
    /// requests at once.
    pub fn new(peer: SocketAddr, waiters: usize) -> Arc<Conn> {
        Arc::new(Conn {
            open: AtomicUsize::new(0),
            born: Instant::now(),
            last_end_ms: AtomicU64::new(0),
            close: CancellationToken::new(),
            waiters: Arc::new(Semaphore::new(waiters)),
            peer,
        })
    }

    /// Marks a request open until the returned guard is dropped.
    pub fn start(self: &Arc<Self>) -> Busy {
        self.open.fetch_add(1, Ordering::AcqRel);
        Busy(Arc::clone(self))
    }

    /// How long the connection has had no request open; `None` while one
    /// is.
    pub fn idle_for(&self) -> Option<Duration> {
        if self.open.load(Ordering::Acquire) > 0 {
            return None;
        }
        let since = Duration::from_millis(self.last_end_ms.load(Ordering::Acquire));
        Some(self.born.elapsed().saturating_sub(since))
    }

    /// Tells the connection to close (gracefully: a request that started
    /// meanwhile still gets its answer).
    pub fn close(&self) {
        self.close.cancel();
    }

    /// Whether the connection has been told to close.
    pub fn closing(&self) -> bool {
        self.close.is_cancelled()
    }

    /// Resolves once the connection has been told to close.
    pub async fn closed(&self) {
        self.close.cancelled().await;
    }
}

/// A request open on a connection; dropped when its answer has been sent.
pub struct Busy(Arc<Conn>);

impl Drop for Busy {
    fn drop(&mut self) {
        let ms = u64::try_from(self.0.born.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.0.last_end_ms.fetch_max(ms, Ordering::AcqRel);
        self.0.open.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The connection a request came on, in the request's extensions.
#[derive(Clone)]
pub struct OnConn(pub Arc<Conn>);

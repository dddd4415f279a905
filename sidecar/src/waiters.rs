//! Requests that wait (`Prefer: wait=N`) for another request with their key
//! to finish: at most so many at once in all and on each client connection
//! (past either, 503 busy at once), and their coordinator calls on a
//! channel of their own, so that waits never queue ahead of the decisions
//! of requests that do not wait.

use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::conn::OnConn;

/// The waiter slots of the whole sidecar, and the channel waits use.
pub struct Waiters {
    /// Room for waiting requests in all.
    total: Arc<Semaphore>,
    /// The coordinator, on a connection of its own: a waiting Acquire holds
    /// a stream on it for as long as it waits.
    pub coordinator: idempotency_client::Client,
}

/// A waiting request's slots, in all and on its connection.
pub struct Waiting {
    /// Its slot among all waiters.
    _total: OwnedSemaphorePermit,
    /// Its slot among its connection's waiters (none when the request came
    /// without one, as in-process tests may send it).
    _connection: Option<OwnedSemaphorePermit>,
}

impl Waiters {
    /// At most `total` waiting requests at once, deciding through
    /// `coordinator`.
    pub fn new(total: usize, coordinator: idempotency_client::Client) -> Waiters {
        Waiters {
            total: Arc::new(Semaphore::new(total)),
            coordinator,
        }
    }

    /// Slots for one more waiting request on `conn`; `None` when its
    /// connection's or the sidecar's are all taken.
    pub fn admit(&self, conn: Option<&OnConn>) -> Option<Waiting> {
        let connection = match conn {
            Some(OnConn(conn)) => Some(Arc::clone(&conn.waiters).try_acquire_owned().ok()?),
            None => None,
        };
        let total = Arc::clone(&self.total).try_acquire_owned().ok()?;
        Some(Waiting {
            _total: total,
            _connection: connection,
        })
    }
}

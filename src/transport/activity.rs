//! Whether a connection is busy: the calls open on it, and when the last
//! one ended. Admission marks a call open until its answer is sent; the
//! connection closes itself once it has been idle long enough.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use tokio::time::Instant;

/// Calls open on one connection, and when the last one ended.
pub struct Activity {
    open: AtomicUsize,
    born: Instant,
    /// Milliseconds from `born` to the end of the last call.
    last_end_ms: AtomicU64,
}

impl Activity {
    pub fn new() -> Arc<Self> {
        Arc::new(Activity {
            open: AtomicUsize::new(0),
            born: Instant::now(),
            last_end_ms: AtomicU64::new(0),
        })
    }

    pub fn start(self: &Arc<Self>) -> OpenCall {
        self.open.fetch_add(1, Ordering::AcqRel);
        OpenCall(Arc::clone(self))
    }

    /// How long the connection has had no call open; `None` while one is.
    pub fn idle_for(&self) -> Option<Duration> {
        if self.open.load(Ordering::Acquire) > 0 {
            return None;
        }
        let since = Duration::from_millis(self.last_end_ms.load(Ordering::Acquire));
        Some(self.born.elapsed().saturating_sub(since))
    }
}

/// A call in progress on a connection; dropped when its answer is sent.
pub struct OpenCall(Arc<Activity>);

impl OpenCall {
    /// Another call on the same connection: an HTTP/JSON request that makes
    /// an in-process Coordinator call holds one for each.
    pub fn another(&self) -> OpenCall {
        self.0.start()
    }
}

impl Drop for OpenCall {
    fn drop(&mut self) {
        let ms = u64::try_from(self.0.born.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.0.last_end_ms.fetch_max(ms, Ordering::AcqRel);
        self.0.open.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_connection_is_idle_only_without_open_calls() {
        let activity = Activity::new();
        let call = activity.start();
        tokio::time::advance(Duration::from_secs(10)).await;
        assert_eq!(activity.idle_for(), None);
        drop(call);
        tokio::time::advance(Duration::from_secs(3)).await;
        let idle = activity.idle_for().unwrap();
        assert!(idle >= Duration::from_secs(3) && idle < Duration::from_secs(4));
    }
}

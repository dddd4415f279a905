//! The database clock's offset: every SQL function reads
//! `clock_timestamp() + offset`. Production never moves it; tests advance it to
//! let leases and retries come due without sleeping.

use std::sync::{
    Arc,
    atomic::{AtomicI64, Ordering},
};
use std::time::Duration;

use chrono::{DateTime, Utc};

/// Shared by every clone of a store, so a test moves time for the whole
/// server at once.
#[derive(Debug, Clone, Default)]
pub struct Clock {
    /// Milliseconds added to the database's clock.
    offset_ms: Arc<AtomicI64>,
}

impl Clock {
    /// Moves the server's notion of "now" forward.
    pub fn advance(&self, by: Duration) {
        let ms = i64::try_from(by.as_millis()).unwrap_or(i64::MAX);
        self.offset_ms.fetch_add(ms, Ordering::SeqCst);
    }

    pub fn offset_ms(&self) -> i64 {
        self.offset_ms.load(Ordering::SeqCst)
    }

    /// The database's "now" as this process estimates it: its own wall
    /// clock, moved by the offset.
    pub fn now(&self) -> DateTime<Utc> {
        Utc::now() + chrono::Duration::milliseconds(self.offset_ms())
    }
}

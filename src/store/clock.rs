//! The database clock as this process sees it. Every SQL function reads
//! `clock_timestamp() + offset`: production never moves the offset; tests
//! advance it to let leases and retries come due without sleeping. The skew
//! between this process's wall clock and the database's is measured by the
//! listener's periodic check, so that decisions made in memory (replays) use
//! the database's time, not this host's.

use std::sync::{
    Arc,
    atomic::{AtomicI64, Ordering},
};
use std::time::Duration;

use chrono::{DateTime, Utc};

/// Shared by every clone of a store, so a test moves time for the whole
/// server at once.
#[derive(Debug, Clone)]
pub struct Clock {
    /// Milliseconds added to the database's clock.
    offset_ms: Arc<AtomicI64>,
    /// The database's clock minus this process's, in milliseconds, as last
    /// measured; `UNMEASURED` until then.
    skew_ms: Arc<AtomicI64>,
}

const UNMEASURED: i64 = i64::MIN;

impl Default for Clock {
    fn default() -> Self {
        Clock {
            offset_ms: Arc::default(),
            skew_ms: Arc::new(AtomicI64::new(UNMEASURED)),
        }
    }
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

    /// Records a reading of the database's clock, `database` (without the
    /// offset), taken between this process's `before` and `after`.
    pub fn measured(&self, database: DateTime<Utc>, before: DateTime<Utc>, after: DateTime<Utc>) {
        let midpoint = before + (after - before) / 2;
        let skew = (database - midpoint).num_milliseconds();
        self.skew_ms
            .store(skew.max(UNMEASURED + 1), Ordering::SeqCst);
    }

    /// The database's "now" (offset included) as this process estimates it:
    /// its own wall clock moved by the measured skew; `None` until the skew
    /// has been measured.
    pub fn database_now(&self) -> Option<DateTime<Utc>> {
        let skew = self.skew_ms.load(Ordering::SeqCst);
        (skew != UNMEASURED)
            .then(|| Utc::now() + chrono::Duration::milliseconds(skew + self.offset_ms()))
    }
}

/// What every call's statement carries besides its own arguments.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Stamp {
    /// The test clock's offset (`Clock::offset_ms`).
    pub offset_ms: i64,
    /// When the statement must have finished, on the database's clock with
    /// the offset (`sql/functions/deadline.sql`); `None` until the
    /// skew is measured.
    pub deadline: Option<DateTime<Utc>>,
}

impl Clock {
    /// The stamp of a statement sent now, whose answer is waited for at
    /// most `limit`.
    pub(crate) fn stamp(&self, limit: Duration) -> Stamp {
        let limit = chrono::Duration::from_std(limit).unwrap_or(chrono::Duration::MAX);
        Stamp {
            offset_ms: self.offset_ms(),
            deadline: self
                .database_now()
                .and_then(|now| now.checked_add_signed(limit)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_database_time_is_unknown_until_measured_then_follows_skew_and_offset() {
        let clock = Clock::default();
        assert!(clock.database_now().is_none());

        let before = Utc::now();
        let after = before + chrono::Duration::milliseconds(10);
        let database = before + chrono::Duration::seconds(30);
        clock.measured(database, before, after);
        clock.advance(Duration::from_secs(60));
        let estimated = clock.database_now().unwrap() - Utc::now();
        let expected = chrono::Duration::seconds(90) - chrono::Duration::milliseconds(5);
        assert!(
            (estimated - expected).num_milliseconds().abs() < 1_000,
            "{estimated} vs {expected}"
        );
    }
}

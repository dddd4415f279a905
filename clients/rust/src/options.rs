//! The settings of one `run_once`, shared by the run and its lease.

use std::time::Duration;

use crate::retry::Backoff;

/// How often the lease is extended while the work runs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Heartbeat {
    /// Every third of the lease TTL.
    #[default]
    Auto,
    /// At this interval.
    Every(Duration),
    /// Never: the work must finish within the lease TTL.
    Off,
}

/// What `run_once` does with the work when the heartbeat hears that the
/// lease is lost (ABORTED: taken over, released by an admin, or run out).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum WhenLeaseLost {
    /// Drop the work's future at its next await point; `run_once` ends at
    /// once with [`crate::RunOnceError::LeaseLost`].
    #[default]
    DropWork,
    /// Let the work finish (it is told through [`crate::Lease::lost`] and
    /// [`crate::Lease::cancellation_token`] and may stop early). Its
    /// Complete is still sent; a value the coordinator refused comes back
    /// in [`crate::RunOnceError::NotRecorded`]. For work that must not be
    /// cut off midway, such as a request already sent to another service.
    LetFinish,
}

/// Per-operation settings of [`Client::run_once`].
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// How long a lease lasts before another caller may take over, and
    /// how far each heartbeat extends it: 60 s.
    pub lease_ttl: Duration,
    /// How long Acquire waits for another holder to finish before the
    /// outcome is IN_PROGRESS: 10 s.
    pub wait: Duration,
    /// The heartbeat: every third of the TTL unless set.
    pub heartbeat: Heartbeat,
    /// How often a call that may be retried (UNAVAILABLE,
    /// DEADLINE_EXCEEDED, SERVER_BUSY, TOO_MANY_WAITERS) is sent again: 5.
    pub max_retries: u32,
    /// Delays between those retries: 100 ms doubling to 2 s, jittered.
    pub backoff: Backoff,
    /// Attempts the record allows in all, fixed when it is created; 0 for
    /// the server's default.
    pub max_attempts: u32,
    /// How long the record (and so its result) is kept; `None` for the
    /// server's default.
    pub retention: Option<Duration>,
    /// The Acquire's request id; `None` for a fresh one per `run_once`.
    /// Set it to the same value across process restarts to get back a lease
    /// granted to a call whose reply was lost.
    pub request_id: Option<String>,
    /// What happens to the work when the lease is lost while it runs:
    /// dropped unless set.
    pub when_lease_lost: WhenLeaseLost,
}

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions {
            lease_ttl: Duration::from_secs(60),
            wait: Duration::from_secs(10),
            heartbeat: Heartbeat::Auto,
            max_retries: 5,
            backoff: Backoff::default(),
            max_attempts: 0,
            retention: None,
            request_id: None,
            when_lease_lost: WhenLeaseLost::DropWork,
        }
    }
}

pub(crate) fn duration_to_proto(d: Duration) -> prost_types::Duration {
    prost_types::Duration {
        seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        nanos: i32::try_from(d.subsec_nanos()).unwrap_or(0),
    }
}

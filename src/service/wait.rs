//! Waiting for a holder: Acquire's `wait` window and the Watch stream. Both
//! subscribe to the record's changes first, then read it, then sleep until a
//! change, the holder's lease running out, or the end of their window —
//! holding no database connection while they sleep.

use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;
use tonic::Status;

use crate::domain::{AcquireCommand, Acquired, Decision, Record, RecordId, Status as RecordStatus};
use crate::error::{Error, cause_chain};
use crate::notify::Subscription;
use crate::proto;
use crate::store::{Store, StoreError};

use super::encode;

/// How much of the caller's deadline is kept back so the final answer
/// (IN_PROGRESS, or the last Watch event) reaches it before the deadline.
const DEADLINE_MARGIN: Duration = Duration::from_millis(100);

/// The window a waiter may use: what it asked, cut by its call's deadline.
pub fn window(asked: Duration, deadline: Option<Duration>) -> Duration {
    match deadline {
        Some(d) => asked.min(d.saturating_sub(DEADLINE_MARGIN)),
        None => asked,
    }
}

/// How soon a waiter asks again after the database failed to answer.
const RETRY_AFTER_UNAVAILABLE: Duration = Duration::from_millis(250);

/// Acquire, and while the answer is IN_PROGRESS wait (up to `window`) for
/// the record to change or its lease to run out, then decide again. The first
/// decision waits `connect_wait` for a connection like any call, and its
/// errors are the caller's; once waiting, a database that fails to answer is
/// asked again until the window ends.
pub async fn acquire(
    store: &Store,
    mut subscription: Subscription,
    cmd: &AcquireCommand,
    window: Duration,
    connect_wait: Option<Duration>,
) -> Result<Acquired, StoreError> {
    let end = Instant::now() + window;
    let mut connect_wait = connect_wait;
    let mut waiting = false;
    loop {
        let left = end.saturating_duration_since(Instant::now());
        let next_check = match store.acquire(cmd, left, connect_wait).await {
            Ok(acquired) if acquired.decision != Decision::InProgress || left.is_zero() => {
                return Ok(acquired);
            }
            // The holder's lease ends after retry_after: then the key can be
            // taken over, so decide again at that moment.
            Ok(acquired) => Instant::now() + acquired.retry_after.unwrap_or(left),
            Err(StoreError::Unavailable(e)) if waiting && !left.is_zero() => {
                tracing::debug!(error = %cause_chain(e.as_ref()), "waiter: database unavailable; asking again");
                Instant::now() + RETRY_AFTER_UNAVAILABLE
            }
            Err(e) => return Err(e),
        };
        waiting = true;
        // A woken waiter is prepared to wait its whole window, for a
        // connection too: many waiters woken at once queue for the pool
        // rather than fail.
        connect_wait = Some(left.max(DEADLINE_MARGIN));
        tokio::select! {
            _ = subscription.changed() => {}
            _ = tokio::time::sleep_until(next_check.min(end)) => {}
        }
    }
}

fn event(record: Record, timed_out: bool) -> proto::WatchEvent {
    proto::WatchEvent {
        record: Some(encode::record(record)),
        timed_out,
    }
}

/// Streams `first` and then every change of the record until it leaves
/// PROCESSING or `window` ends. Stops at once when the caller goes away.
pub async fn follow(
    store: Store,
    mut subscription: Subscription,
    id: RecordId,
    first: Record,
    window: Duration,
    events: mpsc::Sender<Result<proto::WatchEvent, Status>>,
) {
    let end = Instant::now() + window;
    let mut last = first;
    if last.status != RecordStatus::Processing {
        let _ = events.send(Ok(event(last, false))).await;
        return;
    }
    if events.send(Ok(event(last.clone(), false))).await.is_err() {
        return;
    }
    loop {
        let window_over = tokio::select! {
            _ = events.closed() => return,
            _ = subscription.changed() => false,
            _ = tokio::time::sleep_until(end) => true,
        };
        let left = end.saturating_duration_since(Instant::now());
        let record = match store.get(&id, Some(left.max(DEADLINE_MARGIN))).await {
            Ok(record) => record,
            Err(StoreError::Unavailable(e)) if !window_over => {
                tracing::debug!(error = %cause_chain(e.as_ref()), "watch: database unavailable; asking again");
                tokio::time::sleep(RETRY_AFTER_UNAVAILABLE.min(left)).await;
                continue;
            }
            Err(e) => {
                let _ = events.send(Err(Error::from(e).into())).await;
                return;
            }
        };
        let done = record.status != RecordStatus::Processing;
        if window_over {
            let _ = events.send(Ok(event(record, !done))).await;
            return;
        }
        if record != last {
            last = record.clone();
            if events.send(Ok(event(record, false))).await.is_err() || done {
                return;
            }
        }
    }
}

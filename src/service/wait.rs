//! Waiting for a holder: Acquire's `wait` window and the Watch stream. Both
//! subscribe to the record's changes first, then read it, then sleep until a
//! change, the holder's lease running out, or the end of their window —
//! holding no database connection while they sleep.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;
use tonic::Status;

use chrono::{DateTime, Utc};

use crate::domain::{
    AcquireCommand, Acquired, Decision, LeaseToken, Record, RecordId, Refusal,
    Status as RecordStatus,
};
use crate::error::Error;
use crate::metrics;
use crate::notify::Subscription;
use crate::proto;
use crate::store::{CallTime, Store, StoreError};
use crate::telemetry::cause_chain;

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
/// the record to change or its lease to run out, then decide again; the
/// result is handed to `answer` with the store and the command.
///
/// A caller that asked to wait is prepared to wait its window for a database
/// connection too, so a burst of waiters queues for the pool rather than
/// failing (a database that refuses connections still fails fast). The
/// first decision's errors are the caller's; once waiting, a database that
/// fails to answer is asked again until the window ends.
pub fn acquire<F, T>(
    store: Arc<Store>,
    mut subscription: Subscription,
    cmd: AcquireCommand,
    window: Duration,
    answer: F,
) -> impl Future<Output = T> + Send
where
    F: FnOnce(&Store, &AcquireCommand, Result<Acquired, StoreError>) -> T + Send,
    T: Send,
{
    // This future lives as long as the caller waits, once per waiting call,
    // and is as big as its biggest state. Hence it owns what it keeps (a
    // caller's block around it would keep its arguments twice), the shared
    // read's future is boxed (only its short run pays for its size), and
    // its sleeping state, the biggest, keeps just what it compares.
    let end = Instant::now() + window;
    async move {
        let mut waiting = false;
        let decided = 'decided: loop {
            let (mut next_check, mut held) = {
                let left = end.saturating_duration_since(Instant::now());
                match store
                    .acquire(&cmd, left, connect_wait(&store, end, &cmd))
                    .await
                {
                    Ok(acquired) if acquired.decision != Decision::InProgress || left.is_zero() => {
                        break 'decided Ok(acquired);
                    }
                    // The holder's lease ends after retry_after: then the key
                    // can be taken over, so decide again at that moment.
                    Ok(acquired) => (
                        Instant::now() + acquired.retry_after.unwrap_or(left),
                        Some(Held::of(&acquired.record)),
                    ),
                    // Once waiting, a database that fails to answer is asked
                    // again until the window ends.
                    Err(StoreError::Unavailable(e)) if waiting && !left.is_zero() => {
                        tracing::debug!(error = %cause_chain(e.as_ref()), "waiter: database unavailable; asking again");
                        (Instant::now() + RETRY_AFTER_UNAVAILABLE, None)
                    }
                    Err(e) => break 'decided Err(e),
                }
            };
            waiting = true;

            // Sleep until the lease or the window ends, unless a notification
            // shows a change that needs a new decision first.
            loop {
                tokio::select! {
                    _ = subscription.changed() => {}
                    _ = tokio::time::sleep_until(next_check.min(end)) => break,
                }
                let Some(current) = held.take() else { break };
                let seen = Box::pin(subscription.read_shared(Some(current.updated_at), || {
                    store.get(&cmd.id, connect_wait(&store, end, &cmd))
                }))
                .await;
                match classify(seen, current, &cmd) {
                    Seen::Done(acquired) => break 'decided Ok(*acquired),
                    Seen::StillHeld {
                        held: now,
                        extended_by,
                    } => {
                        next_check += extended_by;
                        held = Some(now);
                    }
                    Seen::Decide => break,
                }
            }
        };
        answer(&store, &cmd, decided)
    }
}

/// How long a waiter waits for a database connection: until its window
/// ends (at least the configured wait), and never past its caller's
/// deadline (`cmd.answer_by`), which its statements carry too.
fn connect_wait(store: &Store, end: Instant, cmd: &AcquireCommand) -> CallTime {
    CallTime::until(cmd.answer_by.map(Instant::from_std)).waiting(
        end.saturating_duration_since(Instant::now())
            .max(store.connect_wait()),
    )
}

/// What a waiter remembers of the record it waits on.
#[derive(Clone, Copy)]
struct Held {
    token: LeaseToken,
    updated_at: DateTime<Utc>,
    lease_expires_at: Option<DateTime<Utc>>,
}

impl Held {
    fn of(record: &Record) -> Self {
        Held {
            token: record.lease.token,
            updated_at: record.updated_at,
            lease_expires_at: record.lease_expires_at,
        }
    }
}

/// What a waiter makes of the record read (once for all this process's
/// waiters) after a notification.
enum Seen {
    /// A final answer (`Record::final_decision`: ALREADY_DONE or CONFLICT),
    /// exactly as `idempotency_acquire` would decide it, without a round
    /// trip of the waiter's own.
    Done(Box<Acquired>),
    /// The same lease is still held (a heartbeat moved its end by
    /// `extended_by`): keep waiting.
    StillHeld { held: Held, extended_by: Duration },
    /// Anything else needs a decision under the row lock: Acquire again.
    Decide,
}

fn classify(seen: Result<Option<Record>, StoreError>, held: Held, cmd: &AcquireCommand) -> Seen {
    let Ok(Some(record)) = seen else {
        return Seen::Decide;
    };
    if let Some(decision) = record.final_decision(&cmd.fingerprint) {
        return Seen::Done(Box::new(Acquired {
            decision,
            record,
            retry_after: None,
        }));
    }
    if record.status == RecordStatus::Processing && record.lease.token == held.token {
        let extended_by = match (record.lease_expires_at, held.lease_expires_at) {
            (Some(new), Some(old)) => (new - old).to_std().unwrap_or_default(),
            _ => Duration::ZERO,
        };
        return Seen::StillHeld {
            held: Held::of(&record),
            extended_by,
        };
    }
    Seen::Decide
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
    let _open = store.metrics().stream_opened(metrics::Stream::Watch);
    let end = Instant::now() + window;
    let mut last = first;
    if last.status != RecordStatus::Processing {
        let _ = events.send(Ok(event(last, false))).await;
        return;
    }
    if events.send(Ok(event(last.clone(), false))).await.is_err() {
        return;
    }
    // Set when a read failed: read again without waiting for another
    // notification (the one that woke us was already taken).
    let mut read_again = false;
    loop {
        let window_over = if read_again {
            Instant::now() >= end
        } else {
            tokio::select! {
                _ = events.closed() => return,
                _ = subscription.changed() => false,
                _ = tokio::time::sleep_until(end) => true,
            }
        };
        read_again = false;
        let left = end.saturating_duration_since(Instant::now());
        let wait = CallTime::default().waiting(left.max(DEADLINE_MARGIN));
        let read = if window_over {
            // The last event reads afresh rather than trust that every
            // notification has arrived.
            store.get(&id, wait).await
        } else {
            subscription
                .read_shared(Some(last.updated_at), || store.get(&id, wait))
                .await
                .and_then(|r| r.ok_or(Refusal::NotFound.into()))
        };
        let record = match read {
            Ok(record) => record,
            Err(StoreError::Unavailable(e)) if !window_over => {
                tracing::debug!(error = %cause_chain(e.as_ref()), "watch: database unavailable; asking again");
                tokio::time::sleep(RETRY_AFTER_UNAVAILABLE.min(left)).await;
                read_again = true;
                continue;
            }
            Err(e) => {
                let _ = events
                    .send(Err(Error::from_store(e, store.metrics()).into()))
                    .await;
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

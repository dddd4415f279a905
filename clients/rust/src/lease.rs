//! The lease the work of `run_once` runs under, and the heartbeat that
//! extends it while the work runs.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use tokio_util::sync::CancellationToken;

use crate::client::Client;
use crate::error::{CallError, RunOnceError, WorkError};
use crate::options::{RunOptions, WhenLeaseLost, duration_to_proto};
use crate::proto::ExtendLeaseRequest;
use crate::retry::{Backoff, with_retries};

/// The lease the work runs under.
///
/// Pass [`Lease::fencing_token`] to downstream writes. When the lease is
/// lost, `run_once` drops the work's future (unless told to let it finish:
/// [`WhenLeaseLost`]); work that spawned tasks of its own, or that is let
/// finish, stops with [`Lease::cancellation_token`] or [`Lease::lost`].
#[derive(Clone)]
pub struct Lease {
    inner: Arc<LeaseInner>,
}

struct LeaseInner {
    client: Client,
    scope: String,
    key: String,
    token: String,
    attempt: u32,
    fencing_token: u64,
    checkpoint: Vec<u8>,
    /// When the expiry the server last granted was asked for (by this
    /// process's monotonic clock): each extension adds the time since then,
    /// so the lease stays about one TTL ahead of now instead of growing by a
    /// TTL at every heartbeat.
    extended_at: Mutex<Instant>,
    expires_at: Mutex<Option<SystemTime>>,
    lost: CancellationToken,
    max_retries: u32,
    backoff: Backoff,
}

impl std::fmt::Debug for Lease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lease")
            .field("scope", &self.inner.scope)
            .field("key", &self.inner.key)
            .field("attempt", &self.inner.attempt)
            .field("fencing_token", &self.inner.fencing_token)
            .field("lost", &self.is_lost())
            .finish_non_exhaustive()
    }
}

impl Lease {
    /// The operation.
    pub fn scope(&self) -> &str {
        &self.inner.scope
    }

    /// The idempotency key.
    pub fn key(&self) -> &str {
        &self.inner.key
    }

    /// The lease token (secret: it lets its holder Complete).
    pub fn token(&self) -> &str {
        &self.inner.token
    }

    /// Which attempt this is, counting from 1.
    pub fn attempt(&self) -> u32 {
        self.inner.attempt
    }

    /// Grows with every lease granted on the record: pass it to downstream
    /// writes so that a stale holder's late write can be refused.
    pub fn fencing_token(&self) -> u64 {
        self.inner.fencing_token
    }

    /// What an earlier holder saved with [`Lease::save_checkpoint`]; empty
    /// when nothing was.
    pub fn checkpoint(&self) -> &[u8] {
        &self.inner.checkpoint
    }

    /// When the lease runs out, by the database's clock, as last extended.
    pub fn expires_at(&self) -> Option<SystemTime> {
        *self.inner.expires_at.lock().unwrap()
    }

    /// Saves progress on the record for whoever takes over if this holder
    /// dies, and extends the lease. Retried like every call; an ABORTED
    /// answer means the lease is lost (and the work is told).
    pub async fn save_checkpoint(&self, checkpoint: impl Into<Vec<u8>>) -> Result<(), CallError> {
        let checkpoint = checkpoint.into();
        let inner = &self.inner;
        let result = with_retries(inner.backoff, inner.max_retries, || {
            inner.extend(Some(checkpoint.clone()))
        })
        .await;
        if let Err(error) = &result
            && error.is_lease_lost()
        {
            inner.lost.cancel();
        }
        result
    }

    /// A token cancelled when the lease is lost (a child: cancelling it
    /// does not touch the lease).
    pub fn cancellation_token(&self) -> CancellationToken {
        self.inner.lost.child_token()
    }

    /// Resolves when the lease is lost.
    pub async fn lost(&self) {
        self.inner.lost.cancelled().await;
    }

    /// Whether the lease is known to be lost.
    pub fn is_lost(&self) -> bool {
        self.inner.lost.is_cancelled()
    }
}

impl LeaseInner {
    /// One ExtendLease by the time since the last granted expiry was asked
    /// for (at least the server's minimum of one second): the new expiry is
    /// the old one plus that, about one TTL from now.
    async fn extend(&self, checkpoint: Option<Vec<u8>>) -> Result<(), CallError> {
        let asked = Instant::now();
        let since = asked.duration_since(*self.extended_at.lock().unwrap());
        let response = self
            .client
            .extend_lease(ExtendLeaseRequest {
                scope: self.scope.clone(),
                key: self.key.clone(),
                lease_token: self.token.clone(),
                extend_by: Some(duration_to_proto(since.max(MIN_EXTENSION))),
                checkpoint,
            })
            .await?;
        *self.extended_at.lock().unwrap() = asked;
        if let Some(expires) = response
            .lease
            .and_then(|lease| lease.expires_at)
            .and_then(|at| SystemTime::try_from(at).ok())
        {
            *self.expires_at.lock().unwrap() = Some(expires);
        }
        Ok(())
    }
}

/// The shortest extension the server accepts.
const MIN_EXTENSION: Duration = Duration::from_secs(1);

/// Extends the lease every `interval` until aborted; an ABORTED answer
/// marks the lease lost and ends it; other failures are tried again soon.
async fn heartbeat(lease: Arc<LeaseInner>, interval: Duration) {
    let mut next = interval;
    let mut failures = 0;
    loop {
        tokio::time::sleep(next).await;
        match lease.extend(None).await {
            Ok(()) => {
                failures = 0;
                next = interval;
            }
            Err(error) if error.is_lease_lost() => {
                lease.lost.cancel();
                return;
            }
            Err(error) => {
                next = lease
                    .backoff
                    .delay(failures, error.retry_after)
                    .min(interval);
                failures = failures.saturating_add(1);
            }
        }
    }
}

/// Aborts the heartbeat when the run ends, however it ends (even when the
/// caller drops the `run_once` future).
struct AbortOnDrop(Option<tokio::task::JoinHandle<()>>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        if let Some(task) = &self.0 {
            task.abort();
        }
    }
}

impl Lease {
    /// The lease `granted` by an Acquire sent at `asked`, on a record that
    /// holds `checkpoint`.
    pub(crate) fn granted(
        client: &Client,
        scope: &str,
        key: &str,
        granted: crate::proto::Lease,
        checkpoint: Vec<u8>,
        asked: Instant,
        options: &RunOptions,
    ) -> Lease {
        Lease {
            inner: Arc::new(LeaseInner {
                client: client.clone(),
                scope: scope.to_owned(),
                key: key.to_owned(),
                token: granted.token,
                attempt: granted.attempt,
                fencing_token: granted.fencing_token,
                checkpoint,
                extended_at: Mutex::new(asked),
                expires_at: Mutex::new(
                    granted
                        .expires_at
                        .and_then(|at| SystemTime::try_from(at).ok()),
                ),
                lost: CancellationToken::new(),
                max_retries: options.max_retries,
                backoff: options.backoff,
            }),
        }
    }
}

/// Runs `work` under `lease`, extended every `interval` until the work
/// ends. When the lease is lost meanwhile: with [`WhenLeaseLost::DropWork`]
/// a work still running is dropped and the answer is
/// [`RunOnceError::LeaseLost`]; with [`WhenLeaseLost::LetFinish`] the work
/// runs on (told through the lease) and its outcome is returned, for the
/// Complete to be tried and refused.
pub(crate) async fn under_heartbeat<T, E, F, Fut>(
    lease: Lease,
    interval: Option<Duration>,
    when_lost: WhenLeaseLost,
    work: F,
) -> Result<Result<T, WorkError<E>>, RunOnceError<E, T>>
where
    F: FnOnce(Lease) -> Fut,
    Fut: Future<Output = Result<T, WorkError<E>>>,
{
    let inner = Arc::clone(&lease.inner);
    let beating =
        AbortOnDrop(interval.map(|every| tokio::spawn(heartbeat(Arc::clone(&inner), every))));
    let outcome = match when_lost {
        // A work that has already returned keeps its value (its Complete is
        // refused: NotRecorded); one still running is dropped.
        WhenLeaseLost::DropWork => tokio::select! {
            biased;
            outcome = work(lease) => Some(outcome),
            () = inner.lost.cancelled() => None,
        },
        WhenLeaseLost::LetFinish => Some(work(lease).await),
    };
    // The work has ended (or been dropped): no more extensions.
    drop(beating);
    outcome.ok_or(RunOnceError::LeaseLost)
}

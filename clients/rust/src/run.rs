//! The run-once template: Acquire (retried with one request id), the work
//! under a heartbeat, Complete (retried), and every other decision as a
//! typed outcome.

use std::fmt::Display;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio_util::sync::CancellationToken;

use crate::client::Client;
use crate::codec::{Codec, Json};
use crate::error::{CallError, RunOnceError, WorkError};
use crate::proto::{
    AcquireRequest, CompleteRequest, Decision, ExtendLeaseRequest, Failure, Record, Release,
    Success, acquire_request::RequestFingerprint, complete_request::Outcome,
};
use crate::retry::{Backoff, with_retries};

/// What the request is, so that the same key reused for a different request
/// is caught (outcome CONFLICT).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Fingerprint {
    /// No fingerprint: matches only a record created without one.
    #[default]
    None,
    /// A fingerprint computed by the caller (at most 128 visible ASCII
    /// characters), compared exactly.
    Exact(String),
    /// The raw request; the server stores its SHA-256.
    Payload(Vec<u8>),
    /// The request as JSON text; the server canonicalises it (key order and
    /// white space do not matter) and stores its SHA-256.
    Json(String),
}

impl Fingerprint {
    /// The JSON of `request`, as [`Fingerprint::Json`].
    pub fn json<T: Serialize + ?Sized>(request: &T) -> Result<Self, serde_json::Error> {
        serde_json::to_string(request).map(Fingerprint::Json)
    }

    fn into_proto(self) -> Option<RequestFingerprint> {
        match self {
            Fingerprint::None => None,
            Fingerprint::Exact(f) => Some(RequestFingerprint::Fingerprint(f)),
            Fingerprint::Payload(p) => Some(RequestFingerprint::Payload(p)),
            Fingerprint::Json(j) => Some(RequestFingerprint::JsonPayload(j)),
        }
    }
}

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
        }
    }
}

/// The value `run_once` produced, or the one stored by an earlier run.
#[derive(Debug, Clone)]
pub struct Done<T> {
    /// The work's value (decoded from the stored result on a replay).
    pub value: T,
    /// True when the work did not run here: the value is a replay.
    pub replayed: bool,
    /// The record as it stands.
    pub record: Record,
}

/// The lease the work runs under.
///
/// Pass [`Lease::fencing_token`] to downstream writes. When the lease is
/// lost, `run_once` drops the work's future; work that spawned tasks of its
/// own stops them with [`Lease::cancellation_token`] or [`Lease::lost`].
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

fn duration_to_proto(d: Duration) -> prost_types::Duration {
    prost_types::Duration {
        seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        nanos: i32::try_from(d.subsec_nanos()).unwrap_or(0),
    }
}

fn duration_from_proto(d: Option<prost_types::Duration>) -> Option<Duration> {
    d.and_then(|d| Duration::try_from(d).ok())
}

impl Client {
    /// Runs `work` exactly once for (`scope`, `key`), its value stored as
    /// JSON: the first caller runs it, every later one gets the stored value
    /// back (`replayed`).
    ///
    /// The work gets the [`Lease`] and returns its value, or a
    /// [`WorkError`] saying whether the failure may be retried. While it
    /// runs, a heartbeat extends the lease; if the lease is lost the work's
    /// future is dropped and the outcome is [`RunOnceError::LeaseLost`].
    pub async fn run_once<T, E, F, Fut>(
        &self,
        scope: &str,
        key: &str,
        fingerprint: Fingerprint,
        options: &RunOptions,
        work: F,
    ) -> Result<Done<T>, RunOnceError<E>>
    where
        T: Serialize + DeserializeOwned,
        E: Display,
        F: FnOnce(Lease) -> Fut,
        Fut: Future<Output = Result<T, WorkError<E>>>,
    {
        self.run_once_with_codec(&Json, scope, key, fingerprint, options, work)
            .await
    }

    /// [`Client::run_once`] with the value stored by `codec` (for example
    /// [`crate::Raw`] for bytes).
    pub async fn run_once_with_codec<T, E, C, F, Fut>(
        &self,
        codec: &C,
        scope: &str,
        key: &str,
        fingerprint: Fingerprint,
        options: &RunOptions,
        work: F,
    ) -> Result<Done<T>, RunOnceError<E>>
    where
        C: Codec<T> + ?Sized,
        E: Display,
        F: FnOnce(Lease) -> Fut,
        Fut: Future<Output = Result<T, WorkError<E>>>,
    {
        let request = AcquireRequest {
            scope: scope.to_owned(),
            key: key.to_owned(),
            request_fingerprint: fingerprint.into_proto(),
            lease_ttl: Some(duration_to_proto(options.lease_ttl)),
            max_attempts: options.max_attempts,
            retention: options.retention.map(duration_to_proto),
            wait: Some(duration_to_proto(options.wait)),
            request_id: options
                .request_id
                .clone()
                .unwrap_or_else(|| uuid::Uuid::new_v4().to_string()),
        };
        // When the Acquire that was answered was sent: the lease's expiry
        // counts from about then.
        let sent = Mutex::new(Instant::now());
        let response = with_retries(options.backoff, options.max_retries, || {
            *sent.lock().unwrap() = Instant::now();
            self.acquire(request.clone())
        })
        .await?;
        let asked = *sent.lock().unwrap();
        let decision = response.decision();
        let record = response.record.unwrap_or_default();
        let retry_after = duration_from_proto(response.retry_after);
        match decision {
            Decision::Proceed => {}
            Decision::AlreadyDone => {
                let stored = record.result.clone().unwrap_or_default();
                let value = codec
                    .decode(&stored.result, &stored.content_type)
                    .map_err(RunOnceError::Codec)?;
                return Ok(Done {
                    value,
                    replayed: true,
                    record,
                });
            }
            Decision::InProgress => {
                return Err(RunOnceError::InProgress {
                    retry_after,
                    record: Box::new(record),
                });
            }
            Decision::RetryLater => {
                return Err(RunOnceError::RetryLater {
                    retry_after,
                    record: Box::new(record),
                });
            }
            Decision::Conflict => {
                return Err(RunOnceError::Conflict {
                    record: Box::new(record),
                });
            }
            Decision::Exhausted => {
                return Err(RunOnceError::Exhausted {
                    last_error: record.last_error.clone(),
                    record: Box::new(record),
                });
            }
            Decision::Unspecified => {
                return Err(CallError::protocol("Acquire answered no decision").into());
            }
        }

        let Some(granted) = response.lease else {
            return Err(CallError::protocol("PROCEED without a lease").into());
        };
        let lease = Lease {
            inner: Arc::new(LeaseInner {
                client: self.clone(),
                scope: scope.to_owned(),
                key: key.to_owned(),
                token: granted.token,
                attempt: granted.attempt,
                fencing_token: granted.fencing_token,
                checkpoint: record.checkpoint,
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
        };
        let interval = match options.heartbeat {
            Heartbeat::Auto => Some(options.lease_ttl / 3),
            Heartbeat::Every(interval) => Some(interval),
            Heartbeat::Off => None,
        }
        // Never a busy loop, whatever was asked.
        .map(|interval| interval.max(Duration::from_millis(10)));
        let beating = AbortOnDrop(
            interval.map(|every| tokio::spawn(heartbeat(Arc::clone(&lease.inner), every))),
        );

        let inner = Arc::clone(&lease.inner);
        let outcome = tokio::select! {
            biased;
            () = inner.lost.cancelled() => None,
            outcome = work(lease) => Some(outcome),
        };
        // The work has ended (or been dropped): no more extensions.
        drop(beating);
        let Some(outcome) = outcome else {
            return Err(RunOnceError::LeaseLost);
        };
        if inner.lost.is_cancelled() {
            return Err(RunOnceError::LeaseLost);
        }

        let (completion, result) = match outcome {
            Ok(value) => match codec.encode(&value) {
                Ok(bytes) => (
                    Outcome::Success(Success {
                        result: bytes,
                        content_type: codec.content_type().to_owned(),
                        ..Success::default()
                    }),
                    Ok(value),
                ),
                // The work ran but its value cannot be stored: record a
                // failure so that the key is retried.
                Err(error) => (
                    Outcome::Failure(Failure {
                        error: format!("the result could not be encoded: {error}"),
                        ..Failure::default()
                    }),
                    Err(RunOnceError::Codec(error)),
                ),
            },
            Err(failure) => {
                let outcome = match &failure {
                    WorkError::Retryable(e) => Outcome::Failure(Failure {
                        error: e.to_string(),
                        ..Failure::default()
                    }),
                    WorkError::RetryAfter(e, after) => Outcome::Failure(Failure {
                        error: e.to_string(),
                        permanent: false,
                        retry_after: Some(duration_to_proto(*after)),
                    }),
                    WorkError::Permanent(e) => Outcome::Failure(Failure {
                        error: e.to_string(),
                        permanent: true,
                        retry_after: None,
                    }),
                    WorkError::Release(_) => Outcome::Release(Release {}),
                };
                (outcome, Err(RunOnceError::Work(failure.into_inner())))
            }
        };
        let complete = CompleteRequest {
            scope: scope.to_owned(),
            key: key.to_owned(),
            lease_token: inner.token.clone(),
            outcome: Some(completion),
        };
        let completed = with_retries(options.backoff, options.max_retries, || {
            self.complete(complete.clone())
        })
        .await;
        match (result, completed) {
            (Ok(value), Ok(response)) => Ok(Done {
                value,
                replayed: false,
                record: response.record.unwrap_or_default(),
            }),
            (Ok(_), Err(error)) if error.is_lease_lost() => Err(RunOnceError::LeaseLost),
            (Ok(_), Err(error)) => Err(RunOnceError::Call(error)),
            // The work's own error is what the caller needs to hear, whether
            // or not the coordinator took the failure (if it did not, the
            // lease runs out and the key is retried).
            (Err(error), _) => Err(error),
        }
    }
}

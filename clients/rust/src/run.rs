//! The run-once template: Acquire (retried with one request id), the work
//! under a heartbeat, Complete (retried), and every other decision as a
//! typed outcome.

use std::fmt::Display;
use std::future::Future;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::client::Client;
use crate::codec::{Codec, Json};
use crate::error::{CallError, RunOnceError, WorkError};
use crate::lease::{Lease, under_heartbeat};
use crate::options::{Heartbeat, RunOptions, duration_to_proto};
use crate::proto::{
    AcquireRequest, AcquireResponse, CompleteRequest, CompleteResponse, Decision, Failure, Record,
    Release, Success, acquire_request::RequestFingerprint, complete_request::Outcome,
};
use crate::retry::with_retries;
use serde::Serialize;
use serde::de::DeserializeOwned;

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
    /// future is dropped and the outcome is [`RunOnceError::LeaseLost`]
    /// (or, with [`crate::WhenLeaseLost::LetFinish`], the work runs on).
    /// A value whose Complete fails is returned in
    /// [`RunOnceError::NotRecorded`]: the work did run.
    pub async fn run_once<T, E, F, Fut>(
        &self,
        scope: &str,
        key: &str,
        fingerprint: Fingerprint,
        options: &RunOptions,
        work: F,
    ) -> Result<Done<T>, RunOnceError<E, T>>
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
    ) -> Result<Done<T>, RunOnceError<E, T>>
    where
        C: Codec<T> + ?Sized,
        E: Display,
        F: FnOnce(Lease) -> Fut,
        Fut: Future<Output = Result<T, WorkError<E>>>,
    {
        let lease = match self
            .lease_for_run(codec, scope, key, fingerprint, options)
            .await
        {
            Acquired::Granted { lease, .. } => lease,
            Acquired::Answered(outcome) => return outcome,
        };
        let token = lease.token().to_owned();
        let interval = heartbeat_interval(options);
        let outcome = under_heartbeat(lease, interval, options.when_lease_lost, work).await?;
        let (completion, result) = completion(codec, outcome);
        let completed = self
            .complete_for_run(scope, key, &token, completion, options)
            .await;
        match (result, completed) {
            (Ok(value), Ok(response)) => Ok(Done {
                value,
                replayed: false,
                record: response.record.unwrap_or_default(),
            }),
            // The work ran: its value is the caller's, recorded or not.
            (Ok(value), Err(error)) => Err(RunOnceError::NotRecorded { value, error }),
            // The work's own error is what the caller needs to hear, whether
            // or not the coordinator took the failure (if it did not, the
            // lease runs out and the key is retried).
            (Err(error), _) => Err(error),
        }
    }

    /// The Acquire of one run (`run_once`, `run_once_in_transaction`):
    /// the lease it granted, or what the run answers instead (a replay, or
    /// the decision as an error).
    pub(crate) async fn lease_for_run<T, E, C>(
        &self,
        codec: &C,
        scope: &str,
        key: &str,
        fingerprint: Fingerprint,
        options: &RunOptions,
    ) -> Acquired<T, E>
    where
        C: Codec<T> + ?Sized,
    {
        let request = acquire_request(scope, key, fingerprint, options);
        let (response, asked) = match self.acquire_for_run(&request, options).await {
            Ok(answered) => answered,
            Err(error) => return Acquired::Answered(Err(error.into())),
        };
        let (granted, record) = match decided(codec, response) {
            Decided::Granted(granted, record) => (granted, record),
            Decided::Answered(outcome) => return Acquired::Answered(outcome),
        };
        let checkpoint = record.checkpoint.clone();
        let lease = Lease::granted(self, scope, key, granted, checkpoint, asked, options);
        Acquired::Granted { lease, record }
    }

    /// The Complete of one run's lease `token`, retried.
    pub(crate) async fn complete_for_run(
        &self,
        scope: &str,
        key: &str,
        token: &str,
        outcome: Outcome,
        options: &RunOptions,
    ) -> Result<CompleteResponse, CallError> {
        let complete = CompleteRequest {
            scope: scope.to_owned(),
            key: key.to_owned(),
            lease_token: token.to_owned(),
            outcome: Some(outcome),
        };
        with_retries(options.backoff, options.max_retries, || {
            self.complete(complete.clone())
        })
        .await
    }

    /// Acquire, retried with the same request id; and when the call that
    /// was answered was sent: the lease's expiry counts from about then.
    async fn acquire_for_run(
        &self,
        request: &AcquireRequest,
        options: &RunOptions,
    ) -> Result<(AcquireResponse, Instant), CallError> {
        let sent = Mutex::new(Instant::now());
        let response = with_retries(options.backoff, options.max_retries, || {
            *sent.lock().unwrap() = Instant::now();
            self.acquire(request.clone())
        })
        .await?;
        let asked = *sent.lock().unwrap();
        Ok((response, asked))
    }
}

/// The Acquire of one `run_once`; a fresh request id unless one is given.
fn acquire_request(
    scope: &str,
    key: &str,
    fingerprint: Fingerprint,
    options: &RunOptions,
) -> AcquireRequest {
    AcquireRequest {
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
    }
}

/// What a run's Acquire leaves it with.
pub(crate) enum Acquired<T, E> {
    /// PROCEED: the lease to work under, and the record as it stood.
    Granted {
        lease: Lease,
        #[cfg_attr(
            not(feature = "tokio-postgres"),
            expect(dead_code, reason = "only the in-transaction run reads it")
        )]
        record: Record,
    },
    /// Any other decision, or a failed call: what the run answers (a
    /// replay's stored value, or an error).
    Answered(Result<Done<T>, RunOnceError<E, T>>),
}

/// An Acquire's answer, read.
enum Decided<T, E> {
    /// PROCEED: the lease as granted, and the record.
    Granted(crate::proto::Lease, Record),
    /// What the run answers instead.
    Answered(Result<Done<T>, RunOnceError<E, T>>),
}

/// Reads an Acquire's answer: the lease it granted, or what `run_once`
/// answers instead.
fn decided<T, E, C>(codec: &C, response: AcquireResponse) -> Decided<T, E>
where
    C: Codec<T> + ?Sized,
{
    let decision = response.decision();
    let record = response.record.unwrap_or_default();
    let retry_after = duration_from_proto(response.retry_after);
    let answer = match decision {
        Decision::Proceed => {
            return match response.lease {
                Some(lease) => Decided::Granted(lease, record),
                None => {
                    Decided::Answered(Err(CallError::protocol("PROCEED without a lease").into()))
                }
            };
        }
        Decision::AlreadyDone => {
            let stored = record.result.clone().unwrap_or_default();
            codec
                .decode(&stored.result, &stored.content_type)
                .map_err(RunOnceError::Codec)
                .map(|value| Done {
                    value,
                    replayed: true,
                    record,
                })
        }
        Decision::InProgress => Err(RunOnceError::InProgress {
            retry_after,
            record: Box::new(record),
        }),
        Decision::RetryLater => Err(RunOnceError::RetryLater {
            retry_after,
            record: Box::new(record),
        }),
        Decision::Conflict => Err(RunOnceError::Conflict {
            record: Box::new(record),
        }),
        Decision::Exhausted => Err(RunOnceError::Exhausted {
            last_error: record.last_error.clone(),
            record: Box::new(record),
        }),
        Decision::Unspecified => Err(CallError::protocol("Acquire answered no decision").into()),
    };
    Decided::Answered(answer)
}

/// How often the lease is extended while the work runs; never a busy loop,
/// whatever was asked.
pub(crate) fn heartbeat_interval(options: &RunOptions) -> Option<Duration> {
    match options.heartbeat {
        Heartbeat::Auto => Some(options.lease_ttl / 3),
        Heartbeat::Every(interval) => Some(interval),
        Heartbeat::Off => None,
    }
    .map(|interval| interval.max(Duration::from_millis(10)))
}

/// The Complete the work's `outcome` calls for, and what `run_once`
/// answers once it is sent.
pub(crate) fn completion<T, E, C>(
    codec: &C,
    outcome: Result<T, WorkError<E>>,
) -> (Outcome, Result<T, RunOnceError<E, T>>)
where
    C: Codec<T> + ?Sized,
    E: Display,
{
    match outcome {
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
    }
}

//! Errors: a failed call with its `google.rpc` details decoded, the work's
//! own error and how it wants to be recorded, and everything `run_once` can
//! end with that is not a value.

use std::fmt;
use std::time::Duration;

use tonic::Code;
use tonic_types::StatusExt as _;

use crate::proto::Record;

/// A call the coordinator did not answer with a result (after any retries):
/// the gRPC code and message, and what the `google.rpc` details say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallError {
    /// The gRPC status code.
    pub code: Code,
    /// The status message.
    pub message: String,
    /// `google.rpc.ErrorInfo.reason`, e.g. `INVALID_ARGUMENT`, `LEASE_LOST`,
    /// `UNAUTHENTICATED`, `DATABASE_UNAVAILABLE`; `None` when the error
    /// carried no ErrorInfo (for example, a transport failure).
    pub reason: Option<String>,
    /// `google.rpc.BadRequest` field violations: which field was wrong and
    /// why.
    pub field_violations: Vec<FieldViolation>,
    /// `google.rpc.RetryInfo.retry_delay`: how long to wait before trying
    /// again.
    pub retry_after: Option<Duration>,
}

/// One field of a request that the coordinator refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldViolation {
    /// The field's name, e.g. `scope`.
    pub field: String,
    /// Why it was refused.
    pub description: String,
}

impl CallError {
    /// Whether sending the same call again may succeed: UNAVAILABLE,
    /// DEADLINE_EXCEEDED (the reply may have been lost), and
    /// RESOURCE_EXHAUSTED with reason SERVER_BUSY or TOO_MANY_WAITERS.
    pub fn is_retryable(&self) -> bool {
        match self.code {
            Code::Unavailable | Code::DeadlineExceeded => true,
            Code::ResourceExhausted => matches!(
                self.reason.as_deref(),
                Some("SERVER_BUSY" | "TOO_MANY_WAITERS")
            ),
            _ => false,
        }
    }

    /// ABORTED: the lease is no longer this caller's (reason `LEASE_LOST` or
    /// `LEASE_EXPIRED`).
    pub fn is_lease_lost(&self) -> bool {
        self.code == Code::Aborted
    }

    /// The call's own deadline passed on this side.
    pub(crate) fn deadline(after: Duration) -> Self {
        CallError {
            code: Code::DeadlineExceeded,
            message: format!("no answer within the call's deadline ({after:?})"),
            reason: None,
            field_violations: Vec::new(),
            retry_after: None,
        }
    }

    /// The coordinator answered something this client cannot make sense of.
    pub(crate) fn protocol(message: impl Into<String>) -> Self {
        CallError {
            code: Code::Internal,
            message: message.into(),
            reason: None,
            field_violations: Vec::new(),
            retry_after: None,
        }
    }
}

impl From<tonic::Status> for CallError {
    fn from(status: tonic::Status) -> Self {
        let details = status.get_error_details();
        CallError {
            code: status.code(),
            message: status.message().to_owned(),
            reason: details
                .error_info()
                .map(|info| info.reason.clone())
                .filter(|reason| !reason.is_empty()),
            field_violations: details
                .bad_request()
                .map(|bad| {
                    bad.field_violations
                        .iter()
                        .map(|v| FieldViolation {
                            field: v.field.clone(),
                            description: v.description.clone(),
                        })
                        .collect()
                })
                .unwrap_or_default(),
            retry_after: details.retry_info().and_then(|info| info.retry_delay),
        }
    }
}

impl fmt::Display for CallError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.code)?;
        if let Some(reason) = &self.reason {
            write!(f, " ({reason})")?;
        }
        write!(f, ": {}", self.message)?;
        for violation in &self.field_violations {
            write!(f, "; {}: {}", violation.field, violation.description)?;
        }
        Ok(())
    }
}

impl std::error::Error for CallError {}

/// The work's error, and how the coordinator should record it.
///
/// `?` on a `Result<_, E>` inside the work converts `E` into
/// [`WorkError::Retryable`].
///
/// Non-exhaustive: a new way to record a failure is not a breaking change,
/// so a `match` on it outside this crate needs a `_` arm.
#[derive(Debug)]
#[non_exhaustive]
pub enum WorkError<E> {
    /// The attempt failed; the key may be tried again after the server's
    /// backoff (while attempts are left).
    Retryable(E),
    /// The attempt failed; try again no sooner than this (overrides the
    /// server's backoff).
    RetryAfter(E, Duration),
    /// The request can never succeed: the key becomes EXHAUSTED.
    Permanent(E),
    /// Nothing irreversible happened: give the key back at once; this
    /// attempt does not count.
    Release(E),
}

impl<E> WorkError<E> {
    /// The error inside.
    pub fn into_inner(self) -> E {
        match self {
            WorkError::Retryable(e)
            | WorkError::RetryAfter(e, _)
            | WorkError::Permanent(e)
            | WorkError::Release(e) => e,
        }
    }
}

impl<E> From<E> for WorkError<E> {
    fn from(error: E) -> Self {
        WorkError::Retryable(error)
    }
}

/// How `run_once` ended when it has no recorded value to give: a decision
/// that is not PROCEED or ALREADY_DONE, a lost lease, the work's own error,
/// a value the coordinator did not record, or a call that failed. `E` is
/// the work's error, `T` its value.
///
/// Non-exhaustive: a new way for a call to end is not a breaking change, so
/// a `match` on it outside this crate needs a `_` arm (for example to the
/// error's `Display`).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RunOnceError<E, T> {
    /// Another caller still holds the lease after the wait window; ask
    /// again after `retry_after`.
    #[error("another caller is running this operation (retry after {retry_after:?})")]
    InProgress {
        retry_after: Option<Duration>,
        record: Box<Record>,
    },
    /// The last attempt failed and its retry is not due yet.
    #[error("the last attempt failed; retry after {retry_after:?}")]
    RetryLater {
        retry_after: Option<Duration>,
        record: Box<Record>,
    },
    /// The key was first used with a different request (fingerprint).
    #[error("the key belongs to a different request")]
    Conflict { record: Box<Record> },
    /// No attempts are left, or an attempt failed permanently.
    #[error("no attempts left: {last_error}")]
    Exhausted {
        last_error: String,
        record: Box<Record>,
    },
    /// The lease was taken over (or ran out) while the work ran and the
    /// work was dropped ([`crate::WhenLeaseLost::DropWork`]): another caller
    /// may be running the operation. Nothing was recorded by this caller.
    #[error("the lease was lost; another caller may run the operation")]
    LeaseLost,
    /// The work returned its value, but the Complete that would have stored
    /// it failed (after its retries). The work did run: here is its value.
    /// When `error.is_lease_lost()`, the lease was no longer this caller's
    /// and another caller may run (or have run) the operation; otherwise the
    /// lease runs out and the key's next caller runs the work again.
    #[error("the work's value was not recorded: {error}")]
    NotRecorded {
        /// What the work returned.
        value: T,
        /// Why the Complete failed.
        error: CallError,
    },
    /// The work failed; the failure was reported to the coordinator.
    #[error("{0}")]
    Work(E),
    /// The result could not be encoded, or a stored one decoded.
    #[error("codec: {0}")]
    Codec(#[source] crate::codec::CodecError),
    /// A call failed (after its retries): a bad argument, bad credentials,
    /// the coordinator or its database unreachable.
    #[error("{0}")]
    Call(#[from] CallError),
    /// A statement on the caller's own database connection failed in
    /// `run_once_in_transaction` (the completion, or the savepoint around
    /// the work): the work's writes were rolled back with it, and nothing
    /// was recorded by this caller.
    #[error("the caller's database: {0}")]
    Database(#[source] Box<dyn std::error::Error + Send + Sync>),
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic_types::ErrorDetails;

    #[test]
    fn decodes_reason_field_violations_and_retry_delay() {
        let mut details = ErrorDetails::with_error_info("INVALID_ARGUMENT", "idempotency.v1", []);
        details.add_bad_request_violation("scope", "must match [A-Za-z0-9._:/-]");
        details.set_retry_info(Some(Duration::from_millis(250)));
        let status = tonic::Status::with_error_details(Code::InvalidArgument, "bad scope", details);
        let error = CallError::from(status);
        assert_eq!(error.code, Code::InvalidArgument);
        assert_eq!(error.message, "bad scope");
        assert_eq!(error.reason.as_deref(), Some("INVALID_ARGUMENT"));
        assert_eq!(error.field_violations.len(), 1);
        assert_eq!(error.field_violations[0].field, "scope");
        assert_eq!(error.retry_after, Some(Duration::from_millis(250)));
        assert!(!error.is_retryable());
        let text = error.to_string();
        assert!(
            text.contains("InvalidArgument (INVALID_ARGUMENT)"),
            "{text}"
        );
        assert!(text.contains("scope: must match"), "{text}");
    }

    #[test]
    fn a_status_without_details_has_no_reason() {
        let error = CallError::from(tonic::Status::unavailable("connection refused"));
        assert_eq!(error.code, Code::Unavailable);
        assert_eq!(error.reason, None);
        assert!(error.field_violations.is_empty());
        assert_eq!(error.retry_after, None);
    }

    fn with_reason(code: Code, reason: &str) -> CallError {
        let details = ErrorDetails::with_error_info(reason, "idempotency.v1", []);
        tonic::Status::with_error_details(code, "x", details).into()
    }

    #[test]
    fn which_errors_are_retried() {
        assert!(with_reason(Code::Unavailable, "DATABASE_UNAVAILABLE").is_retryable());
        assert!(with_reason(Code::DeadlineExceeded, "DEADLINE_EXCEEDED").is_retryable());
        assert!(with_reason(Code::ResourceExhausted, "SERVER_BUSY").is_retryable());
        assert!(with_reason(Code::ResourceExhausted, "TOO_MANY_WAITERS").is_retryable());
        assert!(!with_reason(Code::ResourceExhausted, "REQUEST_TOO_LARGE").is_retryable());
        assert!(!with_reason(Code::Aborted, "LEASE_LOST").is_retryable());
        assert!(with_reason(Code::Aborted, "LEASE_EXPIRED").is_lease_lost());
        assert!(!with_reason(Code::Unauthenticated, "UNAUTHENTICATED").is_retryable());
        assert!(!with_reason(Code::InvalidArgument, "INVALID_ARGUMENT").is_retryable());
    }

    #[test]
    fn question_mark_makes_an_error_retryable() {
        fn work() -> Result<(), WorkError<std::num::ParseIntError>> {
            "x".parse::<i32>()?;
            Ok(())
        }
        assert!(matches!(work(), Err(WorkError::Retryable(_))));
    }
}

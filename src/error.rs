//! The one error type of the gRPC surface and its mapping to `tonic::Status`:
//! an exhaustive `match`, so a new kind of error forces a decision about its
//! code. Every status carries a `google.rpc.ErrorInfo` with a stable reason in
//! domain `idempotency.v1`; bad fields add `google.rpc.BadRequest`, and
//! UNAVAILABLE adds `google.rpc.RetryInfo`.
//!
//! Messages name fields and rules, never payloads, results or tokens; the
//! cause chain of server-side failures goes to the log only.

use std::time::Duration;

use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt};

use crate::auth::AuthError;
use crate::domain::{Refusal, TooManyWaiters};
use crate::metrics::Metrics;
use crate::store::{PastDeadline, StoreError};
use crate::telemetry::cause_chain;

/// The `ErrorInfo.domain` of every error this service returns.
pub const ERROR_DOMAIN: &str = "idempotency.v1";

/// How long a caller told UNAVAILABLE should wait before trying again.
const UNAVAILABLE_RETRY_DELAY: Duration = Duration::from_secs(1);

/// A request field that was refused, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// The field's name as in the proto, dotted for nested fields
    /// (`success.result`).
    pub field: String,
    /// Why the field was refused, as the caller reads it in the BadRequest
    /// details.
    pub description: String,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("invalid request: {}", describe(.0))]
    InvalidArgument(Vec<Violation>),
    #[error(transparent)]
    Refused(#[from] Refusal),
    #[error("the database is unavailable")]
    Unavailable(#[source] Box<dyn std::error::Error + Send + Sync>),
    #[error("internal error")]
    Internal(#[source] Box<dyn std::error::Error + Send + Sync>),
    #[error(transparent)]
    Unauthenticated(#[from] AuthError),
    #[error("{0}")]
    PermissionDenied(&'static str),
    #[error(transparent)]
    TooManyWaiters(#[from] TooManyWaiters),
    /// The server holds as many arriving request bytes as it may.
    #[error("the server is receiving too many requests at once; try again shortly")]
    Overloaded,
    /// A message declared longer than the server accepts.
    #[error("the request message is {declared} bytes, over the limit of {limit} ({flag})")]
    RequestTooLarge {
        /// The length the message's gRPC frame declared, in bytes.
        declared: usize,
        /// The largest message accepted, in bytes.
        limit: usize,
        /// What sets the limit (a flag, or the fixed health and reflection
        /// limit), named to the caller.
        flag: &'static str,
    },
    /// A request body that did not arrive in time; the call did not run.
    #[error(
        "the request did not arrive within {0:?} (--request-body-timeout); the call did not run"
    )]
    RequestTooSlow(Duration),
    /// The caller's deadline passed before the answer was ready.
    #[error("the call's deadline passed before it was answered")]
    DeadlineExceeded,
}

fn describe(violations: &[Violation]) -> String {
    violations
        .iter()
        .map(|v| format!("{}: {}", v.field, v.description))
        .collect::<Vec<_>>()
        .join("; ")
}

impl Error {
    /// The call's error for a store failure, counted in `metrics`: a
    /// database failure by its kind, a refusal by its reason. (No `From`:
    /// every call's store failure is counted in its server's metrics.)
    pub fn from_store(error: StoreError, metrics: &Metrics) -> Self {
        if let Some(kind) = error.kind() {
            metrics.database_error(kind);
        }
        if let StoreError::Refused(refusal) = &error {
            metrics.refused(refused(*refusal).1);
        }
        match error {
            StoreError::Refused(refusal) => Error::Refused(refusal),
            // One PostgreSQL still working on the call when its caller's
            // deadline came (a lock wait, say): the caller's deadline.
            StoreError::Unavailable(source)
                if source
                    .downcast_ref::<PastDeadline>()
                    .is_some_and(|past| !past.on_node()) =>
            {
                Error::DeadlineExceeded
            }
            StoreError::Unavailable(source) => Error::Unavailable(source),
            e @ (StoreError::Query(_) | StoreError::Corrupt(_) | StoreError::Config(_)) => {
                Error::Internal(Box::new(e))
            }
        }
    }
}

/// A refusal's code and `ErrorInfo` reason.
fn refused(refusal: Refusal) -> (Code, &'static str) {
    match refusal {
        Refusal::NotFound => (Code::NotFound, "RECORD_NOT_FOUND"),
        Refusal::LeaseLost => (Code::Aborted, "LEASE_LOST"),
        Refusal::LeaseExpired => (Code::Aborted, "LEASE_EXPIRED"),
        Refusal::AlreadyCompleted => (Code::FailedPrecondition, "ALREADY_COMPLETED"),
        Refusal::WrongStatus => (Code::FailedPrecondition, "WRONG_STATUS"),
    }
}

fn status(code: Code, reason: &str, message: String, mut details: ErrorDetails) -> Status {
    details.set_error_info(reason, ERROR_DOMAIN, []);
    Status::with_error_details(code, message, details)
}

impl From<Error> for Status {
    fn from(error: Error) -> Status {
        let message = error.to_string();
        match error {
            Error::InvalidArgument(violations) => {
                let mut details = ErrorDetails::new();
                for v in &violations {
                    details.add_bad_request_violation(v.field.clone(), v.description.clone());
                }
                status(Code::InvalidArgument, "INVALID_ARGUMENT", message, details)
            }
            Error::Refused(refusal) => {
                let (code, reason) = refused(refusal);
                status(code, reason, message, ErrorDetails::new())
            }
            Error::Unavailable(ref source) => {
                tracing::warn!(error = %cause_chain(source.as_ref()), "database unavailable");
                status(
                    Code::Unavailable,
                    "DATABASE_UNAVAILABLE",
                    message,
                    ErrorDetails::with_retry_info(Some(UNAVAILABLE_RETRY_DELAY)),
                )
            }
            Error::Internal(ref source) => {
                tracing::error!(error = %cause_chain(source.as_ref()), "internal error");
                status(Code::Internal, "INTERNAL", message, ErrorDetails::new())
            }
            Error::Unauthenticated(_) => status(
                Code::Unauthenticated,
                "UNAUTHENTICATED",
                message,
                ErrorDetails::new(),
            ),
            Error::PermissionDenied(_) => status(
                Code::PermissionDenied,
                "PERMISSION_DENIED",
                message,
                ErrorDetails::new(),
            ),
            Error::TooManyWaiters(_) => status(
                Code::ResourceExhausted,
                "TOO_MANY_WAITERS",
                message,
                ErrorDetails::with_retry_info(Some(UNAVAILABLE_RETRY_DELAY)),
            ),
            Error::Overloaded => status(
                Code::ResourceExhausted,
                "SERVER_BUSY",
                message,
                ErrorDetails::with_retry_info(Some(UNAVAILABLE_RETRY_DELAY)),
            ),
            Error::RequestTooLarge { .. } => status(
                Code::ResourceExhausted,
                "REQUEST_TOO_LARGE",
                message,
                ErrorDetails::new(),
            ),
            Error::RequestTooSlow(_) => status(
                Code::DeadlineExceeded,
                "REQUEST_TOO_SLOW",
                message,
                ErrorDetails::new(),
            ),
            Error::DeadlineExceeded => status(
                Code::DeadlineExceeded,
                "DEADLINE_EXCEEDED",
                message,
                ErrorDetails::new(),
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn field_violations_travel_as_bad_request_details() {
        let status: Status = Error::InvalidArgument(vec![Violation {
            field: "key".into(),
            description: "must not be empty".into(),
        }])
        .into();
        assert_eq!(status.code(), Code::InvalidArgument);
        let details = status.get_error_details();
        let bad = details.bad_request().expect("BadRequest");
        assert_eq!(bad.field_violations[0].field, "key");
        let info = details.error_info().expect("ErrorInfo");
        assert_eq!(info.reason, "INVALID_ARGUMENT");
        assert_eq!(info.domain, ERROR_DOMAIN);
    }

    #[test]
    fn unavailable_tells_when_to_retry_and_hides_the_cause() {
        let cause = std::io::Error::other("connection refused by 10.0.0.7");
        let status: Status = Error::Unavailable(Box::new(cause)).into();
        assert_eq!(status.code(), Code::Unavailable);
        assert!(status.get_error_details().retry_info().is_some());
        assert!(!status.message().contains("10.0.0.7"));
    }
}

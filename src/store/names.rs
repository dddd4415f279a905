//! The names the SQL functions use for statuses, decisions, outcomes and
//! refusals, and the domain values they stand for: the wire between the
//! store and `sql/`, in one place.

use crate::domain::{Decision, Outcome, Refusal, Status};

/// A record's status, from the `status` column.
pub fn status(name: &str) -> Option<Status> {
    Some(match name {
        "PROCESSING" => Status::Processing,
        "SUCCEEDED" => Status::Succeeded,
        "FAILED" => Status::Failed,
        "FAILED_PERMANENT" => Status::FailedPermanent,
        _ => return None,
    })
}

/// An Acquire's decision, as `idempotency_acquire` returns it
/// ([`Decision::name`]).
pub fn decision(name: &str) -> Option<Decision> {
    Decision::ALL.into_iter().find(|d| d.name() == name)
}

/// The outcome the SQL functions return for a call on a lease: `Some(None)`
/// for `OK`, `Some(Some(_))` for a refusal, `None` for a name not theirs.
pub fn refusal(name: &str) -> Option<Option<Refusal>> {
    Some(match name {
        "OK" => None,
        "NOT_FOUND" => Some(Refusal::NotFound),
        "LEASE_LOST" => Some(Refusal::LeaseLost),
        "LEASE_EXPIRED" => Some(Refusal::LeaseExpired),
        "ALREADY_COMPLETED" => Some(Refusal::AlreadyCompleted),
        "WRONG_STATUS" => Some(Refusal::WrongStatus),
        _ => return None,
    })
}

/// A status's name in the `status` column.
pub fn status_name(status: Status) -> &'static str {
    match status {
        Status::Processing => "PROCESSING",
        Status::Succeeded => "SUCCEEDED",
        Status::Failed => "FAILED",
        Status::FailedPermanent => "FAILED_PERMANENT",
    }
}

/// The name `idempotency_complete` takes for an outcome.
pub fn outcome(outcome: &Outcome) -> &'static str {
    match outcome {
        Outcome::Success(_) => "SUCCESS",
        Outcome::Failure { .. } => "FAILURE",
        Outcome::Release => "RELEASE",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_decision_and_status_has_a_name() {
        for name in [
            "PROCEED",
            "ALREADY_DONE",
            "IN_PROGRESS",
            "RETRY_LATER",
            "CONFLICT",
            "EXHAUSTED",
        ] {
            assert_eq!(decision(name).map(Decision::name), Some(name));
        }
        for name in ["PROCESSING", "SUCCEEDED", "FAILED", "FAILED_PERMANENT"] {
            assert!(status(name).is_some(), "{name}");
        }
        assert_eq!(refusal("OK"), Some(None));
        assert_eq!(decision("proceed"), None);
    }
}

//! Records, leases and decisions: what the store reads back and the service
//! encodes, and the commands that carry validated requests to the store.

use std::time::Duration;

use chrono::{DateTime, Utc};

use super::{ErrorText, Fingerprint, Key, LeaseToken, RequestId, Scope, Tenant};

/// Where a record lives: the tenant comes from the caller's credential, the
/// rest from the request.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RecordId {
    /// The owner: the authenticated caller, never a request field.
    pub tenant: Tenant,
    /// The operation the key belongs to.
    pub scope: Scope,
    /// The caller's idempotency key, unique within the tenant and scope.
    pub key: Key,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Processing,
    Succeeded,
    Failed,
    FailedPermanent,
}

/// A successful outcome as stored and replayed.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct StoredResult {
    /// The response bytes to replay, exactly as the holder gave them.
    pub result: Vec<u8>,
    /// The media type of `result` (e.g. `application/json`); empty when not
    /// given.
    pub content_type: String,
    /// An application status code to replay (e.g. an HTTP status); 0 when not
    /// given.
    pub status_code: i32,
    /// Where a result too large to store lives (a URL, an object key); empty
    /// when none.
    pub result_ref: String,
}

/// One operation's state, as the database holds it.
#[derive(Debug, Clone, PartialEq)]
pub struct Record {
    /// The operation, as stored.
    pub scope: String,
    /// The idempotency key, as stored.
    pub key: String,
    /// Where the operation stands: being worked on, done, or failed (for now
    /// or for good).
    pub status: Status,
    /// The request's fingerprint, fixed when the record was created; empty
    /// when none.
    pub fingerprint: Fingerprint,
    /// Leases granted so far, less released ones.
    pub attempt_count: u32,
    /// Attempts allowed in all, fixed when the record was created.
    pub max_attempts: u32,
    /// When the current lease runs out (database clock); set only while
    /// PROCESSING.
    pub lease_expires_at: Option<DateTime<Utc>>,
    /// When the next attempt is due (database clock); set only while FAILED.
    pub next_retry_at: Option<DateTime<Utc>>,
    /// The last reported failure, or why the record became FAILED_PERMANENT;
    /// empty when none.
    pub last_error: String,
    /// When `last_error` was written; `None` when there is none.
    pub last_error_at: Option<DateTime<Utc>>,
    /// Set when SUCCEEDED.
    pub result: Option<StoredResult>,
    /// The progress last saved with ExtendLease, for whoever takes over;
    /// empty when none.
    pub checkpoint: Vec<u8>,
    /// The latest lease's fencing token (see `Lease::fencing_token`).
    pub fencing_token: u64,
    /// When the record was created (database clock).
    pub created_at: DateTime<Utc>,
    /// When the record last changed (database clock).
    pub updated_at: DateTime<Utc>,
    /// When the record became SUCCEEDED or FAILED_PERMANENT; `None` until
    /// then.
    pub completed_at: Option<DateTime<Utc>>,
    /// When the record is deleted (database clock); it is not found from then
    /// on.
    pub expires_at: DateTime<Utc>,
    /// The latest lease; handed out only with a PROCEED decision.
    pub lease: Lease,
    /// The request_id the latest lease was granted to; empty when none.
    pub lease_request_id: String,
    /// The last administrator's action on the record; `None` when none.
    pub admin: Option<AdminNote>,
}

/// An administrator's action, as recorded on the record it changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdminNote {
    /// What was done: `RELEASE_LEASE`, `RETRY_NOW` or `FAIL_PERMANENTLY`.
    pub action: String,
    /// Who did it: the credential and the operator's own name.
    pub actor: String,
    /// Why, as the administrator wrote it.
    pub reason: String,
    /// When (database clock).
    pub at: DateTime<Utc>,
}

impl Record {
    /// The answer a live record gives an Acquire with `fingerprint` whatever
    /// else holds: CONFLICT for another fingerprint (fixed when the record
    /// was created), ALREADY_DONE once SUCCEEDED (final); `None` when the
    /// answer depends on more (leases, retries, attempts), which only
    /// `idempotency_acquire` decides.
    ///
    /// The same rule as SQL's `idempotency_final_decision`
    /// (`sql/functions/acquire.sql`); `tests/api/conformance.rs` holds
    /// both to `idempotency_acquire`'s answers.
    pub fn final_decision(&self, fingerprint: &Fingerprint) -> Option<Decision> {
        if self.fingerprint != *fingerprint {
            Some(Decision::Conflict)
        } else if self.status == Status::Succeeded {
            Some(Decision::AlreadyDone)
        } else {
            None
        }
    }
}

/// The right to do the work and report it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    /// Proves the holder's right to Complete and ExtendLease; kept after the
    /// lease ends so that a repeated Complete is recognised.
    pub token: LeaseToken,
    /// Which attempt, from 1.
    pub attempt: u32,
    /// `None` once the lease has ended (the record left PROCESSING).
    pub expires_at: Option<DateTime<Utc>>,
    /// Grows with every lease ever granted on the key; holders pass it to
    /// downstream writes so that a stale holder's late write can be refused
    /// there.
    pub fencing_token: u64,
}

/// What an Acquire caller must do (API.md's table).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    Proceed,
    AlreadyDone,
    InProgress,
    RetryLater,
    Conflict,
    Exhausted,
}

impl Decision {
    /// Every decision.
    pub const ALL: [Decision; 6] = [
        Decision::Proceed,
        Decision::AlreadyDone,
        Decision::InProgress,
        Decision::RetryLater,
        Decision::Conflict,
        Decision::Exhausted,
    ];

    /// Its name, as the contract and `idempotency_acquire` spell it (and
    /// metrics label it).
    pub fn name(self) -> &'static str {
        match self {
            Decision::Proceed => "PROCEED",
            Decision::AlreadyDone => "ALREADY_DONE",
            Decision::InProgress => "IN_PROGRESS",
            Decision::RetryLater => "RETRY_LATER",
            Decision::Conflict => "CONFLICT",
            Decision::Exhausted => "EXHAUSTED",
        }
    }
}

/// An Acquire's answer.
#[derive(Debug, Clone, PartialEq)]
pub struct Acquired {
    /// What the caller must do.
    pub decision: Decision,
    /// The record as it stands after the decision (on CONFLICT: the one the
    /// key belongs to).
    pub record: Record,
    /// Set on IN_PROGRESS and RETRY_LATER.
    pub retry_after: Option<Duration>,
}

/// How the last error of a record whose dead lease the sweeper reclaimed
/// begins (`sql/functions/sweep.sql`, `idempotency_sweep_batch`); a test
/// against the database (`tests/api/sweep.rs`) holds the two together.
const RECLAIMED_LEASE_ERROR: &str = "the lease of attempt ";

impl Acquired {
    /// The lease, for the caller that may proceed.
    pub fn lease(&self) -> Option<&Lease> {
        (self.decision == Decision::Proceed).then_some(&self.record.lease)
    }

    /// Whether this answer took over a key whose previous lease ran out
    /// before its holder completed, as far as the answer tells: PROCEED on
    /// an attempt above the first, with no failure reported since (the last
    /// error is empty, or the one the sweeper writes when it reclaims a dead
    /// lease). A retry after a reported failure is not a takeover; a takeover
    /// after an earlier attempt's reported failure looks like one and is not
    /// counted, and a caller asking again with the `request_id` of a lease
    /// it already holds (an answer lost) counts again.
    pub fn took_over(&self) -> bool {
        self.decision == Decision::Proceed
            && self.record.lease.attempt > 1
            && (self.record.last_error.is_empty()
                || self.record.last_error.starts_with(RECLAIMED_LEASE_ERROR))
    }
}

/// Calls that cannot be answered with a record, for reasons the caller must
/// act on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("no record for this scope and key (it may have expired)")]
    NotFound,
    #[error(
        "the lease token is not the record's current one: the lease was lost to another caller; call Acquire again"
    )]
    LeaseLost,
    #[error(
        "the lease has ended (it ran out, or its holder completed it) and cannot be extended; call Acquire again"
    )]
    LeaseExpired,
    #[error(
        "the lease's holder already completed it with another outcome; the stored outcome stands"
    )]
    AlreadyCompleted,
    /// An administrator's action that the record's status does not allow
    /// (releasing the lease of a record nobody holds, say).
    #[error("the record's status does not allow this action; the record is unchanged")]
    WrongStatus,
}

/// A validated Acquire: which record, which request, and the limits its
/// caller asked for (defaults and caps of the policy applied).
#[derive(Debug, Clone)]
pub struct AcquireCommand {
    /// The record the caller asks for: tenant, scope and key.
    pub id: RecordId,
    /// What identifies the request's content: a different one on the same
    /// key is a CONFLICT.
    pub fingerprint: Fingerprint,
    /// The caller's attempt (empty for none): a retry with the same one gets
    /// its own lease back.
    pub request_id: RequestId,
    /// How long a granted lease lasts.
    pub lease_ttl: Duration,
    /// Attempts allowed before the record is FAILED_PERMANENT.
    pub max_attempts: u32,
    /// How long the record is kept once it is done.
    pub retention: Duration,
    /// How long the caller is prepared to wait while the key is held.
    pub wait: Duration,
    /// When the caller stops waiting for any answer (its deadline, as the
    /// server read it when the call arrived); `None`: it did not say. No
    /// statement of the call may commit after it.
    pub answer_by: Option<std::time::Instant>,
}

/// How the holder's work ended.
#[derive(Debug, Clone)]
pub enum Outcome {
    Success(StoredResult),
    Failure {
        /// What went wrong, for whoever retries or investigates.
        error: ErrorText,
        /// Do not retry: the record becomes FAILED_PERMANENT.
        permanent: bool,
        /// Overrides the backoff when set.
        retry_after: Option<Duration>,
    },
    Release,
}

#[derive(Debug, Clone)]
pub struct CompleteCommand {
    /// The record whose lease is completed.
    pub id: RecordId,
    /// The lease token Acquire returned; one that is not the record's latest
    /// is refused as `LeaseLost`.
    pub token: LeaseToken,
    /// How the holder's work ended: what the record stores.
    pub outcome: Outcome,
}

#[derive(Debug, Clone)]
pub struct ExtendCommand {
    /// The record whose lease is extended.
    pub id: RecordId,
    /// The current lease's token.
    pub token: LeaseToken,
    /// How much to add: the new expiry is max(old expiry, now) plus this,
    /// never past the maximum lease from now.
    pub extend_by: Duration,
    /// `None` keeps the stored checkpoint.
    pub checkpoint: Option<Vec<u8>>,
}

/// Why the recovery feed offers a record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DueReason {
    /// FAILED, and its retry has come due.
    RetryDue,
    /// The holder let its lease run out (it probably died); the record may
    /// since have been reclaimed by the sweeper.
    LeaseExpired,
}

/// A due record as offered to one recovery subscriber.
#[derive(Debug, Clone, PartialEq)]
pub struct DueRecord {
    /// The tenant that owns the record.
    pub tenant: Tenant,
    /// The record as it stood when it was offered.
    pub record: Record,
    /// Why it is offered: a retry came due, or its holder's lease ran out.
    pub reason: DueReason,
}

/// What a sweep did (or, dry, would do).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SweepCounts {
    /// Records past their expiry, deleted.
    pub expired_deleted: u64,
    /// PROCESSING records whose lease ran out, turned FAILED or
    /// FAILED_PERMANENT.
    pub leases_reclaimed: u64,
    /// FAILED records whose retry is due.
    pub retries_due: u64,
}

impl std::ops::AddAssign for SweepCounts {
    fn add_assign(&mut self, other: Self) {
        self.expired_deleted += other.expired_deleted;
        self.leases_reclaimed += other.leases_reclaimed;
        self.retries_due += other.retries_due;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{Fingerprint, LeaseToken};

    fn answer(decision: Decision, attempt: u32, last_error: &str) -> Acquired {
        let now = chrono::Utc::now();
        Acquired {
            decision,
            record: Record {
                scope: "s".into(),
                key: "k".into(),
                status: Status::Processing,
                fingerprint: Fingerprint::of_payload(b"request"),
                attempt_count: attempt,
                max_attempts: 10,
                lease_expires_at: Some(now),
                next_retry_at: None,
                last_error: last_error.into(),
                last_error_at: None,
                result: None,
                checkpoint: Vec::new(),
                fencing_token: 1,
                created_at: now,
                updated_at: now,
                completed_at: None,
                expires_at: now,
                lease: Lease {
                    token: LeaseToken::from_uuid(uuid::Uuid::new_v4()),
                    attempt,
                    expires_at: Some(now),
                    fencing_token: 1,
                },
                lease_request_id: String::new(),
                admin: None,
            },
            retry_after: None,
        }
    }

    #[test]
    fn a_takeover_is_a_later_attempt_with_no_failure_reported_since() {
        assert!(answer(Decision::Proceed, 2, "").took_over());
        assert!(
            answer(
                Decision::Proceed,
                3,
                "the lease of attempt 2 of 10 ran out before it completed"
            )
            .took_over(),
            "reclaimed by the sweeper, then taken"
        );
        assert!(
            !answer(Decision::Proceed, 1, "").took_over(),
            "first attempt"
        );
        assert!(
            !answer(Decision::Proceed, 2, "payment gateway said 503").took_over(),
            "a retry after a reported failure"
        );
        assert!(!answer(Decision::InProgress, 2, "").took_over());
    }
}

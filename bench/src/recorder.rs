//! Calls and their answers as history entries ([`crate::history`]), and the
//! final read of a key straight from the database: how the benchmark and
//! the fault suite (`tests/faults`) write what their clients saw.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::history::{self, Call, CallKind, Entry, FinalRead, Micros};
use idempotency_coordinator::proto;

/// The wall clock, in microseconds since the Unix epoch.
pub fn now_us() -> Micros {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as Micros)
}

/// A status code by its canonical name.
pub fn code_name(code: tonic::Code) -> &'static str {
    use tonic::Code::*;
    match code {
        Ok => "OK",
        Cancelled => "CANCELLED",
        Unknown => "UNKNOWN",
        InvalidArgument => "INVALID_ARGUMENT",
        DeadlineExceeded => "DEADLINE_EXCEEDED",
        NotFound => "NOT_FOUND",
        AlreadyExists => "ALREADY_EXISTS",
        PermissionDenied => "PERMISSION_DENIED",
        ResourceExhausted => "RESOURCE_EXHAUSTED",
        FailedPrecondition => "FAILED_PRECONDITION",
        Aborted => "ABORTED",
        OutOfRange => "OUT_OF_RANGE",
        Unimplemented => "UNIMPLEMENTED",
        Internal => "INTERNAL",
        Unavailable => "UNAVAILABLE",
        DataLoss => "DATA_LOSS",
        Unauthenticated => "UNAUTHENTICATED",
    }
}

/// The code a call that never answered is recorded with.
pub const NO_ANSWER: &str = "NO_ANSWER";

fn micros(ts: Option<&prost_types::Timestamp>) -> Option<Micros> {
    ts.map(|t| t.seconds * 1_000_000 + Micros::from(t.nanos) / 1000)
}

fn status(s: i32) -> history::Status {
    match proto::Status::try_from(s) {
        Ok(proto::Status::Succeeded) => history::Status::Succeeded,
        Ok(proto::Status::Failed) => history::Status::Failed,
        Ok(proto::Status::FailedPermanent) => history::Status::FailedPermanent,
        _ => history::Status::Processing,
    }
}

fn decision(d: i32) -> Option<history::Decision> {
    use history::Decision as D;
    Some(match proto::Decision::try_from(d).ok()? {
        proto::Decision::Proceed => D::Proceed,
        proto::Decision::AlreadyDone => D::AlreadyDone,
        proto::Decision::InProgress => D::InProgress,
        proto::Decision::RetryLater => D::RetryLater,
        proto::Decision::Conflict => D::Conflict,
        proto::Decision::Exhausted => D::Exhausted,
        proto::Decision::Unspecified => return None,
    })
}

/// A record as an answer carried it.
pub fn record(r: &proto::Record) -> history::Record {
    history::Record {
        status: status(r.status),
        fencing_token: r.fencing_token,
        attempt_count: r.attempt_count,
        result: r.result.as_ref().map(|s| s.result.clone()),
        created_at_us: micros(r.created_at.as_ref()).unwrap_or_default(),
        updated_at_us: micros(r.updated_at.as_ref()).unwrap_or_default(),
        expires_at_us: micros(r.expires_at.as_ref()).unwrap_or_default(),
        lease_expires_at_us: micros(r.lease_expires_at.as_ref()),
    }
}

/// How a call ended: an answer, a status, or nothing before the client
/// gave up.
pub type Answer<'a, T> = Option<Result<&'a T, &'a tonic::Status>>;

/// When a call ran and with what deadline.
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    /// When the client sent the call (wall clock).
    pub start_us: Micros,
    /// When the client had the answer, or gave up on it (wall clock).
    pub end_us: Micros,
    /// The deadline the call was sent with; `None`: none.
    pub deadline: Option<Duration>,
}

fn base<T>(kind: CallKind, scope: &str, key: &str, t: Timing, answer: &Answer<'_, T>) -> Call {
    let mut call = Call {
        kind,
        server: String::new(),
        scope: scope.into(),
        key: key.into(),
        request_id: String::new(),
        start_us: t.start_us,
        end_us: t.end_us,
        deadline_ms: t.deadline.map(|d| d.as_millis() as u64),
        wait_ms: None,
        code: NO_ANSWER.into(),
        reason: String::new(),
        retry_info: false,
        sent: None,
        decision: None,
        lease: None,
        record: None,
    };
    match answer {
        Some(Ok(_)) => call.code = "OK".into(),
        Some(Err(status)) => {
            use tonic_types::StatusExt;
            let details = status.get_error_details();
            call.code = code_name(status.code()).into();
            call.reason = details
                .error_info()
                .map(|i| i.reason.clone())
                .unwrap_or_default();
            call.retry_info = details.retry_info().is_some();
        }
        None => {}
    }
    call
}

pub fn acquire(
    req: &proto::AcquireRequest,
    t: Timing,
    answer: Answer<'_, proto::AcquireResponse>,
) -> Call {
    let mut call = base(CallKind::Acquire, &req.scope, &req.key, t, &answer);
    call.request_id = req.request_id.clone();
    call.wait_ms = req
        .wait
        .as_ref()
        .map(|w| (w.seconds * 1000 + i64::from(w.nanos) / 1_000_000) as u64);
    if let Some(Ok(resp)) = answer {
        call.decision = decision(resp.decision);
        call.lease = resp.lease.as_ref().map(|l| history::Lease {
            token: l.token.clone(),
            fencing_token: l.fencing_token,
            attempt: l.attempt,
            expires_at_us: micros(l.expires_at.as_ref()).unwrap_or_default(),
        });
        call.record = resp.record.as_ref().map(record);
    }
    call
}

pub fn complete(
    req: &proto::CompleteRequest,
    t: Timing,
    answer: Answer<'_, proto::CompleteResponse>,
) -> Call {
    use proto::complete_request::Outcome;
    let mut call = base(CallKind::Complete, &req.scope, &req.key, t, &answer);
    let (outcome, result) = match &req.outcome {
        Some(Outcome::Success(s)) => (history::Outcome::Success, Some(s.result.clone())),
        Some(Outcome::Failure(_)) => (history::Outcome::Failure, None),
        _ => (history::Outcome::Release, None),
    };
    call.sent = Some(history::Sent {
        lease_token: req.lease_token.clone(),
        outcome,
        result,
    });
    if let Some(Ok(resp)) = answer {
        call.record = resp.record.as_ref().map(record);
    }
    call
}

pub fn get(req: &proto::GetRequest, t: Timing, answer: Answer<'_, proto::GetResponse>) -> Call {
    let mut call = base(CallKind::Get, &req.scope, &req.key, t, &answer);
    if let Some(Ok(resp)) = answer {
        call.record = resp.record.as_ref().map(record);
    }
    call
}

fn micros_of(t: chrono::DateTime<chrono::Utc>) -> Micros {
    t.timestamp_micros()
}

/// (scope, key) of `tenant` as the database holds it now, read through
/// `idempotency_get` (so an expired record reads as none), with the
/// database's clock.
pub async fn final_read(
    db: &tokio_postgres::Client,
    tenant: &str,
    scope: &str,
    key: &str,
) -> Result<Entry, tokio_postgres::Error> {
    let row = db
        .query_one(
            "SELECT clock_timestamp(), k.status, k.fencing_token, k.attempt_count, k.result,
                    k.created_at, k.updated_at, k.expires_at, k.lease_expires_at
               FROM (SELECT 1) one
               LEFT JOIN idempotency_get($1, $2, $3, 0) k ON true",
            &[&tenant, &scope, &key],
        )
        .await?;
    let read_at: chrono::DateTime<chrono::Utc> = row.get(0);
    let record = row
        .get::<_, Option<String>>(1)
        .map(|status| history::Record {
            status: match status.as_str() {
                "SUCCEEDED" => history::Status::Succeeded,
                "FAILED" => history::Status::Failed,
                "FAILED_PERMANENT" => history::Status::FailedPermanent,
                _ => history::Status::Processing,
            },
            fencing_token: row.get::<_, i64>(2) as u64,
            attempt_count: row.get::<_, i32>(3) as u32,
            result: row.get(4),
            created_at_us: micros_of(row.get(5)),
            updated_at_us: micros_of(row.get(6)),
            expires_at_us: micros_of(row.get(7)),
            lease_expires_at_us: row
                .get::<_, Option<chrono::DateTime<chrono::Utc>>>(8)
                .map(micros_of),
        });
    Ok(Entry::Final(FinalRead {
        scope: scope.into(),
        key: key.into(),
        read_at_us: micros_of(read_at),
        record,
    }))
}

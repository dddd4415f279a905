//! Domain answers into responses.

use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::domain::{Acquired, Decision, Lease, Record, RecordLine, Status, StoredResult, Summary};
use crate::proto;

fn timestamp(t: DateTime<Utc>) -> prost_types::Timestamp {
    prost_types::Timestamp {
        seconds: t.timestamp(),
        nanos: i32::try_from(t.timestamp_subsec_nanos()).unwrap_or(0),
    }
}

fn duration(d: Duration) -> prost_types::Duration {
    prost_types::Duration {
        seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        nanos: i32::try_from(d.subsec_nanos()).unwrap_or(0),
    }
}

fn status(s: Status) -> proto::Status {
    match s {
        Status::Processing => proto::Status::Processing,
        Status::Succeeded => proto::Status::Succeeded,
        Status::Failed => proto::Status::Failed,
        Status::FailedPermanent => proto::Status::FailedPermanent,
    }
}

fn decision(d: Decision) -> proto::Decision {
    match d {
        Decision::Proceed => proto::Decision::Proceed,
        Decision::AlreadyDone => proto::Decision::AlreadyDone,
        Decision::InProgress => proto::Decision::InProgress,
        Decision::RetryLater => proto::Decision::RetryLater,
        Decision::Conflict => proto::Decision::Conflict,
        Decision::Exhausted => proto::Decision::Exhausted,
    }
}

fn success(r: StoredResult) -> proto::Success {
    proto::Success {
        result: r.result,
        content_type: r.content_type,
        status_code: r.status_code,
        result_ref: r.result_ref,
    }
}

pub fn lease(l: &Lease) -> proto::Lease {
    proto::Lease {
        token: l.token.to_string(),
        attempt: l.attempt,
        expires_at: l.expires_at.map(timestamp),
        fencing_token: l.fencing_token,
    }
}

pub fn record(r: Record) -> proto::Record {
    proto::Record {
        scope: r.scope,
        key: r.key,
        status: status(r.status).into(),
        fingerprint: r.fingerprint.as_str().to_owned(),
        attempt_count: r.attempt_count,
        max_attempts: r.max_attempts,
        lease_expires_at: r.lease_expires_at.map(timestamp),
        next_retry_at: r.next_retry_at.map(timestamp),
        last_error: r.last_error,
        last_error_at: r.last_error_at.map(timestamp),
        result: r.result.map(success),
        checkpoint: r.checkpoint,
        fencing_token: r.fencing_token,
        created_at: Some(timestamp(r.created_at)),
        updated_at: Some(timestamp(r.updated_at)),
        completed_at: r.completed_at.map(timestamp),
        expires_at: Some(timestamp(r.expires_at)),
        lease_request_id: r.lease_request_id,
        admin_action: r.admin.map(|a| proto::AdminAction {
            action: a.action,
            actor: a.actor,
            reason: a.reason,
            at: Some(timestamp(a.at)),
        }),
    }
}

pub fn acquired(a: Acquired) -> proto::AcquireResponse {
    proto::AcquireResponse {
        decision: decision(a.decision).into(),
        lease: a.lease().map(lease),
        retry_after: a.retry_after.map(duration),
        record: Some(record(a.record)),
    }
}

pub fn record_line(l: RecordLine) -> proto::RecordSummary {
    proto::RecordSummary {
        key: l.key,
        status: status(l.status).into(),
        attempt_count: l.attempt_count,
        max_attempts: l.max_attempts,
        lease_expires_at: l.lease_expires_at.map(timestamp),
        next_retry_at: l.next_retry_at.map(timestamp),
        updated_at: Some(timestamp(l.updated_at)),
    }
}

pub fn summary(s: Summary) -> proto::SummarizeResponse {
    proto::SummarizeResponse {
        scopes: s
            .scopes
            .into_iter()
            .map(|c| proto::ScopeSummary {
                scope: c.scope,
                processing: c.processing,
                leases_expired: c.leases_expired,
                failed: c.failed,
                retries_due: c.retries_due,
                failed_permanent: c.failed_permanent,
                records: c.records,
                records_capped: c.records_capped,
            })
            .collect(),
        estimated_table_records: 0,
        next_page_token: s.next_after.unwrap_or_default(),
    }
}

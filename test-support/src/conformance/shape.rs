//! Answers and records in the form the matrices compare them in: whole, but
//! for what legitimately differs from one path to another.

use std::cmp::Ordering;

use chrono::{DateTime, Utc};
use idempotency_coordinator::proto;
use tokio_postgres::Row;

use super::name;

/// A record as the matrices compare it: every field of `proto::Record`,
/// those that legitimately differ between paths in a form that does not.
///
/// - `key` is left out: all paths share one database, so each path runs on
///   a key of its own.
/// - `fencing_token` is drawn from one sequence that the leases of every
///   record share, so its value depends on how many leases other paths drew
///   first: it is kept as how it compares with the token of the lease the
///   sequence started from (the same, or grown).
/// - The times depend on when each path ran: each is kept as its offset
///   from `updated_at`, which is exact (one statement writes a record's
///   times from one reading of the clock), and `created_at`, which an
///   earlier statement may have written, as whether it is before or at
///   `updated_at`.
#[derive(Debug, PartialEq)]
pub(super) struct Shape {
    scope: String,
    pub(super) status: String,
    fingerprint: String,
    attempt_count: u32,
    max_attempts: u32,
    last_error: String,
    result: Option<proto::Success>,
    checkpoint: Vec<u8>,
    fencing: Ordering,
    created: Ordering,
    /// Offsets from `updated_at`, in microseconds.
    lease_expires_at: Option<i64>,
    next_retry_at: Option<i64>,
    last_error_at: Option<i64>,
    completed_at: Option<i64>,
    expires_at: Option<i64>,
}

fn micros(at: &prost_types::Timestamp) -> i64 {
    at.seconds * 1_000_000 + i64::from(at.nanos) / 1000
}

impl Shape {
    /// `record`, its fencing token compared with `fencing_base`.
    pub(super) fn of(record: &proto::Record, fencing_base: u64) -> Shape {
        let updated = micros(record.updated_at.as_ref().expect("updated_at"));
        let offset =
            |at: &Option<prost_types::Timestamp>| at.as_ref().map(|at| micros(at) - updated);
        let created = micros(record.created_at.as_ref().expect("created_at"));
        Shape {
            scope: record.scope.clone(),
            status: status_name(record.status),
            fingerprint: record.fingerprint.clone(),
            attempt_count: record.attempt_count,
            max_attempts: record.max_attempts,
            last_error: record.last_error.clone(),
            result: record.result.clone(),
            checkpoint: record.checkpoint.clone(),
            fencing: record.fencing_token.cmp(&fencing_base),
            created: created.cmp(&updated),
            lease_expires_at: offset(&record.lease_expires_at),
            next_retry_at: offset(&record.next_retry_at),
            last_error_at: offset(&record.last_error_at),
            completed_at: offset(&record.completed_at),
            expires_at: offset(&record.expires_at),
        }
    }

    /// The record in `row` (the columns of `idempotency_keys`), as the
    /// server would send it; its fencing token compared with its own, the
    /// lease's.
    fn of_row(row: &Row) -> Shape {
        let at = |column: &str| row.get::<_, Option<DateTime<Utc>>>(column);
        let updated = at("updated_at").expect("updated_at").timestamp_micros();
        let offset = |column: &str| at(column).map(|at| at.timestamp_micros() - updated);
        let created = at("created_at").expect("created_at").timestamp_micros();
        let count = |column: &str| u32::try_from(row.get::<_, i32>(column)).unwrap();
        let status: String = row.get("status");
        let result = (status == "SUCCEEDED").then(|| proto::Success {
            result: row.get::<_, Option<Vec<u8>>>("result").unwrap_or_default(),
            content_type: row.get("result_content_type"),
            status_code: row.get("result_status_code"),
            result_ref: row.get("result_ref"),
        });
        Shape {
            scope: row.get("scope"),
            status,
            fingerprint: row.get("fingerprint"),
            attempt_count: count("attempt_count"),
            max_attempts: count("max_attempts"),
            last_error: row.get("last_error"),
            result,
            checkpoint: row.get("checkpoint"),
            fencing: Ordering::Equal,
            created: created.cmp(&updated),
            lease_expires_at: offset("lease_expires_at"),
            next_retry_at: offset("next_retry_at"),
            last_error_at: offset("last_error_at"),
            completed_at: offset("completed_at"),
            expires_at: offset("expires_at"),
        }
    }
}

fn status_name(status: i32) -> String {
    proto::Status::try_from(status)
        .expect("a known status")
        .as_str_name()
        .trim_start_matches("STATUS_")
        .to_owned()
}

/// A granted lease as the matrices compare it: its token is random, so only
/// whether there is one; its expiry as an offset from the record's
/// `updated_at`, and its fencing token as how it compares with the
/// record's.
#[derive(Debug, PartialEq)]
struct LeaseShape {
    has_token: bool,
    attempt: u32,
    expires_at: Option<i64>,
    fencing: Ordering,
}

/// An Acquire's answer as the matrices compare it.
#[derive(Debug, PartialEq)]
pub(super) struct Answer {
    pub(super) decision: String,
    retry_after_ms: Option<i64>,
    lease: Option<LeaseShape>,
    pub(super) record: Option<Shape>,
}

impl Answer {
    /// A server's answer; the record's fencing token compared with the
    /// lease's when it grants one (else with its own).
    pub(super) fn of(response: &proto::AcquireResponse) -> Answer {
        let record = response.record.as_ref();
        let updated = record.and_then(|r| r.updated_at.as_ref()).map(micros);
        let base = response.lease.as_ref().map_or_else(
            || record.map_or(0, |r| r.fencing_token),
            |l| l.fencing_token,
        );
        Answer {
            decision: name(response.decision),
            retry_after_ms: response
                .retry_after
                .map(|d| d.seconds * 1000 + i64::from(d.nanos) / 1_000_000),
            lease: response.lease.as_ref().map(|lease| LeaseShape {
                has_token: !lease.token.is_empty(),
                attempt: lease.attempt,
                expires_at: lease
                    .expires_at
                    .as_ref()
                    .zip(updated)
                    .map(|(at, updated)| micros(at) - updated),
                fencing: lease
                    .fencing_token
                    .cmp(&record.map_or(0, |r| r.fencing_token)),
            }),
            record: record.map(|r| Shape::of(r, base)),
        }
    }

    /// What an Acquire in SQL returned, in a row of its `decision`,
    /// `retry_after_ms` and the columns of its record. PROCEED grants the
    /// lease the record holds.
    pub(super) fn of_row(row: &Row) -> Answer {
        let decision: String = row.get("decision");
        let record = Shape::of_row(row);
        let lease = (decision == "PROCEED").then(|| LeaseShape {
            has_token: row.get::<_, Option<uuid::Uuid>>("lease_token").is_some(),
            attempt: record.attempt_count,
            expires_at: record.lease_expires_at,
            fencing: Ordering::Equal,
        });
        Answer {
            decision,
            retry_after_ms: row.get("retry_after_ms"),
            lease,
            record: Some(record),
        }
    }
}

/// SQL selecting, from the rows of `calls` (a set-returning call aliased
/// `a` with `decision`, `retry_after_ms` and the record `rec`), the answer
/// and every column of its record, and the whole row as text in the same
/// form as [`Shape`] keeps it (`internals`, which holds the columns the
/// server does not send as well).
pub(super) fn answer_and_row(calls: &str) -> String {
    const AS_SHAPE: &str = "ARRAY['lease_token', 'fencing_token', 'created_at', 'updated_at',
        'lease_expires_at', 'next_retry_at', 'last_error_at', 'completed_at', 'expires_at']";
    format!(
        "SELECT a.decision, a.retry_after_ms, r.*,
                (to_jsonb(a.rec) - {AS_SHAPE}::text[] || jsonb_build_object(
                    'created_at', sign(extract(epoch FROM r.created_at - r.updated_at)),
                    'lease_expires_at', r.lease_expires_at - r.updated_at,
                    'next_retry_at', r.next_retry_at - r.updated_at,
                    'last_error_at', r.last_error_at - r.updated_at,
                    'completed_at', r.completed_at - r.updated_at,
                    'expires_at', r.expires_at - r.updated_at))::text AS internals
           FROM {calls}, LATERAL (SELECT (a.rec).*) r"
    )
}

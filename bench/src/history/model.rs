//! What a history holds: calls and their answers, and final reads, as the
//! clients saw them.

use serde::{Deserialize, Serialize};

// The decision of an OK Acquire is the domain's, written by its name.
pub use idempotency_coordinator::domain::Decision;

/// Microseconds since the Unix epoch.
pub type Micros = i64;

/// One line of a history.
// Nearly every entry is a call: boxing calls would cost an allocation each
// and save no memory.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Entry {
    /// A call and its answer.
    Call(Call),
    /// A key as the final read found it.
    Final(FinalRead),
}

/// The calls a history records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CallKind {
    Acquire,
    Complete,
    Get,
}

/// One call: what was asked, when, and what came back.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Call {
    /// Which call it was.
    pub kind: CallKind,
    /// The server the call went to, when the history has several.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub server: String,
    /// The scope the call named.
    pub scope: String,
    /// The idempotency key the call named.
    pub key: String,
    /// The Acquire's request_id ('' for none).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub request_id: String,
    /// Wall-clock start and end of the call, as the client saw them.
    pub start_us: Micros,
    /// When the client had the answer, or gave up on it.
    pub end_us: Micros,
    /// The deadline the client sent (grpc-timeout).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline_ms: Option<u64>,
    /// An Acquire's wait window.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait_ms: Option<u64>,
    /// The gRPC status code by its canonical name ("OK", "UNAVAILABLE", …),
    /// or "NO_ANSWER" when the client gave up on a call that never answered.
    pub code: String,
    /// The ErrorInfo reason of a failed call.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
    /// Whether a failed call carried RetryInfo.
    #[serde(default, skip_serializing_if = "is_false")]
    pub retry_info: bool,
    /// A Complete: what was sent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sent: Option<Sent>,
    /// An OK Acquire: the decision, by its name in the contract.
    #[serde(
        default,
        with = "super::format::decision_name",
        skip_serializing_if = "Option::is_none"
    )]
    pub decision: Option<Decision>,
    /// An OK PROCEED: the lease.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease: Option<Lease>,
    /// An OK answer: the record it carried.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub record: Option<Record>,
}

fn is_false(b: &bool) -> bool {
    !*b
}

impl Call {
    /// Whether the call answered OK.
    pub fn ok(&self) -> bool {
        self.code == "OK"
    }

    /// Whether the call failed in a way that says it took no effect: the
    /// server refused it (bad argument, lost lease, not found, no room) or
    /// answered it with a final word. Anything else that is not OK (a
    /// deadline, an unavailable database, no answer) may have taken effect.
    pub fn refused(&self) -> bool {
        matches!(
            self.code.as_str(),
            "INVALID_ARGUMENT"
                | "NOT_FOUND"
                | "ABORTED"
                | "FAILED_PRECONDITION"
                | "PERMISSION_DENIED"
                | "UNAUTHENTICATED"
                | "RESOURCE_EXHAUSTED"
        )
    }

    /// Wall-clock duration of the call.
    pub fn took_us(&self) -> Micros {
        self.end_us - self.start_us
    }
}

/// A Complete's request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sent {
    /// The lease token the Complete presented.
    pub lease_token: String,
    /// Which outcome the Complete reported.
    pub outcome: Outcome,
    /// The success's result bytes.
    #[serde(
        default,
        with = "super::format::hex_bytes",
        skip_serializing_if = "Option::is_none"
    )]
    pub result: Option<Vec<u8>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Outcome {
    Success,
    Failure,
    Release,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Status {
    Processing,
    Succeeded,
    Failed,
    FailedPermanent,
}

/// A lease as PROCEED granted it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    /// The lease's token, as the answer spelled it.
    pub token: String,
    /// The lease's fencing token: it must grow with every grant on the key.
    pub fencing_token: u64,
    /// Which attempt the lease is, from 1.
    pub attempt: u32,
    /// When the lease runs out (database clock).
    pub expires_at_us: Micros,
}

/// A record as an answer or the final read showed it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// The record's status.
    pub status: Status,
    /// The fencing token of the record's latest lease.
    pub fencing_token: u64,
    /// Leases granted so far, less released ones.
    pub attempt_count: u32,
    /// When SUCCEEDED: the stored result.
    #[serde(
        default,
        with = "super::format::hex_bytes",
        skip_serializing_if = "Option::is_none"
    )]
    pub result: Option<Vec<u8>>,
    /// When the record was created (database clock): with the key, it names
    /// one record.
    pub created_at_us: Micros,
    /// When the record last changed (database clock); on PROCEED, when the
    /// lease was granted.
    pub updated_at_us: Micros,
    /// When the record is deleted (database clock).
    pub expires_at_us: Micros,
    /// When the current lease runs out (database clock); `None` unless
    /// PROCESSING.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_expires_at_us: Option<Micros>,
}

/// One key after the load: its record, or none, and when it was read
/// (database clock).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FinalRead {
    /// The scope of the key read.
    pub scope: String,
    /// The idempotency key read.
    pub key: String,
    /// When the key was read (database clock).
    pub read_at_us: Micros,
    /// The record as it stood; `None` when there was none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub record: Option<Record>,
}

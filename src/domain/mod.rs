//! The coordinator's vocabulary: validated inputs, the policy that bounds
//! them, and the records and decisions the store hands back. No I/O here and
//! nothing of gRPC or PostgreSQL, so the rules can be tested on their own.

mod admin;
mod input;
mod policy;
mod record;

pub use admin::{
    AdminAction, AdminCommand, ListQuery, MAX_OPERATOR_CHARS, RecordLine, ScopeCounts, Summary,
    SummaryQuery, operator_name,
};
pub use input::{
    ErrorText, Fingerprint, InvalidInput, JsonValues, Key, LeaseToken, MAX_ERROR_CHARS, RequestId,
    Scope, Tenant, json_values_at_least,
};
pub use policy::{Backoff, Policy, TooManyWaiters, WaiterLimits};
pub use record::{
    AcquireCommand, Acquired, AdminNote, CompleteCommand, Decision, DueReason, DueRecord,
    ExtendCommand, Lease, Outcome, Record, RecordId, Refusal, Status, StoredResult, SweepCounts,
};

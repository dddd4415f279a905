//! The coordinator's vocabulary: validated inputs, the policy that bounds
//! them, and the records and decisions the store hands back. No I/O here and
//! nothing of gRPC or PostgreSQL, so the rules can be tested on their own.

mod input;
mod policy;
mod record;

pub use input::{
    ErrorText, Fingerprint, InvalidInput, JsonValues, Key, LeaseToken, MAX_ERROR_CHARS, RequestId,
    Scope, Tenant, json_values_at_least,
};
pub use policy::{Backoff, Policy, TooManyWaiters, WaiterLimits};
pub use record::{
    AcquireCommand, Acquired, CompleteCommand, Decision, DueReason, DueRecord, ExtendCommand,
    Lease, Outcome, Record, RecordId, Refusal, Status, StoredResult, SweepCounts,
};

//! What administrators ask of records (the admin RPCs and the operator
//! console): the actions, the pages of a scope's keys, and a tenant's
//! counts per scope.

use chrono::{DateTime, Utc};

use super::{InvalidInput, Key, RecordId, Scope, Status, Tenant};

/// The longest operator's name recorded.
pub const MAX_OPERATOR_CHARS: usize = 128;

/// Characters an operator's name may hold besides letters and digits.
const OPERATOR_PUNCTUATION: &[char] = &[' ', '.', '-', '_', '\'', '@'];

/// Checks an operator's name, which is recorded after the credential in
/// the actor (`credential sha256:…, operator <name>`): letters, digits,
/// single spaces and `. - _ ' @`, at most [`MAX_OPERATOR_CHARS`]. Without
/// `,` or `:` a name cannot read as another credential or a second
/// operator, and without control characters it cannot break a log line.
pub fn operator_name(name: &str) -> Result<(), InvalidInput> {
    let chars = name.chars().count();
    if chars > MAX_OPERATOR_CHARS {
        return Err(InvalidInput(format!(
            "must be at most {MAX_OPERATOR_CHARS} characters, got {chars}"
        )));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !c.is_alphanumeric() && !OPERATOR_PUNCTUATION.contains(c))
    {
        return Err(InvalidInput(format!(
            "may hold letters, digits, spaces and . - _ ' @ only, not {:?}",
            c
        )));
    }
    if name.starts_with(' ') || name.ends_with(' ') || name.contains("  ") {
        return Err(InvalidInput(
            "must not begin or end with a space, nor hold two in a row".to_owned(),
        ));
    }
    Ok(())
}

/// An administrator's action on one record (`idempotency_admin_act`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdminAction {
    /// Take the lease from its holder; the record becomes FAILED, due now.
    ReleaseLease,
    /// A FAILED record's retry becomes due now.
    RetryNow,
    /// The record becomes FAILED_PERMANENT with the reason as its error.
    FailPermanently,
}

impl AdminAction {
    /// The action's name, as `sql/functions/admin.sql` takes it and the
    /// record keeps it.
    pub fn name(self) -> &'static str {
        match self {
            AdminAction::ReleaseLease => "RELEASE_LEASE",
            AdminAction::RetryNow => "RETRY_NOW",
            AdminAction::FailPermanently => "FAIL_PERMANENTLY",
        }
    }
}

/// A validated administrator's request about one record.
#[derive(Debug, Clone)]
pub struct AdminCommand {
    /// The record: the administrator's own tenant, the scope and key asked.
    pub id: RecordId,
    /// Who asks: the credential, and the operator's own name if given.
    pub actor: String,
    /// Why; recorded on the record.
    pub reason: String,
}

/// A page of a scope's keys.
#[derive(Debug, Clone)]
pub struct ListQuery {
    /// Whose records: the administrator's tenant.
    pub tenant: Tenant,
    /// The scope listed.
    pub scope: Scope,
    /// Only keys that begin with this; empty: all.
    pub prefix: String,
    /// Keys after this one; `None`: from the first.
    pub after: Option<Key>,
    /// Only records of this status; `None`: any.
    pub status: Option<Status>,
    /// At most this many.
    pub limit: u32,
}

/// A record as a list shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordLine {
    /// The idempotency key.
    pub key: String,
    /// Where the record stands.
    pub status: Status,
    /// Attempts made so far.
    pub attempt_count: u32,
    /// Attempts allowed.
    pub max_attempts: u32,
    /// While PROCESSING: when the lease runs out.
    pub lease_expires_at: Option<DateTime<Utc>>,
    /// While FAILED: when the retry is due.
    pub next_retry_at: Option<DateTime<Utc>>,
    /// When the record last changed.
    pub updated_at: DateTime<Utc>,
}

/// One scope's counts (`idempotency_admin_summary` says how each is read).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ScopeCounts {
    /// The scope.
    pub scope: String,
    /// PROCESSING records.
    pub processing: u64,
    /// PROCESSING records whose lease has run out.
    pub leases_expired: u64,
    /// FAILED records.
    pub failed: u64,
    /// FAILED records whose retry is due.
    pub retries_due: u64,
    /// FAILED_PERMANENT records.
    pub failed_permanent: u64,
    /// All records, up to the cap.
    pub records: u64,
    /// More than `records`.
    pub records_capped: bool,
}

impl ScopeCounts {
    /// SUCCEEDED records: what the other counts leave of `records` (a lower
    /// bound when `records_capped`).
    pub fn succeeded(&self) -> u64 {
        self.records
            .saturating_sub(self.processing + self.failed + self.failed_permanent)
    }
}

/// A page of a tenant's scopes to count.
#[derive(Debug, Clone)]
pub struct SummaryQuery {
    /// Whose records: the administrator's tenant.
    pub tenant: Tenant,
    /// Scopes after this one; `None`: from the first.
    pub after: Option<Scope>,
    /// At most this many scopes.
    pub limit: u32,
}

/// A page of a tenant's counts per scope.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Summary {
    /// The tenant's scopes, in order.
    pub scopes: Vec<ScopeCounts>,
    /// The scope to pass for the next page; `None` on the last.
    pub next_after: Option<String>,
}

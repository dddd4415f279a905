//! Rows of `idempotency_keys` (as the SQL functions return them) into
//! records.

use tokio_postgres::Row;

use super::{StoreError, names};
use crate::domain::{
    AdminNote, DueReason, DueRecord, Fingerprint, Lease, LeaseToken, Record, Status, StoredResult,
    Tenant,
};

/// Declares [`Columns`]: the columns a record is read from, by name.
macro_rules! columns {
    ($($name:ident),* $(,)?) => {
        /// Where each column a record is read from sits in a row, found in
        /// one pass over the row's columns. Reading a column by name would
        /// search the row's 30-odd columns again for each of the 26 read,
        /// once per call answered. Every statement whose rows become
        /// records returns the whole `idempotency_keys` row, so a row
        /// without one of these columns is corrupt, whether or not its
        /// record would have read that column.
        struct Columns {
            $($name: usize,)*
        }

        impl Columns {
            fn of(row: &Row) -> Result<Self, StoreError> {
                $(let mut $name = None;)*
                for (at, column) in row.columns().iter().enumerate() {
                    // The first column of a name, as a read by name takes.
                    match column.name() {
                        $(stringify!($name) => {
                            $name.get_or_insert(at);
                        })*
                        _ => {}
                    }
                }
                Ok(Columns {
                    $($name: $name.ok_or_else(|| {
                        StoreError::Corrupt(format!("the row has no column {}", stringify!($name)))
                    })?,)*
                })
            }
        }
    };
}

columns!(
    scope,
    idempotency_key,
    status,
    fingerprint,
    attempt_count,
    max_attempts,
    lease_token,
    lease_request_id,
    lease_expires_at,
    fencing_token,
    next_retry_at,
    last_error,
    last_error_at,
    checkpoint,
    result,
    result_content_type,
    result_status_code,
    result_ref,
    created_at,
    updated_at,
    completed_at,
    expires_at,
    admin_action,
    admin_actor,
    admin_reason,
    admin_at,
);

fn count(row: &Row, at: usize, column: &str) -> Result<u32, StoreError> {
    let value: i32 = row.try_get(at)?;
    u32::try_from(value).map_err(|_| StoreError::Corrupt(format!("{column} is negative")))
}

pub(super) fn record(row: &Row) -> Result<Record, StoreError> {
    let at = Columns::of(row)?;
    let status: &str = row.try_get(at.status)?;
    let status = names::status(status)
        .ok_or_else(|| StoreError::Corrupt(format!("unknown status {status:?}")))?;
    let fencing_token: i64 = row.try_get(at.fencing_token)?;
    let fencing_token = u64::try_from(fencing_token)
        .map_err(|_| StoreError::Corrupt("fencing_token is negative".into()))?;
    let attempt_count = count(row, at.attempt_count, "attempt_count")?;
    let lease_expires_at = row.try_get(at.lease_expires_at)?;
    let result = match status {
        Status::Succeeded => Some(StoredResult {
            result: row
                .try_get::<_, Option<Vec<u8>>>(at.result)?
                .unwrap_or_default(),
            content_type: row.try_get(at.result_content_type)?,
            status_code: row.try_get(at.result_status_code)?,
            result_ref: row.try_get(at.result_ref)?,
        }),
        _ => None,
    };
    Ok(Record {
        scope: row.try_get(at.scope)?,
        key: row.try_get(at.idempotency_key)?,
        status,
        fingerprint: Fingerprint::stored(row.try_get(at.fingerprint)?),
        attempt_count,
        max_attempts: count(row, at.max_attempts, "max_attempts")?,
        lease_expires_at,
        next_retry_at: row.try_get(at.next_retry_at)?,
        last_error: row.try_get(at.last_error)?,
        last_error_at: row.try_get(at.last_error_at)?,
        result,
        checkpoint: row.try_get(at.checkpoint)?,
        fencing_token,
        created_at: row.try_get(at.created_at)?,
        updated_at: row.try_get(at.updated_at)?,
        completed_at: row.try_get(at.completed_at)?,
        expires_at: row.try_get(at.expires_at)?,
        lease: Lease {
            token: LeaseToken::from_uuid(row.try_get(at.lease_token)?),
            attempt: attempt_count,
            expires_at: lease_expires_at,
            fencing_token,
        },
        lease_request_id: row.try_get(at.lease_request_id)?,
        admin: admin_note(row, &at)?,
    })
}

/// The last administrator's action (`sql/migrations/0002_admin.sql`), when
/// the row has one.
fn admin_note(row: &Row, at: &Columns) -> Result<Option<AdminNote>, StoreError> {
    let Some(action) = row.try_get::<_, Option<String>>(at.admin_action)? else {
        return Ok(None);
    };
    Ok(Some(AdminNote {
        action,
        actor: row
            .try_get::<_, Option<String>>(at.admin_actor)?
            .unwrap_or_default(),
        reason: row
            .try_get::<_, Option<String>>(at.admin_reason)?
            .unwrap_or_default(),
        at: row
            .try_get::<_, Option<_>>(at.admin_at)?
            .ok_or_else(|| StoreError::Corrupt("admin_action without admin_at".into()))?,
    }))
}

/// A claimed due row: PROCESSING (lease run out) or FAILED that no holder
/// completed (reclaimed by the sweeper) means the holder died; any other
/// FAILED row failed and its retry came due.
pub(super) fn due_record(row: &Row) -> Result<DueRecord, StoreError> {
    let record = record(row)?;
    let holder_completed = row.try_get::<_, Option<&str>>("lease_outcome")?.is_some();
    let reason = match record.status {
        Status::Failed if holder_completed => DueReason::RetryDue,
        _ => DueReason::LeaseExpired,
    };
    Ok(DueRecord {
        tenant: Tenant::new(row.try_get::<_, String>("tenant")?),
        record,
        reason,
    })
}

//! The administrators' calls, one method per function of
//! `sql/functions/admin.sql`: act on a record, delete it, list a scope's
//! keys, summarise a tenant. Actions and deletes run like the other
//! single-key calls (on the shared connections, within the caller's
//! deadline); lists and summaries, which read many rows, on pooled
//! connections.

use tokio_postgres::Row;

use super::{CallTime, Store, StoreError, names, row};
use crate::domain::{
    AdminAction, AdminCommand, ListQuery, Record, RecordId, RecordLine, ScopeCounts, Status,
    Summary, SummaryQuery,
};

const ACT: &str = "SELECT a.outcome, a.rec, idempotency_in_time($8, $7) AS in_time \
     FROM idempotency_admin_act($1, $2, $3, $4, $5, $6, $7) a";
const DELETE: &str = "SELECT d.*, idempotency_in_time($5, $4) AS in_time \
     FROM idempotency_admin_delete($1, $2, $3, $4) d";
const LIST: &str = "SELECT * FROM idempotency_admin_list($1, $2, $3, $4, $5, $6, $7)";
const SUMMARY: &str = "SELECT * FROM idempotency_admin_summary($1, $2, $3, $4, $5)";

/// How many records of a scope the summary counts before it says "more".
pub const SUMMARY_CAP: i32 = 1_000;

impl Store {
    /// Runs `idempotency_admin_act`: the record after the action, or the
    /// refusal (NOT_FOUND, WRONG_STATUS).
    pub async fn admin_act(
        &self,
        cmd: &AdminCommand,
        action: AdminAction,
        time: CallTime,
    ) -> Result<Record, StoreError> {
        let stamp = self.stamp(&time)?;
        let row = self
            .query_one(
                cmd.id.key.as_str(),
                ACT,
                &[
                    &cmd.id.tenant.as_str(),
                    &cmd.id.scope.as_str(),
                    &cmd.id.key.as_str(),
                    &action.name(),
                    &cmd.actor,
                    &cmd.reason,
                    &stamp.offset_ms,
                    &stamp.deadline,
                ],
                time,
            )
            .await?;
        self.record_unless_refused(row, time).await
    }

    /// Runs `idempotency_admin_delete`: the record as it was, or
    /// `Refused(NotFound)`.
    pub async fn admin_delete(&self, id: &RecordId, time: CallTime) -> Result<Record, StoreError> {
        let row = self.query_by_id(DELETE, id, time).await?;
        // This replica stops replaying it at once; others within
        // `replays::MAX_AGE`, when they read it again.
        if let Some(replays) = &self.replays {
            replays.forget(id);
        }
        row::record(&row)
    }

    /// Runs `idempotency_admin_list`: one page of a scope's keys.
    pub async fn admin_list(
        &self,
        query: &ListQuery,
        time: CallTime,
    ) -> Result<Vec<RecordLine>, StoreError> {
        let stamp = self.stamp(&time)?;
        let limit = i32::try_from(query.limit).unwrap_or(i32::MAX);
        let rows = self
            .query(
                LIST,
                &[
                    &query.tenant.as_str(),
                    &query.scope.as_str(),
                    &query.prefix,
                    &query.after.as_ref().map_or("", |k| k.as_str()),
                    &query.status.map_or("", names::status_name),
                    &limit,
                    &stamp.offset_ms,
                ],
                time,
            )
            .await?;
        rows.iter().map(line).collect()
    }

    /// Runs `idempotency_admin_summary`: a page of the tenant's scopes.
    pub async fn admin_summary(
        &self,
        query: &SummaryQuery,
        time: CallTime,
    ) -> Result<Summary, StoreError> {
        let stamp = self.stamp(&time)?;
        let limit = i32::try_from(query.limit).unwrap_or(i32::MAX);
        let rows = self
            .query(
                SUMMARY,
                &[
                    &query.tenant.as_str(),
                    &query.after.as_ref().map_or("", |s| s.as_str()),
                    &limit,
                    &SUMMARY_CAP,
                    &stamp.offset_ms,
                ],
                time,
            )
            .await?;
        let mut summary = Summary::default();
        for row in &rows {
            summary.scopes.push(ScopeCounts {
                scope: row.try_get("scope")?,
                processing: count(row, "processing")?,
                leases_expired: count(row, "leases_expired")?,
                failed: count(row, "failed")?,
                retries_due: count(row, "retries_due")?,
                failed_permanent: count(row, "failed_permanent")?,
                records: count(row, "records")?,
                records_capped: row.try_get("records_capped")?,
            });
        }
        if summary.scopes.len() == query.limit as usize {
            summary.next_after = summary.scopes.last().map(|s| s.scope.clone());
        }
        Ok(summary)
    }
}

fn count(row: &Row, column: &str) -> Result<u64, StoreError> {
    let value: i64 = row.try_get(column)?;
    u64::try_from(value).map_err(|_| StoreError::Corrupt(format!("{column} is negative")))
}

fn small(row: &Row, column: &str) -> Result<u32, StoreError> {
    let value: i32 = row.try_get(column)?;
    u32::try_from(value).map_err(|_| StoreError::Corrupt(format!("{column} is negative")))
}

fn line(row: &Row) -> Result<RecordLine, StoreError> {
    let status: &str = row.try_get("status")?;
    let status: Status = names::status(status)
        .ok_or_else(|| StoreError::Corrupt(format!("unknown status {status:?}")))?;
    Ok(RecordLine {
        key: row.try_get("idempotency_key")?,
        status,
        attempt_count: small(row, "attempt_count")?,
        max_attempts: small(row, "max_attempts")?,
        lease_expires_at: row.try_get("lease_expires_at")?,
        next_retry_at: row.try_get("next_retry_at")?,
        updated_at: row.try_get("updated_at")?,
    })
}

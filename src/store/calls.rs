//! The two hot calls, Acquire and Complete, as owned arguments that either
//! run alone (`idempotency_acquire`, `idempotency_complete`) or ride in a
//! batch (`idempotency_acquire_batch`, `idempotency_complete_batch`). The
//! arguments are bound in one place for both forms.
//!
//! Every statement ends with `idempotency_in_time(deadline, offset)` in its
//! select list: evaluated with the function's rows (the function has run to
//! its end by then) and before the commit, it rolls the statement back if
//! it finishes after the coordinator stopped waiting for it
//! (`sql/functions/deadline.sql`). In a batch's statement it is a subquery
//! (`(SELECT idempotency_in_time(...))`), so that it runs once per
//! statement rather than once per row. A single call returns one row, so
//! there it is called directly: Citus delegates the statement whole to the
//! node holding the key with the check in it, which it cannot do for the
//! subquery (it sends that as a parameter the node does not have).
//!
//! On Citus a batch goes out per node as `idempotency_acquire_batch_at`
//! (`idempotency_complete_batch_at`, `sql/citus/batch_routes.sql`): the
//! same arguments after a routing key (`$1`), the deadline checked inside.

use tokio_postgres::Row;
use tokio_postgres::types::ToSql;

use super::batch::Call;
use super::clock::Stamp;
use super::mux::Shared;
use super::names;
use super::{StoreError, millis};
use crate::domain::{AcquireCommand, Backoff, CompleteCommand, Outcome};

/// `idempotency_acquire`, its ten arguments bound in `AcquireCall::params`'s
/// order, then the deadline (`$11`, a `timestamptz` or NULL).
pub const ACQUIRE: &str = "SELECT a.decision, a.retry_after_ms, (a.rec).*, \
     idempotency_in_time($11, $10) AS in_time \
     FROM idempotency_acquire($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) a";
const ACQUIRE_BATCH: &str = "SELECT b.ord, b.decision, b.retry_after_ms, (b.rec).*, \
     (SELECT idempotency_in_time($11, $10)) AS in_time \
     FROM idempotency_acquire_batch($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) b";
const ACQUIRE_BATCH_AT: &str = "SELECT b.ord, b.decision, b.retry_after_ms, (b.rec).* \
     FROM idempotency_acquire_batch_at($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12) b";
/// `idempotency_complete`, its fifteen arguments bound in
/// `CompleteCall::params`'s order, then the deadline (`$16`).
pub const COMPLETE: &str = "SELECT c.outcome, (c.rec).*, idempotency_in_time($16, $15) AS in_time \
     FROM idempotency_complete($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15) c";
const COMPLETE_BATCH: &str = "SELECT b.ord, b.outcome, (b.rec).*, (SELECT idempotency_in_time($16, $15)) AS in_time \
     FROM idempotency_complete_batch($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15) b";
const COMPLETE_BATCH_AT: &str = "SELECT b.ord, b.outcome, (b.rec).* \
     FROM idempotency_complete_batch_at($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, \
     $14, $15, $16, $17) b";

/// `idempotency_acquire`'s arguments but the clock offset.
pub(super) struct AcquireCall {
    tenant: String,
    scope: String,
    key: String,
    fingerprint: String,
    request_id: String,
    lease_ms: i64,
    max_attempts: i32,
    retention_ms: i64,
    watch_ms: i64,
}

impl AcquireCall {
    pub fn new(cmd: &AcquireCommand, watch: std::time::Duration) -> Result<Self, StoreError> {
        Ok(AcquireCall {
            tenant: cmd.id.tenant.as_str().to_owned(),
            scope: cmd.id.scope.as_str().to_owned(),
            key: cmd.id.key.as_str().to_owned(),
            fingerprint: cmd.fingerprint.as_str().to_owned(),
            request_id: cmd.request_id.as_str().to_owned(),
            lease_ms: millis(cmd.lease_ttl),
            max_attempts: i32::try_from(cmd.max_attempts)
                .map_err(|_| StoreError::Corrupt("max_attempts out of range".into()))?,
            retention_ms: millis(cmd.retention),
            watch_ms: millis(watch),
        })
    }
}

/// One column of a batch: field `f` of every call.
fn column<'a, C, T: 'a>(calls: &'a [&'a C], f: impl Fn(&'a C) -> T) -> Vec<T> {
    calls.iter().map(|c| f(c)).collect()
}

/// Runs a batch's statement: `alone`'s with `args`, or with a routing key
/// `at`'s with the key first.
async fn batch_query(
    shared: &Shared,
    (alone, at): (&'static str, &'static str),
    route: Option<&str>,
    args: &[&(dyn ToSql + Sync)],
) -> Result<Vec<Row>, StoreError> {
    match route {
        None => shared.query(alone, args).await,
        Some(route) => {
            let mut routed: Vec<&(dyn ToSql + Sync)> = Vec::with_capacity(args.len() + 1);
            routed.push(&route);
            routed.extend_from_slice(args);
            shared.query(at, &routed).await
        }
    }
}

impl Call for AcquireCall {
    const ALONE: &'static str = ACQUIRE;
    const KIND: crate::metrics::BatchKind = crate::metrics::BatchKind::Acquire;

    fn row_key(&self) -> (&str, &str, &str) {
        (&self.tenant, &self.scope, &self.key)
    }

    fn params<'a>(&'a self, stamp: &'a Stamp) -> impl AsRef<[&'a (dyn ToSql + Sync)]> + Send + 'a {
        let params: [&(dyn ToSql + Sync); _] = [
            &self.tenant,
            &self.scope,
            &self.key,
            &self.fingerprint,
            &self.request_id,
            &self.lease_ms,
            &self.max_attempts,
            &self.retention_ms,
            &self.watch_ms,
            &stamp.offset_ms,
            &stamp.deadline,
        ];
        params
    }

    async fn many(
        calls: &[&Self],
        route: Option<&str>,
        shared: &Shared,
        stamp: Stamp,
    ) -> Result<Vec<Row>, StoreError> {
        batch_query(
            shared,
            (ACQUIRE_BATCH, ACQUIRE_BATCH_AT),
            route,
            &[
                &column(calls, |c| c.tenant.as_str()),
                &column(calls, |c| c.scope.as_str()),
                &column(calls, |c| c.key.as_str()),
                &column(calls, |c| c.fingerprint.as_str()),
                &column(calls, |c| c.request_id.as_str()),
                &column(calls, |c| c.lease_ms),
                &column(calls, |c| c.max_attempts),
                &column(calls, |c| c.retention_ms),
                &column(calls, |c| c.watch_ms),
                &stamp.offset_ms,
                &stamp.deadline,
            ],
        )
        .await
    }
}

/// `idempotency_complete`'s arguments but the clock offset.
pub(super) struct CompleteCall {
    tenant: String,
    scope: String,
    key: String,
    token: uuid::Uuid,
    outcome: &'static str,
    result: Vec<u8>,
    content_type: String,
    status_code: i32,
    result_ref: String,
    error: String,
    permanent: bool,
    retry_after_ms: Option<i64>,
    backoff_base_ms: i64,
    backoff_cap_ms: i64,
}

impl CompleteCall {
    pub fn new(cmd: &CompleteCommand, backoff: Backoff) -> Self {
        let mut call = CompleteCall {
            tenant: cmd.id.tenant.as_str().to_owned(),
            scope: cmd.id.scope.as_str().to_owned(),
            key: cmd.id.key.as_str().to_owned(),
            token: cmd.token.as_uuid(),
            outcome: names::outcome(&cmd.outcome),
            result: Vec::new(),
            content_type: String::new(),
            status_code: 0,
            result_ref: String::new(),
            error: String::new(),
            permanent: false,
            retry_after_ms: None,
            backoff_base_ms: millis(backoff.base),
            backoff_cap_ms: millis(backoff.cap),
        };
        match &cmd.outcome {
            Outcome::Success(success) => {
                call.result.clone_from(&success.result);
                call.content_type.clone_from(&success.content_type);
                call.status_code = success.status_code;
                call.result_ref.clone_from(&success.result_ref);
            }
            Outcome::Failure {
                error,
                permanent,
                retry_after,
            } => {
                call.error = error.as_str().to_owned();
                call.permanent = *permanent;
                call.retry_after_ms = retry_after.map(millis);
            }
            Outcome::Release => {}
        }
        call
    }
}

impl Call for CompleteCall {
    const ALONE: &'static str = COMPLETE;
    const KIND: crate::metrics::BatchKind = crate::metrics::BatchKind::Complete;

    fn row_key(&self) -> (&str, &str, &str) {
        (&self.tenant, &self.scope, &self.key)
    }

    fn params<'a>(&'a self, stamp: &'a Stamp) -> impl AsRef<[&'a (dyn ToSql + Sync)]> + Send + 'a {
        let params: [&(dyn ToSql + Sync); _] = [
            &self.tenant,
            &self.scope,
            &self.key,
            &self.token,
            &self.outcome,
            &self.result,
            &self.content_type,
            &self.status_code,
            &self.result_ref,
            &self.error,
            &self.permanent,
            &self.retry_after_ms,
            &self.backoff_base_ms,
            &self.backoff_cap_ms,
            &stamp.offset_ms,
            &stamp.deadline,
        ];
        params
    }

    async fn many(
        calls: &[&Self],
        route: Option<&str>,
        shared: &Shared,
        stamp: Stamp,
    ) -> Result<Vec<Row>, StoreError> {
        batch_query(
            shared,
            (COMPLETE_BATCH, COMPLETE_BATCH_AT),
            route,
            &[
                &column(calls, |c| c.tenant.as_str()),
                &column(calls, |c| c.scope.as_str()),
                &column(calls, |c| c.key.as_str()),
                &column(calls, |c| c.token),
                &column(calls, |c| c.outcome),
                &column(calls, |c| c.result.as_slice()),
                &column(calls, |c| c.content_type.as_str()),
                &column(calls, |c| c.status_code),
                &column(calls, |c| c.result_ref.as_str()),
                &column(calls, |c| c.error.as_str()),
                &column(calls, |c| c.permanent),
                &column(calls, |c| c.retry_after_ms),
                &column(calls, |c| c.backoff_base_ms),
                &column(calls, |c| c.backoff_cap_ms),
                &stamp.offset_ms,
                &stamp.deadline,
            ],
        )
        .await
    }
}

//! The two hot calls, Acquire and Complete, as owned arguments that either
//! run alone (`idempotency_acquire`, `idempotency_complete`) or ride in a
//! batch together (`idempotency_call_batch`, `sql/functions/batches.sql`):
//! one queue carries both kinds ([`HotCall`]), so that a cycle's Acquire and
//! another caller's Complete share a statement and its commit. The
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
//! On Citus a batch goes out per node as `idempotency_call_batch_at`
//! (`sql/citus/batch_routes.sql`): the same arguments after a routing key
//! (`$1`), the deadline checked inside.

use tokio_postgres::Row;
use tokio_postgres::types::ToSql;

use super::batch::Call;
use super::clock::Stamp;
use super::mux::Shared;
use super::names;
use super::{StoreError, millis};
use crate::domain::{AcquireCommand, Backoff, CompleteCommand, Outcome};
use crate::metrics::BatchKind;

/// `idempotency_acquire`, its ten arguments bound in `AcquireCall::params`'s
/// order, then the deadline (`$11`, a `timestamptz` or NULL).
pub const ACQUIRE: &str = "SELECT a.decision, a.retry_after_ms, a.rec, \
     idempotency_in_time($11, $10) AS in_time \
     FROM idempotency_acquire($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) a";
/// `idempotency_complete`, its fifteen arguments bound in
/// `CompleteCall::params`'s order, then the deadline (`$16`).
pub const COMPLETE: &str = "SELECT c.outcome, c.rec, idempotency_in_time($16, $15) AS in_time \
     FROM idempotency_complete($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15) c";
/// `idempotency_call_batch`: the 21 arrays of `HotCall::many`, the clock
/// offset (`$22`) and the deadline (`$23`).
const CALL_BATCH: &str = "SELECT b.ord, b.decision, b.retry_after_ms, b.outcome, b.rec, \
     (SELECT idempotency_in_time($23, $22)) AS in_time \
     FROM idempotency_call_batch($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, \
     $15, $16, $17, $18, $19, $20, $21, false, $22) b";
const CALL_BATCH_AT: &str = "SELECT b.ord, b.decision, b.retry_after_ms, b.outcome, b.rec \
     FROM idempotency_call_batch_at($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, \
     $15, $16, $17, $18, $19, $20, $21, $22, $23, $24) b";

/// A hot call queued for a batch: both kinds share one queue and one
/// statement.
pub(super) enum HotCall {
    Acquire(AcquireCall),
    Complete(CompleteCall),
}

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

impl AcquireCall {
    fn params<'a>(&'a self, stamp: &'a Stamp) -> [&'a (dyn ToSql + Sync); 11] {
        [
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
        ]
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

impl CompleteCall {
    fn params<'a>(&'a self, stamp: &'a Stamp) -> [&'a (dyn ToSql + Sync); 16] {
        [
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
        ]
    }
}

/// A single call's arguments, either kind's, on the stack: a call run
/// alone allocates nothing to bind them.
enum Params<'a> {
    Acquire([&'a (dyn ToSql + Sync); 11]),
    Complete([&'a (dyn ToSql + Sync); 16]),
}

impl<'a> AsRef<[&'a (dyn ToSql + Sync)]> for Params<'a> {
    fn as_ref(&self) -> &[&'a (dyn ToSql + Sync)] {
        match self {
            Params::Acquire(params) => params,
            Params::Complete(params) => params,
        }
    }
}

/// One column of a batch: field `f` of every call.
fn column<'a, T: 'a>(calls: &'a [&'a HotCall], f: impl Fn(&'a HotCall) -> T) -> Vec<T> {
    calls.iter().map(|c| f(c)).collect()
}

/// One column of a batch's Acquires: NULL at a Complete's position.
fn acquires<'a, T: 'a>(
    calls: &'a [&'a HotCall],
    f: impl Fn(&'a AcquireCall) -> T,
) -> Vec<Option<T>> {
    column(calls, |c| match c {
        HotCall::Acquire(a) => Some(f(a)),
        HotCall::Complete(_) => None,
    })
}

/// One column of a batch's Completes: NULL at an Acquire's position.
fn completes<'a, T: 'a>(
    calls: &'a [&'a HotCall],
    f: impl Fn(&'a CompleteCall) -> T,
) -> Vec<Option<T>> {
    column(calls, |c| match c {
        HotCall::Complete(c) => Some(f(c)),
        HotCall::Acquire(_) => None,
    })
}

impl Call for HotCall {
    fn alone(&self) -> &'static str {
        match self {
            HotCall::Acquire(_) => ACQUIRE,
            HotCall::Complete(_) => COMPLETE,
        }
    }

    fn kind(&self) -> BatchKind {
        match self {
            HotCall::Acquire(_) => BatchKind::Acquire,
            HotCall::Complete(_) => BatchKind::Complete,
        }
    }

    fn row_key(&self) -> (&str, &str, &str) {
        let (tenant, scope, key) = match self {
            HotCall::Acquire(a) => (&a.tenant, &a.scope, &a.key),
            HotCall::Complete(c) => (&c.tenant, &c.scope, &c.key),
        };
        (tenant, scope, key)
    }

    fn params<'a>(&'a self, stamp: &'a Stamp) -> impl AsRef<[&'a (dyn ToSql + Sync)]> + Send + 'a {
        match self {
            HotCall::Acquire(a) => Params::Acquire(a.params(stamp)),
            HotCall::Complete(c) => Params::Complete(c.params(stamp)),
        }
    }

    async fn many(
        calls: &[&Self],
        route: Option<&str>,
        shared: &Shared,
        stamp: Stamp,
    ) -> Result<Vec<Row>, StoreError> {
        let args: [&(dyn ToSql + Sync); 23] = [
            &column(calls, |c| matches!(c, HotCall::Acquire(_))),
            &column(calls, |c| c.row_key().0),
            &column(calls, |c| c.row_key().1),
            &column(calls, |c| c.row_key().2),
            &acquires(calls, |a| a.fingerprint.as_str()),
            &acquires(calls, |a| a.request_id.as_str()),
            &acquires(calls, |a| a.lease_ms),
            &acquires(calls, |a| a.max_attempts),
            &acquires(calls, |a| a.retention_ms),
            &acquires(calls, |a| a.watch_ms),
            &completes(calls, |c| c.token),
            &completes(calls, |c| c.outcome),
            &completes(calls, |c| c.result.as_slice()),
            &completes(calls, |c| c.content_type.as_str()),
            &completes(calls, |c| c.status_code),
            &completes(calls, |c| c.result_ref.as_str()),
            &completes(calls, |c| c.error.as_str()),
            &completes(calls, |c| c.permanent),
            &column(calls, |c| match c {
                HotCall::Complete(c) => c.retry_after_ms,
                HotCall::Acquire(_) => None,
            }),
            &completes(calls, |c| c.backoff_base_ms),
            &completes(calls, |c| c.backoff_cap_ms),
            &stamp.offset_ms,
            &stamp.deadline,
        ];
        match route {
            None => shared.query(CALL_BATCH, &args).await,
            Some(route) => {
                let mut routed: Vec<&(dyn ToSql + Sync)> = Vec::with_capacity(args.len() + 1);
                routed.push(&route);
                routed.extend_from_slice(&args);
                shared.query(CALL_BATCH_AT, &routed).await
            }
        }
    }
}

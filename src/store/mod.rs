//! The database seam: one method per SQL function of `sql/functions/`, rows turned into
//! domain types. Knows nothing of gRPC.
//!
//! Every decision is made inside PostgreSQL in one round trip, under the row
//! lock of the record concerned and by the database's clock; this module only
//! binds arguments and reads the answer.
//!
//! This file holds the calls (Acquire, Complete, ExtendLease, Get, Watch);
//! the rest is split by job:
//!
//! - `setup`: the configuration, the database URL read once, building the
//!   pool, the shared connections and the batch queues;
//! - `error`: why the store could not answer, and which database errors are
//!   worth a retry;
//! - `run`: how a statement reaches the database: a call's pipelined on a
//!   few shared connections (`mux`), or queued so that Acquires and Completes
//!   that arrive together share one statement and one commit (`batch`, with
//!   their arguments in `calls`; on Citus one statement per node, split by
//!   `shards`, the map of which node holds each key); maintenance's on pooled connections of its
//!   own, so its longer statements never hold up calls queued behind them;
//! - `maintenance`: sweeping and the recovery feed's due records (on a Citus
//!   coordinator per shard and per key);
//! - `row`: rows into domain records, and the names the SQL functions use
//!   for statuses, decisions, outcomes and refusals;
//! - `replays`: SUCCEEDED records answered from memory;
//! - `listener`: the LISTEN connection and the database's clock;
//! - `probe`: whether the connections calls use answer (readiness), and
//!   replacing one that silently stopped;
//! - [`citus`]: a Citus coordinator recognised, what migrating it adds,
//!   and its other nodes (for the listener);
//! - `migrate`: applying `sql/`: the numbered schema migrations once each,
//!   then every function file that changed;
//! - [`connect_error`]: why a connection failed, in one sentence naming
//!   where it went and what to check; and the database URLs refused before
//!   any connection is tried.

mod admin;
mod batch;
mod calls;
pub mod citus;
mod clock;
pub mod connect_error;
mod error;
pub mod listener;
mod maintenance;
pub mod migrate;
mod mux;
pub mod names;
pub mod postgres;
pub mod probe;
mod replays;
mod row;
mod row_type;
mod run;
mod setup;
mod shards;
pub mod tls;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use deadpool_postgres::Pool;
use tokio_postgres::Row;

pub use admin::SUMMARY_CAP;
use calls::{AcquireCall, CompleteCall, HotCall};
pub use maintenance::{ShardLimits, ShardSwept};
use replays::Replays;
use run::millis;
use setup::Batches;

use crate::domain::{
    AcquireCommand, Acquired, Backoff, CompleteCommand, ExtendCommand, Lease, Record, RecordId,
    Refusal,
};
use crate::metrics::Metrics;

pub(crate) use batch::PastDeadline;
pub use clock::Clock;
pub use connect_error::{ConnectError, ConnectTarget, UrlError};
pub use error::{QueryTimeout, StoreError};
pub use listener::Change;
pub use postgres::{Postgres, PostgresError};
pub use setup::{StoreConfig, pg_config};

/// The statements of the two hot calls run alone, for clients that call the
/// SQL functions directly as the store does (the benchmark's baseline).
/// Their rows carry the record as one composite column, `rec`, which
/// `record_in_rec` reads.
pub use calls::{ACQUIRE as ACQUIRE_SQL, COMPLETE as COMPLETE_SQL};
pub use row::record_in_rec;

/// How long one call may take in the store, as its caller sees it.
///
/// `answer_by` is the moment the caller stops waiting for the answer (the
/// gRPC deadline, less admission's margin): no statement of the call may
/// commit after it. Each statement carries the earlier of it and the query
/// timeout's limit as its deadline on the database's clock
/// (`sql/functions/deadline.sql`), so a statement that reaches the
/// database or finishes after its caller heard DEADLINE_EXCEEDED rolls back;
/// the wait for a connection ends by then too.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CallTime {
    /// The longest the call waits for a database connection; `None`: the
    /// store's `--connect-wait`. Never past `answer_by`.
    pub connect_wait: Option<Duration>,
    /// When the caller stops waiting; `None`: only the query timeout bounds
    /// the call's statements.
    pub answer_by: Option<tokio::time::Instant>,
}

impl CallTime {
    /// A call whose caller waits until `answer_by`, if it said.
    pub fn until(answer_by: Option<tokio::time::Instant>) -> Self {
        CallTime {
            connect_wait: None,
            answer_by,
        }
    }

    /// The same call, prepared to wait `wait` for a connection.
    pub fn waiting(self, wait: Duration) -> Self {
        CallTime {
            connect_wait: Some(wait),
            ..self
        }
    }

    /// What is left of the caller's time now; `None`: no deadline.
    pub(crate) fn left(&self) -> Option<Duration> {
        self.answer_by
            .map(|at| at.saturating_duration_since(tokio::time::Instant::now()))
    }
}

/// Connection pool plus the test clock: cheap to clone, shared by every call.
#[derive(Clone)]
pub struct Store {
    /// Connections with their prepared statements cached per connection.
    pool: Pool,
    /// Offset added to the database clock (always zero outside tests).
    clock: Clock,
    /// The longest a call waits for a pooled connection.
    connect_wait: Duration,
    /// The longest one statement may take.
    query_timeout: Duration,
    /// Shared, pipelined connections for the calls' statements, if
    /// configured.
    mux: Option<Arc<mux::Mux>>,
    /// Queues that coalesce Acquires and Completes, if configured.
    batches: Option<Arc<Batches>>,
    /// SUCCEEDED records that answer replays without a round trip, if
    /// configured.
    replays: Option<Arc<Replays>>,
    /// Where connections go, for the messages of failed ones.
    target: Arc<ConnectTarget>,
    /// The database is a Citus coordinator (`citus`): Acquires and
    /// Completes are batched per node once its map of shards is read
    /// (`routes`), alone until then. Learnt at start.
    distributed: Arc<AtomicBool>,
    /// Where each key's row lives on Citus (`shards`); empty on plain
    /// PostgreSQL.
    routes: Arc<shards::Routes>,
    /// The records table's row type as the catalog lists it, once it
    /// changed while connections were open (`row_type`).
    row_types: Arc<row_type::RowTypes>,
    /// The server's metrics, which the store and what it builds record
    /// into; handed on to the rest of the server ([`Store::metrics`]).
    metrics: Metrics,
}

// Each ends with the deadline check that `calls` explains.
const EXTEND_LEASE: &str = "SELECT e.outcome, e.rec, idempotency_in_time($9, $8) AS in_time \
     FROM idempotency_extend_lease($1, $2, $3, $4, $5, $6, $7, $8) e";
const GET: &str = "SELECT g.*, idempotency_in_time($5, $4) AS in_time \
     FROM idempotency_get($1, $2, $3, $4) g";
const WATCH: &str = "SELECT w.*, idempotency_in_time($6, $5) AS in_time \
     FROM idempotency_watch($1, $2, $3, $4, $5) w";

impl Store {
    pub fn clock(&self) -> &Clock {
        &self.clock
    }

    /// The batch queues, unless batching is off or the database is a
    /// Citus coordinator whose map of shards this server does not have:
    /// a batch split by node needs it, and each call runs alone on the node
    /// of its key instead.
    fn batches(&self) -> Option<&Batches> {
        self.batches
            .as_deref()
            .filter(|_| !self.distributed.load(Ordering::Relaxed) || self.routes.ready())
    }

    /// Whether the database is a Citus coordinator, as [`Store::inspect`]
    /// found it.
    pub fn distributed(&self) -> bool {
        self.distributed.load(Ordering::Relaxed)
    }

    /// Finds out whether the database is a Citus coordinator and says
    /// which it found in one log line; on Citus, reads the map of shards
    /// that batches are split by, one statement per node (see [`citus`]).
    pub async fn inspect(&self) -> Result<bool, StoreError> {
        let client = self.connection(CallTime::default()).await?;
        let found = citus::present(&**client).await?;
        self.distributed.store(found, Ordering::Relaxed);
        if found {
            let nodes = citus::other_nodes(&**client).await?;
            let map = shards::load(&**client).await?;
            let grouped = map.is_some();
            self.routes.set(map);
            tracing::info!(
                other_nodes = nodes.len(),
                group_commit_per_node = grouped,
                "database is a Citus coordinator: records distributed by key, \
                 single-key calls delegated to the node holding the key, \
                 batches of Acquires and Completes split by node"
            );
        } else {
            tracing::info!("database is plain PostgreSQL");
        }
        Ok(found)
    }

    /// Acquires and Completes waiting for a batch to carry them.
    pub fn queued_calls(&self) -> usize {
        self.batches.as_ref().map_or(0, |b| b.queued())
    }

    /// The pool's state: connections allowed, open and idle, and calls
    /// waiting for one (read by metrics at scrape time).
    pub fn pool_status(&self) -> deadpool_postgres::Status {
        self.pool.status()
    }

    /// Shared connections configured, and how many are connected now.
    pub fn shared_connections(&self) -> (usize, usize) {
        self.mux
            .as_ref()
            .map_or((0, 0), |mux| (mux.len(), mux.connected()))
    }

    /// The server's metrics: the registry this store records into.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Bytes the replay cache holds.
    pub fn replay_cache_bytes(&self) -> u64 {
        self.replays.as_ref().map_or(0, |r| r.weight())
    }

    /// How long a call waits for a connection unless told otherwise.
    pub fn connect_wait(&self) -> Duration {
        self.connect_wait
    }

    /// Runs `idempotency_acquire`: the whole decision in one round trip.
    /// A non-zero `watch` marks an IN_PROGRESS record watched for that long,
    /// so that its next change notifies the waiting caller.
    pub async fn acquire(
        &self,
        cmd: &AcquireCommand,
        watch: Duration,
        time: CallTime,
    ) -> Result<Acquired, StoreError> {
        if let Some(replays) = &self.replays
            && let Some(now) = self.clock.database_now()
        {
            let answer = replays.answer(cmd, now);
            self.metrics.replay_lookup(answer.is_some());
            if let Some(answer) = answer {
                return Ok(answer);
            }
        }
        let call = HotCall::Acquire(AcquireCall::new(cmd, watch)?);
        let batch = self.batches();
        let row = self
            .run_call(call, batch, time)
            .await?
            .ok_or_else(|| StoreError::Corrupt("idempotency_acquire returned no row".into()))?;
        let record = self.record_in_rec(&row, time).await?;
        let decision: &str = row.try_get("decision")?;
        let decision = names::decision(decision)
            .ok_or_else(|| StoreError::Corrupt(format!("unknown decision {decision:?}")))?;
        let retry_after = row
            .try_get::<_, Option<i64>>("retry_after_ms")?
            .map(|ms| Duration::from_millis(ms.max(0).unsigned_abs()));
        let acquired = Acquired {
            decision,
            record,
            retry_after,
        };
        if let Some(replays) = &self.replays
            && let Some(now) = self.clock.database_now()
        {
            replays.remember(&cmd.id, &acquired.record, now);
        }
        Ok(acquired)
    }

    /// Runs `idempotency_complete`.
    pub async fn complete(
        &self,
        cmd: &CompleteCommand,
        backoff: Backoff,
        time: CallTime,
    ) -> Result<Record, StoreError> {
        let call = HotCall::Complete(CompleteCall::new(cmd, backoff));
        let batch = self.batches();
        let row = self.run_call(call, batch, time).await?;
        self.record_unless_refused(row, time).await
    }

    /// Runs `idempotency_extend_lease` and returns the lease's new state.
    pub async fn extend_lease(
        &self,
        cmd: &ExtendCommand,
        max_lease: Duration,
        time: CallTime,
    ) -> Result<Lease, StoreError> {
        let stamp = self.stamp(&time)?;
        let row = self
            .query_one(
                cmd.id.key.as_str(),
                EXTEND_LEASE,
                &[
                    &cmd.id.tenant.as_str(),
                    &cmd.id.scope.as_str(),
                    &cmd.id.key.as_str(),
                    &cmd.token.as_uuid(),
                    &millis(cmd.extend_by),
                    &millis(max_lease),
                    &cmd.checkpoint.as_deref(),
                    &stamp.offset_ms,
                    &stamp.deadline,
                ],
                time,
            )
            .await?;
        self.record_unless_refused(row, time)
            .await
            .map(|record| record.lease)
    }

    /// Reads an `(outcome, rec)` row: the record when the outcome is OK,
    /// else the refusal it names.
    async fn record_unless_refused(
        &self,
        row: Option<Row>,
        time: CallTime,
    ) -> Result<Record, StoreError> {
        let row = row.ok_or_else(|| StoreError::Corrupt("the function returned no row".into()))?;
        let outcome: &str = row.try_get("outcome")?;
        match names::refusal(outcome) {
            Some(None) => self.record_in_rec(&row, time).await,
            Some(Some(refusal)) => Err(refusal.into()),
            None => Err(StoreError::Corrupt(format!("unknown outcome {outcome:?}"))),
        }
    }

    /// The live record, or `Refused(NotFound)`.
    pub async fn get(&self, id: &RecordId, time: CallTime) -> Result<Record, StoreError> {
        row::record(&self.query_by_id(GET, id, time).await?)
    }

    /// The row of `sql`, whose arguments are `id` (tenant, scope, key), the
    /// clock offset and the deadline; `Refused(NotFound)` when it has none.
    async fn query_by_id(
        &self,
        sql: &'static str,
        id: &RecordId,
        time: CallTime,
    ) -> Result<Row, StoreError> {
        let stamp = self.stamp(&time)?;
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 5] = [
            &id.tenant.as_str(),
            &id.scope.as_str(),
            &id.key.as_str(),
            &stamp.offset_ms,
            &stamp.deadline,
        ];
        let row = self.query_one(id.key.as_str(), sql, &params, time).await?;
        Ok(row.ok_or(Refusal::NotFound)?)
    }

    /// Marks the live record watched for `watch` (its changes notify) and
    /// returns it, or `Refused(NotFound)`.
    pub async fn watch(
        &self,
        id: &RecordId,
        watch: Duration,
        time: CallTime,
    ) -> Result<Record, StoreError> {
        let stamp = self.stamp(&time)?;
        let row = self
            .query_one(
                id.key.as_str(),
                WATCH,
                &[
                    &id.tenant.as_str(),
                    &id.scope.as_str(),
                    &id.key.as_str(),
                    &millis(watch),
                    &stamp.offset_ms,
                    &stamp.deadline,
                ],
                time,
            )
            .await?
            .ok_or(Refusal::NotFound)?;
        row::record(&row)
    }
}

//! The database seam: one method per SQL function of `sql/`, rows turned into
//! domain types. Knows nothing of gRPC.
//!
//! Every decision is made inside PostgreSQL in one round trip, under the row
//! lock of the record concerned and by the database's clock; this module only
//! binds arguments and reads the answer.
//!
//! Calls' statements are pipelined on a few shared connections (`mux`);
//! Acquires and Completes that arrive together share one statement and one
//! commit (`batch`, with their arguments in `calls`); maintenance takes pooled
//! connections of its own, so its longer statements never hold up calls
//! queued behind them.

mod batch;
mod calls;
mod clock;
pub mod listener;
pub mod migrate;
mod mux;
mod replays;
mod row;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Object, Pool, RecyclingMethod, Runtime, Timeouts};
use futures_util::future::Either;
use tokio_postgres::error::SqlState;
use tokio_postgres::{NoTls, Row, types::ToSql};

use batch::Call;
use calls::{AcquireCall, CompleteCall};
use replays::Replays;

use crate::domain::{
    AcquireCommand, Acquired, Backoff, CompleteCommand, Decision, DueRecord, ExtendCommand, Lease,
    Record, RecordId, Refusal, Scope, SweepCounts, Tenant,
};

pub use clock::Clock;
pub use listener::Change;

/// Why the store could not answer.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// An expected refusal: the caller must act on it.
    #[error(transparent)]
    Refused(#[from] Refusal),
    /// No connection could be had in time, or it broke mid-call. Retrying
    /// later is safe: Acquire with a request_id and Complete are idempotent.
    #[error("the database is unavailable")]
    Unavailable(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// The database answered with an error that retrying will not fix.
    #[error("a database call failed")]
    Query(#[source] tokio_postgres::Error),
    /// A row that does not match what the SQL functions promise.
    #[error("the database returned an unexpected row: {0}")]
    Corrupt(String),
    /// The database URL or pool settings cannot be used.
    #[error("invalid database configuration")]
    Config(#[source] Box<dyn std::error::Error + Send + Sync>),
}

impl From<tokio_postgres::Error> for StoreError {
    fn from(error: tokio_postgres::Error) -> Self {
        if is_transient(&error) {
            StoreError::Unavailable(Box::new(error))
        } else {
            StoreError::Query(error)
        }
    }
}

impl StoreError {
    /// A deadlock or serialization failure: the statement rolled back whole,
    /// and running its work again can succeed.
    fn is_conflict(&self) -> bool {
        let StoreError::Unavailable(source) = self else {
            return false;
        };
        source
            .downcast_ref::<tokio_postgres::Error>()
            .and_then(tokio_postgres::Error::as_db_error)
            .is_some_and(|db| {
                // Not 40003 (statement completion unknown): that one may
                // have committed.
                matches!(
                    *db.code(),
                    SqlState::T_R_SERIALIZATION_FAILURE | SqlState::T_R_DEADLOCK_DETECTED
                )
            })
    }
}

/// Lost connections, server shutdowns and resource exhaustion go away on their
/// own; anything else is a bug or a broken schema.
fn is_transient(error: &tokio_postgres::Error) -> bool {
    if error.is_closed() {
        return true;
    }
    if let Some(db) = error.as_db_error() {
        let class = &db.code().code()[..2];
        // 08 connection exception, 53 insufficient resources, 57 operator
        // intervention (shutdown, terminated backend), 40 serialization
        // failure or deadlock.
        return matches!(class, "08" | "53" | "57" | "40");
    }
    std::error::Error::source(error).is_some_and(|s| s.is::<std::io::Error>())
}

/// How the store reaches PostgreSQL.
#[derive(Debug, Clone)]
pub struct StoreConfig {
    /// A libpq-style URL or key=value string.
    pub database_url: String,
    /// Connections kept open at most.
    pub pool_size: usize,
    /// How long a call waits for a connection before answering UNAVAILABLE.
    pub connect_wait: Duration,
    /// How long one statement may take before the call answers UNAVAILABLE
    /// (a database that accepts connections but does not answer).
    pub query_timeout: Duration,
    /// Connections shared and pipelined by all calls; 0: each call takes a
    /// pooled connection of its own.
    pub shared_connections: usize,
    /// Acquires (or Completes) one statement carries at most, on the shared
    /// connections; 1: each runs alone.
    pub batch_size: usize,
    /// Memory for SUCCEEDED records that replays are answered from; 0: none.
    pub replay_cache_bytes: u64,
}

/// A statement that got no answer in time.
#[derive(Debug, thiserror::Error)]
#[error("the database did not answer within {0:?}")]
pub struct QueryTimeout(Duration);

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
}

struct Batches {
    acquire: batch::Coalescer<AcquireCall>,
    complete: batch::Coalescer<CompleteCall>,
}

/// Parses a database URL and names our connections in `pg_stat_activity`.
pub fn pg_config(database_url: &str) -> Result<tokio_postgres::Config, tokio_postgres::Error> {
    let mut config: tokio_postgres::Config = database_url.parse()?;
    if config.get_application_name().is_none() {
        config.application_name("idempotency-coordinator");
    }
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(Duration::from_secs(5));
    }
    Ok(config)
}

const EXTEND_LEASE: &str = "SELECT e.outcome, (e.rec).* \
     FROM idempotency_extend_lease($1, $2, $3, $4, $5, $6, $7, $8) e";
const GET: &str = "SELECT * FROM idempotency_get($1, $2, $3, $4)";
const WATCH: &str = "SELECT * FROM idempotency_watch($1, $2, $3, $4, $5)";
const SWEEP_BATCH: &str = "SELECT * FROM idempotency_sweep_batch($1, $2, $3, $4, $5)";
const COUNT_DUE: &str = "SELECT idempotency_count_due($1, $2)";
const CLAIM_DUE: &str = "SELECT * FROM idempotency_claim_due($1, $2, $3, $4, $5, $6)";
const RELEASE_OFFERS: &str = "SELECT idempotency_release_offers($1)";

pub(crate) fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

impl Store {
    /// Builds the pool; connections open on first use, so this succeeds while
    /// the database is down.
    pub fn new(config: &StoreConfig, clock: Clock) -> Result<Self, StoreError> {
        let pg = pg_config(&config.database_url).map_err(|e| StoreError::Config(Box::new(e)))?;
        let manager = Manager::from_config(
            pg.clone(),
            NoTls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(config.pool_size)
            .runtime(Runtime::Tokio1)
            .build()
            .map_err(|e| StoreError::Config(Box::new(e)))?;
        let mux = (config.shared_connections > 0).then(|| {
            Arc::new(mux::Mux::new(
                pg,
                config.shared_connections,
                config.query_timeout,
            ))
        });
        let batches = match &mux {
            Some(mux) if config.batch_size > 1 => {
                if tokio::runtime::Handle::try_current().is_err() {
                    return Err(StoreError::Config(
                        "batching needs a running Tokio runtime".into(),
                    ));
                }
                let settings = || batch::Settings {
                    mux: Arc::clone(mux),
                    clock: clock.clone(),
                    workers: config.shared_connections,
                    max_batch: config.batch_size,
                    connect_wait: config.connect_wait,
                    query_timeout: config.query_timeout,
                };
                Some(Arc::new(Batches {
                    acquire: batch::Coalescer::start(settings()),
                    complete: batch::Coalescer::start(settings()),
                }))
            }
            _ => None,
        };
        Ok(Store {
            pool,
            clock,
            connect_wait: config.connect_wait,
            query_timeout: config.query_timeout,
            mux,
            batches,
            replays: Replays::new(config.replay_cache_bytes).map(Arc::new),
        })
    }

    pub fn clock(&self) -> &Clock {
        &self.clock
    }

    /// Acquires and Completes waiting for a batch to carry them.
    pub fn queued_calls(&self) -> usize {
        self.batches
            .as_ref()
            .map_or(0, |b| b.acquire.queued() + b.complete.queued())
    }

    /// How long a call waits for a connection unless told otherwise.
    pub fn connect_wait(&self) -> Duration {
        self.connect_wait
    }

    /// A pooled connection, waiting at most `wait` for one (`None`: the
    /// configured wait).
    pub async fn connection(&self, wait: Option<Duration>) -> Result<Object, StoreError> {
        let wait = wait.unwrap_or(self.connect_wait);
        let timeouts = Timeouts {
            wait: Some(wait),
            create: Some(wait),
            recycle: Some(wait),
        };
        self.pool
            .timeout_get(&timeouts)
            .await
            .map_err(|e| StoreError::Unavailable(Box::new(e)))
    }

    async fn query(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
        wait: Option<Duration>,
    ) -> Result<Vec<Row>, StoreError> {
        let client = self.connection(wait).await?;
        self.in_time(async {
            let statement = client.prepare_cached(sql).await?;
            Ok(client.query(&statement, params).await?)
        })
        .await
    }

    /// `work`, or UNAVAILABLE when it takes longer than the query timeout.
    async fn in_time<T>(
        &self,
        work: impl std::future::Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        tokio::time::timeout(self.query_timeout, work)
            .await
            .unwrap_or_else(|_| {
                Err(StoreError::Unavailable(Box::new(QueryTimeout(
                    self.query_timeout,
                ))))
            })
    }

    /// One row of a call's statement: pipelined on a shared connection when
    /// those are configured, else on a pooled connection of its own.
    ///
    /// The statement's future (several KB: connection, timeout, prepare and
    /// query states) lives on the heap only while the statement runs, so a
    /// call sleeping in its wait window between statements does not carry it.
    async fn query_one(
        &self,
        sql: &'static str,
        params: &[&(dyn ToSql + Sync)],
        wait: Option<Duration>,
    ) -> Result<Option<Row>, StoreError> {
        Box::pin(self.run_query_one(sql, params, wait)).await
    }

    async fn run_query_one(
        &self,
        sql: &'static str,
        params: &[&(dyn ToSql + Sync)],
        wait: Option<Duration>,
    ) -> Result<Option<Row>, StoreError> {
        if let Some(mux) = &self.mux {
            let shared = mux.get(wait.unwrap_or(self.connect_wait)).await?;
            return self.in_time(shared.query_opt(sql, params)).await;
        }
        self.query_one_pooled(sql, params, wait).await
    }

    /// One of the hot calls: queued for a batch when batching is on, else
    /// run alone like any other call.
    ///
    /// Not an `async fn`, so that the future the caller awaits holds the
    /// call's arguments only when it runs the statement itself (boxed). A
    /// batched call is queued when this is called, so await what it returns:
    /// a queued call whose future is dropped unpolled still runs.
    fn run_call<'a, C: Call>(
        &'a self,
        call: C,
        batch: Option<&batch::Coalescer<C>>,
        wait: Option<Duration>,
    ) -> impl Future<Output = Result<Option<Row>, StoreError>> + Send + 'a {
        match batch {
            Some(batch) => Either::Left(batch.run(call, wait.unwrap_or(self.connect_wait))),
            None => Either::Right(Box::pin(async move {
                let offset = self.clock.offset_ms();
                self.query_one(C::ALONE, call.params(&offset).as_ref(), wait)
                    .await
            })),
        }
    }

    /// One row, on a pooled connection of its own: for maintenance, whose
    /// longer statements must not hold up calls pipelined behind them.
    async fn query_one_pooled(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
        wait: Option<Duration>,
    ) -> Result<Option<Row>, StoreError> {
        let client = self.connection(wait).await?;
        self.in_time(async {
            let statement = client.prepare_cached(sql).await?;
            Ok(client.query_opt(&statement, params).await?)
        })
        .await
    }

    /// Runs `idempotency_acquire`: the whole decision in one round trip.
    /// A non-zero `watch` marks an IN_PROGRESS record watched for that long,
    /// so that its next change notifies the waiting caller.
    pub async fn acquire(
        &self,
        cmd: &AcquireCommand,
        watch: Duration,
        wait: Option<Duration>,
    ) -> Result<Acquired, StoreError> {
        if let Some(replays) = &self.replays
            && let Some(now) = self.clock.database_now()
            && let Some(answer) = replays.answer(cmd, now)
        {
            return Ok(answer);
        }
        let call = AcquireCall::new(cmd, watch)?;
        let batch = self.batches.as_ref().map(|b| &b.acquire);
        let row = self
            .run_call(call, batch, wait)
            .await?
            .ok_or_else(|| StoreError::Corrupt("idempotency_acquire returned no row".into()))?;
        let decision: &str = row.try_get("decision")?;
        let decision = Decision::from_stored(decision)
            .ok_or_else(|| StoreError::Corrupt(format!("unknown decision {decision:?}")))?;
        let retry_after = row
            .try_get::<_, Option<i64>>("retry_after_ms")?
            .map(|ms| Duration::from_millis(ms.max(0).unsigned_abs()));
        let acquired = Acquired {
            decision,
            record: row::record(&row)?,
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
        wait: Option<Duration>,
    ) -> Result<Record, StoreError> {
        let call = CompleteCall::new(cmd, backoff);
        let batch = self.batches.as_ref().map(|b| &b.complete);
        let row = self.run_call(call, batch, wait).await?;
        record_unless_refused(row)
    }

    /// Runs `idempotency_extend_lease` and returns the lease's new state.
    pub async fn extend_lease(
        &self,
        cmd: &ExtendCommand,
        max_lease: Duration,
        wait: Option<Duration>,
    ) -> Result<Lease, StoreError> {
        let row = self
            .query_one(
                EXTEND_LEASE,
                &[
                    &cmd.id.tenant.as_str(),
                    &cmd.id.scope.as_str(),
                    &cmd.id.key.as_str(),
                    &cmd.token.as_uuid(),
                    &millis(cmd.extend_by),
                    &millis(max_lease),
                    &cmd.checkpoint.as_deref(),
                    &self.clock.offset_ms(),
                ],
                wait,
            )
            .await?;
        record_unless_refused(row).map(|record| record.lease)
    }

    /// The live record, or `Refused(NotFound)`.
    pub async fn get(&self, id: &RecordId, wait: Option<Duration>) -> Result<Record, StoreError> {
        let row = self
            .query_one(
                GET,
                &[
                    &id.tenant.as_str(),
                    &id.scope.as_str(),
                    &id.key.as_str(),
                    &self.clock.offset_ms(),
                ],
                wait,
            )
            .await?
            .ok_or(Refusal::NotFound)?;
        row::record(&row)
    }

    /// Marks the live record watched for `watch` (its changes notify) and
    /// returns it, or `Refused(NotFound)`.
    pub async fn watch(
        &self,
        id: &RecordId,
        watch: Duration,
        wait: Option<Duration>,
    ) -> Result<Record, StoreError> {
        let row = self
            .query_one(
                WATCH,
                &[
                    &id.tenant.as_str(),
                    &id.scope.as_str(),
                    &id.key.as_str(),
                    &millis(watch),
                    &self.clock.offset_ms(),
                ],
                wait,
            )
            .await?
            .ok_or(Refusal::NotFound)?;
        row::record(&row)
    }

    /// Asks the database something trivial, to tell whether it answers.
    pub async fn ping(&self, budget: Duration) -> Result<(), StoreError> {
        let client = self.connection(Some(budget)).await?;
        client.simple_query("SELECT 1").await?;
        Ok(())
    }
}

impl Store {
    /// One short transaction of sweeping (`idempotency_sweep_batch`), at most
    /// `limit` rows of each kind, of one tenant or (`None`) all; `None` when
    /// `exclusive` and another replica holds the sweeper's lock.
    pub async fn sweep_batch(
        &self,
        tenant: Option<&Tenant>,
        limit: u32,
        dry_run: bool,
        exclusive: bool,
    ) -> Result<Option<SweepCounts>, StoreError> {
        let limit = i32::try_from(limit).unwrap_or(i32::MAX);
        let row = self
            .query_one_pooled(
                SWEEP_BATCH,
                &[
                    &tenant.map(Tenant::as_str),
                    &limit,
                    &dry_run,
                    &exclusive,
                    &self.clock.offset_ms(),
                ],
                None,
            )
            .await?
            .ok_or_else(|| StoreError::Corrupt("idempotency_sweep_batch returned no row".into()))?;
        if !row.try_get::<_, bool>("swept")? {
            return Ok(None);
        }
        let count = |column| {
            row.try_get::<_, i64>(column)
                .map(|n| n.max(0).unsigned_abs())
        };
        Ok(Some(SweepCounts {
            expired_deleted: count("expired_deleted")?,
            leases_reclaimed: count("leases_reclaimed")?,
            retries_due: 0,
        }))
    }

    /// FAILED records whose retry is due, of one tenant or (`None`) all.
    pub async fn count_due(&self, tenant: Option<&Tenant>) -> Result<u64, StoreError> {
        let row = self
            .query_one_pooled(
                COUNT_DUE,
                &[&tenant.map(Tenant::as_str), &self.clock.offset_ms()],
                None,
            )
            .await?
            .ok_or_else(|| StoreError::Corrupt("idempotency_count_due returned no row".into()))?;
        Ok(row.try_get::<_, i64>(0)?.max(0).unsigned_abs())
    }

    /// Offers up to `limit` due records to `subscriber` for `offer`
    /// (`idempotency_claim_due`): those of one tenant's scope, or with
    /// `None` those of every tenant.
    pub async fn claim_due(
        &self,
        scope: Option<(&Tenant, &Scope)>,
        subscriber: uuid::Uuid,
        offer: Duration,
        limit: u32,
    ) -> Result<Vec<DueRecord>, StoreError> {
        let (tenant, scope) =
            scope.map_or((None, None), |(t, s)| (Some(t.as_str()), Some(s.as_str())));
        let limit = i32::try_from(limit).unwrap_or(i32::MAX);
        let rows = self
            .query(
                CLAIM_DUE,
                &[
                    &tenant,
                    &scope,
                    &subscriber,
                    &millis(offer),
                    &limit,
                    &self.clock.offset_ms(),
                ],
                None,
            )
            .await?;
        rows.iter().map(row::due_record).collect()
    }

    /// Makes what `subscriber` was offered and did not act on available to
    /// others at once; returns how many records that was.
    pub async fn release_offers(&self, subscriber: uuid::Uuid) -> Result<u64, StoreError> {
        let row = self
            .query_one_pooled(RELEASE_OFFERS, &[&subscriber], None)
            .await?
            .ok_or_else(|| {
                StoreError::Corrupt("idempotency_release_offers returned no row".into())
            })?;
        Ok(row.try_get::<_, i64>(0)?.max(0).unsigned_abs())
    }
}

/// Reads a `(outcome, rec.*)` row: the record when the outcome is OK, else the
/// refusal it names.
fn record_unless_refused(row: Option<Row>) -> Result<Record, StoreError> {
    let row = row.ok_or_else(|| StoreError::Corrupt("the function returned no row".into()))?;
    let outcome: &str = row.try_get("outcome")?;
    match Refusal::from_stored(outcome) {
        Some(None) => row::record(&row),
        Some(Some(refusal)) => Err(refusal.into()),
        None => Err(StoreError::Corrupt(format!("unknown outcome {outcome:?}"))),
    }
}

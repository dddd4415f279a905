//! A few database connections shared by all calls, each call's statement
//! pipelined behind the others on its connection instead of waiting for a
//! connection of its own. Every statement of a call is a single autocommit
//! statement holding row locks only while it runs, so sharing a connection is
//! safe.
//!
//! A connection is replaced when it reports itself closed, and when it stops
//! answering while still open (a firewall or NAT that dropped its state, a
//! database that failed over to another address): a statement that timed
//! out, or a probe (`Mux::probe`) that got no answer in time, retires it, and
//! the next call in its slot connects anew.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::RwLock;
use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, Row, Statement};

use super::StoreError;
use super::connect_error::ConnectError;
use super::error::{self, QueryTimeout};

/// Runs a prepared statement: `run(anew)` prepares it (taken from its
/// connection's cache, or with `anew` prepared now whatever the cache
/// holds) and runs it.
///
/// PostgreSQL does not re-describe a prepared statement. One whose
/// rows are the table's plain columns (Get, Watch, an administrator's
/// delete, the recovery feed) fails once a column it returns is dropped
/// ("attribute N of type record has been dropped") or, re-planned after a
/// function it calls was replaced, its result's shape changed ("cached
/// plan must not change result type"); through a Citus coordinator node,
/// a statement prepared before a column was dropped refers to it as
/// `?dropped?column?`, which does not exist. Such a statement is run once
/// more, prepared anew. Running it again is safe: each statement is its own
/// (autocommit) transaction, which the error rolled back before any row
/// reached us; only a sequence it advanced stays advanced, which leaves a
/// gap in fencing tokens at most.
pub(super) async fn prepared_anew_if_stale<T, F, Fut>(mut run: F) -> Result<T, StoreError>
where
    F: FnMut(bool) -> Fut,
    Fut: Future<Output = Result<T, tokio_postgres::Error>>,
{
    match run(false).await {
        Err(e) if error::prepared_before_a_table_change(&e) => {
            tracing::warn!(
                error = %e,
                "a statement prepared before the records table changed is prepared anew"
            );
            Ok(run(true).await?)
        }
        answer => Ok(answer?),
    }
}

/// One shared connection and the statements prepared on it.
pub(super) struct Shared {
    /// The slot it was connected for.
    slot: usize,
    /// The connection itself, on which every call's statements are pipelined.
    pub client: Client,
    prepared: std::sync::Mutex<HashMap<&'static str, Statement>>,
    /// `true` once retired.
    retired: tokio::sync::watch::Sender<bool>,
}

impl Shared {
    /// `sql` prepared on this connection: once, or with `anew` now (after
    /// the table it returns changed), whatever the cache holds.
    async fn prepare(
        &self,
        sql: &'static str,
        anew: bool,
    ) -> Result<Statement, tokio_postgres::Error> {
        if let Some(statement) = self.lock().get(sql).filter(|_| !anew) {
            return Ok(statement.clone());
        }
        let statement = self.client.prepare(sql).await?;
        self.lock().insert(sql, statement.clone());
        Ok(statement)
    }

    /// At most one row of `sql` (prepared here once, and again after the
    /// table it returns changed: `prepared_anew_if_stale`).
    pub async fn query_opt(
        &self,
        sql: &'static str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Option<Row>, StoreError> {
        prepared_anew_if_stale(async |anew| {
            let statement = self.prepare(sql, anew).await?;
            self.client.query_opt(&statement, params).await
        })
        .await
    }

    /// Every row of `sql` (prepared here once, and again after the table it
    /// returns changed).
    pub async fn query(
        &self,
        sql: &'static str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, StoreError> {
        prepared_anew_if_stale(async |anew| {
            let statement = self.prepare(sql, anew).await?;
            self.client.query(&statement, params).await
        })
        .await
    }

    /// Resolves once this connection is retired.
    pub fn retired(&self) -> impl Future<Output = ()> + Send + 'static {
        let mut retired = self.retired.subscribe();
        async move {
            let _ = retired.wait_for(|retired| *retired).await;
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<&'static str, Statement>> {
        self.prepared.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The shared connections, handed out in turn.
pub(super) struct Mux {
    /// How to connect, with PostgreSQL's own limit on each statement a
    /// little under the client's query timeout: a statement that runs too
    /// long is then rolled back by the database itself.
    pg: super::Postgres,
    slots: Vec<RwLock<Option<Arc<Shared>>>>,
    next: AtomicUsize,
}

/// How long a statement on a shared connection waits for a row lock
/// (`lock_timeout`). The coordinator's own statements hold a record's lock
/// for the milliseconds of one function call; only an application's open
/// transaction (a completion in it, `sql/functions/complete_in_tx.sql`,
/// until its COMMIT) or an operator's session holds one longer. A statement
/// that meets such a lock gives up after this long instead of stalling its
/// connection, and every call pipelined behind it, for the whole statement
/// timeout; its batch runs again one call at a time (`batch`), and the one
/// call on the locked record answers UNAVAILABLE with a retry delay.
pub(super) const LOCK_LIMIT: Duration = Duration::from_millis(300);

/// The part of the query timeout a statement may use in PostgreSQL
/// (`statement_timeout`, and the deadline each call's statement carries):
/// the rest is left for the commit and for error in the measured skew
/// between the clocks, so that a statement that would finish after its
/// caller stopped waiting rolls back instead.
pub(super) fn statement_limit(query_timeout: Duration) -> Duration {
    (query_timeout * 9 / 10).max(Duration::from_millis(1))
}

/// The same for a statement sent now whose (first) caller stops waiting at
/// `answer_by`: the earlier of its deadline and the query timeout bounds it.
pub(super) fn statement_limit_until(
    query_timeout: Duration,
    answer_by: Option<tokio::time::Instant>,
) -> Duration {
    statement_limit(answer_by.map_or(query_timeout, |at| {
        at.saturating_duration_since(tokio::time::Instant::now())
            .min(query_timeout)
    }))
}

impl Mux {
    pub fn new(pg: super::Postgres, connections: usize, query_timeout: Duration) -> Self {
        let options = format!(
            "{} -c statement_timeout={} -c lock_timeout={}",
            pg.get_options().unwrap_or_default(),
            statement_limit(query_timeout).as_millis(),
            LOCK_LIMIT.as_millis()
        );
        let mut config = pg.config().clone();
        config.options(options.trim_start());
        Mux {
            pg: pg.with_config(config),
            slots: (0..connections.max(1)).map(|_| RwLock::new(None)).collect(),
            next: AtomicUsize::new(0),
        }
    }

    /// Shared connections configured.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Shared connections connected now (one being connected counts as not).
    pub fn connected(&self) -> usize {
        self.slots
            .iter()
            .filter(|slot| {
                slot.try_read()
                    .is_ok_and(|s| s.as_ref().is_some_and(|s| !s.client.is_closed()))
            })
            .count()
    }

    /// The next connection, connecting it if it is new or has closed; within
    /// `wait` in all, the time spent behind another call that is connecting
    /// the same slot included.
    pub async fn get(&self, wait: Duration) -> Result<Arc<Shared>, StoreError> {
        let slot = self.next.fetch_add(1, Ordering::Relaxed) % self.slots.len();
        self.slot_within(slot, wait).await
    }

    /// Slot `index`'s connection, within `wait` in all.
    pub async fn slot_within(
        &self,
        index: usize,
        wait: Duration,
    ) -> Result<Arc<Shared>, StoreError> {
        tokio::time::timeout(wait, self.get_slot(index, wait))
            .await
            .unwrap_or_else(|_| {
                Err(StoreError::Unavailable(Box::new(ConnectError::timed_out(
                    &self.pg, wait,
                ))))
            })
    }

    async fn get_slot(&self, index: usize, wait: Duration) -> Result<Arc<Shared>, StoreError> {
        let slot = &self.slots[index];
        if let Some(shared) = slot.read().await.as_ref()
            && !shared.client.is_closed()
        {
            return Ok(Arc::clone(shared));
        }
        let mut slot = slot.write().await;
        if let Some(shared) = slot.as_ref()
            && !shared.client.is_closed()
        {
            return Ok(Arc::clone(shared));
        }
        let (client, connection) = tokio::time::timeout(wait, self.pg.connect())
            .await
            .map_err(|_| ConnectError::timed_out(&self.pg, wait))
            .and_then(|connected| connected.map_err(|e| ConnectError::connecting(&self.pg, &e)))
            .map_err(|e| StoreError::Unavailable(Box::new(e)))?;
        tokio::spawn(connection);
        let shared = Arc::new(Shared {
            slot: index,
            client,
            prepared: std::sync::Mutex::new(HashMap::new()),
            retired: tokio::sync::watch::channel(false).0,
        });
        *slot = Some(Arc::clone(&shared));
        Ok(shared)
    }

    /// Stops handing out `shared`, which did not answer in time: the next
    /// call in its slot connects anew. Statements already sent on it finish
    /// or time out on their own; the connection closes when the last of
    /// them lets go of it.
    pub async fn retire(&self, shared: &Arc<Shared>) {
        let mut slot = self.slots[shared.slot].write().await;
        if slot.as_ref().is_some_and(|s| Arc::ptr_eq(s, shared)) {
            *slot = None;
            shared.retired.send_replace(true);
            tracing::warn!(
                connection = shared.slot,
                "a shared database connection stopped answering; replacing it"
            );
        }
    }

    /// `work` on `shared`, or UNAVAILABLE (and `shared` retired) when it
    /// takes longer than `limit`.
    pub async fn in_time<T>(
        &self,
        shared: &Arc<Shared>,
        limit: Duration,
        work: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        match tokio::time::timeout(limit, work).await {
            Ok(done) => done,
            Err(_) => {
                self.retire(shared).await;
                Err(StoreError::Unavailable(Box::new(QueryTimeout(limit))))
            }
        }
    }

    /// Whether every shared connection answers within `limit`: each is
    /// sent an empty query behind whatever is pipelined on it (connecting it
    /// first if it is new or closed). One that does not answer is retired,
    /// so the next call or probe in its slot connects anew.
    pub async fn probe(&self, limit: Duration) -> Result<(), StoreError> {
        let slots = (0..self.slots.len()).map(|index| self.probe_slot(index, limit));
        futures_util::future::join_all(slots)
            .await
            .into_iter()
            .collect()
    }

    /// Probes one slot; a connection that does not answer is retired and
    /// its replacement probed at once, so that a connection silently dropped
    /// while new ones work is replaced without the slot ever reporting a
    /// failure (calls on the new connection are answered).
    async fn probe_slot(&self, index: usize, limit: Duration) -> Result<(), StoreError> {
        let shared = self.slot_within(index, limit).await?;
        let answered = self.ping(&shared, limit).await;
        if answered.is_ok() || !*shared.retired.borrow() {
            return answered;
        }
        // A quarter of the limit: a working database connects and answers in
        // far less, and a cut network is reported barely later.
        let replaced = self.slot_within(index, limit / 4).await?;
        self.ping(&replaced, limit / 4).await
    }

    /// An empty query on `shared`, answered within `limit` (or `shared`
    /// retired).
    async fn ping(&self, shared: &Arc<Shared>, limit: Duration) -> Result<(), StoreError> {
        self.in_time(shared, limit, async {
            Ok(shared.client.batch_execute("").await?)
        })
        .await
    }
}

//! How a statement reaches the database: a call's on a shared, pipelined
//! connection (or queued for a batch), maintenance's on a pooled connection
//! of its own, each within the query timeout. A connection whose statement
//! got no answer in time is not used again: it may be one that silently
//! stopped answering, and the next statement on it would wait as long.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::{Object, Timeouts};
use futures_util::future::Either;
use tokio_postgres::{Row, Statement, types::ToSql};

use super::batch::{self, Call};
use super::clock::Stamp;
use super::connect_error::ConnectError;
use super::error::{PastDeadline, QueryTimeout};
use super::mux::{Mux, prepared_anew_if_stale, statement_limit_until};
use super::shards;
use super::{CallTime, Store, StoreError};

/// `sql` prepared on a pooled connection: taken from its cache, or with
/// `anew` prepared again (after the table it returns changed).
async fn prepared(
    client: &Object,
    sql: &str,
    anew: bool,
) -> Result<Statement, tokio_postgres::Error> {
    if anew {
        client.statement_cache.remove(sql, &[]);
    }
    client.prepare_cached(sql).await
}

pub(crate) fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

impl Store {
    /// How long `time`'s call may wait for a connection now: its own wait
    /// (or the configured one), never past its caller's deadline.
    pub(super) fn connect_wait_of(&self, time: &CallTime) -> Duration {
        let wait = time.connect_wait.unwrap_or(self.connect_wait);
        time.left().map_or(wait, |left| wait.min(left))
    }

    /// A pooled connection, waiting at most as long as `time` allows.
    pub(super) async fn connection(&self, time: CallTime) -> Result<Object, StoreError> {
        let wait = self.connect_wait_of(&time);
        let timeouts = Timeouts {
            wait: Some(wait),
            create: Some(wait),
            recycle: Some(wait),
        };
        self.pool.timeout_get(&timeouts).await.map_err(|e| {
            StoreError::Unavailable(Box::new(ConnectError::from_pool(&self.target, &e, wait)))
        })
    }

    pub(super) async fn query(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
        time: CallTime,
    ) -> Result<Vec<Row>, StoreError> {
        let client = self.connection(time).await?;
        let pooled = &client;
        let run = move |anew| async move {
            let statement = prepared(pooled, sql, anew).await?;
            pooled.query(&statement, params).await
        };
        let answer = tokio::time::timeout(self.query_timeout, prepared_anew_if_stale(run)).await;
        self.answered_in_time(client, answer)
    }

    /// The answer of a statement on a pooled connection, or UNAVAILABLE
    /// when it did not come within the query timeout; the connection then
    /// leaves the pool instead of going back to it.
    pub(super) fn answered_in_time<T>(
        &self,
        client: Object,
        answer: Result<Result<T, StoreError>, tokio::time::error::Elapsed>,
    ) -> Result<T, StoreError> {
        answer.unwrap_or_else(|_| {
            drop(Object::take(client));
            Err(StoreError::Unavailable(Box::new(QueryTimeout(
                self.query_timeout,
            ))))
        })
    }

    /// What a call's statement sent now carries besides its arguments: the
    /// clock offset, and the moment it must have finished by (the query
    /// timeout's limit, or sooner the caller's deadline, each less the
    /// margin `statement_limit` keeps for the commit and the clocks' skew).
    /// A call whose deadline has passed sends nothing.
    pub(super) fn stamp(&self, time: &CallTime) -> Result<Stamp, StoreError> {
        if time.left().is_some_and(|left| left.is_zero()) {
            return Err(StoreError::Unavailable(Box::new(PastDeadline)));
        }
        let limit = statement_limit_until(self.query_timeout, time.answer_by);
        Ok(self.clock.stamp(limit))
    }

    /// One row of a call's statement: pipelined on a shared connection when
    /// those are configured, else on a pooled connection of its own.
    ///
    /// The statement's future (several KB: connection, timeout, prepare and
    /// query states) lives on the heap only while the statement runs, so a
    /// call sleeping in its wait window between statements does not carry it.
    ///
    /// `key` is the key of the record the call concerns: on Citus, when the
    /// server connects to the nodes, the statement goes straight to the
    /// node holding it.
    pub(super) async fn query_one(
        &self,
        key: &str,
        sql: &'static str,
        params: &[&(dyn ToSql + Sync)],
        time: CallTime,
    ) -> Result<Option<Row>, StoreError> {
        Box::pin(self.run_query_one(key, sql, params, time)).await
    }

    pub(super) async fn run_query_one(
        &self,
        key: &str,
        sql: &'static str,
        params: &[&(dyn ToSql + Sync)],
        time: CallTime,
    ) -> Result<Option<Row>, StoreError> {
        if let Some(coordinator) = &self.mux {
            let node = self.node_of_key(coordinator, key);
            let mux = node.as_deref().unwrap_or(coordinator);
            let shared = mux.get(self.connect_wait_of(&time)).await?;
            let query = shared.query_opt(sql, params);
            let by = (time.answer_by, node.is_some());
            return super::batch::in_time_for(mux, &shared, self.query_timeout, by, query).await;
        }
        self.query_one_pooled(sql, params, time).await
    }

    /// One of the hot calls: queued for a batch when batching is on, else
    /// run alone like any other call (on Citus, on the node of its key).
    ///
    /// Not an `async fn`, so that the future the caller awaits holds the
    /// call's arguments only when it runs the statement itself (boxed). A
    /// batched call is queued when this is called, so await what it returns:
    /// a queued call whose future is dropped unpolled still runs.
    pub(super) fn run_call<'a, C: Call>(
        &'a self,
        call: C,
        batch: Option<&batch::Coalescer<C>>,
        time: CallTime,
    ) -> impl Future<Output = Result<Option<Row>, StoreError>> + Send + 'a {
        match batch {
            Some(batch) => {
                Either::Left(batch.run(call, self.connect_wait_of(&time), time.answer_by))
            }
            None => Either::Right(Box::pin(async move {
                let stamp = self.stamp(&time)?;
                self.query_one(
                    call.row_key().2,
                    call.alone(),
                    call.params(&stamp).as_ref(),
                    time,
                )
                .await
            })),
        }
    }

    /// On Citus, the shared connections to the node holding `key`, when
    /// the server connects to the nodes and knows it; the map is read again
    /// in the background when it is due.
    fn node_of_key(&self, coordinator: &Arc<Mux>, key: &str) -> Option<Arc<Mux>> {
        if !self.distributed() {
            return None;
        }
        shards::reread_if_due(&self.routes, coordinator, self.query_timeout);
        self.routes.node_of_key(key)
    }

    /// One row, on a pooled connection of its own: for maintenance, whose
    /// longer statements must not hold up calls pipelined behind them.
    pub(super) async fn query_one_pooled(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
        time: CallTime,
    ) -> Result<Option<Row>, StoreError> {
        let client = self.connection(time).await?;
        let pooled = &client;
        let run = move |anew| async move {
            let statement = prepared(pooled, sql, anew).await?;
            pooled.query_opt(&statement, params).await
        };
        let answer = tokio::time::timeout(self.query_timeout, prepared_anew_if_stale(run)).await;
        self.answered_in_time(client, answer)
    }
}

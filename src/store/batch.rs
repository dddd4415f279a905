//! Group commit for the hot calls: Acquires (and Completes) that reach this
//! server together run as one statement of `sql/0004_batches.sql`, so in one
//! transaction with one commit for all of them.
//!
//! - **Never waits for company.** A few workers per kind take whatever calls
//!   are queued the moment they are free; an idle server runs each call as
//!   soon as it arrives, alone. Batches form only while every worker is busy,
//!   which is exactly when sharing a commit pays.
//! - **Durable before answered.** A caller hears its answer only after the
//!   batch's statement returned, and the statement returns after its commit.
//! - **No deadlocks between batches.** Calls are ordered by (tenant, scope,
//!   key) before they are sent, so every batch locks rows in the same order.
//! - **One call's failure stays its own.** If the batch statement fails with
//!   anything but an unavailable database (a deadlock or serialization
//!   failure included), it rolled back whole, and its calls run again one by
//!   one, each getting its own answer.
//! - **Callers that gave up are skipped**, so a call that timed out in the
//!   queue never takes a lease nobody will hear of.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::{Mutex, mpsc, oneshot};
use tokio_postgres::Row;

use super::StoreError;
use super::clock::Clock;
use super::mux::{Mux, Shared};

/// One call's arguments, owned so it can wait in the queue.
pub(super) trait Call: Send + Sync + Sized + 'static {
    /// The row it concerns: batches lock rows in this order.
    fn row_key(&self) -> (&str, &str, &str);

    /// Runs this call alone; one row, as the single-call function returns it.
    fn one<'a>(
        &'a self,
        shared: &'a Shared,
        clock_offset_ms: i64,
    ) -> impl Future<Output = Result<Option<Row>, StoreError>> + Send + 'a;

    /// Runs `calls` in this order in one statement; every row carries the
    /// position of its call (`ord`, from 1).
    fn many<'a>(
        calls: &'a [&'a Self],
        shared: &'a Shared,
        clock_offset_ms: i64,
    ) -> impl Future<Output = Result<Vec<Row>, StoreError>> + Send + 'a;
}

/// What a batch needs besides its calls.
pub(super) struct Settings {
    pub mux: Arc<Mux>,
    pub clock: Clock,
    /// Batches of one kind running at once.
    pub workers: usize,
    /// Calls in one statement at most.
    pub max_batch: usize,
    pub connect_wait: Duration,
    pub query_timeout: Duration,
}

struct Pending<C> {
    call: C,
    reply: oneshot::Sender<Result<Option<Row>, StoreError>>,
}

/// The queue of one kind of call and the workers that drain it.
pub(super) struct Coalescer<C: Call> {
    queue: mpsc::UnboundedSender<Pending<C>>,
    /// Calls sent and not yet taken by a worker.
    queued: Arc<AtomicUsize>,
    query_timeout: Duration,
}

impl<C: Call> Coalescer<C> {
    /// Starts the workers on the current runtime; they stop when the
    /// coalescer is dropped.
    pub fn start(settings: Settings) -> Self {
        let (queue, receiver) = mpsc::unbounded_channel();
        let receiver = Arc::new(Mutex::new(receiver));
        let query_timeout = settings.query_timeout;
        let queued = Arc::new(AtomicUsize::new(0));
        let settings = Arc::new(settings);
        for _ in 0..settings.workers.max(1) {
            tokio::spawn(work(
                Arc::clone(&receiver),
                Arc::clone(&queued),
                Arc::clone(&settings),
            ));
        }
        Coalescer {
            queue,
            queued,
            query_timeout,
        }
    }

    /// Calls waiting for a batch to take them.
    pub fn queued(&self) -> usize {
        self.queued.load(Ordering::Relaxed)
    }

    /// Queues `call` and waits for its row: at most `wait` for a batch to
    /// take it and the query timeout for the batch to run.
    pub async fn run(&self, call: C, wait: Duration) -> Result<Option<Row>, StoreError> {
        let (reply, answer) = oneshot::channel();
        self.queued.fetch_add(1, Ordering::Relaxed);
        if self.queue.send(Pending { call, reply }).is_err() {
            self.queued.fetch_sub(1, Ordering::Relaxed);
            return Err(StoreError::Unavailable(
                "the server is shutting down".into(),
            ));
        }
        match tokio::time::timeout(wait + self.query_timeout, answer).await {
            Ok(Ok(answer)) => answer,
            Ok(Err(_)) => Err(StoreError::Unavailable(
                "the batch carrying this call was dropped".into(),
            )),
            Err(_) => Err(StoreError::Unavailable(
                "no batch took this call in time".into(),
            )),
        }
    }
}

async fn work<C: Call>(
    receiver: Arc<Mutex<mpsc::UnboundedReceiver<Pending<C>>>>,
    queued: Arc<AtomicUsize>,
    settings: Arc<Settings>,
) {
    let mut batch = Vec::with_capacity(settings.max_batch);
    loop {
        // One worker at a time waits for calls; it takes all that are queued
        // (up to the limit) and leaves the next arrivals to the next worker.
        if receiver
            .lock()
            .await
            .recv_many(&mut batch, settings.max_batch.max(1))
            .await
            == 0
        {
            return;
        }
        queued.fetch_sub(batch.len(), Ordering::Relaxed);
        batch.retain(|p: &Pending<C>| !p.reply.is_closed());
        if !batch.is_empty() {
            run(&settings, &mut batch).await;
        }
        batch.clear();
    }
}

/// Runs the batch and answers every caller in it.
async fn run<C: Call>(settings: &Settings, batch: &mut Vec<Pending<C>>) {
    let shared = match settings.mux.get(settings.connect_wait).await {
        Ok(shared) => shared,
        Err(e) => return fail_all(batch, e),
    };
    let offset = settings.clock.offset_ms();
    let limit = settings.query_timeout;
    if let [alone] = batch.as_mut_slice() {
        let answer = in_time(limit, alone.call.one(&shared, offset)).await;
        return answer_one(batch.pop(), answer);
    }
    batch.sort_by(|a, b| a.call.row_key().cmp(&b.call.row_key()));
    let calls: Vec<&C> = batch.iter().map(|p| &p.call).collect();
    let rows = in_time(limit, C::many(&calls, &shared, offset)).await;
    drop(calls);
    match rows.and_then(|rows| by_position(rows, batch.len())) {
        Ok(rows) => {
            for (pending, row) in batch.drain(..).zip(rows) {
                let _ = pending.reply.send(Ok(row));
            }
        }
        // Running the calls alone would meet the same unavailable database.
        Err(e @ StoreError::Unavailable(_)) if !e.is_conflict() => fail_all(batch, e),
        Err(e) => {
            tracing::warn!(
                calls = batch.len(),
                error = ?e,
                "a batch failed; running its calls one by one"
            );
            for pending in batch.drain(..) {
                let answer = in_time(limit, pending.call.one(&shared, offset)).await;
                answer_one(Some(pending), answer);
            }
        }
    }
}

fn answer_one<C>(pending: Option<Pending<C>>, answer: Result<Option<Row>, StoreError>) {
    if let Some(pending) = pending {
        let _ = pending.reply.send(answer);
    }
}

/// The batch's rows in the order of its calls.
fn by_position(rows: Vec<Row>, calls: usize) -> Result<Vec<Option<Row>>, StoreError> {
    let mut slots: Vec<Option<Row>> = (0..calls).map(|_| None).collect();
    for row in rows {
        let ord: i32 = row.try_get("ord")?;
        let slot = usize::try_from(ord)
            .ok()
            .and_then(|ord| ord.checked_sub(1))
            .and_then(|i| slots.get_mut(i))
            .ok_or_else(|| StoreError::Corrupt(format!("batch row for call {ord}")))?;
        *slot = Some(row);
    }
    Ok(slots)
}

/// Why a call failed with its whole batch; the batch's error is its source,
/// shared by every call of the batch.
#[derive(Debug, thiserror::Error)]
#[error("the batch carrying this call failed")]
struct BatchFailed(#[source] Arc<StoreError>);

/// Every caller of the batch hears that the database is unavailable, with
/// the batch's error as the cause.
fn fail_all<C>(batch: &mut Vec<Pending<C>>, error: StoreError) {
    let error = Arc::new(error);
    for pending in batch.drain(..) {
        let _ = pending
            .reply
            .send(Err(StoreError::Unavailable(Box::new(BatchFailed(
                Arc::clone(&error),
            )))));
    }
}

async fn in_time<T>(
    limit: Duration,
    work: impl Future<Output = Result<T, StoreError>>,
) -> Result<T, StoreError> {
    tokio::time::timeout(limit, work).await.unwrap_or_else(|_| {
        Err(StoreError::Unavailable(Box::new(super::QueryTimeout(
            limit,
        ))))
    })
}

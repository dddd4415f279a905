//! Group commit for the hot calls: Acquires and Completes that reach this
//! server together run as one statement of `sql/functions/batches.sql`, so in one
//! transaction with one commit for all of them. Both kinds share one queue
//! (`calls::HotCall`): a cycle's Acquire and another caller's Complete
//! share a commit.
//!
//! - **Waits for company only behind another batch.** With no batch out,
//!   a worker takes whatever calls are queued the moment they arrive: an
//!   idle server runs each call alone, at once. With one worker (the
//!   default while other replicas share the database) nothing else is
//!   ever out. With more, or with the default while no other replica shares
//!   the database (`company`), the next batch behind
//!   one that is out (on one shared connection, pipelined behind it) goes
//!   once it carries as many calls, if the one ahead has been out only
//!   briefly, or else when the one ahead is answered (`take`): the
//!   database starts it the moment the first commits, and calls still
//!   share commits.
//! - **Durable before answered.** A caller hears its answer only after the
//!   batch's statement returned, and the statement returns after its commit.
//! - **Rows locked in one order.** Calls are ordered by (tenant, scope,
//!   key) before they are sent, so batches lock rows in the same order and
//!   do not deadlock each other; the one exception, a refused success
//!   decided after its batch's successes were recorded, is in
//!   `sql/functions/batches.sql` (a deadlock there is detected, and the
//!   batch's calls run one by one).
//! - **One call's failure stays its own.** If the batch statement fails with
//!   anything but an unavailable database (a deadlock or serialization
//!   failure included), it rolled back whole, and its calls run again one by
//!   one, each getting its own answer.
//! - **Callers that gave up are skipped**, so a call that timed out in the
//!   queue never takes a lease nobody will hear of. A call no worker has
//!   taken within its connect wait hears UNAVAILABLE then, even while every
//!   worker is stuck on a connection that stopped answering; a call a worker
//!   has taken waits for its statement, which carries the moment the worker
//!   stops waiting and rolls back if it finishes later (`sql/functions/deadline.sql`).
//! - **A dead connection holds up only its own batch.** When the connection
//!   a batch runs on is retired (it stopped answering), the batch goes on
//!   waiting for its statement in a task of its own, and its worker takes
//!   the next calls on a new connection.
//! - **On Citus, one statement per node.** A batch's keys live on several
//!   nodes; its calls are split by the node that holds each key's shard
//!   (`shards`), and each group goes out as one routed statement
//!   (`idempotency_call_batch_at`) that Citus delegates whole to that
//!   node: one local transaction and one commit there, the groups of one
//!   batch sent together, each on a shared connection straight to its node
//!   unless the server goes through the coordinator node. A group of one
//!   runs as a single call.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use futures_util::future::{self, Either};
use tokio::time::Instant;

use tokio::sync::{Mutex, mpsc, oneshot};
use tokio_postgres::Row;
use tokio_postgres::types::ToSql;

use super::StoreError;
use super::clock::{Clock, Stamp};
use super::mux::{Mux, Shared};
use super::shards::{self, Routes, ShardMap};

mod company;
mod take;
mod wait;

use company::Company;
pub(super) use company::replicas;
use take::{Flight, take};
pub(crate) use wait::PastDeadline;
pub(super) use wait::in_time_for;

/// One call's arguments, owned so it can wait in the queue.
pub(super) trait Call: Send + Sync + Sized + 'static {
    /// The single-call statement.
    fn alone(&self) -> &'static str;

    /// What metrics count this call's batches as.
    fn kind(&self) -> crate::metrics::BatchKind;

    /// The row it concerns: batches lock rows in this order.
    fn row_key(&self) -> (&str, &str, &str);

    /// The arguments of `alone`.
    fn params<'a>(&'a self, stamp: &'a Stamp) -> impl AsRef<[&'a (dyn ToSql + Sync)]> + Send + 'a;

    /// Runs this call alone; one row, as the single-call function returns it.
    fn one<'a>(
        &'a self,
        shared: &'a Shared,
        stamp: Stamp,
    ) -> impl Future<Output = Result<Option<Row>, StoreError>> + Send + 'a {
        async move {
            shared
                .query_opt(self.alone(), self.params(&stamp).as_ref())
                .await
        }
    }

    /// Runs `calls` in this order in one statement; every row carries the
    /// position of its call (`ord`, from 1). With `route`, the statement is
    /// the batch's routed form, delegated to the node holding that key.
    fn many<'a>(
        calls: &'a [&'a Self],
        route: Option<&'a str>,
        shared: &'a Shared,
        stamp: Stamp,
    ) -> impl Future<Output = Result<Vec<Row>, StoreError>> + Send + 'a;
}

/// What a batch needs besides its calls.
pub(super) struct Settings {
    /// The shared connections the batches' statements run on.
    pub mux: Arc<Mux>,
    /// The database clock (test offset, measured skew), for the stamp each
    /// statement carries.
    pub clock: Clock,
    /// Batches running at once.
    pub workers: usize,
    /// `--batch-workers auto`: two workers whose batches go on the first
    /// shared connection, the second pipelined behind the first only while
    /// no other replica shares the database (`company`).
    pub auto: bool,
    /// Calls in one statement at most.
    pub max_batch: usize,
    /// The longest a batch's statement is waited for; the earliest deadline
    /// of its callers shortens it.
    pub query_timeout: Duration,
    /// Where each key's row lives, on Citus: batches are split by node.
    pub routes: Arc<Routes>,
    /// How long a queued call waits for a worker to take it: on Citus, a
    /// worker waits for a batch's node groups at most half of it, so that
    /// a node that stopped answering does not hold up the calls of the
    /// other nodes queued behind its batch.
    pub connect_wait: Duration,
    /// Where each batch is counted.
    pub metrics: crate::metrics::Metrics,
}

struct Pending<C> {
    call: C,
    /// A call not taken by then is answered UNAVAILABLE instead of run.
    take_by: Instant,
    /// When its caller stops waiting for the answer, if it said: the
    /// statement that carries the call must not commit after it.
    answer_by: Option<Instant>,
    /// Set by whichever comes first: a worker taking the call, or its caller
    /// giving up on a call no worker took by `take_by`.
    claimed: Arc<AtomicBool>,
    reply: oneshot::Sender<Result<Option<Row>, StoreError>>,
    /// The call's span, which learns the size of the statement that
    /// carried it (`batch_size`).
    span: tracing::Span,
}

impl<C> Pending<C> {
    /// Answers the caller with the row of a statement that carried `size`
    /// calls.
    fn answer(self, size: usize, row: Result<Option<Row>, StoreError>) {
        self.span.record("batch_size", size);
        let _ = self.reply.send(row);
    }
}

/// The queue of one kind of call and the workers that drain it.
pub(super) struct Coalescer<C: Call> {
    queue: mpsc::UnboundedSender<Pending<C>>,
    /// Calls sent and not yet taken by a worker.
    queued: Arc<AtomicUsize>,
    /// The batches out, and with `--batch-workers auto` whether they are
    /// pipelined (what the probe's count of replicas sets).
    flight: Arc<Flight>,
}

impl<C: Call> Coalescer<C> {
    /// Starts the workers on the current runtime; they stop when the
    /// coalescer is dropped.
    pub fn start(settings: Settings) -> Self {
        let (queue, receiver) = mpsc::unbounded_channel();
        let receiver = Arc::new(Mutex::new(receiver));
        let queued = Arc::new(AtomicUsize::new(0));
        let settings = Arc::new(settings);
        let metrics = settings.metrics.clone();
        let flight = Arc::new(Flight::new(settings.auto.then(|| Company::new(metrics))));
        for _ in 0..settings.workers.max(1) {
            tokio::spawn(work(
                Arc::clone(&receiver),
                Arc::clone(&queued),
                Arc::clone(&settings),
                Arc::clone(&flight),
            ));
        }
        Coalescer {
            queue,
            queued,
            flight,
        }
    }

    /// Whether batches are pipelined as the replicas counted say
    /// (`--batch-workers auto`).
    pub fn auto(&self) -> bool {
        self.flight.company().is_some()
    }

    /// Learns the replicas a probe counted on the database (or why it
    /// could not count them), and pipelines only while this one is alone.
    pub fn counted(&self, replicas: Result<u64, StoreError>) {
        if let Some(company) = self.flight.company() {
            company.counted(replicas);
        }
    }

    /// Calls waiting for a batch to take them.
    pub fn queued(&self) -> usize {
        self.queued.load(Ordering::Relaxed)
    }

    /// Queues `call` at once and returns the wait for its row. A call no
    /// batch has taken within `wait` is answered UNAVAILABLE then, and never
    /// runs; once taken, the caller waits for its batch, whose run the
    /// worker bounds (and whose statement rolls back if it finishes after
    /// that), rather than give up on a statement that may still commit.
    ///
    /// Not an `async fn`: the call moves into the queue here, so the future
    /// a caller keeps (ten thousand of them in a burst) holds only the
    /// answer's receiver, not the call's arguments as well.
    pub fn run(
        &self,
        call: C,
        wait: Duration,
        answer_by: Option<Instant>,
    ) -> impl Future<Output = Result<Option<Row>, StoreError>> + Send + use<C> {
        let (reply, answer) = oneshot::channel();
        let take_by = Instant::now() + wait;
        let claimed = Arc::new(AtomicBool::new(false));
        let pending = Pending {
            call,
            take_by,
            answer_by,
            claimed: Arc::clone(&claimed),
            reply,
            span: tracing::Span::current(),
        };
        self.queued.fetch_add(1, Ordering::Relaxed);
        let queued = self.queue.send(pending).is_ok();
        if !queued {
            self.queued.fetch_sub(1, Ordering::Relaxed);
        }
        async move {
            if !queued {
                return Err(StoreError::Unavailable(
                    "the server is shutting down".into(),
                ));
            }
            let dropped = |_| {
                Err(StoreError::Unavailable(
                    "the batch carrying this call was dropped".into(),
                ))
            };
            // The timer on the heap: a waiting Acquire's future (ten
            // thousand of them are the server's memory) then holds this
            // branch's state as one pointer.
            let not_taken_in_time = Box::pin(tokio::time::sleep_until(take_by));
            match future::select(answer, not_taken_in_time).await {
                Either::Left((answered, _)) => answered.unwrap_or_else(dropped),
                Either::Right(_) if !claimed.swap(true, Ordering::AcqRel) => Err(not_taken()),
                // A worker took it just now: its statement may commit.
                Either::Right(((), answer)) => answer.await.unwrap_or_else(dropped),
            }
        }
    }
}

async fn work<C: Call>(
    receiver: Arc<Mutex<mpsc::UnboundedReceiver<Pending<C>>>>,
    queued: Arc<AtomicUsize>,
    settings: Arc<Settings>,
    flight: Arc<Flight>,
) {
    let mut batch = Vec::with_capacity(settings.max_batch);
    let max = settings.max_batch.max(1);
    loop {
        if !take(&receiver, &mut batch, max, &flight).await {
            return;
        }
        queued.fetch_sub(batch.len(), Ordering::Relaxed);
        batch.retain(|pending| !pending.claimed.swap(true, Ordering::AcqRel));
        drop_late(&mut batch);
        if batch.is_empty() {
            continue;
        }
        let _in_flight = flight.board(batch.len());
        let map = settings.routes.map();
        if map.is_some() {
            shards::reread_if_due(&settings.routes, &settings.mux, settings.query_timeout);
        }
        if let Some(map) = map.clone().filter(|_| settings.routes.direct()) {
            // Straight to the nodes: nothing goes through the coordinator.
            run_on_nodes(&settings, &mut batch, map).await;
            batch.clear();
            continue;
        }
        let first = settings.auto.then_some(0);
        let Some(shared) = connection(&settings.mux, first, &mut batch).await else {
            continue;
        };
        let retired = shared.retired();
        let mut job = Box::pin({
            let settings = Arc::clone(&settings);
            let mut batch = std::mem::take(&mut batch);
            async move {
                run(&settings, &mut batch, &shared, map.as_deref()).await;
                batch
            }
        });
        tokio::select! {
            biased;
            done = &mut job => batch = done,
            () = retired => {
                // Its connection stopped answering: the batch waits for its
                // statement (its callers hear how that ends, within the
                // query timeout) while this worker takes the next calls on a
                // new connection.
                tokio::spawn(job);
            }
        }
        batch.clear();
    }
}

/// A shared connection for `batch`, waiting for one (when it must connect)
/// no longer than its calls were prepared to wait to be taken: a call whose
/// connect wait runs out meanwhile hears UNAVAILABLE then, not after the
/// wait of a connection attempt begun for calls that came before it. `None`
/// once every call of the batch has been answered. In `slot` if given,
/// else the next in turn.
async fn connection<C>(
    mux: &Mux,
    slot: Option<usize>,
    batch: &mut Vec<Pending<C>>,
) -> Option<Arc<Shared>> {
    loop {
        drop_late(batch);
        let take_by = batch.iter().map(|pending| pending.take_by).min()?;
        let wait = take_by.saturating_duration_since(Instant::now());
        let got = match slot {
            Some(slot) => mux.slot_within(slot, wait).await,
            None => mux.get(wait).await,
        };
        match got {
            Ok(shared) => {
                // (Re)connecting may have taken a while.
                drop_late(batch);
                return (!batch.is_empty()).then_some(shared);
            }
            // The first call's wait ran out: it hears so (`drop_late`), and
            // calls that may still wait try again. A connection refused
            // outright fails them all at once.
            Err(e)
                if Instant::now() >= take_by
                    && batch.iter().any(|p| p.take_by > Instant::now()) =>
            {
                tracing::debug!(error = ?e, "batch: no connection yet");
            }
            Err(e) => {
                fail_all(batch, e);
                return None;
            }
        }
    }
}

/// Drops the calls whose caller gave up, and answers UNAVAILABLE to those
/// that waited longer than they were prepared to for a batch to take them
/// (or whose caller's deadline has passed).
fn drop_late<C>(batch: &mut Vec<Pending<C>>) {
    let now = Instant::now();
    // In place: the calls kept stay in their order.
    let late = |pending: &mut Pending<C>| {
        pending.reply.is_closed()
            || pending.take_by < now
            || pending.answer_by.is_some_and(|at| at <= now)
    };
    for pending in batch.extract_if(.., late) {
        if !pending.reply.is_closed() {
            let _ = pending.reply.send(Err(not_taken()));
        }
    }
}

/// The answer to a call no batch took within its connect wait.
fn not_taken() -> StoreError {
    StoreError::Unavailable("no database connection was free in time for this call".into())
}

/// Runs the batch on `shared` (a connection to the coordinator node) and
/// answers every caller in it: as one statement, or on Citus (`map`) as one
/// routed statement per node, sent together.
async fn run<C: Call>(
    settings: &Settings,
    batch: &mut Vec<Pending<C>>,
    shared: &Arc<Shared>,
    map: Option<&ShardMap>,
) {
    let Some(map) = map else {
        return run_group(settings, &settings.mux, batch, shared, false).await;
    };
    let groups = by_node(map, std::mem::take(batch));
    let groups = groups.into_iter().map(|(_, mut group)| async move {
        run_group(settings, &settings.mux, &mut group, shared, true).await;
    });
    futures_util::future::join_all(groups).await;
}

/// Runs the batch as one statement per node, each on a shared connection
/// straight to its node (keys the map cannot place through the coordinator
/// node), sent together; answers every caller in it. A node that cannot
/// be reached fails only its own calls, and one that stops answering holds
/// up only its own: each group runs in a task of its own, and the worker
/// waits for them at most half the connect wait, after which the groups
/// still out finish (their callers hear how, within the query timeout)
/// while the worker takes the next calls.
async fn run_on_nodes<C: Call>(
    settings: &Arc<Settings>,
    batch: &mut Vec<Pending<C>>,
    map: Arc<ShardMap>,
) {
    let groups = by_node(&map, std::mem::take(batch));
    let groups: Vec<_> = groups
        .into_iter()
        .map(|(node, mut group)| {
            let settings = Arc::clone(settings);
            tokio::spawn(async move {
                let mux = node
                    .and_then(|node| settings.routes.node(node))
                    .unwrap_or_else(|| Arc::clone(&settings.mux));
                if let Some(shared) = connection(&mux, None, &mut group).await {
                    run_group(&settings, &mux, &mut group, &shared, true).await;
                }
            })
        })
        .collect();
    // Dropping a task's handle leaves it running.
    let _ = tokio::time::timeout(settings.connect_wait / 2, future::join_all(groups)).await;
}

/// `batch`'s calls grouped by the node group the map places their keys on
/// (keys it cannot place in a group of their own, with no node), each
/// group in arrival order.
fn by_node<C: Call>(map: &ShardMap, batch: Vec<Pending<C>>) -> Vec<(Option<i32>, Vec<Pending<C>>)> {
    let mut groups: Vec<(Option<i32>, Vec<Pending<C>>)> = Vec::new();
    for pending in batch {
        let node = map.node_of(pending.call.row_key().2);
        match groups
            .iter_mut()
            .find(|(n, _)| node.is_some() && *n == node)
        {
            Some((_, group)) => group.push(pending),
            None => groups.push((node, vec![pending])),
        }
    }
    groups
}

/// Runs one statement's calls (routed by one of their keys when `routed`)
/// and answers every caller in it.
async fn run_group<C: Call>(
    settings: &Settings,
    mux: &Mux,
    batch: &mut Vec<Pending<C>>,
    shared: &Arc<Shared>,
    routed: bool,
) {
    for kind in crate::metrics::BatchKind::ALL {
        let calls = batch.iter().filter(|p| p.call.kind() == kind).count();
        settings.metrics.batch_ran(kind, calls);
    }
    let limit = settings.query_timeout;
    let answer_by = batch.iter().filter_map(|p| p.answer_by).min();
    let stamp = stamp_by(settings, answer_by);
    if batch.len() <= 1 {
        if let Some(alone) = batch.pop() {
            let one = alone.call.one(shared, stamp);
            let answer = in_time_for(mux, shared, limit, (answer_by, routed), one).await;
            alone.answer(1, answer);
        }
        return;
    }
    batch.sort_by(|a, b| a.call.row_key().cmp(&b.call.row_key()));
    let calls: Vec<&C> = batch.iter().map(|p| &p.call).collect();
    let route = calls.first().filter(|_| routed).map(|c| c.row_key().2);
    let many = C::many(&calls, route, shared, stamp);
    let rows = in_time_for(mux, shared, limit, (answer_by, routed), many).await;
    drop(calls);
    let rows = match rows {
        Ok(rows) => rows,
        // Running the calls alone would meet the same unavailable database.
        Err(e @ StoreError::Unavailable(_)) if !e.is_conflict() => return fail_all(batch, e),
        Err(e) => {
            // The statement rolled back whole: every call may run again.
            if e.is_key_created_meanwhile() {
                // Two replicas raced to create one key: expected, and
                // decided when the calls run alone.
                tracing::debug!(
                    calls = batch.len(),
                    error = ?e,
                    "a key of a batch was created meanwhile; running its calls one by one"
                );
            } else {
                let calls = batch.len();
                tracing::warn!(calls, error = ?e, "a batch failed; running its calls one by one");
            }
            // Pipelined together: a call that fails every time costs its
            // batch-mates one more round trip, not one each.
            let alone = batch
                .drain(..)
                .filter(|pending| !pending.reply.is_closed())
                .map(|pending| async move {
                    let stamp = stamp_by(settings, pending.answer_by);
                    let call = pending.call.one(shared, stamp);
                    let by = (pending.answer_by, routed);
                    let answer = in_time_for(mux, shared, limit, by, call).await;
                    pending.answer(1, answer);
                });
            futures_util::future::join_all(alone).await;
            return;
        }
    };
    // The batch has committed: whatever its rows say, it must not run again.
    match by_position(rows, batch.len()) {
        Ok(rows) => {
            let size = batch.len();
            for (pending, row) in batch.drain(..).zip(rows) {
                pending.answer(size, Ok(Some(row)));
            }
        }
        Err(e) => fail_all(batch, e),
    }
}

/// The stamp of a statement sent now for calls the first of whose callers
/// stops waiting at `answer_by`. One caller's short deadline thus bounds its
/// whole batch: a batch that finishes after it rolls back whole, and every
/// call in it hears UNAVAILABLE rather than one call's lease committing
/// unheard.
fn stamp_by(settings: &Settings, answer_by: Option<Instant>) -> Stamp {
    let limit = super::mux::statement_limit_until(settings.query_timeout, answer_by);
    settings.clock.stamp(limit)
}

/// The batch's rows in the order of its calls: exactly one for each call.
fn by_position(rows: Vec<Row>, calls: usize) -> Result<Vec<Row>, StoreError> {
    let mut slots: Vec<Option<Row>> = (0..calls).map(|_| None).collect();
    for row in rows {
        let ord: i32 = row.try_get("ord")?;
        let slot = usize::try_from(ord)
            .ok()
            .and_then(|ord| ord.checked_sub(1))
            .and_then(|i| slots.get_mut(i))
            .filter(|slot| slot.is_none())
            .ok_or_else(|| StoreError::Corrupt(format!("unexpected batch row for call {ord}")))?;
        *slot = Some(row);
    }
    slots
        .into_iter()
        .enumerate()
        .map(|(i, row)| {
            row.ok_or_else(|| StoreError::Corrupt(format!("no batch row for call {}", i + 1)))
        })
        .collect()
}

/// Why a call failed with its whole batch; the batch's error is its source,
/// shared by every call of the batch.
#[derive(Debug, thiserror::Error)]
#[error("the batch carrying this call failed")]
struct BatchFailed(#[source] Arc<StoreError>);

/// Every caller of the batch hears the batch's error: a row that does not
/// match the SQL functions' promise as such, anything else as an unavailable
/// database with the batch's error as the cause.
fn fail_all<C>(batch: &mut Vec<Pending<C>>, error: StoreError) {
    let corrupt = match &error {
        StoreError::Corrupt(what) => Some(what.clone()),
        _ => None,
    };
    let error = Arc::new(error);
    for pending in batch.drain(..) {
        let answer = match &corrupt {
            Some(what) => StoreError::Corrupt(what.clone()),
            None => StoreError::Unavailable(Box::new(BatchFailed(Arc::clone(&error)))),
        };
        let _ = pending.reply.send(Err(answer));
    }
}

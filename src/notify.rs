//! The hub: waiting without holding a database connection. The changes one
//! LISTEN connection per server process hears are fanned out in memory to
//! every waiter of that process; the hub also admits waiters (the waiter
//! limits) and shares one read of a record among the waiters it wakes.
//!
//! A waiter subscribes to its record *before* it reads the record, so a change
//! committed between the read and the wait is not missed. Notifications are
//! only hints: a waiter that wakes re-reads the table, so a lost or spurious
//! notification can delay an answer but never make it wrong. While the
//! listener is disconnected, every topic is announced on a short interval
//! instead, so waiters re-read (sharing each read); when it reconnects every
//! waiter re-reads once (notifications sent while it was away are lost).
//!
//! A sleeping waiter holds a handle on its topic and one change receiver, no
//! copy of the record's id and no timer of the hub's: ten thousand waiters on
//! a process are its main cost in memory.
//!
//! The connection itself is the store's (`store::listener`): `startup` hands
//! its changes to [`Hub::on_change`] and its state to [`Hub::set_connected`].

use std::collections::HashMap;
use std::future::Future;
use std::hash::Hash;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::domain::{Record, RecordId, Refusal, Scope, Tenant, TooManyWaiters, WaiterLimits};
use crate::metrics::{self, Metrics};
use crate::store::{Change, StoreError};

/// How often waiters re-read while the listener is down.
const FALLBACK_POLL: Duration = Duration::from_millis(250);

/// One topic's change counter and how many listen to it.
struct Topic<K, E> {
    /// The topic's key, shared with its subscriptions (which need it to
    /// leave) rather than copied into each.
    key: Arc<K>,
    /// Bumped on every notification for the topic.
    version: watch::Sender<u64>,
    /// Subscriptions alive for the topic; the topic goes with the last.
    subscribers: usize,
    /// What the topic's subscribers share (for records: the latest read).
    shared: E,
}

/// Topics by key (records, or scopes), each alive while subscribed.
struct Topics<K, E> {
    map: Mutex<HashMap<K, Topic<K, E>>>,
}

impl<K: Hash + Eq + Clone, E: Clone + Default> Topics<K, E> {
    fn new() -> Self {
        Topics {
            map: Mutex::new(HashMap::new()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<K, Topic<K, E>>> {
        // A panic while holding this lock cannot leave the map inconsistent
        // (every change is a single insert, remove or counter step).
        self.map.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Joins `key`'s topic, creating it for the first subscriber.
    fn subscribe(&self, key: &K) -> (Arc<K>, watch::Receiver<u64>, E) {
        let mut map = self.lock();
        let topic = map.entry(key.clone()).or_insert_with(|| Topic {
            key: Arc::new(key.clone()),
            version: watch::Sender::new(0),
            subscribers: 0,
            shared: E::default(),
        });
        topic.subscribers += 1;
        (
            Arc::clone(&topic.key),
            topic.version.subscribe(),
            topic.shared.clone(),
        )
    }

    fn unsubscribe(&self, key: &K) {
        let mut map = self.lock();
        if let Some(topic) = map.get_mut(key) {
            topic.subscribers -= 1;
            if topic.subscribers == 0 {
                map.remove(key);
            }
        }
    }

    fn notify(&self, key: &K) {
        if let Some(topic) = self.lock().get(key) {
            topic.version.send_modify(|v| *v = v.wrapping_add(1));
        }
    }

    fn notify_all(&self) {
        for topic in self.lock().values() {
            topic.version.send_modify(|v| *v = v.wrapping_add(1));
        }
    }

    fn len(&self) -> usize {
        self.lock().len()
    }
}

/// A read of the record and the notification version it is fresh for.
#[derive(Default)]
struct Latest {
    /// The version the read started after; `None` before any read.
    version: Option<u64>,
    /// When the read started: while the listener is down no version moves,
    /// so a read is shared only for one polling interval.
    read_at: Option<Instant>,
    /// The record, or `None` when it was not found.
    record: Option<Record>,
}

/// The record as last read after a notification, shared by every waiter of
/// this process, so that a thousand waiters woken together cost one read.
type SharedRead = Arc<tokio::sync::Mutex<Latest>>;

/// A tenant's scope, as the recovery feed follows it.
type ScopeId = (Tenant, Scope);

/// The in-memory fan-out of one server process.
pub struct Hub {
    /// The most waiters allowed.
    limits: WaiterLimits,
    /// Waiters alive per tenant.
    per_tenant: Mutex<HashMap<Tenant, usize>>,
    /// Records somebody on this process waits on.
    records: Topics<RecordId, SharedRead>,
    /// Scopes a recovery feed (WatchDue) of this process follows.
    scopes: Topics<ScopeId, ()>,
    /// Record subscriptions alive now (Acquire waiters and Watch streams).
    waiters: AtomicUsize,
    /// Of those, how many are asleep in `Subscription::changed` right now
    /// (they have read the record and wait for it to change).
    parked: Arc<AtomicUsize>,
    /// Whether the listener is connected and listening (on Citus, on
    /// every node): `listener && nodes`.
    connected: watch::Sender<bool>,
    /// The listener's own session listens.
    listener: std::sync::atomic::AtomicBool,
    /// On Citus, the sessions on the other nodes all listen (always on
    /// plain PostgreSQL).
    nodes: std::sync::atomic::AtomicBool,
    /// Where refused waiters are counted.
    metrics: Metrics,
}

impl Hub {
    pub fn new(limits: WaiterLimits, metrics: Metrics) -> Arc<Self> {
        Arc::new(Hub {
            limits,
            metrics,
            per_tenant: Mutex::new(HashMap::new()),
            records: Topics::new(),
            scopes: Topics::new(),
            waiters: AtomicUsize::new(0),
            parked: Arc::new(AtomicUsize::new(0)),
            connected: watch::Sender::new(false),
            listener: std::sync::atomic::AtomicBool::new(false),
            nodes: std::sync::atomic::AtomicBool::new(true),
        })
    }

    /// The server's metrics, which the hub records into.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    fn per_tenant(&self) -> MutexGuard<'_, HashMap<Tenant, usize>> {
        self.per_tenant.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes a waiter's place for `tenant`, if one is free.
    fn admit(&self, tenant: &Tenant, kind: metrics::Waiter) -> Result<(), TooManyWaiters> {
        let mut per_tenant = self.per_tenant();
        if self.waiters.load(Ordering::SeqCst) >= self.limits.total {
            self.metrics.waiter_refused(kind, false);
            return Err(TooManyWaiters::Server);
        }
        let count = per_tenant.entry(tenant.clone()).or_insert(0);
        if *count >= self.limits.per_tenant {
            self.metrics.waiter_refused(kind, true);
            return Err(TooManyWaiters::Tenant);
        }
        *count += 1;
        self.waiters.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    fn leave(&self, tenant: &Tenant) {
        let mut per_tenant = self.per_tenant();
        if let Some(count) = per_tenant.get_mut(tenant) {
            *count -= 1;
            if *count == 0 {
                per_tenant.remove(tenant);
            }
        }
        self.waiters.fetch_sub(1, Ordering::SeqCst);
    }

    /// Starts listening for changes of `id`, if the waiter limits allow.
    /// Subscribe before reading the record, then wait on the subscription.
    pub fn subscribe(self: &Arc<Self>, id: &RecordId) -> Result<Subscription, TooManyWaiters> {
        self.admit(&id.tenant, metrics::Waiter::Record)?;
        let (id, version, latest) = self.records.subscribe(id);
        Ok(Subscription {
            hub: Arc::clone(self),
            id,
            latest,
            changes: Changes(version),
        })
    }

    /// Starts listening for records of a tenant's scope coming due, if the
    /// waiter limits allow (a recovery feed takes a waiter's place).
    pub fn subscribe_due(
        self: &Arc<Self>,
        tenant: Tenant,
        scope: Scope,
    ) -> Result<DueSubscription, TooManyWaiters> {
        self.admit(&tenant, metrics::Waiter::Due)?;
        let (id, version, ()) = self.scopes.subscribe(&(tenant, scope));
        Ok(DueSubscription {
            hub: Arc::clone(self),
            id,
            changes: Changes(version),
        })
    }

    /// Waiters alive on this process (recovery feeds included).
    pub fn waiters(&self) -> usize {
        self.waiters.load(Ordering::SeqCst)
    }

    /// Waiters asleep until their record changes.
    pub fn parked(&self) -> usize {
        self.parked.load(Ordering::SeqCst)
    }

    /// Records with at least one waiter on this process.
    pub fn watched_records(&self) -> usize {
        self.records.len()
    }

    /// Wakes whoever waits on what `change` names.
    pub fn on_change(&self, change: Change) {
        match change {
            Change::Record(id) => self.records.notify(&id),
            Change::Due(tenant, scope) => self.scopes.notify(&(tenant, scope)),
        }
    }

    /// While the listener is down no notification arrives: announce every
    /// topic each `FALLBACK_POLL` instead, so waiters re-read (one shared
    /// read per record per interval) until it is back. Runs until `stop` is
    /// cancelled, its own task, so that it outlives the listener (stopped
    /// first at shutdown) while calls in flight finish.
    pub async fn poll_while_down(&self, stop: CancellationToken) {
        let mut connected = self.connected.subscribe();
        loop {
            if *connected.borrow_and_update() {
                tokio::select! {
                    () = stop.cancelled() => return,
                    changed = connected.changed() => {
                        if changed.is_err() {
                            return;
                        }
                    }
                }
                continue;
            }
            tokio::select! {
                () = stop.cancelled() => return,
                _ = tokio::time::sleep(FALLBACK_POLL) => {
                    if !*self.connected.borrow() {
                        self.records.notify_all();
                        self.scopes.notify_all();
                    }
                }
                _ = connected.changed() => {}
            }
        }
    }

    /// Whether the listener is connected and listening: while it is not,
    /// waiters poll (`poll_while_down`); when it comes back, every waiter
    /// re-checks.
    pub fn set_connected(&self, connected: bool) {
        self.listener.store(connected, Ordering::Relaxed);
        let all = connected && self.nodes.load(Ordering::Relaxed);
        self.connected.send_replace(all);
        if all {
            // Whatever changed while we were away was not heard: re-check.
            self.records.notify_all();
            self.scopes.notify_all();
        }
    }

    /// On Citus, whether the listener's sessions on the other nodes all
    /// listen: while one does not, its changes are not heard, and waiters
    /// poll as while the listener is down; when all are back, every waiter
    /// re-checks.
    pub fn set_nodes_listened(&self, all: bool) {
        let was = self.nodes.swap(all, Ordering::Relaxed);
        if was == all {
            return;
        }
        self.set_connected(self.listener.load(Ordering::Relaxed));
    }
}

/// What wakes a subscriber: its topic's version, bumped on a notification,
/// or while the listener is down on a short interval (`poll_while_down`).
struct Changes(watch::Receiver<u64>);

impl Changes {
    async fn changed(&mut self) {
        // The sender lives in the topic, which outlives its subscriptions; if
        // it were gone, nothing could wake this subscriber again.
        if self.0.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

/// One waiter's interest in one record; dropping it (the call ended or was
/// cancelled) unregisters it at once.
pub struct Subscription {
    hub: Arc<Hub>,
    id: Arc<RecordId>,
    latest: SharedRead,
    changes: Changes,
}

impl Subscription {
    /// The record as it stands since the latest notification: read with
    /// `fetch` by the first waiter of this process to ask, and shared with
    /// the others woken by the same notification. `None` when there is no
    /// record. A shared read older than `seen` (the `updated_at` of the
    /// newest state this waiter already knows) is never returned: the waiter
    /// reads afresh instead, so answers never go backwards.
    pub async fn read_shared<F, Fut>(
        &mut self,
        seen: Option<DateTime<Utc>>,
        fetch: F,
    ) -> Result<Option<Record>, StoreError>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<Record, StoreError>>,
    {
        // Read after this version was announced, so at least that fresh.
        let version = *self.changes.0.borrow_and_update();
        let listening = *self.hub.connected.borrow();
        let mut latest = self.latest.lock().await;
        let current = latest.version == Some(version)
            && (listening
                || latest
                    .read_at
                    .is_some_and(|at| at.elapsed() < FALLBACK_POLL));
        let not_older = match (seen, &latest.record) {
            (None, _) => true,
            (Some(seen), Some(record)) => record.updated_at >= seen,
            (Some(_), None) => false,
        };
        if current && not_older {
            return Ok(latest.record.clone());
        }
        let read_at = Instant::now();
        let record = match fetch().await {
            Ok(record) => Some(record),
            Err(StoreError::Refused(Refusal::NotFound)) => None,
            Err(e) => return Err(e),
        };
        *latest = Latest {
            version: Some(version),
            read_at: Some(read_at),
            record: record.clone(),
        };
        Ok(record)
    }

    /// Resolves when the record may have changed: on a notification, or every
    /// short interval while the listener is down.
    pub async fn changed(&mut self) {
        let _parked = Parked::new(&self.hub.parked);
        self.changes.changed().await;
    }
}

/// Counts a waiter as parked for as long as it lives (also when the waiting
/// future is dropped mid-sleep).
struct Parked(Arc<AtomicUsize>);

impl Parked {
    fn new(count: &Arc<AtomicUsize>) -> Self {
        count.fetch_add(1, Ordering::SeqCst);
        Parked(Arc::clone(count))
    }
}

impl Drop for Parked {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.hub.records.unsubscribe(&self.id);
        self.hub.leave(&self.id.tenant);
    }
}

/// A recovery feed's interest in one tenant's scope.
pub struct DueSubscription {
    hub: Arc<Hub>,
    id: Arc<ScopeId>,
    changes: Changes,
}

impl DueSubscription {
    /// Resolves when the sweeper announces due records in the scope (or
    /// every short interval while the listener is down).
    pub async fn announced(&mut self) {
        self.changes.changed().await;
    }
}

impl Drop for DueSubscription {
    fn drop(&mut self) {
        self.hub.scopes.unsubscribe(&self.id);
        self.hub.leave(&self.id.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::Key;

    fn record() -> RecordId {
        RecordId {
            tenant: Tenant::new("t"),
            scope: Scope::try_from("s".to_owned()).unwrap(),
            key: Key::try_from("k".to_owned()).unwrap(),
        }
    }

    /// Whether `subscription` is woken within `within` (of the paused clock).
    async fn woken(subscription: &mut Subscription, within: Duration) -> bool {
        tokio::time::timeout(within, subscription.changed())
            .await
            .is_ok()
    }

    #[tokio::test(start_paused = true)]
    async fn while_the_listener_is_down_waiters_are_woken_to_poll_and_only_then() {
        let hub = Hub::new(
            WaiterLimits {
                total: 10,
                per_tenant: 10,
            },
            Metrics::new(),
        );
        let mut subscription = hub.subscribe(&record()).unwrap();
        let stop = CancellationToken::new();
        let polling = tokio::spawn({
            let hub = Arc::clone(&hub);
            let stop = stop.clone();
            async move { hub.poll_while_down(stop).await }
        });

        // Down, as before the first connection: woken every interval.
        for _ in 0..3 {
            assert!(woken(&mut subscription, FALLBACK_POLL * 2).await);
        }
        // Connected: woken once to re-check, then only by notifications.
        hub.set_connected(true);
        assert!(woken(&mut subscription, FALLBACK_POLL).await);
        assert!(!woken(&mut subscription, FALLBACK_POLL * 20).await);
        hub.records.notify(&record());
        assert!(woken(&mut subscription, Duration::ZERO).await);
        // Down again: polling resumes.
        hub.set_connected(false);
        assert!(woken(&mut subscription, FALLBACK_POLL * 2).await);
        stop.cancel();
        polling.await.unwrap();
    }

    #[test]
    fn waiters_share_their_topic_and_the_last_to_leave_removes_it() {
        let hub = Hub::new(
            WaiterLimits {
                total: 10,
                per_tenant: 10,
            },
            Metrics::new(),
        );
        let first = hub.subscribe(&record()).unwrap();
        let second = hub.subscribe(&record()).unwrap();
        assert!(Arc::ptr_eq(&first.id, &second.id), "one copy of the id");
        assert_eq!((hub.waiters(), hub.watched_records()), (2, 1));
        drop(first);
        assert_eq!((hub.waiters(), hub.watched_records()), (1, 1));
        drop(second);
        assert_eq!((hub.waiters(), hub.watched_records()), (0, 0));
    }
}

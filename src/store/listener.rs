//! The database's side of waiting: one `LISTEN` connection per server
//! process, which hears the notifications the SQL functions send and reads
//! the database's clock every interval (`SELECT clock_timestamp()`,
//! prepared once per connection), which also shows that the database
//! answers and gives [`Clock`] the skew between its clock and this host's.
//!
//! On a Citus coordinator it also listens on every other node of the
//! cluster, where the delegated functions run and notify. Those sessions
//! live beside the coordinator's, each replaced on its own every interval
//! while it is lost; whether each listens goes out on a second channel
//! ([`Listener::nodes`]): waiters poll while any is lost, and readiness
//! follows the coordinator's session alone (a worker down makes its keys'
//! calls fail, the same in every replica: taking every replica out of
//! service for it would fail the other workers' keys too).
//!
//! Its errors are tokio-postgres errors, whose text carries their cause.
//!
//! It knows nothing of who waits: notifications go to the `on_change`
//! callback as [`Change`]s, and whether it is listening goes out on a
//! `watch` channel, which `startup` maps onto readiness and the hub. It runs
//! until its stop token is cancelled.

use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_postgres::AsyncMessage;
use tokio_util::sync::CancellationToken;

use super::clock::Clock;
use super::connect_error::ConnectError;
use crate::domain::{Key, RecordId, Scope, Tenant};
use crate::metrics::Metrics;

/// The channel the SQL functions notify a watched record's change on
/// (payload: tenant, scope and key, one a line).
const CHANGES: &str = "idempotency_changes";
/// The channel the SQL functions notify a newly due record on (payload:
/// tenant and scope, one a line).
const DUE: &str = "idempotency_due";

/// What a notification says changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// A record somebody waits on changed.
    Record(RecordId),
    /// A record of this tenant's scope came due for a retry.
    Due(Tenant, Scope),
}

impl Change {
    /// Reads a notification on `channel` with `payload` (lines as the SQL
    /// functions write them); `None` when it is not one of ours.
    fn parse(channel: &str, payload: &str) -> Option<Change> {
        let mut parts = payload.splitn(3, '\n');
        let tenant = Tenant::new(parts.next()?);
        let scope = Scope::try_from(parts.next()?.to_owned()).ok()?;
        match (channel, parts.next()) {
            (CHANGES, Some(key)) => Some(Change::Record(RecordId {
                tenant,
                scope,
                key: Key::try_from(key.to_owned()).ok()?,
            })),
            (DUE, None) => Some(Change::Due(tenant, scope)),
            _ => None,
        }
    }
}

/// The database listener, ready to run: [`Listener::run`] keeps it until
/// its stop token is cancelled.
pub struct Listener {
    pg: super::Postgres,
    interval: Duration,
    clock: Clock,
    on_change: Arc<dyn Fn(Change) + Send + Sync>,
    /// `true` while connected, listening and reading the clock on time.
    state: watch::Sender<bool>,
    /// On Citus, each other node (host:port) and whether its session
    /// listens.
    nodes: watch::Sender<NodeStates>,
    /// Where whether it listens is exported.
    metrics: Metrics,
}

/// Each other node of a Citus cluster (host:port) and whether the
/// listener's session on it listens; empty on plain PostgreSQL.
pub type NodeStates = Vec<(String, bool)>;

impl Listener {
    /// A listener that, once running, keeps a connection to `pg`,
    /// reconnecting every `interval`, and hands every notification to
    /// `on_change`; whether it listens is exported in `metrics`.
    pub fn new(
        pg: super::Postgres,
        interval: Duration,
        clock: Clock,
        metrics: Metrics,
        on_change: impl Fn(Change) + Send + Sync + 'static,
    ) -> Listener {
        Listener {
            pg,
            interval,
            clock,
            on_change: Arc::new(on_change),
            state: watch::Sender::new(false),
            nodes: watch::Sender::new(Vec::new()),
            metrics,
        }
    }

    /// On Citus, whether the session on each other node listens (the
    /// coordinator's own is [`Listener::listening`]). Closes when the
    /// listener stops.
    pub fn nodes(&self) -> watch::Receiver<NodeStates> {
        self.nodes.subscribe()
    }

    /// Whether it is listening: `true` while connected, listening and
    /// reading the clock on time. Closes when the listener stops.
    pub fn listening(&self) -> watch::Receiver<bool> {
        self.state.subscribe()
    }

    /// Listens until `stop` is cancelled; the session in progress is then
    /// dropped, which closes its connection.
    ///
    /// Attempts every interval, without a growing back-off: one connection
    /// attempt a second costs the database nothing, and readiness comes
    /// back within about an interval of the database answering again.
    ///
    /// A session that went silent (a connection dropped by a NAT or a
    /// firewall, while new ones work) is replaced at once, within half an
    /// interval, before readiness says anything: losing one costs readiness
    /// nothing. The new session's start wakes every waiter to re-check what
    /// the lost one may not have heard. A session the database ended (a
    /// restart, a terminated backend) is down until a new one listens.
    pub async fn run(self, stop: CancellationToken) {
        let Listener {
            pg,
            interval,
            clock,
            on_change,
            state,
            nodes,
            metrics,
        } = self;
        let mut reported = false;
        let mut at_once = false;
        loop {
            let connect_within = if at_once { interval / 2 } else { interval * 2 };
            let session = listen_once(
                &pg,
                (&state, &nodes),
                interval,
                connect_within,
                &clock,
                (&on_change, &metrics),
            );
            let (why, ended) = tokio::select! {
                () = stop.cancelled() => return,
                ended = session => ended,
            };
            let was_listening = ended != Ended::NeverListened;
            // Silent implies it had listened: no loop without a session.
            if ended == Ended::Silent {
                tracing::info!(reason = %why, "database listener's session went silent; connecting again");
                at_once = true;
                continue;
            }
            if ended == Ended::NodesChanged {
                tracing::info!(reason = %why, "listening on the cluster's nodes as they are now");
                at_once = true;
                continue;
            }
            at_once = false;
            state.send_replace(false);
            nodes.send_modify(|nodes| nodes.iter_mut().for_each(|(_, up)| *up = false));
            metrics.listener_connected(false);
            if was_listening {
                reported = false;
            }
            if reported {
                tracing::debug!(reason = %why, "database listener still down");
            } else {
                tracing::warn!(reason = %why, "database listener down: not ready, waiters poll");
                reported = true;
            }
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(interval) => {}
            }
        }
    }
}

/// Asks the database for its clock with `read`, which also shows that it
/// answers, and records the skew between its clock and ours.
async fn read_clock(
    client: &tokio_postgres::Client,
    read: &tokio_postgres::Statement,
    clock: &Clock,
) -> Result<(), tokio_postgres::Error> {
    let before = Utc::now();
    let row = client.query_one(read, &[]).await?;
    let after = Utc::now();
    clock.measured(row.try_get(0)?, before, after);
    Ok(())
}

/// How a listener's session ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ended {
    /// Before it listened (no connection, LISTEN refused, ...).
    NeverListened,
    /// The database ended it or a check failed.
    Failed,
    /// A check got no answer in time.
    Silent,
    /// A Citus node was added or removed: a new session listens on the
    /// nodes as they are now.
    NodesChanged,
}

/// One connected session: LISTEN, then read the clock every `interval`
/// until something fails. Returns why it ended, and whether it got as far
/// as listening.
async fn listen_once(
    pg: &super::Postgres,
    (state, node_states): (&watch::Sender<bool>, &watch::Sender<NodeStates>),
    interval: Duration,
    connect_within: Duration,
    clock: &Clock,
    (on_change, metrics): (&Arc<dyn Fn(Change) + Send + Sync>, &Metrics),
) -> (String, Ended) {
    let connect = tokio::time::timeout(connect_within, pg.connect()).await;
    let (client, connection) = match connect {
        Ok(Ok(pair)) => pair,
        Ok(Err(e)) => {
            return (
                ConnectError::connecting(pg, &e).to_string(),
                Ended::NeverListened,
            );
        }
        Err(_) => {
            return (
                ConnectError::timed_out(pg, connect_within).to_string(),
                Ended::NeverListened,
            );
        }
    };
    let driver = deliver(connection, Arc::clone(on_change));
    if let Err(e) = client
        .batch_execute(&format!("LISTEN {CHANGES}; LISTEN {DUE}"))
        .await
    {
        driver.abort();
        return (format!("LISTEN failed: {}", e), Ended::NeverListened);
    }
    let mut nodes = match listen_on_other_nodes(pg, &client, connect_within, on_change).await {
        Ok(nodes) => nodes,
        Err(why) => {
            driver.abort();
            return (why, Ended::NeverListened);
        }
    };
    let read = match client.prepare("SELECT clock_timestamp()").await {
        Ok(read) => read,
        Err(e) => {
            driver.abort();
            return (
                format!("preparing the check failed: {}", e),
                Ended::NeverListened,
            );
        }
    };
    if let Err(e) = read_clock(&client, &read, clock).await {
        driver.abort();
        return (
            format!("reading the clock failed: {}", e),
            Ended::NeverListened,
        );
    }
    if let Some(nodes) = &nodes {
        node_states.send_replace(states(nodes));
    }
    state.send_replace(true);
    metrics.listener_connected(true);
    tracing::info!("listening for changes; ready");
    let ended = loop {
        tokio::time::sleep(interval).await;
        match tokio::time::timeout(interval, read_clock(&client, &read, clock)).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => break (format!("check failed: {}", e), Ended::Failed),
            Err(_) => {
                break (
                    format!("check took longer than {interval:?}"),
                    Ended::Silent,
                );
            }
        }
        let Some(nodes) = &mut nodes else { continue };
        check_nodes(nodes, interval, on_change).await;
        node_states.send_if_modified(|now| {
            let then = std::mem::replace(now, states(nodes));
            *now != then
        });
        if let Some(why) = nodes_changed(&client, nodes).await {
            break (why, Ended::NodesChanged);
        }
    };
    driver.abort();
    for node in nodes.into_iter().flatten() {
        if let Some(session) = node.session {
            session.driver.abort();
        }
    }
    ended
}

/// Hands every notification `connection` receives to `on_change`, until
/// the connection ends (then the task ends).
fn deliver(
    mut connection: tokio_postgres::Connection<tokio_postgres::Socket, super::postgres::PgStream>,
    on_change: Arc<dyn Fn(Change) + Send + Sync>,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            match std::future::poll_fn(|cx| connection.poll_message(cx)).await {
                Some(Ok(AsyncMessage::Notification(n))) => {
                    match Change::parse(n.channel(), n.payload()) {
                        Some(change) => on_change(change),
                        None => tracing::warn!(
                            channel = n.channel(),
                            "ignoring a malformed notification"
                        ),
                    }
                }
                Some(Ok(_)) => {}
                Some(Err(_)) | None => return,
            }
        }
    })
}

/// A LISTEN session on another node of a Citus cluster.
struct NodeSession {
    client: tokio_postgres::Client,
    driver: JoinHandle<()>,
}

/// Another node of a Citus cluster and its session, if it listens.
struct Node {
    /// host:port, for messages and health.
    name: String,
    pg: super::Postgres,
    session: Option<NodeSession>,
}

/// Whether each node listens.
fn states(nodes: &[Node]) -> NodeStates {
    nodes
        .iter()
        .map(|node| (node.name.clone(), node.session.is_some()))
        .collect()
}

/// On a Citus coordinator, a LISTEN session on each other node of the
/// cluster (`pg_dist_node`): the functions run on the node that holds the
/// key's row, and a NOTIFY reaches only that node's listeners. `None` on
/// plain PostgreSQL. A node that cannot be listened on now is tried again
/// at every check ([`check_nodes`]). A node added or removed later ends
/// the session ([`nodes_changed`]), and the next one listens on the new
/// set.
async fn listen_on_other_nodes(
    pg: &super::Postgres,
    client: &tokio_postgres::Client,
    connect_within: Duration,
    on_change: &Arc<dyn Fn(Change) + Send + Sync>,
) -> Result<Option<Vec<Node>>, String> {
    let nodes = match super::citus::present(client).await {
        Ok(true) => super::citus::other_nodes(client).await,
        Ok(false) => return Ok(None),
        Err(e) => Err(e),
    }
    .map_err(|e| format!("reading the Citus nodes failed: {e}"))?;
    let mut listening = Vec::with_capacity(nodes.len());
    for (host, port) in nodes {
        let mut node = Node {
            name: format!("{host}:{port}"),
            pg: pg.for_node(&host, port),
            session: None,
        };
        match listen_on(&node, connect_within, on_change).await {
            Ok(session) => node.session = Some(session),
            Err(why) => {
                tracing::warn!(node = node.name, reason = %why, "not listening on this node: its waiters poll");
            }
        }
        listening.push(node);
    }
    Ok(Some(listening))
}

/// A LISTEN session on `node`, within `connect_within`.
async fn listen_on(
    node: &Node,
    connect_within: Duration,
    on_change: &Arc<dyn Fn(Change) + Send + Sync>,
) -> Result<NodeSession, String> {
    let listened = async {
        let (client, connection) = node
            .pg
            .connect()
            .await
            .map_err(|e| ConnectError::connecting(&node.pg, &e).to_string())?;
        let driver = deliver(connection, Arc::clone(on_change));
        match client
            .batch_execute(&format!("LISTEN {CHANGES}; LISTEN {DUE}"))
            .await
        {
            Ok(()) => Ok(NodeSession { client, driver }),
            Err(e) => {
                driver.abort();
                Err(format!("LISTEN failed: {e}"))
            }
        }
    };
    tokio::time::timeout(connect_within, listened)
        .await
        .unwrap_or_else(|_| Err(format!("connecting took longer than {connect_within:?}")))
}

/// Checks each node's session (it ended, or did not answer within
/// `interval`: lost) and tries once to listen again on each node without
/// one, within half an interval.
async fn check_nodes(
    nodes: &mut [Node],
    interval: Duration,
    on_change: &Arc<dyn Fn(Change) + Send + Sync>,
) {
    for node in nodes.iter_mut() {
        if let Some(session) = &node.session {
            let answered = tokio::time::timeout(interval, session.client.simple_query("")).await;
            let lost = match answered {
                Ok(Ok(_)) if !session.driver.is_finished() => None,
                Ok(Ok(_)) | Ok(Err(_)) => Some("its session ended".to_owned()),
                Err(_) => Some(format!(
                    "its session took longer than {interval:?} to answer"
                )),
            };
            if let Some(why) = lost {
                if let Some(session) = node.session.take() {
                    session.driver.abort();
                }
                tracing::warn!(node = node.name, reason = %why, "lost the listening session on this node: its waiters poll");
            }
        }
        if node.session.is_none()
            && let Ok(session) = listen_on(node, interval / 2, on_change).await
        {
            tracing::info!(node = node.name, "listening on this node again");
            node.session = Some(session);
        }
    }
}

/// Whether the cluster's other nodes are no longer those `nodes` listens
/// on (a worker added, removed or moved), read from the coordinator's
/// metadata; why, if so.
async fn nodes_changed(client: &tokio_postgres::Client, nodes: &[Node]) -> Option<String> {
    let now = match super::citus::other_nodes(client).await {
        Ok(now) => now,
        Err(e) => return Some(format!("reading the Citus nodes failed: {e}")),
    };
    let listened = nodes.iter().map(|node| node.name.as_str());
    let same = now.len() == nodes.len()
        && now
            .iter()
            .map(|(host, port)| format!("{host}:{port}"))
            .zip(listened)
            .all(|(now, listened)| now == listened);
    (!same).then(|| "the cluster's nodes changed".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notifications_read_as_changes_and_anything_else_is_refused() {
        assert_eq!(
            Change::parse(CHANGES, "t\ns\nk"),
            Some(Change::Record(RecordId {
                tenant: Tenant::new("t"),
                scope: Scope::try_from("s".to_owned()).unwrap(),
                key: Key::try_from("k".to_owned()).unwrap(),
            }))
        );
        assert_eq!(
            Change::parse(DUE, "t\ns"),
            Some(Change::Due(
                Tenant::new("t"),
                Scope::try_from("s".to_owned()).unwrap()
            ))
        );
        for (channel, payload) in [(CHANGES, "t\ns"), (DUE, "t\ns\nk"), ("other", "t\ns\nk")] {
            assert_eq!(
                Change::parse(channel, payload),
                None,
                "{channel} {payload:?}"
            );
        }
    }
}

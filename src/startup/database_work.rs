//! What runs once the database is ready, under the supervisor until the
//! drain: the listener (changes to the hub), the probe of the connections
//! calls use, readiness following both, and the sweeper (and with it the
//! recovery webhook).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tonic_health::server::HealthReporter;

use super::background::{Supervisor, Until};
use crate::config::ServeConfig;
use crate::metrics::Metrics;
use crate::notify::Hub;
use crate::proto::coordinator_server::CoordinatorServer;
use crate::recovery::{Webhook, WebhookConfig};
use crate::service::CoordinatorService;
use crate::store::listener::{Listener, NodeStates};
use crate::store::{Store, probe::Probe};
use crate::sweeper::{self, SweepTotals, Sweeper};
use tonic_health::ServingStatus;

/// Everything the database work needs, gathered before the database is
/// ready.
pub(super) struct DatabaseWork {
    /// Hears the listener's changes, and whether it listens.
    hub: Arc<Hub>,
    /// Where readiness is said.
    reporter: HealthReporter,
    /// Probed, and the source of the clock the listener measures.
    store: Store,
    sweeper: Sweeper,
    sweep_totals: Arc<SweepTotals>,
    /// How often the listener and the probe check the database.
    health_interval: Duration,
    /// How often the sweeper sweeps; zero: never.
    sweep_interval: Duration,
    webhook: Option<WebhookConfig>,
}

impl DatabaseWork {
    /// The database work as `config` sets it.
    pub(super) fn new(
        config: &ServeConfig,
        hub: Arc<Hub>,
        reporter: HealthReporter,
        store: Store,
        sweeper: Sweeper,
        sweep_totals: Arc<SweepTotals>,
    ) -> DatabaseWork {
        DatabaseWork {
            hub,
            reporter,
            store,
            sweeper,
            sweep_totals,
            health_interval: config.health_interval,
            sweep_interval: config.sweep_interval,
            webhook: config.webhook.clone(),
        }
    }

    /// Starts the listener on `pg`, the probe, readiness and (unless its
    /// interval is zero) the sweeper, each ending when the drain begins.
    pub(super) fn start(self, pg: crate::store::Postgres, background: &mut Supervisor) {
        let DatabaseWork {
            hub,
            reporter,
            store,
            sweeper,
            sweep_totals,
            health_interval,
            sweep_interval,
            webhook,
        } = self;
        let metrics = store.metrics().clone();
        let listener = Listener::new(
            pg,
            health_interval,
            store.clock().clone(),
            metrics.clone(),
            {
                let hub = Arc::clone(&hub);
                move |change| hub.on_change(change)
            },
        );
        let probe = Probe::new(store, health_interval);
        let (listening, nodes, answering) =
            (listener.listening(), listener.nodes(), probe.answering());
        background.spawn("database listener", Until::Drain, |stop| listener.run(stop));
        background.spawn("database probe", Until::Drain, |stop| probe.run(stop));
        background.spawn("Citus nodes' health", Until::Drain, |stop| {
            follow_nodes(nodes, Arc::clone(&hub), reporter.clone(), stop)
        });
        background.spawn("readiness", Until::Drain, |stop| {
            follow_database(listening, answering, (hub, metrics), reporter, stop)
        });
        if !sweep_interval.is_zero() {
            background.spawn("sweeper", Until::Drain, |stop| {
                sweeper::run(
                    sweeper,
                    sweep_interval,
                    sweep_totals,
                    webhook.map(Webhook::start),
                    stop,
                )
            });
        }
    }
}

/// Maps the database's state onto readiness until `stop` is cancelled, or
/// until `stop`: `idempotency.v1.Coordinator` is SERVING only while the
/// listener is connected, listening and reading the database's clock on
/// time, and the connections calls use answer the probe. The hub follows
/// the listener alone (waiters poll while it is down). Should the listener
/// or the probe end without being asked (the supervisor logs which),
/// nothing would say the database is up any more: the replica then says it
/// is not ready, for good, and its waiters poll.
async fn follow_database(
    mut listening: watch::Receiver<bool>,
    mut answering: watch::Receiver<bool>,
    (hub, metrics): (Arc<Hub>, Metrics),
    reporter: HealthReporter,
    stop: CancellationToken,
) {
    loop {
        let notified = *listening.borrow_and_update();
        hub.set_connected(notified);
        let up = notified && *answering.borrow_and_update();
        metrics.ready(up);
        if up {
            reporter
                .set_serving::<CoordinatorServer<CoordinatorService>>()
                .await;
        } else {
            reporter
                .set_not_serving::<CoordinatorServer<CoordinatorService>>()
                .await;
        }
        let changed = tokio::select! {
            () = stop.cancelled() => return,
            changed = listening.changed() => changed,
            changed = answering.changed() => changed,
        };
        if changed.is_err() {
            if !stop.is_cancelled() {
                hub.set_connected(false);
                metrics.ready(false);
                reporter
                    .set_not_serving::<CoordinatorServer<CoordinatorService>>()
                    .await;
            }
            return;
        }
    }
}

/// The health service's name for the listening session on another node of
/// a Citus cluster (host:port).
pub fn node_service(node: &str) -> String {
    format!("idempotency.v1.Coordinator/citus-node/{node}")
}

/// On Citus, says in the health service whether the listener's session on
/// each other node listens (SERVING or NOT_SERVING under
/// [`node_service`]'s name), and has waiters poll while any does not:
/// changes on that node are not heard meanwhile. Readiness itself follows
/// the coordinator node (`follow_database`).
async fn follow_nodes(
    mut nodes: watch::Receiver<NodeStates>,
    hub: Arc<Hub>,
    reporter: HealthReporter,
    stop: CancellationToken,
) {
    loop {
        let states = nodes.borrow_and_update().clone();
        hub.set_nodes_listened(states.iter().all(|(_, up)| *up));
        for (node, up) in &states {
            let status = if *up {
                ServingStatus::Serving
            } else {
                ServingStatus::NotServing
            };
            reporter
                .set_service_status(node_service(node), status)
                .await;
        }
        tokio::select! {
            () = stop.cancelled() => return,
            changed = nodes.changed() => if changed.is_err() { return },
        }
    }
}

#[cfg(test)]
mod tests {
    use tonic_health::pb::HealthCheckRequest;
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::health_server::Health as _;
    use tonic_health::server::{HealthReporter, HealthService};

    use super::*;
    use crate::domain::WaiterLimits;

    #[tokio::test]
    async fn readiness_falls_when_the_listener_ends_unasked_and_not_at_a_stop() {
        for asked in [false, true] {
            let reporter = HealthReporter::new();
            let service = HealthService::from_health_reporter(reporter.clone());
            let hub = Hub::new(
                WaiterLimits {
                    total: 10,
                    per_tenant: 10,
                },
                crate::metrics::Metrics::new(),
            );
            let (listening, listening_rx) = watch::channel(true);
            let (_answering, answering_rx) = watch::channel(true);
            let stop = CancellationToken::new();
            let follow = tokio::spawn(follow_database(
                listening_rx,
                answering_rx,
                (Arc::clone(&hub), hub.metrics().clone()),
                reporter,
                stop.clone(),
            ));
            let check = || async {
                let request = tonic::Request::new(HealthCheckRequest {
                    service: "idempotency.v1.Coordinator".to_owned(),
                });
                // Not registered until the first status is said.
                match service.check(request).await {
                    Ok(answer) => answer.into_inner().status(),
                    Err(_) => ServingStatus::Unknown,
                }
            };
            let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
            while check().await != ServingStatus::Serving {
                assert!(tokio::time::Instant::now() < deadline, "never SERVING");
                tokio::task::yield_now().await;
            }
            if asked {
                stop.cancel();
            }
            drop(listening);
            follow.await.unwrap();
            let expected = if asked {
                ServingStatus::Serving
            } else {
                ServingStatus::NotServing
            };
            assert_eq!(check().await, expected, "asked to stop: {asked}");
        }
    }
}

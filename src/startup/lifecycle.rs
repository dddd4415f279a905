//! A serving server's life, from its ports open to its drain: waiting for
//! the database (unless it was ready), then the database work and the
//! Coordinator's gate opened, serving until shutdown, and the drain.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tonic_health::ServingStatus;
use tonic_health::server::HealthReporter;

use super::StartupError;
use super::background::Supervisor;
use super::database::wait_for_database;
use super::database_work::DatabaseWork;

use crate::notify::Hub;
use crate::proto::coordinator_server::CoordinatorServer;
use crate::service::CoordinatorService;
use crate::store::Store;

/// What the server's life needs besides its background tasks.
pub(super) struct Life {
    /// The database answered (and was migrated) before the server ran.
    pub(super) database_ready: bool,
    /// The store the wait connects and migrates through.
    pub(super) store: Store,
    /// The database URL, parsed and checked.
    pub(super) pg: crate::store::Postgres,
    /// Whether the wait migrates.
    pub(super) run_migrations: bool,
    /// How long the wait may take (`None`: forever).
    pub(super) database_wait: Option<Duration>,
    /// Started once the database is ready.
    pub(super) work: DatabaseWork,
    /// The Coordinator's gate: set once the database is ready.
    pub(super) database_up: Arc<AtomicBool>,
    pub(super) hub: Arc<Hub>,
    pub(super) reporter: HealthReporter,
    /// How long the drain waits, not ready, before the ports close.
    pub(super) shutdown_delay: Duration,
}

impl Life {
    /// Waits for the database unless it is ready, then starts the database
    /// work under `background`, opens the Coordinator and serves until
    /// `shutdown`; then drains. A wait that ends without a database drains
    /// at once and returns its error.
    pub(super) async fn run(
        self,
        background: &mut Supervisor,
        shutdown: impl Future<Output = ()>,
    ) -> Result<(), StartupError> {
        tokio::pin!(shutdown);
        let waited = if self.database_ready {
            Some(Ok(()))
        } else {
            tokio::select! {
                () = &mut shutdown => None,
                waited = wait_for_database(
                    &self.store,
                    &self.pg,
                    self.run_migrations,
                    self.database_wait,
                ) => Some(waited),
            }
        };
        let (served, outcome) = match waited {
            Some(Ok(())) => {
                self.work.start(self.pg, background);
                self.database_up.store(true, Ordering::Release);
                shutdown.await;
                (true, Ok(()))
            }
            Some(Err(e)) => (false, Err(e)),
            None => (false, Ok(())),
        };
        drain(
            background,
            &self.hub,
            &self.reporter,
            self.shutdown_delay,
            served,
        )
        .await;
        outcome
    }
}

/// Stops the database work (and the credentials' reload), turns readiness
/// and liveness NOT_SERVING, and, when the server `served`, waits
/// `shutdown_delay` before the ports close, so that traffic moves away
/// first.
async fn drain(
    background: &mut Supervisor,
    hub: &Hub,
    reporter: &HealthReporter,
    shutdown_delay: Duration,
    served: bool,
) {
    background.drain().await;
    // Calls still waiting hear of changes by polling from now on.
    hub.set_connected(false);
    reporter
        .set_not_serving::<CoordinatorServer<CoordinatorService>>()
        .await;
    hub.metrics().ready(false);
    reporter
        .set_service_status("", ServingStatus::NotServing)
        .await;
    // A server that never was ready had no traffic sent its way.
    if !shutdown_delay.is_zero() && served {
        tracing::info!(?shutdown_delay, "not ready; draining before closing");
        tokio::time::sleep(shutdown_delay).await;
    }
    tracing::info!("closing; calls in flight finish first");
}

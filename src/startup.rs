//! Builds the server exactly as production runs it: tests boot this same
//! `Application` on port 0 against their own database.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpListener;
use tonic::service::Routes;
use tonic_health::ServingStatus;

use crate::auth::{Authenticator, CredentialsError};
use crate::config::ServeConfig;
use crate::error::cause_chain;
use crate::notify::Hub;
use crate::proto::{self, coordinator_server::CoordinatorServer};
use crate::recovery::Webhook;
use crate::service::CoordinatorService;
use crate::store::{self, Clock, Store, StoreError, migrate};
use crate::sweeper::{self, SweepTotals, Sweeper};
use crate::tls::{Tls, TlsError};
use crate::transport::{self, Admission};

/// Room for the rest of a Complete request around the largest result.
const REQUEST_OVERHEAD_BYTES: usize = 64 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum StartupError {
    #[error("invalid configuration: {0}")]
    Config(String),
    #[error("cannot reach the database to migrate it")]
    Database(#[source] StoreError),
    #[error("{0}")]
    Unhealthy(String),
    #[error("cannot start the private PostgreSQL")]
    Embedded(#[from] crate::embedded::EmbeddedError),
    #[error("cannot read the credentials file")]
    Credentials(#[from] CredentialsError),
    #[error("cannot set up TLS")]
    Tls(#[from] TlsError),
    #[error("cannot migrate the database")]
    Migrate(#[from] migrate::MigrateError),
    #[error("cannot listen on {addr}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot build the reflection service")]
    Reflection(#[from] tonic_reflection::server::Error),
}

/// Applies pending migrations, and logs what it did.
pub async fn run_migrations(store: &Store) -> Result<Vec<i32>, StartupError> {
    let applied = store.migrate().await?;
    if applied.is_empty() {
        tracing::info!("database schema is current");
    } else {
        tracing::info!(?applied, "applied migrations");
    }
    Ok(applied)
}

/// Open files the server needs besides client connections: its database
/// connections, the listener, the runtime's own, the webhook's and logs.
const RESERVED_FILES: usize = 64;

/// The connection limit in force: the configured one, lowered (with a
/// warning) so that client connections cannot take the descriptors that
/// database connections need.
fn connection_cap(config: &ServeConfig) -> usize {
    let wanted = config.connections.max_connections;
    let Some(files) = transport::raise_open_file_limit() else {
        return wanted;
    };
    let reserved = RESERVED_FILES + config.store.pool_size + config.store.shared_connections;
    let fits = usize::try_from(files)
        .unwrap_or(usize::MAX)
        .saturating_sub(reserved)
        .max(1);
    if fits < wanted {
        tracing::warn!(
            max_connections = fits,
            configured = wanted,
            open_file_limit = files,
            "the open file limit lowers the connection limit"
        );
    }
    wanted.min(fits)
}

/// A server that is bound and migrated, ready to run.
pub struct Application {
    /// Bound before `run_until`, so the port is known (and taken) at once.
    listener: TcpListener,
    /// The store every service call goes through.
    store: Store,
    /// What the server was built from.
    config: ServeConfig,
    /// The fan-out of change notifications to this process's waiters.
    hub: Arc<Hub>,
    /// What the background sweeper has done.
    sweep_totals: Arc<SweepTotals>,
    /// Who callers are.
    auth: Arc<Authenticator>,
    /// TLS in force, when configured.
    tls: Option<Arc<Tls>>,
}

impl Application {
    pub async fn build(config: ServeConfig) -> Result<Self, StartupError> {
        config.policy.check().map_err(StartupError::Config)?;
        if config.max_request_bytes < config.policy.max_result_bytes + REQUEST_OVERHEAD_BYTES {
            return Err(StartupError::Config(format!(
                "--max-request-bytes must be at least the result limit plus {REQUEST_OVERHEAD_BYTES} bytes"
            )));
        }
        if let Some(webhook) = &config.webhook
            && webhook.url.scheme() != "http"
        {
            return Err(StartupError::Config(format!(
                "the recovery webhook must be an http:// URL (this build has no TLS client), got {}://",
                webhook.url.scheme()
            )));
        }
        let auth = Arc::new(Authenticator::new(
            config.auth_tokens.clone(),
            config.allow_empty_credentials,
        )?);
        let tls = config.tls.clone().map(Tls::load).transpose()?.map(Arc::new);
        let store = Store::new(&config.store, Clock::default()).map_err(StartupError::Database)?;
        if config.run_migrations {
            run_migrations(&store).await?;
        }
        let listener =
            TcpListener::bind(config.listen)
                .await
                .map_err(|source| StartupError::Bind {
                    addr: config.listen,
                    source,
                })?;
        let waiter_limits = config.waiter_limits;
        Ok(Application {
            listener,
            store,
            config,
            hub: Hub::new(waiter_limits),
            sweep_totals: Arc::default(),
            auth,
            tls,
        })
    }

    /// The address actually bound (the real port when asked for port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.listener
            .local_addr()
            .expect("a bound TCP listener has a local address")
    }

    /// The server's clock offset, which tests advance instead of sleeping.
    pub fn clock(&self) -> Clock {
        self.store.clock().clone()
    }

    /// The store, to observe its queues.
    pub fn store(&self) -> Store {
        self.store.clone()
    }

    /// The waiter registry, to observe how many calls wait.
    pub fn hub(&self) -> Arc<Hub> {
        Arc::clone(&self.hub)
    }

    /// Reads the credentials file again, as SIGHUP does.
    pub fn reload_handle(&self) -> Arc<Authenticator> {
        Arc::clone(&self.auth)
    }

    /// The TLS configuration, to reload as SIGHUP does.
    pub fn tls_handle(&self) -> Option<Arc<Tls>> {
        self.tls.clone()
    }

    /// What the background sweeper of this process has done so far.
    pub fn sweep_totals(&self) -> Arc<SweepTotals> {
        Arc::clone(&self.sweep_totals)
    }

    /// Serves until `shutdown` resolves; then readiness and liveness turn
    /// NOT_SERVING, new connections are refused after the configured delay,
    /// and calls in flight finish.
    pub async fn run_until(self, shutdown: impl Future<Output = ()>) -> Result<(), StartupError> {
        let Application {
            listener,
            store,
            config,
            hub,
            sweep_totals,
            auth,
            tls,
        } = self;
        if auth.is_on() {
            tracing::info!("authentication on: bearer tokens required");
        } else {
            tracing::warn!(
                "authentication is off: every caller is the one default tenant and may Sweep; pass --auth-tokens to require tokens"
            );
        }
        let reloading = tokio::spawn(reload_on_hangup(Arc::clone(&auth), tls.clone()));
        let addr = listener.local_addr().map_err(|source| StartupError::Bind {
            addr: config.listen,
            source,
        })?;

        let (reporter, health) = tonic_health::server::health_reporter();
        // Not ready until the first database check passes.
        reporter
            .set_not_serving::<CoordinatorServer<CoordinatorService>>()
            .await;
        let pg = store::pg_config(&config.store.database_url)
            .map_err(|e| StartupError::Config(cause_chain(&e)))?;
        let changes = store::listener::start(pg, config.health_interval, store.clock().clone(), {
            let hub = Arc::clone(&hub);
            move |change| hub.on_change(change)
        });
        let listener_task = changes.task;
        let probe = store::probe::start(store.clone(), config.health_interval);
        let probe_task = probe.task;
        let following = tokio::spawn(follow_database(
            changes.listening,
            probe.answering,
            Arc::clone(&hub),
            reporter.clone(),
        ));
        let hub_at_drain = Arc::clone(&hub);
        // Outlives the listener, which the drain stops: calls still waiting
        // then hear of changes by polling.
        let polling = tokio::spawn({
            let hub = Arc::clone(&hub);
            async move { hub.poll_while_down().await }
        });

        // Reflection knows our contract, the health service and the
        // google.rpc error details, so grpcurl can show all three.
        let reflection_v1 = tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(proto::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_types::pb::FILE_DESCRIPTOR_SET)
            .build_v1()?;
        let reflection_v1alpha = tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(proto::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_types::pb::FILE_DESCRIPTOR_SET)
            .build_v1alpha()?;
        let sweeper = Sweeper::new(store.clone(), config.sweep_batch);
        let sweeping = (!config.sweep_interval.is_zero()).then(|| {
            tokio::spawn(sweeper::run(
                sweeper.clone(),
                config.sweep_interval,
                sweep_totals,
                config.webhook.clone().map(Webhook::start),
            ))
        });
        if sweeping.is_none() && config.webhook.is_some() {
            tracing::warn!("the recovery webhook runs with the sweeper, which is off");
        }
        let coordinator = CoordinatorServer::new(CoordinatorService::new(
            store,
            Arc::new(config.policy.clone()),
            hub,
            sweeper,
            config.feed,
            Arc::clone(&auth),
        ))
        // Requests somewhat over the result limit still decode, so the caller
        // hears INVALID_ARGUMENT naming `success.result`; past
        // --max-request-bytes admission refuses them (RESOURCE_EXHAUSTED)
        // from their length prefix, before they arrive.
        .max_decoding_message_size(config.max_request_bytes);

        let shutdown_delay = config.shutdown_delay;
        let drain = async move {
            shutdown.await;
            listener_task.abort();
            probe_task.abort();
            following.abort();
            // Calls still waiting hear of changes by polling from now on.
            hub_at_drain.set_connected(false);
            reloading.abort();
            if let Some(sweeping) = &sweeping {
                sweeping.abort();
            }
            reporter
                .set_not_serving::<CoordinatorServer<CoordinatorService>>()
                .await;
            reporter
                .set_service_status("", ServingStatus::NotServing)
                .await;
            if !shutdown_delay.is_zero() {
                tracing::info!(?shutdown_delay, "not ready; draining before closing");
                tokio::time::sleep(shutdown_delay).await;
            }
            tracing::info!("closing; calls in flight finish first");
        };

        let routes = Routes::new(health)
            .add_service(reflection_v1)
            .add_service(reflection_v1alpha)
            .add_service(coordinator)
            .prepare();
        let admission = Arc::new(Admission::new(
            routes,
            auth,
            config.max_inflight_request_bytes,
            config.max_request_bytes,
            config.request_body_timeout,
        ));
        let mut connections = config.connections;
        connections.max_connections = connection_cap(&config);
        tracing::info!(
            %addr,
            tls = tls.is_some(),
            mutual = config.tls.as_ref().is_some_and(|t| t.client_ca.is_some()),
            max_connections = connections.max_connections,
            "listening"
        );
        transport::serve(listener, tls, admission, connections, drain).await;
        polling.abort();
        tracing::info!("stopped");
        Ok(())
    }
}

/// Maps the database's state onto readiness: `idempotency.v1.Coordinator`
/// is SERVING only while the listener is connected, listening and reading
/// the database's clock on time, and the connections calls use answer the
/// probe. The hub follows the listener alone (waiters poll while it is
/// down).
async fn follow_database(
    mut listening: tokio::sync::watch::Receiver<bool>,
    mut answering: tokio::sync::watch::Receiver<bool>,
    hub: Arc<Hub>,
    reporter: tonic_health::server::HealthReporter,
) {
    loop {
        let notified = *listening.borrow_and_update();
        hub.set_connected(notified);
        let up = notified && *answering.borrow_and_update();
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
            changed = listening.changed() => changed,
            changed = answering.changed() => changed,
        };
        if changed.is_err() {
            return;
        }
    }
}

/// Reads the credentials and certificates again on every SIGHUP, without
/// touching connections; a bad file leaves the old ones in force.
async fn reload_on_hangup(auth: Arc<Authenticator>, tls: Option<Arc<Tls>>) {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let Ok(mut hangups) = signal(SignalKind::hangup()) else {
            tracing::warn!("cannot listen for SIGHUP; credentials are not reloaded");
            return;
        };
        while hangups.recv().await.is_some() {
            match auth.reload() {
                Ok(n) => tracing::info!(credentials = n, "credentials reloaded"),
                Err(e) => tracing::error!(
                    error = %cause_chain(&e),
                    "credentials not reloaded; the previous ones stay in force"
                ),
            }
            if let Some(tls) = &tls {
                match tls.reload() {
                    Ok(()) => tracing::info!("TLS certificates reloaded"),
                    Err(e) => tracing::error!(
                        error = %cause_chain(&e),
                        "TLS certificates not reloaded; the previous ones stay in force"
                    ),
                }
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = (auth, tls);
        std::future::pending::<()>().await;
    }
}

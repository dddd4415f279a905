//! Builds the server exactly as production runs it: tests boot this same
//! `Application` on port 0 against their own database.
//!
//! `serve` binds its port first and serves at once: liveness SERVING,
//! readiness NOT_SERVING and Coordinator calls UNAVAILABLE while it waits for
//! the database (and migrates it), retrying with backoff for up to
//! `--database-wait`; then it starts the listener (readiness) and the
//! sweeper, and opens the Coordinator. A database URL that cannot work is
//! refused before the port is bound.
//!
//! The parts:
//!
//! - [`commands`]: what `serve`, `migrate` and `health` do, on the database
//!   given or on a private PostgreSQL ([`crate::embedded`]); `main` only
//!   parses the arguments and picks one.
//! - `ports`: the ports bound first ([`Listeners`]), each client port's
//!   connection cap from the open file limit, and the client ports served
//!   until they close together.
//! - `database`: waiting for the database ([`wait_for_database`]), and the
//!   gate that answers Coordinator calls UNAVAILABLE meanwhile.
//! - `routes`: the gRPC port's services: the Coordinator, health, and
//!   reflection in both versions from one builder.
//! - `http_door`: the HTTP/JSON door on the gRPC port's admission.
//! - `metrics_exporter`: the metrics port.
//! - `credentials`: authentication said at start, credentials and
//!   certificates reloaded on SIGHUP.
//! - `database_work`: what runs once the database is ready: the listener,
//!   the probe, readiness following both, and the sweeper.
//! - `lifecycle`: the wait, serving until shutdown, and the drain.
//! - `background`: the one supervisor of the background tasks, which all
//!   end on one cancellation token.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tonic_health::server::HealthService;

use crate::auth::{Authenticator, CredentialsError};
use crate::config::ServeConfig;
use crate::http::DoorServices;
use crate::notify::Hub;
use crate::service::CoordinatorService;
use crate::store::{self, Clock, Store, StoreError, UrlError, migrate};
use crate::sweeper::{SweepTotals, Sweeper};
use crate::telemetry::cause_chain;
use crate::tls::{Tls, TlsError};

use background::{Supervisor, Until};
use database_work::DatabaseWork;
use http_door::HttpDoor;
use lifecycle::Life;
use ports::{ClientPorts, bind_failure};

pub use database::wait_for_database;
pub use ports::Listeners;

mod background;
pub mod commands;
mod credentials;
mod database;
mod database_work;
mod http_door;
mod lifecycle;
mod metrics_exporter;
mod ports;
mod routes;

/// Room for the rest of a Complete request around the largest result.
const REQUEST_OVERHEAD_BYTES: usize = 64 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum StartupError {
    #[error("invalid configuration: {0}")]
    Config(String),
    #[error("cannot set up the database connections")]
    Database(#[source] StoreError),
    /// The database URL cannot work, however long one waits.
    #[error(transparent)]
    DatabaseUrl(#[from] UrlError),
    /// The one attempt allowed failed (`migrate`, or a zero wait).
    #[error("{}", cause_chain(.0.as_ref()))]
    Unreachable(Box<dyn std::error::Error + Send + Sync>),
    /// The database did not answer within --database-wait.
    #[error(
        "gave up on the database after {attempts} attempts in {waited:?} (--database-wait): {}",
        cause_chain(.last.as_ref())
    )]
    GaveUp {
        /// Connection attempts made.
        attempts: u32,
        /// How long they took in all.
        waited: Duration,
        /// Why the last attempt failed.
        last: Box<dyn std::error::Error + Send + Sync>,
    },
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
    #[error("{}", bind_failure(addr, flag, source))]
    Bind {
        /// The address that could not be bound.
        addr: SocketAddr,
        /// The flag that chose the address.
        flag: &'static str,
        /// What the operating system said.
        #[source]
        source: std::io::Error,
    },
    #[error("cannot listen on the Unix socket {} (--unix-socket)", path.display())]
    BindUnix {
        /// The socket's path.
        path: std::path::PathBuf,
        /// What the operating system said.
        #[source]
        source: std::io::Error,
    },
    #[error("cannot build the reflection service")]
    Reflection(#[from] tonic_reflection::server::Error),
    #[error("cannot read the contract's descriptors for the HTTP/JSON door")]
    Descriptors(#[from] prost_reflect::DescriptorError),
}

/// A bound server, ready to run: built (database reached and migrated) or
/// only bound (`run_until` then waits for the database while it serves).
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
    /// The database URL, parsed and checked.
    pg: crate::store::Postgres,
    /// The database answered (and was migrated) before `run_until`.
    database_ready: bool,
    /// Where Prometheus metrics are served, when configured.
    metrics_listener: Option<TcpListener>,
    /// Where the HTTP/JSON door is served, when configured.
    http_listener: Option<TcpListener>,
    /// Where gRPC is also served on a Unix socket, when configured.
    unix_listener: Option<tokio::net::UnixListener>,
}

impl Application {
    /// [`Application::bind`], then, when it migrates, waits for the database
    /// (up to `database_wait`) and migrates it before returning, so that the
    /// first call finds the schema; without migrations `run_until` waits for
    /// the database while it serves, as `serve` does.
    pub async fn build(config: ServeConfig) -> Result<Self, StartupError> {
        let mut app = Application::bind(config).await?;
        if app.config.run_migrations {
            wait_for_database(&app.store, &app.pg, true, app.config.database_wait).await?;
            app.database_ready = true;
        }
        Ok(app)
    }

    /// Everything that needs no database: checks the configuration (a
    /// database URL that cannot work included), reads the credentials and
    /// certificates, and binds the port. `run_until` then serves at once and
    /// waits for the database (and migrates it) in the background.
    pub async fn bind(config: ServeConfig) -> Result<Self, StartupError> {
        let listeners =
            Listeners::bind(config.listen, config.http_listen, config.metrics_listen).await?;
        Application::bind_on(config, listeners).await
    }

    /// [`Application::bind`] on ports already bound (`Listeners::bind`,
    /// before anything else was started).
    pub async fn bind_on(config: ServeConfig, listeners: Listeners) -> Result<Self, StartupError> {
        config.policy.check().map_err(StartupError::Config)?;
        if config.max_request_bytes < config.policy.max_result_bytes + REQUEST_OVERHEAD_BYTES {
            return Err(StartupError::Config(format!(
                "--max-request-bytes must be at least the result limit plus {REQUEST_OVERHEAD_BYTES} bytes"
            )));
        }
        if let Some(webhook) = &config.webhook {
            webhook
                .client()
                .map_err(|e| StartupError::Config(cause_chain(&e)))?;
        }
        let auth = Arc::new(Authenticator::new(
            config.auth_tokens.clone(),
            config.allow_empty_credentials,
        )?);
        let tls = config.tls.clone().map(Tls::load).transpose()?.map(Arc::new);
        let pg = store::connect_error::check_url(&config.store.database_url)?;
        let store = Store::new(&config.store, Clock::default()).map_err(StartupError::Database)?;
        let Listeners {
            grpc: listener,
            metrics: metrics_listener,
            http: http_listener,
        } = listeners;
        let unix_listener = config
            .unix_socket
            .as_deref()
            .map(ports::bind_unix)
            .transpose()?;
        let hub = Hub::new(config.waiter_limits, store.metrics().clone());
        Ok(Application {
            listener,
            store,
            config,
            hub,
            sweep_totals: Arc::default(),
            auth,
            tls,
            pg,
            database_ready: false,
            metrics_listener,
            http_listener,
            unix_listener,
        })
    }

    /// Where metrics are served, when they are.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics_listener
            .as_ref()
            .and_then(|l| l.local_addr().ok())
    }

    /// Where the HTTP/JSON door is served, when it is.
    pub fn http_addr(&self) -> Option<SocketAddr> {
        self.http_listener
            .as_ref()
            .and_then(|l| l.local_addr().ok())
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
    ///
    /// Until the database is ready (see [`wait_for_database`]) liveness is
    /// SERVING, readiness NOT_SERVING and Coordinator calls are answered
    /// UNAVAILABLE; the listener and the sweeper start once it is. Returns
    /// the error when the wait ends without a database, after closing.
    pub async fn run_until(self, shutdown: impl Future<Output = ()>) -> Result<(), StartupError> {
        let (life, ports, mut background) = self.assemble().await?;
        // Both ports stop together once the drain has run.
        let closing = CancellationToken::new();
        let living = async {
            let outcome = life.run(&mut background, shutdown).await;
            closing.cancel();
            outcome
        };
        let (outcome, ()) = tokio::join!(living, ports.serve(&closing));
        background.close().await;
        outcome?;
        tracing::info!("stopped");
        Ok(())
    }

    /// Wires the server: the Coordinator, health and reflection behind
    /// admission on the gRPC port, the HTTP/JSON door, and the background
    /// tasks that serve alongside the ports, started under their
    /// supervisor. Returns the server's life (the wait for the database and
    /// what follows), its client ports, and the supervisor.
    async fn assemble(self) -> Result<(Life, ClientPorts, Supervisor), StartupError> {
        let Application {
            listener,
            store,
            config,
            hub,
            sweep_totals,
            auth,
            tls,
            pg,
            database_ready,
            metrics_listener,
            http_listener,
            unix_listener,
        } = self;
        credentials::announce(&auth);
        let addr = listener.local_addr().map_err(|source| StartupError::Bind {
            addr: config.listen,
            flag: "--listen",
            source,
        })?;
        let sweeper = Sweeper::new(store.clone(), config.sweep_batch);
        if config.sweep_interval.is_zero() && config.webhook.is_some() {
            tracing::warn!("the recovery webhook runs with the sweeper, which is off");
        }
        // Coordinator calls are answered UNAVAILABLE until the database is
        // ready.
        let database_up = Arc::new(AtomicBool::new(database_ready));
        let coordinator = CoordinatorService::new(
            store.clone(),
            Arc::new(config.policy.clone()),
            Arc::clone(&hub),
            sweeper.clone(),
            config.feed,
            Arc::clone(&auth),
        );
        let gate = database::gate(Arc::clone(&database_up));
        let (admission, reporter) = routes::admission(
            coordinator.clone(),
            gate,
            (Arc::clone(&auth), store.metrics().clone()),
            &config,
        )
        .await?;
        let door_services = DoorServices {
            admission: Arc::clone(&admission),
            coordinator,
            health: HealthService::from_health_reporter(reporter.clone()),
        };
        let http_door = HttpDoor::open(http_listener, door_services, Arc::clone(&auth), &config)?;
        store
            .metrics()
            .set_scope_labels(config.metrics_scope_labels);
        let connections =
            ports::connection_limits(&config, http_door.is_some(), metrics_listener.is_some());

        let mut background = Supervisor::new();
        spawn_serving_tasks(
            &mut background,
            &auth,
            tls.as_ref(),
            &hub,
            &store,
            metrics_listener,
        );
        tracing::info!(
            %addr,
            tls = tls.is_some(),
            mutual = config.tls.as_ref().is_some_and(|t| t.client_ca.is_some()),
            max_connections = connections.max_connections,
            "listening"
        );
        let life = Life {
            database_ready,
            store: store.clone(),
            pg,
            run_migrations: config.run_migrations,
            database_wait: config.database_wait,
            work: DatabaseWork::new(
                &config,
                Arc::clone(&hub),
                reporter.clone(),
                store,
                sweeper,
                sweep_totals,
            ),
            database_up,
            hub,
            reporter,
            shutdown_delay: config.shutdown_delay,
        };

        let ports = ClientPorts {
            grpc: listener,
            unix: unix_listener,
            admission,
            http: http_door,
            tls,
            connections,
        };
        Ok((life, ports, background))
    }
}

/// Starts what serves alongside the ports from the start: the credentials'
/// reload on SIGHUP (until the drain), and the hub's polling and the metrics
/// port (until the ports have closed).
fn spawn_serving_tasks(
    background: &mut Supervisor,
    auth: &Arc<Authenticator>,
    tls: Option<&Arc<Tls>>,
    hub: &Arc<Hub>,
    store: &Store,
    metrics_listener: Option<TcpListener>,
) {
    background.spawn("credentials reload", Until::Drain, |stop| {
        credentials::reload_on_hangup(Arc::clone(auth), tls.cloned(), stop)
    });
    // Outlives the listener, which the drain stops: calls still waiting
    // then hear of changes by polling.
    background.spawn("hub polling", Until::Closed, |stop| {
        let hub = Arc::clone(hub);
        async move { hub.poll_while_down(stop).await }
    });
    metrics_exporter::start(background, metrics_listener, store.clone(), Arc::clone(hub));
}

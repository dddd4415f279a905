//! Builds the server exactly as production runs it: tests boot this same
//! `Application` on port 0 against their own database.
//!
//! `serve` binds its port first and serves at once: liveness SERVING,
//! readiness NOT_SERVING and Coordinator calls UNAVAILABLE while it waits for
//! the database (and migrates it), retrying with backoff for up to
//! `--database-wait`; then it starts the listener (readiness) and the
//! sweeper, and opens the Coordinator. A database URL that cannot work is
//! refused before the port is bound.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tokio::net::TcpListener;
use tonic::Status;
use tonic::service::Routes;
use tonic::service::interceptor::InterceptedService;
use tonic_health::ServingStatus;

use crate::auth::{Authenticator, CredentialsError};
use crate::config::ServeConfig;
use crate::error::{Error, cause_chain};
use crate::metrics;
use crate::notify::Hub;
use crate::proto::{self, coordinator_server::CoordinatorServer};
use crate::recovery::Webhook;
use crate::service::CoordinatorService;
use crate::store::{self, Clock, ConnectTarget, Store, StoreError, UrlError, migrate};
use crate::sweeper::{self, SweepTotals, Sweeper};
use crate::tls::{Tls, TlsError};
use crate::transport::{self, Admission};

/// Room for the rest of a Complete request around the largest result.
const REQUEST_OVERHEAD_BYTES: usize = 64 * 1024;

/// The pause after the first failed attempt to reach the database at
/// start; it doubles with each attempt, up to [`MAX_DATABASE_RETRY`].
const FIRST_DATABASE_RETRY: Duration = Duration::from_millis(250);
/// The longest pause between attempts to reach the database at start.
const MAX_DATABASE_RETRY: Duration = Duration::from_secs(5);
/// The longest one attempt to connect may take (a host that drops packets
/// never refuses).
const DATABASE_ATTEMPT_LIMIT: Duration = Duration::from_secs(10);

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
    #[error("cannot build the reflection service")]
    Reflection(#[from] tonic_reflection::server::Error),
    #[error("cannot read the contract's descriptors for the HTTP/JSON door")]
    Descriptors(#[from] prost_reflect::DescriptorError),
}

/// Waits until the database at `pg` answers and, with `migrate`, applies
/// its pending migrations through `store`: one attempt, then retries after
/// 250 ms doubling to 5 s, each failure logged with where it tried and why,
/// for at most `bound` (`None`: forever; zero: the one attempt).
///
/// Every connection failure is retried, refusals by the server included (no
/// such database or role, a refused password): those are fixed on the
/// database's side, and a database being provisioned shows them for a while.
/// What retrying cannot fix ends the wait at once: a migration that fails
/// other than by losing its connection. (A URL that cannot work never gets
/// here: [`store::connect_error::check_url`] refuses it first.)
pub async fn wait_for_database(
    store: &Store,
    pg: &tokio_postgres::Config,
    migrate: bool,
    bound: Option<Duration>,
) -> Result<(), StartupError> {
    let target = ConnectTarget::of(pg);
    let started = Instant::now();
    let mut pause = FIRST_DATABASE_RETRY;
    let mut attempt = 0;
    loop {
        attempt += 1;
        let failure = match attempt_database(store, pg, migrate).await {
            Ok(()) => {
                tracing::info!(
                    attempts = attempt,
                    waited = ?started.elapsed(),
                    host = %target.places(),
                    database = %target.database(),
                    user = %target.user(),
                    "database ready"
                );
                return Ok(());
            }
            Err(Attempt::Fatal(e)) => return Err(e),
            Err(Attempt::Retry(failure)) => failure,
        };
        let waited = started.elapsed();
        let left = bound.map(|bound| bound.saturating_sub(waited));
        if left == Some(Duration::ZERO) {
            return Err(if attempt == 1 {
                StartupError::Unreachable(failure)
            } else {
                StartupError::GaveUp {
                    attempts: attempt,
                    waited,
                    last: failure,
                }
            });
        }
        let retry_in = left.map_or(pause, |left| left.min(pause));
        tracing::warn!(
            attempt,
            error = %cause_chain(failure.as_ref()),
            host = %target.places(),
            database = %target.database(),
            user = %target.user(),
            ?retry_in,
            "waiting for the database"
        );
        tokio::time::sleep(retry_in).await;
        pause = (pause * 2).min(MAX_DATABASE_RETRY);
    }
}

/// How one attempt to reach (and migrate) the database failed.
enum Attempt {
    /// Worth another attempt.
    Retry(Box<dyn std::error::Error + Send + Sync>),
    /// Not worth one.
    Fatal(StartupError),
}

/// Connects once, migrates when asked, and learns whether the database is
/// a Citus coordinator.
async fn attempt_database(
    store: &Store,
    pg: &tokio_postgres::Config,
    migrate: bool,
) -> Result<(), Attempt> {
    store::connect_error::probe(pg, DATABASE_ATTEMPT_LIMIT)
        .await
        .map_err(|e| Attempt::Retry(Box::new(e)))?;
    if migrate {
        migrate_database(store).await?;
    }
    store.inspect().await.map_err(|e| match e {
        StoreError::Unavailable(e) => Attempt::Retry(e),
        other => Attempt::Fatal(StartupError::Database(other)),
    })?;
    Ok(())
}

/// Applies what the database lacks (`store::migrate`).
async fn migrate_database(store: &Store) -> Result<(), Attempt> {
    match store.migrate().await {
        Ok(applied) if applied.is_empty() => tracing::info!("database schema is current"),
        Ok(applied) => tracing::info!(?applied, "applied migrations"),
        // The connection went away between the probe and the migration,
        // or during it (which rolled it back).
        Err(migrate::MigrateError::Connect(e)) => return Err(Attempt::Retry(Box::new(e))),
        Err(migrate::MigrateError::Database(e)) => {
            return Err(match StoreError::from(e) {
                StoreError::Unavailable(e) => Attempt::Retry(e),
                StoreError::Query(e) => {
                    Attempt::Fatal(StartupError::Migrate(migrate::MigrateError::Database(e)))
                }
                other => Attempt::Fatal(StartupError::Database(other)),
            });
        }
        Err(e) => return Err(Attempt::Fatal(e.into())),
    }
    Ok(())
}

/// What a Coordinator call hears while the server waits for the database
/// at start.
#[derive(Debug, thiserror::Error)]
#[error("the server is still waiting for the database at start-up")]
struct WaitingForDatabase;

/// Open files the server needs besides client connections: its database
/// connections, the listener, the runtime's own, the webhook's and logs.
const RESERVED_FILES: usize = 64;

/// The connection limit in force on each client port: the configured one,
/// lowered (with a warning) so that every port at its limit together, the
/// metrics port's connections and the database connections fit in the open
/// file limit. One budget of descriptors, shared out equally between the
/// client ports (`ports`: the gRPC port, and the HTTP port if served), so
/// that a flood on one port cannot take the descriptors another port's
/// connections need.
fn connection_cap(config: &ServeConfig, ports: usize, metrics_port: bool) -> usize {
    let wanted = config.connections.max_connections;
    let Some(files) = transport::raise_open_file_limit() else {
        return wanted;
    };
    let scrapers = if metrics_port {
        metrics::MAX_SCRAPE_CONNECTIONS
    } else {
        0
    };
    let reserved =
        RESERVED_FILES + config.store.pool_size + config.store.shared_connections + scrapers;
    let fits = (usize::try_from(files)
        .unwrap_or(usize::MAX)
        .saturating_sub(reserved)
        / ports.max(1))
    .max(1);
    if fits < wanted {
        tracing::warn!(
            max_connections = fits,
            configured = wanted,
            open_file_limit = files,
            ports,
            "the open file limit lowers the connection limit"
        );
    }
    wanted.min(fits)
}

/// What a failed bind says: for a port in use, which flag moves it.
fn bind_failure(addr: &SocketAddr, flag: &str, source: &std::io::Error) -> String {
    if source.kind() == std::io::ErrorKind::AddrInUse {
        format!("{addr} is in use; pass {flag} ADDR (or stop the other server)")
    } else {
        format!("cannot listen on {addr} ({flag})")
    }
}

/// The ports a server serves, bound first, before anything is started (a
/// private PostgreSQL included): a port in use is said at once.
pub struct Listeners {
    grpc: TcpListener,
    metrics: Option<TcpListener>,
    http: Option<TcpListener>,
}

impl Listeners {
    /// Binds the gRPC port (`--listen`), and the HTTP/JSON and metrics
    /// ports when given.
    pub async fn bind(
        listen: SocketAddr,
        http_listen: Option<SocketAddr>,
        metrics_listen: Option<SocketAddr>,
    ) -> Result<Self, StartupError> {
        async fn one(addr: SocketAddr, flag: &'static str) -> Result<TcpListener, StartupError> {
            TcpListener::bind(addr)
                .await
                .map_err(|source| StartupError::Bind { addr, flag, source })
        }
        let grpc = one(listen, "--listen").await?;
        let http = match http_listen {
            Some(addr) => Some(one(addr, "--http-listen").await?),
            None => None,
        };
        let metrics = match metrics_listen {
            Some(addr) => Some(one(addr, "--metrics-listen").await?),
            None => None,
        };
        Ok(Listeners {
            grpc,
            metrics,
            http,
        })
    }
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
    pg: tokio_postgres::Config,
    /// The database answered (and was migrated) before `run_until`.
    database_ready: bool,
    /// Where Prometheus metrics are served, when configured.
    metrics_listener: Option<TcpListener>,
    /// Where the HTTP/JSON door is served, when configured.
    http_listener: Option<TcpListener>,
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
        let waiter_limits = config.waiter_limits;
        Ok(Application {
            listener,
            store,
            config,
            hub: Hub::new(waiter_limits),
            sweep_totals: Arc::default(),
            auth,
            tls,
            pg,
            database_ready: false,
            metrics_listener,
            http_listener,
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
            flag: "--listen",
            source,
        })?;

        let (reporter, health) = tonic_health::server::health_reporter();
        // Not ready until the first database check passes.
        reporter
            .set_not_serving::<CoordinatorServer<CoordinatorService>>()
            .await;
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
        let (metrics_store, metrics_hub) = (store.clone(), Arc::clone(&hub));
        let sweeper = Sweeper::new(store.clone(), config.sweep_batch);
        if config.sweep_interval.is_zero() && config.webhook.is_some() {
            tracing::warn!("the recovery webhook runs with the sweeper, which is off");
        }
        // Coordinator calls are answered UNAVAILABLE until the database is
        // ready.
        let database_up = Arc::new(AtomicBool::new(database_ready));
        let gate = {
            let up = Arc::clone(&database_up);
            move |request: tonic::Request<()>| {
                if up.load(Ordering::Acquire) {
                    Ok(request)
                } else {
                    Err(Status::from(Error::Unavailable(Box::new(
                        WaitingForDatabase,
                    ))))
                }
            }
        };
        // What runs once the database is ready: the listener (and with it
        // readiness) and the sweeper.
        let start_database_work = {
            let hub = Arc::clone(&hub);
            let reporter = reporter.clone();
            let clock = store.clock().clone();
            let sweeper = sweeper.clone();
            let health_interval = config.health_interval;
            let sweep_interval = config.sweep_interval;
            let webhook = config.webhook.clone();
            let probed = store.clone();
            move |pg| {
                let changes = store::listener::start(pg, health_interval, clock, {
                    let hub = Arc::clone(&hub);
                    move |change| hub.on_change(change)
                });
                let listener_task = changes.task;
                let probe = store::probe::start(probed, health_interval);
                let following = tokio::spawn(follow_database(
                    changes.listening,
                    probe.answering,
                    Arc::clone(&hub),
                    reporter.clone(),
                ));
                let sweeping = (!sweep_interval.is_zero()).then(|| {
                    tokio::spawn(sweeper::run(
                        sweeper,
                        sweep_interval,
                        sweep_totals,
                        webhook.map(Webhook::start),
                    ))
                });
                [
                    Some(listener_task),
                    Some(probe.task),
                    Some(following),
                    sweeping,
                ]
            }
        };
        let store_to_wait_on = store.clone();
        let (run_migrations, database_wait) = (config.run_migrations, config.database_wait);
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
        let coordinator = InterceptedService::new(coordinator, gate);

        let shutdown_delay = config.shutdown_delay;
        let (failed, failure) = tokio::sync::oneshot::channel();
        let drain = async move {
            tokio::pin!(shutdown);
            let waited = if database_ready {
                Some(Ok(()))
            } else {
                tokio::select! {
                    () = &mut shutdown => None,
                    waited = wait_for_database(
                        &store_to_wait_on,
                        &pg,
                        run_migrations,
                        database_wait,
                    ) => Some(waited),
                }
            };
            let running = match waited {
                Some(Ok(())) => {
                    let running = start_database_work(pg);
                    database_up.store(true, Ordering::Release);
                    shutdown.await;
                    Some(running)
                }
                Some(Err(e)) => {
                    let _ = failed.send(e);
                    None
                }
                None => None,
            };
            for task in running.iter().flatten().flatten() {
                task.abort();
            }
            // Calls still waiting hear of changes by polling from now on.
            hub_at_drain.set_connected(false);
            reloading.abort();
            reporter
                .set_not_serving::<CoordinatorServer<CoordinatorService>>()
                .await;
            metrics::ready(false);
            reporter
                .set_service_status("", ServingStatus::NotServing)
                .await;
            // A server that never was ready had no traffic sent its way.
            if !shutdown_delay.is_zero() && running.is_some() {
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
        let auth_for_http = Arc::clone(&auth);
        let admission = Arc::new(Admission::new(
            routes,
            auth,
            config.max_inflight_request_bytes,
            config.max_request_bytes,
            config.request_body_timeout,
        ));
        metrics::set_scope_labels(config.metrics_scope_labels);
        let ports = if http_listener.is_some() { 2 } else { 1 };
        let cap = connection_cap(&config, ports, metrics_listener.is_some());
        let exporting = metrics_listener.map(|listener| {
            if let Ok(addr) = listener.local_addr() {
                tracing::info!(%addr, "serving metrics at /metrics");
            }
            tokio::spawn(metrics::serve(
                listener,
                metrics_snapshot(metrics_store, metrics_hub),
            ))
        });
        let mut connections = config.connections;
        connections.max_connections = cap;
        tracing::info!(
            %addr,
            tls = tls.is_some(),
            mutual = config.tls.as_ref().is_some_and(|t| t.client_ca.is_some()),
            max_connections = connections.max_connections,
            "listening"
        );
        // Both ports stop together once the drain has run.
        let (stop, stopping) = tokio::sync::watch::channel(false);
        let stopped = move || {
            let mut stopping = stopping.clone();
            async move {
                let _ = stopping.wait_for(|stop| *stop).await;
            }
        };
        let http = match http_listener {
            Some(http_listener) => {
                let door = crate::http::Door::new(
                    Arc::clone(&admission),
                    auth_for_http,
                    config.max_request_bytes,
                    config.request_body_timeout,
                )?;
                if let Ok(addr) = http_listener.local_addr() {
                    tracing::info!(%addr, tls = tls.is_some(), "serving HTTP/JSON");
                }
                Some(transport::serve_http(
                    http_listener,
                    tls.clone(),
                    Arc::new(crate::http::Handler(door)),
                    connections,
                    stopped(),
                ))
            }
            None => None,
        };
        let http = async move {
            if let Some(http) = http {
                http.await;
            }
        };
        let draining = async move {
            drain.await;
            let _ = stop.send(true);
        };
        tokio::join!(
            draining,
            transport::serve(listener, tls, admission, connections, stopped()),
            http,
        );
        polling.abort();
        if let Some(exporting) = exporting {
            exporting.abort();
        }
        if let Ok(e) = failure.await {
            return Err(e);
        }
        tracing::info!("stopped");
        Ok(())
    }
}

/// Reads, at each scrape, the state metrics show: the store's connections
/// and queue, and the hub's waiters.
fn metrics_snapshot(store: Store, hub: Arc<Hub>) -> metrics::SnapshotFn {
    Arc::new(move || {
        let pool = store.pool_status();
        let (shared_connections, shared_connected) = store.shared_connections();
        metrics::Snapshot {
            pool_max_size: pool.max_size,
            pool_size: pool.size,
            pool_available: pool.available,
            pool_waiting: pool.waiting,
            shared_connections,
            shared_connected,
            queued_calls: store.queued_calls(),
            replay_cache_bytes: store.replay_cache_bytes(),
            waiters: hub.waiters(),
            waiters_parked: hub.parked(),
            watched_records: hub.watched_records(),
        }
    })
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
        metrics::ready(up);
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

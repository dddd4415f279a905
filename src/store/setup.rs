//! Building a store: its configuration, the database URL read once, the
//! pool, the shared connections and the batch queues.

use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};

use super::calls::HotCall;
use super::clock::Clock;
use super::connect_error::ConnectTarget;
use super::replays::Replays;
use super::{Store, StoreError, batch, mux};
use crate::metrics::Metrics;

/// How the store reaches PostgreSQL.
#[derive(Debug, Clone)]
pub struct StoreConfig {
    /// A libpq-style URL or key=value string.
    pub database_url: String,
    /// Connections kept open at most.
    pub pool_size: usize,
    /// How long a call waits for a connection before answering UNAVAILABLE.
    pub connect_wait: Duration,
    /// How long one statement may take before the call answers UNAVAILABLE
    /// (a database that accepts connections but does not answer).
    pub query_timeout: Duration,
    /// Connections shared and pipelined by all calls; 0: each call takes a
    /// pooled connection of its own.
    pub shared_connections: usize,
    /// Acquires and Completes one statement carries at most, on the shared
    /// connections; 1: each runs alone.
    pub batch_size: usize,
    /// Batches running at once; 0: two per shared connection; `None`
    /// (auto): two pipelined on one connection while no other replica
    /// shares the database, else one at a time.
    pub batch_workers: Option<usize>,
    /// Memory for SUCCEEDED records that replays are answered from; 0: none.
    pub replay_cache_bytes: u64,
    /// On Citus, calls on shared connections go straight to the node
    /// holding their key (`shards`), not through the coordinator node.
    pub citus_direct: bool,
}

/// The one queue Acquires and Completes share: a batch carries both kinds.
pub(super) type Batches = batch::Coalescer<HotCall>;

/// Parses a database URL and names our connections in `pg_stat_activity`.
pub fn pg_config(database_url: &str) -> Result<tokio_postgres::Config, tokio_postgres::Error> {
    let mut config: tokio_postgres::Config = database_url.parse()?;
    if config.get_application_name().is_none() {
        config.application_name("idempotency-coordinator");
    }
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(Duration::from_secs(5));
    }
    // A connection whose peer vanished without a word (a NAT or firewall
    // that dropped its state, a failed-over address) is found dead by the
    // kernel: idle, after about 10 + 3 × 5 s of unanswered keepalives; with
    // a statement unacknowledged, after 20 s. The probe (`store::probe`)
    // finds the ones calls use sooner; these catch the rest. Settings given
    // in the URL win.
    let given = |name: &str| database_url.contains(name);
    if !given("keepalives_idle") {
        config.keepalives_idle(Duration::from_secs(10));
    }
    if !given("keepalives_interval") {
        config.keepalives_interval(Duration::from_secs(5));
    }
    if !given("keepalives_retries") {
        config.keepalives_retries(3);
    }
    if !given("tcp_user_timeout") {
        config.tcp_user_timeout(Duration::from_secs(20));
    }
    Ok(config)
}

impl Store {
    /// Builds the pool; connections open on first use, so this succeeds while
    /// the database is down.
    ///
    /// The store makes the server's metrics (a registry of its own, which
    /// it records into and hands on: [`Store::metrics`]).
    pub fn new(config: &StoreConfig, clock: Clock) -> Result<Self, StoreError> {
        let metrics = Metrics::new();
        let pg = super::Postgres::new(&config.database_url)
            .map_err(|e| StoreError::Config(Box::new(e)))?;
        let target = Arc::new(ConnectTarget::of(&pg));
        let manager = Manager::from_config(
            pg.config().clone(),
            pg.connector(),
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(config.pool_size)
            .runtime(Runtime::Tokio1)
            .build()
            .map_err(|e| StoreError::Config(Box::new(e)))?;
        let direct =
            (config.citus_direct && config.shared_connections > 0).then(|| super::shards::Direct {
                pg: pg.clone(),
                connections: config.shared_connections,
                query_timeout: config.query_timeout,
            });
        let mux = (config.shared_connections > 0).then(|| {
            Arc::new(mux::Mux::new(
                pg,
                config.shared_connections,
                config.query_timeout,
            ))
        });
        let routes = Arc::new(super::shards::Routes::new(direct));
        let batches = match &mux {
            Some(mux) if config.batch_size > 1 => {
                if tokio::runtime::Handle::try_current().is_err() {
                    return Err(StoreError::Config(
                        "batching needs a running Tokio runtime".into(),
                    ));
                }
                let settings = batch::Settings {
                    mux: Arc::clone(mux),
                    clock: clock.clone(),
                    // Auto by default: two pipelined on one connection
                    // while this replica is alone on the database, else
                    // one at a time, the biggest batches and the fewest
                    // commits; more keep the database busy while each
                    // waits for its commit, each behind another as large
                    // as it (batch::take, docs/performance.md).
                    workers: match config.batch_workers {
                        None => 2,
                        Some(0) => 2 * config.shared_connections,
                        Some(n) => n,
                    },
                    auto: config.batch_workers.is_none(),
                    max_batch: config.batch_size,
                    query_timeout: config.query_timeout,
                    routes: Arc::clone(&routes),
                    connect_wait: config.connect_wait,
                    metrics: metrics.clone(),
                };
                Some(Arc::new(batch::Coalescer::start(settings)))
            }
            _ => None,
        };
        Ok(Store {
            pool,
            clock,
            connect_wait: config.connect_wait,
            query_timeout: config.query_timeout,
            mux,
            batches,
            replays: Replays::new(config.replay_cache_bytes).map(Arc::new),
            target,
            distributed: Arc::default(),
            routes,
            row_types: Arc::default(),
            metrics,
        })
    }
}

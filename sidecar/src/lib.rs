//! `idempotency-sidecar`: an HTTP reverse proxy that gives any HTTP API
//! `Idempotency-Key` semantics, with the idempotency coordinator deciding
//! through its Rust client library. See docs/sidecar.md.
//!
//! # Layout
//!
//! - [`config`]: flags and their defaults; bad values refused at start.
//! - [`normalise`]: the method and path as the upstream reads them.
//! - [`routes`]: which requests are coordinated, under which scope, and
//!   what their fingerprint covers and their stored answer keeps.
//! - [`key`]: the `Idempotency-Key` header (sf-string or token), accepted
//!   or refused; `Prefer: wait`; the tenant's namespace.
//! - [`fingerprint`]: what makes a request "the same request".
//! - [`proxy`]: the state every request shares.
//! - [`request`]: one request, start to end; pass-through streaming.
//! - [`coordinate`]: the coordinator's decision and its answer; the upstream
//!   call in a task of its own.
//! - [`attempt`]: one upstream call under the lease; what is stored, failed
//!   or released.
//! - [`recording`]: an answer whose storing failed, stored again until it
//!   is, or another holder took the key over.
//! - [`upstream`]: the HTTP client; hop-by-hop headers; retryable statuses.
//! - [`stored`]: the stored answer's byte format.
//! - [`problem`]: RFC 9457 problem answers.
//! - [`body`]: bounded body reading.
//! - [`answers`]: the budget of upstream answers held until sent.
//! - [`budget`]: the body budget, charged as bytes arrive, shared by client.
//! - [`waiters`]: bounds on waiting requests; their coordinator channel.
//! - [`server`]: the client listener, its limits and drain.
//! - [`table`]: the connection table; shedding the longest idle.
//! - [`connection`]: one client connection's deadlines and idle timeout.
//! - [`conn`]: one client connection's state, as its requests see it.
//! - [`coordinator`]: reaching the coordinator, over TCP or a Unix socket.
//! - [`ops`]: readiness following the coordinator; the metrics listener.
//! - [`metrics`]: what is counted.

pub mod answers;
pub mod attempt;
pub mod body;
pub mod budget;
pub mod config;
pub mod conn;
pub mod connection;
pub mod coordinate;
pub mod coordinator;
pub mod fingerprint;
pub mod key;
pub mod metrics;
pub mod normalise;
pub mod ops;
pub mod problem;
pub mod proxy;
pub mod recording;
pub mod request;
pub mod routes;
pub mod server;
pub mod stored;
pub mod table;
pub mod upstream;
pub mod waiters;

use std::net::SocketAddr;
use std::sync::Arc;

use idempotency_client::ConnectError;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::config::{Args, ConfigError};
use crate::coordinator::Coordinator;
use crate::metrics::Metrics;
use crate::ops::Readiness;
use crate::problem::Problems;
use crate::proxy::Proxy;
use crate::upstream::Upstream;

/// Why the sidecar could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// A flag is wrong.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The coordinator's endpoint or credentials are unusable.
    #[error("coordinator: {0}")]
    Coordinator(#[from] ConnectError),
    /// A listener could not be bound.
    #[error("binding {addr}: {error}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        error: std::io::Error,
    },
}

/// A running sidecar.
pub struct Running {
    /// Where clients connect.
    pub addr: SocketAddr,
    /// Where metrics and health are served.
    pub metrics_addr: SocketAddr,
    draining: CancellationToken,
    served: tokio::task::JoinHandle<()>,
}

impl Running {
    /// Stops accepting clients and drains (readiness turns 503 at once).
    pub fn drain(&self) {
        self.draining.cancel();
    }

    /// Resolves when the drain is over and everything has stopped.
    pub async fn stopped(self) {
        let _ = self.served.await;
    }
}

async fn bind(addr: SocketAddr) -> Result<TcpListener, StartError> {
    TcpListener::bind(addr)
        .await
        .map_err(|error| StartError::Bind { addr, error })
}

/// Starts the sidecar `args` describe: binds both listeners, connects
/// (lazily) to the coordinator, and serves until [`Running::drain`].
pub async fn start(args: &Args) -> Result<Running, StartError> {
    let routes = args.routes()?;
    let settings = args.settings()?;
    let budget_kib = settings.body_budget_kib;
    let upstream = Upstream::new(
        args.upstream_base()?,
        args.upstream_h2c,
        args.upstream_timeout.into(),
        args.retry_statuses()?,
    );
    let options = args.coordinator_options()?;
    let reach = Coordinator::of(args);
    let health_channel = reach.health_channel(args, &options)?;
    // Waits get a connection of their own: a waiting Acquire holds a
    // stream for as long as it waits, and decisions never queue behind them.
    let waits = reach.client(options.clone())?;
    let coordinator = reach.client(options)?;
    let metrics = Metrics::default();
    let proxy = Arc::new(Proxy {
        routes,
        upstream,
        coordinator,
        settings,
        problems: Problems {
            base: args.problem_docs.clone(),
        },
        metrics: metrics.clone(),
        body_budget: budget::BodyBudget::new(
            budget_kib,
            args.body_share_kib()?,
            args.request_body_idle_timeout.into(),
        ),
        waiters: waiters::Waiters::new(args.max_waiters, waits),
        answers: answers::AnswerBudget::new(args.answer_budget_kib()?),
    });
    let listener = bind(args.listen).await?;
    let metrics_listener = bind(args.metrics_listen).await?;
    let addr = listener.local_addr().map_err(|error| StartError::Bind {
        addr: args.listen,
        error,
    })?;
    let metrics_addr = metrics_listener
        .local_addr()
        .map_err(|error| StartError::Bind {
            addr: args.metrics_listen,
            error,
        })?;
    let draining = CancellationToken::new();
    let stop = CancellationToken::new();
    let readiness = Readiness::default();
    tokio::spawn(ops::follow_health(
        health_channel,
        args.health_interval.into(),
        readiness.clone(),
        metrics.clone(),
        stop.clone(),
    ));
    tokio::spawn(ops::serve(
        metrics_listener,
        metrics,
        readiness,
        draining.clone(),
        stop.clone(),
    ));
    let limits = server::Limits {
        max_connections: args.max_connections,
        max_streams: args.max_streams,
        header_read_timeout: args.header_read_timeout.into(),
        idle_timeout: args.idle_timeout.into(),
        max_waiters_per_connection: args.max_waiters_per_connection,
        drain_timeout: args.drain_timeout.into(),
    };
    let served = tokio::spawn({
        let draining = draining.clone();
        async move {
            server::serve(listener, proxy, limits, draining).await;
            stop.cancel();
        }
    });
    Ok(Running {
        addr,
        metrics_addr,
        draining,
        served,
    })
}

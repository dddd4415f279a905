//! The `serve` command: its flags, and everything it needs resolved from
//! them (or from the defaults, for servers built in code).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use super::limits::default_connections;
use super::{
    AuthArgs, DEFAULT_DATABASE_WAIT, DEFAULT_DUE_OFFER, DEFAULT_DUE_POLL, DEFAULT_HEALTH_INTERVAL,
    DEFAULT_MAX_INFLIGHT_REQUEST_MIB, DEFAULT_MAX_REQUEST_BYTES, DEFAULT_REQUEST_BODY_TIMEOUT,
    DEFAULT_SWEEP_BATCH, DEFAULT_SWEEP_INTERVAL, DEFAULT_WAITER_LIMITS, DatabaseArgs,
    LifecycleArgs, LimitsArgs, PolicyArgs, PoolArgs, RecoveryArgs, StatementArgs, TlsArgs, nonzero,
};
use crate::domain::{Policy, WaiterLimits};
use crate::recovery::WebhookConfig;
use crate::service::FeedConfig;
use crate::store::StoreConfig;
use crate::tls::TlsFiles;
use crate::transport::ConnectionLimits;

/// The `serve` command's flags, grouped by what they configure (in the
/// order `--help` lists them).
#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// Address to listen on for gRPC (port 0 picks a free port).
    #[arg(long, env = "IDEMPOTENCY_LISTEN", default_value = "127.0.0.1:50051")]
    pub listen: SocketAddr,

    /// Also serve gRPC, in plaintext, on a Unix socket at this path (for a
    /// client in the same pod or host, such as the sidecar: no TCP on
    /// either side), with the gRPC port's credentials and limits. The
    /// socket's file permissions say who may connect. Off unless given.
    #[arg(long, env = "IDEMPOTENCY_UNIX_SOCKET")]
    pub unix_socket: Option<PathBuf>,

    /// Also serve the Coordinator over HTTP/1.1 and HTTP/2 with JSON on this
    /// address (port 0 picks a free port): the workflow API (POST /acquire,
    /// POST /complete, GET /health) and every unary RPC in the Connect
    /// protocol (POST /idempotency.v1.Coordinator/Acquire, ...), with the
    /// gRPC port's credentials, limits and TLS; off unless given.
    #[arg(long, env = "IDEMPOTENCY_HTTP_LISTEN")]
    pub http_listen: Option<SocketAddr>,

    /// Also serve the operator console at /console/ on the HTTP port
    /// (--http-listen): records, leases and counts for an admin credential,
    /// and the admin actions. Off unless given.
    #[arg(long, env = "IDEMPOTENCY_CONSOLE", requires = "http_listen")]
    pub console: bool,

    /// Host names the HTTP port answers to besides IP addresses and
    /// localhost (comma-separated, port ignored, e.g.
    /// `coordinator.internal,idem.example.com`): the console, and every
    /// route without --auth-tokens, refuse another `Host` (421), so that a
    /// web page whose name was rebound to this server cannot read or act.
    #[arg(
        long,
        env = "IDEMPOTENCY_HTTP_ALLOWED_HOSTS",
        value_delimiter = ',',
        requires = "http_listen"
    )]
    pub http_allowed_hosts: Vec<String>,

    /// Where the database is (or where a private one is started).
    #[command(flatten)]
    pub database: DatabaseArgs,

    /// The database pool.
    #[command(flatten)]
    pub pool: PoolArgs,

    /// Who may call.
    #[command(flatten)]
    pub auth: AuthArgs,

    /// TLS on the gRPC and HTTP ports.
    #[command(flatten)]
    pub tls: TlsArgs,

    /// How statements reach the database.
    #[command(flatten)]
    pub statements: StatementArgs,

    /// The defaults and limits of requests.
    #[command(flatten)]
    pub policy: PolicyArgs,

    /// What the server holds at once.
    #[command(flatten)]
    pub limits: LimitsArgs,

    /// Sweeping and recovery.
    #[command(flatten)]
    pub recovery: RecoveryArgs,

    /// Start, readiness and shutdown.
    #[command(flatten)]
    pub lifecycle: LifecycleArgs,

    /// Serve Prometheus metrics at GET /metrics over plain HTTP on this
    /// address (port 0 picks a free port); off unless given.
    #[arg(long, env = "IDEMPOTENCY_METRICS_LISTEN")]
    pub metrics_listen: Option<SocketAddr>,

    /// Also count Acquire decisions by scope. Scopes are chosen by callers,
    /// so every scope becomes a time series: only for a bounded set.
    #[arg(long, env = "IDEMPOTENCY_METRICS_SCOPE_LABELS")]
    pub metrics_scope_labels: bool,
}

/// Everything `serve` needs, resolved.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// Where the gRPC port is served (port 0 picks a free one).
    pub listen: SocketAddr,
    /// Where gRPC is also served on a Unix socket; `None`: nowhere.
    pub unix_socket: Option<PathBuf>,
    /// Where the HTTP/JSON door is served; `None`: nowhere.
    pub http_listen: Option<SocketAddr>,
    /// The operator console is served on the HTTP door at /console/.
    pub console: bool,
    /// Host names the HTTP port answers to besides IP addresses and
    /// localhost (`--http-allowed-hosts`).
    pub http_allowed_hosts: Vec<String>,
    /// How the store reaches PostgreSQL: URL, pool and shared connections,
    /// timeouts, replay cache.
    pub store: StoreConfig,
    /// The defaults and limits applied to every request.
    pub policy: Policy,
    /// Pending migrations are applied at start (off with
    /// `--skip-migrations`).
    pub run_migrations: bool,
    /// On SIGTERM/SIGINT, how long to keep serving after readiness turns
    /// NOT_SERVING.
    pub shutdown_delay: Duration,
    /// How often readiness asks the database whether it answers.
    pub health_interval: Duration,
    /// Background sweeping every this long; zero: off.
    pub sweep_interval: Duration,
    /// Records of each kind one sweeping transaction handles at most.
    pub sweep_batch: u32,
    /// How the WatchDue recovery feed offers and looks for due records.
    pub feed: FeedConfig,
    /// Where the sweeper POSTs due records; `None`: no webhook.
    pub webhook: Option<WebhookConfig>,
    /// The credentials file; `None`: authentication off.
    pub auth_tokens: Option<PathBuf>,
    /// How many calls may wait at once, in all and per tenant.
    pub waiter_limits: WaiterLimits,
    /// The largest request message accepted on either port, in bytes.
    pub max_request_bytes: usize,
    /// Request bytes held at once while requests arrive.
    pub max_inflight_request_bytes: usize,
    /// How long a request's body may take to arrive after its headers.
    pub request_body_timeout: Duration,
    /// Accepting and keeping connections.
    pub connections: ConnectionLimits,
    /// A credentials file without credentials is accepted.
    pub allow_empty_credentials: bool,
    /// TLS files; `None`: plaintext.
    pub tls: Option<TlsFiles>,
    /// How long to wait for the database at start: `None` forever, zero
    /// one attempt.
    pub database_wait: Option<Duration>,
    /// Where Prometheus metrics are served; `None`: nowhere.
    pub metrics_listen: Option<SocketAddr>,
    /// Acquire decisions are also counted by scope.
    pub metrics_scope_labels: bool,
}

impl ServeConfig {
    /// The defaults, for `listen` and `database_url`.
    pub fn new(listen: SocketAddr, database_url: impl Into<String>) -> Self {
        ServeConfig {
            listen,
            unix_socket: None,
            http_listen: None,
            console: false,
            http_allowed_hosts: Vec::new(),
            store: StoreConfig::new(database_url),
            policy: Policy::default(),
            run_migrations: true,
            shutdown_delay: Duration::ZERO,
            health_interval: DEFAULT_HEALTH_INTERVAL,
            sweep_interval: DEFAULT_SWEEP_INTERVAL,
            sweep_batch: DEFAULT_SWEEP_BATCH,
            feed: FeedConfig {
                offer: DEFAULT_DUE_OFFER,
                poll: DEFAULT_DUE_POLL,
            },
            webhook: None,
            auth_tokens: None,
            waiter_limits: DEFAULT_WAITER_LIMITS,
            max_request_bytes: DEFAULT_MAX_REQUEST_BYTES,
            max_inflight_request_bytes: DEFAULT_MAX_INFLIGHT_REQUEST_MIB << 20,
            request_body_timeout: DEFAULT_REQUEST_BODY_TIMEOUT,
            connections: default_connections(),
            allow_empty_credentials: false,
            tls: None,
            database_wait: Some(DEFAULT_DATABASE_WAIT),
            metrics_listen: None,
            metrics_scope_labels: false,
        }
    }
}

impl From<ServeArgs> for ServeConfig {
    fn from(a: ServeArgs) -> Self {
        ServeConfig {
            listen: a.listen,
            unix_socket: a.unix_socket,
            http_listen: a.http_listen,
            console: a.console,
            http_allowed_hosts: a.http_allowed_hosts,
            store: a.statements.store(a.database.database_url, &a.pool),
            policy: a.policy.policy(),
            run_migrations: !a.statements.skip_migrations,
            shutdown_delay: a.lifecycle.shutdown_delay.into(),
            health_interval: a.lifecycle.health_interval.into(),
            sweep_interval: a.recovery.sweep_interval.into(),
            sweep_batch: a.recovery.sweep_batch,
            feed: a.recovery.feed(),
            webhook: a.recovery.webhook(),
            auth_tokens: a.auth.auth_tokens,
            waiter_limits: a.limits.waiter_limits(),
            max_request_bytes: a.limits.max_request_bytes,
            max_inflight_request_bytes: a.limits.max_inflight_request_mib << 20,
            request_body_timeout: a.limits.request_body_timeout.into(),
            connections: a.limits.connections(),
            allow_empty_credentials: a.auth.allow_empty_credentials,
            tls: a.tls.files(),
            database_wait: nonzero(a.lifecycle.database_wait.into()),
            metrics_listen: a.metrics_listen,
            metrics_scope_labels: a.metrics_scope_labels,
        }
    }
}

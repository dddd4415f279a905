//! Flags, each with an environment fallback, and the defaults in one place:
//! request defaults and limits come from `Policy::default()`, the rest from
//! the constants below.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::builder::TypedValueParser;
use clap::{Args, Parser, Subcommand};

use crate::domain::WaiterLimits;
use crate::domain::{Backoff, Policy};
use crate::recovery::WebhookConfig;
use crate::service::FeedConfig;
use crate::store::StoreConfig;
pub use crate::telemetry::LogFormat;
use crate::tls::TlsFiles;
use crate::transport::{ConnectionLimits, MAX_HEADER_LIST_BYTES, WINDOW_BYTES};

/// Connections the pool keeps open at most.
pub const DEFAULT_POOL_SIZE: usize = 16;
/// How long a call waits for a database connection before UNAVAILABLE.
pub const DEFAULT_CONNECT_WAIT: Duration = Duration::from_secs(1);
/// Connections all calls share, their statements pipelined, and batches of
/// each kind running at once (measured best on 2 cores; see README); 0: a
/// pooled connection per call.
pub const DEFAULT_SHARED_CONNECTIONS: usize = 2;
/// Acquires (or Completes) that one statement carries at most when they
/// arrive together; 1: each runs alone.
pub const DEFAULT_BATCH_SIZE: usize = 64;
/// Memory for SUCCEEDED records that replays are answered from, in MiB.
pub const DEFAULT_REPLAY_CACHE_MIB: u64 = 8;
/// How long one statement may take before the call answers UNAVAILABLE.
pub const DEFAULT_QUERY_TIMEOUT: Duration = Duration::from_secs(10);
/// How often readiness asks the database whether it answers.
pub const DEFAULT_HEALTH_INTERVAL: Duration = Duration::from_secs(1);
/// Calls that may wait at once on one server, and per tenant.
pub const DEFAULT_WAITER_LIMITS: WaiterLimits = WaiterLimits {
    total: 50_000,
    per_tenant: 10_000,
};
/// Concurrent HTTP/2 streams (calls) one client connection may open.
pub const DEFAULT_MAX_STREAMS: u32 = 1000;
/// The largest request the server decodes.
pub const DEFAULT_MAX_REQUEST_BYTES: usize = 4 * 1024 * 1024;
/// Request bytes the server holds at once while requests arrive, in MiB.
pub const DEFAULT_MAX_INFLIGHT_REQUEST_MIB: usize = 64;
/// How long a request's body may take to arrive.
pub const DEFAULT_REQUEST_BODY_TIMEOUT: Duration = Duration::from_secs(10);
/// Client connections served at once.
pub const DEFAULT_MAX_CONNECTIONS: usize = 4096;
/// How long a new connection may take to send its TLS handshake and HTTP/2
/// preface.
pub const DEFAULT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a connection with no call open is kept.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(300);
/// Silence on a connection after which the server pings it.
pub const DEFAULT_HTTP2_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(60);
/// How long a ping may go unanswered before the connection is dropped.
pub const DEFAULT_HTTP2_KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(20);
/// Silence after which TCP keepalive probes start.
pub const DEFAULT_TCP_KEEPALIVE: Duration = Duration::from_secs(60);
/// How often the background sweeper runs.
pub const DEFAULT_SWEEP_INTERVAL: Duration = Duration::from_secs(60);
/// Rows of each kind per sweeping transaction.
pub const DEFAULT_SWEEP_BATCH: u32 = 1000;
/// How long a due record offered to one subscriber is not offered again.
pub const DEFAULT_DUE_OFFER: Duration = Duration::from_secs(30);
/// How often an idle recovery feed looks for newly due records.
pub const DEFAULT_DUE_POLL: Duration = Duration::from_secs(1);
/// How long `serve` waits for the database at start before it exits: longer
/// than PostgreSQL takes to start, recover from a crash or fail over to a
/// standby (usually well under a minute or two), short enough that a
/// database that will not come (a wrong host, a role nobody creates) ends in
/// an exit that supervisors count and show, not in a process that waits
/// unnoticed.
pub const DEFAULT_DATABASE_WAIT: Duration = Duration::from_secs(300);

fn hd(d: Duration) -> humantime::Duration {
    d.into()
}

#[derive(Debug, Parser)]
#[command(
    name = "idempotency-coordinator",
    version,
    about = "Runs each side-effecting operation exactly once: a gRPC coordinator over PostgreSQL."
)]
pub struct Cli {
    /// What to do: serve, migrate, or ask a server's health.
    #[command(subcommand)]
    pub command: Command,

    /// Log format: human-readable text, or one JSON object per line.
    #[arg(long, env = "IDEMPOTENCY_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text, global = true)]
    pub log_format: LogFormat,

    /// Export each call's span over OTLP/gRPC to this collector, e.g.
    /// http://127.0.0.1:4317 (plaintext); off when unset, unless
    /// OTEL_EXPORTER_OTLP_ENDPOINT is set. OTEL_SERVICE_NAME renames the
    /// service (default idempotency-coordinator).
    #[arg(long, env = "IDEMPOTENCY_OTLP_ENDPOINT", global = true)]
    pub otlp_endpoint: Option<String>,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve the Coordinator, health and reflection services (applies pending
    /// migrations first).
    Serve(Box<ServeArgs>),
    /// Apply pending database migrations, then exit.
    Migrate(DatabaseArgs),
    /// Ask a running server's health service; exit 0 when SERVING (for
    /// container health checks, where the image has no shell or grpcurl).
    Health(HealthArgs),
}

#[derive(Debug, Clone, Args)]
pub struct HealthArgs {
    /// The server's gRPC address: the address `serve` listens on (the same
    /// flag and environment variable), an unspecified one (0.0.0.0, [::])
    /// asked on loopback.
    #[arg(long, env = "IDEMPOTENCY_LISTEN", default_value = "127.0.0.1:50051")]
    pub listen: SocketAddr,
    /// Ask this address instead (host:port).
    #[arg(long)]
    pub target: Option<String>,
    /// The health service to ask: `idempotency.v1.Coordinator` is readiness
    /// (the database answers), `""` liveness.
    #[arg(long, default_value = "idempotency.v1.Coordinator")]
    pub service: String,
    /// TLS as `serve` has it (the same flags and environment variables):
    /// ask over TLS, trusting exactly the server's own certificate, and
    /// present it as a client certificate when the server requires one.
    #[command(flatten)]
    pub tls: TlsArgs,
}

/// The TLS flags, shared by `serve` and `health` (which reads the same
/// files to reach the server as a container's health check).
#[derive(Debug, Clone, Args)]
pub struct TlsArgs {
    /// Serve TLS with this PEM certificate chain (needs --tls-key); read
    /// again on SIGHUP. Without it the port speaks plaintext.
    #[arg(long, env = "IDEMPOTENCY_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,

    /// The PEM private key of --tls-cert.
    #[arg(long, env = "IDEMPOTENCY_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,

    /// Require client certificates that chain to these PEM CA certificates
    /// (mutual TLS; needs --tls-cert).
    #[arg(long, env = "IDEMPOTENCY_TLS_CLIENT_CA", requires = "tls_cert")]
    pub tls_client_ca: Option<PathBuf>,
}

impl TlsArgs {
    /// The certificate files, when TLS is on.
    pub fn files(&self) -> Option<TlsFiles> {
        let (cert, key) = (self.tls_cert.clone()?, self.tls_key.clone()?);
        Some(TlsFiles {
            cert,
            key,
            client_ca: self.tls_client_ca.clone(),
        })
    }
}

impl HealthArgs {
    /// Where to ask: `--target`, or the listen address (on loopback when it
    /// names every interface).
    pub fn target(&self) -> String {
        if let Some(target) = &self.target {
            return target.clone();
        }
        let mut addr = self.listen;
        if addr.ip().is_unspecified() {
            addr.set_ip(match addr {
                SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
                SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
            });
        }
        addr.to_string()
    }
}

#[derive(Debug, Clone, Args)]
pub struct DatabaseArgs {
    /// PostgreSQL connection URL, e.g. postgres://user@host:5432/db. Without
    /// it, a private PostgreSQL is started in --data-dir (local development
    /// only).
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    pub database_url: Option<String>,

    /// Where the private PostgreSQL keeps its data when no --database-url is
    /// given [default: ~/.local/share/idempotency-coordinator, or
    /// /var/lib/idempotency-coordinator for root].
    #[arg(long, env = "IDEMPOTENCY_DATA_DIR", conflicts_with = "database_url")]
    pub data_dir: Option<PathBuf>,
}

#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// Address to listen on for gRPC (port 0 picks a free port).
    #[arg(long, env = "IDEMPOTENCY_LISTEN", default_value = "127.0.0.1:50051")]
    pub listen: SocketAddr,

    /// Also serve the Coordinator over HTTP/1.1 and HTTP/2 with JSON on this
    /// address (port 0 picks a free port): the workflow API (POST /acquire,
    /// POST /complete, GET /health) and every unary RPC in the Connect
    /// protocol (POST /idempotency.v1.Coordinator/Acquire, ...), with the
    /// gRPC port's credentials, limits and TLS; off unless given.
    #[arg(long, env = "IDEMPOTENCY_HTTP_LISTEN")]
    pub http_listen: Option<SocketAddr>,

    /// Where the database is (or where a private one is started).
    #[command(flatten)]
    pub database: DatabaseArgs,

    /// Database connections kept open at most by this replica.
    #[arg(long, env = "IDEMPOTENCY_POOL_SIZE", default_value_t = DEFAULT_POOL_SIZE)]
    pub pool_size: usize,

    /// How long a call waits for a database connection before it answers
    /// UNAVAILABLE (never longer than the call's own deadline).
    #[arg(long, env = "IDEMPOTENCY_CONNECT_WAIT", default_value_t = hd(DEFAULT_CONNECT_WAIT))]
    pub connect_wait: humantime::Duration,

    /// Require bearer tokens: a file of `<token or sha256:HEX> <tenant>
    /// [admin]` lines (`#` comments), read again on SIGHUP. Without it every
    /// caller is one default tenant. Replace it by renaming a new file over
    /// it: a file that does not end with a newline is refused as cut short.
    #[arg(long, env = "IDEMPOTENCY_AUTH_TOKENS")]
    pub auth_tokens: Option<PathBuf>,

    /// Accept a credentials file with no credential in it (every Coordinator
    /// call is then refused); without it such a file is refused as a mistake.
    #[arg(
        long,
        env = "IDEMPOTENCY_ALLOW_EMPTY_CREDENTIALS",
        requires = "auth_tokens"
    )]
    pub allow_empty_credentials: bool,

    /// TLS on the gRPC and HTTP ports.
    #[command(flatten)]
    pub tls: TlsArgs,

    /// Connections shared by all calls, their statements pipelined on them;
    /// also how many Acquire batches (and Complete batches) run at once
    /// (0: every call takes a pooled connection of its own, no batches).
    #[arg(long, env = "IDEMPOTENCY_SHARED_CONNECTIONS", default_value_t = DEFAULT_SHARED_CONNECTIONS)]
    pub shared_connections: usize,

    /// Acquires (or Completes) that arrive while every batch worker is busy
    /// share one statement and one commit, up to this many (1: each runs
    /// alone). Needs --shared-connections above 0; a batch never waits for
    /// company.
    #[arg(long, env = "IDEMPOTENCY_BATCH_SIZE", default_value_t = DEFAULT_BATCH_SIZE,
          value_parser = TypedValueParser::map(clap::value_parser!(u16).range(1..=1000), usize::from))]
    pub batch_size: usize,

    /// Memory, in MiB, for SUCCEEDED records that repeated Acquires are
    /// answered from without the database, until 5 s before they expire by
    /// the database's clock and for at most a minute per read; 0: every
    /// Acquire asks the database.
    #[arg(long, env = "IDEMPOTENCY_REPLAY_CACHE_MIB", default_value_t = DEFAULT_REPLAY_CACHE_MIB,
          value_parser = clap::value_parser!(u64).range(0..=65536))]
    pub replay_cache_mib: u64,

    /// How long one database statement may take before the call answers
    /// UNAVAILABLE (the shared connections also set nine tenths of it as
    /// PostgreSQL's statement_timeout, so an overlong statement rolls back).
    #[arg(long, env = "IDEMPOTENCY_QUERY_TIMEOUT", default_value_t = hd(DEFAULT_QUERY_TIMEOUT))]
    pub query_timeout: humantime::Duration,

    /// Do not apply pending migrations at start (run `migrate` separately).
    #[arg(long, env = "IDEMPOTENCY_SKIP_MIGRATIONS")]
    pub skip_migrations: bool,

    /// Lease length for an Acquire that leaves lease_ttl unset.
    #[arg(long, env = "IDEMPOTENCY_DEFAULT_LEASE_TTL", default_value_t = hd(Policy::default().default_lease_ttl))]
    pub default_lease_ttl: humantime::Duration,

    /// The longest lease an Acquire may ask for, and how far ExtendLease may
    /// push a lease from now.
    #[arg(long, env = "IDEMPOTENCY_MAX_LEASE_TTL", default_value_t = hd(Policy::default().max_lease_ttl))]
    pub max_lease_ttl: humantime::Duration,

    /// Attempts allowed for a record whose Acquire leaves max_attempts at 0.
    #[arg(long, env = "IDEMPOTENCY_DEFAULT_MAX_ATTEMPTS", default_value_t = Policy::default().default_max_attempts)]
    pub default_max_attempts: u32,

    /// The most attempts an Acquire may ask for.
    #[arg(long, env = "IDEMPOTENCY_MAX_ATTEMPTS_LIMIT", default_value_t = Policy::default().max_max_attempts)]
    pub max_attempts_limit: u32,

    /// How long a record is kept after its last change when the Acquire that
    /// created it leaves retention unset.
    #[arg(long, env = "IDEMPOTENCY_DEFAULT_RETENTION", default_value_t = hd(Policy::default().default_retention))]
    pub default_retention: humantime::Duration,

    /// The longest retention an Acquire may ask for.
    #[arg(long, env = "IDEMPOTENCY_MAX_RETENTION", default_value_t = hd(Policy::default().max_retention))]
    pub max_retention: humantime::Duration,

    /// Retry delay after a first failed attempt; doubles with each attempt.
    #[arg(long, env = "IDEMPOTENCY_BACKOFF_BASE", default_value_t = hd(Policy::default().backoff.base))]
    pub backoff_base: humantime::Duration,

    /// The longest retry delay the backoff reaches.
    #[arg(long, env = "IDEMPOTENCY_BACKOFF_CAP", default_value_t = hd(Policy::default().backoff.cap))]
    pub backoff_cap: humantime::Duration,

    /// The largest result a Complete may store, in bytes.
    #[arg(long, env = "IDEMPOTENCY_MAX_RESULT_BYTES", default_value_t = Policy::default().max_result_bytes)]
    pub max_result_bytes: usize,

    /// The longest an Acquire may wait for a holder (longer waits are cut).
    #[arg(long, env = "IDEMPOTENCY_MAX_WAIT", default_value_t = hd(Policy::default().max_wait))]
    pub max_wait: humantime::Duration,

    /// The longest window of a Watch stream (longer requests are cut).
    #[arg(long, env = "IDEMPOTENCY_MAX_WATCH", default_value_t = hd(Policy::default().max_watch))]
    pub max_watch: humantime::Duration,

    /// Calls (Acquire with wait, Watch) that may wait at once on this server;
    /// beyond it calls get RESOURCE_EXHAUSTED.
    #[arg(long, env = "IDEMPOTENCY_MAX_WAITERS", default_value_t = DEFAULT_WAITER_LIMITS.total)]
    pub max_waiters: usize,

    /// Calls of one tenant that may wait at once on this server.
    #[arg(long, env = "IDEMPOTENCY_MAX_WAITERS_PER_TENANT", default_value_t = DEFAULT_WAITER_LIMITS.per_tenant)]
    pub max_waiters_per_tenant: usize,

    /// Concurrent calls (HTTP/2 streams) one client connection may have open.
    #[arg(long, env = "IDEMPOTENCY_MAX_CONCURRENT_STREAMS", default_value_t = DEFAULT_MAX_STREAMS)]
    pub max_concurrent_streams: u32,

    /// The largest request message the server accepts, in bytes (at least the
    /// result limit plus 64 KiB).
    #[arg(long, env = "IDEMPOTENCY_MAX_REQUEST_BYTES", default_value_t = DEFAULT_MAX_REQUEST_BYTES)]
    pub max_request_bytes: usize,

    /// Request bytes, in MiB, the server holds at once while Coordinator
    /// requests arrive (with a share per call for its headers and state),
    /// on both ports together; past it calls get RESOURCE_EXHAUSTED (HTTP
    /// 429) at once. With --auth-tokens one tenant holds at most half of
    /// it, and one HTTP/JSON connection at most two of the largest bodies
    /// (4 × --max-request-bytes). Health and reflection calls have 8 MiB
    /// of their own.
    #[arg(long, env = "IDEMPOTENCY_MAX_INFLIGHT_REQUEST_MIB", default_value_t = DEFAULT_MAX_INFLIGHT_REQUEST_MIB,
          value_parser = TypedValueParser::map(clap::value_parser!(u32).range(1..=65536), |v| v as usize))]
    pub max_inflight_request_mib: usize,

    /// How long a request's body may take to arrive after its headers
    /// (DEADLINE_EXCEEDED after that, and the call does not run).
    #[arg(long, env = "IDEMPOTENCY_REQUEST_BODY_TIMEOUT", default_value_t = hd(DEFAULT_REQUEST_BODY_TIMEOUT))]
    pub request_body_timeout: humantime::Duration,

    /// Client connections served at once (lowered to fit the open file
    /// limit); more wait in the listen queue.
    #[arg(long, env = "IDEMPOTENCY_MAX_CONNECTIONS", default_value_t = DEFAULT_MAX_CONNECTIONS)]
    pub max_connections: usize,

    /// How long a new connection may take to complete its TLS handshake and
    /// send the HTTP/2 preface before it is closed.
    #[arg(long, env = "IDEMPOTENCY_HANDSHAKE_TIMEOUT", default_value_t = hd(DEFAULT_HANDSHAKE_TIMEOUT))]
    pub handshake_timeout: humantime::Duration,

    /// Close a connection that has had no call open for this long (GOAWAY;
    /// clients reconnect on their next call); 0 keeps idle connections.
    #[arg(long, env = "IDEMPOTENCY_IDLE_TIMEOUT", default_value_t = hd(DEFAULT_IDLE_TIMEOUT))]
    pub idle_timeout: humantime::Duration,

    /// Ping a connection that has been silent this long, and drop it if the
    /// ping is not answered within --http2-keepalive-timeout; 0: no pings.
    #[arg(long, env = "IDEMPOTENCY_HTTP2_KEEPALIVE_INTERVAL", default_value_t = hd(DEFAULT_HTTP2_KEEPALIVE_INTERVAL))]
    pub http2_keepalive_interval: humantime::Duration,

    /// How long a keepalive ping may go unanswered.
    #[arg(long, env = "IDEMPOTENCY_HTTP2_KEEPALIVE_TIMEOUT", default_value_t = hd(DEFAULT_HTTP2_KEEPALIVE_TIMEOUT))]
    pub http2_keepalive_timeout: humantime::Duration,

    /// TCP keepalive probes after this much silence on a connection (the
    /// kernel drops it after three unanswered probes); 0: off.
    #[arg(long, env = "IDEMPOTENCY_TCP_KEEPALIVE", default_value_t = hd(DEFAULT_TCP_KEEPALIVE))]
    pub tcp_keepalive: humantime::Duration,

    /// How often the background sweeper deletes expired records and reclaims
    /// dead leases (one replica at a time); 0 turns it off.
    #[arg(long, env = "IDEMPOTENCY_SWEEP_INTERVAL", default_value_t = hd(DEFAULT_SWEEP_INTERVAL))]
    pub sweep_interval: humantime::Duration,

    /// Records of each kind a sweeping transaction handles at most.
    #[arg(long, env = "IDEMPOTENCY_SWEEP_BATCH", default_value_t = DEFAULT_SWEEP_BATCH)]
    pub sweep_batch: u32,

    /// How long a due record offered to one WatchDue subscriber (or the
    /// webhook) is not offered to another, unless somebody Acquires it.
    #[arg(long, env = "IDEMPOTENCY_DUE_OFFER_INTERVAL", default_value_t = hd(DEFAULT_DUE_OFFER))]
    pub due_offer_interval: humantime::Duration,

    /// How often an idle WatchDue stream looks for retries that came due.
    #[arg(long, env = "IDEMPOTENCY_DUE_POLL_INTERVAL", default_value_t = hd(DEFAULT_DUE_POLL))]
    pub due_poll_interval: humantime::Duration,

    /// POST each due record (every tenant) as JSON to this http:// or
    /// https:// URL after each sweep, for callers that cannot hold a
    /// WatchDue stream. https:// trusts the system's root certificates
    /// (SSL_CERT_FILE, SSL_CERT_DIR) unless --recovery-webhook-ca is given.
    #[arg(long, env = "IDEMPOTENCY_RECOVERY_WEBHOOK")]
    pub recovery_webhook: Option<reqwest::Url>,

    /// PEM CA certificates that an https:// webhook's certificate must
    /// chain to, in place of the system's roots (a private CA).
    #[arg(
        long,
        env = "IDEMPOTENCY_RECOVERY_WEBHOOK_CA",
        requires = "recovery_webhook"
    )]
    pub recovery_webhook_ca: Option<PathBuf>,

    /// Time limit of one webhook POST.
    #[arg(
        long,
        env = "IDEMPOTENCY_RECOVERY_WEBHOOK_TIMEOUT",
        default_value = "5s"
    )]
    pub recovery_webhook_timeout: humantime::Duration,

    /// POSTs per due record before it waits for its next offer.
    #[arg(
        long,
        env = "IDEMPOTENCY_RECOVERY_WEBHOOK_ATTEMPTS",
        default_value_t = 3
    )]
    pub recovery_webhook_attempts: u32,

    /// On SIGTERM/SIGINT, how long to keep serving after readiness turns
    /// NOT_SERVING, so load balancers stop sending new calls first.
    #[arg(long, env = "IDEMPOTENCY_SHUTDOWN_DELAY", default_value_t = hd(Duration::ZERO))]
    pub shutdown_delay: humantime::Duration,

    /// At start, how long to wait for the database to answer (and to apply
    /// migrations), retrying with backoff while liveness is SERVING and
    /// readiness NOT_SERVING, before exiting; 0 waits forever. A database
    /// URL that cannot work exits at once.
    #[arg(long, env = "IDEMPOTENCY_DATABASE_WAIT", default_value_t = hd(DEFAULT_DATABASE_WAIT))]
    pub database_wait: humantime::Duration,

    /// How often readiness asks the database whether it answers: the
    /// listener reads the database's clock every interval, and every shared
    /// connection is sent an empty query every half interval; either
    /// unanswered within an interval turns readiness NOT_SERVING.
    #[arg(long, env = "IDEMPOTENCY_HEALTH_INTERVAL", default_value_t = hd(DEFAULT_HEALTH_INTERVAL),
          value_parser = at_least_10ms)]
    pub health_interval: humantime::Duration,

    /// Serve Prometheus metrics at GET /metrics over plain HTTP on this
    /// address (port 0 picks a free port); off unless given.
    #[arg(long, env = "IDEMPOTENCY_METRICS_LISTEN")]
    pub metrics_listen: Option<SocketAddr>,

    /// Also count Acquire decisions by scope. Scopes are chosen by callers,
    /// so every scope becomes a time series: only for a bounded set.
    #[arg(long, env = "IDEMPOTENCY_METRICS_SCOPE_LABELS")]
    pub metrics_scope_labels: bool,
}

impl StoreConfig {
    /// The defaults, for `database_url`.
    pub fn new(database_url: impl Into<String>) -> Self {
        StoreConfig {
            database_url: database_url.into(),
            pool_size: DEFAULT_POOL_SIZE,
            connect_wait: DEFAULT_CONNECT_WAIT,
            query_timeout: DEFAULT_QUERY_TIMEOUT,
            shared_connections: DEFAULT_SHARED_CONNECTIONS,
            batch_size: DEFAULT_BATCH_SIZE,
            replay_cache_bytes: DEFAULT_REPLAY_CACHE_MIB << 20,
        }
    }

    /// One pooled connection that waits up to 10 s, and nothing for calls:
    /// what `migrate` needs.
    pub fn for_migrations(database_url: impl Into<String>) -> Self {
        StoreConfig {
            pool_size: 1,
            connect_wait: Duration::from_secs(10),
            shared_connections: 0,
            batch_size: 1,
            replay_cache_bytes: 0,
            ..StoreConfig::new(database_url)
        }
    }
}

/// A health interval: at least 10 ms, so that checks cannot spin.
fn at_least_10ms(value: &str) -> Result<humantime::Duration, String> {
    let d: humantime::Duration = value.parse().map_err(|e| format!("{e}"))?;
    if Duration::from(d) < Duration::from_millis(10) {
        return Err("must be at least 10ms".to_owned());
    }
    Ok(d)
}

fn nonzero(d: Duration) -> Option<Duration> {
    (!d.is_zero()).then_some(d)
}

/// Everything `serve` needs, resolved.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// Where the gRPC port is served (port 0 picks a free one).
    pub listen: SocketAddr,
    /// Where the HTTP/JSON door is served; `None`: nowhere.
    pub http_listen: Option<SocketAddr>,
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
            http_listen: None,
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
            connections: ConnectionLimits {
                max_connections: DEFAULT_MAX_CONNECTIONS,
                max_concurrent_streams: DEFAULT_MAX_STREAMS,
                handshake_timeout: DEFAULT_HANDSHAKE_TIMEOUT,
                idle_timeout: Some(DEFAULT_IDLE_TIMEOUT),
                keepalive_interval: Some(DEFAULT_HTTP2_KEEPALIVE_INTERVAL),
                keepalive_timeout: DEFAULT_HTTP2_KEEPALIVE_TIMEOUT,
                tcp_keepalive: Some(DEFAULT_TCP_KEEPALIVE),
                max_header_list_bytes: MAX_HEADER_LIST_BYTES,
                window_bytes: WINDOW_BYTES,
            },
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
        let defaults = Policy::default();
        ServeConfig {
            listen: a.listen,
            http_listen: a.http_listen,
            store: StoreConfig {
                database_url: a.database.database_url.unwrap_or_default(),
                pool_size: a.pool_size,
                connect_wait: a.connect_wait.into(),
                query_timeout: a.query_timeout.into(),
                shared_connections: a.shared_connections,
                batch_size: a.batch_size,
                replay_cache_bytes: a.replay_cache_mib << 20,
            },
            policy: Policy {
                default_lease_ttl: a.default_lease_ttl.into(),
                max_lease_ttl: a.max_lease_ttl.into(),
                default_max_attempts: a.default_max_attempts,
                max_max_attempts: a.max_attempts_limit,
                default_retention: a.default_retention.into(),
                max_retention: a.max_retention.into(),
                backoff: Backoff {
                    base: a.backoff_base.into(),
                    cap: a.backoff_cap.into(),
                },
                max_result_bytes: a.max_result_bytes,
                max_wait: a.max_wait.into(),
                max_watch: a.max_watch.into(),
                ..defaults
            },
            run_migrations: !a.skip_migrations,
            shutdown_delay: a.shutdown_delay.into(),
            health_interval: a.health_interval.into(),
            sweep_interval: a.sweep_interval.into(),
            sweep_batch: a.sweep_batch,
            feed: FeedConfig {
                offer: a.due_offer_interval.into(),
                poll: a.due_poll_interval.into(),
            },
            webhook: a.recovery_webhook.map(|url| WebhookConfig {
                url,
                ca: a.recovery_webhook_ca,
                timeout: a.recovery_webhook_timeout.into(),
                attempts: a.recovery_webhook_attempts,
                offer: a.due_offer_interval.into(),
            }),
            auth_tokens: a.auth_tokens,
            waiter_limits: WaiterLimits {
                total: a.max_waiters,
                per_tenant: a.max_waiters_per_tenant,
            },
            max_request_bytes: a.max_request_bytes,
            max_inflight_request_bytes: a.max_inflight_request_mib << 20,
            request_body_timeout: a.request_body_timeout.into(),
            connections: ConnectionLimits {
                max_connections: a.max_connections,
                max_concurrent_streams: a.max_concurrent_streams,
                handshake_timeout: a.handshake_timeout.into(),
                idle_timeout: nonzero(a.idle_timeout.into()),
                keepalive_interval: nonzero(a.http2_keepalive_interval.into()),
                keepalive_timeout: a.http2_keepalive_timeout.into(),
                tcp_keepalive: nonzero(a.tcp_keepalive.into()),
                max_header_list_bytes: MAX_HEADER_LIST_BYTES,
                window_bytes: WINDOW_BYTES,
            },
            allow_empty_credentials: a.allow_empty_credentials,
            tls: a.tls.files(),
            database_wait: nonzero(a.database_wait.into()),
            metrics_listen: a.metrics_listen,
            metrics_scope_labels: a.metrics_scope_labels,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_flags_default_to_the_contract() {
        let cli = Cli::try_parse_from([
            "idempotency-coordinator",
            "serve",
            "--database-url",
            "postgres://x@y/z",
        ])
        .unwrap();
        let Command::Serve(args) = cli.command else {
            panic!("serve expected")
        };
        let config = ServeConfig::from(*args);
        assert_eq!(config.policy, Policy::default());
        assert_eq!(config.listen, "127.0.0.1:50051".parse().unwrap());
    }

    #[test]
    fn durations_read_as_human_text() {
        let cli = Cli::try_parse_from([
            "idempotency-coordinator",
            "serve",
            "--database-url",
            "postgres://x@y/z",
            "--default-lease-ttl",
            "90s",
            "--backoff-cap",
            "10m",
        ])
        .unwrap();
        let Command::Serve(args) = cli.command else {
            panic!("serve expected")
        };
        let config = ServeConfig::from(*args);
        assert_eq!(config.policy.default_lease_ttl, Duration::from_secs(90));
        assert_eq!(config.policy.backoff.cap, Duration::from_secs(600));
    }
}

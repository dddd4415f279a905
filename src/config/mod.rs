//! Flags, each with an environment fallback, and their defaults, each
//! written once: request defaults and limits come from `Policy::default()`,
//! the rest from constants kept beside the flags they are the defaults of
//! and re-exported here.
//!
//! By what they configure: `database` (the URL, the pool, how statements
//! reach the database; `StoreConfig`'s defaults), `auth` (the credentials
//! file), `tls` (shared by `serve` and `health`), `policy` (the defaults and
//! limits of requests), `limits` (waiters, request bytes and time,
//! connections), `recovery` (the sweeper, the WatchDue feed, the webhook),
//! `lifecycle` (waiting for the database at start, readiness, shutdown),
//! `health` (the `health` command), and `serve`, which groups them into the
//! `serve` command's flags and resolves them into a [`ServeConfig`]. The
//! command line itself, with the logging and tracing flags every command
//! takes, is here.

use std::time::Duration;

use clap::{Parser, Subcommand};

mod auth;
mod database;
mod health;
mod lifecycle;
mod limits;
mod policy;
mod recovery;
mod serve;
mod tls;

pub use crate::telemetry::LogFormat;
pub use auth::AuthArgs;
pub use database::{
    BatchWorkers, DEFAULT_BATCH_SIZE, DEFAULT_CONNECT_WAIT, DEFAULT_POOL_SIZE,
    DEFAULT_QUERY_TIMEOUT, DEFAULT_REPLAY_CACHE_MIB, DEFAULT_SHARED_CONNECTIONS, DatabaseArgs,
    PoolArgs, StatementArgs,
};
pub use health::HealthArgs;
pub use lifecycle::{DEFAULT_DATABASE_WAIT, DEFAULT_HEALTH_INTERVAL, LifecycleArgs};
pub use limits::{
    DEFAULT_HANDSHAKE_TIMEOUT, DEFAULT_HTTP2_KEEPALIVE_INTERVAL, DEFAULT_HTTP2_KEEPALIVE_TIMEOUT,
    DEFAULT_IDLE_TIMEOUT, DEFAULT_MAX_CONNECTIONS, DEFAULT_MAX_INFLIGHT_REQUEST_MIB,
    DEFAULT_MAX_REQUEST_BYTES, DEFAULT_MAX_STREAMS, DEFAULT_REQUEST_BODY_TIMEOUT,
    DEFAULT_TCP_KEEPALIVE, DEFAULT_WAITER_LIMITS, LimitsArgs,
};
pub use policy::PolicyArgs;
pub use recovery::{
    DEFAULT_DUE_OFFER, DEFAULT_DUE_POLL, DEFAULT_SWEEP_BATCH, DEFAULT_SWEEP_INTERVAL, RecoveryArgs,
};
pub use serve::{ServeArgs, ServeConfig};
pub use tls::TlsArgs;

fn hd(d: Duration) -> humantime::Duration {
    d.into()
}

fn nonzero(d: Duration) -> Option<Duration> {
    (!d.is_zero()).then_some(d)
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

    /// Threads that run calls: 0 (the default) for one per core the process
    /// may use (TOKIO_WORKER_THREADS overrides that), N for N. Fewer threads
    /// than cores wake each other less: on two cores shared with the
    /// database, 1 spent about a sixth less server CPU per Acquire +
    /// Complete, but caps the server at one core (docs/performance.md).
    #[arg(
        long,
        env = "IDEMPOTENCY_WORKER_THREADS",
        global = true,
        default_value_t = 0
    )]
    pub worker_threads: u16,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::Policy;

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
    fn the_flags_default_to_what_servers_built_in_code_get() {
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
        let from_flags = ServeConfig::from(*args);
        let in_code = ServeConfig::new(from_flags.listen, "postgres://x@y/z");
        assert_eq!(format!("{from_flags:?}"), format!("{in_code:?}"));
    }

    #[test]
    fn worker_threads_default_to_one_per_core_and_may_be_named_after_serve_or_before() {
        let parse = |args: &[&str]| {
            Cli::try_parse_from(
                ["idempotency-coordinator"]
                    .iter()
                    .chain(args)
                    .chain(&["--database-url", "postgres://x@y/z"]),
            )
        };
        assert_eq!(parse(&["serve"]).unwrap().worker_threads, 0);
        assert_eq!(
            parse(&["serve", "--worker-threads", "1"])
                .unwrap()
                .worker_threads,
            1
        );
        assert_eq!(
            parse(&["--worker-threads", "3", "serve"])
                .unwrap()
                .worker_threads,
            3
        );
        let refused = parse(&["serve", "--worker-threads", "many"]).unwrap_err();
        assert!(
            refused.to_string().contains("--worker-threads"),
            "{refused}"
        );
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

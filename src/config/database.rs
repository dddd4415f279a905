//! The database: where it is (or where a private one is started), the
//! pool, and how statements reach it (shared connections, batches, the
//! replay cache, the statement time limit, migrations at start).

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use clap::builder::TypedValueParser;

use super::hd;
use crate::store::StoreConfig;

/// Connections the pool keeps open at most.
pub const DEFAULT_POOL_SIZE: usize = 16;
/// How long a call waits for a database connection before UNAVAILABLE.
pub const DEFAULT_CONNECT_WAIT: Duration = Duration::from_secs(1);
/// Connections all calls share, their statements pipelined (measured best
/// on 2 cores; see README); 0: a pooled connection per call.
pub const DEFAULT_SHARED_CONNECTIONS: usize = 2;
/// Acquires (or Completes) that one statement carries at most when they
/// arrive together; 1: each runs alone.
pub const DEFAULT_BATCH_SIZE: usize = 64;
/// Auto: two batches pipelined on one connection while no other replica
/// shares the database, one at a time (the fewest commits and the least
/// database CPU per call) while others do (docs/performance.md, "Two
/// batches, one connection").
pub const DEFAULT_BATCH_WORKERS: BatchWorkers = BatchWorkers(None);
/// Memory for SUCCEEDED records that replays are answered from, in MiB.
pub const DEFAULT_REPLAY_CACHE_MIB: u64 = 8;
/// How long one statement may take before the call answers UNAVAILABLE.
pub const DEFAULT_QUERY_TIMEOUT: Duration = Duration::from_secs(10);

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

/// The pool of database connections.
#[derive(Debug, Clone, Args)]
pub struct PoolArgs {
    /// Database connections kept open at most by this replica.
    #[arg(long, env = "IDEMPOTENCY_POOL_SIZE", default_value_t = DEFAULT_POOL_SIZE)]
    pub pool_size: usize,

    /// How long a call waits for a database connection before it answers
    /// UNAVAILABLE (never longer than the call's own deadline).
    #[arg(long, env = "IDEMPOTENCY_CONNECT_WAIT", default_value_t = hd(DEFAULT_CONNECT_WAIT))]
    pub connect_wait: humantime::Duration,
}

/// How statements reach the database: shared connections and batches, the
/// replay cache, the statement time limit, and migrations at start.
#[derive(Debug, Clone, Args)]
pub struct StatementArgs {
    /// Connections shared by all calls, their statements pipelined on them
    /// (0: every call takes a pooled connection of its own, no batches).
    #[arg(long, env = "IDEMPOTENCY_SHARED_CONNECTIONS", default_value_t = DEFAULT_SHARED_CONNECTIONS)]
    pub shared_connections: usize,

    /// Acquires and Completes that arrive together share one statement and
    /// one commit, up to this many (1: each runs alone). Needs
    /// --shared-connections above 0. A batch goes out at once while no other
    /// is out; behind one that is, once it carries as many calls (if that
    /// one has been out under 20 ms), or else when that one is answered.
    #[arg(long, env = "IDEMPOTENCY_BATCH_SIZE", default_value_t = DEFAULT_BATCH_SIZE,
          value_parser = TypedValueParser::map(clap::value_parser!(u16).range(1..=1000), usize::from))]
    pub batch_size: usize,

    /// Batches out at once: `auto`, or a number (0: two per shared
    /// connection). `auto`, the default, sends two on the first shared
    /// connection while no other replica shares the database (counted at
    /// every health probe: the sessions holding a shared advisory lock
    /// each replica takes), else one at a time; the switch is logged and
    /// shown by the `batches_pipelined` metric. One sends each batch after
    /// the last was answered: the biggest batches, the fewest commits and
    /// the least database CPU per call, while the database waits for the
    /// server between batches. Two with --shared-connections 1 pipeline
    /// always: the second is sent while the first runs, so the database
    /// starts it the moment the first commits, and it waits to carry as
    /// many calls as the first; where several replicas share a database,
    /// their batches get smaller and cost it more. More, on more
    /// connections, run batches side by side, each waiting until it carries
    /// as many calls as are out, for a database with cores to spare.
    #[arg(long, env = "IDEMPOTENCY_BATCH_WORKERS", default_value_t = DEFAULT_BATCH_WORKERS)]
    pub batch_workers: BatchWorkers,

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

    /// On a Citus cluster, send every call through the coordinator node
    /// instead of straight to the worker holding its key (for a network
    /// where this server cannot reach the workers). Direct by default: the
    /// coordinator node then does no work per call.
    #[arg(long, env = "IDEMPOTENCY_CITUS_VIA_COORDINATOR")]
    pub citus_via_coordinator: bool,

    /// Do not apply pending migrations at start (run `migrate` separately).
    #[arg(long, env = "IDEMPOTENCY_SKIP_MIGRATIONS")]
    pub skip_migrations: bool,
}

/// `--batch-workers`: `auto` (`None`) or a number of workers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchWorkers(pub Option<usize>);

impl std::str::FromStr for BatchWorkers {
    type Err = String;

    fn from_str(value: &str) -> Result<Self, Self::Err> {
        if value.eq_ignore_ascii_case("auto") {
            return Ok(BatchWorkers(None));
        }
        value
            .parse()
            .map(|n| BatchWorkers(Some(n)))
            .map_err(|_| format!("`{value}` is neither `auto` nor a number of workers"))
    }
}

impl std::fmt::Display for BatchWorkers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            None => f.write_str("auto"),
            Some(n) => write!(f, "{n}"),
        }
    }
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
            batch_workers: DEFAULT_BATCH_WORKERS.0,
            replay_cache_bytes: DEFAULT_REPLAY_CACHE_MIB << 20,
            citus_direct: true,
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

impl StatementArgs {
    /// The store's configuration for `database_url`, with `pool`.
    pub(super) fn store(&self, database_url: Option<String>, pool: &PoolArgs) -> StoreConfig {
        StoreConfig {
            database_url: database_url.unwrap_or_default(),
            pool_size: pool.pool_size,
            connect_wait: pool.connect_wait.into(),
            query_timeout: self.query_timeout.into(),
            shared_connections: self.shared_connections,
            batch_size: self.batch_size,
            batch_workers: self.batch_workers.0,
            replay_cache_bytes: self.replay_cache_mib << 20,
            citus_direct: !self.citus_via_coordinator,
        }
    }
}

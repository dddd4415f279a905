//! Prometheus metrics for operators: what every layer counts, and the plain
//! HTTP listener (`--metrics-listen`) that serves them at `GET /metrics`.
//!
//! A leaf: it uses nothing of ours, so every layer may call it. The
//! metrics live in one process-wide registry (a `LazyLock` static), so that
//! recording a value needs no handle threaded through constructors: a call
//! such as `metrics::replay_lookup(true)` is all a layer adds. The price is
//! that servers sharing a process (the in-process test servers) share
//! counters; tests that read exact values start a server process of their
//! own.
//!
//! Labels are bounded: methods and gRPC codes come from fixed tables (a path
//! no service answers is `unknown`), kinds and reasons are enumerations.
//! Scopes are chosen by callers, so a scope label appears only on one
//! family, and only when the operator asks for it (`--metrics-scope-labels`).
//! No key, token, tenant or request field is ever a label: tenants are
//! bounded by the credentials file, but their names identify customers, and
//! the per-tenant waiter limit has its own refusal label.
//!
//! Values that are state rather than events (the pool, the shared
//! connections, waiters, the replay cache's bytes) are read when a scrape
//! arrives, from a [`Snapshot`] that `startup` builds from the store and the
//! hub.
//!
//! `docs/operations.md` lists every metric, its labels and the alerts on it.

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant};

use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method as HttpMethod, Request, Response, StatusCode, header};
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::{Registry, Unit};
use tokio::net::TcpListener;
use tonic::Code;

/// The services and methods this server answers: the only values the
/// `service` and `method` labels take, besides `unknown`.
const SERVICES: &[(&str, &[&str])] = &[
    (
        "idempotency.v1.Coordinator",
        &[
            "Acquire",
            "Complete",
            "ExtendLease",
            "Get",
            "Watch",
            "WatchDue",
            "Sweep",
        ],
    ),
    ("grpc.health.v1.Health", &["Check", "Watch"]),
    (
        "grpc.reflection.v1.ServerReflection",
        &["ServerReflectionInfo"],
    ),
    (
        "grpc.reflection.v1alpha.ServerReflection",
        &["ServerReflectionInfo"],
    ),
];

/// The label value of anything not in a fixed table.
const UNKNOWN: &str = "unknown";

/// Call latency buckets, in seconds: sub-millisecond answers up to the
/// longest wait window (`--max-wait`, 1 min by default).
const LATENCY_BUCKETS: [f64; 16] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0,
];

/// Calls per batch statement: 1 up to the largest `--batch-size` (1000).
const BATCH_BUCKETS: [f64; 11] = [
    1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1000.0,
];

/// How long a sweeping round takes, in seconds.
const SWEEP_BUCKETS: [f64; 10] = [0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0];

/// Scrape connections open at once; past it, a new one closes the one idle
/// longest (if idle for `SCRAPE_EVICTABLE_AFTER`), or waits for one to end.
pub const MAX_SCRAPE_CONNECTIONS: usize = 128;

/// How long a scrape connection must have gone without a request before a
/// new connection may close it: a scraper's connection sends its request
/// at once, and is never closed before the server has read it.
const SCRAPE_EVICTABLE_AFTER: Duration = Duration::from_millis(250);

/// How long a scraper may take to send its request's headers.
const SCRAPE_HEADER_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MethodLabels {
    service: &'static str,
    method: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RpcLabels {
    service: &'static str,
    method: &'static str,
    code: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DecisionLabels {
    decision: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ScopeDecisionLabels {
    decision: &'static str,
    scope: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PortReasonLabels {
    port: &'static str,
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RefusedWaiterLabels {
    kind: &'static str,
    limit: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StreamLabels {
    method: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ActionLabels {
    action: &'static str,
}

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

fn latency_histogram() -> Histogram {
    Histogram::new(LATENCY_BUCKETS)
}

fn batch_histogram() -> Histogram {
    Histogram::new(BATCH_BUCKETS)
}

/// Every metric of the process, and the registry that encodes them.
struct Metrics {
    registry: Registry,
    rpcs: Family<RpcLabels, Counter>,
    rpc_duration: HistogramFamily<MethodLabels>,
    decisions: Family<DecisionLabels, Counter>,
    decisions_by_scope: Family<ScopeDecisionLabels, Counter>,
    takeovers: Counter,
    refusals: Family<ReasonLabels, Counter>,
    requests_refused: Family<PortReasonLabels, Counter>,
    database_errors: Family<KindLabels, Counter>,
    batch_size: HistogramFamily<KindLabels>,
    group_commits: Family<KindLabels, Counter>,
    batch_queued: Gauge,
    replay_lookups: Family<ResultLabels, Counter>,
    replay_bytes: Gauge,
    waiters: Gauge,
    waiters_parked: Gauge,
    watched_records: Gauge,
    waiters_refused: Family<RefusedWaiterLabels, Counter>,
    streams_open: Family<StreamLabels, Gauge>,
    ready: Gauge,
    listener_connected: Gauge,
    listener_connections: Counter,
    sweeps: Family<OutcomeLabels, Counter>,
    sweep_duration: Histogram,
    swept: Family<ActionLabels, Counter>,
    retries_due: Gauge,
    pool_max: Gauge,
    pool_size: Gauge,
    pool_available: Gauge,
    pool_waiting: Gauge,
    shared_connections: Gauge,
    shared_connected: Gauge,
}

impl Metrics {
    fn new() -> Self {
        let mut m = Metrics {
            registry: Registry::with_prefix("idempotency"),
            rpcs: Family::default(),
            rpc_duration: Family::new_with_constructor(latency_histogram),
            decisions: Family::default(),
            decisions_by_scope: Family::default(),
            takeovers: Counter::default(),
            refusals: Family::default(),
            requests_refused: Family::default(),
            database_errors: Family::default(),
            batch_size: Family::new_with_constructor(batch_histogram),
            group_commits: Family::default(),
            batch_queued: Gauge::default(),
            replay_lookups: Family::default(),
            replay_bytes: Gauge::default(),
            waiters: Gauge::default(),
            waiters_parked: Gauge::default(),
            watched_records: Gauge::default(),
            waiters_refused: Family::default(),
            streams_open: Family::default(),
            ready: Gauge::default(),
            listener_connected: Gauge::default(),
            listener_connections: Counter::default(),
            sweeps: Family::default(),
            sweep_duration: Histogram::new(SWEEP_BUCKETS),
            swept: Family::default(),
            retries_due: Gauge::default(),
            pool_max: Gauge::default(),
            pool_size: Gauge::default(),
            pool_available: Gauge::default(),
            pool_waiting: Gauge::default(),
            shared_connections: Gauge::default(),
            shared_connected: Gauge::default(),
        };
        let r = &mut m.registry;
        r.register(
            "build",
            "The server's version",
            Info::new([("version", env!("CARGO_PKG_VERSION"))]),
        );
        r.register(
            "rpcs",
            "Calls answered, by service, method and gRPC status code (calls refused at admission included; a call whose client went away is CANCELLED)",
            m.rpcs.clone(),
        );
        r.register_with_unit(
            "rpc_duration",
            "Time from a call's admission to its final status (for streams: the stream's life), by service and method",
            Unit::Seconds,
            m.rpc_duration.clone(),
        );
        r.register(
            "acquire_decisions",
            "Acquire answers, by decision",
            m.decisions.clone(),
        );
        r.register(
            "acquire_decisions_by_scope",
            "Acquire answers, by decision and scope (only with --metrics-scope-labels)",
            m.decisions_by_scope.clone(),
        );
        r.register(
            "lease_takeovers",
            "Acquires that took over a key whose previous lease ran out before it completed (PROCEED, attempt above 1, no failure reported since)",
            m.takeovers.clone(),
        );
        r.register(
            "refusals",
            "Calls on a lease or record refused, by reason (LEASE_LOST, LEASE_EXPIRED, ALREADY_COMPLETED, RECORD_NOT_FOUND)",
            m.refusals.clone(),
        );
        r.register(
            "requests_refused",
            "Requests refused at the edge before a service saw them, by port (grpc, http) and reason (unauthenticated; overloaded, tenant_share, connection_share: no room in the in-flight byte budget or its tenant's or connection's share; too_large, too_slow, too_many_values, media_type, cross_site, malformed, invalid, not_found, method)",
            m.requests_refused.clone(),
        );
        r.register(
            "database_errors",
            "Calls that failed on the database, by kind (unavailable, timeout, pool_timeout, query, corrupt, config)",
            m.database_errors.clone(),
        );
        r.register(
            "batch_size",
            "Calls carried by one statement of the batch workers, by kind (acquire, complete)",
            m.batch_size.clone(),
        );
        r.register(
            "group_commits",
            "Batch statements that carried two or more calls in one commit, by kind",
            m.group_commits.clone(),
        );
        r.register(
            "batch_queued_calls",
            "Acquires and Completes waiting for a batch worker",
            m.batch_queued.clone(),
        );
        r.register(
            "replay_cache_lookups",
            "Acquires looked up in the replay cache, by result (hit: answered from memory)",
            m.replay_lookups.clone(),
        );
        r.register_with_unit(
            "replay_cache",
            "Memory the replay cache holds",
            Unit::Bytes,
            m.replay_bytes.clone(),
        );
        r.register(
            "waiters",
            "Calls waiting on this server (Acquire with wait, Watch, WatchDue)",
            m.waiters.clone(),
        );
        r.register(
            "waiters_parked",
            "Waiters asleep until their record changes",
            m.waiters_parked.clone(),
        );
        r.register(
            "watched_records",
            "Records at least one call on this server waits on",
            m.watched_records.clone(),
        );
        r.register(
            "waiters_refused",
            "Calls refused RESOURCE_EXHAUSTED by the waiter limits, by kind (record: Acquire with wait and Watch; due: WatchDue) and limit (server, tenant)",
            m.waiters_refused.clone(),
        );
        r.register(
            "streams_open",
            "Watch and WatchDue streams open, by method",
            m.streams_open.clone(),
        );
        r.register(
            "ready",
            "1 while readiness (health service idempotency.v1.Coordinator) is SERVING: the listener is connected and the calls' connections answer",
            m.ready.clone(),
        );
        r.register(
            "listener_connected",
            "1 while the LISTEN connection is up and reading the database's clock on time (readiness needs it; waiters poll without it)",
            m.listener_connected.clone(),
        );
        r.register(
            "listener_connections",
            "LISTEN sessions established: the first, and one per reconnect",
            m.listener_connections.clone(),
        );
        r.register(
            "sweeps",
            "Background sweeping rounds, by outcome (swept, skipped: another replica sweeps, failed)",
            m.sweeps.clone(),
        );
        r.register_with_unit(
            "sweep_duration",
            "How long a background sweeping round took",
            Unit::Seconds,
            m.sweep_duration.clone(),
        );
        r.register(
            "swept_records",
            "Records swept (background and Sweep calls), by action (expired_deleted, leases_reclaimed)",
            m.swept.clone(),
        );
        r.register(
            "retries_due",
            "FAILED records whose retry is due, as of the last background sweep",
            m.retries_due.clone(),
        );
        r.register(
            "db_pool_max_size",
            "Pooled database connections allowed (--pool-size)",
            m.pool_max.clone(),
        );
        r.register(
            "db_pool_size",
            "Pooled database connections open",
            m.pool_size.clone(),
        );
        r.register(
            "db_pool_available",
            "Pooled database connections open and idle",
            m.pool_available.clone(),
        );
        r.register(
            "db_pool_waiting",
            "Calls waiting for a pooled database connection",
            m.pool_waiting.clone(),
        );
        r.register(
            "db_shared_connections",
            "Shared, pipelined database connections configured (--shared-connections)",
            m.shared_connections.clone(),
        );
        r.register(
            "db_shared_connections_connected",
            "Shared database connections connected now",
            m.shared_connected.clone(),
        );
        m.zero();
        m
    }

    /// Creates the series of every bounded label value at zero, so that
    /// `rate()` and `increase()` see the first event, and alerts on a
    /// series that has not moved yet have one to read.
    fn zero(&self) {
        for decision in DECISIONS {
            let _ = self.decisions.get_or_create(&DecisionLabels { decision });
        }
        for reason in REFUSALS {
            let _ = self.refusals.get_or_create(&ReasonLabels { reason });
        }
        for port in [Port::Grpc, Port::Http] {
            for reason in EDGE_REFUSALS {
                let _ = self.requests_refused.get_or_create(&PortReasonLabels {
                    port: port.label(),
                    reason,
                });
            }
        }
        for kind in DatabaseError::ALL {
            let _ = self
                .database_errors
                .get_or_create(&KindLabels { kind: kind.label() });
        }
        for kind in [BatchKind::Acquire, BatchKind::Complete] {
            let labels = KindLabels { kind: kind.label() };
            let _ = self.batch_size.get_or_create(&labels);
            let _ = self.group_commits.get_or_create(&labels);
        }
        for result in ["hit", "miss"] {
            let _ = self.replay_lookups.get_or_create(&ResultLabels { result });
        }
        for kind in ["record", "due"] {
            for limit in ["server", "tenant"] {
                let _ = self
                    .waiters_refused
                    .get_or_create(&RefusedWaiterLabels { kind, limit });
            }
        }
        for method in ["Watch", "WatchDue"] {
            let _ = self.streams_open.get_or_create(&StreamLabels { method });
        }
        for outcome in ["swept", "skipped", "failed"] {
            let _ = self.sweeps.get_or_create(&OutcomeLabels { outcome });
        }
        for action in ["expired_deleted", "leases_reclaimed"] {
            let _ = self.swept.get_or_create(&ActionLabels { action });
        }
    }
}

/// Acquire's decisions, as the contract names them.
const DECISIONS: [&str; 6] = [
    "PROCEED",
    "ALREADY_DONE",
    "IN_PROGRESS",
    "RETRY_LATER",
    "CONFLICT",
    "EXHAUSTED",
];

/// The reasons a call on a lease or record is refused (`ErrorInfo.reason`).
const REFUSALS: [&str; 4] = [
    "RECORD_NOT_FOUND",
    "LEASE_LOST",
    "LEASE_EXPIRED",
    "ALREADY_COMPLETED",
];

/// The reasons a request is refused at the edge that both ports share,
/// created at zero.
const EDGE_REFUSALS: [&str; 6] = [
    "unauthenticated",
    "overloaded",
    "tenant_share",
    "too_large",
    "too_slow",
    "connection_share",
];

static METRICS: LazyLock<Metrics> = LazyLock::new(Metrics::new);

/// Whether Acquire decisions are also counted by scope.
static SCOPE_LABELS: AtomicBool = AtomicBool::new(false);

/// Counts Acquire decisions by scope as well (`--metrics-scope-labels`).
/// Scopes are chosen by callers: every scope seen becomes a series.
pub fn set_scope_labels(on: bool) {
    SCOPE_LABELS.store(on, Ordering::Relaxed);
}

fn count(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// The canonical name of a gRPC status code.
fn code_name(code: Code) -> &'static str {
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "CANCELLED",
        Code::Unknown => "UNKNOWN",
        Code::InvalidArgument => "INVALID_ARGUMENT",
        Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        Code::NotFound => "NOT_FOUND",
        Code::AlreadyExists => "ALREADY_EXISTS",
        Code::PermissionDenied => "PERMISSION_DENIED",
        Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        Code::FailedPrecondition => "FAILED_PRECONDITION",
        Code::Aborted => "ABORTED",
        Code::OutOfRange => "OUT_OF_RANGE",
        Code::Unimplemented => "UNIMPLEMENTED",
        Code::Internal => "INTERNAL",
        Code::Unavailable => "UNAVAILABLE",
        Code::DataLoss => "DATA_LOSS",
        Code::Unauthenticated => "UNAUTHENTICATED",
    }
}

/// The service and method a call's path names, from the fixed table.
fn method_of(path: &str) -> MethodLabels {
    let unknown = MethodLabels {
        service: UNKNOWN,
        method: UNKNOWN,
    };
    let Some((service, method)) = path.strip_prefix('/').and_then(|p| p.split_once('/')) else {
        return unknown;
    };
    let Some((service, methods)) = SERVICES.iter().find(|(name, _)| *name == service) else {
        return unknown;
    };
    MethodLabels {
        service,
        method: methods
            .iter()
            .find(|name| **name == method)
            .copied()
            .unwrap_or(UNKNOWN),
    }
}

/// One call, from its admission until its final status is known. Dropped
/// without [`Rpc::finish`] (the client went away, or the answer was dropped
/// before its status was sent), it counts as CANCELLED.
#[derive(Debug)]
pub struct Rpc {
    method: MethodLabels,
    started: Instant,
    finished: bool,
}

impl Rpc {
    /// A call to `path` (`/package.Service/Method`) starts now.
    pub fn start(path: &str) -> Self {
        Rpc {
            method: method_of(path),
            started: Instant::now(),
            finished: false,
        }
    }

    /// The call's final status is `code`.
    pub fn finish(mut self, code: Code) {
        self.record(code);
    }

    fn record(&mut self, code: Code) {
        self.finished = true;
        let m = &*METRICS;
        m.rpcs
            .get_or_create(&RpcLabels {
                service: self.method.service,
                method: self.method.method,
                code: code_name(code),
            })
            .inc();
        m.rpc_duration
            .get_or_create(&self.method)
            .observe(self.started.elapsed().as_secs_f64());
    }
}

impl Drop for Rpc {
    fn drop(&mut self) {
        if !self.finished {
            self.record(Code::Cancelled);
        }
    }
}

/// An Acquire answered `decision` (its name in the contract, e.g.
/// `PROCEED`) for `scope`; `takeover` when it took over a lease that ran out.
pub fn acquired(decision: &'static str, scope: &str, takeover: bool) {
    let m = &*METRICS;
    m.decisions
        .get_or_create(&DecisionLabels { decision })
        .inc();
    if SCOPE_LABELS.load(Ordering::Relaxed) {
        m.decisions_by_scope
            .get_or_create(&ScopeDecisionLabels {
                decision,
                scope: scope.to_owned(),
            })
            .inc();
    }
    if takeover {
        m.takeovers.inc();
    }
}

/// A call on a lease or record was refused for `reason` (the status's
/// ErrorInfo reason, e.g. `LEASE_LOST`).
pub fn refused(reason: &'static str) {
    METRICS
        .refusals
        .get_or_create(&ReasonLabels { reason })
        .inc();
}

/// The port a request came in on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Port {
    /// The gRPC port (`--listen`).
    Grpc,
    /// The HTTP/JSON port (`--http-listen`).
    Http,
}

impl Port {
    fn label(self) -> &'static str {
        match self {
            Port::Grpc => "grpc",
            Port::Http => "http",
        }
    }
}

/// A request was refused at the edge (admission, or the HTTP/JSON door)
/// before any service saw it; `reason` is one of a fixed set (see the
/// metric's help).
pub fn request_refused(port: Port, reason: &'static str) {
    METRICS
        .requests_refused
        .get_or_create(&PortReasonLabels {
            port: port.label(),
            reason,
        })
        .inc();
}

/// Why a call failed on the database.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DatabaseError {
    /// Connections refused or lost, the server shutting down or out of
    /// resources, a deadlock.
    Unavailable,
    /// A statement that did not answer within `--query-timeout`.
    Timeout,
    /// No pooled connection (or batch worker) was free within the wait.
    PoolTimeout,
    /// An error retrying will not fix (a bug or a broken schema).
    Query,
    /// A row that does not match what the SQL functions promise.
    Corrupt,
    /// The database URL or pool settings cannot be used.
    Config,
}

impl DatabaseError {
    const ALL: [DatabaseError; 6] = [
        DatabaseError::Unavailable,
        DatabaseError::Timeout,
        DatabaseError::PoolTimeout,
        DatabaseError::Query,
        DatabaseError::Corrupt,
        DatabaseError::Config,
    ];

    fn label(self) -> &'static str {
        match self {
            DatabaseError::Unavailable => "unavailable",
            DatabaseError::Timeout => "timeout",
            DatabaseError::PoolTimeout => "pool_timeout",
            DatabaseError::Query => "query",
            DatabaseError::Corrupt => "corrupt",
            DatabaseError::Config => "config",
        }
    }
}

/// A call failed on the database.
pub fn database_error(kind: DatabaseError) {
    METRICS
        .database_errors
        .get_or_create(&KindLabels { kind: kind.label() })
        .inc();
}

/// Which hot call a batch carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BatchKind {
    Acquire,
    Complete,
}

impl BatchKind {
    fn label(self) -> &'static str {
        match self {
            BatchKind::Acquire => "acquire",
            BatchKind::Complete => "complete",
        }
    }
}

/// A batch worker sends one statement carrying `calls` calls (0: none was
/// left to run, and nothing is counted).
pub fn batch_ran(kind: BatchKind, calls: usize) {
    if calls == 0 {
        return;
    }
    let m = &*METRICS;
    let labels = KindLabels { kind: kind.label() };
    m.batch_size.get_or_create(&labels).observe(calls as f64);
    if calls > 1 {
        m.group_commits.get_or_create(&labels).inc();
    }
}

/// An Acquire was looked up in the replay cache.
pub fn replay_lookup(hit: bool) {
    let result = if hit { "hit" } else { "miss" };
    METRICS
        .replay_lookups
        .get_or_create(&ResultLabels { result })
        .inc();
}

/// What a refused waiter waited for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Waiter {
    /// A record's change: Acquire with a wait window, or Watch.
    Record,
    /// A scope's due records: WatchDue.
    Due,
}

/// A waiter was refused: by the server's limit, or (`tenant`) by its
/// tenant's.
pub fn waiter_refused(kind: Waiter, tenant: bool) {
    let kind = match kind {
        Waiter::Record => "record",
        Waiter::Due => "due",
    };
    let limit = if tenant { "tenant" } else { "server" };
    METRICS
        .waiters_refused
        .get_or_create(&RefusedWaiterLabels { kind, limit })
        .inc();
}

/// A server-streaming method whose open streams are counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    Watch,
    WatchDue,
}

/// An open stream; closed when dropped.
#[derive(Debug)]
pub struct OpenStream(Gauge);

/// A `stream` opens; it counts as open until the guard is dropped.
pub fn stream_opened(stream: Stream) -> OpenStream {
    let method = match stream {
        Stream::Watch => "Watch",
        Stream::WatchDue => "WatchDue",
    };
    let gauge = METRICS
        .streams_open
        .get_or_create_owned(&StreamLabels { method });
    gauge.inc();
    OpenStream(gauge)
}

impl Drop for OpenStream {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// Readiness turned SERVING (`true`) or NOT_SERVING.
pub fn ready(up: bool) {
    METRICS.ready.set(i64::from(up));
}

/// The LISTEN connection went up (a new session) or down.
pub fn listener_connected(up: bool) {
    let m = &*METRICS;
    m.listener_connected.set(i64::from(up));
    if up {
        m.listener_connections.inc();
    }
}

/// How a background sweeping round ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SweepOutcome {
    Swept,
    /// Another replica holds the sweeper's lock.
    Skipped,
    Failed,
}

/// A background sweeping round ended after `took`; `retries_due` when it
/// swept and counted them.
pub fn sweep_round(outcome: SweepOutcome, took: Duration, retries_due: Option<u64>) {
    let m = &*METRICS;
    let outcome = match outcome {
        SweepOutcome::Swept => "swept",
        SweepOutcome::Skipped => "skipped",
        SweepOutcome::Failed => "failed",
    };
    m.sweeps.get_or_create(&OutcomeLabels { outcome }).inc();
    m.sweep_duration.observe(took.as_secs_f64());
    if let Some(due) = retries_due {
        m.retries_due.set(i64::try_from(due).unwrap_or(i64::MAX));
    }
}

/// One sweeping transaction deleted and reclaimed this many records.
pub fn swept(expired_deleted: u64, leases_reclaimed: u64) {
    let m = &*METRICS;
    m.swept
        .get_or_create(&ActionLabels {
            action: "expired_deleted",
        })
        .inc_by(expired_deleted);
    m.swept
        .get_or_create(&ActionLabels {
            action: "leases_reclaimed",
        })
        .inc_by(leases_reclaimed);
}

/// The state read when a scrape arrives.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// Pooled connections allowed at most (`--pool-size`).
    pub pool_max_size: usize,
    /// Pooled connections open now.
    pub pool_size: usize,
    /// Pooled connections open and idle.
    pub pool_available: usize,
    /// Calls waiting for a pooled connection.
    pub pool_waiting: usize,
    /// Shared connections configured (`--shared-connections`).
    pub shared_connections: usize,
    /// Shared connections connected now.
    pub shared_connected: usize,
    /// Calls waiting for a batch worker.
    pub queued_calls: usize,
    /// What the replay cache holds, in bytes.
    pub replay_cache_bytes: u64,
    /// Calls waiting on this server (Acquire with wait, Watch, WatchDue).
    pub waiters: usize,
    /// Waiters asleep until their record changes.
    pub waiters_parked: usize,
    /// Records at least one call on this server waits on.
    pub watched_records: usize,
}

fn apply(snapshot: &Snapshot) {
    let m = &*METRICS;
    m.pool_max.set(count(snapshot.pool_max_size));
    m.pool_size.set(count(snapshot.pool_size));
    m.pool_available.set(count(snapshot.pool_available));
    m.pool_waiting.set(count(snapshot.pool_waiting));
    m.shared_connections.set(count(snapshot.shared_connections));
    m.shared_connected.set(count(snapshot.shared_connected));
    m.batch_queued.set(count(snapshot.queued_calls));
    m.replay_bytes
        .set(i64::try_from(snapshot.replay_cache_bytes).unwrap_or(i64::MAX));
    m.waiters.set(count(snapshot.waiters));
    m.waiters_parked.set(count(snapshot.waiters_parked));
    m.watched_records.set(count(snapshot.watched_records));
}

/// The text format a scraper asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// OpenMetrics 1.0 text (what Prometheus asks for first).
    OpenMetrics,
    /// The Prometheus text format 0.0.4 (anything else, curl included).
    Prometheus,
}

impl Format {
    /// The format a request's `Accept` header prefers.
    fn accepted(accept: Option<&str>) -> Format {
        match accept {
            Some(accept) if accept.contains("application/openmetrics-text") => Format::OpenMetrics,
            _ => Format::Prometheus,
        }
    }

    fn content_type(self) -> &'static str {
        match self {
            Format::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
            Format::Prometheus => "text/plain; version=0.0.4; charset=utf-8",
        }
    }
}

/// Every metric, with the state in `snapshot`, in `format`.
pub fn render(format: Format, snapshot: &Snapshot) -> String {
    apply(snapshot);
    let mut text = String::with_capacity(16 * 1024);
    let encoded = match format {
        Format::OpenMetrics => {
            prometheus_client::encoding::text::encode(&mut text, &METRICS.registry)
        }
        Format::Prometheus => {
            prometheus_client::encoding::prometheus_text::encode(&mut text, &METRICS.registry)
        }
    };
    // Writing into a String cannot fail; a metric that could not encode
    // would be a bug in this module.
    encoded.expect("metrics encode into a String");
    text
}

/// What reads the state at scrape time.
pub type SnapshotFn = Arc<dyn Fn() -> Snapshot + Send + Sync>;

fn answer(request: &Request<Incoming>, snapshot: &SnapshotFn) -> Response<String> {
    let plain = |status: StatusCode, text: &str| {
        let mut response = Response::new(format!("{text}\n"));
        *response.status_mut() = status;
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            header::HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        response
    };
    if request.uri().path() != "/metrics" {
        return plain(StatusCode::NOT_FOUND, "not found; metrics are at /metrics");
    }
    if request.method() != HttpMethod::GET && request.method() != HttpMethod::HEAD {
        let mut response = plain(StatusCode::METHOD_NOT_ALLOWED, "GET /metrics");
        response
            .headers_mut()
            .insert(header::ALLOW, header::HeaderValue::from_static("GET, HEAD"));
        return response;
    }
    let format = Format::accepted(
        request
            .headers()
            .get(header::ACCEPT)
            .and_then(|v| v.to_str().ok()),
    );
    let mut response = Response::new(render(format, &snapshot()));
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static(format.content_type()),
    );
    response
}

/// The scrape connections open, each with the moment it was accepted or
/// last began a request. When all [`MAX_SCRAPE_CONNECTIONS`] are open, a new
/// connection closes the one that has gone longest without a request: a
/// peer that opens connections and sends half a request head (or nothing)
/// cannot keep a scraper out, since a scraper sends its request as soon as
/// it connects.
#[derive(Default)]
struct Scrapers {
    open: std::sync::Mutex<OpenScrapes>,
}

/// Each open scrape connection, by number: when it last began a request
/// (or was accepted), and its task.
type OpenScrapes = std::collections::HashMap<u64, (Instant, tokio::task::AbortHandle)>;

impl Scrapers {
    fn lock(&self) -> std::sync::MutexGuard<'_, OpenScrapes> {
        self.open.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether there is room for one more connection, closing the one that
    /// has gone longest without a request if all the room is taken and it
    /// has been idle long enough.
    fn make_room(&self) -> bool {
        let mut open = self.lock();
        if open.len() < MAX_SCRAPE_CONNECTIONS {
            return true;
        }
        let Some((id, at)) = open
            .iter()
            .min_by_key(|(_, (at, _))| *at)
            .map(|(id, (at, _))| (*id, *at))
        else {
            return true;
        };
        if at.elapsed() < SCRAPE_EVICTABLE_AFTER {
            return false;
        }
        if let Some((_, task)) = open.remove(&id) {
            task.abort();
            tracing::debug!("metrics listener: closed the scrape connection idle longest");
        }
        true
    }

    fn active(&self, id: u64) {
        if let Some((at, _)) = self.lock().get_mut(&id) {
            *at = Instant::now();
        }
    }
}

/// Takes a connection out of [`Scrapers`] when its task ends or is aborted.
struct Open {
    scrapers: Arc<Scrapers>,
    id: u64,
}

impl Drop for Open {
    fn drop(&mut self) {
        self.scrapers.lock().remove(&self.id);
    }
}

/// Serves `GET /metrics` over plain HTTP/1.1 on `listener` until the task is
/// aborted, reading the state from `snapshot` at each scrape. At most
/// `MAX_SCRAPE_CONNECTIONS` connections are open at once, each given at
/// most `SCRAPE_HEADER_TIMEOUT` for a request head; past the cap a new
/// connection takes the place of the one idle longest.
pub async fn serve(listener: TcpListener, snapshot: SnapshotFn) {
    let scrapers = Arc::new(Scrapers::default());
    let mut http = http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(SCRAPE_HEADER_TIMEOUT);
    for id in 0u64.. {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                // Out of descriptors, most likely: let some close first.
                tracing::warn!(error = %e, "metrics listener: cannot accept a connection");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        while !scrapers.make_room() {
            tokio::time::sleep(SCRAPE_EVICTABLE_AFTER / 5).await;
        }
        let snapshot = Arc::clone(&snapshot);
        let seen = Arc::clone(&scrapers);
        let connection = http.serve_connection(
            TokioIo::new(stream),
            service_fn(move |request| {
                seen.active(id);
                let response = answer(&request, &snapshot);
                async move { Ok::<_, Infallible>(response) }
            }),
        );
        let open = Open {
            scrapers: Arc::clone(&scrapers),
            id,
        };
        // Registered before the task can end (it takes the same lock to
        // leave).
        let mut registry = scrapers.lock();
        let task = tokio::spawn(async move {
            let _open = open;
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "metrics connection ended");
            }
        });
        registry.insert(id, (Instant::now(), task.abort_handle()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_map_to_known_methods_or_unknown() {
        let m = method_of("/idempotency.v1.Coordinator/Acquire");
        assert_eq!(
            (m.service, m.method),
            ("idempotency.v1.Coordinator", "Acquire")
        );
        let m = method_of("/grpc.health.v1.Health/Check");
        assert_eq!((m.service, m.method), ("grpc.health.v1.Health", "Check"));
        let m = method_of("/idempotency.v1.Coordinator/DropTables");
        assert_eq!(
            (m.service, m.method),
            ("idempotency.v1.Coordinator", UNKNOWN)
        );
        for path in [
            "/",
            "",
            "/x",
            "/a.b.C/Acquire",
            "idempotency.v1.Coordinator/Acquire",
        ] {
            let m = method_of(path);
            assert_eq!((m.service, m.method), (UNKNOWN, UNKNOWN), "{path:?}");
        }
    }

    #[test]
    fn every_code_has_its_canonical_name() {
        for (number, name) in [
            (0, "OK"),
            (3, "INVALID_ARGUMENT"),
            (8, "RESOURCE_EXHAUSTED"),
            (14, "UNAVAILABLE"),
            (16, "UNAUTHENTICATED"),
        ] {
            assert_eq!(code_name(Code::from(number)), name);
        }
    }

    #[test]
    fn scrapers_get_the_format_they_ask_for() {
        assert_eq!(
            Format::accepted(Some(
                "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"
            )),
            Format::OpenMetrics
        );
        assert_eq!(Format::accepted(Some("*/*")), Format::Prometheus);
        assert_eq!(Format::accepted(None), Format::Prometheus);
    }

    #[test]
    fn both_formats_carry_the_metrics_and_openmetrics_ends_with_eof() {
        // The registry is process-wide: other tests of this binary may add
        // to it, so only presence is checked here.
        Rpc::start("/idempotency.v1.Coordinator/Get").finish(Code::NotFound);
        let snapshot = Snapshot {
            pool_max_size: 7,
            ..Snapshot::default()
        };
        let open = render(Format::OpenMetrics, &snapshot);
        assert!(open.ends_with("# EOF\n"), "{open}");
        assert!(open.contains("idempotency_db_pool_max_size 7\n"), "{open}");
        assert!(open.contains(
            "idempotency_rpcs_total{service=\"idempotency.v1.Coordinator\",method=\"Get\",code=\"NOT_FOUND\"}"
        ));
        let prom = render(Format::Prometheus, &snapshot);
        assert!(!prom.contains("# EOF"));
        assert!(
            prom.contains("# TYPE idempotency_rpcs_total counter"),
            "{prom}"
        );
        assert!(
            prom.contains("idempotency_rpc_duration_seconds_count{"),
            "{prom}"
        );
    }

    #[test]
    fn an_open_stream_counts_until_dropped() {
        let gauge = || {
            METRICS
                .streams_open
                .get_or_create_owned(&StreamLabels { method: "WatchDue" })
                .get()
        };
        let before = gauge();
        let stream = stream_opened(Stream::WatchDue);
        assert_eq!(gauge(), before + 1);
        drop(stream);
        assert_eq!(gauge(), before);
    }
}

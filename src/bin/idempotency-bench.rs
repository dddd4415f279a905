//! Load generator for a running coordinator: drives it over gRPC with
//! concurrent clients for a fixed time and prints throughput and latency
//! percentiles, each scenario closing with one machine-readable `RESULT` line.
//!
//! ```text
//! cargo run --release --bin idempotency-bench -- --target 127.0.0.1:50051 \
//!     --scenario cycle,replay,contend,wait --clients 32 --seconds 10 \
//!     --baseline-sql --database-url postgres://postgres@127.0.0.1:5432/bench
//! ```
//!
//! `--baseline-sql` runs `cycle`, `replay` and `contend` a second time
//! straight against PostgreSQL, through the same SQL functions prepared on one
//! connection per client: the physical limit the coordinator can at most
//! match. The `RESULT` line then carries `sql_ops_per_s` and `ratio`.
//!
//! Scenarios:
//! - `cycle`: Acquire + Complete on fresh keys, nobody waiting (the plain path);
//! - `replay`: Acquire on 1,000 keys already SUCCEEDED;
//! - `contend`: all clients on `--hot-keys` keys; whoever gets the lease gives
//!   it straight back (Complete with release);
//! - `cycle-beside-waiters`: the same while `--waiters` calls wait on other
//!   keys, so the listener, the fan-out and watched records are all busy;
//! - `wait`: `--waiters` calls wait on one key, one Complete releases them
//!   all; reports the delay from that Complete to the last answer;
//! - `sweep`: puts `--expired` expired records straight into the database
//!   (`--database-url`), then runs `cycle` while one Sweep call deletes them;
//!   reports the sweep's duration and the slowest client call meanwhile;
//! - `idle-connections`: opens `--waiters` HTTP/2 connections that make no
//!   call; with `--server-pid`, reports what each costs the server.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use clap::{Parser, ValueEnum};
use hdrhistogram::Histogram;
use idempotency_coordinator::proto::coordinator_client::CoordinatorClient;
use idempotency_coordinator::proto::{
    AcquireRequest, CompleteRequest, Decision, Success, complete_request::Outcome,
};
use tonic::transport::Channel;

#[derive(Debug, Parser)]
#[command(about = "Drives a running idempotency coordinator and reports what it sustains.")]
struct Args {
    /// The coordinator's address.
    #[arg(long, default_value = "127.0.0.1:50051")]
    target: String,
    /// Scenarios to run, in order (comma-separated).
    #[arg(long, value_enum, value_delimiter = ',', default_value = "cycle")]
    scenario: Vec<Scenario>,
    /// Concurrent clients issuing calls back to back.
    #[arg(long, default_value_t = 32)]
    clients: usize,
    /// How long each timed scenario runs.
    #[arg(long, default_value_t = 10)]
    seconds: u64,
    /// HTTP/2 connections the clients share.
    #[arg(long, default_value_t = 8)]
    connections: usize,
    /// Waiting calls in `cycle-beside-waiters` and `wait`.
    #[arg(long, default_value_t = 1000)]
    waiters: usize,
    /// Expired records the `sweep` scenario sweeps.
    #[arg(long, default_value_t = 100_000)]
    expired: u32,
    /// The server's database, for scenarios that prepare data in it and for
    /// the direct-SQL baseline.
    #[arg(long, env = "DATABASE_URL")]
    database_url: Option<String>,
    /// Also run `cycle`, `replay` and `contend` directly against PostgreSQL
    /// (the same SQL functions, prepared, one connection per client) and
    /// report the coordinator's throughput as a ratio of that.
    #[arg(long)]
    baseline_sql: bool,
    /// Hot keys in `contend`.
    #[arg(long, default_value_t = 4)]
    hot_keys: usize,
    /// Pace `cycle` at this many cycles per second in all (spread over the
    /// clients) instead of as fast as it goes, to read latency at a given load.
    #[arg(long)]
    rate: Option<f64>,
    /// The server's process id, when it runs on this machine: `wait` then
    /// reports the server's resident memory while every waiter is parked.
    #[arg(long)]
    server_pid: Option<u32>,
}

/// Resident memory of process `pid` in MiB, from /proc (Linux).
fn resident_mib(pid: u32) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kib: f64 = status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kib / 1024.0)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Scenario {
    Cycle,
    Replay,
    Contend,
    CycleBesideWaiters,
    Wait,
    Sweep,
    IdleConnections,
}

type Client = CoordinatorClient<Channel>;

fn acquire(scope: &str, key: &str) -> AcquireRequest {
    AcquireRequest {
        scope: scope.into(),
        key: key.into(),
        ..Default::default()
    }
}

fn succeed(scope: &str, key: &str, token: String) -> CompleteRequest {
    CompleteRequest {
        scope: scope.into(),
        key: key.into(),
        lease_token: token,
        outcome: Some(Outcome::Success(Success {
            result: br#"{"status":"ok"}"#.to_vec(),
            content_type: "application/json".into(),
            status_code: 200,
            result_ref: String::new(),
        })),
    }
}

fn histogram() -> Histogram<u64> {
    // Microseconds from 1 µs to 60 s, three significant figures.
    Histogram::new_with_bounds(1, 60_000_000, 3).expect("valid histogram bounds")
}

fn ms(h: &Histogram<u64>, quantile: f64) -> f64 {
    h.value_at_quantile(quantile) as f64 / 1000.0
}

/// A distinct prefix per run, so runs against one database never collide.
fn run_id() -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    format!("{nanos:x}")
}

async fn connect(target: &str, n: usize) -> Vec<Client> {
    let mut clients = Vec::with_capacity(n);
    for _ in 0..n.max(1) {
        let channel = Channel::from_shared(format!("http://{target}"))
            .expect("a valid target address")
            .tcp_nodelay(true)
            .connect()
            .await
            .unwrap_or_else(|e| panic!("cannot connect to {target}: {e}"));
        clients.push(CoordinatorClient::new(channel));
    }
    clients
}

/// Statements the direct-SQL baseline runs: the coordinator's own SQL
/// functions, called the way the store calls them.
/// Both read back the whole record, as the coordinator does.
const SQL_ACQUIRE: &str = "SELECT a.decision, a.retry_after_ms, (a.rec).* \
     FROM idempotency_acquire('default', $1, $2, '', '', 900000, 10, 86400000, 0, 0) a";
const SQL_COMPLETE: &str = "SELECT c.outcome, (c.rec).* FROM idempotency_complete('default', $1, $2, \
     $3, $4, $5, 'application/json', 200, '', '', false, NULL, 1000, 3600000, 0) c";

/// One direct database connection with its prepared statements.
struct Sql {
    client: tokio_postgres::Client,
    acquire: tokio_postgres::Statement,
    complete: tokio_postgres::Statement,
}

/// What the scenarios drive: the coordinator over gRPC, or (for the
/// baseline) PostgreSQL directly through the same SQL functions.
#[derive(Clone)]
enum Driver {
    Grpc(Client),
    Sql(Arc<Sql>),
}

impl Driver {
    /// Acquire: the decision, and the lease token on PROCEED.
    async fn acquire(&mut self, scope: &str, key: &str) -> (i32, Option<String>) {
        match self {
            Driver::Grpc(c) => {
                let answer = c
                    .acquire(acquire(scope, key))
                    .await
                    .expect("acquire")
                    .into_inner();
                (answer.decision, answer.lease.map(|l| l.token))
            }
            Driver::Sql(sql) => {
                let row = sql
                    .client
                    .query_one(&sql.acquire, &[&scope, &key])
                    .await
                    .expect("idempotency_acquire");
                let decision = match row.get::<_, &str>(0) {
                    "PROCEED" => Decision::Proceed,
                    "ALREADY_DONE" => Decision::AlreadyDone,
                    "IN_PROGRESS" => Decision::InProgress,
                    "RETRY_LATER" => Decision::RetryLater,
                    "CONFLICT" => Decision::Conflict,
                    _ => Decision::Exhausted,
                };
                let token = (decision == Decision::Proceed)
                    .then(|| row.get::<_, uuid::Uuid>("lease_token").to_string());
                (decision as i32, token)
            }
        }
    }

    /// Complete with success, or give the key back (`release`).
    async fn complete(&mut self, scope: &str, key: &str, token: String, release: bool) {
        match self {
            Driver::Grpc(c) => {
                let mut req = succeed(scope, key, token);
                if release {
                    req.outcome =
                        Some(Outcome::Release(idempotency_coordinator::proto::Release {}));
                }
                c.complete(req).await.expect("complete");
            }
            Driver::Sql(sql) => {
                let token: uuid::Uuid = token.parse().expect("uuid token");
                let outcome = if release { "RELEASE" } else { "SUCCESS" };
                let result: &[u8] = br#"{"status":"ok"}"#;
                sql.client
                    .query_one(&sql.complete, &[&scope, &key, &token, &outcome, &result])
                    .await
                    .expect("idempotency_complete");
            }
        }
    }
}

async fn sql_drivers(url: &str, n: usize) -> Vec<Driver> {
    let mut drivers = Vec::with_capacity(n);
    for _ in 0..n {
        let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
            .await
            .expect("connect to the database");
        tokio::spawn(connection);
        let acquire = client.prepare(SQL_ACQUIRE).await.expect("prepare acquire");
        let complete = client
            .prepare(SQL_COMPLETE)
            .await
            .expect("prepare complete");
        drivers.push(Driver::Sql(Arc::new(Sql {
            client,
            acquire,
            complete,
        })));
    }
    drivers
}

struct CycleStats {
    cycles: u64,
    elapsed: Duration,
    cycle: Histogram<u64>,
    acquire: Histogram<u64>,
    complete: Histogram<u64>,
}

/// Acquire + Complete on fresh keys, `clients` at a time, for `duration`.
async fn cycles(clients: &[Client], n: usize, duration: Duration, run: &str) -> CycleStats {
    let drivers: Vec<Driver> = clients.iter().cloned().map(Driver::Grpc).collect();
    cycles_until(
        &drivers,
        n,
        duration,
        Arc::new(AtomicBool::new(false)),
        run,
        None,
    )
    .await
}

/// Like [`cycles`], ending early when `stop` is set.
async fn cycles_until(
    clients: &[Driver],
    n: usize,
    duration: Duration,
    stop: Arc<AtomicBool>,
    run: &str,
    rate: Option<f64>,
) -> CycleStats {
    let start = Instant::now();
    let end = start + duration;
    // Each client's share of the rate, as a period between cycle starts.
    let period = rate
        .filter(|r| *r > 0.0)
        .map(|r| Duration::from_secs_f64(n as f64 / r));
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let mut client = clients[i % clients.len()].clone();
            let run = run.to_owned();
            let stop = Arc::clone(&stop);
            tokio::spawn(async move {
                let (mut cycle, mut acquire_h, mut complete_h) =
                    (histogram(), histogram(), histogram());
                let mut count = 0u64;
                let mut ticks = period.map(|p| {
                    let mut t = tokio::time::interval_at(
                        tokio::time::Instant::now() + p.mul_f64(i as f64 / n as f64),
                        p,
                    );
                    t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
                    t
                });
                while Instant::now() < end && !stop.load(Ordering::Relaxed) {
                    if let Some(ticks) = &mut ticks {
                        ticks.tick().await;
                    }
                    let key = format!("{run}-{i}-{count}");
                    let t0 = Instant::now();
                    let (decision, token) = client.acquire("bench.cycle", &key).await;
                    let t1 = Instant::now();
                    assert_eq!(decision, Decision::Proceed as i32, "fresh key");
                    client
                        .complete("bench.cycle", &key, token.expect("lease"), false)
                        .await;
                    let t2 = Instant::now();
                    acquire_h.saturating_record((t1 - t0).as_micros() as u64);
                    complete_h.saturating_record((t2 - t1).as_micros() as u64);
                    cycle.saturating_record((t2 - t0).as_micros() as u64);
                    count += 1;
                }
                (count, cycle, acquire_h, complete_h)
            })
        })
        .collect();
    let mut stats = CycleStats {
        cycles: 0,
        elapsed: Duration::ZERO,
        cycle: histogram(),
        acquire: histogram(),
        complete: histogram(),
    };
    for task in tasks {
        let (count, cycle, acquire_h, complete_h) = task.await.expect("client task");
        stats.cycles += count;
        stats.cycle.add(cycle).expect("same bounds");
        stats.acquire.add(acquire_h).expect("same bounds");
        stats.complete.add(complete_h).expect("same bounds");
    }
    stats.elapsed = start.elapsed();
    stats
}

/// Calls per second and their latency, for scenarios of single calls.
struct CallStats {
    calls: u64,
    elapsed: Duration,
    latency: Histogram<u64>,
}

impl CallStats {
    fn per_s(&self) -> f64 {
        self.calls as f64 / self.elapsed.as_secs_f64()
    }
}

/// `n` clients each calling Acquire back to back for `duration`: on keys
/// that are done (`replay`: every answer ALREADY_DONE), or on a few hot keys
/// (`contend`: a caller that gets the lease gives it straight back, the
/// others get IN_PROGRESS).
async fn acquires(
    drivers: &[Driver],
    n: usize,
    duration: Duration,
    scope: &'static str,
    keys: Arc<Vec<String>>,
    contend: bool,
) -> CallStats {
    let start = Instant::now();
    let end = start + duration;
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let mut driver = drivers[i % drivers.len()].clone();
            let keys = Arc::clone(&keys);
            tokio::spawn(async move {
                let mut latency = histogram();
                let mut count = 0u64;
                while Instant::now() < end {
                    let key = &keys[(i + count as usize) % keys.len()];
                    let t0 = Instant::now();
                    let (decision, token) = driver.acquire(scope, key).await;
                    latency.saturating_record(t0.elapsed().as_micros() as u64);
                    count += 1;
                    if contend {
                        if let Some(token) = token {
                            driver.complete(scope, key, token, true).await;
                        }
                    } else {
                        assert_eq!(decision, Decision::AlreadyDone as i32, "a replay");
                    }
                }
                (count, latency)
            })
        })
        .collect();
    let mut stats = CallStats {
        calls: 0,
        elapsed: Duration::ZERO,
        latency: histogram(),
    };
    for task in tasks {
        let (count, latency) = task.await.expect("client task");
        stats.calls += count;
        stats.latency.add(latency).expect("same bounds");
    }
    stats.elapsed = start.elapsed();
    stats
}

/// Prints a timed scenario's human line and its `RESULT` line.
fn report(name: &str, args: &Args, per_s: f64, latency: &Histogram<u64>, extra: &str) {
    let [p50, p90, p99, p999] = [0.5, 0.9, 0.99, 0.999].map(|q| ms(latency, q));
    println!(
        "{name}: {per_s:.0}/s; p50 {p50:.2} ms p90 {p90:.2} ms p99 {p99:.2} ms p99.9 {p999:.2} ms"
    );
    println!(
        "RESULT scenario={name} clients={} seconds={} ops_per_s={per_s:.0} p50_ms={p50:.2} p90_ms={p90:.2} p99_ms={p99:.2} p999_ms={p999:.2}{extra}",
        args.clients, args.seconds,
    );
}

fn report_cycles(name: &str, args: &Args, stats: &CycleStats, extra: &str) -> f64 {
    let per_s = stats.cycles as f64 / stats.elapsed.as_secs_f64();
    let extra = format!(" acquire_p99_ms={:.2}{extra}", ms(&stats.acquire, 0.99));
    report(name, args, per_s, &stats.cycle, &extra);
    per_s
}

/// Takes a lease on `key` so that others find it IN_PROGRESS.
async fn hold(client: &mut Client, scope: &str, key: &str) -> String {
    let mut req = acquire(scope, key);
    req.lease_ttl = Some(prost_types::Duration {
        seconds: 600,
        nanos: 0,
    });
    let granted = client.acquire(req).await.expect("hold").into_inner();
    assert_eq!(granted.decision, Decision::Proceed as i32, "fresh key");
    granted.lease.expect("lease").token
}

fn waiting(scope: &str, key: &str) -> AcquireRequest {
    AcquireRequest {
        wait: Some(prost_types::Duration {
            seconds: 60,
            nanos: 0,
        }),
        ..acquire(scope, key)
    }
}

/// Connections enough that no connection carries more than 100 waiting
/// streams (servers commonly allow 100 to 200 per connection).
fn waiter_connections(args: &Args) -> usize {
    args.connections.max(args.waiters.div_ceil(100))
}

async fn cycle_beside_waiters(args: &Args, clients: &[Client], run: &str) -> f64 {
    let scope = "bench.parked";
    let held_keys = args.waiters.div_ceil(10).max(1);
    let mut holder = clients[0].clone();
    let mut tokens = Vec::with_capacity(held_keys);
    for k in 0..held_keys {
        tokens.push(hold(&mut holder, scope, &format!("{run}-held-{k}")).await);
    }
    let waiter_clients = connect(&args.target, waiter_connections(args)).await;
    let stop = Arc::new(AtomicBool::new(false));
    let waiters: Vec<_> = (0..args.waiters)
        .map(|i| {
            let mut client = waiter_clients[i % waiter_clients.len()].clone();
            let key = format!("{run}-held-{}", i % held_keys);
            let stop = Arc::clone(&stop);
            tokio::spawn(async move {
                // Wait again whenever a window ends, until the run is over.
                while !stop.load(Ordering::SeqCst) {
                    let answer = client.acquire(waiting(scope, &key)).await.expect("wait");
                    if answer.into_inner().decision != Decision::InProgress as i32 {
                        break;
                    }
                }
            })
        })
        .collect();
    // Let the waiters reach the server and park before measuring.
    tokio::time::sleep(Duration::from_secs(2)).await;

    let stats = cycles(
        clients,
        args.clients,
        Duration::from_secs(args.seconds),
        &format!("{run}-beside"),
    )
    .await;
    stop.store(true, Ordering::SeqCst);
    for (k, token) in tokens.into_iter().enumerate() {
        holder
            .complete(succeed(scope, &format!("{run}-held-{k}"), token))
            .await
            .expect("release the held keys");
    }
    for waiter in waiters {
        waiter.await.expect("waiter task");
    }
    report_cycles(
        "cycle-beside-waiters",
        args,
        &stats,
        &format!(" background_waiters={}", args.waiters),
    )
}

async fn wait_release(args: &Args, clients: &[Client], run: &str) {
    let scope = "bench.wait";
    let key = format!("{run}-one");
    let mut holder = clients[0].clone();
    let token = hold(&mut holder, scope, &key).await;
    let waiter_clients = connect(&args.target, waiter_connections(args)).await;
    let waiters: Vec<_> = (0..args.waiters)
        .map(|i| {
            let mut client = waiter_clients[i % waiter_clients.len()].clone();
            let key = key.clone();
            tokio::spawn(async move {
                let answer = client.acquire(waiting(scope, &key)).await.expect("wait");
                (answer.into_inner().decision, Instant::now())
            })
        })
        .collect();
    // Let every waiter reach the server and park.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let rss = args.server_pid.and_then(resident_mib);
    if let Some(rss) = rss {
        println!(
            "wait: server resident memory with {} waiters parked: {rss:.1} MiB",
            args.waiters
        );
    }

    let released = Instant::now();
    holder
        .complete(succeed(scope, &key, token))
        .await
        .expect("complete");
    let completed = released.elapsed();
    let mut delays = histogram();
    let mut last = Duration::ZERO;
    for waiter in waiters {
        let (decision, at) = waiter.await.expect("waiter task");
        assert_eq!(
            decision,
            Decision::AlreadyDone as i32,
            "every waiter gets the result"
        );
        let delay = at.saturating_duration_since(released);
        last = last.max(delay);
        delays.saturating_record(delay.as_micros() as u64);
    }
    println!(
        "wait: {} waiters released by one Complete (which took {:.2} ms): median answer after {:.2} ms, last after {:.2} ms",
        args.waiters,
        completed.as_secs_f64() * 1000.0,
        ms(&delays, 0.5),
        last.as_secs_f64() * 1000.0,
    );
    println!(
        "RESULT scenario=wait waiters={} complete_ms={:.2} p50_ms={:.2} p99_ms={:.2} last_ms={:.2}{}",
        args.waiters,
        completed.as_secs_f64() * 1000.0,
        ms(&delays, 0.5),
        ms(&delays, 0.99),
        last.as_secs_f64() * 1000.0,
        rss.map(|mib| format!(" server_rss_mib={mib:.1}"))
            .unwrap_or_default(),
    );
}

/// Opens `--waiters` connections that make no call and reports the server's
/// resident memory before and after.
async fn idle_connections(args: &Args) {
    let before = args.server_pid.and_then(resident_mib);
    let open = connect(&args.target, args.waiters).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = args.server_pid.and_then(resident_mib);
    if let (Some(before), Some(after)) = (before, after) {
        println!(
            "idle-connections: {} connections: server resident {before:.1} MiB before, {after:.1} MiB after: {:.1} KiB each",
            open.len(),
            (after - before) * 1024.0 / open.len() as f64
        );
    }
    drop(open);
}

/// Expired SUCCEEDED records, written straight into the server's table (the
/// fastest way to make many; the coordinator never writes expired rows).
const INSERT_EXPIRED: &str = "
    INSERT INTO idempotency_keys (
        tenant, scope, idempotency_key, status, fingerprint, attempt_count, max_attempts,
        retention, lease_token, lease_request_id, fencing_token,
        created_at, updated_at, completed_at, expires_at)
    SELECT 'default', 'bench.expired', $1 || '-' || i, 'SUCCEEDED', '', 1, 10,
           interval '1 minute', gen_random_uuid(), '', 1,
           now() - interval '2 hours', now() - interval '2 hours',
           now() - interval '2 hours', now() - interval '1 hour'
      FROM generate_series(1, $2::integer) AS i";

async fn sweep_under_load(args: &Args, clients: &[Client], run: &str) {
    let url = args
        .database_url
        .as_deref()
        .expect("the sweep scenario needs --database-url (or DATABASE_URL)");
    let (db, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .expect("connect to the database");
    tokio::spawn(connection);
    let expired = i32::try_from(args.expired).unwrap_or(i32::MAX);
    let inserted = db
        .execute(INSERT_EXPIRED, &[&run, &expired])
        .await
        .expect("insert expired records");
    println!("sweep: {inserted} expired records in place; sweeping them under load");

    let stop = Arc::new(AtomicBool::new(false));
    let load = {
        let clients: Vec<Driver> = clients.iter().cloned().map(Driver::Grpc).collect();
        let stop = Arc::clone(&stop);
        let run = format!("{run}-load");
        let n = args.clients;
        tokio::spawn(async move {
            cycles_until(&clients, n, Duration::from_secs(3600), stop, &run, None).await
        })
    };
    // Let the load settle before the sweep starts.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut sweeper = clients[0].clone();
    let started = Instant::now();
    let swept = sweeper
        .sweep(idempotency_coordinator::proto::SweepRequest {
            dry_run: false,
            limit: 0,
        })
        .await
        .expect("sweep")
        .into_inner();
    let took = started.elapsed();
    stop.store(true, Ordering::SeqCst);
    let stats = load.await.expect("load task");
    let worst_ms = stats.acquire.max().max(stats.complete.max()) as f64 / 1000.0;
    println!(
        "sweep: deleted {} in {:.2} s; meanwhile {} clients ran {:.0} cycles/s, slowest call {:.1} ms, acquire p99 {:.2} ms",
        swept.expired_deleted,
        took.as_secs_f64(),
        args.clients,
        stats.cycles as f64 / stats.elapsed.as_secs_f64(),
        worst_ms,
        ms(&stats.acquire, 0.99),
    );
    println!(
        "RESULT scenario=sweep expired={} deleted={} sweep_s={:.2} clients={} ops_per_s={:.0} worst_call_ms={:.1} acquire_p99_ms={:.2} complete_p99_ms={:.2}",
        args.expired,
        swept.expired_deleted,
        took.as_secs_f64(),
        args.clients,
        stats.cycles as f64 / stats.elapsed.as_secs_f64(),
        worst_ms,
        ms(&stats.acquire, 0.99),
        ms(&stats.complete, 0.99),
    );
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    let clients = connect(&args.target, args.connections).await;
    let run = run_id();
    println!(
        "target {} · {} clients over {} connections · {} s per timed scenario · {} cores here",
        args.target,
        args.clients,
        args.connections,
        args.seconds,
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    let grpc: Vec<Driver> = clients.iter().cloned().map(Driver::Grpc).collect();
    let sql = if args.baseline_sql {
        let url = args
            .database_url
            .as_deref()
            .expect("--baseline-sql needs --database-url (or DATABASE_URL)");
        Some(sql_drivers(url, args.clients).await)
    } else {
        None
    };
    let seconds = Duration::from_secs(args.seconds);
    let mut plain = None;
    for (n, scenario) in args.scenario.iter().enumerate() {
        // Keys unique to this run and this step of it.
        let run = format!("{run}-{n}");
        match scenario {
            Scenario::Cycle => {
                let stats = cycles_until(
                    &grpc,
                    args.clients,
                    seconds,
                    Arc::new(AtomicBool::new(false)),
                    &run,
                    args.rate,
                )
                .await;
                let extra = match &sql {
                    Some(sql) => {
                        let base = cycles_until(
                            sql,
                            args.clients,
                            seconds,
                            Arc::new(AtomicBool::new(false)),
                            &format!("{run}-sql"),
                            args.rate,
                        )
                        .await;
                        let sql_per_s = base.cycles as f64 / base.elapsed.as_secs_f64();
                        let per_s = stats.cycles as f64 / stats.elapsed.as_secs_f64();
                        println!(
                            "cycle, direct SQL: {sql_per_s:.0} cycles/s; acquire p99 {:.2} ms",
                            ms(&base.acquire, 0.99)
                        );
                        format!(
                            " sql_ops_per_s={sql_per_s:.0} ratio={:.2}",
                            per_s / sql_per_s
                        )
                    }
                    None => String::new(),
                };
                plain = Some(report_cycles("cycle", &args, &stats, &extra));
            }
            Scenario::Replay | Scenario::Contend => {
                let contend = *scenario == Scenario::Contend;
                let (name, scope, count) = if contend {
                    ("contend", "bench.contend", args.hot_keys.max(1))
                } else {
                    ("replay", "bench.replay", 1000)
                };
                let keys: Arc<Vec<String>> =
                    Arc::new((0..count).map(|k| format!("{run}-{k}")).collect());
                if !contend {
                    let mut setup = grpc[0].clone();
                    for key in keys.iter() {
                        let (_, token) = setup.acquire(scope, key).await;
                        setup
                            .complete(scope, key, token.expect("fresh key"), false)
                            .await;
                    }
                }
                let stats = acquires(
                    &grpc,
                    args.clients,
                    seconds,
                    scope,
                    Arc::clone(&keys),
                    contend,
                )
                .await;
                let mut extra = String::new();
                if let Some(sql) = &sql {
                    let base = acquires(sql, args.clients, seconds, scope, keys, contend).await;
                    println!(
                        "{name}, direct SQL: {:.0} acquires/s; p99 {:.2} ms",
                        base.per_s(),
                        ms(&base.latency, 0.99)
                    );
                    extra = format!(
                        " sql_ops_per_s={:.0} ratio={:.2}",
                        base.per_s(),
                        stats.per_s() / base.per_s()
                    );
                }
                report(name, &args, stats.per_s(), &stats.latency, &extra);
            }
            Scenario::CycleBesideWaiters => {
                let beside = cycle_beside_waiters(&args, &clients, &run).await;
                if let Some(plain) = plain {
                    println!(
                        "beside {} waiters the plain path runs at {:.2} of its speed with nobody waiting",
                        args.waiters,
                        beside / plain
                    );
                }
            }
            Scenario::Wait => wait_release(&args, &clients, &run).await,
            Scenario::Sweep => sweep_under_load(&args, &clients, &run).await,
            Scenario::IdleConnections => idle_connections(&args).await,
        }
    }
}

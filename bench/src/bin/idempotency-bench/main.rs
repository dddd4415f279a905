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
//!   call; with `--server-pid`, reports what each costs the server;
//! - `limit`: the figure `cycle` is held against, the cheapest possible
//!   Acquire + Complete in SQL (`bench/limit/`) driven by pgbench with as
//!   many clients for as long (`--limit-database-url`); after a `cycle`,
//!   reports the ratio of the two. `cycle,limit,cycle,limit,cycle,limit`
//!   alternates them;
//! - `http-cycle`: the cycle an n8n workflow makes, over the HTTP door
//!   (`--http-target`) rather than gRPC: `POST /acquire`, then
//!   `POST /complete` with `final_status: DONE`, on fresh keys, one cycle at
//!   a time on each of `--connections` HTTP/1.1 keep-alive connections.
//!   Any cycle whose answers are not 200/PROCEED and 200/ok is counted as
//!   failed and the run exits 1.
//!
//! ```text
//! cargo run --release --bin idempotency-bench -- --scenario http-cycle \
//!     --http-target http://127.0.0.1:8080 --connections 32 --seconds 10
//! ```
//!
//! `--record-history FILE` writes every call of `cycle` and `contend` (each
//! Acquire with a request_id) to FILE as JSON lines;
//! `idempotency-bench check-history FILE` then reads each key it names from
//! the database (`--database-url`, or the private PostgreSQL of
//! `--data-dir`) and checks the history with the history checker
//! ([`idempotency_bench::history`]), exiting 1 on any violation. Without the flag the scenarios'
//! loops record nothing.
//!
//! `--check` holds what the run measured to the performance goals, after
//! the scenarios, one line per goal (figure, budget, pass or fail), and
//! exits 1 naming every goal missed. Per `cycle`: WAL bytes ≤ 530 and commits
//! ≤ 0.25 (with `--database-url`), PostgreSQL CPU ≤ 120 µs, server CPU ≤ 70
//! µs (with `--server-pid`); `cycle ÷ limit` ≥ 1.3; server resident memory
//! ≤ 48 MiB with 10,000 waiters parked (`wait --waiters 10000
//! --server-pid`); server CPU ≤ 20 µs per `replay` call. A figure measured
//! more than once (alternations) is judged by its median. A goal whose
//! figure the run did not measure is reported "not measured" and fails
//! nothing. `--budget-*` flags replace the budgets.
//!
//! ```text
//! idempotency-bench --server-pid $PID --database-url postgres://…/bench \
//!     --scenario cycle,limit,cycle,limit,cycle,limit,replay --check
//! idempotency-bench --server-pid $PID --scenario wait --waiters 10000 --check
//! ```

mod baseline;
mod check;
mod client;
mod cost;
mod history;
mod http_cycle;
mod idle;
mod limit;
mod load;
mod report;
mod sweep;
mod waiters;

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use clap::{Parser, Subcommand, ValueEnum};

use check::Goal;
use client::{Client, Driver, connect};

#[derive(Debug, Parser)]
#[command(about = "Drives a running idempotency coordinator and reports what it sustains.")]
struct Args {
    /// The coordinator's address; repeat it for replicas of one database,
    /// and the clients are spread evenly over them.
    #[arg(long, default_value = "127.0.0.1:50051")]
    target: Vec<String>,
    /// The coordinator's HTTP door (`--http-listen`), for `http-cycle`.
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    http_target: String,
    /// Scenarios to run, in order (comma-separated).
    #[arg(long, value_enum, value_delimiter = ',', default_value = "cycle")]
    scenario: Vec<Scenario>,
    /// Concurrent clients issuing calls back to back.
    #[arg(long, default_value_t = 32)]
    clients: usize,
    /// How long each timed scenario runs.
    #[arg(long, default_value_t = 10)]
    seconds: u64,
    /// HTTP/2 connections the gRPC clients share, to each target; in
    /// `http-cycle`, the HTTP/1.1 connections, each running one cycle at a
    /// time.
    #[arg(long, default_value_t = 8)]
    connections: usize,
    /// Waiting calls in `cycle-beside-waiters` and `wait`.
    #[arg(long, default_value_t = 1000)]
    waiters: usize,
    /// Expired records the `sweep` scenario sweeps.
    #[arg(long, default_value_t = 100_000)]
    expired: u32,
    /// The server's database, for scenarios that prepare data in it and for
    /// the direct-SQL baseline [default: the private PostgreSQL of a server
    /// started without one, in --data-dir].
    #[arg(long, env = "DATABASE_URL", global = true)]
    database_url: Option<String>,
    /// The data dir of a server started without a database URL [default:
    /// the server's default].
    #[arg(
        long,
        env = "IDEMPOTENCY_DATA_DIR",
        conflicts_with = "database_url",
        global = true
    )]
    data_dir: Option<std::path::PathBuf>,
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
    /// The server's process id, when it runs on this machine (repeat it for
    /// replicas): timed scenarios then report its CPU time per operation, and
    /// `wait` the first one's resident memory while every waiter is parked.
    #[arg(long)]
    server_pid: Vec<u32>,
    /// A replica's `--metrics-listen` address (host:port; repeat it for
    /// replicas): timed scenarios then report the size of its batches, and
    /// `wait` reads the first one's memory once its gauge shows every
    /// waiter parked (without it, 2 s after they were sent).
    #[arg(long)]
    metrics: Vec<String>,
    /// The database `limit` runs pgbench against (created if missing).
    #[arg(long, default_value = "postgres://postgres@127.0.0.1:5432/limit")]
    limit_database_url: String,
    /// The pgbench that `limit` runs.
    #[arg(long, default_value = "pgbench")]
    pgbench: std::path::PathBuf,
    /// Write every call of `cycle` and `contend` to this file as a history
    /// (JSON lines), for `check-history`.
    #[arg(long)]
    record_history: Option<std::path::PathBuf>,
    /// After the scenarios, hold what they measured to the performance goals
    /// (the `--budget-*` flags) and exit 1 if any goal measured missed its
    /// budget.
    #[arg(long)]
    check: bool,
    #[command(flatten)]
    budgets: check::Budgets,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Check a history written with --record-history: read each of its keys
    /// from the database (--database-url, or the private PostgreSQL of
    /// --data-dir) and report every broken promise; exits 1 on any.
    CheckHistory {
        /// The history file.
        file: std::path::PathBuf,
    },
}

impl Args {
    /// The server's database: the URL given, or the socket of the private
    /// PostgreSQL in the data dir, as the server itself defaults to.
    pub(crate) fn database(&self) -> String {
        self.database_url.clone().unwrap_or_else(|| {
            let dir = self
                .data_dir
                .clone()
                .unwrap_or_else(idempotency_coordinator::embedded::default_data_dir);
            idempotency_coordinator::embedded::database_url(&dir)
        })
    }
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
    HttpCycle,
    Limit,
}

/// A distinct prefix per run, so runs against one database never collide.
fn run_id() -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    format!("{nanos:x}")
}

/// What the scenarios of a run share: the gRPC clients and the drivers over
/// them, the HTTP door, the history being written, the server's meter.
struct Setup {
    clients: Vec<Client>,
    /// The gRPC clients as drivers.
    grpc: Vec<Driver>,
    /// The drivers of the recorded scenarios (`cycle`, `contend`): the gRPC
    /// ones, writing every call to the history when there is one.
    recorded: Vec<Driver>,
    /// Straight against PostgreSQL, with `--baseline-sql`.
    sql: Option<Vec<Driver>>,
    /// The HTTP door, when `http-cycle` runs.
    http: Option<http_cycle::Target>,
    history: Option<Arc<history::HistoryFile>>,
    /// The server's database (for its commits and WAL), when named.
    meter: cost::Meter,
}

impl Setup {
    /// Connects to what the scenarios drive, and says what that is.
    async fn new(args: &Args) -> Setup {
        // gRPC connections only when a scenario speaks gRPC, so that
        // `http-cycle` alone needs nothing but the HTTP door.
        let speaks_grpc = args
            .scenario
            .iter()
            .any(|s| !matches!(s, Scenario::HttpCycle | Scenario::Limit));
        let clients = if speaks_grpc {
            connect(&args.target, args.connections).await
        } else {
            Vec::new()
        };
        let http = args.scenario.contains(&Scenario::HttpCycle).then(|| {
            http_cycle::Target::parse(&args.http_target).unwrap_or_else(|e| {
                eprintln!("{e}");
                std::process::exit(2);
            })
        });
        banner(args, speaks_grpc, http.is_some());
        let grpc: Vec<Driver> = clients.iter().cloned().map(Driver::Grpc).collect();
        let history = args
            .record_history
            .as_deref()
            .map(|path| Arc::new(history::HistoryFile::create(path)));
        let recorded: Vec<Driver> = match &history {
            Some(h) => clients
                .iter()
                .map(|c| Driver::Recorded(c.clone(), Arc::clone(h)))
                .collect(),
            None => grpc.clone(),
        };
        let sql = if args.baseline_sql {
            let sql = baseline::sql_drivers(&args.database(), args.clients).await;
            Some(sql.into_iter().map(Driver::Sql).collect::<Vec<_>>())
        } else {
            None
        };
        let meter = cost::Meter::new(
            &args.server_pid,
            args.database_url.as_deref(),
            &args.metrics,
        )
        .await;
        Setup {
            clients,
            grpc,
            recorded,
            sql,
            http,
            history,
            meter,
        }
    }
}

/// The run's first lines: what it drives, how hard, from how many cores.
fn banner(args: &Args, speaks_grpc: bool, http: bool) {
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    if speaks_grpc {
        println!(
            "target {} · {} clients over {} connections each · {} s per timed scenario · {cores} cores here",
            args.target.join(", "),
            args.clients,
            args.connections,
            args.seconds,
        );
    }
    if http {
        println!(
            "http target {} · {} HTTP/1.1 connections · {} s per timed scenario · {cores} cores here",
            args.http_target,
            args.connections.max(1),
            args.seconds,
        );
    }
}

/// What the scenarios of a run leave for those after them.
struct Carried {
    /// The throughput of the last `cycle`, which `cycle-beside-waiters` and
    /// `limit` compare theirs with.
    plain: Option<f64>,
    /// The meter of the limit's database, once `limit` has prepared it.
    limit_meter: Option<cost::Meter>,
    /// Whether every `http-cycle` cycle so far succeeded.
    all_cycles_succeeded: bool,
    /// The figures the goals of `--check` are about.
    measured: check::Measured,
}

/// Runs one scenario; `run` makes its keys unique.
async fn step(args: &Args, setup: &Setup, scenario: Scenario, run: &str, carried: &mut Carried) {
    let sql = setup.sql.as_deref();
    match scenario {
        Scenario::Cycle => {
            let (per_s, cost) = load::cycle(args, &setup.recorded, sql, run, &setup.meter).await;
            carried.plain = Some(per_s);
            for (goal, name) in [
                (Goal::WalBytes, "wal_bytes"),
                (Goal::Commits, "commits"),
                (Goal::PostgresCpu, "postgres_cpu_us"),
                (Goal::ServerCpu, "server_cpu_us"),
            ] {
                if let Some(figure) = cost.get(name) {
                    carried.measured.add(goal, figure);
                }
            }
        }
        Scenario::Replay | Scenario::Contend => {
            let contend = scenario == Scenario::Contend;
            let drivers = if contend {
                &setup.recorded
            } else {
                &setup.grpc
            };
            let cost =
                load::replay_or_contend(args, drivers, sql, run, contend, &setup.meter).await;
            if let (false, Some(cpu)) = (contend, cost.get("server_cpu_us")) {
                carried.measured.add(Goal::ReplayServerCpu, cpu);
            }
        }
        Scenario::CycleBesideWaiters => {
            let beside = waiters::cycle_beside_waiters(args, &setup.clients, run).await;
            if let Some(plain) = carried.plain {
                println!(
                    "beside {} waiters the plain path runs at {:.2} of its speed with nobody waiting",
                    args.waiters,
                    beside / plain
                );
            }
        }
        Scenario::Wait => {
            let rss = waiters::wait_release(args, &setup.clients, run).await;
            // The goal is stated for one number of waiters.
            if let (check::GOAL_WAITERS, Some(rss)) = (args.waiters, rss) {
                carried.measured.add(Goal::WaitersRss, rss);
            }
        }
        Scenario::Sweep => sweep::sweep_under_load(args, &setup.clients, run).await,
        Scenario::IdleConnections => idle::idle_connections(args).await,
        Scenario::Limit => limit_step(args, carried).await,
        Scenario::HttpCycle => {
            let target = setup.http.as_ref().expect("parsed in Setup::new");
            carried.all_cycles_succeeded &= http_cycle::http_cycle(args, target, run).await;
        }
    }
}

/// `limit`, its database prepared the first time; after a `cycle`, the
/// ratio of the two.
async fn limit_step(args: &Args, carried: &mut Carried) {
    if carried.limit_meter.is_none() {
        if let Err(e) = limit::prepare(&args.limit_database_url).await {
            eprintln!("limit: {e}");
            std::process::exit(2);
        }
        carried.limit_meter =
            Some(cost::Meter::new(&[], Some(&args.limit_database_url), &[]).await);
    }
    let meter = carried.limit_meter.as_ref().expect("set above");
    match limit::limit(args, meter).await {
        Ok(limit) => {
            if let Some(plain) = carried.plain {
                println!(
                    "cycle ÷ limit: {:.2} (the coordinator's last cycle, {plain:.0}/s, against {limit:.0}/s)",
                    plain / limit
                );
                println!(
                    "RESULT scenario=cycle_over_limit ratio={:.2}",
                    plain / limit
                );
                carried.measured.add(Goal::CycleOverLimit, plain / limit);
            }
        }
        Err(e) => {
            eprintln!("limit: {e}");
            std::process::exit(1);
        }
    }
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    if let Some(Command::CheckHistory { file }) = &args.command {
        let clean = history::check_history(file, &args.database()).await;
        std::process::exit(if clean { 0 } else { 1 });
    }
    let setup = Setup::new(&args).await;
    let run = run_id();
    let mut carried = Carried {
        plain: None,
        limit_meter: None,
        all_cycles_succeeded: true,
        measured: check::Measured::default(),
    };
    for (n, scenario) in args.scenario.iter().enumerate() {
        // Keys unique to this run and this step of it.
        let run = format!("{run}-{n}");
        step(&args, &setup, *scenario, &run, &mut carried).await;
    }
    if let Some(history) = &setup.history {
        history.flush();
        if let Some(path) = &args.record_history {
            println!("history written to {}", path.display());
        }
    }
    let goals_met = !args.check || check::report(&carried.measured, &args.budgets);
    if !carried.all_cycles_succeeded || !goals_met {
        std::process::exit(1);
    }
}

//! What a timed scenario cost, per cycle (or per call): CPU time of the
//! benchmark itself, of each server (`--server-pid`), of PostgreSQL (every
//! process named `postgres` on this machine) and of a driver run as a child
//! (`pgbench`); the server's context switches; and, with a database, what
//! PostgreSQL did: commits, statements (when `pg_stat_statements` is loaded),
//! WAL records, bytes and flushes. With `--metrics`, the calls each
//! replica's batches carried.
//!
//! Read from /proc (Linux) before and after the scenario, so they include
//! whatever else the machine ran meanwhile: measure on a quiet machine.

use std::fmt::Write as _;

/// CPU seconds of process `pid` (user + system, all its threads), and of its
/// children that ended and were waited for.
fn cpu_seconds(pid: &str) -> Option<(f64, f64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The fields after the command name, which may itself hold spaces.
    let fields: Vec<&str> = stat.get(stat.rfind(')')? + 2..)?.split(' ').collect();
    let field = |i: usize| fields.get(i)?.parse::<u64>().ok();
    let own = field(11)? + field(12)?;
    let children = field(13)? + field(14)?;
    Some((own as f64 / clock_ticks(), children as f64 / clock_ticks()))
}

fn clock_ticks() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if ticks > 0 { ticks as f64 } else { 100.0 }
}

/// Voluntary and involuntary context switches of every thread of `pid`.
fn context_switches(pid: u32) -> u64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    tasks
        .flatten()
        .filter_map(|task| std::fs::read_to_string(task.path().join("status")).ok())
        .map(|status| {
            status
                .lines()
                .filter(|line| line.contains("ctxt_switches:"))
                .filter_map(|line| line.split_whitespace().nth(1)?.parse::<u64>().ok())
                .sum::<u64>()
        })
        .sum()
}

/// CPU seconds of every process named `postgres` (the postmaster, its
/// backends and its background workers), and of the backends that ended (a
/// pgbench client's), which the postmaster counts as its children's.
fn postgres_seconds() -> f64 {
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return 0.0;
    };
    procs
        .flatten()
        .filter_map(|entry| {
            let pid = entry.file_name().into_string().ok()?;
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
            let (own, children) = (comm.trim_end() == "postgres").then(|| cpu_seconds(&pid))??;
            Some(own + children)
        })
        .sum()
}

/// CPU seconds of finished children of this process (a `pgbench` run).
fn children_seconds() -> f64 {
    // SAFETY: getrusage writes into the struct it is given.
    let usage = unsafe {
        let mut usage = std::mem::zeroed::<libc::rusage>();
        libc::getrusage(libc::RUSAGE_CHILDREN, &mut usage);
        usage
    };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    secs(usage.ru_utime) + secs(usage.ru_stime)
}

/// The machine's busy and total CPU seconds, from /proc/stat.
fn machine_seconds() -> (f64, f64) {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let ticks: Vec<u64> = stat
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .skip(1)
        .filter_map(|t| t.parse().ok())
        .collect();
    let total: u64 = ticks.iter().sum();
    let idle = ticks.get(3).copied().unwrap_or(0) + ticks.get(4).copied().unwrap_or(0);
    let hz = clock_ticks();
    ((total - idle) as f64 / hz, total as f64 / hz)
}

/// PostgreSQL's own counters, of the whole server (measure on a quiet one).
///
/// Write transactions (one commit each) come from the next transaction id
/// and WAL bytes from the WAL insert position, both exact at any moment;
/// WAL records and flushes from `pg_stat_wal`, which backends report up to
/// a second late (ten when they fall idle), so those two are approximate.
/// The last checkpoint's redo position tells whether one began during the
/// run: PostgreSQL then logs each page whole the first time it changes,
/// and the run's WAL bytes count those images (bench/wal/breakdown.sh
/// measures them apart).
#[derive(Clone, Copy, Default)]
struct Database {
    commits: i64,
    statements: Option<i64>,
    wal_records: i64,
    wal_bytes: i64,
    wal_syncs: i64,
    checkpoint_redo: Option<i64>,
}

async fn database(client: &tokio_postgres::Client) -> Option<Database> {
    let row = client
        .query_one(
            "SELECT txid_snapshot_xmax(txid_current_snapshot()), w.wal_records, \
                    pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')::bigint, w.wal_sync \
               FROM pg_stat_wal w",
            &[],
        )
        .await
        .map_err(|e| eprintln!("no database figures: {e}"))
        .ok()?;
    // Statements per cycle only where pg_stat_statements is loaded.
    let statements = client
        .query_one(
            "SELECT coalesce(sum(calls), 0)::bigint FROM pg_stat_statements \
              WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())",
            &[],
        )
        .await
        .ok()
        .map(|row| row.get(0));
    // Only where the role may read the control file (a superuser, or one
    // granted pg_control_checkpoint).
    let checkpoint_redo = client
        .query_one(
            "SELECT pg_wal_lsn_diff(redo_lsn, '0/0')::bigint FROM pg_control_checkpoint()",
            &[],
        )
        .await
        .ok()
        .map(|row| row.get(0));
    Some(Database {
        commits: row.get(0),
        wal_records: row.get(1),
        wal_bytes: row.get(2),
        wal_syncs: row.get(3),
        statements,
        checkpoint_redo,
    })
}

/// The page of a replica's `--metrics-listen` address (`host:port`).
pub(crate) async fn scrape(address: &str) -> Option<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(address).await.ok()?;
    let request = format!("GET /metrics HTTP/1.0\r\nHost: {address}\r\n\r\n");
    stream.write_all(request.as_bytes()).await.ok()?;
    let mut page = String::new();
    stream.read_to_string(&mut page).await.ok()?;
    Some(page)
}

/// The batches of one replica so far: (statements, calls) by kind.
async fn batches(address: &str) -> Option<[(f64, f64); 2]> {
    let text = scrape(address).await?;
    let value = |name: &str, kind: &str| -> f64 {
        text.lines()
            .filter(|line| line.starts_with(name) && line.contains(&format!("kind=\"{kind}\"")))
            .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    Some(["acquire", "complete"].map(|kind| {
        (
            value("idempotency_batch_size_count", kind),
            value("idempotency_batch_size_sum", kind),
        )
    }))
}

/// Where the figures are read from.
pub(crate) struct Meter {
    servers: Vec<u32>,
    database: Option<tokio_postgres::Client>,
    metrics: Vec<String>,
}

/// The counters at one moment.
pub(crate) struct Reading {
    bench: f64,
    children: f64,
    servers: Vec<(f64, u64)>,
    postgres: f64,
    machine: (f64, f64),
    database: Option<Database>,
    batches: Vec<Option<[(f64, f64); 2]>>,
}

impl Meter {
    /// `database`: a connection to the database the scenario writes to, for
    /// its commits and WAL (`None`: not reported).
    pub(crate) async fn new(servers: &[u32], database: Option<&str>, metrics: &[String]) -> Self {
        let database = match database {
            Some(url) => match tokio_postgres::connect(url, tokio_postgres::NoTls).await {
                Ok((client, connection)) => {
                    tokio::spawn(connection);
                    Some(client)
                }
                Err(e) => {
                    eprintln!("no database figures: cannot connect to the database: {e}");
                    None
                }
            },
            None => None,
        };
        Meter {
            servers: servers.to_vec(),
            database,
            metrics: metrics.to_vec(),
        }
    }

    pub(crate) async fn read(&self) -> Reading {
        let database = match &self.database {
            Some(client) => database(client).await,
            None => None,
        };
        let mut batches_now = Vec::with_capacity(self.metrics.len());
        for url in &self.metrics {
            batches_now.push(batches(url).await);
        }
        Reading {
            bench: cpu_seconds("self").map_or(0.0, |(own, _)| own),
            children: children_seconds(),
            servers: self
                .servers
                .iter()
                .map(|pid| {
                    (
                        cpu_seconds(&pid.to_string()).map_or(0.0, |(own, _)| own),
                        context_switches(*pid),
                    )
                })
                .collect(),
            postgres: postgres_seconds(),
            machine: machine_seconds(),
            database,
            batches: batches_now,
        }
    }

    /// What happened between `before` and now, per one of `ops` operations
    /// (cycles or calls): prints it as one human line, and returns the
    /// figures (for the `RESULT` line and `--check`).
    pub(crate) async fn report(&self, name: &str, before: &Reading, ops: u64) -> Cost {
        let after = self.read().await;
        let ops = ops.max(1) as f64;
        let us = |seconds: f64| seconds / ops * 1e6;
        let mut human = format!("{name} cost per operation:");
        // The RESULT fields: name, value, decimals.
        let mut figures: Vec<(String, f64, usize)> = Vec::new();
        if !self.servers.is_empty() {
            let (cpu, switches) = after
                .servers
                .iter()
                .zip(&before.servers)
                .fold((0.0, 0u64), |(cpu, switches), (a, b)| {
                    (cpu + a.0 - b.0, switches + a.1.saturating_sub(b.1))
                });
            let (cpu, switches) = (us(cpu), switches as f64 / ops);
            let _ = write!(
                human,
                " server {cpu:.0} µs CPU ({switches:.1} context switches),"
            );
            figures.push(("server_cpu_us".into(), cpu, 0));
            figures.push(("server_switches".into(), switches, 2));
        }
        let postgres = us(after.postgres - before.postgres);
        let bench = us(after.bench - before.bench);
        let pgbench = us(after.children - before.children);
        let busy = (after.machine.0 - before.machine.0)
            / (after.machine.1 - before.machine.1).max(f64::MIN_POSITIVE);
        let _ = write!(
            human,
            " PostgreSQL {postgres:.0} µs, bench {bench:.0} µs, pgbench {pgbench:.0} µs; machine {:.0}% busy",
            busy * 100.0,
        );
        figures.push(("postgres_cpu_us".into(), postgres, 0));
        figures.push(("bench_cpu_us".into(), bench, 0));
        figures.push(("pgbench_cpu_us".into(), pgbench, 0));
        figures.push(("machine_busy".into(), busy, 2));
        if let (Some(a), Some(b)) = (after.database, before.database) {
            let per = |x: i64| x as f64 / ops;
            let commits = per(a.commits - b.commits);
            let wal_bytes = per(a.wal_bytes - b.wal_bytes);
            let wal_records = per(a.wal_records - b.wal_records);
            let wal_flushes = per(a.wal_syncs - b.wal_syncs);
            let _ = write!(
                human,
                "; {commits:.3} commits, {wal_bytes:.0} WAL bytes in about {wal_records:.1} records, about {wal_flushes:.3} WAL flushes",
            );
            figures.push(("commits".into(), commits, 3));
            figures.push(("wal_bytes".into(), wal_bytes, 0));
            figures.push(("wal_records".into(), wal_records, 2));
            figures.push(("wal_flushes".into(), wal_flushes, 3));
            if let (Some(ra), Some(rb)) = (a.checkpoint_redo, b.checkpoint_redo) {
                let checkpoint = ra != rb;
                if checkpoint {
                    let _ = write!(human, " (a checkpoint began: page images included)");
                }
                figures.push(("checkpoint".into(), f64::from(u8::from(checkpoint)), 0));
            }
            // Less this meter's own two statements.
            if let (Some(sa), Some(sb)) = (a.statements, b.statements) {
                let statements = per(sa - sb - 2);
                let _ = write!(human, ", {statements:.3} statements");
                figures.push(("statements".into(), statements, 3));
            }
        }
        for (n, (a, b)) in after.batches.iter().zip(&before.batches).enumerate() {
            if let (Some(a), Some(b)) = (a, b) {
                let shape = |i: usize| {
                    let statements = a[i].0 - b[i].0;
                    let calls = a[i].1 - b[i].1;
                    (statements, calls / statements.max(1.0))
                };
                let ((acquires, acquire_size), (completes, complete_size)) = (shape(0), shape(1));
                let replica = n + 1;
                let _ = write!(
                    human,
                    "\n  replica {replica}: {acquires:.0} acquire statements of {acquire_size:.1} calls on average, {completes:.0} complete statements of {complete_size:.1}",
                );
                figures.push((format!("replica{replica}_acquire_batch"), acquire_size, 2));
                figures.push((format!("replica{replica}_complete_batch"), complete_size, 2));
            }
        }
        println!("{human}");
        Cost { figures }
    }
}

/// What an operation cost, as [`Meter::report`] measured it: each figure's
/// `RESULT` name, its value and the decimals it is printed with.
pub(crate) struct Cost {
    figures: Vec<(String, f64, usize)>,
}

impl Cost {
    /// The figures as `RESULT` fields (` name=value` each).
    pub(crate) fn fields(&self) -> String {
        self.figures
            .iter()
            .map(|(name, value, decimals)| format!(" {name}={value:.decimals$}"))
            .collect()
    }

    /// The figure of that `RESULT` name, if it was measured.
    pub(crate) fn get(&self, name: &str) -> Option<f64> {
        self.figures
            .iter()
            .find(|(n, _, _)| n == name)
            .map(|(_, value, _)| *value)
    }
}

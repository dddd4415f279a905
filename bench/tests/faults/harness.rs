//! What every fault test needs: a cluster behind a proxy with coordinators
//! on it, a probe that samples their health, the load that records a
//! history, the final read, and the checks of calls and history.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use idempotency_bench::history::{self, Call, CallKind, Entry};
use idempotency_bench::recorder::{self, now_us};
use idempotency_coordinator::proto;
use tonic_health::pb::health_check_response::ServingStatus;

use crate::binary;
use crate::client::{Health, Recording};
use crate::cluster::Cluster;
use crate::process::{Launch, ServerProcess};
use crate::proxy::Proxy;

/// The readiness service name.
pub const READINESS: &str = "idempotency.v1.Coordinator";

/// Small timeouts, so faults show within the test's few seconds.
pub const FLAGS: &[&str] = &["--connect-wait", "300ms", "--query-timeout", "1s"];

/// `flags`, with readiness checked every 200 ms unless they say otherwise
/// (the default, 1 s, would make each fault's readiness figures mostly the
/// check's own period).
pub fn with_health_interval(flags: &[&'static str]) -> Vec<&'static str> {
    let mut all = flags.to_vec();
    if !flags.contains(&"--health-interval") {
        all.extend(["--health-interval", "200ms"]);
    }
    all
}

/// How far past its deadline a call may answer (scheduling on a busy
/// two-core machine).
pub const MARGIN: Duration = Duration::from_millis(500);

/// One fault test at a time: their timings are the point.
pub async fn serial() -> tokio::sync::MutexGuard<'static, ()> {
    static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    SERIAL.lock().await
}

/// A test's PostgreSQL, the proxy in front of it, and coordinators on it.
pub struct Env {
    pub servers: Vec<Option<ServerProcess>>,
    pub proxy: Proxy,
    pub cluster: Cluster,
}

impl Env {
    pub async fn start(replicas: usize, flags: &[&'static str]) -> Env {
        let cluster = Cluster::start().await;
        let proxy = Proxy::start(cluster.socket()).await;
        let mut servers = Vec::new();
        for _ in 0..replicas {
            let flags = with_health_interval(flags);
            let launch = Launch {
                binary: Some(binary::path()),
                ..Launch::default()
            };
            servers.push(Some(
                ServerProcess::launch(&proxy.url(), &flags, launch).await,
            ));
        }
        Env {
            servers,
            proxy,
            cluster,
        }
    }

    pub fn addr(&self, i: usize) -> SocketAddr {
        self.servers[i].as_ref().expect("running").addr
    }
}

/// Seconds since the Unix epoch as a short offset from `t0`, for reports.
pub fn secs(t0: i64, t: i64) -> f64 {
    (t - t0) as f64 / 1e6
}

/// One health sample of a server.
#[derive(Debug, Clone, Copy)]
pub struct Sample {
    pub at_us: i64,
    pub readiness: Option<ServingStatus>,
    pub liveness: Option<ServingStatus>,
}

/// Samples a server's readiness and liveness every 50 ms.
pub struct Monitor {
    samples: Arc<Mutex<Vec<Sample>>>,
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl Monitor {
    pub async fn start(addr: SocketAddr) -> Monitor {
        let samples = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let mut health = Health::connect(addr).await;
        let task = tokio::spawn({
            let samples = Arc::clone(&samples);
            let stop = Arc::clone(&stop);
            async move {
                while !stop.load(Ordering::Relaxed) {
                    let at_us = now_us();
                    let readiness = health.check(READINESS).await;
                    let liveness = health.check("").await;
                    samples.lock().unwrap().push(Sample {
                        at_us,
                        readiness,
                        liveness,
                    });
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        });
        Monitor {
            samples,
            stop,
            task,
        }
    }

    pub fn samples(&self) -> Vec<Sample> {
        self.samples.lock().unwrap().clone()
    }

    /// Waits up to `deadline` for a sample taken at or after `since_us` that
    /// `wanted` accepts; returns how long after `since_us` it was taken.
    pub async fn until(
        &self,
        since_us: i64,
        deadline: Duration,
        wanted: impl Fn(&Sample) -> bool,
    ) -> Option<Duration> {
        let end = Instant::now() + deadline;
        loop {
            if let Some(s) = self
                .samples()
                .iter()
                .find(|s| s.at_us >= since_us && wanted(s))
            {
                return Some(Duration::from_micros((s.at_us - since_us) as u64));
            }
            if Instant::now() > end {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub async fn stop(self) -> Vec<Sample> {
        self.stop.store(true, Ordering::Relaxed);
        let samples = Arc::clone(&self.samples);
        let _ = self.task.await;
        samples.lock().unwrap().clone()
    }
}

pub fn ready(s: &Sample) -> bool {
    s.readiness == Some(ServingStatus::Serving)
}

pub fn not_ready(s: &Sample) -> bool {
    s.readiness == Some(ServingStatus::NotServing)
}

/// Liveness samples that were not SERVING.
pub fn liveness_lapses(samples: &[Sample], t0: i64) -> Vec<String> {
    samples
        .iter()
        .filter(|s| s.liveness != Some(ServingStatus::Serving))
        .map(|s| format!("liveness {:?} at +{:.2}s", s.liveness, secs(t0, s.at_us)))
        .collect()
}

fn seconds(s: i64) -> Option<prost_types::Duration> {
    Some(prost_types::Duration {
        seconds: s,
        nanos: 0,
    })
}

/// The scope the load runs in.
pub const SCOPE: &str = "faults";

/// Clients running Acquire → work → Complete (and Acquire with wait) on a
/// few shared keys, a fresh set every `GENERATION`, recording every call.
pub struct Load {
    stop: Arc<AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    pub history: Arc<Mutex<Vec<Entry>>>,
}

/// Workers, keys shared per generation, and how long a generation lasts.
const WORKERS: usize = 6;
const KEYS: u128 = 3;
const GENERATION: Duration = Duration::from_millis(400);
/// Each call's deadline, and an Acquire-with-wait's window and deadline.
pub const DEADLINE: Duration = Duration::from_secs(1);
const WAIT_SECS: i64 = 1;
const WAIT_DEADLINE: Duration = Duration::from_millis(1500);
/// Leases are short, so the final read can come soon after the load.
const LEASE_SECS: i64 = 2;

impl Load {
    /// Starts the workers on `servers` (each worker starts on one and moves
    /// to the next when a call fails without a word from the server).
    pub async fn start(servers: &[SocketAddr]) -> Load {
        let history = Arc::new(Mutex::new(Vec::new()));
        let mut clients = Vec::new();
        for addr in servers {
            clients.push(Recording::connect(*addr, Arc::clone(&history)).await);
        }
        let stop = Arc::new(AtomicBool::new(false));
        let started = Instant::now();
        let tasks = (0..WORKERS)
            .map(|w| {
                let mut clients = clients.clone();
                let n = clients.len();
                clients.rotate_left(w % n);
                let stop = Arc::clone(&stop);
                tokio::spawn(async move {
                    let mut n = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        let generation = started.elapsed().as_millis() / GENERATION.as_millis();
                        let pick = uuid::Uuid::new_v4().as_u128();
                        let key = format!("g{generation}-{}", pick % KEYS);
                        cycle(&mut clients, w, n, &key, pick).await;
                        n += 1;
                    }
                })
            })
            .collect();
        Load {
            stop,
            tasks,
            history,
        }
    }

    /// Stops the workers (each finishes its cycle) and returns the history.
    pub async fn stop(self) -> Vec<Entry> {
        self.stop.store(true, Ordering::Relaxed);
        for task in self.tasks {
            task.await.expect("load worker");
        }
        self.history.lock().unwrap().clone()
    }

    /// Waits until some call that started at or after `since_us` was
    /// answered by the database (see [`went_to_database`]); returns when it
    /// ended.
    pub async fn until_ok_after(&self, since_us: i64, deadline: Duration) -> Option<i64> {
        let end = Instant::now() + deadline;
        loop {
            let found = self
                .history
                .lock()
                .unwrap()
                .iter()
                .filter_map(|e| match e {
                    Entry::Call(c) if c.start_us >= since_us && went_to_database(c) => {
                        Some(c.end_us)
                    }
                    _ => None,
                })
                .min();
            if found.is_some() {
                return found;
            }
            if Instant::now() > end {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// Whether an answer shows the database answered: a PROCEED or an OK
/// Complete (replays may come from the server's memory).
pub fn went_to_database(c: &Call) -> bool {
    c.ok() && (c.kind == CallKind::Complete || c.decision == Some(history::Decision::Proceed))
}

/// Whether a failed call came from the server (coordinator errors always
/// carry an ErrorInfo reason) rather than from a broken connection.
fn from_server(status: &tonic::Status) -> bool {
    use tonic_types::StatusExt;
    status.get_error_details().error_info().is_some()
}

/// One logical attempt on `key`: Acquire (retried with the same request_id
/// while the answer is unknown), and on PROCEED a little work and a
/// Complete (retried with the same token likewise).
async fn cycle(clients: &mut [Recording], w: usize, n: u64, key: &str, pick: u128) {
    let request_id = format!("w{w}-{n}");
    let waits = pick.is_multiple_of(4);
    let mut req = proto::AcquireRequest {
        scope: SCOPE.into(),
        key: key.into(),
        request_id,
        lease_ttl: seconds(LEASE_SECS),
        ..Default::default()
    };
    let deadline = if waits {
        req.wait = seconds(WAIT_SECS);
        WAIT_DEADLINE
    } else {
        DEADLINE
    };
    let mut lease = None;
    for _ in 0..4 {
        match clients[0].acquire(req.clone(), deadline).await {
            Some(Ok(resp)) => {
                if resp.decision == proto::Decision::Proceed as i32 {
                    lease = resp.lease;
                } else {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                break;
            }
            Some(Err(status)) if !from_server(&status) => clients.rotate_left(1),
            _ => {}
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let Some(lease) = lease else { return };
    tokio::time::sleep(Duration::from_millis(20)).await; // the work
    let req = crate::client::cycle_complete(SCOPE, key, lease, pick, &format!("w{w}"));
    for _ in 0..4 {
        match clients[0].complete(req.clone(), DEADLINE).await {
            Some(Ok(_)) => return,
            Some(Err(status)) if !from_server(&status) => clients.rotate_left(1),
            Some(Err(status))
                if matches!(
                    status.code(),
                    tonic::Code::Aborted | tonic::Code::FailedPrecondition | tonic::Code::NotFound
                ) =>
            {
                return;
            }
            _ => {}
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Reads every key the history names from the database, once every lease
/// granted in it has run out by the database's clock, and appends the
/// reads to the history.
pub async fn final_reads(cluster: &Cluster, history: &mut Vec<Entry>) {
    let db = cluster.connect().await;
    let calls = || {
        history.iter().filter_map(|e| match e {
            Entry::Call(c) => Some(c),
            Entry::Final(_) => None,
        })
    };
    let last_expiry = calls()
        .filter_map(|c| c.lease.as_ref().map(|l| l.expires_at_us))
        .max()
        .unwrap_or(0);
    let end = Instant::now() + Duration::from_secs(15);
    loop {
        let now: chrono::DateTime<chrono::Utc> = db
            .query_one("SELECT clock_timestamp()", &[])
            .await
            .unwrap()
            .get(0);
        if now.timestamp_micros() > last_expiry {
            break;
        }
        assert!(Instant::now() < end, "leases did not run out");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let keys: BTreeSet<(String, String)> =
        calls().map(|c| (c.scope.clone(), c.key.clone())).collect();
    for (scope, key) in keys {
        let read = recorder::final_read(&db, "default", &scope, &key)
            .await
            .expect("final read");
        history.push(read);
    }
}

/// Calls that broke the promises a caller relies on under faults: every
/// call answered by its deadline (plus [`MARGIN`]), never CANCELLED; a
/// failure is UNAVAILABLE with RetryInfo or DEADLINE_EXCEEDED (or a lost
/// lease, for a Complete retried after its lease ran out); a waiter's
/// answer comes within its window. Calls to servers in `dead` (killed on
/// purpose) need only have answered in time.
pub fn call_problems(history: &[Entry], t0: i64, dead: &[SocketAddr]) -> Vec<String> {
    let mut problems = Vec::new();
    for c in history.iter().filter_map(|e| match e {
        Entry::Call(c) => Some(c),
        Entry::Final(_) => None,
    }) {
        let at = format!(
            "{:?} {} at +{:.2}s (took {} ms)",
            c.kind,
            c.key,
            secs(t0, c.start_us),
            c.took_us() / 1000
        );
        let deadline = Duration::from_millis(c.deadline_ms.unwrap_or(0));
        if c.code == recorder::NO_ANSWER {
            problems.push(format!("{at}: no answer by its deadline"));
            continue;
        }
        if c.took_us() > (deadline + MARGIN).as_micros() as i64 {
            problems.push(format!("{at}: answered {} past its deadline", c.code));
        }
        let to_dead = dead.iter().any(|d| d.to_string() == c.server);
        if to_dead {
            continue;
        }
        match c.code.as_str() {
            "OK" | "DEADLINE_EXCEEDED" => {}
            "UNAVAILABLE" if c.retry_info => {}
            "ABORTED" if c.kind == CallKind::Complete && c.reason == "LEASE_LOST" => {}
            code => problems.push(format!("{at}: {code} ({})", c.reason)),
        }
        if let (true, Some(wait_ms)) = (c.ok(), c.wait_ms) {
            let window = Duration::from_millis(wait_ms).min(deadline) + MARGIN;
            if c.took_us() > window.as_micros() as i64 {
                problems.push(format!("{at}: a waiter answered after its window"));
            }
        }
    }
    problems
}

/// What a run measured, printed so that it can be quoted.
pub struct Report {
    pub name: &'static str,
    /// Readiness NOT_SERVING this long after the fault.
    pub flipped: Option<Duration>,
    /// Readiness SERVING again this long after recovery.
    pub back: Option<Duration>,
    /// The span from the first failed call to the last.
    pub refused: Option<(f64, f64)>,
    pub calls: usize,
    pub codes: BTreeMap<String, usize>,
    pub violations: Vec<history::Violation>,
}

impl Report {
    pub fn new(name: &'static str, history: &[Entry], t0: i64) -> Report {
        let calls: Vec<&Call> = history
            .iter()
            .filter_map(|e| match e {
                Entry::Call(c) => Some(c),
                Entry::Final(_) => None,
            })
            .collect();
        let mut codes = BTreeMap::new();
        for c in &calls {
            *codes.entry(c.code.clone()).or_insert(0) += 1;
        }
        let failed: Vec<&&Call> = calls.iter().filter(|c| !c.ok()).collect();
        let refused = failed
            .iter()
            .map(|c| c.end_us)
            .min()
            .zip(failed.iter().map(|c| c.end_us).max())
            .map(|(a, b)| (secs(t0, a), secs(t0, b)));
        Report {
            name,
            flipped: None,
            back: None,
            refused,
            calls: calls.len(),
            codes,
            violations: history::check(history),
        }
    }

    pub fn print(&self) {
        let ms =
            |d: Option<Duration>| d.map_or("never".into(), |d| format!("{} ms", d.as_millis()));
        let refused = self.refused.map_or("none".into(), |(a, b)| {
            format!("from +{a:.2}s to +{b:.2}s after the fault ({:.2} s)", b - a)
        });
        println!(
            "FAULT {}: readiness NOT_SERVING after {}, SERVING again {} after recovery; calls refused {}; {} calls in the history {:?}; {} violations",
            self.name,
            ms(self.flipped),
            ms(self.back),
            refused,
            self.calls,
            self.codes,
            self.violations.len()
        );
        for v in &self.violations {
            println!("  violation: {v}");
        }
    }
}

/// Fails the test with every problem found.
pub fn assert_none(what: &str, problems: &[String]) {
    assert!(
        problems.is_empty(),
        "{what}: {} problems:\n{}",
        problems.len(),
        problems
            .iter()
            .take(30)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    );
}

//! The load: client tasks running Acquire → work → Complete cycles on keys
//! from pools of their own (one pool a group: the keys of one worker, of
//! one shard...), a fresh few keys every generation, every call recorded.
//! Every call a fault leaves without a definite answer (UNAVAILABLE,
//! DEADLINE_EXCEEDED, none) is retried as is: Acquire with its request_id,
//! Complete with its lease token.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use idempotency_bench::history::{self, Call, CallKind, Entry};
use idempotency_bench::recorder;
use idempotency_coordinator::proto;

use crate::client::Recording;
use crate::harness::CitusDatabase;

/// The scope the load runs in.
pub const SCOPE: &str = "citus-faults";
/// Each call's deadline.
pub const DEADLINE: Duration = Duration::from_secs(1);
/// How far past its deadline a call may answer (a busy two-core machine).
const MARGIN: Duration = Duration::from_millis(500);
/// Fresh keys per generation of each pool, and how long one lasts.
const KEYS: usize = 2;
const GENERATION: Duration = Duration::from_millis(400);
/// Leases are short, so the final read can come soon after the load.
const LEASE_SECS: i64 = 2;
/// The pause before a retry.
const RETRY: Duration = Duration::from_millis(50);

pub struct Load {
    stop: Arc<AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    history: Arc<Mutex<Vec<Entry>>>,
}

impl Load {
    /// `per_pool` tasks on each pool of keys, all through the server at
    /// `addr`, each on a connection of its own.
    pub async fn start(addr: SocketAddr, pools: &[Vec<String>], per_pool: usize) -> Load {
        let history = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let started = Instant::now();
        let mut tasks = Vec::new();
        for (p, pool) in pools.iter().enumerate() {
            assert!(pool.len() >= KEYS, "pool {p} has too few keys");
            for t in 0..per_pool {
                let mut client = Recording::connect(addr, Arc::clone(&history)).await;
                let (stop, pool) = (Arc::clone(&stop), Arc::new(pool.clone()));
                tasks.push(tokio::spawn(async move {
                    let mut n = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        let generation =
                            (started.elapsed().as_millis() / GENERATION.as_millis()) as usize;
                        let pick = uuid::Uuid::new_v4().as_u128();
                        let key = &pool
                            [(generation * KEYS + (pick % KEYS as u128) as usize) % pool.len()];
                        let id = format!("p{p}-t{t}-{n}");
                        cycle(&mut client, &stop, &id, key, pick).await;
                        n += 1;
                    }
                }));
            }
        }
        Load {
            stop,
            tasks,
            history,
        }
    }

    /// The calls recorded so far.
    pub fn calls(&self) -> Vec<Call> {
        calls(&self.history.lock().unwrap())
    }

    /// Waits until `done` holds of the calls recorded so far; fails the
    /// test, naming `what`, after `within`.
    pub async fn until(&self, within: Duration, what: &str, done: impl Fn(&[Call]) -> bool) {
        let end = Instant::now() + within;
        while !done(&self.calls()) {
            assert!(Instant::now() < end, "not within {within:?}: {what}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Stops the tasks (each finishes its cycle, or its retries), then
    /// appends a final read of every key called, once every lease granted
    /// has run out by the database's clock.
    pub async fn stop(self, db: &CitusDatabase) -> Vec<Entry> {
        self.stop.store(true, Ordering::Relaxed);
        for task in self.tasks {
            task.await.expect("load task");
        }
        let mut history = self.history.lock().unwrap().clone();
        final_reads(db, &mut history).await;
        history
    }
}

/// The calls of a history.
pub fn calls(history: &[Entry]) -> Vec<Call> {
    history
        .iter()
        .filter_map(|e| match e {
            Entry::Call(c) => Some(c.clone()),
            Entry::Final(_) => None,
        })
        .collect()
}

/// An answer that leaves the outcome open, so the call is sent again.
fn retryable(answer: &Option<Result<impl Sized, tonic::Status>>) -> bool {
    match answer {
        None => true,
        Some(Ok(_)) => false,
        Some(Err(s)) => matches!(
            s.code(),
            tonic::Code::Unavailable | tonic::Code::DeadlineExceeded
        ),
    }
}

/// One logical attempt on `key`: Acquire until answered, and on PROCEED a
/// little work and a Complete until answered (or its lease is lost).
async fn cycle(client: &mut Recording, stop: &AtomicBool, id: &str, key: &str, pick: u128) {
    let req = proto::AcquireRequest {
        scope: SCOPE.into(),
        key: key.into(),
        request_id: id.into(),
        lease_ttl: Some(prost_types::Duration {
            seconds: LEASE_SECS,
            nanos: 0,
        }),
        ..Default::default()
    };
    let lease = loop {
        let answer = client.acquire(req.clone(), DEADLINE).await;
        if !retryable(&answer) {
            match answer {
                Some(Ok(resp)) if resp.decision == proto::Decision::Proceed as i32 => {
                    break resp.lease;
                }
                _ => return,
            }
        }
        if stop.load(Ordering::Relaxed) {
            return;
        }
        tokio::time::sleep(RETRY).await;
    };
    let Some(lease) = lease else { return };
    tokio::time::sleep(Duration::from_millis(20)).await; // the work
    let req = crate::client::cycle_complete(SCOPE, key, lease, pick, id);
    while retryable(&client.complete(req.clone(), DEADLINE).await) {
        if stop.load(Ordering::Relaxed) {
            return;
        }
        tokio::time::sleep(RETRY).await;
    }
}

async fn final_reads(db: &CitusDatabase, history: &mut Vec<Entry>) {
    let client = db.connect().await;
    let calls = calls(history);
    let last_expiry = calls
        .iter()
        .filter_map(|c| c.lease.as_ref().map(|l| l.expires_at_us))
        .max()
        .unwrap_or(0);
    let end = Instant::now() + Duration::from_secs(15);
    loop {
        let now: chrono::DateTime<chrono::Utc> = client
            .query_one("SELECT clock_timestamp()", &[])
            .await
            .expect("read the clock")
            .get(0);
        if now.timestamp_micros() > last_expiry {
            break;
        }
        assert!(Instant::now() < end, "leases did not run out");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let keys: BTreeSet<(String, String)> = calls
        .iter()
        .map(|c| (c.scope.clone(), c.key.clone()))
        .collect();
    for (scope, key) in keys {
        let read = recorder::final_read(&client, "default", &scope, &key)
            .await
            .expect("final read");
        history.push(read);
    }
}

/// Whether the database answered the call: a PROCEED or an OK Complete
/// (replays may come from the server's memory).
pub fn went_to_database(c: &Call) -> bool {
    c.ok() && (c.kind == CallKind::Complete || c.decision == Some(history::Decision::Proceed))
}

/// Asserts that no call broke what a caller relies on under faults: every call
/// answered by its deadline (plus a margin); a failure is UNAVAILABLE with
/// RetryInfo or DEADLINE_EXCEEDED (or a lost lease, for a Complete retried
/// after its lease ran out). A failing assertion shows what the server
/// logged at ERROR meanwhile: an INTERNAL answer's cause.
pub fn assert_calls_answered(calls: &[Call], t0: i64) {
    let problems = call_problems(calls, t0);
    assert!(
        problems.is_empty(),
        "calls:\n{}\nthe server's errors (latest last):\n{}",
        problems.join("\n"),
        crate::server_log::errors().join("\n")
    );
}

fn call_problems(calls: &[Call], t0: i64) -> Vec<String> {
    let mut problems = Vec::new();
    for c in calls {
        let at = format!(
            "{:?} {} at +{:.2}s (took {} ms)",
            c.kind,
            c.key,
            secs(t0, c.start_us),
            c.took_us() / 1000
        );
        let deadline = Duration::from_millis(c.deadline_ms.unwrap_or(0));
        if c.took_us() > (deadline + MARGIN).as_micros() as i64 {
            problems.push(format!("{at}: answered {} past its deadline", c.code));
        }
        match c.code.as_str() {
            "OK" | "DEADLINE_EXCEEDED" => {}
            "UNAVAILABLE" if c.retry_info => {}
            "ABORTED" if c.kind == CallKind::Complete && c.reason == "LEASE_LOST" => {}
            code => problems.push(format!("{at}: {code} ({})", c.reason)),
        }
    }
    problems
}

/// The history checker's verdict, every violation named.
pub fn assert_history_clean(history: &[Entry]) {
    let violations = history::check(history);
    assert!(
        violations.is_empty(),
        "{} violation(s) in the history:\n{}",
        violations.len(),
        violations
            .iter()
            .map(|v| format!("  {v}"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

/// Seconds from `t0` to `t` (microseconds since the epoch).
pub fn secs(t0: i64, t: i64) -> f64 {
    (t - t0) as f64 / 1e6
}

/// Counts of each code among `calls` on `keys` that started in
/// `[from, to)`, with the longest time one took: what callers saw.
pub fn codes(calls: &[Call], keys: &HashSet<String>, from: i64, to: i64) -> String {
    let mut by_code: BTreeMap<(&str, &str), (usize, i64)> = BTreeMap::new();
    for c in calls
        .iter()
        .filter(|c| keys.contains(&c.key) && c.start_us >= from && c.start_us < to)
    {
        let entry = by_code.entry((&c.code, &c.reason)).or_default();
        entry.0 += 1;
        entry.1 = entry.1.max(c.took_us() / 1000);
    }
    by_code
        .iter()
        .map(|((code, reason), (n, max))| match *reason {
            "" => format!("{code} x{n} (longest {max} ms)"),
            reason => format!("{code} {reason} x{n} (longest {max} ms)"),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

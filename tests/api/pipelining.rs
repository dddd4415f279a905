//! `--batch-workers auto`, the default: a replica pipelines two batches on
//! one connection while it is alone on its database, and sends one at a
//! time while another replica shares it. Replicas join and leave (stopped,
//! and killed) under load: the switch shows both ways in each replica's
//! `batches_pipelined` metric and its log, every cycle stays exactly-once
//! across the replicas, and none stalls.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idempotency_coordinator::proto::Decision;
use idempotency_coordinator::proto::coordinator_client::CoordinatorClient;
use tokio::task::JoinHandle;
use tonic::transport::Channel;

use crate::helpers::*;
use crate::metrics::{metrics_addr, scrape};

/// Metrics on, and a probe (which counts the replicas) every 200 ms, each
/// given 400 ms: a count that takes longer under the load fails, and
/// stops pipelining as another replica does (the log tells them apart).
const FLAGS: [&str; 4] = [
    "--metrics-listen",
    "127.0.0.1:0",
    "--health-interval",
    "400ms",
];
/// What a replica logs when a count stops its pipelining.
const NOT_ALONE: &str = "other replicas share the database: one batch at a time";
/// How long a switch may take: a few probes, on a loaded machine.
const SWITCH: Duration = Duration::from_secs(15);
/// How long one call may take under the load before it counts as stalled.
const STALL: Duration = Duration::from_secs(5);
/// Cycles the load must complete after each switch.
const CYCLES_PER_STEP: u64 = 30;
/// Tasks running cycles at once.
const TASKS: usize = 12;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_pipeline_alone_and_not_together_as_they_join_and_leave_under_load() {
    let db = TestDatabase::create().await;
    let a = ServerProcess::start_with(&db.url, &FLAGS).await;
    let load = Load::start(1, a.client().await);
    until_pipelined(&a, true, "A, alone, to pipeline").await;
    load.progressed().await;

    let b = ServerProcess::start_with(&db.url, &FLAGS).await;
    load.join(2, b.client().await);
    until_pipelined(&a, false, "A, joined by B, to stop pipelining").await;
    load.progressed().await;
    assert!(logged(&a, "no other replica shares the database"));
    assert!(logged(&a, NOT_ALONE), "A counted B");
    assert_eq!(
        pipelined(&b).await,
        0.0,
        "B, never alone, does not pipeline"
    );

    load.leave(1).await;
    assert!(a.terminate().await.success());
    until_pipelined(&b, true, "B, left alone by A's stop, to pipeline").await;
    load.progressed().await;

    let c = ServerProcess::start_with(&db.url, &FLAGS).await;
    load.join(3, c.client().await);
    until_pipelined(&b, false, "B, joined by C, to stop pipelining").await;
    load.progressed().await;
    assert!(logged(&b, NOT_ALONE), "B counted C");

    load.leave(3).await;
    c.kill().await;
    until_pipelined(&b, true, "B, left alone by C's crash, to pipeline").await;
    load.progressed().await;

    let cycles = load.stop().await;
    assert!(cycles >= 5 * CYCLES_PER_STEP);
    assert!(b.terminate().await.success());
}

/// The server's `batches_pipelined` gauge.
async fn pipelined(server: &ServerProcess) -> f64 {
    scrape(metrics_addr(server))
        .await
        .value("idempotency_batches_pipelined", &[])
        .expect("the batches_pipelined gauge")
}

async fn until_pipelined(server: &ServerProcess, on: bool, what: &str) {
    let metrics: SocketAddr = metrics_addr(server);
    let wanted = if on { 1.0 } else { 0.0 };
    eventually(what, SWITCH, || async move {
        let s = scrape(metrics).await;
        (s.value("idempotency_batches_pipelined", &[]) == Some(wanted)).then_some(())
    })
    .await;
}

/// Whether `server` logged a line whose message starts with `message`.
fn logged(server: &ServerProcess, message: &str) -> bool {
    server.logs().iter().any(|line| {
        serde_json::from_str::<serde_json::Value>(line).is_ok_and(|entry| {
            entry["fields"]["message"]
                .as_str()
                .is_some_and(|m| m.starts_with(message))
        })
    })
}

/// A replica the load sends cycles to.
#[derive(Clone)]
struct Target {
    id: u32,
    client: CoordinatorClient<Channel>,
    /// Cycles using it now: it is stopped only once none is.
    busy: Arc<AtomicUsize>,
}

/// Counts a cycle on a target while it lives.
struct Busy(Arc<AtomicUsize>);

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Tasks running cycles on the live replicas until stopped; every cycle
/// races two Acquires of a new key on two replicas (one alone: twice on
/// it), completes the winner, and reads the replay on the other.
struct Load {
    targets: Arc<Mutex<Vec<Target>>>,
    done: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    tasks: Vec<JoinHandle<()>>,
}

impl Load {
    fn start(id: u32, client: CoordinatorClient<Channel>) -> Load {
        let targets = Arc::new(Mutex::new(vec![Target {
            id,
            client,
            busy: Arc::default(),
        }]));
        let done = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let tasks = (0..TASKS)
            .map(|task| {
                let (targets, done, stop) = (targets.clone(), done.clone(), stop.clone());
                tokio::spawn(async move {
                    let mut n = 0_usize;
                    while !stop.load(Ordering::SeqCst) {
                        cycle(&targets, task, n).await;
                        n += 1;
                        done.fetch_add(1, Ordering::SeqCst);
                    }
                })
            })
            .collect();
        Load {
            targets,
            done,
            stop,
            tasks,
        }
    }

    fn join(&self, id: u32, client: CoordinatorClient<Channel>) {
        self.targets.lock().unwrap().push(Target {
            id,
            client,
            busy: Arc::default(),
        });
    }

    /// Takes replica `id` out of the load, once no cycle uses it.
    async fn leave(&self, id: u32) {
        let busy = {
            let mut targets = self.targets.lock().unwrap();
            let at = targets.iter().position(|t| t.id == id).expect("a target");
            targets.remove(at).busy
        };
        eventually("the cycles on a leaving replica to end", STALL, || {
            let idle = busy.load(Ordering::SeqCst) == 0;
            async move { idle.then_some(()) }
        })
        .await;
    }

    /// Waits for the load to complete more cycles, failing the test when a
    /// cycle failed or stalled.
    async fn progressed(&self) {
        let from = self.done.load(Ordering::SeqCst);
        let done = &self.done;
        let tasks = &self.tasks;
        eventually("the load to go on", SWITCH, || async move {
            let failed = tasks.iter().any(JoinHandle::is_finished);
            (failed || done.load(Ordering::SeqCst) >= from + CYCLES_PER_STEP).then_some(())
        })
        .await;
        assert!(
            !self.tasks.iter().any(JoinHandle::is_finished),
            "a cycle failed (see the panic above)"
        );
    }

    /// Stops the load; the cycles completed.
    async fn stop(self) -> u64 {
        self.stop.store(true, Ordering::SeqCst);
        for task in self.tasks {
            if let Err(e) = task.await {
                std::panic::resume_unwind(e.into_panic());
            }
        }
        self.done.load(Ordering::SeqCst)
    }
}

/// Two targets for cycle `n` of `task`, each counted busy until dropped.
fn pick(targets: &Mutex<Vec<Target>>, task: usize, n: usize) -> [(Target, Busy); 2] {
    let targets = targets.lock().unwrap();
    let at = |i: usize| {
        let target = targets[i % targets.len()].clone();
        target.busy.fetch_add(1, Ordering::SeqCst);
        let busy = Busy(Arc::clone(&target.busy));
        (target, busy)
    };
    [at(task + n), at(task + n + 1)]
}

async fn cycle(targets: &Mutex<Vec<Target>>, task: usize, n: usize) {
    let [(mut x, _x), (mut y, _y)] = pick(targets, task, n);
    let key = format!("t{task}-{n}");
    let (first, second) = tokio::join!(
        tokio::time::timeout(STALL, x.client.acquire(acquire("pipelining", &key))),
        tokio::time::timeout(STALL, y.client.acquire(acquire("pipelining", &key))),
    );
    let first = first
        .unwrap_or_else(stalled("acquire"))
        .unwrap()
        .into_inner();
    let second = second
        .unwrap_or_else(stalled("acquire"))
        .unwrap()
        .into_inner();
    let decisions = [decision(&first), decision(&second)];
    let (winner, mut winner_client, mut other_client) = match decisions {
        [Decision::Proceed, Decision::InProgress] => (first, x.client, y.client),
        [Decision::InProgress, Decision::Proceed] => (second, y.client, x.client),
        other => panic!("key {key}: {other:?}, not one lease and one refusal"),
    };
    let completing = winner_client.complete(complete(
        "pipelining",
        &key,
        &token(&winner),
        success(key.as_bytes()),
    ));
    tokio::time::timeout(STALL, completing)
        .await
        .unwrap_or_else(stalled("complete"))
        .unwrap();
    let replay = tokio::time::timeout(STALL, other_client.acquire(acquire("pipelining", &key)))
        .await
        .unwrap_or_else(stalled("replay"))
        .unwrap()
        .into_inner();
    assert_eq!(decision(&replay), Decision::AlreadyDone, "key {key}");
    assert_eq!(
        replay.record.unwrap().result.unwrap().result,
        key.as_bytes(),
        "key {key}: the replay is the stored result"
    );
}

/// What a call that took longer than [`STALL`] fails the test with.
fn stalled<T>(what: &'static str) -> impl FnOnce(tokio::time::error::Elapsed) -> T {
    move |_| panic!("{what} stalled for {STALL:?}")
}

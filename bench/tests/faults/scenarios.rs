//! Each fault with the load running, then the history checked: PostgreSQL
//! stopped and started, crashed and restarted, the network cut, its
//! connections silently dead, and a coordinator replica killed.

use std::time::Duration;

use idempotency_bench::recorder::now_us;

use crate::harness::*;
use crate::proxy::Mode;

/// Faults of the database or the network under one coordinator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// PostgreSQL stopped (fast shutdown), started again.
    Stop,
    /// PostgreSQL and its backends SIGKILLed, restarted (crash recovery).
    Crash,
    /// No byte moves (longer than --connect-wait), then the network is back.
    Blackhole,
    /// The connections open now are silently dead for good; new ones work.
    DeadConnections,
}

/// How long a fault lasts before it is healed.
const HOLD: Duration = Duration::from_millis(2500);
/// The load before a fault, and after recovery.
const BEFORE: Duration = Duration::from_secs(1);
const AFTER: Duration = Duration::from_millis(1500);
/// Readiness must follow a fault and a recovery within this.
const READINESS_WITHIN: Duration = Duration::from_secs(5);
/// Calls must work again within this of silently dead connections.
const DEAD_CONNECTIONS_RECOVERY: Duration = Duration::from_secs(20);

/// What a run under a fault saw, for the assertions.
pub struct Run {
    pub report: Report,
    pub samples: Vec<Sample>,
    pub history: Vec<idempotency_bench::history::Entry>,
    pub fault_at: i64,
    /// When calls (or, for the other faults, the network or database)
    /// came back.
    pub healed_at: Option<i64>,
}

pub async fn run(fault: Fault, name: &'static str) -> Run {
    let mut env = Env::start(1, FLAGS).await;
    let addr = env.addr(0);
    let monitor = Monitor::start(addr).await;
    let t0 = now_us();
    assert!(
        monitor
            .until(t0, Duration::from_secs(10), ready)
            .await
            .is_some(),
        "not ready at start"
    );
    let load = Load::start(&[addr]).await;
    tokio::time::sleep(BEFORE).await;

    let fault_at = now_us();
    match fault {
        Fault::Stop => env.cluster.stop_fast().await,
        Fault::Crash => env.cluster.crash().await,
        Fault::Blackhole => env.proxy.set(Mode::Blackhole),
        Fault::DeadConnections => env.proxy.freeze_existing(),
    }
    let flipped = if fault == Fault::DeadConnections {
        None
    } else {
        monitor.until(fault_at, READINESS_WITHIN, not_ready).await
    };
    let (healed_at, back) = if fault == Fault::DeadConnections {
        // Nothing to heal: new connections work from the start. Calls must
        // find that out themselves.
        let recovered = load
            .until_ok_after(fault_at + 1_000, DEAD_CONNECTIONS_RECOVERY)
            .await;
        (recovered, None)
    } else {
        let hold_until = fault_at + HOLD.as_micros() as i64;
        tokio::time::sleep(Duration::from_micros(
            hold_until.saturating_sub(now_us()).max(0) as u64,
        ))
        .await;
        match fault {
            Fault::Stop | Fault::Crash => env.cluster.restart().await,
            _ => env.proxy.set(Mode::Pass),
        }
        let healed_at = now_us();
        let back = monitor.until(healed_at, READINESS_WITHIN, ready).await;
        (Some(healed_at), back)
    };
    tokio::time::sleep(AFTER).await;
    let recovered = match healed_at {
        Some(at) => load.until_ok_after(at, Duration::from_secs(5)).await,
        None => None,
    };
    let mut history = load.stop().await;
    let samples = monitor.stop().await;
    final_reads(&env.cluster, &mut history).await;

    let mut report = Report::new(name, &history, fault_at);
    report.flipped = flipped;
    report.back = back;
    report.print();
    match (fault, healed_at, recovered) {
        (Fault::DeadConnections, Some(at), _) => println!(
            "FAULT {name}: calls answered by the database again {:.2} s after their connections went dead",
            secs(fault_at, at)
        ),
        (_, Some(at), Some(ok)) => println!(
            "FAULT {name}: first call answered OK {:.2} s after recovery",
            secs(at, ok)
        ),
        _ => {}
    }
    assert!(
        healed_at.is_none() || recovered.is_some(),
        "{name}: no call succeeded after recovery"
    );
    drop(env);
    Run {
        report,
        samples,
        history,
        fault_at,
        healed_at,
    }
}

/// The assertions every fault shares: calls answered in time and with the
/// right codes, liveness throughout, and a clean history.
fn assert_kept_promises(run: &Run) {
    assert_none("calls", &call_problems(&run.history, run.fault_at, &[]));
    assert_none("liveness", &liveness_lapses(&run.samples, run.fault_at));
    let violations: Vec<String> = run
        .report
        .violations
        .iter()
        .map(|v| v.to_string())
        .collect();
    assert_none("history", &violations);
}

async fn database_or_network_fault(fault: Fault, name: &'static str) {
    let _turn = serial().await;
    let run = run(fault, name).await;
    assert!(
        run.report.flipped.is_some(),
        "{name}: readiness was not NOT_SERVING within {READINESS_WITHIN:?} of the fault"
    );
    assert!(
        run.report.back.is_some(),
        "{name}: readiness was not SERVING again within {READINESS_WITHIN:?} of recovery"
    );
    assert_kept_promises(&run);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_stopped_and_started_again() {
    database_or_network_fault(Fault::Stop, "postgres-stop").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_killed_and_restarted_with_crash_recovery() {
    database_or_network_fault(Fault::Crash, "postgres-crash").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn network_cut_longer_than_connect_wait_then_restored() {
    database_or_network_fault(Fault::Blackhole, "network-blackhole").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn existing_connections_silently_dead_while_new_ones_work() {
    let _turn = serial().await;
    let run = run(Fault::DeadConnections, "dead-connections").await;
    assert!(
        run.healed_at.is_some(),
        "calls did not work again within {DEAD_CONNECTIONS_RECOVERY:?} of their connections going dead"
    );
    assert_kept_promises(&run);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_killed_while_another_keeps_serving() {
    let _turn = serial().await;
    let mut env = Env::start(2, FLAGS).await;
    let (a, b) = (env.addr(0), env.addr(1));
    let monitor = Monitor::start(b).await;
    let t0 = now_us();
    assert!(
        monitor
            .until(t0, Duration::from_secs(10), ready)
            .await
            .is_some(),
        "not ready at start"
    );
    let load = Load::start(&[a, b]).await;
    tokio::time::sleep(BEFORE).await;
    let fault_at = now_us();
    env.servers[0].take().expect("replica a").kill().await;
    let recovered = load.until_ok_after(fault_at, Duration::from_secs(5)).await;
    tokio::time::sleep(AFTER + Duration::from_secs(1)).await;
    let mut history = load.stop().await;
    let samples = monitor.stop().await;
    final_reads(&env.cluster, &mut history).await;

    let report = Report::new("replica-kill", &history, fault_at);
    report.print();
    let served_after = history
        .iter()
        .filter(|e| {
            matches!(e, idempotency_bench::history::Entry::Call(c)
                if c.ok() && c.start_us > fault_at && c.server == b.to_string())
        })
        .count();
    println!(
        "FAULT replica-kill: {served_after} calls answered OK by the surviving replica after the kill"
    );
    assert!(recovered.is_some(), "no call succeeded after the kill");
    let unready: Vec<String> = samples
        .iter()
        .filter(|s| s.at_us >= fault_at && !ready(s))
        .map(|s| {
            format!(
                "readiness {:?} at +{:.2}s",
                s.readiness,
                secs(fault_at, s.at_us)
            )
        })
        .collect();
    assert_none("the surviving replica's readiness", &unready);
    let run = Run {
        report,
        samples,
        history,
        fault_at,
        healed_at: recovered,
    };
    assert_none("calls", &call_problems(&run.history, fault_at, &[a]));
    assert_none("liveness", &liveness_lapses(&run.samples, fault_at));
    let violations: Vec<String> = run
        .report
        .violations
        .iter()
        .map(|v| v.to_string())
        .collect();
    assert_none("history", &violations);
}

//! Readiness tells the truth: it follows the network both ways, does not
//! say SERVING while calls fail, and does not flap once they work again.

use std::time::Duration;

use idempotency_bench::history::Entry;
use idempotency_bench::recorder::now_us;

use super::ready_env;
use crate::harness::*;
use crate::proxy::Mode;
use crate::scenarios::{Fault, run};

/// Readiness samples that said SERVING while calls had been failing for
/// more than `limit`: failing since the first failed call after the last
/// call the database answered.
fn serving_while_failing(
    history: &[Entry],
    samples: &[Sample],
    limit: Duration,
    t0: i64,
) -> Vec<String> {
    let calls: Vec<_> = history
        .iter()
        .filter_map(|e| match e {
            Entry::Call(c) => Some(c),
            Entry::Final(_) => None,
        })
        .collect();
    samples
        .iter()
        .filter(|s| ready(s))
        .filter_map(|s| {
            let last_ok = calls
                .iter()
                .filter(|c| went_to_database(c) && c.end_us <= s.at_us)
                .map(|c| c.end_us)
                .max()
                .unwrap_or(i64::MIN);
            let failing_since = calls
                .iter()
                .filter(|c| !c.ok() && c.end_us > last_ok && c.end_us <= s.at_us)
                .map(|c| c.end_us)
                .min()?;
            (s.at_us - failing_since > limit.as_micros() as i64).then(|| {
                format!(
                    "SERVING at +{:.2}s while calls had failed since +{:.2}s",
                    secs(t0, s.at_us),
                    secs(t0, failing_since)
                )
            })
        })
        .collect()
}

/// (a) Connections silently dead while new ones would work: calls work
/// again within 20 s, and readiness does not say SERVING while calls have
/// been failing for more than 5 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_dead_connections_are_replaced_and_readiness_tells() {
    let _turn = serial().await;
    let run = run(Fault::DeadConnections, "regression-a-dead-connections").await;
    let problems = serving_while_failing(
        &run.history,
        &run.samples,
        Duration::from_secs(5),
        run.fault_at,
    );
    let recovered = run.healed_at.map(|at| secs(run.fault_at, at));
    println!(
        "REGRESSION a: calls recovered after {recovered:?} s; {} SERVING samples while failing over 5 s",
        problems.len()
    );
    assert!(
        recovered.is_some(),
        "calls did not work again within 20 s of their connections going dead"
    );
    assert_none("readiness while calls fail", &problems);
}

/// (e) Readiness follows the network: NOT_SERVING within 2 s of the cut,
/// SERVING within 2 s of its return.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_readiness_follows_the_network_within_two_seconds() {
    let _turn = serial().await;
    let env = Env::start(
        1,
        // The default interval: the two seconds are the default's promise.
        &[
            "--connect-wait",
            "300ms",
            "--query-timeout",
            "1s",
            "--health-interval",
            "1s",
        ],
    )
    .await;
    let monitor = Monitor::start(env.addr(0)).await;
    assert!(
        monitor
            .until(now_us(), Duration::from_secs(10), ready)
            .await
            .is_some()
    );
    let cut_at = now_us();
    env.proxy.set(Mode::Blackhole);
    let flipped = monitor
        .until(cut_at, Duration::from_secs(5), not_ready)
        .await;
    // The cut lasts at least 3 s, whenever readiness noticed it.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let back_at = now_us();
    env.proxy.set(Mode::Pass);
    let back = monitor.until(back_at, Duration::from_secs(5), ready).await;
    let samples = monitor.stop().await;
    println!(
        "REGRESSION e: readiness NOT_SERVING {flipped:?} after the cut, SERVING {back:?} after its return"
    );
    assert_none("liveness", &liveness_lapses(&samples, cut_at));
    let limit = Duration::from_secs(2);
    assert!(
        flipped.is_some_and(|d| d <= limit),
        "readiness after the cut: {flipped:?}"
    );
    assert!(
        back.is_some_and(|d| d <= limit),
        "readiness after the return: {back:?}"
    );
}

/// (h) Readiness follows whether calls can be served: with the server's
/// default health interval, existing connections going silently dead while
/// new ones work (a NAT that dropped its state) is repaired by replacing
/// them, and readiness does not turn NOT_SERVING once calls are answered
/// again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_readiness_does_not_flap_after_calls_recover_from_dead_connections() {
    let _turn = serial().await;
    let (env, monitor) = ready_env(&["--health-interval", "1s"]).await;
    let load = Load::start(&[env.addr(0)]).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let fault_at = now_us();
    env.proxy.freeze_existing();
    let recovered = load
        .until_ok_after(fault_at, Duration::from_secs(20))
        .await
        .expect("calls answered again");
    // Long enough for every check of the listener and of the calls'
    // connections to have found its connection dead.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let samples = monitor.stop().await;
    load.stop().await;
    let flaps: Vec<String> = samples
        .iter()
        .filter(|s| s.at_us > recovered && not_ready(s))
        .map(|s| format!("NOT_SERVING at +{:.2}s", secs(fault_at, s.at_us)))
        .collect();
    println!(
        "REGRESSION h: calls answered again {:.2} s after the connections went dead; {} NOT_SERVING samples after that",
        secs(fault_at, recovered),
        flaps.len()
    );
    assert_none("readiness after calls recovered", &flaps);
}

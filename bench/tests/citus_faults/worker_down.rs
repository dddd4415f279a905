//! A worker stopped and started again under load: calls on its keys answer
//! UNAVAILABLE (with RetryInfo) while it is down and work again once it is
//! back; calls on the other worker's keys answer throughout.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use idempotency_bench::recorder::now_us;
use tonic_health::pb::health_check_response::ServingStatus;

use crate::client::Health;
use crate::load::{self, Load, codes, secs, went_to_database};
use crate::placement;
use crate::setup::{Env, serial};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_worker_s_keys_answer_unavailable_and_the_other_worker_s_keep_answering() {
    let _serial = serial().await;
    let Some(env) = Env::start().await else {
        return;
    };
    let [stopped, other] = env.db.cluster.workers();
    let mut by_node = placement::keys_by_node(&env.db, 600).await;
    let down = by_node.remove(&stopped).expect("keys on the first worker");
    let up = by_node.remove(&other).expect("keys on the second worker");
    let (down_keys, up_keys): (HashSet<String>, HashSet<String>) =
        (down.iter().cloned().collect(), up.iter().cloned().collect());
    let load = Load::start(env.addr, &[down, up], 3).await;
    let t0 = now_us();
    let answered_since = |keys: &HashSet<String>, since: i64, n: usize| {
        let keys = keys.clone();
        move |calls: &[idempotency_bench::history::Call]| {
            calls
                .iter()
                .filter(|c| keys.contains(&c.key) && c.start_us >= since && went_to_database(c))
                .count()
                >= n
        }
    };
    load.until(
        Duration::from_secs(10),
        "both workers' keys answer",
        |calls| answered_since(&down_keys, t0, 3)(calls) && answered_since(&up_keys, t0, 3)(calls),
    )
    .await;

    let mut health = Health::connect(env.addr).await;
    env.on_cluster(move |c| c.stop_node(stopped)).await;
    let stopped_at = now_us();
    // The listener's session on the stopped worker is lost: that node's
    // health says so, while the replica stays ready (every replica would
    // say the same, and the other worker's keys still answer).
    let node = node_service(stopped);
    let not_ready = readiness(&mut health, &node, ServingStatus::NotServing).await;
    assert_eq!(
        health.check(READINESS).await,
        Some(ServingStatus::Serving),
        "the replica stays ready while one worker is down"
    );
    load.until(
        Duration::from_secs(10),
        "a call on the stopped worker's keys fails",
        |calls| {
            calls
                .iter()
                .any(|c| down_keys.contains(&c.key) && c.start_us >= stopped_at && !c.ok())
        },
    )
    .await;
    // Held down until the other worker's keys have answered a good many
    // calls meanwhile.
    load.until(
        Duration::from_secs(15),
        "the other worker's keys answer while one is down",
        answered_since(&up_keys, stopped_at, 60),
    )
    .await;

    env.on_cluster(move |c| c.start_node(stopped)).await;
    let started_at = now_us();
    let ready = readiness(&mut health, &node, ServingStatus::Serving).await;
    load.until(
        Duration::from_secs(20),
        "the restarted worker's keys answer again",
        answered_since(&down_keys, started_at, 3),
    )
    .await;
    let history = load.stop(&env.db).await;
    let calls = load::calls(&history);
    let back_at = calls
        .iter()
        .filter(|c| down_keys.contains(&c.key) && c.start_us >= started_at && went_to_database(c))
        .map(|c| c.end_us)
        .min()
        .expect("answered after the restart");
    println!(
        "WORKER DOWN: stopped worker's keys while down ({:.2} s): {}",
        secs(stopped_at, started_at),
        codes(&calls, &down_keys, stopped_at, started_at)
    );
    println!(
        "WORKER DOWN: other worker's keys meanwhile: {}",
        codes(&calls, &up_keys, stopped_at, started_at)
    );
    println!(
        "WORKER DOWN: the node's health NOT_SERVING {:.2} s after the stop, SERVING {:.2} s after the restart",
        secs(stopped_at, not_ready),
        secs(started_at, ready)
    );
    println!(
        "WORKER DOWN: first call on the restarted worker's keys answered {:.2} s after its restart",
        secs(started_at, back_at)
    );

    load::assert_calls_answered(&calls, t0);
    assert_all_answered(&calls, &up_keys, stopped_at, started_at);
    load::assert_history_clean(&history);
    env.stop().await;
}

/// Every call on `keys` begun between `from` and `to` answered.
fn assert_all_answered(
    calls: &[idempotency_bench::history::Call],
    keys: &HashSet<String>,
    from: i64,
    to: i64,
) {
    let failed: Vec<_> = calls
        .iter()
        .filter(|c| keys.contains(&c.key) && c.start_us >= from && c.start_us < to)
        .filter(|c| !c.ok())
        .map(|c| format!("{:?} {} {} ({})", c.kind, c.key, c.code, c.reason))
        .collect();
    assert!(
        failed.is_empty(),
        "the other worker's keys failed while one worker was down:\n{}",
        failed.join("\n")
    );
}

/// The readiness service name.
pub const READINESS: &str = "idempotency.v1.Coordinator";

/// The health service name of the listener's session on the node at
/// `port`.
pub fn node_service(port: u16) -> String {
    format!("{READINESS}/citus-node/127.0.0.1:{port}")
}

/// Waits until `service`'s health reads `status`; returns when it did.
pub async fn readiness(health: &mut Health, service: &str, status: ServingStatus) -> i64 {
    let end = Instant::now() + Duration::from_secs(10);
    while health.check(service).await != Some(status) {
        assert!(Instant::now() < end, "{service} did not become {status:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    now_us()
}

//! Calls are answered in time and with the right code while the database
//! does not answer: after their connect wait when no connection comes, by
//! their deadline when no answer does, never CANCELLED.

use std::time::Duration;

use idempotency_bench::history::Entry;
use idempotency_bench::recorder::now_us;
use idempotency_coordinator::proto;

use super::{History, ready_env, warm_client};
use crate::harness::*;
use crate::proxy::Mode;

/// The calls of `history` begun at `since_us` or later that were not
/// answered UNAVAILABLE within `limit`, and the slowest of them all.
fn later_than(history: &History, since_us: i64, limit: Duration) -> (Duration, Vec<String>) {
    let mut problems = Vec::new();
    let mut slowest = Duration::ZERO;
    for e in history.lock().unwrap().iter() {
        let Entry::Call(c) = e else { continue };
        if c.start_us < since_us {
            continue;
        }
        let took = Duration::from_micros(c.took_us() as u64);
        slowest = slowest.max(took);
        if c.code != "UNAVAILABLE" || took > limit {
            problems.push(format!("{} answered {} after {took:?}", c.key, c.code));
        }
    }
    (slowest, problems)
}

/// (c) With the network cut, calls queued behind the batch workers that
/// are stuck on it answer UNAVAILABLE after --connect-wait, not at their
/// own (longer) deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_calls_queued_behind_stuck_batches_answer_after_connect_wait() {
    queued_behind_stuck_batches(2, &[], "c").await;
}

/// (c2) With two batch workers on one connection, one batch stuck and a
/// worker free, before the health probe has found the connection dead (it
/// probes every 10 s here): the calls that come later are not sent behind
/// the stuck batch on its connection, where they would wait for
/// --query-timeout, but wait for it to land, and hear UNAVAILABLE after
/// --connect-wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_calls_are_not_sent_behind_a_stuck_batch() {
    let flags = [
        "--health-interval",
        "10s",
        "--batch-workers",
        "2",
        "--shared-connections",
        "1",
    ];
    queued_behind_stuck_batches(1, &flags, "c2").await;
}

/// `stuck` calls sent into a cut network, then ten more 300 ms later:
/// those answer UNAVAILABLE within --connect-wait and a second.
async fn queued_behind_stuck_batches(stuck: usize, more_flags: &[&'static str], label: &str) {
    let _turn = serial().await;
    let connect_wait = Duration::from_millis(500);
    let mut flags = vec!["--connect-wait", "500ms", "--query-timeout", "5s"];
    flags.extend_from_slice(more_flags);
    let (env, _monitor) = ready_env(&flags).await;
    let (client, history) = warm_client(&env).await;
    let deadline = Duration::from_secs(8);
    let acquire = |key: String| {
        let mut client = client.clone();
        tokio::spawn(async move {
            let req = proto::AcquireRequest {
                scope: SCOPE.into(),
                key,
                ..Default::default()
            };
            client.acquire(req, deadline).await
        })
    };
    env.proxy.set(Mode::Blackhole);
    // The first calls take the batch workers into the cut network.
    let stuck: Vec<_> = (0..stuck).map(|i| acquire(format!("stuck-{i}"))).collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let queued_at = now_us();
    let queued: Vec<_> = (0..10).map(|i| acquire(format!("queued-{i}"))).collect();
    for q in queued {
        q.await.unwrap();
    }
    env.proxy.set(Mode::Pass);
    for s in stuck {
        s.await.unwrap();
    }
    let limit = connect_wait + Duration::from_secs(1);
    let (slowest, problems) = later_than(&history, queued_at, limit);
    println!(
        "REGRESSION {label}: the slowest queued call answered after {slowest:?} (connect-wait {connect_wait:?}, deadline {deadline:?})"
    );
    assert_none("calls queued behind stuck batches", &problems);
}

/// (d) A call whose deadline passes while the database does not answer is
/// answered DEADLINE_EXCEEDED (or, if no batch worker took it by then,
/// UNAVAILABLE: its connect wait is cut by its deadline), never CANCELLED,
/// and on time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_an_expired_deadline_is_deadline_exceeded_never_cancelled() {
    let _turn = serial().await;
    let (env, _monitor) = ready_env(&["--connect-wait", "2s", "--query-timeout", "5s"]).await;
    let (client, history) = warm_client(&env).await;
    let deadline = Duration::from_millis(500);
    env.proxy.set(Mode::Blackhole);
    let mut calls = Vec::new();
    for i in 0..3 {
        let mut c = client.clone();
        calls.push(tokio::spawn(async move {
            let key = format!("late-{i}");
            c.acquire(
                proto::AcquireRequest {
                    scope: SCOPE.into(),
                    key: key.clone(),
                    ..Default::default()
                },
                deadline,
            )
            .await;
            c.get(
                proto::GetRequest {
                    scope: SCOPE.into(),
                    key: key.clone(),
                },
                deadline,
            )
            .await;
            c.complete(
                proto::CompleteRequest {
                    scope: SCOPE.into(),
                    key,
                    lease_token: uuid::Uuid::new_v4().to_string(),
                    outcome: Some(proto::complete_request::Outcome::Release(proto::Release {})),
                },
                deadline,
            )
            .await;
        }));
    }
    for c in calls {
        c.await.unwrap();
    }
    env.proxy.set(Mode::Pass);
    let mut problems = Vec::new();
    let mut codes = std::collections::BTreeMap::new();
    for e in history.lock().unwrap().iter() {
        let Entry::Call(c) = e else { continue };
        *codes.entry(c.code.clone()).or_insert(0) += 1;
        let took = Duration::from_micros(c.took_us() as u64);
        let expected = matches!(c.code.as_str(), "DEADLINE_EXCEEDED" | "UNAVAILABLE");
        if !expected || took > deadline + MARGIN {
            problems.push(format!(
                "{:?} {} answered {} ({}) after {took:?}",
                c.kind, c.key, c.code, c.reason
            ));
        }
    }
    println!(
        "REGRESSION d: calls with a {deadline:?} deadline on a cut network answered {codes:?}"
    );
    assert_none("expired deadlines", &problems);
    assert!(
        codes.contains_key("DEADLINE_EXCEEDED"),
        "the calls workers took wait past their deadline: {codes:?}"
    );
}

/// (g) A call waits at most its connect wait for a connection. With the
/// network cut and the server's connections already given up on, calls
/// arriving one after another (while batch workers are busy connecting for
/// the calls before them) are answered UNAVAILABLE within --connect-wait,
/// not after a connection attempt begun for earlier calls plus one of their
/// own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_a_call_waits_at_most_its_connect_wait_for_a_connection() {
    let _turn = serial().await;
    let connect_wait = Duration::from_secs(1);
    let (env, monitor) = ready_env(&["--connect-wait", "1s", "--query-timeout", "1s"]).await;
    let (client, history) = warm_client(&env).await;
    env.proxy.set(Mode::Blackhole);
    // The probe finds the shared connections dead and retires them: from
    // then on every call needs a new connection, which the cut network
    // never completes.
    assert!(
        monitor
            .until(now_us(), Duration::from_secs(10), not_ready)
            .await
            .is_some(),
        "readiness did not notice the cut"
    );
    let mut calls = tokio::task::JoinSet::new();
    for wave in 0..15 {
        for i in 0..2 {
            let mut c = client.clone();
            calls.spawn(async move {
                let req = proto::AcquireRequest {
                    scope: SCOPE.into(),
                    key: format!("cut-{wave}-{i}"),
                    ..Default::default()
                };
                c.acquire(req, Duration::from_secs(8)).await;
            });
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    calls.join_all().await;
    env.proxy.set(Mode::Pass);
    let limit = connect_wait + Duration::from_millis(300);
    let (slowest, problems) = later_than(&history, 0, limit);
    println!(
        "REGRESSION g: 30 calls on a cut network; the slowest answered after {slowest:?} (connect-wait {connect_wait:?})"
    );
    assert_none("calls past their connect wait", &problems);
}

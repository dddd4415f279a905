//! Nothing commits after its caller heard an error: a statement that
//! reaches the database after its caller gave up (a paused network, a
//! deadline past) is refused there, so no record, completion or extension
//! appears once the network is back.

use std::time::{Duration, Instant};

use idempotency_bench::recorder::now_us;
use idempotency_coordinator::proto;

use super::{ready_env, warm_client, warm_up};
use crate::client::Recording;
use crate::harness::*;
use crate::proxy::Mode;

/// Waits until the proxy holds no bytes and no statement runs in the
/// database but the test's own: whatever the coordinator sent has arrived
/// and finished.
async fn until_settled(env: &Env) {
    let db = env.cluster.connect().await;
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        let running: i64 = db
            .query_one(
                "SELECT count(*) FROM pg_stat_activity
                  WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()
                    AND state NOT IN ('idle')",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        if running == 0 && env.proxy.pending() == 0 {
            return;
        }
        assert!(
            Instant::now() < end,
            "{running} statements still running, {} bytes held",
            env.proxy.pending()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// (b) The network pauses: an Acquire without request_id answers
/// UNAVAILABLE, and once the network is back that Acquire must not have
/// taken effect late (a statement that arrives after its caller gave up is
/// refused by the database).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_an_acquire_answered_unavailable_never_commits_later() {
    let _turn = serial().await;
    let env = Env::start(1, FLAGS).await;
    let monitor = Monitor::start(env.addr(0)).await;
    let t0 = now_us();
    assert!(
        monitor
            .until(t0, Duration::from_secs(10), ready)
            .await
            .is_some()
    );
    let history = Default::default();
    let mut client = Recording::connect(env.addr(0), history).await;
    warm_up(&mut client).await;
    env.proxy.set(Mode::Blackhole);
    let req = proto::AcquireRequest {
        scope: SCOPE.into(),
        key: "paused".into(),
        lease_ttl: Some(prost_types::Duration {
            seconds: 60,
            nanos: 0,
        }),
        ..Default::default()
    };
    let started = Instant::now();
    let answer = client.acquire(req, Duration::from_secs(3)).await;
    let took = started.elapsed();
    env.proxy.set(Mode::Pass);
    let back = now_us();
    assert!(
        monitor
            .until(back, Duration::from_secs(10), ready)
            .await
            .is_some(),
        "not ready again"
    );
    until_settled(&env).await;
    let rows: Vec<String> = env
        .cluster
        .connect()
        .await
        .query(
            "SELECT status FROM idempotency_keys WHERE idempotency_key = 'paused'",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let code = answer
        .as_ref()
        .map(|a| a.as_ref().err().map(tonic::Status::code));
    println!(
        "REGRESSION b: the paused Acquire answered {code:?} after {took:?}; the key holds {rows:?} once the network is back"
    );
    assert_eq!(code, Some(Some(tonic::Code::Unavailable)), "{answer:?}");
    assert!(
        !rows.iter().any(|s| s == "PROCESSING"),
        "the Acquire answered UNAVAILABLE took effect after the network came back: {rows:?}"
    );
}

/// (f) A call's own deadline is the one the database enforces. Calls sent
/// with a 3 s deadline into a paused network, under the default 10 s query
/// timeout, are answered by their deadline; the network returns 2 s after
/// that, and none of them has taken effect: no record for the keys of an
/// Acquire, a waiting Acquire and a batch of Acquires, a held lease neither
/// completed nor extended. The history checker finds no orphan lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_a_call_past_its_deadline_never_commits_later() {
    let _turn = serial().await;
    let (env, monitor) = ready_env(&["--connect-wait", "5s", "--query-timeout", "10s"]).await;
    let (mut client, history) = warm_client(&env).await;
    // The history from the held leases on (warm_client left out the
    // warm-up's: final reads wait for every lease it names to run out).
    let held = hold_leases(&mut client).await;
    let db = env.cluster.connect().await;
    let expiry_before = held_extend_expiry(&db).await;

    let deadline = Duration::from_secs(3);
    let new_keys: Vec<String> = ["alone", "waiting"]
        .into_iter()
        .map(String::from)
        .chain((0..6).map(|i| format!("batch-{i}")))
        .collect();
    env.proxy.set(Mode::Blackhole);
    let paused_at = Instant::now();
    let answers = send_past_deadline(&env, &client, &held, &new_keys, deadline).await;
    let answered_in = paused_at.elapsed();
    // The network returns 2 s after the deadline.
    tokio::time::sleep((deadline + Duration::from_secs(2)).saturating_sub(paused_at.elapsed()))
        .await;
    env.proxy.set(Mode::Pass);
    assert!(
        monitor
            .until(now_us(), Duration::from_secs(15), ready)
            .await
            .is_some(),
        "not ready again"
    );
    until_settled(&env).await;

    let mut problems = took_effect(&db, &new_keys, expiry_before).await;
    let mut entries = history.lock().unwrap().clone();
    final_reads(&env.cluster, &mut entries).await;
    problems.extend(
        idempotency_bench::history::check(&entries)
            .iter()
            .map(ToString::to_string),
    );
    println!(
        "REGRESSION f: calls with a {deadline:?} deadline answered within {answered_in:?}: {answers:?}"
    );
    assert!(
        answered_in < deadline + MARGIN,
        "answered after {answered_in:?}"
    );
    assert_none("calls past their deadline that took effect", &problems);
}

fn seconds(seconds: i64) -> Option<prost_types::Duration> {
    Some(prost_types::Duration { seconds, nanos: 0 })
}

/// Leases of 8 s on `held-complete` and `held-extend`: their tokens.
async fn hold_leases(client: &mut Recording) -> Vec<String> {
    let mut held = Vec::new();
    for key in ["held-complete", "held-extend"] {
        let req = proto::AcquireRequest {
            scope: SCOPE.into(),
            key: key.into(),
            lease_ttl: seconds(8),
            ..Default::default()
        };
        let answer = client.acquire(req, Duration::from_secs(5)).await;
        let lease = answer.and_then(Result::ok).and_then(|a| a.lease);
        held.push(lease.expect("a lease").token);
    }
    held
}

/// When the lease on `held-extend` runs out, as the table holds it.
async fn held_extend_expiry(db: &tokio_postgres::Client) -> chrono::DateTime<chrono::Utc> {
    let row = db
        .query_one(
            "SELECT lease_expires_at FROM idempotency_keys WHERE idempotency_key = 'held-extend'",
            &[],
        )
        .await
        .unwrap();
    row.get::<_, chrono::DateTime<chrono::Utc>>(0)
}

/// Sends, each with `deadline`: an Acquire on every key of `new_keys` (one
/// that waits on `waiting`), a Complete of the `held` lease on
/// `held-complete` and an ExtendLease of the one on `held-extend`. Returns
/// how each was answered.
async fn send_past_deadline(
    env: &Env,
    client: &Recording,
    held: &[String],
    new_keys: &[String],
    deadline: Duration,
) -> Vec<String> {
    let mut calls = tokio::task::JoinSet::new();
    for key in new_keys {
        let mut c = client.clone();
        let req = proto::AcquireRequest {
            scope: SCOPE.into(),
            key: key.clone(),
            lease_ttl: seconds(300),
            wait: if key == "waiting" { seconds(10) } else { None },
            ..Default::default()
        };
        calls.spawn(async move {
            let answer = c.acquire(req, deadline).await;
            format!("{:?}", answer.map(|a| a.err().map(|s| s.code())))
        });
    }
    let mut c = client.clone();
    let token = held[0].clone();
    calls.spawn(async move {
        let req = proto::CompleteRequest {
            scope: SCOPE.into(),
            key: "held-complete".into(),
            lease_token: token,
            outcome: Some(proto::complete_request::Outcome::Success(proto::Success {
                result: b"late".to_vec(),
                ..Default::default()
            })),
        };
        let answer = c.complete(req, deadline).await;
        format!("{:?}", answer.map(|a| a.err().map(|s| s.code())))
    });
    let addr = env.addr(0);
    let token = held[1].clone();
    calls.spawn(async move {
        let mut raw = proto::coordinator_client::CoordinatorClient::with_origin(
            crate::client::h2(addr).await,
            crate::client::origin(addr),
        );
        let mut req = tonic::Request::new(proto::ExtendLeaseRequest {
            scope: SCOPE.into(),
            key: "held-extend".into(),
            lease_token: token,
            extend_by: seconds(600),
            ..Default::default()
        });
        req.set_timeout(deadline);
        format!("{:?}", raw.extend_lease(req).await.err().map(|s| s.code()))
    });
    calls.join_all().await
}

/// What the calls past their deadline did to the table: a record on a key
/// of `new_keys`, the lease on `held-complete` completed, the one on
/// `held-extend` moved from `expiry_before`.
async fn took_effect(
    db: &tokio_postgres::Client,
    new_keys: &[String],
    expiry_before: chrono::DateTime<chrono::Utc>,
) -> Vec<String> {
    let mut problems = Vec::new();
    for key in new_keys {
        let rows = db
            .query(
                "SELECT status FROM idempotency_keys WHERE idempotency_key = $1",
                &[key],
            )
            .await
            .unwrap();
        if !rows.is_empty() {
            let status: String = rows[0].get(0);
            problems.push(format!("{key}: a {status} record"));
        }
    }
    let completed: String = db
        .query_one(
            "SELECT status FROM idempotency_keys WHERE idempotency_key = 'held-complete'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    if completed != "PROCESSING" {
        problems.push(format!(
            "held-complete: {completed} after a Complete past its deadline"
        ));
    }
    let expiry_after = held_extend_expiry(db).await;
    if expiry_after != expiry_before {
        problems.push(format!(
            "held-extend: the lease moved from {expiry_before} to {expiry_after} after an ExtendLease past its deadline"
        ));
    }
    problems
}

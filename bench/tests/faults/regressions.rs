//! Defects an earlier probe found, held as behaviour: each test fails while
//! its defect is there.

use std::time::{Duration, Instant};

use idempotency_bench::history::Entry;
use idempotency_bench::recorder::now_us;
use idempotency_coordinator::proto;

use crate::client::Recording;
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

/// A few calls, so that the server's shared connections are open: the
/// calls of the test then go out on them (not on new connections, which a
/// cut network would stop at --connect-wait).
async fn warm_up(client: &mut Recording) {
    for i in 0..4 {
        let req = proto::AcquireRequest {
            scope: SCOPE.into(),
            key: format!("warm-{i}"),
            ..Default::default()
        };
        let answer = client.acquire(req, Duration::from_secs(5)).await;
        assert!(matches!(answer, Some(Ok(_))), "warm-up: {answer:?}");
    }
}

/// A server on its own PostgreSQL behind the proxy, with `flags`, ready.
async fn ready_env(flags: &[&'static str]) -> (Env, Monitor) {
    let env = Env::start(1, flags).await;
    let monitor = Monitor::start(env.addr(0)).await;
    assert!(
        monitor
            .until(now_us(), Duration::from_secs(10), ready)
            .await
            .is_some()
    );
    (env, monitor)
}

type History = std::sync::Arc<std::sync::Mutex<Vec<Entry>>>;

/// A recording client of `env`'s server, its shared connections warmed up,
/// and its (then empty) history.
async fn warm_client(env: &Env) -> (Recording, History) {
    let history = History::default();
    let mut client = Recording::connect(env.addr(0), std::sync::Arc::clone(&history)).await;
    warm_up(&mut client).await;
    history.lock().unwrap().clear();
    (client, history)
}

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

/// (c) With the network cut, calls queued behind the batch workers that
/// are stuck on it answer UNAVAILABLE after --connect-wait, not at their
/// own (longer) deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_calls_queued_behind_stuck_batches_answer_after_connect_wait() {
    let _turn = serial().await;
    let connect_wait = Duration::from_millis(500);
    let (env, _monitor) = ready_env(&["--connect-wait", "500ms", "--query-timeout", "5s"]).await;
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
    let stuck: Vec<_> = (0..2).map(|i| acquire(format!("stuck-{i}"))).collect();
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
        "REGRESSION c: the slowest queued call answered after {slowest:?} (connect-wait {connect_wait:?}, deadline {deadline:?})"
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
    let secs = |seconds| Some(prost_types::Duration { seconds, nanos: 0 });
    let mut held = Vec::new();
    for key in ["held-complete", "held-extend"] {
        let req = proto::AcquireRequest {
            scope: SCOPE.into(),
            key: key.into(),
            lease_ttl: secs(8),
            ..Default::default()
        };
        let answer = client.acquire(req, Duration::from_secs(5)).await;
        let lease = answer.and_then(Result::ok).and_then(|a| a.lease);
        held.push(lease.expect("a lease").token);
    }
    let db = env.cluster.connect().await;
    let lease_expiry = || async {
        let row = db
            .query_one(
                "SELECT lease_expires_at FROM idempotency_keys WHERE idempotency_key = 'held-extend'",
                &[],
            )
            .await
            .unwrap();
        row.get::<_, chrono::DateTime<chrono::Utc>>(0)
    };
    let expiry_before = lease_expiry().await;

    let deadline = Duration::from_secs(3);
    let new_keys: Vec<String> = ["alone", "waiting"]
        .into_iter()
        .map(String::from)
        .chain((0..6).map(|i| format!("batch-{i}")))
        .collect();
    env.proxy.set(Mode::Blackhole);
    let paused_at = Instant::now();
    let mut calls = tokio::task::JoinSet::new();
    for key in &new_keys {
        let mut c = client.clone();
        let req = proto::AcquireRequest {
            scope: SCOPE.into(),
            key: key.clone(),
            lease_ttl: secs(300),
            wait: if key == "waiting" { secs(10) } else { None },
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
            extend_by: secs(600),
            ..Default::default()
        });
        req.set_timeout(deadline);
        format!("{:?}", raw.extend_lease(req).await.err().map(|s| s.code()))
    });
    let answers = calls.join_all().await;
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

    let mut problems = Vec::new();
    for key in &new_keys {
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
    let expiry_after = lease_expiry().await;
    if expiry_after != expiry_before {
        problems.push(format!(
            "held-extend: the lease moved from {expiry_before} to {expiry_after} after an ExtendLease past its deadline"
        ));
    }
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

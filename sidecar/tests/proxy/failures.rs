//! Upstream failures are not replayed; hang-ups and answers too large to
//! store.

use std::time::Duration;

use http::{Method, StatusCode};

use idempotency_coordinator::proto::{AdminTarget, ReleaseLeaseRequest};

use crate::polling::eventually;
use crate::support::{Coordinator, Env, TestClient, fresh_key, start_sidecar};
use crate::upstream::TestUpstream;

#[tokio::test]
async fn an_upstream_500_is_not_replayed_and_the_retry_runs_again() {
    let env = Env::start(&[]).await;
    let key = fresh_key();
    let failed = env.client.post("/flaky", &key, "{}").await;
    assert_eq!(failed.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert!(!failed.replayed());
    assert_eq!(failed.text(), "{\"error\":\"boom\"}");
    let retried = env.client.post("/flaky", &key, "{}").await;
    assert_eq!(retried.status, StatusCode::CREATED);
    assert!(!retried.replayed());
    let replayed = env.client.post("/flaky", &key, "{}").await;
    assert!(replayed.replayed());
    assert_eq!(replayed.body, retried.body);
    let seen = env.upstream.seen();
    assert_eq!(seen.len(), 2);
    assert_eq!((seen[0].attempt, seen[1].attempt), (Some(1), Some(2)));
    assert!(seen[1].fencing_token > seen[0].fencing_token);
}

#[tokio::test]
async fn an_unreachable_upstream_is_502_and_the_key_runs_again() {
    let env = Env::start(&[]).await;
    // A port nothing listens on: bind one, then free it.
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap()
    };
    let sidecar = crate::support::start_sidecar(
        &format!("http://{closed}"),
        &env.coordinator.endpoint(),
        &[],
    )
    .await;
    let client = crate::support::TestClient::new(sidecar.addr);
    let key = fresh_key();
    let reply = client.post("/pay", &key, "{}").await;
    assert_eq!(reply.status, StatusCode::BAD_GATEWAY);
    assert!(reply.problem_type().ends_with("#upstream-unavailable"));
    // Recorded as a failure, not a result: through a working sidecar the
    // same key runs.
    let ran = env.client.post("/pay", &key, "{}").await;
    assert_eq!(ran.status, StatusCode::CREATED);
    assert!(!ran.replayed());
}

#[tokio::test]
async fn a_client_that_hangs_up_mid_request_still_has_its_answer_stored() {
    let env = Env::start(&[]).await;
    let key = fresh_key();
    let client = env.client.clone();
    let hanging = {
        let key = key.clone();
        tokio::spawn(async move { client.post("/gate", &key, "{}").await })
    };
    eventually(
        "the upstream to see the request",
        Duration::from_secs(10),
        || async { (env.upstream.count("/gate") == 1).then_some(()) },
    )
    .await;
    // The client hangs up while the upstream works.
    hanging.abort();
    let _ = hanging.await;
    env.upstream.open_gate();
    let replay = eventually("the stored answer", Duration::from_secs(20), || async {
        let reply = env.client.post("/gate", &key, "{}").await;
        (reply.status != StatusCode::CONFLICT).then_some(reply)
    })
    .await;
    assert_eq!(replay.status, StatusCode::CREATED);
    assert!(replay.replayed(), "{replay:?}");
    assert_eq!(replay.text(), "{\"effect\":1}");
    assert_eq!(env.upstream.count("/gate"), 1);
}

#[tokio::test]
async fn a_lease_lost_mid_request_does_not_cut_the_upstream_call_off() {
    let coordinator = Coordinator::start_with(&["--metrics-listen", "127.0.0.1:0"]).await;
    let upstream = TestUpstream::start().await;
    // A heartbeat every second.
    // Keys global (no caller's namespace), so the operator names the
    // client's key as it is.
    let flags = [
        "--lease-ttl",
        "3s",
        "--route",
        "POST /gate accept scope=gates",
        "--credential-headers",
        "-",
    ];
    let sidecar = start_sidecar(&upstream.url(), &coordinator.endpoint(), &flags).await;
    let client = TestClient::new(sidecar.addr);
    let key = fresh_key();
    let waiting = {
        let (client, key) = (client.clone(), key.clone());
        tokio::spawn(async move { client.post("/gate", &key, "{}").await })
    };
    eventually(
        "the upstream to see the request",
        Duration::from_secs(10),
        || async { (upstream.count("/gate") == 1).then_some(()) },
    )
    .await;
    // An operator takes the lease away while the upstream works.
    coordinator
        .server
        .client()
        .await
        .release_lease(ReleaseLeaseRequest {
            target: Some(AdminTarget {
                scope: "gates".into(),
                // The header's sf-string, unquoted.
                key: key.trim_matches('"').to_owned(),
                reason: "the holder looks stuck".into(),
                operator: "test".into(),
            }),
        })
        .await
        .expect("release the lease");
    let metrics = TestClient::new(
        coordinator
            .server
            .logged_addr("serving metrics at /metrics"),
    );
    eventually(
        "the sidecar's heartbeat to hear that its lease is lost",
        Duration::from_secs(10),
        || async {
            let text = metrics
                .send(Method::GET, "/metrics", None, "", &[])
                .await
                .text();
            text.lines()
                .any(|line| {
                    line.starts_with("idempotency_rpcs_total{")
                        && line.contains("method=\"ExtendLease\"")
                        && line.contains("code=\"ABORTED\"")
                })
                .then_some(())
        },
    )
    .await;
    upstream.open_gate();
    let reply = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the upstream's answer within 10 s")
        .unwrap();
    // The call the upstream was answering was not cut off: its answer
    // reaches the client that caused it, though it was not stored.
    assert_eq!(reply.status, StatusCode::CREATED, "{reply:?}");
    assert_eq!(reply.text(), "{\"effect\":1}");
    assert!(!reply.replayed());
    assert_eq!(upstream.count("/gate"), 1);
}

#[tokio::test]
async fn an_answer_too_large_to_store_is_passed_through_and_the_key_released() {
    let env = Env::start(&["--max-stored-bytes", "4096"]).await;
    let key = fresh_key();
    let big = env.client.post("/big?bytes=100000", &key, "{}").await;
    assert_eq!(big.status, StatusCode::OK);
    assert_eq!(big.body.len(), 100_000);
    assert!(!big.replayed());
    let again = env.client.post("/big?bytes=100000", &key, "{}").await;
    assert_eq!(again.body.len(), 100_000);
    assert!(!again.replayed());
    assert_eq!(env.upstream.count("/big"), 2, "released: the key ran again");
    let metrics = env.ops("/metrics").await.text();
    assert!(
        metrics.contains("idempotency_sidecar_too_large_responses_total{route=\"default\"} 2"),
        "{metrics}"
    );
    // A small one on another key is still stored.
    let small = fresh_key();
    env.client.post("/big?bytes=10", &small, "{}").await;
    assert!(
        env.client
            .post("/big?bytes=10", &small, "{}")
            .await
            .replayed()
    );
}

#[tokio::test]
async fn a_retry_after_the_sidecar_dies_reaches_the_upstream_with_a_higher_fencing_token() {
    let coordinator = crate::support::Coordinator::start().await;
    let upstream = crate::upstream::TestUpstream::start().await;
    let mut dying = tokio::process::Command::new(env!("CARGO_BIN_EXE_idempotency-sidecar"))
        .args(["--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"])
        .args([
            "--upstream",
            &upstream.url(),
            "--coordinator",
            &coordinator.endpoint(),
        ])
        .args(["--lease-ttl", "2s", "--log-format", "json"])
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start the sidecar binary");
    let addr = crate::operations::listening_addr(&mut dying).await;
    let client = crate::support::TestClient::new(addr);
    let key = fresh_key();
    let in_flight = {
        let key = key.clone();
        tokio::spawn(async move {
            let _ = tokio::time::timeout(
                Duration::from_secs(30),
                client.send(Method::POST, "/gate", Some(&key), "{}", &[]),
            )
            .await;
        })
    };
    eventually(
        "the upstream to see the request",
        Duration::from_secs(10),
        || async { (upstream.count("/gate") == 1).then_some(()) },
    )
    .await;
    dying.start_kill().unwrap();
    let _ = dying.wait().await;
    in_flight.abort();
    upstream.open_gate();
    let sidecar =
        crate::support::start_sidecar(&upstream.url(), &coordinator.endpoint(), &[]).await;
    let client = crate::support::TestClient::new(sidecar.addr);
    let retried = eventually("the lease to run out", Duration::from_secs(20), || async {
        let reply = client.post("/gate", &key, "{}").await;
        (reply.status != StatusCode::CONFLICT).then_some(reply)
    })
    .await;
    assert_eq!(retried.status, StatusCode::CREATED);
    let seen = upstream.seen();
    assert_eq!(seen.len(), 2);
    assert!(seen[1].fencing_token > seen[0].fencing_token, "{seen:?}");
    assert_eq!(seen[1].attempt, Some(2));
}

#[tokio::test]
async fn a_slow_upstream_keeps_its_lease_while_it_works() {
    // A one-second lease, an upstream that takes three: the heartbeat
    // keeps the key held, so a second request never runs it again.
    let env = Env::start(&["--lease-ttl", "1s"]).await;
    let key = fresh_key();
    let client = env.client.clone();
    let first = {
        let key = key.clone();
        tokio::spawn(async move { client.post("/pay?hold_ms=3000", &key, "{}").await })
    };
    eventually(
        "the upstream to see the request",
        Duration::from_secs(10),
        || async { (env.upstream.count("/pay") == 1).then_some(()) },
    )
    .await;
    let seen_at = std::time::Instant::now();
    let mut held_for = Duration::ZERO;
    while !first.is_finished() {
        let reply = env.client.post("/pay?hold_ms=3000", &key, "{}").await;
        if first.is_finished() && reply.status != StatusCode::CONFLICT {
            break;
        }
        assert_eq!(reply.status, StatusCode::CONFLICT, "{reply:?}");
        held_for = seen_at.elapsed();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        held_for > Duration::from_millis(1500),
        "the key was held past its first lease (last 409 after {held_for:?})"
    );
    assert_eq!(first.await.unwrap().status, StatusCode::CREATED);
    assert!(
        env.client
            .post("/pay?hold_ms=3000", &key, "{}")
            .await
            .replayed()
    );
    assert_eq!(env.upstream.count("/pay"), 1);
}

#[tokio::test]
async fn an_upstream_429_is_retried_no_sooner_than_its_retry_after() {
    let env = Env::start(&[]).await;
    let key = fresh_key();
    let busy = env.client.post("/busy", &key, "{}").await;
    assert_eq!(busy.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(busy.text(), "slow down");
    let early = env.client.post("/busy", &key, "{}").await;
    assert_eq!(early.status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(early.problem_type().ends_with("#retry-later"));
    let after: u64 = early.headers["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((20..=30).contains(&after), "Retry-After {after}");
    assert_eq!(env.upstream.count("/busy"), 1);
}

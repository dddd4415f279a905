//! Replays answered from a replica's memory agree with the database: the
//! same answer while the record lives, none once it has expired, on every
//! replica, for its own tenant only.

use std::time::Duration;

use idempotency_coordinator::config::ServeConfig;
use idempotency_coordinator::proto::coordinator_client::CoordinatorClient;
use idempotency_coordinator::proto::{self, Decision};
use tonic::transport::Channel;
use tonic_health::pb::health_check_response::ServingStatus;

use crate::helpers::*;

/// An Acquire of (s, k) whose record is kept for a minute once done.
fn kept_a_minute() -> proto::AcquireRequest {
    proto::AcquireRequest {
        retention: secs(60),
        ..acquire("s", "k")
    }
}

/// Runs (s, k) to SUCCEEDED with `result` through `c`.
async fn done(c: &mut CoordinatorClient<Channel>, result: &[u8]) {
    let lease = proceed(c, kept_a_minute()).await;
    c.complete(complete("s", "k", &token(&lease), success(result)))
        .await
        .expect("complete");
}

async fn answer(c: &mut CoordinatorClient<Channel>) -> proto::AcquireResponse {
    c.acquire(kept_a_minute())
        .await
        .expect("acquire")
        .into_inner()
}

#[tokio::test]
async fn replays_answer_the_stored_result_until_the_record_expires_then_the_key_is_new() {
    let app = spawn_app().await;
    let mut c = app.client.clone();
    done(&mut c, b"first").await;

    let first = answer(&mut c).await;
    assert_eq!(decision(&first), Decision::AlreadyDone);
    for _ in 0..3 {
        assert_eq!(
            answer(&mut c).await,
            first,
            "every replay is the same answer"
        );
    }
    let other = c
        .acquire(with_fingerprint(kept_a_minute(), "another-request"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(decision(&other), Decision::Conflict);

    app.clock.advance(Duration::from_secs(50));
    assert_eq!(answer(&mut c).await, first, "ten seconds before expiry");

    app.clock.advance(Duration::from_secs(11));
    let after = answer(&mut c).await;
    assert_eq!(decision(&after), Decision::Proceed, "expired: a new record");
    assert_eq!(after.record.unwrap().attempt_count, 1);
}

#[tokio::test]
async fn two_replicas_agree_once_a_record_both_replayed_has_expired() {
    let db = TestDatabase::create().await;
    let config = || ServeConfig::new("127.0.0.1:0".parse().unwrap(), db.url.clone());
    let (a, b) = tokio::join!(start_server(config()), start_server(config()));
    let (mut ca, mut cb) = (a.client.clone(), b.client.clone());
    done(&mut ca, b"once").await;
    for _ in 0..2 {
        for c in [&mut ca, &mut cb] {
            assert_eq!(decision(&answer(c).await), Decision::AlreadyDone);
        }
    }

    for server in [&a, &b] {
        server.clock.advance(Duration::from_secs(61));
    }
    let taken = answer(&mut cb).await;
    assert_eq!(
        decision(&taken),
        Decision::Proceed,
        "replica b: a new record"
    );
    let seen_from_a = answer(&mut ca).await;
    assert_eq!(
        decision(&seen_from_a),
        Decision::InProgress,
        "replica a sees b's new lease, not the expired result it replayed"
    );
}

#[tokio::test]
async fn a_replay_is_answered_from_memory_while_the_database_is_unreachable() {
    let db = TestDatabase::create().await;
    let proxy = DatabaseProxy::start(database_addr()).await;
    let mut config = ServeConfig::new("127.0.0.1:0".parse().unwrap(), proxy.url_for(&db));
    config.store.connect_wait = Duration::from_millis(300);
    let server = start_server(config).await;
    // Ready means the listener has read the database's clock, which replays
    // from memory need.
    until_health(&server, READINESS, ServingStatus::Serving).await;
    let mut c = server.client.clone();
    done(&mut c, b"kept").await;
    let replay = answer(&mut c).await;

    proxy.cut();
    assert_eq!(answer(&mut c).await, replay);
    let unreachable = c.get(get_req("s", "k")).await.unwrap_err();
    assert_eq!(unreachable.code(), tonic::Code::Unavailable);
    let other_key = c.acquire(acquire("s", "other")).await.unwrap_err();
    assert_eq!(other_key.code(), tonic::Code::Unavailable);
}

//! ExtendLease: the holder's heartbeat, by the server's clock.

use std::time::Duration;

use idempotency_coordinator::proto;
use tonic::Code;

use crate::helpers::*;

fn extend(scope: &str, key: &str, token: &str, by: i64) -> proto::ExtendLeaseRequest {
    proto::ExtendLeaseRequest {
        scope: scope.into(),
        key: key.into(),
        lease_token: token.into(),
        extend_by: secs(by),
        checkpoint: None,
    }
}

#[tokio::test]
async fn extending_a_live_lease_adds_to_its_old_expiry() {
    let app = spawn_app().await;
    let mut c = app.client.clone();
    let mut req = acquire("s", "k");
    req.lease_ttl = secs(60);
    let granted = proceed(&mut c, req).await;
    let old = granted.lease.as_ref().unwrap().clone();

    let new = c
        .extend_lease(extend("s", "k", &token(&granted), 30))
        .await
        .unwrap()
        .into_inner()
        .lease
        .unwrap();
    let added = seconds_between(
        old.expires_at.as_ref().unwrap(),
        new.expires_at.as_ref().unwrap(),
    );
    assert!((29.99..=30.01).contains(&added), "added {added} s");
    assert_eq!(
        (new.token, new.attempt, new.fencing_token),
        (old.token, old.attempt, old.fencing_token)
    );
}

#[tokio::test]
async fn no_lease_reaches_past_the_maximum_from_now() {
    let app = spawn_app_with(|c| {
        c.policy.max_lease_ttl = Duration::from_secs(120);
        c.policy.default_lease_ttl = Duration::from_secs(60);
    })
    .await;
    let mut c = app.client.clone();
    let mut req = acquire("s", "k");
    req.lease_ttl = secs(100);
    let granted = proceed(&mut c, req).await;
    let created = granted.record.as_ref().unwrap().created_at.unwrap();

    let new = c
        .extend_lease(extend("s", "k", &token(&granted), 100))
        .await
        .unwrap()
        .into_inner()
        .lease
        .unwrap();
    let reach = seconds_between(&created, new.expires_at.as_ref().unwrap());
    assert!(
        (119.9..=120.1).contains(&reach),
        "reaches {reach} s from now"
    );
}

#[tokio::test]
async fn an_expired_lease_cannot_be_revived() {
    let app = spawn_app().await;
    let mut c = app.client.clone();
    let mut req = acquire("s", "k");
    req.lease_ttl = secs(5);
    let granted = proceed(&mut c, req).await;
    app.clock.advance(Duration::from_secs(6));

    let err = c
        .extend_lease(extend("s", "k", &token(&granted), 60))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Aborted);
    assert_eq!(reason(&err), "LEASE_EXPIRED");
}

#[tokio::test]
async fn extending_with_a_token_that_is_not_current_is_lease_lost() {
    let app = spawn_app().await;
    let mut c = app.client.clone();
    let (stale, _) = taken_over(&app).await;

    let err = c
        .extend_lease(extend("s", "k", &token(&stale), 60))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Aborted);
    assert_eq!(reason(&err), "LEASE_LOST");
}

#[tokio::test]
async fn a_checkpoint_saved_by_a_holder_that_died_reaches_the_next_holder() {
    let app = spawn_app().await;
    let mut c = app.client.clone();
    let mut req = acquire("s", "k");
    req.lease_ttl = secs(5);
    let first = proceed(&mut c, req.clone()).await;
    let mut beat = extend("s", "k", &token(&first), 5);
    beat.checkpoint = Some(b"page=3".to_vec());
    c.extend_lease(beat).await.unwrap();
    // A heartbeat without a checkpoint keeps the saved one.
    c.extend_lease(extend("s", "k", &token(&first), 1))
        .await
        .unwrap();
    app.clock.advance(Duration::from_secs(60));

    let second = proceed(&mut c, req).await;
    assert_eq!(second.record.unwrap().checkpoint, b"page=3");
}

#[tokio::test]
async fn extending_a_lease_on_a_key_without_a_record_is_not_found() {
    let app = spawn_app().await;
    let mut c = app.client.clone();
    let err = c
        .extend_lease(extend(
            "s",
            "nothing",
            "00000000-0000-0000-0000-000000000000",
            5,
        ))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
}

#[tokio::test]
async fn extending_a_lease_that_was_completed_is_refused() {
    let app = spawn_app().await;
    let mut c = app.client.clone();
    let granted = proceed(&mut c, acquire("s", "k")).await;
    c.complete(complete("s", "k", &token(&granted), success(b"ok")))
        .await
        .unwrap();
    let err = c
        .extend_lease(extend("s", "k", &token(&granted), 5))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Aborted);
    assert_eq!(
        reason(&err),
        "LEASE_EXPIRED",
        "the lease ended with its Complete"
    );
}

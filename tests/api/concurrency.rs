//! Races on one key: exactly one lease, and identical replays.

use futures::future::join_all;
use idempotency_coordinator::proto::Decision;

use crate::helpers::*;

/// 50 concurrent Acquires of one fresh key: exactly one PROCEED, 49
/// IN_PROGRESS; returns the winner's answer.
async fn race(app: &TestApp, key: &str) -> idempotency_coordinator::proto::AcquireResponse {
    let calls = (0..50).map(|_| {
        let mut c = app.client.clone();
        async move { c.acquire(acquire("race", key)).await.unwrap().into_inner() }
    });
    let mut answers = join_all(calls).await;
    let count = |d: Decision| answers.iter().filter(|a| decision(a) == d).count();
    assert_eq!(
        (count(Decision::Proceed), count(Decision::InProgress)),
        (1, 49)
    );
    let winner = answers
        .iter()
        .position(|a| decision(a) == Decision::Proceed);
    answers.swap_remove(winner.expect("one PROCEED"))
}

#[tokio::test]
async fn fifty_concurrent_acquires_on_a_fresh_key_grant_exactly_one_lease() {
    let app = spawn_app().await;
    race(&app, "one-key").await;
    assert_eq!(app.db.count_records().await, 1);
}

#[tokio::test]
async fn after_complete_fifty_concurrent_acquires_all_replay_the_same_bytes() {
    let app = spawn_app().await;
    let mut c = app.client.clone();
    let granted = proceed(&mut c, acquire("race", "k")).await;
    let result: Vec<u8> = (0..=255u8).cycle().take(10_000).collect();
    c.complete(complete("race", "k", &token(&granted), success(&result)))
        .await
        .unwrap();

    let calls = (0..50).map(|_| {
        let mut c = app.client.clone();
        async move { c.acquire(acquire("race", "k")).await.unwrap().into_inner() }
    });
    for answer in join_all(calls).await {
        assert_eq!(decision(&answer), Decision::AlreadyDone);
        assert_eq!(answer.record.unwrap().result.unwrap().result, result);
    }
}

#[tokio::test]
async fn with_a_pooled_connection_per_call_the_race_still_grants_one_lease() {
    let app = spawn_app_with(|c| c.store.shared_connections = 0).await;
    let holder = race(&app, "pooled").await;
    let mut c = app.client.clone();
    complete_ok(
        &mut c,
        complete("race", "pooled", &token(&holder), success(b"ok")),
    )
    .await;
    let replay = c
        .acquire(acquire("race", "pooled"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(decision(&replay), Decision::AlreadyDone);
}

/// Two batches out at a time on one connection (`--batch-workers 2
/// --shared-connections 1`), each behind the other: the race grants one
/// lease, its holder's Complete is replayed to every later caller, and a
/// second race of many fresh keys beside it grants one lease each.
#[tokio::test]
async fn with_two_batches_pipelined_on_one_connection_races_still_grant_one_lease() {
    let app = spawn_app_with(|c| {
        c.store.shared_connections = 1;
        c.store.batch_workers = Some(2);
    })
    .await;
    let keys: Vec<String> = (0..40).map(|i| format!("fresh-{i}")).collect();
    let fresh = join_all(keys.iter().map(|key| {
        let mut c = app.client.clone();
        async move { c.acquire(acquire("race", key)).await.unwrap().into_inner() }
    }));
    let (holder, fresh) = futures::join!(race(&app, "pipelined"), fresh);
    assert!(
        fresh.iter().all(|a| decision(a) == Decision::Proceed),
        "every fresh key granted"
    );
    let mut c = app.client.clone();
    complete_ok(
        &mut c,
        complete("race", "pipelined", &token(&holder), success(b"ok")),
    )
    .await;
    let replays = join_all((0..20).map(|_| {
        let mut c = app.client.clone();
        async move {
            c.acquire(acquire("race", "pipelined"))
                .await
                .unwrap()
                .into_inner()
        }
    }))
    .await;
    assert!(replays.iter().all(|a| decision(a) == Decision::AlreadyDone));
    assert_eq!(app.db.count_records().await, 41);
}

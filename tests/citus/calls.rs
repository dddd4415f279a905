//! Every single-key call through the Citus coordinator node, with the
//! answers one PostgreSQL gives, decided on the worker holding the key.

use std::collections::BTreeSet;
use std::time::Duration;

use idempotency_coordinator::proto::{self, Decision, Status};

use crate::app::spawn_citus_app;
use crate::helpers::*;
use crate::placement::{group_of, range_of_group, worker_of};

#[tokio::test]
async fn a_new_key_proceeds_on_its_worker_and_a_second_caller_is_in_progress() {
    let Some(app) = spawn_citus_app().await else {
        return;
    };
    let mut c = app.client.clone();
    let mut req = acquire("payments.charge", "order-1");
    req.lease_ttl = secs(30);
    let first = proceed(&mut c, req.clone()).await;
    let lease = first.lease.as_ref().unwrap();
    assert_eq!(lease.attempt, 1);
    assert_eq!(lease.token.len(), 36);
    let record = first.record.as_ref().unwrap();
    assert_eq!(status_of(record), Status::Processing);
    let ttl = seconds_between(
        record.created_at.as_ref().unwrap(),
        lease.expires_at.as_ref().unwrap(),
    );
    assert!((29.9..=30.1).contains(&ttl), "lease of {ttl} s");
    // Decided on the worker: its token comes from that node's range.
    let worker = worker_of(&app.db, "order-1").await;
    let range = range_of_group(group_of(&app.db, worker).await);
    assert!(
        range.contains(&lease.fencing_token),
        "token {} from the range of worker {worker}, {range:?}",
        lease.fencing_token
    );

    let second = c.acquire(req).await.unwrap().into_inner();
    assert_eq!(decision(&second), Decision::InProgress);
    assert!(second.lease.is_none());
    assert!(second.retry_after.is_some());
}

#[tokio::test]
async fn a_success_is_replayed_with_its_stored_result() {
    let Some(app) = spawn_citus_app().await else {
        return;
    };
    let mut c = app.client.clone();
    let holder = proceed(&mut c, acquire("s", "replayed")).await;
    let done = complete_ok(
        &mut c,
        complete("s", "replayed", &token(&holder), success(b"{\"ok\":1}")),
    )
    .await;
    assert_eq!(status_of(&done), Status::Succeeded);

    let replay = c
        .acquire(acquire("s", "replayed"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(decision(&replay), Decision::AlreadyDone);
    let result = replay.record.unwrap().result.unwrap();
    assert_eq!(result.result, b"{\"ok\":1}");
    assert_eq!(result.content_type, "application/json");
    assert_eq!(result.status_code, 201);
}

#[tokio::test]
async fn a_failure_is_retried_later_with_a_larger_fencing_token() {
    let Some(app) = spawn_citus_app().await else {
        return;
    };
    let mut c = app.client.clone();
    let first = proceed(&mut c, acquire("s", "flaky")).await;
    let failed = complete_ok(
        &mut c,
        complete("s", "flaky", &token(&first), failure("boom")),
    )
    .await;
    assert_eq!(status_of(&failed), Status::Failed);

    let early = c.acquire(acquire("s", "flaky")).await.unwrap().into_inner();
    assert_eq!(decision(&early), Decision::RetryLater);
    assert!(early.retry_after.is_some());

    app.clock.advance(Duration::from_secs(3600));
    let retry = proceed(&mut c, acquire("s", "flaky")).await;
    let (old, new) = (first.lease.unwrap(), retry.lease.unwrap());
    assert_eq!(new.attempt, 2);
    assert!(
        new.fencing_token > old.fencing_token,
        "{} after {}",
        new.fencing_token,
        old.fencing_token
    );
    assert_ne!(new.token, old.token);
}

#[tokio::test]
async fn a_different_fingerprint_conflicts() {
    let Some(app) = spawn_citus_app().await else {
        return;
    };
    let mut c = app.client.clone();
    proceed(&mut c, with_fingerprint(acquire("s", "fp"), "aaa")).await;
    let resp = c
        .acquire(with_fingerprint(acquire("s", "fp"), "bbb"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(decision(&resp), Decision::Conflict);
    assert!(resp.lease.is_none());
}

#[tokio::test]
async fn extend_lease_and_get_answer_from_the_keys_worker() {
    let Some(app) = spawn_citus_app().await else {
        return;
    };
    let mut c = app.client.clone();
    let mut req = acquire("s", "long");
    req.lease_ttl = secs(10);
    let holder = proceed(&mut c, req).await;
    let extended = c
        .extend_lease(proto::ExtendLeaseRequest {
            scope: "s".into(),
            key: "long".into(),
            lease_token: token(&holder),
            extend_by: secs(60),
            checkpoint: Some(b"half way".to_vec()),
        })
        .await
        .unwrap()
        .into_inner();
    let lease = extended.lease.unwrap();
    let before = holder.lease.unwrap().expires_at.unwrap();
    assert!(seconds_between(&before, lease.expires_at.as_ref().unwrap()) > 40.0);

    let record = get_record(&mut c, get_req("s", "long")).await;
    assert_eq!(status_of(&record), Status::Processing);
    assert_eq!(record.checkpoint, b"half way");
    let missing = c.get(get_req("s", "never-acquired")).await.unwrap_err();
    assert_eq!(missing.code(), tonic::Code::NotFound);
}

#[tokio::test]
async fn many_callers_racing_one_key_get_exactly_one_lease() {
    let Some(app) = spawn_citus_app().await else {
        return;
    };
    let clients = clients(app.addr, 8).await;
    let calls = (0..32).map(|i| {
        let mut c = clients[i % clients.len()].clone();
        tokio::spawn(async move { c.acquire(acquire("s", "contended")).await })
    });
    let mut decisions = Vec::new();
    for call in calls {
        decisions.push(decision(
            &call.await.unwrap().expect("acquire").into_inner(),
        ));
    }
    let proceeds = decisions
        .iter()
        .filter(|d| **d == Decision::Proceed)
        .count();
    assert_eq!(proceeds, 1, "{decisions:?}");
    assert!(
        decisions
            .iter()
            .all(|d| matches!(d, Decision::Proceed | Decision::InProgress)),
        "{decisions:?}"
    );
}

#[tokio::test]
async fn keys_are_spread_over_both_workers() {
    let Some(app) = spawn_citus_app().await else {
        return;
    };
    let mut c = app.client.clone();
    let keys: Vec<String> = (0..16).map(|i| format!("spread-{i}")).collect();
    for key in &keys {
        proceed(&mut c, acquire("s", key)).await;
    }
    let mut workers = BTreeSet::new();
    for key in &keys {
        let worker = worker_of(&app.db, key).await;
        // The row is in a shard on that worker, not on the coordinator.
        let found: i64 = app
            .db
            .connect_worker(worker)
            .await
            .query_one(
                "SELECT count(*) FROM idempotency_keys WHERE idempotency_key = $1",
                &[key],
            )
            .await
            .unwrap()
            .get(0);
        assert_eq!(found, 1, "{key} on worker {worker}");
        workers.insert(worker);
    }
    let expected: BTreeSet<u16> = app.db.cluster.workers().into_iter().collect();
    assert_eq!(workers, expected);
}

#[tokio::test]
async fn a_permanent_failure_exhausts_the_key() {
    let Some(app) = spawn_citus_app().await else {
        return;
    };
    let mut c = app.client.clone();
    let holder = proceed(&mut c, acquire("s", "doomed")).await;
    let outcome = proto::complete_request::Outcome::Failure(proto::Failure {
        error: "card declined".into(),
        permanent: true,
        retry_after: None,
    });
    let record = complete_ok(&mut c, complete("s", "doomed", &token(&holder), outcome)).await;
    assert_eq!(status_of(&record), Status::FailedPermanent);
    assert_eq!(record.last_error, "card declined");
    assert!(record.next_retry_at.is_none());

    let again = c
        .acquire(acquire("s", "doomed"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(decision(&again), Decision::Exhausted);
    assert!(again.lease.is_none());
    assert_eq!(
        status_of(again.record.as_ref().unwrap()),
        Status::FailedPermanent
    );
}

#[tokio::test]
async fn release_gives_the_key_back_at_once_without_counting_the_attempt() {
    let Some(app) = spawn_citus_app().await else {
        return;
    };
    let mut c = app.client.clone();
    let mut req = acquire("s", "released");
    req.max_attempts = 1;
    let first = proceed(&mut c, req.clone()).await;
    let release = proto::complete_request::Outcome::Release(proto::Release {});
    let record = complete_ok(&mut c, complete("s", "released", &token(&first), release)).await;
    assert_eq!(status_of(&record), Status::Failed);
    assert_eq!(record.attempt_count, 0);

    // With a single attempt allowed, the key is still usable, at once.
    let second = proceed(&mut c, req).await;
    let lease = second.lease.unwrap();
    assert_eq!(lease.attempt, 1);
    assert!(lease.fencing_token > first.lease.unwrap().fencing_token);
}

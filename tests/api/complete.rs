//! Complete's rules: success, failure with backoff, release, idempotent
//! repeats and lost leases.

use std::time::Duration;

use idempotency_coordinator::proto::{self, Decision, Status, complete_request::Outcome};
use tonic::Code;

use crate::helpers::*;

fn failure_with(
    error: &str,
    permanent: bool,
    retry_after: Option<prost_types::Duration>,
) -> Outcome {
    Outcome::Failure(proto::Failure {
        error: error.into(),
        permanent,
        retry_after,
    })
}

#[tokio::test]
async fn success_stores_the_result_and_makes_the_record_succeeded() {
    let app = spawn_app().await;
    let mut c = app.client.clone();
    let lease = proceed(&mut c, acquire("s", "k")).await;
    let mut result = success(b"\x00\xffbinary");
    if let Outcome::Success(s) = &mut result {
        s.result_ref = "s3://bucket/receipt-1".into();
    }
    let record = complete_ok(&mut c, complete("s", "k", &token(&lease), result)).await;
    assert_eq!(status_of(&record), Status::Succeeded);
    let stored = record.result.as_ref().unwrap();
    assert_eq!(stored.result, b"\x00\xffbinary");
    assert_eq!(stored.result_ref, "s3://bucket/receipt-1");
    assert_eq!(stored.status_code, 201);
    assert!(record.completed_at.is_some());
    assert!(record.lease_expires_at.is_none());
    // Retention counts from completion.
    let kept = seconds_between(
        record.completed_at.as_ref().unwrap(),
        record.expires_at.as_ref().unwrap(),
    );
    assert!((86399.9..=86400.1).contains(&kept), "kept {kept} s");
}

#[tokio::test]
async fn failure_backs_off_exponentially_up_to_the_cap() {
    let app = spawn_app_with(|c| {
        c.policy.backoff.base = Duration::from_secs(10);
        c.policy.backoff.cap = Duration::from_secs(25);
    })
    .await;
    let mut c = app.client.clone();
    let mut delays = Vec::new();
    for _ in 0..3 {
        let lease = proceed(&mut c, acquire("s", "k")).await;
        let record = complete_ok(&mut c, complete("s", "k", &token(&lease), failure("boom"))).await;
        assert_eq!(status_of(&record), Status::Failed);
        let delay = seconds_between(
            record.last_error_at.as_ref().unwrap(),
            record.next_retry_at.as_ref().unwrap(),
        );
        delays.push(delay.round() as i64);
        app.clock.advance(Duration::from_secs(30));
    }
    assert_eq!(delays, [10, 20, 25], "base, base * 2, then the cap");
}

#[tokio::test]
async fn a_failures_retry_after_overrides_the_backoff() {
    let app = spawn_app().await;
    let mut c = app.client.clone();
    let lease = proceed(&mut c, acquire("s", "k")).await;
    let record = complete_ok(
        &mut c,
        complete(
            "s",
            "k",
            &token(&lease),
            failure_with("429", false, secs(0)),
        ),
    )
    .await;
    assert_eq!(record.next_retry_at, record.last_error_at, "due at once");
    let again = proceed(&mut c, acquire("s", "k")).await;
    assert_eq!(again.lease.unwrap().attempt, 2);
}

#[tokio::test]
async fn a_failure_on_the_last_attempt_is_permanent() {
    let app = spawn_app().await;
    let mut c = app.client.clone();
    let mut req = acquire("s", "k");
    req.max_attempts = 2;
    for attempt in 1..=2 {
        let lease = proceed(&mut c, req.clone()).await;
        assert_eq!(lease.lease.as_ref().unwrap().attempt, attempt);
        let record = complete_ok(
            &mut c,
            complete(
                "s",
                "k",
                &token(&lease),
                failure_with("nope", false, secs(0)),
            ),
        )
        .await;
        let expected = if attempt == 2 {
            Status::FailedPermanent
        } else {
            Status::Failed
        };
        assert_eq!(status_of(&record), expected);
    }
    let resp = c.acquire(req).await.unwrap().into_inner();
    assert_eq!(decision(&resp), Decision::Exhausted);
}

#[tokio::test]
async fn a_failures_error_is_cut_to_4000_characters() {
    let app = spawn_app().await;
    let mut c = app.client.clone();
    let lease = proceed(&mut c, acquire("s", "k")).await;
    let long = "é".repeat(5000);
    let record = complete_ok(&mut c, complete("s", "k", &token(&lease), failure(&long))).await;
    assert_eq!(record.last_error.chars().count(), 4000);
}

#[tokio::test]
async fn release_gives_the_key_back_at_once_without_counting_the_attempt() {
    let app = spawn_app().await;
    let mut c = app.client.clone();
    let mut req = acquire("s", "k");
    req.max_attempts = 1;
    let first = proceed(&mut c, req.clone()).await;
    let record = complete_ok(
        &mut c,
        complete(
            "s",
            "k",
            &token(&first),
            Outcome::Release(proto::Release {}),
        ),
    )
    .await;
    assert_eq!(status_of(&record), Status::Failed);
    assert_eq!(record.attempt_count, 0);

    // With a single attempt allowed, the key is still usable.
    let second = proceed(&mut c, req).await;
    let lease = second.lease.unwrap();
    assert_eq!(lease.attempt, 1);
    assert!(lease.fencing_token > first.lease.unwrap().fencing_token);
}

#[tokio::test]
async fn an_expired_lease_is_still_honoured_if_nobody_took_over() {
    let app = spawn_app().await;
    let mut c = app.client.clone();
    let mut req = acquire("s", "k");
    req.lease_ttl = secs(5);
    let lease = proceed(&mut c, req).await;
    app.clock.advance(Duration::from_secs(60));

    let record = complete_ok(
        &mut c,
        complete("s", "k", &token(&lease), success(b"late but done")),
    )
    .await;
    assert_eq!(status_of(&record), Status::Succeeded);
}

#[tokio::test]
async fn a_holders_late_success_stands_even_after_an_acquire_exhausted_the_key() {
    let app = spawn_app().await;
    let mut c = app.client.clone();
    let mut req = acquire("s", "k");
    req.lease_ttl = secs(5);
    req.max_attempts = 1;
    let lease = proceed(&mut c, req.clone()).await;
    app.clock.advance(Duration::from_secs(6));
    let resp = c.acquire(req.clone()).await.unwrap().into_inner();
    assert_eq!(decision(&resp), Decision::Exhausted);

    // Nobody took over: the work the holder did is what happened.
    let record = complete_ok(&mut c, complete("s", "k", &token(&lease), success(b"done"))).await;
    assert_eq!(status_of(&record), Status::Succeeded);
    let resp = c.acquire(req).await.unwrap().into_inner();
    assert_eq!(decision(&resp), Decision::AlreadyDone);
}

#[tokio::test]
async fn repeating_a_complete_returns_the_record_as_it_stands() {
    let app = spawn_app().await;
    let mut c = app.client.clone();
    let lease = proceed(&mut c, acquire("s", "k")).await;
    let call = complete("s", "k", &token(&lease), success(b"first"));
    let first = c.complete(call.clone()).await.unwrap().into_inner().record;
    let again = c.complete(call).await.unwrap().into_inner().record;
    assert_eq!(first, again, "nothing changed on the repeat");

    let other_bytes = complete("s", "k", &token(&lease), success(b"second"));
    let record = complete_ok(&mut c, other_bytes).await;
    assert_eq!(
        record.result.unwrap().result,
        b"first",
        "the first stored result stands"
    );
}

#[tokio::test]
async fn a_different_outcome_after_completion_is_refused_and_the_stored_one_stands() {
    let app = spawn_app().await;
    let mut c = app.client.clone();
    let lease = proceed(&mut c, acquire("s", "k")).await;
    c.complete(complete("s", "k", &token(&lease), success(b"ok")))
        .await
        .unwrap();
    let err = c
        .complete(complete("s", "k", &token(&lease), failure("oops")))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition);
    assert_eq!(reason(&err), "ALREADY_COMPLETED");
    let record = get_record(&mut c, get_req("s", "k")).await;
    assert_eq!(status_of(&record), Status::Succeeded);
}

#[tokio::test]
async fn a_holder_whose_lease_was_taken_over_cannot_complete() {
    let app = spawn_app().await;
    let mut c = app.client.clone();
    let (stale, fresh) = taken_over(&app).await;
    c.complete(complete("s", "k", &token(&fresh), success(b"new holder")))
        .await
        .unwrap();

    let err = c
        .complete(complete("s", "k", &token(&stale), success(b"stale holder")))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Aborted);
    assert_eq!(reason(&err), "LEASE_LOST");

    let record = get_record(&mut c, get_req("s", "k")).await;
    assert_eq!(record.result.unwrap().result, b"new holder");
    assert!(fresh.lease.unwrap().fencing_token > stale.lease.unwrap().fencing_token);
}

#[tokio::test]
async fn a_stale_holder_cannot_complete_while_the_new_holder_works() {
    let app = spawn_app().await;
    let mut c = app.client.clone();
    let (stale, _) = taken_over(&app).await;

    let err = c
        .complete(complete("s", "k", &token(&stale), failure("stale")))
        .await
        .unwrap_err();
    assert_eq!(reason(&err), "LEASE_LOST");
    let record = get_record(&mut c, get_req("s", "k")).await;
    assert_eq!(status_of(&record), Status::Processing, "nothing changed");
    assert_eq!(record.last_error, "");
}

#[tokio::test]
async fn complete_on_a_key_that_has_no_record_is_not_found() {
    let app = spawn_app().await;
    let mut c = app.client.clone();
    let err = c
        .complete(complete(
            "s",
            "missing",
            "00000000-0000-0000-0000-000000000000",
            success(b"x"),
        ))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    assert_eq!(reason(&err), "RECORD_NOT_FOUND");
}

//! One test per row of API.md's Acquire table.

use std::time::Duration;

use idempotency_coordinator::proto::{Decision, Status, complete_request};

use crate::helpers::*;

#[tokio::test]
async fn a_new_key_proceeds_with_attempt_one_and_a_fresh_lease() {
    let app = spawn_app().await;
    let mut c = app.client.clone();
    let mut req = acquire("payments.charge", "order-1");
    req.lease_ttl = secs(30);
    let resp = proceed(&mut c, req).await;

    let lease = resp.lease.as_ref().unwrap();
    assert_eq!(lease.attempt, 1);
    assert!(lease.fencing_token >= 1);
    assert_eq!(lease.token.len(), 36, "an opaque uuid-sized token");
    let record = resp.record.as_ref().unwrap();
    assert_eq!(status_of(record), Status::Processing);
    assert_eq!(record.attempt_count, 1);
    assert_eq!(record.max_attempts, 10);
    let ttl = seconds_between(
        record.created_at.as_ref().unwrap(),
        lease.expires_at.as_ref().unwrap(),
    );
    assert!((29.9..=30.1).contains(&ttl), "lease of {ttl} s");
    assert_eq!(app.db.count_records().await, 1);
}

#[tokio::test]
async fn an_expired_record_counts_as_absent_and_starts_over() {
    let app = spawn_app().await;
    let mut c = app.client.clone();
    let mut req = with_fingerprint(acquire("s", "k"), "first");
    req.retention = secs(60);
    req.lease_ttl = secs(1);
    let first = proceed(&mut c, req).await;
    c.complete(complete("s", "k", &token(&first), success(b"old")))
        .await
        .unwrap();

    app.clock.advance(Duration::from_secs(61));
    // A different fingerprint would conflict with a live record; the expired
    // one is gone, so this is simply a new record.
    let again = proceed(&mut c, with_fingerprint(acquire("s", "k"), "second")).await;
    let record = again.record.unwrap();
    assert_eq!(record.attempt_count, 1);
    assert_eq!(record.fingerprint, "second");
    assert!(record.result.is_none());
    assert!(
        again.lease.unwrap().fencing_token > first.lease.unwrap().fencing_token,
        "fencing tokens keep growing across the record's lifetimes"
    );
}

#[tokio::test]
async fn a_different_fingerprint_conflicts_and_changes_nothing() {
    let app = spawn_app().await;
    let mut c = app.client.clone();
    proceed(&mut c, with_fingerprint(acquire("s", "k"), "aaa")).await;
    let before = c.get(get_req("s", "k")).await.unwrap().into_inner().record;

    let resp = c
        .acquire(with_fingerprint(acquire("s", "k"), "bbb"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(decision(&resp), Decision::Conflict);
    assert!(resp.lease.is_none());
    let after = c.get(get_req("s", "k")).await.unwrap().into_inner().record;
    assert_eq!(before, after);
}

#[tokio::test]
async fn a_succeeded_key_replays_the_stored_result() {
    let app = spawn_app().await;
    let mut c = app.client.clone();
    let first = proceed(&mut c, acquire("s", "k")).await;
    c.complete(complete("s", "k", &token(&first), success(b"{\"id\":42}")))
        .await
        .unwrap();

    let resp = c.acquire(acquire("s", "k")).await.unwrap().into_inner();
    assert_eq!(decision(&resp), Decision::AlreadyDone);
    assert!(resp.lease.is_none());
    let result = resp.record.unwrap().result.unwrap();
    assert_eq!(result.result, b"{\"id\":42}");
    assert_eq!(result.content_type, "application/json");
    assert_eq!(result.status_code, 201);
}

#[tokio::test]
async fn the_same_request_id_gets_its_live_lease_back() {
    let app = spawn_app().await;
    let mut c = app.client.clone();
    let mut req = acquire("s", "k");
    req.request_id = "attempt-7".into();
    let first = proceed(&mut c, req.clone()).await;

    let again = proceed(&mut c, req).await;
    assert_eq!(again.lease, first.lease, "the very same lease");
    assert_eq!(again.record.unwrap().attempt_count, 1);

    let mut other = acquire("s", "k");
    other.request_id = "attempt-8".into();
    let resp = c.acquire(other).await.unwrap().into_inner();
    assert_eq!(decision(&resp), Decision::InProgress);
}

#[tokio::test]
async fn a_live_lease_answers_in_progress_with_the_time_left() {
    let app = spawn_app().await;
    let mut c = app.client.clone();
    let mut req = acquire("s", "k");
    req.lease_ttl = secs(120);
    proceed(&mut c, req).await;
    app.clock.advance(Duration::from_secs(20));

    let resp = c.acquire(acquire("s", "k")).await.unwrap().into_inner();
    assert_eq!(decision(&resp), Decision::InProgress);
    assert!(resp.lease.is_none());
    let left = resp.retry_after.unwrap();
    assert!(
        (99..=100).contains(&left.seconds),
        "{left:?} left of the lease"
    );
}

#[tokio::test]
async fn an_expired_lease_is_taken_over_with_a_new_token_and_the_next_attempt() {
    let app = spawn_app().await;
    let mut c = app.client.clone();
    let mut req = acquire("s", "k");
    req.lease_ttl = secs(10);
    let first = proceed(&mut c, req).await;
    app.clock.advance(Duration::from_secs(11));

    let second = proceed(&mut c, acquire("s", "k")).await;
    let (old, new) = (first.lease.unwrap(), second.lease.unwrap());
    assert_ne!(old.token, new.token);
    assert_eq!(new.attempt, 2);
    assert!(new.fencing_token > old.fencing_token);
}

#[tokio::test]
async fn a_failed_key_answers_retry_later_until_its_retry_is_due() {
    let app = spawn_app().await;
    let mut c = app.client.clone();
    let first = proceed(&mut c, acquire("s", "k")).await;
    let mut fail = failure("card declined");
    if let complete_request::Outcome::Failure(f) = &mut fail {
        f.retry_after = secs(30);
    }
    c.complete(complete("s", "k", &token(&first), fail))
        .await
        .unwrap();

    let resp = c.acquire(acquire("s", "k")).await.unwrap().into_inner();
    assert_eq!(decision(&resp), Decision::RetryLater);
    let wait = resp.retry_after.unwrap();
    assert!((29..=30).contains(&wait.seconds), "{wait:?}");
    assert_eq!(resp.record.unwrap().last_error, "card declined");
}

#[tokio::test]
async fn a_failed_key_whose_retry_is_due_proceeds_with_the_next_attempt() {
    let app = spawn_app().await;
    let mut c = app.client.clone();
    let first = proceed(&mut c, acquire("s", "k")).await;
    c.complete(complete("s", "k", &token(&first), failure("timeout")))
        .await
        .unwrap();
    app.clock.advance(Duration::from_secs(2));

    let second = proceed(&mut c, acquire("s", "k")).await;
    assert_eq!(second.lease.unwrap().attempt, 2);
    let record = second.record.unwrap();
    assert_eq!(status_of(&record), Status::Processing);
    assert_eq!(record.last_error, "timeout", "the last error stays visible");
}

#[tokio::test]
async fn a_lease_that_runs_out_on_the_last_attempt_exhausts_the_key() {
    let app = spawn_app().await;
    let mut c = app.client.clone();
    let mut req = acquire("s", "k");
    req.max_attempts = 1;
    req.lease_ttl = secs(5);
    proceed(&mut c, req).await;
    app.clock.advance(Duration::from_secs(6));

    let resp = c.acquire(acquire("s", "k")).await.unwrap().into_inner();
    assert_eq!(decision(&resp), Decision::Exhausted);
    let record = resp.record.unwrap();
    assert_eq!(status_of(&record), Status::FailedPermanent);
    assert!(
        record.last_error.contains("ran out"),
        "last_error says why: {}",
        record.last_error
    );
}

#[tokio::test]
async fn a_permanently_failed_key_is_exhausted() {
    let app = spawn_app().await;
    let mut c = app.client.clone();
    let first = proceed(&mut c, acquire("s", "k")).await;
    let fail = complete_request::Outcome::Failure(idempotency_coordinator::proto::Failure {
        error: "account closed".into(),
        permanent: true,
        retry_after: None,
    });
    c.complete(complete("s", "k", &token(&first), fail))
        .await
        .unwrap();

    let resp = c.acquire(acquire("s", "k")).await.unwrap().into_inner();
    assert_eq!(decision(&resp), Decision::Exhausted);
    let record = resp.record.unwrap();
    assert_eq!(status_of(&record), Status::FailedPermanent);
    assert_eq!(record.last_error, "account closed");
}

#[tokio::test]
async fn json_payloads_that_differ_only_in_layout_are_the_same_request() {
    use idempotency_coordinator::proto::acquire_request::RequestFingerprint;
    let app = spawn_app().await;
    let mut c = app.client.clone();
    let mut first = acquire("s", "k");
    first.request_fingerprint = Some(RequestFingerprint::JsonPayload(r#"{"a":1,"b":2}"#.into()));
    let granted = proceed(&mut c, first).await;
    c.complete(complete("s", "k", &token(&granted), success(b"ok")))
        .await
        .unwrap();

    let mut same = acquire("s", "k");
    same.request_fingerprint = Some(RequestFingerprint::JsonPayload(
        "{ \"b\": 2,\n  \"a\": 1 }".into(),
    ));
    let resp = c.acquire(same).await.unwrap().into_inner();
    assert_eq!(decision(&resp), Decision::AlreadyDone);

    let mut different = acquire("s", "k");
    different.request_fingerprint =
        Some(RequestFingerprint::JsonPayload(r#"{"a":1,"b":3}"#.into()));
    let resp = c.acquire(different).await.unwrap().into_inner();
    assert_eq!(decision(&resp), Decision::Conflict);

    let mut raw = acquire("s", "k");
    raw.request_fingerprint = Some(RequestFingerprint::Payload(br#"{"a":1,"b":2}"#.to_vec()));
    let resp = c.acquire(raw).await.unwrap().into_inner();
    assert_eq!(
        decision(&resp),
        Decision::AlreadyDone,
        "the raw bytes of canonical JSON hash the same as the JSON"
    );
}

#[tokio::test]
async fn large_json_payloads_fingerprint_as_small_ones_do_and_too_many_values_are_refused() {
    use idempotency_coordinator::proto::acquire_request::RequestFingerprint;
    let app = spawn_app().await;
    let mut c = app.client.clone();
    // Over 16 KiB: canonicalised off the async workers.
    let items: Vec<String> = (0..3000)
        .map(|i| format!(r#"{{"n":{i},"k":"v"}}"#))
        .collect();
    let compact = format!(r#"{{"items":[{}],"z":true}}"#, items.join(","));
    let reordered: Vec<String> = (0..3000)
        .map(|i| format!("{{ \"k\": \"v\", \"n\": {i} }}"))
        .collect();
    let spaced = format!(
        "{{ \"z\": true,\n \"items\": [ {} ] }}",
        reordered.join(",\n")
    );
    assert!(compact.len() > 16 * 1024);
    let with_json = |text: &str| {
        let mut req = acquire("s", "large");
        req.request_fingerprint = Some(RequestFingerprint::JsonPayload(text.to_owned()));
        req
    };
    let granted = proceed(&mut c, with_json(&compact)).await;
    c.complete(complete("s", "large", &token(&granted), success(b"ok")))
        .await
        .unwrap();
    let resp = c.acquire(with_json(&spaced)).await.unwrap().into_inner();
    assert_eq!(decision(&resp), Decision::AlreadyDone);
    let resp = c
        .acquire(with_json(&compact.replace("\"z\":true", "\"z\":false")))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(decision(&resp), Decision::Conflict);

    let too_many = format!("[{}]", vec!["[]"; 100_000].join(","));
    let err = c.acquire(with_json(&too_many)).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert_eq!(bad_fields(&err), ["json_payload"]);
    assert!(err.message().contains("100000"), "{}", err.message());
}

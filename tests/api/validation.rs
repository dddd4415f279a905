//! Bad input is INVALID_ARGUMENT naming the field, and writes nothing.

use idempotency_coordinator::proto::{self, Status, acquire_request::RequestFingerprint};
use tonic::Code;

use crate::helpers::*;

fn assert_invalid(err: &tonic::Status, field: &str) {
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert_eq!(reason(err), "INVALID_ARGUMENT");
    assert_eq!(bad_fields(err), [field], "{err:?}");
    assert!(
        err.message().contains(field),
        "the message names {field}: {}",
        err.message()
    );
}

#[tokio::test]
async fn bad_acquire_fields_are_refused_by_name_and_write_nothing() {
    let app = spawn_app().await;
    let mut c = app.client.clone();
    let hours = |h: i64| secs(h * 3600);
    let cases: Vec<(&str, proto::AcquireRequest)> = vec![
        ("key", acquire("s", "")),
        ("key", acquire("s", &"k".repeat(256))),
        ("key", acquire("s", "has space")),
        ("key", acquire("s", "has\nnewline")),
        ("scope", acquire("sc*pe", "k")),
        ("scope", acquire(&"s".repeat(129), "k")),
        ("scope", acquire("", "k")),
        (
            "lease_ttl",
            proto::AcquireRequest {
                lease_ttl: hours(25),
                ..acquire("s", "k")
            },
        ),
        (
            "max_attempts",
            proto::AcquireRequest {
                max_attempts: 1001,
                ..acquire("s", "k")
            },
        ),
        (
            "retention",
            proto::AcquireRequest {
                retention: secs(30),
                ..acquire("s", "k")
            },
        ),
        (
            "wait",
            proto::AcquireRequest {
                wait: secs(-1),
                ..acquire("s", "k")
            },
        ),
        (
            "request_id",
            proto::AcquireRequest {
                request_id: "r".repeat(129),
                ..acquire("s", "k")
            },
        ),
        (
            "fingerprint",
            with_fingerprint(acquire("s", "k"), &"f".repeat(129)),
        ),
        (
            "json_payload",
            proto::AcquireRequest {
                request_fingerprint: Some(RequestFingerprint::JsonPayload("{not json".into())),
                ..acquire("s", "k")
            },
        ),
    ];
    for (field, req) in cases {
        let err = c.acquire(req).await.unwrap_err();
        assert_invalid(&err, field);
    }
    assert_eq!(app.db.count_records().await, 0, "nothing was written");
}

#[tokio::test]
async fn invalid_json_is_refused_saying_it_is_not_json() {
    let app = spawn_app().await;
    let mut c = app.client.clone();
    let req = proto::AcquireRequest {
        request_fingerprint: Some(RequestFingerprint::JsonPayload("{\"a\": }".into())),
        ..acquire("s", "k")
    };
    let err = c.acquire(req).await.unwrap_err();
    assert!(
        err.message().contains("not valid JSON"),
        "{}",
        err.message()
    );
}

#[tokio::test]
async fn a_key_of_255_characters_and_a_scope_of_128_work() {
    let app = spawn_app().await;
    let mut c = app.client.clone();
    let key = "~".repeat(255);
    let scope = "a".repeat(128);
    let granted = proceed(&mut c, acquire(&scope, &key)).await;
    assert_eq!(
        granted.record.unwrap().key,
        key,
        "stored whole, not truncated"
    );
}

#[tokio::test]
async fn a_result_over_the_limit_is_refused_and_the_lease_stays() {
    let app = spawn_app().await;
    let mut c = app.client.clone();
    let granted = proceed(&mut c, acquire("s", "k")).await;
    for size in [1024 * 1024 + 1, 2 * 1024 * 1024] {
        let err = c
            .complete(complete(
                "s",
                "k",
                &token(&granted),
                success(&vec![7u8; size]),
            ))
            .await
            .unwrap_err();
        assert_invalid(&err, "success.result");
    }
    let record = get_record(&mut c, get_req("s", "k")).await;
    assert_eq!(status_of(&record), Status::Processing);

    // Exactly at the limit is fine.
    c.complete(complete(
        "s",
        "k",
        &token(&granted),
        success(&vec![7u8; 1024 * 1024]),
    ))
    .await
    .expect("a result of exactly 1 MiB is stored");
}

#[tokio::test]
async fn a_malformed_lease_token_is_refused_by_name() {
    let app = spawn_app().await;
    let mut c = app.client.clone();
    proceed(&mut c, acquire("s", "k")).await;
    let err = c
        .complete(complete("s", "k", "not-a-token", success(b"x")))
        .await
        .unwrap_err();
    assert_invalid(&err, "lease_token");
}

#[tokio::test]
async fn an_oversized_checkpoint_is_refused_by_name() {
    let app = spawn_app().await;
    let mut c = app.client.clone();
    let granted = proceed(&mut c, acquire("s", "k")).await;
    let err = c
        .extend_lease(proto::ExtendLeaseRequest {
            scope: "s".into(),
            key: "k".into(),
            lease_token: token(&granted),
            extend_by: secs(10),
            checkpoint: Some(vec![0; 64 * 1024 + 1]),
        })
        .await
        .unwrap_err();
    assert_invalid(&err, "checkpoint");
}

#[tokio::test]
async fn text_with_a_nul_character_is_refused_by_name_and_the_lease_stays() {
    let app = spawn_app().await;
    let mut c = app.client.clone();
    let granted = proceed(&mut c, acquire("s", "k")).await;
    let err = c
        .complete(complete("s", "k", &token(&granted), failure("bad\0byte")))
        .await
        .unwrap_err();
    assert_invalid(&err, "failure.error");
    let mut result = success(b"ok");
    if let idempotency_coordinator::proto::complete_request::Outcome::Success(s) = &mut result {
        s.content_type = "text/\0plain".into();
    }
    let err = c
        .complete(complete("s", "k", &token(&granted), result))
        .await
        .unwrap_err();
    assert_invalid(&err, "success.content_type");
    let record = get_record(&mut c, get_req("s", "k")).await;
    assert_eq!(status_of(&record), Status::Processing);
}

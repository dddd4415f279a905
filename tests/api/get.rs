//! Get: the record as it stands, or NOT_FOUND.

use std::time::Duration;

use idempotency_coordinator::proto::Status;
use tonic::Code;

use crate::helpers::*;

#[tokio::test]
async fn get_returns_the_record_as_it_stands() {
    let app = spawn_app().await;
    let mut c = app.client.clone();
    let granted = proceed(&mut c, with_fingerprint(acquire("s", "k"), "fp-1")).await;
    let record = get_record(&mut c, get_req("s", "k")).await;
    assert_eq!(record, granted.record.unwrap());
    assert_eq!(record.fingerprint, "fp-1");
    assert_eq!(status_of(&record), Status::Processing);
}

#[tokio::test]
async fn get_of_a_key_without_a_record_is_not_found() {
    let app = spawn_app().await;
    let mut c = app.client.clone();
    let err = c.get(get_req("s", "never")).await.unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    assert_eq!(reason(&err), "RECORD_NOT_FOUND");
}

#[tokio::test]
async fn an_expired_record_is_not_found() {
    let app = spawn_app().await;
    let mut c = app.client.clone();
    let mut req = acquire("s", "k");
    req.retention = secs(60);
    req.lease_ttl = secs(1);
    let granted = proceed(&mut c, req).await;
    c.complete(complete("s", "k", &token(&granted), success(b"x")))
        .await
        .unwrap();
    c.get(get_req("s", "k")).await.expect("still retained");

    app.clock.advance(Duration::from_secs(61));
    let err = c.get(get_req("s", "k")).await.unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
}

//! Watch: the record as it stands, then every change, until it is done or
//! the window ends.

use std::time::Duration;

use idempotency_coordinator::proto::{self, Status};
use tokio_stream::StreamExt;
use tonic::Code;

use crate::helpers::*;

fn watch_req(scope: &str, key: &str, timeout_secs: i64) -> proto::WatchRequest {
    proto::WatchRequest {
        scope: scope.into(),
        key: key.into(),
        timeout: secs(timeout_secs),
    }
}

#[tokio::test]
async fn watch_streams_each_change_in_order_and_ends_at_succeeded() {
    let app = spawn_app().await;
    let mut c = app.client.clone();
    let holder = proceed(&mut c, acquire("s", "k")).await;
    let mut events = c.watch(watch_req("s", "k", 30)).await.unwrap().into_inner();

    let first = events.next().await.unwrap().unwrap();
    assert_eq!(
        status_of(first.record.as_ref().unwrap()),
        Status::Processing
    );
    assert!(!first.timed_out);

    c.extend_lease(proto::ExtendLeaseRequest {
        scope: "s".into(),
        key: "k".into(),
        lease_token: token(&holder),
        extend_by: secs(60),
        checkpoint: Some(b"half way".to_vec()),
    })
    .await
    .unwrap();
    let second = events.next().await.unwrap().unwrap();
    let record = second.record.unwrap();
    assert_eq!(status_of(&record), Status::Processing);
    assert_eq!(record.checkpoint, b"half way");

    c.complete(complete("s", "k", &token(&holder), success(b"done")))
        .await
        .unwrap();
    let last = events.next().await.unwrap().unwrap();
    assert_eq!(status_of(last.record.as_ref().unwrap()), Status::Succeeded);
    assert!(!last.timed_out);
    assert!(
        events.next().await.is_none(),
        "the stream ends after SUCCEEDED"
    );
    until_waiters(&app, 0).await;
}

#[tokio::test]
async fn watch_ends_with_timed_out_when_the_window_ends_first() {
    let app = spawn_app().await;
    let mut c = app.client.clone();
    proceed(&mut c, acquire("s", "k")).await;
    let events: Vec<_> = c
        .watch(watch_req("s", "k", 1))
        .await
        .unwrap()
        .into_inner()
        .collect()
        .await;
    let events: Vec<_> = events.into_iter().map(Result::unwrap).collect();
    assert_eq!(events.len(), 2, "{events:?}");
    assert!(!events[0].timed_out);
    assert!(events[1].timed_out);
    assert_eq!(
        status_of(events[1].record.as_ref().unwrap()),
        Status::Processing
    );
}

#[tokio::test]
async fn watching_a_finished_record_sends_it_once_and_ends() {
    let app = spawn_app().await;
    let mut c = app.client.clone();
    let holder = proceed(&mut c, acquire("s", "k")).await;
    c.complete(complete("s", "k", &token(&holder), success(b"x")))
        .await
        .unwrap();
    let events: Vec<_> = c
        .watch(watch_req("s", "k", 30))
        .await
        .unwrap()
        .into_inner()
        .collect()
        .await;
    assert_eq!(events.len(), 1);
    assert_eq!(
        status_of(events[0].as_ref().unwrap().record.as_ref().unwrap()),
        Status::Succeeded
    );
}

#[tokio::test]
async fn watching_a_key_without_a_record_is_not_found() {
    let app = spawn_app().await;
    let mut c = app.client.clone();
    let err = c.watch(watch_req("s", "none", 5)).await.unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    until_waiters(&app, 0).await;
}

#[tokio::test]
async fn a_watch_on_one_replica_sees_a_change_made_on_another() {
    let app = spawn_app().await;
    let other = ServerProcess::start(&app.db.url).await;
    let mut a = other.client().await;
    let holder = proceed(&mut a, acquire("s", "k")).await;
    let mut c = app.client.clone();
    let mut events = c.watch(watch_req("s", "k", 30)).await.unwrap().into_inner();
    events.next().await.unwrap().unwrap();
    a.complete(complete("s", "k", &token(&holder), success(b"elsewhere")))
        .await
        .unwrap();
    let done = tokio::time::timeout(Duration::from_secs(10), events.next())
        .await
        .expect("the change arrives")
        .unwrap()
        .unwrap();
    assert_eq!(done.record.unwrap().result.unwrap().result, b"elsewhere");
}

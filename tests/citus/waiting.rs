//! Waiting on the cluster: the functions notify on the worker holding the
//! row, and the server hears it there.

use std::time::Duration;

use idempotency_coordinator::proto::{self, Decision, Status};
use tokio_stream::StreamExt;

use crate::app::spawn_citus_app;
use crate::helpers::*;

/// Well under the wait windows below: only a notification answers this
/// soon.
const HEARD_WITHIN: Duration = Duration::from_secs(5);

#[tokio::test]
async fn a_waiting_acquire_hears_the_completion_on_the_keys_worker() {
    let Some(app) = spawn_citus_app().await else {
        return;
    };
    let mut c = app.client.clone();
    let holder = proceed(&mut c, acquire("s", "awaited")).await;
    let mut waiter = app.client.clone();
    let waiting = tokio::spawn(async move { waiter.acquire(waiting("s", "awaited", 30)).await });
    until_waiters(&app, 1).await;
    complete_ok(
        &mut c,
        complete("s", "awaited", &token(&holder), success(b"r")),
    )
    .await;
    let answer = tokio::time::timeout(HEARD_WITHIN, waiting)
        .await
        .expect("the waiter heard the completion")
        .unwrap()
        .unwrap()
        .into_inner();
    assert_eq!(decision(&answer), Decision::AlreadyDone);
}

#[tokio::test]
async fn watch_follows_a_record_to_its_end() {
    let Some(app) = spawn_citus_app().await else {
        return;
    };
    let mut c = app.client.clone();
    let holder = proceed(&mut c, acquire("s", "watched")).await;
    let mut events = c
        .watch(proto::WatchRequest {
            scope: "s".into(),
            key: "watched".into(),
            timeout: secs(30),
        })
        .await
        .unwrap()
        .into_inner();
    let first = events.next().await.unwrap().unwrap();
    assert_eq!(
        status_of(first.record.as_ref().unwrap()),
        Status::Processing
    );
    complete_ok(
        &mut c,
        complete("s", "watched", &token(&holder), success(b"r")),
    )
    .await;
    let last = tokio::time::timeout(HEARD_WITHIN, events.next())
        .await
        .expect("the watch heard the completion")
        .unwrap()
        .unwrap();
    assert_eq!(status_of(last.record.as_ref().unwrap()), Status::Succeeded);
    assert!(!last.timed_out);
}

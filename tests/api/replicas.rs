//! Two server processes on one database behave as one service.

use futures::future::join_all;
use idempotency_coordinator::proto::Decision;

use crate::helpers::*;

#[tokio::test]
async fn two_server_processes_on_one_database_grant_exactly_one_lease() {
    let db = TestDatabase::create().await;
    let (a, b) = tokio::join!(ServerProcess::start(&db.url), ServerProcess::start(&db.url));
    let (ca, cb) = (a.client().await, b.client().await);

    let calls = (0..50).map(|i| {
        let mut c = if i % 2 == 0 { ca.clone() } else { cb.clone() };
        async move {
            c.acquire(acquire("replicas", "k"))
                .await
                .unwrap()
                .into_inner()
        }
    });
    let answers = join_all(calls).await;
    let proceeds: Vec<_> = answers
        .iter()
        .filter(|a| decision(a) == Decision::Proceed)
        .collect();
    assert_eq!(proceeds.len(), 1);
    assert_eq!(
        answers
            .iter()
            .filter(|a| decision(a) == Decision::InProgress)
            .count(),
        49
    );

    // What one replica stored, the other replays.
    let mut ca = ca;
    ca.complete(complete(
        "replicas",
        "k",
        &token(proceeds[0]),
        success(b"once"),
    ))
    .await
    .unwrap();
    let mut cb = cb;
    let replay = cb
        .acquire(acquire("replicas", "k"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(decision(&replay), Decision::AlreadyDone);
    assert_eq!(replay.record.unwrap().result.unwrap().result, b"once");

    assert!(
        a.terminate().await.success(),
        "SIGTERM stops the server cleanly"
    );
    assert!(b.terminate().await.success());
}

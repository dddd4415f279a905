//! A reload of the credentials that removes a token ends what it holds
//! open: its WatchDue stream, the console's session and live stream.

use std::time::Duration;

use idempotency_coordinator::proto;

use super::*;

/// The longest a revoked credential's stream may last after the reload.
const ENDS_WITHIN: Duration = Duration::from_secs(5);

#[tokio::test]
async fn a_reload_that_removes_tokens_ends_their_watch_due_and_console_streams_within_5_s() {
    let db = TestDatabase::create().await;
    let file = tokens();
    let console = Console::start(&db, Some(&file), &[]).await;
    let mut worker = grpc(&console.server, WORKER).await;
    worker.acquire(acquire("pay", "k")).await.unwrap();
    let mut due = worker
        .watch_due(proto::WatchDueRequest {
            scope: "pay".into(),
        })
        .await
        .expect("WatchDue opens")
        .into_inner();
    let cookie = console.session().await;
    let mut live = console.get("watch?scope=pay&key=k", &cookie).await;
    assert_eq!(live.status(), 200);
    assert!(
        live.chunk().await.unwrap().is_some(),
        "the live stream's first event"
    );

    file.rewrite("other-token-0123456789 elsewhere\n");
    console.server.signal("HUP");

    let ended = tokio::time::timeout(ENDS_WITHIN, async {
        loop {
            match due.message().await {
                Ok(Some(_)) => continue,
                Ok(None) => panic!("WatchDue ended without saying why"),
                Err(status) => return status,
            }
        }
    })
    .await
    .expect("the revoked worker's WatchDue ended within 5 s of the reload");
    assert_eq!(ended.code(), tonic::Code::Unauthenticated, "{ended:?}");
    tokio::time::timeout(ENDS_WITHIN, async {
        while let Ok(Some(_)) = live.chunk().await {}
    })
    .await
    .expect("the revoked admin's live stream ended within 5 s of the reload");
    let home = console.get("", &cookie).await;
    assert_eq!(home.status(), 303, "the revoked admin's session ended");
    assert_eq!(home.headers()["location"], "/console/login");
}

#[tokio::test]
async fn a_reload_that_keeps_a_token_keeps_its_watch_due_open() {
    let db = TestDatabase::create().await;
    let file = tokens();
    let console = Console::start(&db, Some(&file), &[]).await;
    let mut worker = grpc(&console.server, WORKER).await;
    let mut due = worker
        .watch_due(proto::WatchDueRequest {
            scope: "pay".into(),
        })
        .await
        .unwrap()
        .into_inner();
    file.rewrite(&format!(
        "{WORKER} shop\nother-token-0123456789 elsewhere\n"
    ));
    console.server.signal("HUP");
    eventually("the reload", Duration::from_secs(10), || async {
        console
            .server
            .logs()
            .iter()
            .any(|l| l.contains("credentials reloaded"))
            .then_some(())
    })
    .await;
    // A lease that runs out is still offered on the stream.
    let mut short = acquire("pay", "short");
    short.lease_ttl = secs(1);
    worker.acquire(short).await.unwrap();
    let offered = tokio::time::timeout(Duration::from_secs(20), due.message())
        .await
        .expect("the kept worker's WatchDue still delivers")
        .expect("no error");
    assert_eq!(offered.unwrap().record.unwrap().key, "short");
}

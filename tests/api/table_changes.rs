//! The records table changed while a server runs on it: a column added (a
//! migration of a rolling upgrade, or an operator's), then dropped. The
//! server's connections learnt the table's row type before; the hot calls
//! read their records as one value of that type (`store::row_type`), so
//! they must read them by the columns the table has now, answering every
//! call that committed.

use futures::future::join_all;
use idempotency_coordinator::config::ServeConfig;
use idempotency_coordinator::proto::coordinator_client::CoordinatorClient;
use idempotency_coordinator::proto::{self, Decision, Status};
use tonic::transport::Channel;

use crate::helpers::*;

/// A cycle on `key` and everything read back of it: a replay, a Get, and
/// on the way an ExtendLease of the live lease.
async fn cycle(c: &mut CoordinatorClient<Channel>, key: &str) {
    let lease = proceed(c, acquire("s", key)).await;
    let extended = c
        .extend_lease(proto::ExtendLeaseRequest {
            scope: "s".into(),
            key: key.into(),
            lease_token: token(&lease),
            extend_by: secs(30),
            checkpoint: None,
        })
        .await
        .expect("extend_lease");
    assert!(extended.into_inner().lease.is_some(), "{key}");
    let record = complete_ok(c, complete("s", key, &token(&lease), success(b"ok"))).await;
    assert_eq!(status_of(&record), Status::Succeeded, "{key}");
    let replay = c.acquire(acquire("s", key)).await.unwrap().into_inner();
    assert_eq!(decision(&replay), Decision::AlreadyDone, "{key}");
    let got = get_record(c, get_req("s", key)).await;
    assert_eq!(got.result.map(|r| r.result), Some(b"ok".to_vec()), "{key}");
}

/// Cycles on many keys at once, so that they also run in batches.
async fn cycles(c: &CoordinatorClient<Channel>, prefix: &str) {
    join_all((0..16).map(|i| {
        let mut c = c.clone();
        async move { cycle(&mut c, &format!("{prefix}-{i}")).await }
    }))
    .await;
}

#[tokio::test]
async fn a_column_added_and_dropped_while_the_server_runs_changes_no_answer() {
    let db = TestDatabase::create().await;
    let server = start_server(ServeConfig::new(
        "127.0.0.1:0".parse().unwrap(),
        db.url.clone(),
    ))
    .await;
    let c = server.client.clone();
    cycles(&c, "before").await;
    let admin = db.connect().await;

    admin
        .batch_execute("ALTER TABLE idempotency_keys ADD COLUMN operator_note text DEFAULT 'n'")
        .await
        .unwrap();
    cycles(&c, "added").await;

    admin
        .batch_execute("ALTER TABLE idempotency_keys DROP COLUMN operator_note")
        .await
        .unwrap();
    cycles(&c, "dropped").await;
    server.stop().await;
}

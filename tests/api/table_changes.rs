//! The records table changed while a server runs on it: a column dropped
//! and one added (by a migration of a rolling upgrade, or an operator).
//! The server's connections learnt the table's row type before; the hot
//! calls (Acquire, Complete, ExtendLease) read their records as one value
//! of that type (`store::row_type`), so they must read them by the columns
//! the table has now, answering every call that committed. (Get, Watch and
//! the other reads of plain columns are prepared with the columns of their
//! day: a column dropped under them fails them until their connections are
//! replaced, as it always has.)

use futures::future::join_all;
use idempotency_coordinator::config::ServeConfig;
use idempotency_coordinator::proto::coordinator_client::CoordinatorClient;
use idempotency_coordinator::proto::{self, Decision, Status};
use tonic::transport::Channel;

use crate::helpers::*;

/// A cycle on `key` with an ExtendLease of the live lease on the way, and
/// its replay.
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
    assert_eq!(
        record.result.map(|r| r.result),
        Some(b"ok".to_vec()),
        "{key}"
    );
    let replay = c.acquire(acquire("s", key)).await.unwrap().into_inner();
    assert_eq!(decision(&replay), Decision::AlreadyDone, "{key}");
}

/// Cycles on many keys at once, so that they also run in batches.
async fn cycles(c: &CoordinatorClient<Channel>, prefix: &str) {
    join_all((0..16).map(|i| {
        let mut c = c.clone();
        async move { cycle(&mut c, &format!("{prefix}-{i}")).await }
    }))
    .await;
}

/// A column the connections knew is dropped (a value then has a field
/// fewer than they know), then one is added (as many fields as they know,
/// the last of another type, and one more than the store last looked up).
#[tokio::test]
async fn columns_dropped_and_added_while_the_server_runs_change_no_answer() {
    let db = TestDatabase::create().await;
    let admin = db.connect().await;
    let mut migrating = db.connect().await;
    idempotency_coordinator::store::migrate::migrate(&mut migrating)
        .await
        .unwrap();
    admin
        .batch_execute("ALTER TABLE idempotency_keys ADD COLUMN gone integer")
        .await
        .unwrap();
    let server = start_server(ServeConfig::new(
        "127.0.0.1:0".parse().unwrap(),
        db.url.clone(),
    ))
    .await;
    let c = server.client.clone();
    cycles(&c, "before").await;

    admin
        .batch_execute("ALTER TABLE idempotency_keys DROP COLUMN gone")
        .await
        .unwrap();
    cycles(&c, "dropped").await;

    admin
        .batch_execute("ALTER TABLE idempotency_keys ADD COLUMN operator_note text DEFAULT 'n'")
        .await
        .unwrap();
    cycles(&c, "added").await;
    server.stop().await;
}

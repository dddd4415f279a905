//! The records table changed while a server runs on it: a column dropped
//! and one added (by a migration of a rolling upgrade, or an operator).
//! The server's connections learnt the table's row type before; the hot
//! calls (Acquire, Complete, ExtendLease) read their records as one value
//! of that type (`store::row_type`), so they must read them by the columns
//! the table has now, answering every call that committed. Get, Watch and
//! an administrator's delete, like the other statements that return plain
//! columns, are prepared with
//! the columns of their day: after a column they return is dropped, or a
//! function they call is replaced after a column was added, they are
//! prepared anew (`store::mux::prepared_anew_if_stale`) instead of
//! failing until their connections are replaced.

use std::time::Duration;

use futures::future::join_all;
use idempotency_coordinator::config::ServeConfig;
use idempotency_coordinator::proto::coordinator_client::CoordinatorClient;
use idempotency_coordinator::proto::{self, Decision, Status};
use tonic::transport::Channel;

use crate::helpers::*;

/// A cycle on `key` with an ExtendLease of the live lease on the way, its
/// replay, its record read by Get and by Watch, then deleted by an
/// administrator (authentication is off) and the key leased afresh.
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
    let got = get_record(c, get_req("s", key)).await;
    assert_eq!(status_of(&got), Status::Succeeded, "{key}");
    assert_eq!(got.result.map(|r| r.result), Some(b"ok".to_vec()), "{key}");
    let watched = c
        .watch(proto::WatchRequest {
            scope: "s".into(),
            key: key.into(),
            timeout: secs(5),
        })
        .await
        .expect("watch")
        .into_inner()
        .message()
        .await
        .expect("watch event")
        .and_then(|event| event.record)
        .expect("the record as it is");
    assert_eq!(status_of(&watched), Status::Succeeded, "{key}");
    let deleted = c
        .delete_record(proto::DeleteRecordRequest {
            target: Some(proto::AdminTarget {
                scope: "s".into(),
                key: key.into(),
                reason: "start over".into(),
                operator: String::new(),
            }),
        })
        .await
        .expect("delete_record")
        .into_inner()
        .record
        .expect("the record as it was");
    assert_eq!(status_of(&deleted), Status::Succeeded, "{key}");
    proceed(c, acquire("s", key)).await;
}

/// Cycles on many keys at once, so that they also run in batches.
async fn cycles(c: &CoordinatorClient<Channel>, prefix: &str) {
    join_all((0..16).map(|i| {
        let mut c = c.clone();
        async move { cycle(&mut c, &format!("{prefix}-{i}")).await }
    }))
    .await;
}

/// A migrated database whose records table has a column `gone` that no
/// record reads, and a connection to change the table with.
async fn migrated_with_a_column_to_drop() -> (TestDatabase, tokio_postgres::Client) {
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
    (db, admin)
}

/// A column the connections knew is dropped (a value then has a field
/// fewer than they know), then one is added (as many fields as they know,
/// the last of another type, and one more than the store last looked up),
/// then the functions that return `SETOF idempotency_keys` are replaced.
#[tokio::test]
async fn columns_dropped_and_added_while_the_server_runs_change_no_answer() {
    let (db, admin) = migrated_with_a_column_to_drop().await;
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

    // A migration of the next release replaces the functions that return
    // `SETOF idempotency_keys`: a statement prepared before is planned
    // again, with the added column in its result.
    admin
        .batch_execute(
            "DO $$ DECLARE f oid; BEGIN \
               FOR f IN SELECT oid FROM pg_proc \
                        WHERE prorettype = 'idempotency_keys'::regtype LOOP \
                 EXECUTE pg_get_functiondef(f); \
               END LOOP; \
             END $$",
        )
        .await
        .unwrap();
    cycles(&c, "replaced").await;
    server.stop().await;
}

/// The recovery feed runs on the pool, not on the shared connections: with
/// one pooled connection, the feed's statement prepared before a column is
/// dropped is the one it must run after.
#[tokio::test]
async fn the_recovery_feed_goes_on_after_a_column_is_dropped() {
    let (db, admin) = migrated_with_a_column_to_drop().await;
    let mut config = ServeConfig::new("127.0.0.1:0".parse().unwrap(), db.url.clone());
    config.store.pool_size = 1;
    config.sweep_interval = Duration::ZERO;
    config.feed.poll = Duration::from_millis(50);
    let server = start_server(config).await;
    let mut c = server.client.clone();
    let mut feed = c
        .watch_due(proto::WatchDueRequest { scope: "s".into() })
        .await
        .expect("watch_due")
        .into_inner();

    fail_due(&mut c, "before").await;
    assert_eq!(next_due(&mut feed).await.as_deref(), Some("before"));
    admin
        .batch_execute("ALTER TABLE idempotency_keys DROP COLUMN gone")
        .await
        .unwrap();
    fail_due(&mut c, "dropped").await;
    assert_eq!(next_due(&mut feed).await.as_deref(), Some("dropped"));
    drop(feed);
    server.stop().await;
}

/// `key` of scope `s` failed, and due for its retry now.
async fn fail_due(c: &mut CoordinatorClient<Channel>, key: &str) {
    let granted = proceed(c, acquire("s", key)).await;
    let fail = proto::complete_request::Outcome::Failure(proto::Failure {
        error: "boom".into(),
        permanent: false,
        retry_after: secs(0),
    });
    complete_ok(c, complete("s", key, &token(&granted), fail)).await;
}

/// The key of the feed's next offer, or `None` if none comes within 10 s.
async fn next_due(feed: &mut tonic::Streaming<proto::DueRecord>) -> Option<String> {
    let due = tokio::time::timeout(Duration::from_secs(10), feed.message())
        .await
        .ok()?
        .expect("the feed goes on")?;
    Some(due.record?.key)
}

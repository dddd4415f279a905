//! The records table changed while a server runs on it: a column dropped
//! and one added (by a migration of a rolling upgrade, or an operator).
//! The server's connections learnt the table's row type before; the hot
//! calls (Acquire, Complete, ExtendLease) read their records as one value
//! of that type (`store::row_type`), so they must read them by the columns
//! the table has now, answering every call that committed. Get, Watch and
//! an administrator's delete, like the other statements that return plain
//! columns, are prepared with the columns of their day: after a column
//! they return is dropped, or a function they call is replaced after a
//! column was added, they are prepared anew
//! (`store::mux::prepared_anew_if_stale`) instead of failing until their
//! connections are replaced.

use std::time::Duration;

use idempotency_coordinator::config::ServeConfig;
use idempotency_coordinator::proto;
use idempotency_coordinator::proto::coordinator_client::CoordinatorClient;
use tonic::transport::Channel;

use crate::helpers::*;

/// A fresh database ready for `the_table_changed_under`, and a
/// connection to change its table with.
async fn a_database_with_a_column_to_drop() -> (TestDatabase, tokio_postgres::Client) {
    let db = TestDatabase::create().await;
    let mut admin = db.connect().await;
    migrate_with_a_column_to_drop(&mut admin).await;
    (db, admin)
}

/// A column the connections knew is dropped, one is added, and the
/// functions returning records are replaced (`the_table_changed_under`).
#[tokio::test]
async fn columns_dropped_and_added_while_the_server_runs_change_no_answer() {
    let (db, admin) = a_database_with_a_column_to_drop().await;
    let server = start_server(ServeConfig::new(
        "127.0.0.1:0".parse().unwrap(),
        db.url.clone(),
    ))
    .await;
    the_table_changed_under(&admin, &server.client).await;
    server.stop().await;
}

/// The recovery feed runs on the pool, not on the shared connections: with
/// one pooled connection, the feed's statement prepared before a column is
/// dropped is the one it must run after.
#[tokio::test]
async fn the_recovery_feed_goes_on_after_a_column_is_dropped() {
    let (db, admin) = a_database_with_a_column_to_drop().await;
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

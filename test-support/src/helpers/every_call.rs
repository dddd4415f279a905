//! Every call a record meets, on one key or on many at once, and the
//! records table changed under a server between rounds of them (by a
//! migration of a rolling upgrade, or an operator).

use futures::future::join_all;
use idempotency_coordinator::proto::coordinator_client::CoordinatorClient;
use idempotency_coordinator::proto::{self, Decision, Status};
use tonic::transport::Channel;

use super::*;

/// A cycle on `key` with an ExtendLease of the live lease on the way, its
/// replay, its record read by Get and by Watch, then deleted by an
/// administrator (authentication is off) and the key leased afresh.
pub async fn a_key_through_every_call(c: &mut CoordinatorClient<Channel>, key: &str) {
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
pub async fn keys_through_every_call(c: &CoordinatorClient<Channel>, prefix: &str) {
    join_all((0..16).map(|i| {
        let mut c = c.clone();
        async move { a_key_through_every_call(&mut c, &format!("{prefix}-{i}")).await }
    }))
    .await;
}

/// Migrates the database `client` is connected to and gives its records
/// table a column `gone` that no record reads, for
/// [`the_table_changed_under`] to drop once a server runs on it.
pub async fn migrate_with_a_column_to_drop(client: &mut tokio_postgres::Client) {
    idempotency_coordinator::store::migrate::migrate(client)
        .await
        .unwrap();
    client
        .batch_execute("ALTER TABLE idempotency_keys ADD COLUMN gone integer")
        .await
        .unwrap();
}

/// On a database [`migrate_with_a_column_to_drop`] prepared, with `admin`
/// connected to it and `c` to a
/// server on it: rounds of every call on fresh keys before the change and
/// after each of its steps. `gone` is dropped (a value then has a field
/// fewer than the connections know); a column is added (as many fields as
/// they know, the last of another type, and one more than the store last
/// looked up); then the functions that return `SETOF idempotency_keys`
/// are replaced, as a migration of the next release does, so that a
/// statement prepared before is planned again with the added column.
pub async fn the_table_changed_under(
    admin: &tokio_postgres::Client,
    c: &CoordinatorClient<Channel>,
) {
    keys_through_every_call(c, "before").await;
    admin
        .batch_execute("ALTER TABLE idempotency_keys DROP COLUMN gone")
        .await
        .unwrap();
    keys_through_every_call(c, "dropped").await;
    admin
        .batch_execute("ALTER TABLE idempotency_keys ADD COLUMN operator_note text DEFAULT 'n'")
        .await
        .unwrap();
    keys_through_every_call(c, "added").await;
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
    keys_through_every_call(c, "replaced").await;
}

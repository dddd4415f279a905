//! Migrating a Citus coordinator: the table distributed by key, the
//! single-key functions delegated by their key and the batches' routed
//! forms by their routing key, and all kept so by later migrations.

use idempotency_coordinator::store::migrate;

use crate::harness::CitusDatabase;

/// (function, distribution argument index, colocated with the table) of
/// every distributed function with a distribution argument.
async fn delegated(client: &tokio_postgres::Client) -> Vec<(String, i32, bool)> {
    client
        .query(
            "SELECT p.proname::text, o.distribution_argument_index,
                    o.colocationid = (SELECT colocationid FROM pg_dist_partition
                                       WHERE logicalrelid = 'idempotency_keys'::regclass)
               FROM pg_dist_object o JOIN pg_proc p ON p.oid = o.objid
              WHERE o.classid = 'pg_proc'::regclass
                AND o.distribution_argument_index IS NOT NULL
              ORDER BY 1",
            &[],
        )
        .await
        .expect("read pg_dist_object")
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect()
}

/// The single-key functions by `p_key` (argument 2), the batches' routed
/// forms by `p_route` (argument 0).
fn expected() -> Vec<(String, i32, bool)> {
    [
        ("idempotency_acquire", 2),
        ("idempotency_acquire_batch_at", 0),
        ("idempotency_admin_act", 2),
        ("idempotency_admin_delete", 2),
        ("idempotency_call_batch_at", 0),
        ("idempotency_complete", 2),
        ("idempotency_complete_batch_at", 0),
        ("idempotency_extend_lease", 2),
        ("idempotency_get", 2),
        ("idempotency_watch", 2),
    ]
    .map(|(f, arg)| (f.to_owned(), arg, true))
    .to_vec()
}

async fn distribution(client: &tokio_postgres::Client) -> Option<(String, String)> {
    client
        .query_opt(
            "SELECT partmethod::text, column_to_column_name(logicalrelid, partkey)
               FROM pg_dist_partition WHERE logicalrelid = 'idempotency_keys'::regclass",
            &[],
        )
        .await
        .expect("read pg_dist_partition")
        .map(|r| (r.get(0), r.get(1)))
}

#[tokio::test]
async fn migrating_distributes_the_table_and_delegates_the_single_key_functions() {
    let Some(db) = CitusDatabase::create().await else {
        return;
    };
    let mut client = db.connect().await;
    let applied = migrate::migrate(&mut client).await.expect("migrate");
    assert_eq!(applied.migrations.len(), migrate::MIGRATIONS.len());
    assert_eq!(
        distribution(&client).await,
        Some(("h".to_owned(), "idempotency_key".to_owned()))
    );
    assert_eq!(delegated(&client).await, expected());

    assert!(migrate::migrate(&mut client).await.unwrap().is_empty());
    assert_eq!(delegated(&client).await, expected());
}

#[tokio::test]
async fn function_files_applied_again_stay_delegated() {
    let Some(db) = CitusDatabase::create().await else {
        return;
    };
    let mut client = db.connect().await;
    migrate::migrate(&mut client).await.expect("migrate");
    // An older build's files, as far as the bookkeeping knows; one of its
    // functions dropped, as a file that changes a signature does.
    client
        .batch_execute(
            "UPDATE idempotency_schema_functions SET checksum = 'older';
             DROP FUNCTION idempotency_get(text, text, text, bigint);",
        )
        .await
        .unwrap();
    let applied = migrate::migrate(&mut client).await.expect("migrate again");
    assert_eq!(applied.functions.len(), migrate::FUNCTIONS.len());
    assert_eq!(delegated(&client).await, expected());
    assert_eq!(
        distribution(&client).await,
        Some(("h".to_owned(), "idempotency_key".to_owned()))
    );
}

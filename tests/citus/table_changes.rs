//! The records table changed on a Citus cluster while a server runs on it:
//! `ALTER TABLE` on the coordinator node changes every shard on the
//! workers. The server's connections prepared their statements and learnt
//! the row type before: on the worker holding each key (calls go straight
//! there), or on the coordinator node, which passes a worker's error on
//! (`--citus-via-coordinator`). Every call must go on answering, as on one
//! PostgreSQL (`tests/api/table_changes.rs`).

use idempotency_coordinator::config::ServeConfig;
use idempotency_coordinator::store::migrate;

use crate::app::server_on;
use crate::harness::CitusDatabase;
use crate::helpers::*;

#[tokio::test]
async fn columns_dropped_and_added_on_the_cluster_while_the_server_runs_change_no_answer() {
    columns_dropped_and_added(|_| {}).await;
}

#[tokio::test]
async fn through_the_coordinator_node_too() {
    columns_dropped_and_added(|c| c.store.citus_direct = false).await;
}

/// A column dropped, then one added, on a fresh database, with the server
/// configured by `configure` running cycles on every key before and after.
async fn columns_dropped_and_added(configure: impl FnOnce(&mut ServeConfig)) {
    let Some(db) = CitusDatabase::create().await else {
        return;
    };
    let admin = db.connect().await;
    let mut migrating = db.connect().await;
    migrate::migrate(&mut migrating).await.unwrap();
    admin
        .batch_execute("ALTER TABLE idempotency_keys ADD COLUMN gone integer")
        .await
        .unwrap();
    let server = server_on(&db, configure).await;
    let c = server.client.clone();
    keys_through_every_call(&c, "before").await;

    admin
        .batch_execute("ALTER TABLE idempotency_keys DROP COLUMN gone")
        .await
        .unwrap();
    keys_through_every_call(&c, "dropped").await;

    admin
        .batch_execute("ALTER TABLE idempotency_keys ADD COLUMN operator_note text DEFAULT 'n'")
        .await
        .unwrap();
    keys_through_every_call(&c, "added").await;

    // A migration of the next release replaces the functions that return
    // `SETOF idempotency_keys` (on the coordinator node, which propagates
    // them to the workers).
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
    keys_through_every_call(&c, "replaced").await;
    server.stop().await;
}

//! The records table changed on a Citus cluster while a server runs on it:
//! `ALTER TABLE` on the coordinator node changes every shard on the
//! workers. The server's connections prepared their statements and learnt
//! the row type before: on the worker holding each key (calls go straight
//! there), or on the coordinator node, which passes a worker's error on
//! (`--citus-via-coordinator`). Every call must go on answering, as on one
//! PostgreSQL (`tests/api/table_changes.rs`).

use idempotency_coordinator::config::ServeConfig;

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

/// The table changed under a server configured by `configure`, on a fresh
/// database (`the_table_changed_under`); `ALTER TABLE` and the replaced
/// functions go to the coordinator node, which propagates them.
async fn columns_dropped_and_added(configure: impl FnOnce(&mut ServeConfig)) {
    let Some(db) = CitusDatabase::create().await else {
        return;
    };
    let mut admin = db.connect().await;
    migrate_with_a_column_to_drop(&mut admin).await;
    let server = server_on(&db, configure).await;
    the_table_changed_under(&admin, &server.client).await;
    server.stop().await;
}

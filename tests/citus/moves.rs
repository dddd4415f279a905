//! A call that waits out a shard move. Citus blocks writes to a shard
//! while it moves, not reads: a function can read (and lock) its row on
//! the old placement, wait with its write, and write on the new one once
//! the move commits, under a snapshot taken before the move's copy did.
//! There the write must find the version it read, or write nothing and
//! ask for a retry; never answer a decision it did not store
//! (`idempotency_changed_meanwhile`, for the statements on the distributed
//! table). The routed batch takes the lock Citus's writes take on its
//! shards' metadata before it reads anything, so it waits for the whole
//! move instead, and decides on the row where the move left it.
//!
//! Citus's own hook for its isolation tests holds the move between
//! blocking writes and copying the shard
//! (`citus.running_under_citus_test_suite`: the move takes a share lock on
//! advisory lock (55152, 44000) there), so the call's write is sure to
//! wait for the move.

use std::time::Duration;

use tokio::task::JoinHandle;

use crate::app::spawn_citus_app;
use crate::harness::CitusDatabase;
use crate::helpers::{eventually, waiting_on};
use crate::placement::place;

/// A move of `shard` from `from` to `to` blocking writes, held after it
/// blocks them and before it copies: the gate's session holds the lock the
/// move waits for there, until it is unlocked.
async fn held_move(
    db: &CitusDatabase,
    shard: i64,
    from: u16,
    to: u16,
) -> (
    tokio_postgres::Client,
    JoinHandle<Result<u64, tokio_postgres::Error>>,
) {
    let gate = db.connect().await;
    gate.execute("SELECT pg_advisory_lock(55152, 44000)", &[])
        .await
        .unwrap();
    let mover = db.connect().await;
    mover
        .batch_execute("SET citus.running_under_citus_test_suite = on")
        .await
        .unwrap();
    let moving = tokio::spawn(async move {
        mover
            .execute(
                "SELECT citus_move_shard_placement($1, '127.0.0.1', $2, '127.0.0.1', $3, \
                 shard_transfer_mode := 'block_writes')",
                &[&shard, &i32::from(from), &i32::from(to)],
            )
            .await
    });
    eventually(
        "the move to wait before its copy",
        Duration::from_secs(20),
        || async { (waiting_on(&gate, "advisory").await > 0).then_some(()) },
    )
    .await;
    (gate, moving)
}

#[tokio::test]
async fn a_batch_whose_shard_moves_to_its_node_waits_for_the_move_and_decides_on_the_moved_row() {
    let Some(app) = spawn_citus_app().await else {
        return;
    };
    let db = &app.db;
    let (key, shard, from) = place(db, 1).await.remove(0);
    let [a, b] = db.cluster.workers();
    let to = if from == a { b } else { a };
    let coordinator = db.connect().await;
    let token: uuid::Uuid = coordinator
        .query_one(
            "SELECT (a.rec).lease_token FROM idempotency_acquire('t', 's', $1, '', '', \
             60000, 3, 86400000, 0, 0) a",
            &[&key],
        )
        .await
        .expect("acquire")
        .get(0);

    // The move, held after it blocks writes, before it copies.
    let (gate, moving) = held_move(db, shard, from, to).await;

    // A batch holding the Complete (a failure: it runs
    // idempotency_complete), routed by a key of the node the shard moves
    // to, as a server whose map predates an earlier move sends it: it runs
    // there, and waits for the move.
    let route = place(db, 64)
        .await
        .into_iter()
        .find(|(_, s, port)| *port == to && *s != shard)
        .map(|(k, _, _)| k)
        .expect("a key on the other worker");
    let node = db.connect_worker(to).await;
    let watcher = db.connect_worker(to).await;
    let batch_key = key.clone();
    let completing = tokio::spawn(async move {
        node.query_opt(
            "SELECT b.outcome, (b.rec).status FROM idempotency_call_batch_at($1, \
             ARRAY[false], ARRAY['t'], ARRAY['s'], ARRAY[$2::text], ARRAY[''], ARRAY[''], \
             ARRAY[0::bigint], ARRAY[0], ARRAY[0::bigint], ARRAY[0::bigint], ARRAY[$3::uuid], \
             ARRAY['FAILURE'], ARRAY[NULL::bytea], ARRAY[''], ARRAY[0], \
             ARRAY[''], ARRAY['it broke'], ARRAY[false], ARRAY[NULL::bigint], ARRAY[1000::bigint], \
             ARRAY[60000::bigint], 0, NULL) b",
            &[&route, &batch_key, &token],
        )
        .await
    });
    eventually(
        "the batch to wait for the move",
        Duration::from_secs(20),
        || async { (waiting_on(&watcher, "advisory").await > 0).then_some(()) },
    )
    .await;
    gate.execute("SELECT pg_advisory_unlock(55152, 44000)", &[])
        .await
        .unwrap();
    moving.await.unwrap().expect("the move");

    // The batch took the shard's metadata lock before it read anything
    // (`idempotency_local_shards`), so it waited for the whole move and
    // then found the shard on its own node: it decides on the moved row,
    // and what it answers is what it stored.
    let row = completing
        .await
        .unwrap()
        .expect("the batch after the move")
        .expect("the Complete's row");
    let (outcome, answered): (String, String) = (row.get(0), row.get(1));
    assert_eq!(outcome, "OK", "the Complete is applied after the move");
    let stored: String = coordinator
        .query_one(
            "SELECT status FROM idempotency_keys \
             WHERE tenant = 't' AND scope = 's' AND idempotency_key = $1",
            &[&key],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(answered, stored, "the answer is the record stored");
    assert_eq!(stored, "FAILED");
}

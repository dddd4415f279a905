//! Group commit on Citus: Acquires and Completes that reach the server
//! together are split by the node holding each key, and each node's share
//! runs as one statement, one transaction, on that node.

use std::collections::{BTreeMap, BTreeSet};

use idempotency_coordinator::proto::{self, Decision, Status};
use tokio::task::JoinHandle;

use crate::app::{CitusApp, spawn_citus_app_with};
use crate::harness::CitusDatabase;
use crate::helpers::*;
use crate::placement::{group_of, range_of_group, worker_of, writers};

/// A server with one shared connection, so one batch worker per kind: calls
/// that arrive while it is busy queue and go out together.
async fn batching_app() -> Option<CitusApp> {
    spawn_citus_app_with(|c| {
        c.store.shared_connections = 1;
        c.store.batch_workers = Some(1);
    })
    .await
}

/// Sends `reqs` at once over a few connections; their answers in order.
async fn acquire_all(
    app: &CitusApp,
    reqs: Vec<proto::AcquireRequest>,
) -> Vec<proto::AcquireResponse> {
    let clients = clients(app.addr, 8).await;
    let calls: Vec<JoinHandle<_>> = reqs
        .into_iter()
        .enumerate()
        .map(|(i, req)| {
            let mut c = clients[i % clients.len()].clone();
            tokio::spawn(async move { c.acquire(req).await })
        })
        .collect();
    let mut answers = Vec::new();
    for call in calls {
        answers.push(call.await.unwrap().expect("acquire").into_inner());
    }
    answers
}

/// Whether some transaction wrote keys of more than one shard: a batch
/// split by node, not by shard, that committed once on its node.
async fn one_commit_spanned_shards(db: &CitusDatabase, keys: &[String]) -> bool {
    let writers = writers(db).await;
    let client = db.connect().await;
    let mut shards: BTreeMap<(u16, String), BTreeSet<i64>> = BTreeMap::new();
    for key in keys {
        let shard: i64 = client
            .query_one(
                "SELECT get_shard_id_for_distribution_column('idempotency_keys', $1::text)",
                &[key],
            )
            .await
            .unwrap()
            .get(0);
        shards
            .entry(writers[key].clone())
            .or_default()
            .insert(shard);
    }
    shards.values().any(|shards| shards.len() > 1)
}

#[tokio::test]
async fn acquires_that_arrive_together_share_one_commit_per_node_and_each_get_their_own_answer() {
    let Some(app) = batching_app().await else {
        return;
    };
    let mut shared = false;
    for wave in 0..5 {
        let keys: Vec<String> = (0..64).map(|i| format!("batch-{wave}-{i}")).collect();
        let answers = acquire_all(&app, keys.iter().map(|k| acquire("s", k)).collect()).await;
        for (key, answer) in keys.iter().zip(&answers) {
            assert_eq!(decision(answer), Decision::Proceed, "{key}");
            let record = answer.record.as_ref().unwrap();
            assert_eq!(record.key, *key);
            // Decided on the key's own worker: its token is from that
            // node's range.
            let worker = worker_of(&app.db, key).await;
            let range = range_of_group(group_of(&app.db, worker).await);
            let token = answer.lease.as_ref().unwrap().fencing_token;
            assert!(
                range.contains(&token),
                "{key}: token {token} of worker {worker}"
            );
        }
        if one_commit_spanned_shards(&app.db, &keys).await {
            shared = true;
            break;
        }
    }
    assert!(shared, "no two keys of different shards shared a commit");
}

/// Completes `keys` (leased by `leases`) with their own key as the result,
/// all at once; each answer says SUCCEEDED.
async fn complete_all(app: &CitusApp, keys: &[String], leases: &[proto::AcquireResponse]) {
    let clients = clients(app.addr, 8).await;
    let calls: Vec<JoinHandle<_>> = keys
        .iter()
        .zip(leases)
        .enumerate()
        .map(|(i, (key, lease))| {
            let mut c = clients[i % clients.len()].clone();
            let req = complete("s", key, &token(lease), success(key.as_bytes()));
            tokio::spawn(async move { c.complete(req).await })
        })
        .collect();
    for call in calls {
        let done = call.await.unwrap().expect("complete").into_inner();
        assert_eq!(status_of(done.record.as_ref().unwrap()), Status::Succeeded);
    }
}

#[tokio::test]
async fn completes_that_arrive_together_share_one_commit_per_node_and_replay_each_result() {
    let Some(app) = batching_app().await else {
        return;
    };
    let mut shared = false;
    for wave in 0..5 {
        let keys: Vec<String> = (0..48).map(|i| format!("done-{wave}-{i}")).collect();
        let leases = acquire_all(&app, keys.iter().map(|k| acquire("s", k)).collect()).await;
        complete_all(&app, &keys, &leases).await;
        let replays = acquire_all(&app, keys.iter().map(|k| acquire("s", k)).collect()).await;
        for (key, replay) in keys.iter().zip(&replays) {
            assert_eq!(decision(replay), Decision::AlreadyDone, "{key}");
            let result = replay.record.as_ref().unwrap().result.as_ref().unwrap();
            assert_eq!(result.result, key.as_bytes());
        }
        // The rows' last writers are now the Completes' transactions.
        if one_commit_spanned_shards(&app.db, &keys).await {
            shared = true;
            break;
        }
    }
    assert!(
        shared,
        "no two Completes of different shards shared a commit"
    );
}

#[tokio::test]
async fn many_callers_racing_on_a_few_keys_get_exactly_one_lease_each() {
    let Some(app) = batching_app().await else {
        return;
    };
    let keys: Vec<String> = (0..4).map(|i| format!("raced-{i}")).collect();
    let reqs = (0..96)
        .map(|i| acquire("s", &keys[i % keys.len()]))
        .collect();
    let answers = acquire_all(&app, reqs).await;
    let mut proceeds: BTreeMap<&str, usize> = BTreeMap::new();
    for (i, answer) in answers.iter().enumerate() {
        let key = keys[i % keys.len()].as_str();
        match decision(answer) {
            Decision::Proceed => *proceeds.entry(key).or_default() += 1,
            Decision::InProgress => {}
            other => panic!("{key}: {other:?}"),
        }
    }
    let expected: BTreeMap<&str, usize> = keys.iter().map(|k| (k.as_str(), 1)).collect();
    assert_eq!(proceeds, expected);
}

#[tokio::test]
async fn batches_split_by_a_stale_map_still_get_the_right_answers() {
    let Some(app) = batching_app().await else {
        return;
    };
    // The server has read its map; one shard then moves to the other worker.
    let keys: Vec<String> = (0..64).map(|i| format!("moved-{i}")).collect();
    let from = worker_of(&app.db, &keys[0]).await;
    let [w1, w2] = app.db.cluster.workers();
    let to = if from == w1 { w2 } else { w1 };
    let coordinator = app.db.connect().await;
    coordinator
        .execute(
            "SELECT citus_move_shard_placement(
                 get_shard_id_for_distribution_column('idempotency_keys', $1::text),
                 '127.0.0.1', $2, '127.0.0.1', $3, shard_transfer_mode := 'block_writes')",
            &[&keys[0], &i32::from(from), &i32::from(to)],
        )
        .await
        .expect("move the shard");
    assert_eq!(worker_of(&app.db, &keys[0]).await, to);

    let answers = acquire_all(&app, keys.iter().map(|k| acquire("s", k)).collect()).await;
    for (key, answer) in keys.iter().zip(&answers) {
        assert_eq!(decision(answer), Decision::Proceed, "{key}");
        assert_eq!(answer.record.as_ref().unwrap().key, *key);
    }
    let again = acquire_all(&app, keys.iter().map(|k| acquire("s", k)).collect()).await;
    for (key, answer) in keys.iter().zip(&again) {
        assert_eq!(decision(answer), Decision::InProgress, "{key}");
    }
    let writers = writers(&app.db).await;
    assert_eq!(writers[&keys[0]].0, to, "the row is where its shard is now");
}

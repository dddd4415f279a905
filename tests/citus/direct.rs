//! Calls straight to the workers: unless told to go through the coordinator
//! node (`--citus-via-coordinator`), the server sends each call, and each
//! node's share of a batch, to the worker holding its keys, so the
//! coordinator node takes no part in them. Shown by stopping it: every call
//! still answers, alone or in a batch, while a server that goes through it
//! answers UNAVAILABLE.

use idempotency_coordinator::proto::{Decision, Status};
use tonic::Code;

use crate::app::server_on;
use crate::harness::{CitusDatabase, private_cluster};
use crate::helpers::*;
use crate::placement::keys_by_node;

/// A cycle on `key` through `app`: a new lease, then its success.
async fn cycle(app: &TestServer, key: &str) {
    let mut c = app.client.clone();
    let lease = proceed(&mut c, acquire("s", key)).await;
    let done = complete_ok(&mut c, complete("s", key, &token(&lease), success(b"ok"))).await;
    assert_eq!(status_of(&done), Status::Succeeded, "{key}");
}

#[tokio::test]
async fn calls_answer_from_the_workers_while_the_coordinator_node_is_down() {
    let Some(cluster) = private_cluster() else {
        return;
    };
    let db = CitusDatabase::create_on(cluster.clone()).await;
    let alone = server_on(&db, |c| c.store.batch_size = 1).await;
    let batched = server_on(&db, |c| {
        c.store.shared_connections = 1;
        c.store.batch_workers = Some(1);
    })
    .await;
    let via = server_on(&db, |c| c.store.citus_direct = false).await;
    // Keys of the two workers in turn.
    let [first, second]: [Vec<String>; 2] = keys_by_node(&db, 80)
        .await
        .into_values()
        .collect::<Vec<_>>()
        .try_into()
        .expect("keys on both workers");
    let keys: Vec<String> = first
        .into_iter()
        .zip(second)
        .flat_map(|(a, b)| [a, b])
        .take(40)
        .collect();
    // Each server has read the map of shards and used every node.
    for (i, key) in keys.iter().enumerate().take(20) {
        let app = [&alone, &batched, &via][i % 3];
        cycle(app, key).await;
    }

    cluster.stop_node(cluster.coordinator());

    for key in &keys[20..30] {
        cycle(&alone, key).await;
    }
    // Calls that arrive together: one statement per worker.
    let calls: Vec<_> = keys[30..]
        .iter()
        .map(|key| {
            let mut c = batched.client.clone();
            let req = acquire("s", key);
            tokio::spawn(async move { c.acquire(req).await })
        })
        .collect();
    for call in calls {
        let answer = call.await.unwrap().expect("acquire").into_inner();
        assert_eq!(decision(&answer), Decision::Proceed);
    }
    let mut c = via.client.clone();
    let refused = c
        .acquire(acquire("s", "through-the-coordinator"))
        .await
        .expect_err("the coordinator node is down");
    assert_eq!(refused.code(), Code::Unavailable, "{refused:?}");

    cluster.start_node(cluster.coordinator());
}

//! Shards moving under load: one shard moved to the other worker
//! (`citus_move_shard_placement`), and a third worker added and the shards
//! rebalanced onto it (`citus_add_node`, `citus_rebalance_start`). Calls
//! keep answering (a call a move blocks past its deadline answers
//! DEADLINE_EXCEEDED or UNAVAILABLE and is retried), keys answer from
//! their new node, and the history stays clean.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use idempotency_bench::history::Call;
use idempotency_bench::recorder::now_us;
use tonic_health::pb::health_check_response::ServingStatus;

use crate::client::Health;
use crate::listening::{self, HEARD_WITHIN};
use crate::load::{self, Load, codes, secs, went_to_database};
use crate::placement::{self, group_of, node_of_shard, range_of_group};
use crate::setup::{Env, serial};
use crate::worker_down::{READINESS, node_service, readiness};

/// Whether `c` is a PROCEED on one of `keys` that started after `since`,
/// with a fencing token drawn by node group `group`: a lease granted on
/// that group's node.
fn granted_by(c: &Call, keys: &HashSet<String>, since: i64, group: u64) -> bool {
    keys.contains(&c.key)
        && c.start_us >= since
        && went_to_database(c)
        && c.lease
            .as_ref()
            .is_some_and(|l| range_of_group(group).contains(&l.fencing_token))
}

/// Moves `shard` from the worker on `from` to the one on `to`, online
/// (logical replication) where the nodes allow it, else blocking writes to
/// it meanwhile; returns the transfer mode that worked.
async fn move_shard(env: &Env, shard: i64, from: u16, to: u16) -> &'static str {
    let coordinator = env.db.connect().await;
    for mode in ["force_logical", "block_writes"] {
        let moved = coordinator
            .execute(
                "SELECT citus_move_shard_placement($1, '127.0.0.1', $2, '127.0.0.1', $3, \
                 shard_transfer_mode := $4::text::citus.shard_transfer_mode)",
                &[&shard, &i32::from(from), &i32::from(to), &mode],
            )
            .await;
        match moved {
            Ok(_) => return mode,
            Err(e) => println!(
                "SHARD MOVE: {mode} refused: {}",
                e.as_db_error()
                    .map_or(e.to_string(), |d| d.message().to_string())
            ),
        }
    }
    panic!("no transfer mode moved the shard");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shard_moved_under_load_keeps_its_keys_answering() {
    let _serial = serial().await;
    let Some(env) = Env::start().await else {
        return;
    };
    let [from, to] = env.db.cluster.workers();
    // The keys of one shard on the first worker, and others on the second.
    let placed = placement::place(&env.db, 3000).await;
    let shard = placed.iter().find(|(_, _, port)| *port == from).unwrap().1;
    let moving: Vec<String> = placed
        .iter()
        .filter(|(_, s, _)| *s == shard)
        .map(|(k, _, _)| k.clone())
        .collect();
    let staying: Vec<String> = placed
        .iter()
        .filter(|(_, _, port)| *port == to)
        .map(|(k, _, _)| k.clone())
        .collect();
    let moving_keys: HashSet<String> = moving.iter().cloned().collect();
    let load = Load::start(env.addr, &[moving, staying], 3).await;
    let t0 = now_us();
    load.until(
        Duration::from_secs(10),
        "the shard's keys answer",
        |calls| {
            calls
                .iter()
                .any(|c| moving_keys.contains(&c.key) && went_to_database(c))
        },
    )
    .await;

    let move_start = now_us();
    let took = Instant::now();
    let mode = move_shard(&env, shard, from, to).await;
    let move_end = now_us();
    println!(
        "SHARD MOVE: citus_move_shard_placement ({mode}) took {:?}",
        took.elapsed()
    );
    assert_eq!(node_of_shard(&env.db, shard).await, to, "the shard moved");
    let group = group_of(&env.db, to).await;
    load.until(
        Duration::from_secs(10),
        "the moved shard's keys answer from their new worker",
        |calls| {
            calls
                .iter()
                .any(|c| granted_by(c, &moving_keys, move_end, group))
        },
    )
    .await;
    let history = load.stop(&env.db).await;
    let calls = load::calls(&history);
    println!(
        "SHARD MOVE: the moved shard's keys during the move ({:.2} s): {}",
        secs(move_start, move_end),
        codes(&calls, &moving_keys, move_start, move_end)
    );
    println!(
        "SHARD MOVE: after the move: {}",
        codes(&calls, &moving_keys, move_end, i64::MAX)
    );
    load::assert_calls_answered(&calls, t0);
    load::assert_history_clean(&history);
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_added_and_the_shards_rebalanced_under_load() {
    let _serial = serial().await;
    let Some(env) = Env::start().await else {
        return;
    };
    let keys: Vec<String> = placement::place(&env.db, 600)
        .await
        .into_iter()
        .map(|(k, _, _)| k)
        .collect();
    let (first, second) = keys.split_at(keys.len() / 2);
    let load = Load::start(env.addr, &[first.to_vec(), second.to_vec()], 3).await;
    let t0 = now_us();
    load.until(Duration::from_secs(10), "calls answer", |calls| {
        calls.iter().filter(|c| went_to_database(c)).count() >= 5
    })
    .await;

    let added_at = now_us();
    let port = env.on_cluster(|c| c.start_extra_node()).await;
    env.db.add_worker(port).await;
    let rebalance_start = now_us();
    let took = Instant::now();
    let coordinator = env.db.connect().await;
    // Two statements: the job must be committed before its tasks run.
    coordinator
        .execute(
            "SELECT citus_rebalance_start(shard_transfer_mode := 'block_writes')",
            &[],
        )
        .await
        .expect("start the rebalance");
    coordinator
        .execute("SELECT citus_rebalance_wait()", &[])
        .await
        .expect("the rebalance");
    let rebalance_end = now_us();
    println!(
        "REBALANCE: adding the node took {:.2} s, the rebalance {:?}",
        secs(added_at, rebalance_start),
        took.elapsed()
    );
    let moved: HashSet<String> = placement::placements(&env.db, &keys)
        .await
        .into_iter()
        .filter(|(_, _, p)| *p == port)
        .map(|(k, _, _)| k)
        .collect();
    assert!(!moved.is_empty(), "no key lives on the new worker");
    println!(
        "REBALANCE: {} of {} keys live on the new worker",
        moved.len(),
        keys.len()
    );
    let group = group_of(&env.db, port).await;
    load.until(
        Duration::from_secs(15),
        "keys on the new worker answer from there",
        |calls| {
            calls
                .iter()
                .any(|c| granted_by(c, &moved, rebalance_end, group))
        },
    )
    .await;
    let history = load.stop(&env.db).await;
    let calls = load::calls(&history);
    let all: HashSet<String> = keys.iter().cloned().collect();
    println!(
        "REBALANCE: calls while the node was added and the shards moved ({:.2} s): {}",
        secs(added_at, rebalance_end),
        codes(&calls, &all, added_at, rebalance_end)
    );
    println!(
        "REBALANCE: after, keys on the new worker: {}",
        codes(&calls, &moved, rebalance_end, i64::MAX)
    );
    load::assert_calls_answered(&calls, t0);
    load::assert_history_clean(&history);
    waiting_on_the_new_worker(&env, port).await;
    env.stop().await;
}

/// A waiter on a key of the node added is woken by its holder's Complete:
/// the listener follows the cluster's metadata and listens on a node
/// within about an interval of its being added, without a restart and
/// without readiness falling.
async fn waiting_on_the_new_worker(env: &Env, new: u16) {
    let fresh = placement::place(&env.db, 200).await;
    let key = fresh
        .into_iter()
        .find(|(_, _, p)| *p == new)
        .map(|(k, _, _)| k)
        .expect("a fresh key on the new worker");
    listening::until_listening_on(env, new, Duration::from_secs(10)).await;
    let mut health = Health::connect(env.addr).await;
    readiness(&mut health, READINESS, ServingStatus::Serving).await;
    readiness(&mut health, &node_service(new), ServingStatus::Serving).await;
    let after = listening::waiter_answers_after(env, &key).await;
    println!(
        "REBALANCE: a waiter on a key of the new worker answered {after:?} after its holder's \
         Complete"
    );
    assert!(
        after < HEARD_WITHIN,
        "the waiter did not hear the Complete on the new worker ({after:?})"
    );
}

//! The per-call path on a worker runs on cached plans. Citus plans a
//! statement of a distributed table, then plans it again for the shard it
//! lands on. For a statement on one shard with no volatile call inside, it
//! keeps that shard's plan with PostgreSQL's cached plan of the statement,
//! and each later run in the same session reuses both; any other statement
//! is deparsed for its shard, parsed and planned anew every time it runs.
//! Every statement of the delegated single calls is of the first kind; the
//! routed batch runs its statements on the shard's own table, prepared once
//! per session (`sql/citus/batch_routes.sql`). So once a session has run
//! them a worker plans nothing per call.
//!
//! Told from the worker's own `pg_stat_statements` (the harness tracks
//! nested statements and their planning), over 50 cycles on the keys of
//! one shard, after as many to warm up the sessions, the statistics reset
//! in between:
//! - `plans` of a function's statement counts PostgreSQL planning it
//!   (through Citus's planner, or of a prepared shard statement): none;
//! - a shard plan made from text (the statement deparsed for the shard with
//!   its values, parsed again: what Citus does when it cannot use a cached
//!   plan) is entered under that text, which names the shard's table
//!   (`idempotency_keys_<shard id>`), when it is parsed; a cached shard
//!   plan is parsed once per session, so after the reset its runs are
//!   entered by the executor alone, under the placeholder text Citus gives
//!   them. No statement naming the shard may run but the batch's own
//!   prepared ones (`idempotency_keys_<shard id> AS k`).
//!
//! Per call would be one plan per run, in every round; the test allows a
//! tenth of that, and takes the best of a few rounds, for the sessions whose
//! caches other tests' catalog changes reset ([`ROUNDS`]).

use std::collections::HashMap;

use idempotency_coordinator::proto::Status;
use idempotency_coordinator::proto::coordinator_client::CoordinatorClient;
use tonic::transport::Channel;

use crate::app::server_on;
use crate::harness::CitusDatabase;
use crate::helpers::*;
use crate::placement::place;

/// Cycles measured in a round, half alone and half in batches; each server
/// runs as many before (so that each session it opened has run each
/// statement on the shard past PostgreSQL's five custom plans).
const CYCLES: usize = 50;

/// A cycle on `key` through a server's client: a new lease, then its
/// success.
async fn cycle(mut c: CoordinatorClient<Channel>, key: &str) {
    let lease = proceed(&mut c, acquire("s", key)).await;
    let done = complete_ok(&mut c, complete("s", key, &token(&lease), success(b"ok"))).await;
    assert_eq!(status_of(&done), Status::Succeeded, "{key}");
}

/// `keys` cycled through `app`, `lanes` at a time (calls that arrive
/// together ride in one batch).
async fn cycles(app: &TestServer, keys: &[String], lanes: usize) {
    for chunk in keys.chunks(lanes) {
        let runs: Vec<_> = chunk
            .iter()
            .map(|key| {
                let client = app.client.clone();
                let key = key.clone();
                tokio::spawn(async move { cycle(client, &key).await })
            })
            .collect();
        for run in runs {
            run.await.expect("cycle");
        }
    }
}

/// The statements of our functions on the table, as `pg_stat_statements`
/// enters them: the distributed table's (`idempotency_keys k`, Citus's path)
/// and the routed batch's on the shard's own table
/// (`idempotency_keys_<shard id> AS k`, prepared once per session by
/// `idempotency_shard_statements`). Citus's deparsed shard statements name
/// the shard qualified and without `AS`.
const OURS: &str = "'(idempotency_keys|idempotency_keys_[0-9]+ AS) k\\M'";

/// The worker's counts for this database: (runs and plans of the
/// statements of our functions on `idempotency_keys`, runs of statements
/// naming a shard).
async fn counts(worker: &tokio_postgres::Client) -> (i64, i64, i64) {
    let row = worker
        .query_one(
            "SELECT coalesce(sum(calls) FILTER (WHERE query ~ OURS), 0)::bigint,
                    coalesce(sum(plans) FILTER (WHERE query ~ OURS), 0)::bigint,
                    coalesce(sum(calls) FILTER (WHERE query ~ 'idempotency_keys_[0-9]+'
                                                AND query !~ OURS), 0)::bigint
               FROM pg_stat_statements
              WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())"
                .replace("OURS", OURS)
                .as_str(),
            &[],
        )
        .await
        .expect("read pg_stat_statements");
    (row.get(0), row.get(1), row.get(2))
}

/// What the worker's statistics say, for the failure message.
async fn dump(worker: &tokio_postgres::Client) -> String {
    worker
        .query(
            "SELECT calls, plans, left(regexp_replace(query, '\\s+', ' ', 'g'), 120)
               FROM pg_stat_statements
              WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
              ORDER BY calls DESC LIMIT 25",
            &[],
        )
        .await
        .expect("read pg_stat_statements")
        .iter()
        .map(|r| {
            let (calls, plans, query): (i64, i64, String) = (r.get(0), r.get(1), r.get(2));
            format!("{calls:>6} {plans:>6} {query}\n")
        })
        .collect()
}

#[tokio::test]
async fn a_worker_plans_nothing_per_call_once_its_sessions_have_run() {
    let Some(db) = CitusDatabase::create().await else {
        return;
    };
    let alone = server_on(&db, |c| c.store.batch_size = 1).await;
    let batched = server_on(&db, |c| {
        c.store.shared_connections = 1;
        c.store.batch_workers = Some(1);
    })
    .await;
    // Keys of one shard: the one most of ten thousand keys fall in.
    let mut by_shard: HashMap<i64, (u16, Vec<String>)> = HashMap::new();
    for (key, shard, port) in place(&db, 10_000).await {
        by_shard
            .entry(shard)
            .or_insert((port, Vec::new()))
            .1
            .push(key);
    }
    let (port, keys) = by_shard
        .into_values()
        .max_by_key(|(_, keys)| keys.len())
        .expect("placed keys");
    assert!(
        keys.len() >= (1 + ROUNDS) * CYCLES,
        "{} keys in the shard",
        keys.len()
    );
    // Created on the coordinator node, which creates it on every node.
    db.connect()
        .await
        .batch_execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        .await
        .expect("pg_stat_statements on every node");
    let worker = db.connect_worker(port).await;

    let half = CYCLES / 2;
    let mut rounds = keys.chunks_exact(CYCLES);
    let warm_up = rounds.next().expect("keys to warm up");
    cycles(&alone, &warm_up[..half], 1).await;
    cycles(&batched, &warm_up[half..], 5).await;
    let mut disturbed = Vec::new();
    for measured in rounds.take(ROUNDS) {
        worker
            .execute("SELECT pg_stat_statements_reset()", &[])
            .await
            .expect("reset pg_stat_statements");
        cycles(&alone, &measured[..half], 1).await;
        cycles(&batched, &measured[half..], 5).await;
        let (calls, plans, shard_calls) = counts(&worker).await;
        let seen = dump(&worker).await;
        // Each cycle runs at least two statements on the table entered
        // under their own text (alone: the read and the locked read before
        // the success; batched: the shard's INSERT and success).
        assert!(
            calls >= 2 * CYCLES as i64,
            "the worker's statistics saw {calls} statements of {CYCLES} cycles:\n{seen}"
        );
        // Planned per call would be one plan per run, in every round.
        if plans * PER_CALL_IF_OVER <= calls && shard_calls * PER_CALL_IF_OVER <= calls {
            return;
        }
        eprintln!(
            "a round of {CYCLES} cycles: {plans} plans and {shard_calls} shard statements \
             planned from text in {calls} runs:\n{seen}"
        );
        disturbed.push((calls, plans, shard_calls));
    }
    panic!(
        "planned per call in every round (runs, plans, shard statements planned from text): \
         {disturbed:?}; each round's statistics are above"
    );
}

/// Rounds measured. The cluster is shared with the suite's other tests,
/// whose databases, extensions and tables are catalog changes on every
/// node: a session that falls far enough behind them has all its caches
/// reset, cached plans included, and plans its statements once more, so a
/// round run while other tests create databases can see a burst of plans.
/// Planning per call shows in every round; such a burst does not.
const ROUNDS: usize = 3;

/// Plans (or shard statements planned from text) over this share of the
/// runs mean some statement is planned per call.
const PER_CALL_IF_OVER: i64 = 10;

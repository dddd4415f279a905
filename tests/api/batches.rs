//! Acquires and Completes that arrive together share one statement and one
//! commit; each caller still gets its own answer, and one failing call does
//! not fail the others.
//!
//! Batches form on demand behind the gate (`helpers::gate`): while the
//! server's one batch worker waits there, the next calls queue; opening the
//! gate lets them run as one batch.

use std::time::Duration;

use futures::future::join_all;
use idempotency_coordinator::proto::{self, Decision};
use tokio::task::JoinHandle;
use tonic::Code;

use crate::helpers::*;

/// A server with one batch worker per kind, and the gate trigger installed.
async fn gated_app() -> (TestApp, tokio_postgres::Client) {
    gated_app_with(|_| {}).await
}

/// The same, configured by `configure`; a key named `poison…` fails the
/// statement that writes it.
async fn gated_app_with(
    configure: impl FnOnce(&mut idempotency_coordinator::config::ServeConfig),
) -> (TestApp, tokio_postgres::Client) {
    let app = spawn_app_with(|c| {
        c.store.shared_connections = 1;
        c.store.batch_workers = Some(1);
        configure(c);
    })
    .await;
    let db = app.db.connect().await;
    install_gate(&db).await;
    db.batch_execute(
        "CREATE FUNCTION test_poison() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
             IF NEW.idempotency_key LIKE 'poison%' THEN
                 RAISE EXCEPTION 'this key is poisoned';
             END IF;
             RETURN NEW;
         END $$;
         CREATE TRIGGER test_poison BEFORE INSERT OR UPDATE ON idempotency_keys
             FOR EACH ROW EXECUTE FUNCTION test_poison();",
    )
    .await
    .expect("install the poison trigger");
    (app, db)
}

type AcquireCall = JoinHandle<Result<proto::AcquireResponse, tonic::Status>>;

fn acquire_in_background(app: &TestApp, key: &str) -> AcquireCall {
    send_in_background(app, acquire("batch", key))
}

fn send_in_background(app: &TestApp, req: proto::AcquireRequest) -> AcquireCall {
    let mut client = app.client.clone();
    tokio::spawn(async move { client.acquire(req).await.map(|r| r.into_inner()) })
}

fn gate_acquire(app: &TestApp, key: &str) -> JoinHandle<()> {
    let call = acquire_in_background(app, key);
    tokio::spawn(async move {
        call.await
            .unwrap()
            .expect("the gate call passes once opened");
    })
}

#[tokio::test]
async fn acquires_that_arrive_together_share_one_commit_and_each_get_their_own_answer() {
    let (app, db) = gated_app().await;
    shut_gate(&db).await;
    let gate = gate_acquire(&app, "gate-1");
    // Sent in descending order; the batch runs them in key order.
    let keys: Vec<String> = (0..10).rev().map(|i| format!("k{i}")).collect();
    let answers = batched(&app, &db, gate, || {
        let mut calls: Vec<_> = keys
            .iter()
            .map(|k| acquire_in_background(&app, k))
            .collect();
        calls.push(acquire_in_background(&app, "k3"));
        calls
    })
    .await;

    for (key, answer) in keys.iter().zip(&answers) {
        let answer = answer.as_ref().expect("every call in the batch answers");
        assert_eq!(answer.record.as_ref().unwrap().key, *key);
    }
    let proceeded = |key: &str| {
        answers
            .iter()
            .filter(|a| {
                let a = a.as_ref().unwrap();
                a.record.as_ref().unwrap().key == key && decision(a) == Decision::Proceed
            })
            .count()
    };
    for key in &keys {
        assert_eq!(proceeded(key), 1, "exactly one lease for {key}");
    }
    // The second call for k3 in the same batch sees the first one's lease.
    assert_eq!(
        decision(answers.last().unwrap().as_ref().unwrap()),
        Decision::InProgress
    );
    assert_eq!(
        writers(&db, &keys).await,
        1,
        "one transaction wrote them all"
    );
}

/// The first call on a key in a batch may be answered from the batch's
/// first read; a later one must see what the earlier ones did.
#[tokio::test]
async fn a_later_call_on_a_key_in_a_batch_sees_what_an_earlier_one_did() {
    let (app, db) = gated_app().await;
    let mut c = app.client.clone();
    proceed(&mut c, with_fingerprint(acquire("batch", "k"), "a")).await;
    // The lease runs out: the next Acquire with fingerprint "a" takes over.
    app.clock.advance(Duration::from_secs(16 * 60));

    shut_gate(&db).await;
    let gate = gate_acquire(&app, "gate-s");
    until_gate_holds(&db).await;
    let takeover = send_in_background(&app, with_fingerprint(acquire("batch", "k"), "a"));
    until_queued(&app, 1).await;
    let other = send_in_background(&app, with_fingerprint(acquire("batch", "k"), "b"));
    until_queued(&app, 2).await;
    open_gate(&db, gate).await;

    let takeover = takeover.await.unwrap().expect("takeover");
    assert_eq!(decision(&takeover), Decision::Proceed);
    let taken = takeover.record.unwrap();
    assert_eq!(taken.attempt_count, 2);
    let other = other.await.unwrap().expect("conflict");
    assert_eq!(decision(&other), Decision::Conflict);
    let seen = other.record.unwrap();
    assert_eq!(
        (seen.attempt_count, seen.fencing_token),
        (taken.attempt_count, taken.fencing_token),
        "the CONFLICT shows the record as the takeover left it"
    );
    assert_eq!(writers(&db, &["k".to_owned()]).await, 1);
}

#[tokio::test]
async fn completes_that_arrive_together_share_one_commit_and_store_each_result() {
    let (app, db) = gated_app().await;
    let mut c = app.client.clone();
    let keys: Vec<String> = (0..8).map(|i| format!("c{i}")).collect();
    let mut tokens = Vec::new();
    for key in &keys {
        tokens.push(token(&proceed(&mut c, acquire("batch", key)).await));
    }
    let gate_token = token(&proceed(&mut c, acquire("batch", "gate-c")).await);

    shut_gate(&db).await;
    let gate = {
        let mut c = app.client.clone();
        tokio::spawn(async move {
            c.complete(complete("batch", "gate-c", &gate_token, success(b"gate")))
                .await
                .expect("the gate call passes once opened");
        })
    };
    let calls = || {
        keys.iter()
            .zip(&tokens)
            .rev()
            .map(|(key, token)| {
                let mut c = app.client.clone();
                let req = complete("batch", key, token, success(key.as_bytes()));
                tokio::spawn(async move { c.complete(req).await.map(|r| r.into_inner()) })
            })
            .collect()
    };
    for answer in batched(&app, &db, gate, calls).await {
        let record = answer.expect("every Complete answers").record.unwrap();
        assert_eq!(status_of(&record), proto::Status::Succeeded);
        assert_eq!(record.result.unwrap().result, record.key.as_bytes());
    }
    assert_eq!(
        writers(&db, &keys).await,
        1,
        "one transaction wrote them all"
    );
    for key in &keys {
        let replay = c.acquire(acquire("batch", key)).await.unwrap().into_inner();
        assert_eq!(decision(&replay), Decision::AlreadyDone);
        assert_eq!(
            replay.record.unwrap().result.unwrap().result,
            key.as_bytes()
        );
    }
}

#[tokio::test]
async fn a_call_that_fails_in_a_batch_does_not_fail_the_others() {
    let (app, db) = gated_app().await;
    shut_gate(&db).await;
    let gate = gate_acquire(&app, "gate-p");
    let keys: Vec<String> = (0..6).map(|i| format!("p{i}")).collect();
    let mut answers = batched(&app, &db, gate, || {
        let mut calls: Vec<_> = keys
            .iter()
            .map(|k| acquire_in_background(&app, k))
            .collect();
        calls.insert(3, acquire_in_background(&app, "poison"));
        calls
    })
    .await;

    let poisoned = answers.remove(3).expect_err("the poisoned call fails");
    assert_eq!(poisoned.code(), Code::Internal);
    assert!(
        !poisoned.message().contains("poisoned"),
        "the database's message stays in the log: {poisoned:?}"
    );
    for (key, answer) in keys.iter().zip(answers) {
        let answer = answer.expect("the others succeed");
        assert_eq!(decision(&answer), Decision::Proceed);
        assert_eq!(answer.record.unwrap().key, *key);
    }
    assert_eq!(app.db.count_records().await, 7, "the six and the gate");
}

/// A new key that another transaction creates after a batch looked for it
/// (another replica's Acquire; here the test's own transaction): the
/// batch's calls are each still decided once, that key on the other's
/// record, and none fails.
#[tokio::test]
async fn a_key_created_by_another_transaction_during_a_batch_is_decided_on_that_record() {
    let (app, db) = gated_app().await;
    let other = app.db.connect().await;
    other.batch_execute("BEGIN").await.unwrap();
    let theirs: i64 = other
        .query_one(
            "SELECT (a.rec).fencing_token FROM idempotency_acquire(
                 'default', 'batch', 'm1', '', 'theirs', 60000, 3, 3600000, 0, 0) a",
            &[],
        )
        .await
        .unwrap()
        .get(0);

    shut_gate(&db).await;
    let gate = gate_acquire(&app, "gate-m");
    until_gate_holds(&db).await;
    let keys = ["m0", "m1", "m2"];
    let calls: Vec<_> = keys
        .iter()
        .map(|k| acquire_in_background(&app, k))
        .collect();
    until_queued(&app, keys.len()).await;
    open_gate(&db, gate).await;
    // The batch found no m1 and now waits for the transaction creating it.
    eventually(
        "the batch to wait for the other transaction",
        Duration::from_secs(10),
        || async { (waiting_on(&db, "transactionid").await > 0).then_some(()) },
    )
    .await;
    other.batch_execute("COMMIT").await.unwrap();

    let answers: Vec<_> = join_all(calls)
        .await
        .into_iter()
        .map(|a| a.unwrap().expect("no call fails"))
        .collect();
    let decided: Vec<_> = answers
        .iter()
        .map(|a| (a.record.as_ref().unwrap().key.as_str(), decision(a)))
        .collect();
    assert_eq!(
        decided,
        [
            ("m0", Decision::Proceed),
            ("m1", Decision::InProgress),
            ("m2", Decision::Proceed)
        ]
    );
    assert_eq!(
        i64::try_from(answers[1].record.as_ref().unwrap().fencing_token).unwrap(),
        theirs,
        "m1 is answered with the other transaction's lease"
    );
    assert_eq!(app.db.count_records().await, 4, "the three and the gate");
}

/// A statement that outlives the query timeout is rolled back by PostgreSQL
/// itself, so the caller's UNAVAILABLE is the whole truth: it never commits
/// later.
#[tokio::test]
async fn a_statement_past_the_query_timeout_is_rolled_back_not_committed_later() {
    let (app, db) = gated_app_with(|c| c.store.query_timeout = Duration::from_secs(1)).await;
    shut_gate(&db).await;
    let stuck = acquire_in_background(&app, "gate-t");
    let refused = stuck.await.unwrap().expect_err("the call gives up");
    assert_eq!(refused.code(), Code::Unavailable);
    eventually(
        "the statement to leave the gate",
        Duration::from_secs(10),
        || async {
            let waiting = at_the_gate(&db).await;
            (waiting == 0).then_some(())
        },
    )
    .await;
    db.execute("SELECT pg_advisory_unlock($1)", &[&GATE_LOCK])
        .await
        .unwrap();
    assert_eq!(app.db.count_records().await, 0, "nothing was committed");
}

/// Two servers on `db`, each batching on one shared connection with one
/// worker.
async fn two_batching_servers(db: &TestDatabase) -> (TestServer, TestServer) {
    let config = || {
        let mut config = idempotency_coordinator::config::ServeConfig::new(
            "127.0.0.1:0".parse().unwrap(),
            db.url.clone(),
        );
        config.store.shared_connections = 1;
        config.store.batch_workers = Some(1);
        config
    };
    tokio::join!(start_server(config()), start_server(config()))
}

/// Two servers batching new keys in opposite orders on one database: without
/// a common lock order their batches would deadlock (and answer UNAVAILABLE).
#[tokio::test]
async fn two_servers_batching_the_same_keys_in_opposite_orders_never_deadlock() {
    let db = TestDatabase::create().await;
    let (a, b) = two_batching_servers(&db).await;
    for round in 0..20 {
        let keys: Vec<String> = (0..16).map(|i| format!("r{round}-{i:02}")).collect();
        let calls = keys
            .iter()
            .map(|k| (a.client.clone(), k.clone()))
            .chain(keys.iter().rev().map(|k| (b.client.clone(), k.clone())))
            .map(|(mut c, k)| async move { c.acquire(acquire("deadlock", &k)).await });
        let answers: Vec<_> = join_all(calls)
            .await
            .into_iter()
            .map(|a| a.expect("no call fails").into_inner())
            .collect();
        for key in &keys {
            let leases = answers
                .iter()
                .filter(|a| a.record.as_ref().unwrap().key == *key)
                .filter(|a| decision(a) == Decision::Proceed)
                .count();
            assert_eq!(leases, 1, "one lease for {key}");
        }
    }
}

/// Two servers batching the same lease's Complete at once (a caller's
/// retry that reached another replica): the successes' UPDATE of one batch
/// waits for the other's, finds the lease completed and leaves the call to
/// idempotency_complete. Both hear OK; the first result stays.
#[tokio::test]
async fn two_servers_completing_the_same_leases_at_once_both_answer_ok_and_store_one_result() {
    let db = TestDatabase::create().await;
    let (a, b) = two_batching_servers(&db).await;
    for round in 0..10 {
        let keys: Vec<String> = (0..12).map(|i| format!("d{round}-{i:02}")).collect();
        let mut c = a.client.clone();
        let mut tokens = Vec::new();
        for key in &keys {
            tokens.push(token(&proceed(&mut c, acquire("duplicate", key)).await));
        }
        let calls = keys.iter().zip(&tokens).flat_map(|(key, token)| {
            [(a.client.clone(), "a"), (b.client.clone(), "b")].map(|(mut c, by)| {
                let req = complete("duplicate", key, token, success(by.as_bytes()));
                async move { c.complete(req).await }
            })
        });
        let answers: Vec<_> = join_all(calls)
            .await
            .into_iter()
            .map(|a| {
                let record = a.expect("a repeated success is OK").into_inner().record;
                record.unwrap()
            })
            .collect();
        for pair in answers.chunks(2) {
            for record in pair {
                assert_eq!(status_of(record), proto::Status::Succeeded);
            }
            let stored = |r: &proto::Record| r.result.as_ref().unwrap().result.clone();
            assert_eq!(stored(&pair[0]), stored(&pair[1]), "one result, the first");
            assert!(stored(&pair[0]) == b"a" || stored(&pair[0]) == b"b");
        }
    }
}

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
        c.store.batch_workers = 1;
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
        config.store.batch_workers = 1;
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

/// The batch's statement called straight, Acquires only, on `keys` in this
/// order: each row's position, key and decision, by position.
async fn acquire_batch_in_sql(
    db: &tokio_postgres::Client,
    keys: &[&str],
) -> Vec<(i32, String, String)> {
    let n = i32::try_from(keys.len()).unwrap();
    let rows = db
        .query(
            "SELECT b.ord, (b.rec).idempotency_key, b.decision
               FROM idempotency_acquire_batch(
                        array_fill('default'::text, ARRAY[$2::int]), array_fill('sql'::text, ARRAY[$2::int]),
                        $1::text[], array_fill('fp'::text, ARRAY[$2::int]), array_fill(''::text, ARRAY[$2::int]),
                        array_fill(60000::bigint, ARRAY[$2::int]), array_fill(3, ARRAY[$2::int]),
                        array_fill(3600000::bigint, ARRAY[$2::int]), array_fill(0::bigint, ARRAY[$2::int]), 0) b
              ORDER BY b.ord",
            &[&keys, &n],
        )
        .await
        .unwrap();
    rows.iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect()
}

#[tokio::test]
async fn new_keys_of_a_batch_get_their_own_rows_whether_its_keys_come_sorted_repeated_or_not() {
    // A sorted batch of distinct keys creates its new keys in one INSERT
    // after deciding the others; a repeated or unsorted one creates each in
    // turn. Either way every call hears about its own key, and a repeated
    // key's second Acquire sees the record its first one created.
    let app = spawn_app().await;
    let db = app.db.connect().await;
    let sorted = acquire_batch_in_sql(&db, &["s1", "s2", "s3"]).await;
    let unsorted = acquire_batch_in_sql(&db, &["u3", "u1", "u2"]).await;
    let repeated = acquire_batch_in_sql(&db, &["r1", "r1", "r2"]).await;
    let expect = |rows: &[(&str, &str)]| -> Vec<(i32, String, String)> {
        rows.iter()
            .zip(1..)
            .map(|((key, decision), ord)| (ord, (*key).to_owned(), (*decision).to_owned()))
            .collect()
    };
    assert_eq!(
        sorted,
        expect(&[("s1", "PROCEED"), ("s2", "PROCEED"), ("s3", "PROCEED")])
    );
    assert_eq!(
        unsorted,
        expect(&[("u3", "PROCEED"), ("u1", "PROCEED"), ("u2", "PROCEED")])
    );
    assert_eq!(
        repeated,
        expect(&[("r1", "PROCEED"), ("r1", "IN_PROGRESS"), ("r2", "PROCEED")])
    );
    // Existing keys among new ones are read, not created again.
    let again = acquire_batch_in_sql(&db, &["s0", "s1", "s4"]).await;
    assert_eq!(
        again,
        expect(&[("s0", "PROCEED"), ("s1", "IN_PROGRESS"), ("s4", "PROCEED")])
    );
    let records: i64 = db
        .query_one(
            "SELECT count(*) FROM idempotency_keys WHERE scope = 'sql' AND idempotency_key LIKE 's%'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(records, 5, "one record per key");
}

/// The batch's statement called straight, Completes only (`calls`: key,
/// lease token as text, outcome), in this order: each row's position, key
/// and outcome, by position.
async fn complete_batch_in_sql(
    db: &tokio_postgres::Client,
    calls: &[(&str, &str, &str)],
) -> Vec<(i32, String, String)> {
    complete_batch_in_sql_storing(db, calls, b"ok").await
}

/// The same, every success storing `result`.
async fn complete_batch_in_sql_storing(
    db: &tokio_postgres::Client,
    calls: &[(&str, &str, &str)],
    result: &[u8],
) -> Vec<(i32, String, String)> {
    let keys: Vec<&str> = calls.iter().map(|c| c.0).collect();
    let tokens: Vec<&str> = calls.iter().map(|c| c.1).collect();
    let outcomes: Vec<&str> = calls.iter().map(|c| c.2).collect();
    let n = i32::try_from(calls.len()).unwrap();
    let rows = db
        .query(
            "SELECT b.ord, $1::text[], b.outcome
               FROM idempotency_complete_batch(
                        array_fill('default'::text, ARRAY[$4::int]), array_fill('sql'::text, ARRAY[$4::int]),
                        $1::text[], $2::text[]::uuid[], $3::text[],
                        array_fill($5::bytea, ARRAY[$4::int]), array_fill('text/plain'::text, ARRAY[$4::int]),
                        array_fill(200, ARRAY[$4::int]), array_fill(''::text, ARRAY[$4::int]),
                        array_fill('failed'::text, ARRAY[$4::int]), array_fill(false, ARRAY[$4::int]),
                        array_fill(NULL::bigint, ARRAY[$4::int]), array_fill(100::bigint, ARRAY[$4::int]),
                        array_fill(1000::bigint, ARRAY[$4::int]), 0) b
              ORDER BY b.ord",
            &[&keys, &tokens, &outcomes, &n, &result],
        )
        .await
        .unwrap();
    rows.iter()
        .map(|r| {
            let ord: i32 = r.get(0);
            let keys: Vec<String> = r.get(1);
            (ord, keys[ord as usize - 1].clone(), r.get(2))
        })
        .collect()
}

/// The lease token of `key` (scope `sql`), as text.
async fn token_in_sql(db: &tokio_postgres::Client, key: &str) -> String {
    db.query_one(
        "SELECT lease_token::text FROM idempotency_keys WHERE scope = 'sql' AND idempotency_key = $1",
        &[&key],
    )
    .await
    .unwrap()
    .get(0)
}

#[tokio::test]
async fn a_batchs_successes_are_recorded_together_and_each_answered_as_alone() {
    // A sorted batch of distinct keys records its successes in one UPDATE;
    // a success it cannot apply, and every other outcome, is decided by
    // idempotency_complete, and the successes before a call decided there
    // are recorded first.
    let app = spawn_app().await;
    let db = app.db.connect().await;
    let keys = ["c1", "c2", "c3", "c4", "c5"];
    acquire_batch_in_sql(&db, &keys).await;
    let mut tokens = Vec::new();
    for key in keys {
        tokens.push(token_in_sql(&db, key).await);
    }
    let t = |i: usize| tokens[i].as_str();
    assert_eq!(
        complete_batch_in_sql(&db, &[("c2", t(1), "SUCCESS")]).await,
        vec![(1, "c2".to_owned(), "OK".to_owned())]
    );
    let other_token = "00000000-0000-4000-8000-000000000000";
    let answers = complete_batch_in_sql(
        &db,
        &[
            ("c1", t(0), "SUCCESS"),
            ("c2", t(1), "SUCCESS"),
            ("c3", other_token, "SUCCESS"),
            ("c4", t(3), "FAILURE"),
            ("c5", t(4), "SUCCESS"),
            ("c6", other_token, "SUCCESS"),
        ],
    )
    .await;
    let expect: Vec<(i32, String, String)> = [
        ("c1", "OK"),
        ("c2", "OK"), // completed before with the same outcome
        ("c3", "LEASE_LOST"),
        ("c4", "OK"),
        ("c5", "OK"),
        ("c6", "NOT_FOUND"),
    ]
    .iter()
    .zip(1..)
    .map(|((k, o), ord)| (ord, (*k).to_owned(), (*o).to_owned()))
    .collect();
    assert_eq!(answers, expect);
    let statuses: Vec<(String, String)> = db
        .query(
            "SELECT idempotency_key, status FROM idempotency_keys WHERE scope = 'sql' ORDER BY 1",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let expect: Vec<(String, String)> = [
        ("c1", "SUCCEEDED"),
        ("c2", "SUCCEEDED"),
        ("c3", "PROCESSING"),
        ("c4", "FAILED"),
        ("c5", "SUCCEEDED"),
    ]
    .iter()
    .map(|(k, s)| ((*k).to_owned(), (*s).to_owned()))
    .collect();
    assert_eq!(statuses, expect);
    let result: Vec<u8> = db
        .query_one(
            "SELECT result FROM idempotency_keys WHERE scope = 'sql' AND idempotency_key = 'c5'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(result, b"ok");
    // The successes before c4, which ran idempotency_complete, were recorded
    // before it (rows locked in key order); c5's after it.
    let changed: Vec<chrono::DateTime<chrono::Utc>> = db
        .query(
            "SELECT updated_at FROM idempotency_keys
              WHERE scope = 'sql' AND idempotency_key IN ('c1', 'c4', 'c5') ORDER BY idempotency_key",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert!(
        changed[0] < changed[1] && changed[1] < changed[2],
        "c1, c4, c5 changed in key order: {changed:?}"
    );
}

#[tokio::test]
async fn a_success_whose_row_another_batch_holds_waits_and_is_decided_on_what_that_batch_wrote() {
    // Batch X records two successes and stays open; batch Y, the same
    // Completes (a retry on another replica), waits for X's row locks. Once X
    // commits, Y's UPDATE finds the leases completed and leaves both calls
    // to idempotency_complete: OK, with X's results.
    let app = spawn_app().await;
    let x = app.db.connect().await;
    let y = app.db.connect().await;
    let keys = ["w1", "w2"];
    acquire_batch_in_sql(&x, &keys).await;
    let mut tokens = Vec::new();
    for key in keys {
        tokens.push(token_in_sql(&x, key).await);
    }
    let calls = [
        ("w1", tokens[0].as_str(), "SUCCESS"),
        ("w2", tokens[1].as_str(), "SUCCESS"),
    ];
    let ok = vec![
        (1, "w1".to_owned(), "OK".to_owned()),
        (2, "w2".to_owned(), "OK".to_owned()),
    ];
    x.batch_execute("BEGIN").await.unwrap();
    assert_eq!(complete_batch_in_sql_storing(&x, &calls, b"x").await, ok);
    let waits = app.db.connect().await;
    let before = waiting_on(&waits, "transactionid").await;
    let owned = calls.map(|(k, t, o)| (k.to_owned(), t.to_owned(), o));
    let retry = tokio::spawn(async move {
        let calls: Vec<(&str, &str, &str)> = owned
            .iter()
            .map(|(k, t, o)| (k.as_str(), t.as_str(), *o))
            .collect();
        complete_batch_in_sql_storing(&y, &calls, b"y").await
    });
    eventually(
        "the retry to wait for the first batch's row lock",
        Duration::from_secs(10),
        || async { (waiting_on(&waits, "transactionid").await > before).then_some(()) },
    )
    .await;
    x.batch_execute("COMMIT").await.unwrap();
    let mut retried = retry.await.unwrap();
    retried.sort();
    assert_eq!(retried, ok);
    for key in keys {
        let result: Vec<u8> = x
            .query_one(
                "SELECT result FROM idempotency_keys WHERE scope = 'sql' AND idempotency_key = $1",
                &[&key],
            )
            .await
            .unwrap()
            .get(0);
        assert_eq!(result, b"x", "{key} keeps the first batch's result");
    }
}

#[tokio::test]
async fn a_batchs_successes_never_read_the_whole_table_whatever_size_it_was_planned_at() {
    // A session caches the plan of the successes' UPDATE the first times it
    // runs. Planned on a small table, an UPDATE joined to the keys would read
    // the whole table; it must look each key up at every size.
    let app = spawn_app().await;
    let db = app.db.connect().await;
    acquire_batch_in_sql(&db, &["a0", "a1", "a2"]).await;
    db.batch_execute("ANALYZE idempotency_keys").await.unwrap();
    db.batch_execute("BEGIN").await.unwrap();
    let seq_scans = || async {
        let scans: i64 = db
            .query_one(
                "SELECT seq_scan FROM pg_stat_xact_user_tables WHERE relname = 'idempotency_keys'",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        scans
    };
    let mut scanned = 0;
    for round in 0..12 {
        if round == 8 {
            // The table grows well past what the cached plans were made for.
            let many: Vec<String> = (0..3000).map(|i| format!("m{i:05}")).collect();
            let many: Vec<&str> = many.iter().map(String::as_str).collect();
            acquire_batch_in_sql(&db, &many).await;
        }
        let keys: Vec<String> = (0..4).map(|i| format!("r{round:02}-{i}")).collect();
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        acquire_batch_in_sql(&db, &keys).await;
        let mut calls = Vec::new();
        for key in &keys {
            calls.push((*key, token_in_sql(&db, key).await));
        }
        let calls: Vec<(&str, &str, &str)> = calls
            .iter()
            .map(|(k, t)| (*k, t.as_str(), "SUCCESS"))
            .collect();
        let before = seq_scans().await;
        let answers = complete_batch_in_sql(&db, &calls).await;
        scanned += seq_scans().await - before;
        assert!(answers.iter().all(|(_, _, outcome)| outcome == "OK"));
    }
    db.batch_execute("COMMIT").await.unwrap();
    assert_eq!(scanned, 0, "sequential scans of the table by the successes");
}

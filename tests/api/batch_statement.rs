//! The batch's statement (`idempotency_call_batch`, through its one-kind
//! wrappers) called straight, without a server: how a batch creates its new
//! keys and records its successes, which no answer through the API shows
//! apart from the single-call paths.

use std::time::Duration;

use crate::helpers::*;

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
    // The test's own database holds only this test's records.
    let statuses = statuses(&app.db).await;
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

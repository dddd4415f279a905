//! One rule for final answers, wherever it is applied: every path that can
//! answer an Acquire (the single call, the batch's pre-check, the replay
//! cache on and off, a waiting Acquire woken by a change) answers exactly
//! what `idempotency_acquire` alone answers for the same record, over a
//! matrix of record states and request fingerprints.
//!
//! The reference is `idempotency_acquire` run on the record as it stands, in
//! a transaction that is rolled back, right before the path answers.

use std::time::Duration;

use idempotency_coordinator::config::ServeConfig;
use idempotency_coordinator::proto;
use tokio_postgres::{Client, GenericClient, Transaction};

use crate::helpers::*;

/// The fingerprint every record is created with.
const CREATED_WITH: &str = "fp-a";
/// The fingerprints a caller may bring: the same, another, none.
const FINGERPRINTS: [&str; 3] = [CREATED_WITH, "fp-b", ""];

#[derive(Debug, Clone, Copy)]
enum State {
    ProcessingLive,
    ProcessingExpired,
    Succeeded,
    FailedDue,
    FailedNotDue,
    FailedPermanent,
    /// Past its retention: counts as absent.
    Expired,
}

const STATES: [State; 7] = [
    State::ProcessingLive,
    State::ProcessingExpired,
    State::Succeeded,
    State::FailedDue,
    State::FailedNotDue,
    State::FailedPermanent,
    State::Expired,
];

const WHERE_KEY: &str = "tenant = 'default' AND scope = $1 AND idempotency_key = $2";

/// Creates `key` in scope `s` with fingerprint `fp-a` as a PROCESSING
/// record, and returns its lease token.
async fn create(db: &impl GenericClient, key: &str) -> uuid::Uuid {
    let row = db
        .query_one(
            "SELECT (a.rec).lease_token FROM idempotency_acquire(
                 'default', 's', $1, $2, '', 60000, 3, 3600000, 0, 0) a",
            &[&key, &CREATED_WITH],
        )
        .await
        .unwrap();
    row.get(0)
}

async fn complete_in_sql(
    db: &impl GenericClient,
    key: &str,
    token: uuid::Uuid,
    outcome: &str,
    permanent: bool,
) {
    db.execute(
        "SELECT * FROM idempotency_complete('default', 's', $1, $2, $3, '\\x6f6b'::bytea,
             'text/plain', 200, '', 'it failed', $4, NULL, 1000, 3600000, 0)",
        &[&key, &token, &outcome, &permanent],
    )
    .await
    .unwrap();
}

/// Puts the PROCESSING record `key` (leased with `token`) into `state`.
async fn put_in(db: &impl GenericClient, key: &str, token: uuid::Uuid, state: State) {
    let update = |set: &str| format!("UPDATE idempotency_keys SET {set} WHERE {WHERE_KEY}");
    match state {
        State::ProcessingLive => {
            // A new lease, so that a waiter on the old one sees a change.
            db.execute(
                &update("lease_token = gen_random_uuid(), updated_at = now()"),
                &[&"s", &key],
            )
            .await
            .unwrap();
        }
        State::ProcessingExpired => {
            db.execute(
                &update("lease_expires_at = now() - interval '1 minute', updated_at = now()"),
                &[&"s", &key],
            )
            .await
            .unwrap();
        }
        State::Succeeded => complete_in_sql(db, key, token, "SUCCESS", false).await,
        State::FailedDue | State::FailedNotDue => {
            complete_in_sql(db, key, token, "FAILURE", false).await;
            let due = match state {
                State::FailedDue => "now() - interval '1 second'",
                _ => "now() + interval '1 hour'",
            };
            db.execute(&update(&format!("next_retry_at = {due}")), &[&"s", &key])
                .await
                .unwrap();
        }
        State::FailedPermanent => complete_in_sql(db, key, token, "FAILURE", true).await,
        State::Expired => {
            complete_in_sql(db, key, token, "SUCCESS", false).await;
            db.execute(
                &update("expires_at = now() - interval '1 second'"),
                &[&"s", &key],
            )
            .await
            .unwrap();
        }
    }
}

/// What `idempotency_acquire` alone answers `fingerprint` on `key` as `tx`
/// sees it, leaving the record (and `tx`) as it is.
async fn reference_in(tx: &mut Transaction<'_>, key: &str, fingerprint: &str) -> String {
    let probe = tx.savepoint("reference").await.unwrap();
    let row = probe
        .query_one(
            "SELECT decision FROM idempotency_acquire(
                 'default', 's', $1, $2, '', 60000, 3, 3600000, 0, 0)",
            &[&key, &fingerprint],
        )
        .await
        .unwrap();
    probe.rollback().await.unwrap();
    row.get(0)
}

/// What `idempotency_acquire` alone answers `fingerprint` on `key` now,
/// leaving the record as it is.
async fn reference(db: &mut Client, key: &str, fingerprint: &str) -> String {
    let mut tx = db.transaction().await.unwrap();
    let answer = reference_in(&mut tx, key, fingerprint).await;
    tx.rollback().await.unwrap();
    answer
}

/// The batch's answer for one call on `key`, leaving the record as it is.
async fn batched(db: &mut Client, key: &str, fingerprint: &str) -> String {
    let tx = db.transaction().await.unwrap();
    let row = tx
        .query_one(
            "SELECT decision FROM idempotency_acquire_batch(
                 ARRAY['default'], ARRAY['s'], ARRAY[$1::text], ARRAY[$2::text], ARRAY[''],
                 ARRAY[60000::bigint], ARRAY[3], ARRAY[3600000::bigint], ARRAY[0::bigint], 0)",
            &[&key, &fingerprint],
        )
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    row.get(0)
}

fn name(decision: i32) -> String {
    proto::Decision::try_from(decision)
        .expect("a known decision")
        .as_str_name()
        .trim_start_matches("DECISION_")
        .to_owned()
}

fn with_fingerprint(key: &str, fingerprint: &str) -> proto::AcquireRequest {
    let mut request = acquire("s", key);
    if !fingerprint.is_empty() {
        request.request_fingerprint = Some(
            proto::acquire_request::RequestFingerprint::Fingerprint(fingerprint.to_owned()),
        );
    }
    request
}

async fn server(db: &TestDatabase, configure: impl FnOnce(&mut ServeConfig)) -> TestServer {
    let mut config = ServeConfig::new("127.0.0.1:0".parse().unwrap(), db.url.clone());
    config.sweep_interval = Duration::ZERO;
    configure(&mut config);
    start_server(config).await
}

#[tokio::test]
async fn every_path_answers_what_idempotency_acquire_answers() {
    let db = TestDatabase::create().await;
    let mut sql = db.connect().await;
    // A pooled connection per call, no batches, no replay cache.
    let single = server(&db, |c| {
        c.store.shared_connections = 0;
        c.store.replay_cache_bytes = 0;
    })
    .await;
    // The defaults: shared connections, batches, replay cache on.
    let cached = server(&db, |_| {}).await;
    // Shared connections and batches, replay cache off.
    let uncached = server(&db, |c| c.store.replay_cache_bytes = 0).await;

    let mut disagreements = Vec::new();
    let mut checked = 0;
    for state in STATES {
        for fingerprint in FINGERPRINTS {
            let case = format!("{state:?} / fingerprint {fingerprint:?}");
            let mut agree = |path: &str, expected: &str, got: &str| {
                checked += 1;
                if expected != got {
                    disagreements.push(format!(
                        "{case} / {path}: idempotency_acquire answers {expected}, the path {got}"
                    ));
                }
            };

            // The batch's pre-check, straight in SQL.
            let key = format!("{state:?}-{fingerprint}-batch");
            let token = create(&sql, &key).await;
            put_in(&sql, &key, token, state).await;
            let expected = reference(&mut sql, &key, fingerprint).await;
            agree(
                "batch",
                &expected,
                &batched(&mut sql, &key, fingerprint).await,
            );

            // Through each server.
            for (path, server) in [
                ("single call", &single),
                ("replay cache on", &cached),
                ("replay cache off", &uncached),
            ] {
                let key = format!("{state:?}-{fingerprint}-{}", path.replace(' ', "-"));
                let token = create(&sql, &key).await;
                put_in(&sql, &key, token, state).await;
                let mut client = server.client.clone();
                // First an Acquire with the record's own fingerprint, which
                // a replay cache remembers a SUCCEEDED record from; then the
                // call compared, on the record as that left it.
                client
                    .acquire(with_fingerprint(&key, CREATED_WITH))
                    .await
                    .unwrap();
                let expected = reference(&mut sql, &key, fingerprint).await;
                let answer = client
                    .acquire(with_fingerprint(&key, fingerprint))
                    .await
                    .unwrap()
                    .into_inner();
                agree(path, &expected, &name(answer.decision));
            }
        }
    }

    // A waiting Acquire, woken by a change of the record it waits on: the
    // record moves into each state (and, for the fingerprint dimension,
    // takes the fingerprint given) while the waiter is parked.
    for state in STATES {
        for fingerprint in FINGERPRINTS {
            let case = format!("waiting / {state:?} / record fingerprint {fingerprint:?}");
            let key = format!("{state:?}-{fingerprint}-waiting");
            let token = create(&sql, &key).await;
            let mut client = cached.client.clone();
            let mut request = with_fingerprint(&key, CREATED_WITH);
            request.wait = secs(3);
            let waiter = tokio::spawn(async move { client.acquire(request).await });
            until_parked(&cached, 1).await;
            // One transaction, so that the waiter hears of the change (at
            // commit) only once it is whole, and the reference is read
            // before the waiter can act on it.
            let mut tx = sql.transaction().await.unwrap();
            put_in(&tx, &key, token, state).await;
            tx.execute(
                &format!("UPDATE idempotency_keys SET fingerprint = $3 WHERE {WHERE_KEY}"),
                &[&"s", &key, &fingerprint],
            )
            .await
            .unwrap();
            let expected = {
                let expected = reference_in(&mut tx, &key, CREATED_WITH).await;
                tx.execute(
                    &format!(
                        "SELECT idempotency_notify_if_watched(k, now()) FROM idempotency_keys k WHERE {WHERE_KEY}"
                    ),
                    &[&"s", &key],
                )
                .await
                .unwrap();
                tx.commit().await.unwrap();
                expected
            };
            let answer = waiter.await.unwrap().unwrap().into_inner();
            checked += 1;
            if expected != name(answer.decision) {
                disagreements.push(format!(
                    "{case}: idempotency_acquire answers {expected}, the waiter {}",
                    name(answer.decision)
                ));
            }
            until_waiters(&cached, 0).await;
        }
    }

    println!("{checked} answers checked");
    assert!(
        disagreements.is_empty(),
        "{} of {checked} answers disagree:\n{}",
        disagreements.len(),
        disagreements.join("\n")
    );
}

#[tokio::test]
async fn sql_cuts_error_texts_where_the_server_does() {
    use idempotency_coordinator::domain::MAX_ERROR_CHARS;
    let app = spawn_app().await;
    let mut c = app.client.clone();
    let granted = proceed(&mut c, acquire("s", "cut")).await;
    // The server keeps MAX_ERROR_CHARS characters of a failure's text...
    let long = "é".repeat(MAX_ERROR_CHARS + 500);
    let record = c
        .complete(complete("s", "cut", &token(&granted), failure(&long)))
        .await
        .unwrap()
        .into_inner()
        .record
        .unwrap();
    assert_eq!(record.last_error.chars().count(), MAX_ERROR_CHARS);
    // ...and idempotency_acquire, writing its own text around that one when
    // no attempt is left, keeps as many.
    let sql = app.db.connect().await;
    sql.execute(
        &format!("UPDATE idempotency_keys SET attempt_count = max_attempts WHERE {WHERE_KEY}"),
        &[&"s", &"cut"],
    )
    .await
    .unwrap();
    let exhausted = c.acquire(acquire("s", "cut")).await.unwrap().into_inner();
    assert_eq!(name(exhausted.decision), "EXHAUSTED");
    let last_error = exhausted.record.unwrap().last_error;
    assert!(
        last_error.starts_with("no attempts left"),
        "{last_error:.40}"
    );
    assert_eq!(last_error.chars().count(), MAX_ERROR_CHARS);
}

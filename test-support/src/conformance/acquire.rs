//! Acquire over the matrix of record states and fingerprints: the batch's
//! pre-check, each server, and a waiter woken by a change all answer what
//! `idempotency_acquire` answers.

use tokio_postgres::Client;

use super::Backend;
use super::watch::Watcher;
use super::{
    CREATED_WITH, FINGERPRINTS, STATES, Servers, State, Tally, WHERE_KEY, acquire_with,
    batch_precheck, create, name, put_in, reference, reference_in, server,
};
use crate::helpers::*;

/// What the contract says an Acquire answers on a record in `state` when
/// the record's fingerprint and the call's are `same` or not (no
/// fingerprint is one of its own): a record there is conflicts with any
/// other fingerprint; with its own, each state has its decision. Pins the
/// reference, so that every database the matrix runs on answers alike.
fn contract(state: State, same: bool) -> String {
    let decision = match state {
        State::Expired => "PROCEED",
        _ if !same => "CONFLICT",
        State::ProcessingLive => "IN_PROGRESS",
        State::ProcessingExpired | State::FailedDue => "PROCEED",
        State::Succeeded => "ALREADY_DONE",
        State::FailedNotDue => "RETRY_LATER",
        State::FailedPermanent => "EXHAUSTED",
    };
    decision.to_owned()
}

/// The batch's pre-check, straight in SQL, on a record in `state`; and the
/// reference, against the contract.
async fn check_the_batch_precheck(
    sql: &mut Client,
    tally: &mut Tally,
    state: State,
    fingerprint: &str,
) {
    let key = format!("{state:?}-{fingerprint}-batch");
    let token = create(&*sql, &key).await;
    put_in(&*sql, &key, token, state).await;
    let expected = reference(sql, &key, fingerprint).await;
    let got = batch_precheck(sql, &key, fingerprint).await;
    let case = format!("{state:?} / fingerprint {fingerprint:?}");
    let agreed = contract(state, fingerprint == CREATED_WITH);
    tally.compare(&case, "the contract", &agreed, &expected);
    let case = format!("{case} / batch");
    tally.compare(&case, "idempotency_acquire", &expected, &got);
}

/// Each server, on a record of its own in `state`; returns a watcher of
/// each record, started before the calls.
async fn check_each_server(
    sql: &mut Client,
    servers: &Servers,
    tally: &mut Tally,
    state: State,
    fingerprint: &str,
) -> Vec<Watcher> {
    let mut watchers = Vec::new();
    for (path, server) in servers.paths() {
        let key = format!("{state:?}-{fingerprint}-{}", path.replace(' ', "-"));
        let token = create(&*sql, &key).await;
        put_in(&*sql, &key, token, state).await;
        watchers.push(Watcher::start(server, &key).await);
        let mut client = server.client.clone();
        // First an Acquire with the record's own fingerprint, which a replay
        // cache remembers a SUCCEEDED record from; then the call compared,
        // on the record as that left it.
        client
            .acquire(acquire_with(&key, CREATED_WITH))
            .await
            .unwrap();
        let expected = reference(sql, &key, fingerprint).await;
        let answer = client
            .acquire(acquire_with(&key, fingerprint))
            .await
            .unwrap()
            .into_inner();
        let case = format!("{state:?} / fingerprint {fingerprint:?} / {path}");
        tally.compare(
            &case,
            "idempotency_acquire",
            &expected,
            &name(answer.decision),
        );
    }
    watchers
}

/// What the watchers of one case's records saw through each server,
/// compared with what the single call's watcher saw.
async fn compare_the_watchers(
    tally: &mut Tally,
    servers: &Servers,
    case: &str,
    watchers: Vec<Watcher>,
) {
    let mut watched = Vec::new();
    for watcher in watchers {
        watched.push(watcher.events().await);
    }
    let (reference, others) = watched.split_first().expect("a watcher per server");
    for ((path, _), seen) in servers.paths().skip(1).zip(others) {
        let case = format!("{case} / {path}, watched");
        tally.compare(&case, "a single call", reference, seen);
    }
}

/// A waiting Acquire, woken by a change of the record it waits on: the
/// record moves into `state` (and takes `fingerprint`) while the waiter is
/// parked.
async fn check_a_waiter_woken_by_a_change(
    sql: &mut Client,
    server: &TestServer,
    tally: &mut Tally,
    state: State,
    fingerprint: &str,
) {
    let key = format!("{state:?}-{fingerprint}-waiting");
    let token = create(&*sql, &key).await;
    let mut client = server.client.clone();
    let mut request = acquire_with(&key, CREATED_WITH);
    request.wait = secs(3);
    let waiter = tokio::spawn(async move { client.acquire(request).await });
    until_parked(server, 1).await;
    // One transaction, so that the waiter hears of the change (at commit)
    // only once it is whole, and the reference is read before the waiter
    // can act on it.
    let mut tx = sql.transaction().await.unwrap();
    put_in(&tx, &key, token, state).await;
    tx.execute(
        &format!("UPDATE idempotency_keys SET fingerprint = $3 WHERE {WHERE_KEY}"),
        &[&"s", &key, &fingerprint],
    )
    .await
    .unwrap();
    let expected = reference_in(&mut tx, &key, CREATED_WITH).await;
    let case = format!("waiting / {state:?} / record fingerprint {fingerprint:?}");
    let agreed = contract(state, fingerprint == CREATED_WITH);
    tally.compare(&case, "the contract", &agreed, &expected);
    // The row made a value of the table's type: on a Citus cluster the
    // statement runs on a shard, whose rows are of the shard's own type.
    tx.execute(
        &format!(
            "SELECT idempotency_notify_if_watched(ROW(k.*)::idempotency_keys, now())
               FROM idempotency_keys k WHERE {WHERE_KEY}"
        ),
        &[&"s", &key],
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();
    let answer = waiter.await.unwrap().unwrap().into_inner();
    tally.compare(
        &case,
        "idempotency_acquire",
        &expected,
        &name(answer.decision),
    );
    until_waiters(server, 0).await;
}

pub async fn every_path_answers_what_idempotency_acquire_answers<B: Backend>() {
    let Some(db) = B::create().await else {
        return;
    };
    let mut sql = db.connect().await;
    let servers = Servers::start(&db).await;
    let mut tally = Tally::default();
    let mut watched = Vec::new();
    for state in STATES {
        for fingerprint in FINGERPRINTS {
            check_the_batch_precheck(&mut sql, &mut tally, state, fingerprint).await;
            let watchers =
                check_each_server(&mut sql, &servers, &mut tally, state, fingerprint).await;
            watched.push((format!("{state:?} / fingerprint {fingerprint:?}"), watchers));
        }
    }
    // Every watcher's stream has ended before any call waits.
    for (case, watchers) in watched {
        compare_the_watchers(&mut tally, &servers, &case, watchers).await;
    }
    for state in STATES {
        for fingerprint in FINGERPRINTS {
            check_a_waiter_woken_by_a_change(
                &mut sql,
                servers.cached(),
                &mut tally,
                state,
                fingerprint,
            )
            .await;
        }
    }
    tally.assert_all_agree();
}

pub async fn sql_cuts_error_texts_where_the_server_does<B: Backend>() {
    use idempotency_coordinator::domain::MAX_ERROR_CHARS;
    let Some(db) = B::create().await else {
        return;
    };
    let app = server(&db, |_| {}).await;
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
    let sql = db.connect().await;
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

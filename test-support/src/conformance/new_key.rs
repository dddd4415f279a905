//! A key nobody has used: the first Acquire creates its record and grants a
//! lease, the same answer and the same record on every path (the batch's
//! statement, each server, a group commit, a waiting Acquire) as
//! `idempotency_acquire` alone would give and create.

use idempotency_coordinator::proto;
use tokio_postgres::Client;

use super::Backend;
use super::shape::{Answer, Shape, answer_and_row};
use super::{
    FINGERPRINTS, Servers, Tally, acquire_with, assert_one_writer_per_node, batched_beside,
    companion_complete, gated_servers,
};
use crate::helpers::*;

const REFERENCE: &str = "idempotency_acquire";

/// The Acquire every path is sent: what the SQL reference is called with
/// (a 60 s lease, 3 attempts, an hour's retention).
fn first_acquire(key: &str, fingerprint: &str) -> proto::AcquireRequest {
    proto::AcquireRequest {
        lease_ttl: secs(60),
        max_attempts: 3,
        retention: secs(3600),
        ..acquire_with(key, fingerprint)
    }
}

/// What `calls` (SQL aliased `a`, on `$1` the key and `$2` the fingerprint)
/// answers on a new key, and the whole row it creates; rolled back.
async fn in_sql(sql: &mut Client, calls: &str, key: &str, fingerprint: &str) -> (Answer, String) {
    let tx = sql.transaction().await.unwrap();
    let row = tx
        .query_one(&answer_and_row(calls), &[&key, &fingerprint])
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    (Answer::of_row(&row), row.get("internals"))
}

/// `idempotency_acquire` alone on a new key; rolled back.
async fn reference(sql: &mut Client, key: &str, fingerprint: &str) -> (Answer, String) {
    let calls = "idempotency_acquire('default', 's', $1, $2, '', 60000, 3, 3600000, 0, 0) a";
    in_sql(sql, calls, key, fingerprint).await
}

/// The batch's statement for one call on a new key; rolled back.
async fn batch(sql: &mut Client, key: &str, fingerprint: &str) -> (Answer, String) {
    let calls = "idempotency_acquire_batch(
        ARRAY['default'], ARRAY['s'], ARRAY[$1::text], ARRAY[$2::text], ARRAY[''],
        ARRAY[60000::bigint], ARRAY[3], ARRAY[3600000::bigint], ARRAY[0::bigint], 0) a";
    in_sql(sql, calls, key, fingerprint).await
}

/// A server's answer to `request`, and the record Get reads after it.
async fn through(server: &TestServer, request: proto::AcquireRequest) -> (Answer, Shape) {
    let mut client = server.client.clone();
    let key = request.key.clone();
    let answer = client.acquire(request).await.unwrap().into_inner();
    let record = get_record(&mut client, get_req("s", &key)).await;
    let lease = answer.lease.as_ref().map_or(0, |l| l.fencing_token);
    (Answer::of(&answer), Shape::of(&record, lease))
}

/// The Acquires of a new key for each fingerprint, queued together behind
/// `gate` on `gated` (the server of `path`) with a Complete of another key,
/// and run as one statement (per node): the answers and the records Get
/// reads after them.
async fn group_commit(
    gated: &TestServer,
    path: &str,
    gate: &Gate,
    db: &impl Backend,
) -> Vec<(Answer, Shape)> {
    let path = path.replace(' ', "-");
    let companion_key = format!("companion-new-{path}");
    let companion = companion_complete(gated, &companion_key).await;
    gate.shut().await;
    let gate_call = {
        let mut client = gated.client.clone();
        let gate_key = format!("gate-new-{path}");
        tokio::spawn(async move {
            client
                .acquire(acquire("s", &gate_key))
                .await
                .expect("the gate call passes once opened");
        })
    };
    let keys: Vec<String> = FINGERPRINTS
        .iter()
        .map(|fingerprint| format!("new-{fingerprint}-{path}"))
        .collect();
    let calls = || {
        keys.iter()
            .zip(FINGERPRINTS)
            .map(|(key, fingerprint)| {
                let mut client = gated.client.clone();
                let request = first_acquire(key, fingerprint);
                tokio::spawn(async move { client.acquire(request).await.unwrap().into_inner() })
            })
            .collect()
    };
    let answers = batched_beside(gate, gated, gate_call, calls, companion).await;
    let written: Vec<String> = keys.iter().cloned().chain([companion_key]).collect();
    assert_one_writer_per_node(db, &written).await;
    let mut seen = Vec::new();
    for (key, answer) in keys.iter().zip(answers) {
        let record = get_record(&mut gated.client.clone(), get_req("s", key)).await;
        let lease = answer.lease.as_ref().map_or(0, |l| l.fencing_token);
        seen.push((Answer::of(&answer), Shape::of(&record, lease)));
    }
    seen
}

/// Compares a path's answer, and the record Get read after it, with the
/// reference's.
fn compare(tally: &mut Tally, case: &str, expected: &Answer, (answer, record): &(Answer, Shape)) {
    tally.compare(case, REFERENCE, expected, answer);
    let case = format!("{case}, read back");
    tally.compare(&case, REFERENCE, &expected.record.as_ref(), &Some(record));
}

pub async fn a_new_key_gets_the_same_first_lease_on_every_path<B: Backend>() {
    let Some(db) = B::create().await else {
        return;
    };
    let mut sql = db.connect().await;
    let servers = Servers::start(&db).await;
    let (gated, gate) = gated_servers(&db).await;
    let mut tally = Tally::default();
    let mut references = Vec::new();
    for fingerprint in FINGERPRINTS {
        let case = |path: &str| format!("new key / fingerprint {fingerprint:?} / {path}");
        // The batch's statement, straight in SQL, on the reference's key:
        // both are rolled back, so their whole rows compare.
        let key = format!("new-{fingerprint}-sql");
        let (expected, row) = reference(&mut sql, &key, fingerprint).await;
        assert_eq!(expected.decision, "PROCEED", "{expected:?}");
        let (answer, batch_row) = batch(&mut sql, &key, fingerprint).await;
        tally.compare(&case("batch"), REFERENCE, &expected, &answer);
        tally.compare(&case("batch, whole row"), REFERENCE, &row, &batch_row);

        for (path, server) in servers.paths() {
            let key = format!("new-{fingerprint}-{}", path.replace(' ', "-"));
            let seen = through(server, first_acquire(&key, fingerprint)).await;
            compare(&mut tally, &case(path), &expected, &seen);
        }
        // A waiting Acquire finds no holder to wait for.
        let mut waiting = first_acquire(&format!("new-{fingerprint}-waiting"), fingerprint);
        waiting.wait = secs(3);
        let seen = through(servers.cached(), waiting).await;
        compare(&mut tally, &case("waiting"), &expected, &seen);
        references.push((fingerprint, expected));
    }
    for (path, server) in &gated {
        let seen = group_commit(server, path, &gate, &db).await;
        for ((fingerprint, expected), seen) in references.iter().zip(&seen) {
            let case = format!("new key / fingerprint {fingerprint:?} / {path}");
            compare(&mut tally, &case, expected, seen);
        }
    }
    tally.assert_all_agree();
}

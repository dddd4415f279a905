//! The conformance matrix: the same calls get the same answers and leave
//! the same records, whichever path they take: a single call on a pooled
//! connection, a call alone on a shared connection with the replay cache on
//! or off, a group commit (the batch's statement), a waiting Acquire woken
//! by a change; on a Citus cluster also calls alone and a group commit sent
//! through the coordinator node rather than straight to the worker holding
//! their keys.
//!
//! - [`acquire`]: one rule for final answers, wherever it is applied: every
//!   path that can answer an Acquire answers exactly what
//!   `idempotency_acquire` alone answers for the same record, over a matrix
//!   of record states and request fingerprints. The reference is
//!   `idempotency_acquire` run on the record as it stands, in a transaction
//!   that is rolled back, right before the path answers; it in turn answers
//!   what the contract says for the state and fingerprints, on whichever
//!   database the matrix runs. A watcher of each record sees the same
//!   events through each server.
//! - [`new_key`]: a key nobody has used, on every path and in a group
//!   commit: the whole answer (decision, lease, record) and the record read
//!   back after it, compared with what `idempotency_acquire` answers and
//!   creates.
//! - [`complete`]: Complete's outcomes and refusals, as a single call, alone
//!   on a shared connection (replay cache on and off) and in a group commit:
//!   the answer, the record read back after it and what a watcher of the
//!   record saw, whole, compared with the single call's.
//!
//! `shape` says which fields legitimately differ from path to path, and how
//! they are compared instead; `watch` how a watcher's events are.
//!
//! The matrix is generic over where it runs ([`Backend`]): the API suite
//! runs it on one PostgreSQL (`tests/api/conformance.rs`), the Citus suite
//! on a Citus cluster (`tests/citus/conformance.rs`), each by invoking
//! [`conformance_tests!`](crate::conformance_tests) with its database.

pub mod acquire;
mod backend;
pub mod complete;
pub mod new_key;
mod shape;
mod watch;

pub use backend::Backend;

use std::fmt::Debug;
use std::future::Future;
use std::time::Duration;

use chrono::{DateTime, Utc};
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

/// The `updated_at` of the record `key`.
async fn updated_at(db: &impl GenericClient, key: &str) -> DateTime<Utc> {
    db.query_one(
        &format!("SELECT updated_at FROM idempotency_keys WHERE {WHERE_KEY}"),
        &[&"s", &key],
    )
    .await
    .unwrap()
    .get(0)
}

/// Sets each of `columns` of the record `key` to the record's `updated_at`
/// plus its offset, in seconds. The times are computed here and sent as
/// values: Citus refuses an UPDATE of a distributed table that applies a
/// STABLE operator (`timestamptz - interval`) to a column.
async fn set_after_update(db: &impl GenericClient, key: &str, columns: &[(&str, i64)]) {
    let updated = updated_at(db, key).await;
    let mut set = Vec::new();
    let mut times = Vec::new();
    for (i, (column, seconds)) in columns.iter().enumerate() {
        set.push(format!("{column} = ${}", i + 3));
        times.push(updated + chrono::Duration::seconds(*seconds));
    }
    let mut params: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = vec![&"s", &key];
    params.extend(
        times
            .iter()
            .map(|t| t as &(dyn tokio_postgres::types::ToSql + Sync)),
    );
    db.execute(
        &format!(
            "UPDATE idempotency_keys SET {} WHERE {WHERE_KEY}",
            set.join(", ")
        ),
        &params,
    )
    .await
    .unwrap();
}

/// Puts the PROCESSING record `key` (leased with `token`) into `state`.
/// Times are set relative to the record's own (`updated_at`, or `now()` for
/// both), so that every record put in a state has the same offsets. Values
/// a statement would draw (a new lease token) are drawn here: Citus refuses
/// volatile functions in an UPDATE of a distributed table.
async fn put_in(db: &impl GenericClient, key: &str, token: uuid::Uuid, state: State) {
    let update = |set: &str| format!("UPDATE idempotency_keys SET {set} WHERE {WHERE_KEY}");
    match state {
        State::ProcessingLive => {
            // A new lease, so that a waiter on the old one sees a change.
            db.execute(
                &update(
                    "lease_token = $3, updated_at = now(),
                     lease_expires_at = now() + interval '1 minute',
                     expires_at = now() + interval '1 hour'",
                ),
                &[&"s", &key, &uuid::Uuid::new_v4()],
            )
            .await
            .unwrap();
        }
        State::ProcessingExpired => {
            db.execute(
                &update(
                    "lease_expires_at = now() - interval '1 minute', updated_at = now(),
                     expires_at = now() + interval '1 hour'",
                ),
                &[&"s", &key],
            )
            .await
            .unwrap();
        }
        State::Succeeded => complete_in_sql(db, key, token, "SUCCESS", false).await,
        State::FailedDue | State::FailedNotDue => {
            complete_in_sql(db, key, token, "FAILURE", false).await;
            let due = match state {
                State::FailedDue => -1,
                _ => 3600,
            };
            set_after_update(db, key, &[("next_retry_at", due)]).await;
        }
        State::FailedPermanent => complete_in_sql(db, key, token, "FAILURE", true).await,
        State::Expired => {
            complete_in_sql(db, key, token, "SUCCESS", false).await;
            set_after_update(db, key, &[("expires_at", -1)]).await;
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
async fn batch_precheck(db: &mut Client, key: &str, fingerprint: &str) -> String {
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

/// A decision as `idempotency_acquire` names it.
fn name(decision: i32) -> String {
    proto::Decision::try_from(decision)
        .expect("a known decision")
        .as_str_name()
        .trim_start_matches("DECISION_")
        .to_owned()
}

/// An Acquire of `key` in scope `s`, with `fingerprint` unless it is empty.
fn acquire_with(key: &str, fingerprint: &str) -> proto::AcquireRequest {
    let mut request = acquire("s", key);
    if !fingerprint.is_empty() {
        request.request_fingerprint = Some(
            proto::acquire_request::RequestFingerprint::Fingerprint(fingerprint.to_owned()),
        );
    }
    request
}

async fn server(db: &impl Backend, configure: impl FnOnce(&mut ServeConfig)) -> TestServer {
    let mut config = ServeConfig::new("127.0.0.1:0".parse().unwrap(), db.url().to_owned());
    config.sweep_interval = Duration::ZERO;
    configure(&mut config);
    start_server(config).await
}

/// A path a call can take: its name, and how its server is configured.
pub type Path = (&'static str, fn(&mut ServeConfig));

/// The paths every database has; the first is the reference.
const PATHS: [Path; 3] = [
    // A pooled connection per call, no batches, no replay cache.
    ("single call", |c| {
        c.store.shared_connections = 0;
        c.store.replay_cache_bytes = 0;
    }),
    // The defaults: shared connections, batches, replay cache on.
    ("replay cache on", |_| {}),
    // Shared connections and batches, replay cache off.
    ("replay cache off", |c| c.store.replay_cache_bytes = 0),
];

/// The servers a call can go through, on one database: one per path of
/// [`PATHS`], then one per path the database adds ([`Backend::PATHS`]).
struct Servers(Vec<(&'static str, TestServer)>);

impl Servers {
    async fn start<B: Backend>(db: &B) -> Self {
        let mut servers = Vec::new();
        for (name, configure) in PATHS.iter().chain(B::PATHS) {
            servers.push((*name, server(db, configure).await));
        }
        Servers(servers)
    }

    /// Each path's name and server, the reference first.
    fn paths(&self) -> impl Iterator<Item = (&'static str, &TestServer)> {
        self.0.iter().map(|(name, server)| (*name, server))
    }

    /// The server with the defaults.
    fn cached(&self) -> &TestServer {
        &self.0[1].1
    }
}

/// Servers whose calls of a kind run as one batch when they queue behind
/// the gate (`helpers::gate`), each with its path's name: one with the
/// defaults, then one per path the database adds ([`Backend::PATHS`]); and
/// the gate, installed in `db`.
async fn gated_servers<B: Backend>(db: &B) -> (Vec<(String, TestServer)>, Gate) {
    let gate = db.gate().await;
    let defaults: Path = ("", |_| {});
    let mut servers = Vec::new();
    for (name, configure) in std::iter::once(&defaults).chain(B::PATHS) {
        let gated = server(db, |c| {
            configure(c);
            c.store.shared_connections = 1;
            c.store.batch_workers = Some(1);
        })
        .await;
        let path = format!("group commit {name}").trim_end().to_owned();
        servers.push((path, gated));
    }
    (servers, gate)
}

/// Fails the test unless one transaction on each node wrote the rows of
/// `keys` that node holds: a group commit is one statement, one commit,
/// per node (on a Citus cluster, the batch is split by the node holding
/// each key).
async fn assert_one_writer_per_node(db: &impl Backend, keys: &[String]) {
    let writers = db.writers_per_node(keys).await;
    assert!(
        !writers.is_empty() && writers.iter().all(|n| *n == 1),
        "one statement per node wrote them all: writers per node {writers:?}"
    );
}

/// `calls` queued together behind `gate` on `gated` with `companion` (a
/// call of the other kind, below), run as one statement: the answers of
/// `calls`, in order, once the companion has passed too.
async fn batched_beside<T: Send + 'static>(
    gate: &Gate,
    gated: &TestServer,
    gate_call: tokio::task::JoinHandle<()>,
    calls: impl FnOnce() -> Vec<tokio::task::JoinHandle<T>>,
    companion: impl Future<Output = ()> + Send + 'static,
) -> Vec<T> {
    let with_companion = || {
        let mut calls: Vec<_> = calls()
            .into_iter()
            .map(|call| tokio::spawn(async move { Some(call.await.unwrap()) }))
            .collect();
        calls.push(tokio::spawn(async move {
            companion.await;
            None
        }));
        calls
    };
    let answers = gate.batched(gated, gate_call, with_companion).await;
    answers.into_iter().flatten().collect()
}

/// A Complete (success) of a lease taken on `key` now, to be queued beside
/// the Acquires of a group commit: the statement then carries both kinds,
/// as a cycle's calls share one on a busy server, and the compared answers
/// must not change for it. The future passes once it answered OK.
async fn companion_complete(server: &TestServer, key: &str) -> impl Future<Output = ()> + use<> {
    let mut client = server.client.clone();
    let token = token(&proceed(&mut client, acquire("s", key)).await);
    let request = complete("s", key, &token, success(b"companion"));
    async move {
        let answer = client.complete(request).await;
        assert!(
            answer.is_ok(),
            "the companion Complete succeeds: {answer:?}"
        );
    }
}

/// An Acquire of the new key `key`, to be queued beside the Completes of a
/// group commit (see [`companion_complete`]). The future passes once it
/// answered PROCEED.
fn companion_acquire(server: &TestServer, key: &str) -> impl Future<Output = ()> + use<> {
    let mut client = server.client.clone();
    let request = acquire("s", key);
    async move {
        proceed(&mut client, request).await;
    }
}

/// Answers compared with their reference, and the ones that disagree.
#[derive(Default)]
struct Tally {
    checked: usize,
    disagreements: Vec<String>,
}

impl Tally {
    /// Compares what `path` answered in `case` with what `reference`
    /// answers.
    fn compare<T: PartialEq + Debug>(
        &mut self,
        case: &str,
        reference: &str,
        expected: &T,
        got: &T,
    ) {
        self.checked += 1;
        if expected != got {
            self.disagreements.push(format!(
                "{case}: {reference} answers {expected:?}, this path {got:?}"
            ));
        }
    }

    /// Fails the test unless every answer agreed with its reference.
    fn assert_all_agree(&self) {
        println!("{} answers checked", self.checked);
        assert!(
            self.disagreements.is_empty(),
            "{} of {} answers disagree:\n{}",
            self.disagreements.len(),
            self.checked,
            self.disagreements.join("\n")
        );
    }
}

/// The matrix's tests on the database `$backend` (a [`Backend`]), each a
/// `#[tokio::test]` of the suite that invokes it: a suite's
/// `conformance.rs` is this one line.
#[macro_export]
macro_rules! conformance_tests {
    ($backend:ty) => {
        $crate::conformance_tests!(@each $backend;
            acquire::every_path_answers_what_idempotency_acquire_answers,
            acquire::sql_cuts_error_texts_where_the_server_does,
            new_key::a_new_key_gets_the_same_first_lease_on_every_path,
            complete::complete_leaves_the_same_record_alone_or_in_a_group_commit,
        );
    };
    (@each $backend:ty; $($module:ident :: $name:ident),* $(,)?) => {
        $(
            #[tokio::test]
            async fn $name() {
                $crate::conformance::$module::$name::<$backend>().await;
            }
        )*
    };
}

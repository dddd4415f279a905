//! `run_once_in_transaction` against the real server binary, with an
//! application table in the coordinator's own database: concurrent callers
//! on one key leave exactly one row and one result; a holder whose lease
//! was taken over cannot commit its row; a failed work's row is rolled back
//! and the failure recorded.

use std::sync::Mutex;
use std::time::Duration;

use futures::future::join_all;
use idempotency_client::proto::coordinator_client::CoordinatorClient;
use idempotency_client::proto::{
    CompleteRequest, Decision, GetRequest, Record, Status, Success, complete_request,
};
use idempotency_client::{Fingerprint, Heartbeat, InDatabase, RunOnceError, RunOptions, WorkError};
use tokio::sync::oneshot;
use tokio_postgres::{Client as PgClient, NoTls};
use tonic::transport::Channel;

use crate::database::TestDatabase;
use crate::history::{self, Entry};
use crate::process::ServerProcess;
use crate::recorder::now_us;
use crate::recording::{self, History, completed_in_transaction, violations};
use crate::support::*;

/// The server on a fresh database, which also holds the application's
/// `orders` table.
struct App {
    server: ServerProcess,
    db: TestDatabase,
}

impl App {
    async fn start() -> Self {
        let db = TestDatabase::create().await;
        let server = ServerProcess::start(&db.url).await;
        db.connect()
            .await
            .batch_execute(
                "CREATE TABLE orders (
                     id       bigserial PRIMARY KEY,
                     order_key text NOT NULL,
                     placed_by text NOT NULL
                 )",
            )
            .await
            .expect("create the application's table");
        App { server, db }
    }

    async fn client(&self) -> idempotency_client::Client {
        idempotency_client::Client::connect(
            format!("http://{}", self.server.addr),
            idempotency_client::ClientOptions::default(),
        )
        .await
        .expect("connect the client")
    }

    /// An application connection of its own.
    async fn connection(&self) -> PgClient {
        let (client, connection) = tokio_postgres::connect(&self.db.url, NoTls)
            .await
            .expect("connect to the database");
        tokio::spawn(connection);
        client
    }

    /// Who placed the orders of `key`.
    async fn orders(&self, key: &str) -> Vec<String> {
        self.connection()
            .await
            .query(
                "SELECT placed_by FROM orders WHERE order_key = $1 ORDER BY id",
                &[&key],
            )
            .await
            .expect("read the orders")
            .iter()
            .map(|row| row.get(0))
            .collect()
    }
}

/// The bare generated stub of the client library, on `server`.
async fn stub(server: &ServerProcess) -> CoordinatorClient<Channel> {
    CoordinatorClient::connect(format!("http://{}", server.addr))
        .await
        .expect("connect the stub")
}

/// The record of (scope, key), read with a bare Get.
async fn record(server: &ServerProcess, scope: &str, key: &str) -> Record {
    stub(server)
        .await
        .get(GetRequest {
            scope: scope.into(),
            key: key.into(),
        })
        .await
        .expect("get the record")
        .into_inner()
        .record
        .expect("a record")
}

/// The order's insert, as the work of every test here.
async fn place_order(
    tx: &mut tokio_postgres::Transaction<'_>,
    key: &str,
    by: &str,
) -> Result<String, WorkError<String>> {
    tx.execute(
        "INSERT INTO orders (order_key, placed_by) VALUES ($1, $2)",
        &[&key, &by],
    )
    .await
    .map_err(|e| WorkError::Retryable(e.to_string()))?;
    Ok(format!("order placed by {by}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_concurrent_callers_insert_one_row_and_all_get_its_result() {
    let app = App::start().await;
    let client = app.client().await;
    let key = fresh_key();
    let options = RunOptions {
        wait: Duration::from_secs(30),
        ..RunOptions::default()
    };
    let callers = (0..50).map(|i| {
        let (app, client, key, options) = (&app, &client, &key, &options);
        async move {
            let mut pg = app.connection().await;
            let mut tx = pg.transaction().await.expect("begin");
            let by = format!("caller-{i}");
            let done = client
                .in_database(InDatabase::default())
                .run_once_in_transaction(
                    &mut tx,
                    "orders.place",
                    key,
                    Fingerprint::None,
                    options,
                    async |tx, _lease| place_order(tx, key, &by).await,
                )
                .await;
            tx.commit().await.expect("commit");
            done
        }
    });
    let outcomes = within(
        "fifty callers to finish",
        Duration::from_secs(60),
        join_all(callers),
    )
    .await;
    let mut values = Vec::new();
    let mut ran = 0;
    for outcome in outcomes {
        let done = outcome.unwrap_or_else(|e| panic!("every caller gets the result: {e}"));
        if !done.replayed {
            ran += 1;
        }
        values.push(done.value);
    }
    assert_eq!(ran, 1, "the work ran once");
    let orders = app.orders(&key).await;
    assert_eq!(orders.len(), 1, "exactly one row: {orders:?}");
    let expected = format!("order placed by {}", orders[0]);
    assert!(values.iter().all(|v| *v == expected), "{values:?}");
    let record = record(&app.server, "orders.place", &key).await;
    assert_eq!(record.status(), Status::Succeeded);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_whose_lease_was_taken_over_cannot_commit_its_row() {
    let app = App::start().await;
    let client = app.client().await;
    let key = fresh_key();
    // No heartbeat: A's lease lapses while its work is paused.
    let options = RunOptions {
        lease_ttl: Duration::from_secs(1),
        heartbeat: Heartbeat::Off,
        ..RunOptions::default()
    };
    let (inserted, row_in) = oneshot::channel();
    let (resume, resumed) = oneshot::channel::<()>();
    let a = {
        let (app_db, key) = (app.db.url.clone(), key.clone());
        tokio::spawn(async move {
            let (mut pg, connection) = tokio_postgres::connect(&app_db, NoTls).await.unwrap();
            tokio::spawn(connection);
            let mut tx = pg.transaction().await.unwrap();
            let outcome = client
                .in_database(InDatabase::default())
                .run_once_in_transaction(
                    &mut tx,
                    "orders.place",
                    &key,
                    Fingerprint::None,
                    &options,
                    async |tx, _lease| {
                        let placed = place_order(tx, &key, "A").await;
                        inserted.send(()).unwrap();
                        resumed.await.unwrap();
                        placed
                    },
                )
                .await;
            // A commits whatever its transaction holds.
            let committed = tx.commit().await;
            (outcome, committed)
        })
    };
    within("A's insert", Duration::from_secs(10), row_in)
        .await
        .unwrap();

    // B takes the lapsed lease over and completes through the coordinator.
    let mut stub = stub(&app.server).await;
    let lease_b = eventually("B to take over", Duration::from_secs(10), || {
        let mut stub = stub.clone();
        let key = key.clone();
        async move {
            let answer = stub
                .acquire(idempotency_client::proto::AcquireRequest {
                    scope: "orders.place".into(),
                    key,
                    lease_ttl: Some(Duration::from_secs(60).try_into().unwrap()),
                    ..Default::default()
                })
                .await
                .unwrap()
                .into_inner();
            match answer.decision() {
                Decision::Proceed => answer.lease,
                _ => None,
            }
        }
    })
    .await;
    stub.complete(CompleteRequest {
        scope: "orders.place".into(),
        key: key.clone(),
        lease_token: lease_b.token,
        outcome: Some(complete_request::Outcome::Success(Success {
            result: b"\"from B\"".to_vec(),
            content_type: "application/json".into(),
            ..Success::default()
        })),
    })
    .await
    .expect("B completes");

    resume.send(()).unwrap();
    let (outcome, committed) = within("A to end", Duration::from_secs(10), a)
        .await
        .unwrap();
    assert!(
        matches!(outcome, Err(RunOnceError::LeaseLost)),
        "A hears LEASE_LOST: {outcome:?}"
    );
    // The work's writes were rolled back with its savepoint: even a caller
    // that commits anyway does not commit the side effect.
    committed.expect("A's commit, without the work's writes");
    assert!(
        app.orders(&key).await.is_empty(),
        "A's row is not in the table"
    );
    let record = record(&app.server, "orders.place", &key).await;
    assert_eq!(record.status(), Status::Succeeded);
    assert_eq!(record.result.unwrap().result, b"\"from B\"");
}

/// One `run_once_in_transaction` of `key` under `place`, committed: its work
/// inserts `by`'s order and then answers `then`.
async fn run_placing(
    app: &App,
    place: InDatabase,
    key: &str,
    by: &str,
    then: Result<String, WorkError<String>>,
) -> Result<idempotency_client::Done<String>, RunOnceError<String, String>> {
    let client = app.client().await;
    let mut pg = app.connection().await;
    let mut tx = pg.transaction().await.unwrap();
    let outcome = client
        .in_database(place)
        .run_once_in_transaction(
            &mut tx,
            "orders.place",
            key,
            Fingerprint::None,
            &RunOptions::default(),
            async |tx, _lease| {
                place_order(tx, key, by).await?;
                then
            },
        )
        .await;
    tx.commit().await.unwrap();
    outcome
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_work_leaves_no_row_and_its_failure_recorded() {
    let app = App::start().await;
    let key = fresh_key();
    let declined = Err(WorkError::Retryable("the card was declined".to_owned()));
    let outcome = run_placing(&app, InDatabase::default(), &key, "failing", declined).await;
    assert!(
        matches!(&outcome, Err(RunOnceError::Work(e)) if e == "the card was declined"),
        "{outcome:?}"
    );
    assert!(
        app.orders(&key).await.is_empty(),
        "the work's row was rolled back"
    );
    let record = record(&app.server, "orders.place", &key).await;
    assert_eq!(record.status(), Status::Failed);
    assert_eq!(record.last_error, "the card was declined");
}

/// B's `run_once_in_transaction` of `key`, committed, asked again while
/// another holder has the key, until it is done; B's completion goes into
/// `history`.
async fn retry_as_b(
    app: &App,
    client: &idempotency_client::Client,
    history: &History,
    key: &str,
    options: &RunOptions,
) -> idempotency_client::Done<String> {
    eventually(
        "B's retry to run the work",
        Duration::from_secs(15),
        || async move {
            let mut pg = app.connection().await;
            let mut tx = pg.transaction().await.unwrap();
            let token = Mutex::new(String::new());
            let start_us = now_us();
            let outcome = client
                .in_database(InDatabase::default())
                .run_once_in_transaction(
                    &mut tx,
                    "orders.place",
                    key,
                    Fingerprint::None,
                    options,
                    async |tx, lease| {
                        *token.lock().unwrap() = lease.token().to_owned();
                        place_order(tx, key, "B").await
                    },
                )
                .await;
            tx.commit().await.unwrap();
            match outcome {
                Ok(done) => {
                    let sent = serde_json::to_vec(&done.value).unwrap();
                    let token = token.into_inner().unwrap();
                    let when = (start_us, now_us());
                    let scope_key = ("orders.place", key);
                    completed_in_transaction(
                        history,
                        scope_key,
                        &token,
                        sent,
                        when,
                        Some(&done.record),
                    );
                    Some(done)
                }
                Err(RunOnceError::InProgress { .. }) => None,
                Err(RunOnceError::Call(e)) if e.code == idempotency_client::Code::Unavailable => {
                    None
                }
                Err(other) => panic!("B: {other}"),
            }
        },
    )
    .await
}

/// The history the test recorded, with its final read of `key`, holds to
/// every promise of the coordinator.
async fn assert_no_violation(app: &App, history: &History, key: &str) {
    let db = app.connection().await;
    let leases = history
        .lock()
        .unwrap()
        .iter()
        .filter(|e| matches!(e, Entry::Call(c) if c.decision == Some(history::Decision::Proceed)))
        .count();
    assert_eq!(leases, 2, "A's lease and B's are in the history");
    let violations = violations(history, &db, ("orders.place", key)).await;
    let entries = history.lock().unwrap().len();
    assert!(
        violations.is_empty(),
        "the history checker found, in {entries} calls: {violations:#?}"
    );
}

/// Ends `backend` as a killed process would (its connection closes) and
/// waits until PostgreSQL has ended it.
async fn kill(app: &App, backend: i32) {
    let admin = app.connection().await;
    admin
        .execute("SELECT pg_terminate_backend($1)", &[&backend])
        .await
        .unwrap();
    eventually("the backend to end", Duration::from_secs(10), || {
        let admin = &admin;
        async move {
            let left: i64 = admin
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity WHERE pid = $1",
                    &[&backend],
                )
                .await
                .unwrap()
                .get(0);
            (left == 0).then_some(())
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_killed_after_its_completion_before_its_commit_leaves_nothing_and_the_retry_inserts_one_row()
 {
    let app = App::start().await;
    let history = History::default();
    let client = recording::client(&format!("http://{}", app.server.addr), &history).await;
    let key = fresh_key();
    let options = RunOptions {
        lease_ttl: Duration::from_secs(1),
        heartbeat: Heartbeat::Off,
        wait: Duration::from_secs(1),
        ..RunOptions::default()
    };
    let mut pg_a = app.connection().await;
    let backend: i32 = pg_a
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0);
    let mut tx = pg_a.transaction().await.unwrap();
    let token = Mutex::new(String::new());
    let start_us = now_us();
    let completed: Result<_, RunOnceError<String, String>> = client
        .in_database(InDatabase::default())
        .run_once_in_transaction(
            &mut tx,
            "orders.place",
            &key,
            Fingerprint::None,
            &options,
            async |tx, lease| {
                *token.lock().unwrap() = lease.token().to_owned();
                place_order(tx, &key, "A").await
            },
        )
        .await;
    assert!(
        completed.is_ok(),
        "A completed in its transaction: {completed:?}"
    );
    // The process dies after the completion, before its COMMIT (and sends
    // no ROLLBACK either): its completion never answered.
    std::mem::forget(tx);
    kill(&app, backend).await;
    let sent = serde_json::to_vec("order placed by A").unwrap();
    let token = token.into_inner().unwrap();
    let when = (start_us, now_us());
    completed_in_transaction(&history, ("orders.place", &key), &token, sent, when, None);
    assert!(app.orders(&key).await.is_empty(), "A's row died with it");

    let done = retry_as_b(&app, &client, &history, &key, &options).await;
    assert!(!done.replayed, "B ran the work");
    assert_eq!(app.orders(&key).await, ["B"], "exactly one row, B's");
    let record = record(&app.server, "orders.place", &key).await;
    assert_eq!(record.status(), Status::Succeeded);
    assert_eq!(record.attempt_count, 2);
    assert_no_violation(&app, &history, &key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_killed_before_its_commit_leaves_nothing_and_the_retry_inserts_one_row() {
    let app = App::start().await;
    let history = History::default();
    let client = recording::client(&format!("http://{}", app.server.addr), &history).await;
    let key = fresh_key();
    let options = RunOptions {
        lease_ttl: Duration::from_secs(1),
        heartbeat: Heartbeat::Off,
        // B asks again rather than wait out a whole window.
        wait: Duration::from_secs(1),
        ..RunOptions::default()
    };
    // A: its statements run, then the process dies before its commit. To
    // PostgreSQL a killed process is a connection that closed: its backend
    // is terminated, and A's calls stop where they are.
    let (inserted, row_in) = oneshot::channel();
    let mut pg_a = app.connection().await;
    let backend: i32 = pg_a
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0);
    let a = {
        let (client, key, options) = (client.clone(), key.clone(), options.clone());
        tokio::spawn(async move {
            let mut tx = pg_a.transaction().await.unwrap();
            let _ = client
                .in_database(InDatabase::default())
                .run_once_in_transaction(
                    &mut tx,
                    "orders.place",
                    &key,
                    Fingerprint::None,
                    &options,
                    async |tx, _lease| -> Result<String, WorkError<String>> {
                        place_order(tx, &key, "A").await?;
                        inserted.send(()).unwrap();
                        std::future::pending().await
                    },
                )
                .await;
        })
    };
    within("A's insert", Duration::from_secs(10), row_in)
        .await
        .unwrap();
    a.abort();
    kill(&app, backend).await;
    assert!(app.orders(&key).await.is_empty(), "A's row died with it");

    // B retries once A's lease has run out.
    let done = retry_as_b(&app, &client, &history, &key, &options).await;
    assert!(!done.replayed, "B ran the work");
    assert_eq!(app.orders(&key).await, ["B"], "exactly one row, B's");
    let record = record(&app.server, "orders.place", &key).await;
    assert_eq!(record.status(), Status::Succeeded);
    assert_eq!(record.attempt_count, 2);
    assert_no_violation(&app, &history, &key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_over_the_limit_fails_the_key_for_good_and_leaves_no_row() {
    let app = App::start().await;
    let key = fresh_key();
    let big = Ok("x".repeat(1024 * 1024 + 1));
    let outcome = run_placing(&app, InDatabase::default(), &key, "too big", big).await;
    assert!(
        matches!(&outcome, Err(RunOnceError::Call(e)) if e.code == idempotency_client::Code::InvalidArgument),
        "{outcome:?}"
    );
    assert!(app.orders(&key).await.is_empty(), "the row was rolled back");
    // Failed for good, not given back to run again.
    let record = record(&app.server, "orders.place", &key).await;
    assert_eq!(record.status(), Status::FailedPermanent);
    assert_eq!(record.attempt_count, 1);
    assert!(
        record.last_error.contains("p_result"),
        "{}",
        record.last_error
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_tenant_is_named_and_the_lease_given_back() {
    let app = App::start().await;
    let key = fresh_key();
    let elsewhere = InDatabase {
        tenant: "someone-else".into(),
        ..InDatabase::default()
    };
    let placed = Ok("order placed".to_owned());
    let outcome = run_placing(&app, elsewhere, &key, "wrong tenant", placed).await;
    let Err(RunOnceError::Call(error)) = &outcome else {
        panic!("{outcome:?}");
    };
    assert_eq!(error.reason.as_deref(), Some("RECORD_NOT_FOUND"));
    assert!(
        error.message.contains("\"someone-else\""),
        "{}",
        error.message
    );
    assert!(app.orders(&key).await.is_empty(), "the row was rolled back");
    // Released (FAILED, due now, the attempt not counted), not left
    // PROCESSING until the lease runs out.
    let record = record(&app.server, "orders.place", &key).await;
    assert_eq!(record.status(), Status::Failed, "{record:?}");
    assert_eq!(record.attempt_count, 0, "{record:?}");
}

//! `idempotency_complete_in_tx`, called on an application's own connection
//! inside its own transaction: Complete's decisions and refusals as SQL
//! errors that stop the transaction from committing, the result visible
//! (to the coordinator, its replays and its waiters on any replica) only
//! once the transaction commits, and the schema installed in a schema of
//! its own in an application's database.

use std::time::{Duration, Instant};

use idempotency_coordinator::proto::{Decision, Status};
use tokio::sync::mpsc;
use tokio_postgres::{AsyncMessage, Client, NoTls};
use tonic_types::StatusExt;

use crate::helpers::*;

/// The function's call, on the application's connection.
const COMPLETE_IN_TX: &str = "SELECT status FROM idempotency_complete_in_tx(\
     'default', $1::text, $2::text, $3::text::uuid, $4::bytea, 'application/json', 0, '')";

const ORDERS: &str = "CREATE TABLE orders (order_key text NOT NULL, placed_by text NOT NULL)";

/// The SQLSTATE and DETAIL of a statement the database refused.
fn refused(error: &tokio_postgres::Error) -> (String, String) {
    let db = error.as_db_error().expect("a database error");
    (
        db.code().code().to_owned(),
        db.detail().unwrap_or_default().to_owned(),
    )
}

/// Runs `sql` in a transaction of its own and returns the error it raised.
async fn refusal(
    pg: &mut Client,
    sql: &str,
    params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
) -> (String, String) {
    let tx = pg.transaction().await.unwrap();
    let error = tx.query(sql, params).await.expect_err("refused");
    tx.rollback().await.unwrap();
    refused(&error)
}

#[tokio::test]
async fn the_result_is_stored_at_commit_and_every_refusal_stops_the_transaction() {
    let app = spawn_app().await;
    let mut c = app.client.clone();
    let mut pg = app.db.connect().await;
    pg.batch_execute(ORDERS).await.unwrap();

    let held = proceed(&mut c, acquire("orders", "k1")).await;
    let token = token(&held);
    let tx = pg.transaction().await.unwrap();
    tx.execute("INSERT INTO orders VALUES ('k1', 'holder')", &[])
        .await
        .unwrap();
    let row = tx
        .query_one(
            COMPLETE_IN_TX,
            &[&"orders", &"k1", &token, &b"\"placed\"".as_slice()],
        )
        .await
        .unwrap();
    assert_eq!(row.get::<_, String>(0), "SUCCEEDED");
    // Not committed: the coordinator still sees the lease.
    let record = get_record(&mut c, get_req("orders", "k1")).await;
    assert_eq!(status_of(&record), Status::Processing);
    tx.commit().await.unwrap();

    let replay = c
        .acquire(acquire("orders", "k1"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(decision(&replay), Decision::AlreadyDone);
    assert_eq!(replay.record.unwrap().result.unwrap().result, b"\"placed\"");
    // The same holder again: OK, nothing changes.
    let again = pg
        .query_one(
            COMPLETE_IN_TX,
            &[&"orders", &"k1", &token, &b"\"other\"".as_slice()],
        )
        .await
        .unwrap();
    assert_eq!(again.get::<_, String>(0), "SUCCEEDED");
    let record = get_record(&mut c, get_req("orders", "k1")).await;
    assert_eq!(record.result.unwrap().result, b"\"placed\"");

    // Another lease's token: LEASE_LOST.
    let other = proceed(&mut c, acquire("orders", "k2")).await;
    let stranger = uuid::Uuid::new_v4().to_string();
    let params: [&(dyn tokio_postgres::types::ToSql + Sync); 4] =
        [&"orders", &"k2", &stranger, &b"1".as_slice()];
    assert_eq!(
        refusal(&mut pg, COMPLETE_IN_TX, &params).await,
        ("IK002".to_owned(), "LEASE_LOST".to_owned())
    );
    // No record: RECORD_NOT_FOUND.
    let params: [&(dyn tokio_postgres::types::ToSql + Sync); 4] =
        [&"orders", &"none", &stranger, &b"1".as_slice()];
    assert_eq!(
        refusal(&mut pg, COMPLETE_IN_TX, &params).await,
        ("IK001".to_owned(), "RECORD_NOT_FOUND".to_owned())
    );
    // A lease completed with a failure: ALREADY_COMPLETED.
    let other_token = crate::helpers::token(&other);
    c.complete(complete("orders", "k2", &other_token, failure("declined")))
        .await
        .unwrap();
    let params: [&(dyn tokio_postgres::types::ToSql + Sync); 4] =
        [&"orders", &"k2", &other_token, &b"1".as_slice()];
    assert_eq!(
        refusal(&mut pg, COMPLETE_IN_TX, &params).await,
        ("IK003".to_owned(), "ALREADY_COMPLETED".to_owned())
    );
}

#[tokio::test]
async fn bad_arguments_are_refused_with_the_argument_named() {
    let app = spawn_app().await;
    let mut pg = app.db.connect().await;
    let token = uuid::Uuid::new_v4().to_string();
    let null_token =
        "SELECT * FROM idempotency_complete_in_tx('default', 's', 'k', NULL, 'x', '', 0, '')";
    let tx = pg.transaction().await.unwrap();
    let error = tx.query(null_token, &[]).await.unwrap_err();
    tx.rollback().await.unwrap();
    let db = error.as_db_error().unwrap();
    assert_eq!(db.code().code(), "22023");
    assert_eq!(db.detail(), Some("p_token"), "the argument in DETAIL");
    assert!(
        db.message().contains("p_token must not be NULL"),
        "{}",
        db.message()
    );

    let long_type = "x".repeat(256);
    let sql = "SELECT * FROM idempotency_complete_in_tx('default', 's', 'k', $1::text::uuid, 'x', $2, 0, '')";
    let params: [&(dyn tokio_postgres::types::ToSql + Sync); 2] = [&token, &long_type];
    assert_eq!(
        refusal(&mut pg, sql, &params).await,
        ("22023".to_owned(), "p_content_type".to_owned())
    );
    let big = vec![0_u8; 1024 * 1024 + 1];
    let sql = "SELECT * FROM idempotency_complete_in_tx('default', 's', 'k', $1::text::uuid, $2, '', 0, '')";
    let params: [&(dyn tokio_postgres::types::ToSql + Sync); 2] = [&token, &big];
    assert_eq!(
        refusal(&mut pg, sql, &params).await,
        ("22023".to_owned(), "p_result".to_owned())
    );
}

/// The payloads of `idempotency_changes` as a connection of the test's own
/// hears them.
async fn listen(url: &str) -> (Client, mpsc::UnboundedReceiver<String>) {
    let (client, mut connection) = tokio_postgres::connect(url, NoTls).await.unwrap();
    let (heard, payloads) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Some(Ok(message)) = std::future::poll_fn(|cx| connection.poll_message(cx)).await {
            if let AsyncMessage::Notification(n) = message {
                let _ = heard.send(n.payload().to_owned());
            }
        }
    });
    client
        .batch_execute("LISTEN idempotency_changes")
        .await
        .unwrap();
    (client, payloads)
}

/// The next payload heard, within a deadline.
async fn next_heard(payloads: &mut mpsc::UnboundedReceiver<String>) -> String {
    tokio::time::timeout(Duration::from_secs(10), payloads.recv())
        .await
        .expect("a notification within 10 s")
        .expect("the listener runs")
}

#[tokio::test]
async fn a_commit_wakes_a_waiter_on_another_replica_and_a_rollback_wakes_nobody() {
    let db = TestDatabase::create().await;
    let (one, two) = tokio::join!(ServerProcess::start(&db.url), ServerProcess::start(&db.url));
    let (mut c1, mut c2) = (one.client().await, two.client().await);
    let mut pg = db.connect().await;
    pg.batch_execute(ORDERS).await.unwrap();
    let (_listening, mut payloads) = listen(&db.url).await;

    let held = proceed(&mut c1, acquire("orders", "k")).await;
    let token = token(&held);
    let waiter = tokio::spawn(async move {
        let answer = c2
            .acquire(waiting("orders", "k", 30))
            .await
            .unwrap()
            .into_inner();
        (answer, Instant::now())
    });
    // The waiter on replica two has marked the record watched.
    eventually(
        "the waiter to watch the record",
        Duration::from_secs(10),
        || {
            let pg = &pg;
            async move {
                let row = pg
                    .query_one("SELECT watch_until IS NOT NULL FROM idempotency_keys", &[])
                    .await
                    .unwrap();
                row.get::<_, bool>(0).then_some(())
            }
        },
    )
    .await;

    // Completed, then rolled back: no notification, the record PROCESSING,
    // and no replica replays the result.
    let tx = pg.transaction().await.unwrap();
    tx.execute("INSERT INTO orders VALUES ('k', 'rolled back')", &[])
        .await
        .unwrap();
    tx.query_one(
        COMPLETE_IN_TX,
        &[&"orders", &"k", &token, &b"\"lost\"".as_slice()],
    )
    .await
    .unwrap();
    tx.rollback().await.unwrap();
    pg.execute("SELECT pg_notify('idempotency_changes', 'sentinel-1')", &[])
        .await
        .unwrap();
    assert_eq!(
        next_heard(&mut payloads).await,
        "sentinel-1",
        "the rollback notified"
    );
    assert!(!waiter.is_finished(), "the rollback woke the waiter");
    let record = get_record(&mut c1, get_req("orders", "k")).await;
    assert_eq!(status_of(&record), Status::Processing);
    let mut c3 = two.client().await;
    let now = c3
        .acquire(acquire("orders", "k"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(decision(&now), Decision::InProgress);

    // Completed and committed: one notification, and the waiter wakes.
    let tx = pg.transaction().await.unwrap();
    tx.execute("INSERT INTO orders VALUES ('k', 'committed')", &[])
        .await
        .unwrap();
    tx.query_one(
        COMPLETE_IN_TX,
        &[&"orders", &"k", &token, &b"\"kept\"".as_slice()],
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();
    let committed = Instant::now();
    let (answer, woke) = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the waiter wakes")
        .unwrap();
    assert_eq!(decision(&answer), Decision::AlreadyDone);
    assert_eq!(answer.record.unwrap().result.unwrap().result, b"\"kept\"");
    // Woken by the commit's notification: with the listener up nothing else
    // wakes a waiter before its 30 s wait runs out. The bound is generous so
    // that a loaded machine does not fail it; the figure is printed.
    let after = woke.saturating_duration_since(committed);
    eprintln!("the waiter woke {after:?} after the commit returned");
    assert!(
        after < Duration::from_secs(2),
        "woke {after:?} after the commit"
    );
    assert_eq!(next_heard(&mut payloads).await, "default\norders\nk");
    let placed: Vec<String> = pg
        .query("SELECT placed_by FROM orders", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(placed, ["committed"]);
}

/// `url` with a search_path of `schema` for every session it opens.
fn with_search_path(url: &str, schema: &str) -> String {
    let separator = if url.contains('?') { '&' } else { '?' };
    format!("{url}{separator}options=-c%20search_path%3D{schema}")
}

#[tokio::test]
async fn the_schema_installed_in_a_schema_of_its_own_beside_a_table_of_the_same_name() {
    let db = TestDatabase::create().await;
    let pg = db.connect().await;
    // The application's own table happens to have one of our names.
    pg.batch_execute(
        "CREATE TABLE idempotency_keys (id integer PRIMARY KEY, note text);
         INSERT INTO idempotency_keys VALUES (1, 'the application''s');
         CREATE TABLE orders (order_key text NOT NULL, placed_by text NOT NULL);
         CREATE SCHEMA idempotency",
    )
    .await
    .unwrap();
    let url = with_search_path(&db.url, "idempotency");
    let migrated = tokio::process::Command::new(env!("CARGO_BIN_EXE_idempotency-coordinator"))
        .args(["--log-format", "json", "migrate", "--database-url", &url])
        .env_remove("RUST_LOG")
        .env_remove("DATABASE_URL")
        .kill_on_drop(true)
        .output();
    let migrated = tokio::time::timeout(Duration::from_secs(60), migrated)
        .await
        .expect("migrate exits")
        .unwrap();
    assert!(migrated.status.success(), "{migrated:?}");
    let server = ServerProcess::start(&url).await;
    let mut c = server.client().await;

    let held = proceed(&mut c, acquire("orders", "k")).await;
    let token = token(&held);
    let mut app = db.connect().await;
    let tx = app.transaction().await.unwrap();
    tx.execute("INSERT INTO orders VALUES ('k', 'app')", &[])
        .await
        .unwrap();
    let qualified = COMPLETE_IN_TX.replace(
        "FROM idempotency_complete_in_tx",
        "FROM idempotency.idempotency_complete_in_tx",
    );
    tx.query_one(
        &qualified,
        &[&"orders", &"k", &token, &b"\"placed\"".as_slice()],
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();

    let replay = c
        .acquire(acquire("orders", "k"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(decision(&replay), Decision::AlreadyDone);
    let apps: Vec<String> = pg
        .query("SELECT note FROM public.idempotency_keys", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(
        apps,
        ["the application's"],
        "the application's table untouched"
    );
    let ours: i64 = pg
        .query_one(
            "SELECT count(*) FROM pg_class
              WHERE relnamespace = 'public'::regnamespace AND relkind IN ('r', 'S')
                AND relname LIKE 'idempotency%'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        ours, 1,
        "nothing of ours in public but the application's table"
    );
    let functions: i64 = pg
        .query_one(
            "SELECT count(*) FROM pg_proc WHERE pronamespace = 'public'::regnamespace",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(functions, 0, "no function of ours in public");
}

#[tokio::test]
async fn a_record_locked_by_an_open_transaction_does_not_stall_other_keys() {
    // One shared connection: a statement stuck on the lock would hold up
    // every call pipelined behind it.
    let app = spawn_app_with(|c| c.store.shared_connections = 1).await;
    let mut c = app.client.clone();
    let mut pg = app.db.connect().await;
    pg.batch_execute(ORDERS).await.unwrap();
    let held = proceed(&mut c, acquire("orders", "locked")).await;
    let token = token(&held);
    let tx = pg.transaction().await.unwrap();
    tx.query_one(
        COMPLETE_IN_TX,
        &[&"orders", &"locked", &token, &b"\"placed\"".as_slice()],
    )
    .await
    .unwrap();

    // The same key first, so that the other key's statement queues behind
    // it on the one connection. A caller that will wait for the record marks
    // it watched, which takes its row lock.
    let mut same = c.clone();
    let same = tokio::spawn(async move {
        let started = Instant::now();
        let answer = same.acquire(waiting("orders", "locked", 30)).await;
        (answer, started.elapsed())
    });
    tokio::time::sleep(Duration::from_millis(20)).await;
    let started = Instant::now();
    let other = c.acquire(acquire("orders", "other")).await.unwrap();
    let other_took = started.elapsed();
    assert_eq!(decision(other.get_ref()), Decision::Proceed);
    assert!(
        other_took < Duration::from_secs(1),
        "an unrelated key took {other_took:?}"
    );
    let (answer, same_took) = tokio::time::timeout(Duration::from_secs(5), same)
        .await
        .expect("the locked key answers")
        .unwrap();
    let status = answer.expect_err("the locked key is refused for now");
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    assert!(
        status.get_error_details().retry_info().is_some(),
        "a retry delay"
    );
    assert!(
        same_took < Duration::from_secs(1),
        "the locked key took {same_took:?}"
    );

    tx.commit().await.unwrap();
    let replay = c
        .acquire(acquire("orders", "locked"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(decision(&replay), Decision::AlreadyDone);
    assert_eq!(replay.record.unwrap().result.unwrap().result, b"\"placed\"");
}

/// The function's argument types, to grant it.
const SIGNATURE: &str =
    "idempotency_complete_in_tx(text, text, text, uuid, bytea, text, integer, text)";

/// A connection to `db` as `role`, run on a task of its own.
async fn connect_as(db: &TestDatabase, role: &str) -> Client {
    let mut config: tokio_postgres::Config = db.url.parse().unwrap();
    config.user(role);
    let (client, connection) = config.connect(NoTls).await.unwrap();
    tokio::spawn(connection);
    client
}

#[tokio::test]
async fn an_application_role_completes_only_once_granted_and_never_reads_the_records() {
    let app = spawn_app().await;
    let mut c = app.client.clone();
    let owner = app.db.connect().await;
    let role = format!("app_{}", app.db.name);
    owner
        .batch_execute(&format!(
            "{ORDERS}; DROP ROLE IF EXISTS {role}; CREATE ROLE {role} LOGIN;
             GRANT INSERT ON orders TO {role}"
        ))
        .await
        .unwrap();
    let held = proceed(&mut c, acquire("orders", "k")).await;
    let token = token(&held);
    let mut pg = connect_as(&app.db, &role).await;
    let params: [&(dyn tokio_postgres::types::ToSql + Sync); 4] =
        [&"orders", &"k", &token, &b"\"placed\"".as_slice()];
    let tx = pg.transaction().await.unwrap();
    let error = tx.query(COMPLETE_IN_TX, &params).await.unwrap_err();
    tx.rollback().await.unwrap();
    let db = error.as_db_error().unwrap();
    assert_eq!(db.code().code(), "42501", "executed before it was granted");
    assert!(
        db.message().contains("function idempotency_complete_in_tx"),
        "{}",
        db.message()
    );

    owner
        .batch_execute(&format!("GRANT EXECUTE ON FUNCTION {SIGNATURE} TO {role}"))
        .await
        .unwrap();
    for read in [
        "SELECT count(*) FROM idempotency_keys",
        "UPDATE idempotency_keys SET attempt_count = 0",
    ] {
        assert_eq!(refusal(&mut pg, read, &[]).await.0, "42501", "{read}");
    }
    // A temporary table of the caller's session named as ours is not
    // where the function looks.
    pg.batch_execute("CREATE TEMP TABLE idempotency_keys (id integer)")
        .await
        .unwrap();
    let tx = pg.transaction().await.unwrap();
    tx.execute("INSERT INTO orders VALUES ('k', 'app')", &[])
        .await
        .unwrap();
    let row = tx.query_one(COMPLETE_IN_TX, &params).await.unwrap();
    assert_eq!(row.get::<_, String>(0), "SUCCEEDED");
    tx.commit().await.unwrap();
    let shadow: i64 = pg
        .query_one("SELECT count(*) FROM pg_temp.idempotency_keys", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(shadow, 0);
    drop(pg);

    let replay = c
        .acquire(acquire("orders", "k"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(decision(&replay), Decision::AlreadyDone);
    assert_eq!(replay.record.unwrap().result.unwrap().result, b"\"placed\"");
    owner
        .batch_execute(&format!("DROP OWNED BY {role}; DROP ROLE {role}"))
        .await
        .unwrap();
}

#[tokio::test]
async fn a_transaction_that_is_not_read_committed_is_refused_by_name() {
    let app = spawn_app().await;
    let mut c = app.client.clone();
    let mut pg = app.db.connect().await;
    let held = proceed(&mut c, acquire("orders", "k")).await;
    let token = token(&held);
    for level in ["REPEATABLE READ", "SERIALIZABLE"] {
        let tx = pg.transaction().await.unwrap();
        tx.batch_execute(&format!("SET TRANSACTION ISOLATION LEVEL {level}"))
            .await
            .unwrap();
        let error = tx
            .query(
                COMPLETE_IN_TX,
                &[&"orders", &"k", &token, &b"\"placed\"".as_slice()],
            )
            .await
            .unwrap_err();
        tx.rollback().await.unwrap();
        let db = error.as_db_error().unwrap();
        assert_eq!(db.code().code(), "0A000", "{level}");
        assert!(
            db.message().contains(level) && db.message().contains("READ COMMITTED is required"),
            "{}",
            db.message()
        );
    }
    // Refused, not completed: the lease is still the holder's.
    let tx = pg.transaction().await.unwrap();
    let row = tx
        .query_one(
            COMPLETE_IN_TX,
            &[&"orders", &"k", &token, &b"\"placed\"".as_slice()],
        )
        .await
        .unwrap();
    assert_eq!(row.get::<_, String>(0), "SUCCEEDED");
    tx.commit().await.unwrap();
}

//! Batches on demand: a trigger holds the statement of every "gate" key on
//! an advisory lock the test owns. While a server's one batch worker of a
//! kind waits there, the next calls of that kind queue; opening the gate
//! lets them run as one batch.

use std::time::Duration;

use tokio::task::JoinHandle;

use super::polling::eventually;
use super::server::TestServer;

/// The advisory lock the gate trigger waits on.
pub const GATE_LOCK: i64 = 4242;

/// Installs the gate trigger: an INSERT or UPDATE of a key named `gate…`
/// waits while the test holds [`GATE_LOCK`]. Servers meant to batch behind
/// it run one shared connection (`shared_connections = 1`), so one batch
/// worker per kind.
pub async fn install_gate(db: &tokio_postgres::Client) {
    db.batch_execute(&format!(
        "CREATE FUNCTION test_gate() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
             IF NEW.idempotency_key LIKE 'gate%' THEN
                 PERFORM pg_advisory_xact_lock_shared({GATE_LOCK});
             END IF;
             RETURN NEW;
         END $$;
         CREATE TRIGGER test_gate BEFORE INSERT OR UPDATE ON idempotency_keys
             FOR EACH ROW EXECUTE FUNCTION test_gate();"
    ))
    .await
    .expect("install the gate trigger");
}

/// With the gate shut and `gate_call` started: once that call waits at the
/// gate (keeping the one worker busy), starts `calls`, and opens the gate
/// once all of them wait in the server's queue. Returns the calls' answers.
pub async fn batched<T: Send + 'static>(
    server: &TestServer,
    db: &tokio_postgres::Client,
    gate_call: JoinHandle<()>,
    calls: impl FnOnce() -> Vec<JoinHandle<T>>,
) -> Vec<T> {
    until_gate_holds(db).await;
    let calls = calls();
    until_queued(server, calls.len()).await;
    open_gate(db, gate_call).await;
    let mut answers = Vec::new();
    for call in calls {
        answers.push(call.await.unwrap());
    }
    answers
}

/// Statements waiting at the gate.
pub async fn at_the_gate(db: &tokio_postgres::Client) -> i64 {
    db.query_one(
        "SELECT count(*) FROM pg_stat_activity \
         WHERE datname = current_database() AND wait_event = 'advisory'",
        &[],
    )
    .await
    .unwrap()
    .get(0)
}

/// Until a statement waits at the gate.
pub async fn until_gate_holds(db: &tokio_postgres::Client) {
    eventually(
        "a call to wait at the gate",
        Duration::from_secs(10),
        || async {
            let waiting = at_the_gate(db).await;
            (waiting > 0).then_some(())
        },
    )
    .await;
}

/// Until `n` calls wait in the server's queue for a batch.
pub async fn until_queued(server: &TestServer, n: usize) {
    eventually("the calls to queue", Duration::from_secs(10), || async {
        (server.store.queued_calls() == n).then_some(())
    })
    .await;
}

/// Lets the gate call through and waits for it.
pub async fn open_gate(db: &tokio_postgres::Client, gate_call: JoinHandle<()>) {
    db.execute("SELECT pg_advisory_unlock($1)", &[&GATE_LOCK])
        .await
        .unwrap();
    gate_call.await.unwrap();
}

/// Takes the gate's lock: from now on a gate key's statement waits.
pub async fn shut_gate(db: &tokio_postgres::Client) {
    db.execute("SELECT pg_advisory_lock($1)", &[&GATE_LOCK])
        .await
        .unwrap();
}

/// Transactions that last wrote the rows of these keys.
pub async fn writers(db: &tokio_postgres::Client, keys: &[String]) -> i64 {
    db.query_one(
        "SELECT count(DISTINCT xmin::text) FROM idempotency_keys WHERE idempotency_key = ANY($1)",
        &[&keys],
    )
    .await
    .unwrap()
    .get(0)
}

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
/// it run one shared connection and one batch worker
/// (`shared_connections = 1`, `batch_workers = 1`).
pub async fn install_gate(db: &tokio_postgres::Client) {
    // One statement at a time: Citus sends each to the workers as it came,
    // and a worker refuses several commands in one.
    db.batch_execute(&format!(
        "CREATE FUNCTION test_gate() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
             IF NEW.idempotency_key LIKE 'gate%' THEN
                 -- The server's lock_timeout is not for the gate: it
                 -- stays shut as long as the test needs.
                 PERFORM set_config('lock_timeout', '0', true);
                 PERFORM pg_advisory_xact_lock_shared({GATE_LOCK});
             END IF;
             RETURN NEW;
         END $$"
    ))
    .await
    .expect("install the gate function");
    db.batch_execute(
        "CREATE TRIGGER test_gate BEFORE INSERT OR UPDATE ON idempotency_keys
             FOR EACH ROW EXECUTE FUNCTION test_gate()",
    )
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
    waiting_on(db, "advisory").await
}

/// Statements of the database waiting on `event` (`pg_stat_activity`'s
/// `wait_event`: `advisory`, `transactionid`, …).
pub async fn waiting_on(db: &tokio_postgres::Client, event: &str) -> i64 {
    db.query_one(
        "SELECT count(*) FROM pg_stat_activity \
         WHERE datname = current_database() AND wait_event = $1",
        &[&event],
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

/// The gate's lock held from connections of the test's own, one per node
/// where the gate trigger runs: one on a single PostgreSQL; on a Citus
/// cluster one per worker, since the trigger runs on the worker holding the
/// key's shard and advisory locks are each node's own.
pub struct Gate {
    holders: Vec<tokio_postgres::Client>,
}

impl Gate {
    /// A gate whose lock `holders` take and release, and whose waiters are
    /// counted on their nodes (each connected to the test's database).
    pub fn held_by(holders: Vec<tokio_postgres::Client>) -> Gate {
        Gate { holders }
    }

    /// Takes the lock on every node: from now on a gate key's statement
    /// waits, wherever it runs.
    pub async fn shut(&self) {
        for holder in &self.holders {
            shut_gate(holder).await;
        }
    }

    /// Statements waiting at the gate, on every node.
    pub async fn waiting(&self) -> i64 {
        let mut waiting = 0;
        for holder in &self.holders {
            waiting += at_the_gate(holder).await;
        }
        waiting
    }

    /// As [`batched`], with the gate held on every node.
    pub async fn batched<T: Send + 'static>(
        &self,
        server: &TestServer,
        gate_call: JoinHandle<()>,
        calls: impl FnOnce() -> Vec<JoinHandle<T>>,
    ) -> Vec<T> {
        eventually(
            "a call to wait at the gate",
            Duration::from_secs(10),
            || async { (self.waiting().await > 0).then_some(()) },
        )
        .await;
        let calls = calls();
        until_queued(server, calls.len()).await;
        for holder in &self.holders {
            holder
                .execute("SELECT pg_advisory_unlock($1)", &[&GATE_LOCK])
                .await
                .unwrap();
        }
        gate_call.await.unwrap();
        let mut answers = Vec::new();
        for call in calls {
            answers.push(call.await.unwrap());
        }
        answers
    }
}

//! Whether a waiter on a key that lives on a node added while the server
//! runs is woken by its holder's Complete: the listener follows the nodes
//! `pg_dist_node` lists.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use idempotency_coordinator::proto::{self, complete_request::Outcome};

use crate::client::Recording;
use crate::setup::Env;

/// The waiter's window; the holder's lease is longer, so only a
/// notification (or the window's end) answers the waiter.
const WINDOW_SECS: i64 = 4;
const LEASE_SECS: i64 = 30;
/// A waiter that answers within this of the Complete heard it.
pub const HEARD_WITHIN: Duration = Duration::from_secs(1);

fn seconds(s: i64) -> Option<prost_types::Duration> {
    Some(prost_types::Duration {
        seconds: s,
        nanos: 0,
    })
}

/// Holds `key`, parks a waiter on it, completes it, and returns how long
/// after the Complete the waiter answered.
pub async fn waiter_answers_after(env: &Env, key: &str) -> Duration {
    let history = Arc::new(Mutex::new(Vec::new()));
    let mut holder = Recording::connect(env.addr, Arc::clone(&history)).await;
    let acquire = |request_id: &str, wait: Option<prost_types::Duration>| proto::AcquireRequest {
        scope: "listening".into(),
        key: key.into(),
        request_id: request_id.into(),
        lease_ttl: seconds(LEASE_SECS),
        wait,
        ..Default::default()
    };
    let lease = holder
        .acquire(acquire("holder", None), Duration::from_secs(5))
        .await
        .expect("an answer")
        .expect("the holder's Acquire")
        .lease
        .expect("the holder's lease");
    let mut waiter = Recording::connect(env.addr, history).await;
    let parked_before = env.hub.parked();
    let waiting = tokio::spawn({
        let req = acquire("waiter", seconds(WINDOW_SECS));
        async move {
            waiter.acquire(req, Duration::from_secs(10)).await;
            Instant::now()
        }
    });
    let end = Instant::now() + Duration::from_secs(5);
    while env.hub.parked() <= parked_before {
        assert!(Instant::now() < end, "the waiter did not park");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let complete = proto::CompleteRequest {
        scope: "listening".into(),
        key: key.into(),
        lease_token: lease.token,
        outcome: Some(Outcome::Success(proto::Success {
            result: b"done".to_vec(),
            content_type: "text/plain".into(),
            status_code: 200,
            result_ref: String::new(),
        })),
    };
    holder
        .complete(complete, Duration::from_secs(5))
        .await
        .expect("an answer")
        .expect("the holder's Complete");
    let completed = Instant::now();
    let answered = waiting.await.expect("the waiter");
    answered.saturating_duration_since(completed)
}

/// The server's sessions on a worker: only its listener connects to the
/// workers (calls go through the coordinator).
const SERVER_SESSIONS: &str = "FROM pg_stat_activity WHERE datname = current_database() \
     AND application_name = 'idempotency-coordinator'";

/// Waits until the server's listener has a session on the node on `port`.
pub async fn until_listening_on(env: &Env, port: u16, within: Duration) {
    let node = env.db.connect_worker(port).await;
    let end = Instant::now() + within;
    loop {
        let n: i64 = node
            .query_one(&format!("SELECT count(*) {SERVER_SESSIONS}"), &[])
            .await
            .expect("read pg_stat_activity")
            .get(0);
        if n > 0 {
            return;
        }
        assert!(
            Instant::now() < end,
            "no LISTEN session on the node on {port}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

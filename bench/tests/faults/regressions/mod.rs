//! Defects an earlier probe found, held as behaviour: each test fails while
//! its defect is there. By family: readiness that tells the truth
//! (`readiness`), calls answered in time and with the right code
//! (`answer_times`), and nothing committed after its caller heard an error
//! (`late_commits`). Each test keeps the letter it was found under.

use std::time::Duration;

use idempotency_bench::history::Entry;
use idempotency_bench::recorder::now_us;
use idempotency_coordinator::proto;

use crate::client::Recording;
use crate::harness::*;

mod answer_times;
mod late_commits;
mod readiness;

/// A few calls, so that the server's shared connections are open: the
/// calls of the test then go out on them (not on new connections, which a
/// cut network would stop at --connect-wait).
async fn warm_up(client: &mut Recording) {
    for i in 0..4 {
        let req = proto::AcquireRequest {
            scope: SCOPE.into(),
            key: format!("warm-{i}"),
            ..Default::default()
        };
        let answer = client.acquire(req, Duration::from_secs(5)).await;
        assert!(matches!(answer, Some(Ok(_))), "warm-up: {answer:?}");
    }
}

/// A server on its own PostgreSQL behind the proxy, with `flags`, ready.
async fn ready_env(flags: &[&'static str]) -> (Env, Monitor) {
    let env = Env::start(1, flags).await;
    let monitor = Monitor::start(env.addr(0)).await;
    assert!(
        monitor
            .until(now_us(), Duration::from_secs(10), ready)
            .await
            .is_some()
    );
    (env, monitor)
}

type History = std::sync::Arc<std::sync::Mutex<Vec<Entry>>>;

/// A recording client of `env`'s server, its shared connections warmed up,
/// and its (then empty) history.
async fn warm_client(env: &Env) -> (Recording, History) {
    let history = History::default();
    let mut client = Recording::connect(env.addr(0), std::sync::Arc::clone(&history)).await;
    warm_up(&mut client).await;
    history.lock().unwrap().clear();
    (client, history)
}

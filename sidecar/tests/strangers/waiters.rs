//! Waiters by the hundred on one client connection, on a key a slow
//! upstream call holds: they are bounded (past the bound, 503 at once) and
//! wait on a coordinator connection of their own, so other clients' keyed
//! POSTs are still decided at once.

use std::time::{Duration, Instant};

use futures_util::future::join_all;
use http::{Method, StatusCode};

use crate::polling::eventually;
use crate::support::{Coordinator, TestClient, fresh_key, start_sidecar};
use crate::upstream::TestUpstream;

const WAITERS: usize = 200;
const PER_CONNECTION: usize = 32;

#[tokio::test]
async fn keyed_posts_are_answered_within_1s_while_200_requests_wait_on_one_connection() {
    // The coordinator's stream limit scaled down with the waiters (the
    // probe: 1,000 waiters against its default 1,000).
    let coordinator = Coordinator::start_with(&["--max-concurrent-streams", "100"]).await;
    let upstream = TestUpstream::start().await;
    let sidecar = start_sidecar(&upstream.url(), &coordinator.endpoint(), &[]).await;
    let client = TestClient::new(sidecar.addr);
    let key = fresh_key();
    let holder = tokio::spawn({
        let (client, key) = (client.clone(), key.clone());
        async move { client.post("/gate", &key, "{}").await }
    });
    eventually(
        "the slow call upstream",
        Duration::from_secs(10),
        || async { (upstream.count("/gate") == 1).then_some(()) },
    )
    .await;
    let one_connection = TestClient::h2c(sidecar.addr);
    let waiting = tokio::spawn(join_all((0..WAITERS).map(|_| {
        let (client, key) = (one_connection.clone(), key.clone());
        async move {
            let prefer = [("prefer", "wait=30")];
            client
                .send(Method::POST, "/gate", Some(&key), "{}", &prefer)
                .await
        }
    })));
    // Others' keyed POSTs, one after another for 3 s, each decided at once.
    let mut answered = 0;
    let window = Instant::now();
    while window.elapsed() < Duration::from_secs(3) {
        let started = Instant::now();
        let reply = client.post("/pay", &fresh_key(), "{\"amount\":1}").await;
        let took = started.elapsed();
        assert_eq!(
            reply.status,
            StatusCode::CREATED,
            "after {took:?} with {WAITERS} waiters: {reply:?}"
        );
        assert!(
            took < Duration::from_secs(1),
            "a keyed POST took {took:?} with {WAITERS} waiters on one connection"
        );
        answered += 1;
    }
    upstream.open_gate();
    assert_eq!(holder.await.unwrap().status, StatusCode::CREATED);
    let replies = waiting.await.unwrap();
    let busy: Vec<_> = replies
        .iter()
        .filter(|r| r.status == StatusCode::SERVICE_UNAVAILABLE)
        .collect();
    let replayed = replies
        .iter()
        .filter(|r| r.status == StatusCode::CREATED && r.replayed())
        .count();
    assert_eq!(
        busy.len(),
        WAITERS - PER_CONNECTION,
        "refused past the connection's waiters"
    );
    assert_eq!(
        replayed, PER_CONNECTION,
        "the waiters admitted got the answer"
    );
    for reply in busy {
        assert!(reply.problem_type().ends_with("#busy"), "{reply:?}");
        assert!(reply.headers.contains_key("retry-after"));
    }
    assert_eq!(upstream.count("/gate"), 1);
    assert!(answered > 0);
}

//! Waiting with a deadline, not a sleep, for the in-process server's waiter counts.

use std::time::{Duration, Instant};

use idempotency_coordinator::notify::Hub;

use super::server::TestServer;

/// Waits until `count(hub)` reaches `n`, saying where it stood on failure.
async fn until_count(server: &TestServer, n: usize, what: &str, count: fn(&Hub) -> usize) {
    let start = Instant::now();
    while count(&server.hub) != n {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "timed out waiting for {n} {what}: {} now ({} waiters, {} parked)",
            count(&server.hub),
            server.hub.waiters(),
            server.hub.parked(),
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until `n` calls wait on `server`.
pub async fn until_waiters(server: &TestServer, n: usize) {
    until_count(server, n, "waiters", Hub::waiters).await;
}

/// Waits until `n` calls on `server` have read their record and sleep
/// until it changes.
pub async fn until_parked(server: &TestServer, n: usize) {
    until_count(server, n, "parked waiters", Hub::parked).await;
}

//! Waiting on a condition with a deadline, not a sleep; needs no server of
//! the tests' own, so other test binaries share it.

use std::future::Future;
use std::time::{Duration, Instant};

/// Polls `check` until it returns `Some`, failing the test at `deadline`.
pub async fn eventually<T, F, Fut>(what: &str, deadline: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let start = Instant::now();
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(
            start.elapsed() < deadline,
            "timed out after {deadline:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

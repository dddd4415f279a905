//! Metrics belong to their server: two servers in one process count their
//! own calls (no process-wide registry).

use std::time::Duration;

use idempotency_coordinator::metrics::{Format, Snapshot};

use crate::helpers::*;
use crate::metrics::Scrape;

/// Two servers in one process count apart: each has its own metrics,
/// handed to what records into them, and no registry is shared.
#[tokio::test]
async fn two_in_process_servers_count_apart() {
    let (a, b) = (spawn_app().await, spawn_app().await);
    let value = |app: &TestApp, name: &str, labels: &[(&str, &str)]| {
        let text = (app.store.metrics()).render(Format::Prometheus, &Snapshot::default());
        Scrape::parse(text).value(name, labels).unwrap_or(0.0)
    };
    let acquires = [
        ("service", "idempotency.v1.Coordinator"),
        ("method", "Acquire"),
        ("code", "OK"),
    ];
    let counted = |app: &TestApp| value(app, "idempotency_rpcs_total", &acquires);
    for key in ["one", "two", "three"] {
        a.client
            .clone()
            .acquire(acquire("apart", key))
            .await
            .unwrap();
    }
    b.client
        .clone()
        .acquire(acquire("apart", "one"))
        .await
        .unwrap();
    // A call is counted once its answer has gone out.
    eventually(
        "each server to count its own Acquires",
        Duration::from_secs(10),
        || async { (counted(&a) == 3.0 && counted(&b) == 1.0).then_some(()) },
    )
    .await;
    let proceeded = [("decision", "PROCEED")];
    let decided = |app: &TestApp| value(app, "idempotency_acquire_decisions_total", &proceeded);
    assert_eq!((decided(&a), decided(&b)), (3.0, 1.0));
}

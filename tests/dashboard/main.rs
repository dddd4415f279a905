//! The Grafana dashboard (`deploy/grafana/dashboards/`) against a real
//! Prometheus: Debian's `prometheus` (unpacked by `.ci/run` into
//! `target/ci-tools/prometheus`, or `PROMETHEUS`) scrapes a real server
//! under load, with the alert rules of `deploy/prometheus/alerts.yaml`
//! loaded, and every panel's query is evaluated through Prometheus' HTTP
//! API: each must parse and return data. Skipped, loudly, without the
//! binary unless CI is set.

mod load;
mod prometheus;

use test_support::helpers;

use std::path::PathBuf;
use std::time::Duration;

use idempotency_coordinator::config::ServeConfig;
use idempotency_coordinator::startup::Application;
use serde_json::Value;

use helpers::{TestDatabase, run_app};

/// Every query of every panel, with Grafana's rate interval filled in.
fn panel_queries() -> Vec<(String, String)> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("deploy/grafana/dashboards/idempotency-coordinator.json");
    let dashboard: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let mut queries = Vec::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().into_iter().flatten() {
            let expr = target["expr"]
                .as_str()
                .unwrap()
                .replace("$__rate_interval", "20s");
            queries.push((panel["title"].as_str().unwrap().to_owned(), expr));
        }
    }
    queries
}

#[tokio::test]
async fn every_dashboard_query_returns_data_from_a_real_prometheus() {
    let Some(binary) = prometheus::binary() else {
        return;
    };
    let db = TestDatabase::create().await;
    let mut config = ServeConfig::new("127.0.0.1:0".parse().unwrap(), db.url.clone());
    config.metrics_listen = Some("127.0.0.1:0".parse().unwrap());
    config.store.replay_cache_bytes = 8 << 20;
    config.sweep_interval = Duration::from_secs(1);
    let app = Application::build(config).await.expect("build the server");
    let metrics = app.metrics_addr().expect("the metrics listener");
    let server = run_app(app).await;
    let load = load::start(&server).await;

    let prometheus = prometheus::Prometheus::start(&binary, metrics).await;
    let queries = panel_queries();
    assert!(
        queries.len() >= 20,
        "every panel's queries: {}",
        queries.len()
    );
    let mut missing = Vec::new();
    for (panel, expr) in &queries {
        if !prometheus.returns_data(expr, Duration::from_secs(60)).await {
            missing.push(format!("{panel}: {expr}"));
        }
    }
    let groups = prometheus.rule_groups().await;
    load.stop().await;
    prometheus.stop().await;
    server.stop().await;
    assert!(
        missing.is_empty(),
        "queries without data:\n{}",
        missing.join("\n")
    );
    assert!(!groups.is_empty(), "the alert rules are loaded");
}

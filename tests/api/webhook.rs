//! The recovery webhook: due records POSTed as JSON after each sweep; a
//! failing or hanging webhook never stops the sweeper.

use std::sync::atomic::Ordering;
use std::time::Duration;

use idempotency_coordinator::config::ServeConfig;
use idempotency_coordinator::proto::{self, complete_request::Outcome};
use idempotency_coordinator::recovery::WebhookConfig;
use idempotency_coordinator::startup::Application;

use crate::helpers::*;

fn config(db: &TestDatabase, url: &str) -> ServeConfig {
    let mut config = ServeConfig::new("127.0.0.1:0".parse().unwrap(), db.url.clone());
    config.sweep_interval = Duration::from_millis(100);
    config.webhook = Some(WebhookConfig {
        url: url.parse().unwrap(),
        ca: None,
        timeout: Duration::from_millis(300),
        attempts: 2,
        offer: Duration::from_secs(30),
    });
    config
}

async fn fail_retryable(c: &mut Client, key: &str) {
    let granted = proceed(c, acquire("jobs", key)).await;
    let fail = Outcome::Failure(proto::Failure {
        error: "upstream 503".into(),
        permanent: false,
        retry_after: secs(0),
    });
    complete_ok(c, complete("jobs", key, &token(&granted), fail)).await;
}

type Client = idempotency_coordinator::proto::coordinator_client::CoordinatorClient<
    tonic::transport::Channel,
>;

#[tokio::test]
async fn the_webhook_receives_each_due_record_as_json() {
    let db = TestDatabase::create().await;
    let mut hook = TestWebhook::start(WebhookMode::Ok).await;
    let server = start_server(config(&db, &hook.url)).await;
    let mut c = server.client.clone();
    for key in ["a", "b", "c"] {
        fail_retryable(&mut c, key).await;
    }

    let mut keys = Vec::new();
    while keys.len() < 3 {
        let body = tokio::time::timeout(Duration::from_secs(10), hook.bodies.recv())
            .await
            .expect("a POST")
            .unwrap();
        assert_eq!(body["scope"], "jobs");
        assert_eq!(body["reason"], "RETRY_DUE");
        assert_eq!(body["last_error"], "upstream 503");
        assert_eq!(body["attempt_count"], 1);
        keys.push(body["key"].as_str().unwrap().to_owned());
    }
    keys.sort();
    assert_eq!(keys, ["a", "b", "c"]);
    // Each was offered once: no second POST within the offer interval.
    let again = tokio::time::timeout(Duration::from_millis(500), hook.bodies.recv()).await;
    assert!(again.is_err(), "no repeat: {again:?}");
}

#[tokio::test]
async fn a_webhook_that_fails_or_hangs_does_not_stop_the_sweeps() {
    for mode in [WebhookMode::Fail, WebhookMode::Hang] {
        let db = TestDatabase::create().await;
        let mut hook = TestWebhook::start(mode).await;
        let app = Application::build(config(&db, &hook.url)).await.unwrap();
        let totals = app.sweep_totals();
        let server = run_app(app).await;
        let mut c = server.client.clone();
        for i in 0..5 {
            fail_retryable(&mut c, &format!("k{i}")).await;
        }
        // The webhook is tried...
        tokio::time::timeout(Duration::from_secs(10), hook.bodies.recv())
            .await
            .expect("the webhook was called");
        // ...and sweeping goes on regardless.
        let rounds = totals.rounds.load(Ordering::SeqCst);
        eventually(
            &format!("sweeps to go on ({mode:?})"),
            Duration::from_secs(10),
            || async { (totals.rounds.load(Ordering::SeqCst) >= rounds + 5).then_some(()) },
        )
        .await;
    }
}

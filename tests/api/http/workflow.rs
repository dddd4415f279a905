//! The workflow API (`/acquire`, `/complete`, `/health`) replayed as n8n
//! calls it, string numbers included, with the documented answers and
//! backoff figures; both ports on one key; a caller that carries its token.

use std::time::Duration;

use idempotency_coordinator::proto::{Decision, Status};
use serde_json::{Value, json};

use super::{base, client, http_app, post, rfc3339, send};
use crate::helpers::*;

#[tokio::test]
async fn the_workflow_apis_documented_calls_get_the_documented_answers() {
    let app = http_app().await;
    let http = client();
    let url = base(&app);

    // Section 4: every field, as documented.
    let (status, _, answer) = post(
        &http,
        &format!("{url}/acquire"),
        &json!({"scope": "order_process", "idempotency_key": "order-123",
                "payload_fingerprint": "", "ttl_seconds": 900, "max_attempts": 10}),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["decision"], "PROCEED");
    assert_eq!(answer["attempt_count"], 1);
    let expires = rfc3339(&answer["lock_expires_at"]);
    assert!(answer["lock_expires_at"].as_str().unwrap().ends_with('Z'));
    let lease = (expires - chrono::Utc::now()).num_seconds();
    assert!((890..=900).contains(&lease), "a 900 s lock, {lease} s left");
    assert!(answer.get("lease_token").is_none(), "only when asked for");

    // Someone else meanwhile: RETRY_LATER, no lock.
    let (_, _, again) = post(
        &http,
        &format!("{url}/acquire"),
        &json!({"scope": "order_process", "idempotency_key": "order-123"}),
    )
    .await;
    assert_eq!(again["decision"], "RETRY_LATER");
    assert_eq!(again["coordinator_decision"], "IN_PROGRESS");
    assert_eq!(again["lock_expires_at"], Value::Null);

    let done = json!({"scope": "order_process", "idempotency_key": "order-123",
                      "final_status": "DONE", "error_message": "", "attempt_count": 1,
                      "base_retry_seconds": 60});
    let (status, _, answer) = post(&http, &format!("{url}/complete"), &done).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["ok"], true);
    assert_eq!(answer["status"], "DONE");
    // Again: the same answer.
    let (status, _, answer) = post(&http, &format!("{url}/complete"), &done).await;
    assert_eq!(
        (status, &answer["ok"], &answer["status"]),
        (200, &json!(true), &json!("DONE"))
    );

    let (_, _, replay) = post(
        &http,
        &format!("{url}/acquire"),
        &json!({"scope": "order_process", "idempotency_key": "order-123", "payload_fingerprint": ""}),
    )
    .await;
    assert_eq!(replay["decision"], "SKIP_ALREADY_DONE");
    assert_eq!(replay["lock_expires_at"], Value::Null);

    // Another fingerprint for the same key.
    let (_, _, conflict) = post(
        &http,
        &format!("{url}/acquire"),
        &json!({"scope": "order_process", "idempotency_key": "order-123", "payload_fingerprint": "ab12"}),
    )
    .await;
    assert_eq!(conflict["decision"], "CONFLICT");

    let (status, _, health) = send(http.get(format!("{url}/health"))).await;
    assert_eq!(status, 200);
    assert_eq!(health, json!({"status": "ok", "db": "connected"}));
}

#[tokio::test]
async fn n8n_failures_back_off_by_the_documented_figures_from_string_numbers() {
    let app = http_app().await;
    let http = client();
    let url = base(&app);
    let mut grpc = app.client.clone();
    let figures = [60, 120, 240, 480, 960, 1920, 3600, 3600];
    for (attempt_count, expected) in figures.into_iter().enumerate() {
        let key = format!("order-{attempt_count}");
        // Section 7's template, numbers as n8n may render them.
        let (_, _, acquired) = post(
            &http,
            &format!("{url}/acquire"),
            &json!({"scope": "your_workflow_name", "idempotency_key": key,
                    "ttl_seconds": "900", "max_attempts": "3"}),
        )
        .await;
        assert_eq!(acquired["decision"], "PROCEED", "{acquired}");
        let (status, _, failed) = post(
            &http,
            &format!("{url}/complete"),
            &json!({"scope": "your_workflow_name", "idempotency_key": key,
                    "final_status": "FAILED", "error_message": "smtp timeout",
                    "attempt_count": attempt_count.to_string()}),
        )
        .await;
        assert_eq!(status, 200, "{failed}");
        assert_eq!(
            (&failed["ok"], &failed["status"]),
            (&json!(true), &json!("FAILED"))
        );
        assert_eq!(failed["retry_after_seconds"], expected);
        assert_eq!(failed["coordinator_status"], "FAILED");

        let record = get_record(&mut grpc, get_req("your_workflow_name", &key)).await;
        assert_eq!(status_of(&record), Status::Failed);
        assert_eq!(record.last_error, "smtp timeout");
        let delay = seconds_between(
            record.last_error_at.as_ref().unwrap(),
            record.next_retry_at.as_ref().unwrap(),
        );
        assert!(
            (delay - expected as f64).abs() < 1.0,
            "{key}: {delay} s, not {expected} s"
        );
    }

    // Without attempt_count, the record's (1 here): 60 × 2¹. Read back
    // through the Connect Get, relative to updated_at.
    post(
        &http,
        &format!("{url}/acquire"),
        &json!({"scope": "your_workflow_name", "idempotency_key": "order-x", "max_attempts": 3}),
    )
    .await;
    let (_, _, failed) = post(
        &http,
        &format!("{url}/complete"),
        &json!({"scope": "your_workflow_name", "idempotency_key": "order-x",
                "final_status": "FAILED", "error_message": "{{ $json.error.message }}"}),
    )
    .await;
    assert_eq!(failed["retry_after_seconds"], 120, "{failed}");
    let (status, _, got) = post(
        &http,
        &format!("{url}/idempotency.v1.Coordinator/Get"),
        &json!({"scope": "your_workflow_name", "key": "order-x"}),
    )
    .await;
    assert_eq!(status, 200, "{got}");
    let record = &got["record"];
    assert_eq!(record["status"], "STATUS_FAILED");
    let delay = rfc3339(&record["nextRetryAt"]) - rfc3339(&record["updatedAt"]);
    assert!((delay.num_milliseconds() - 120_000).abs() < 1000, "{delay}");

    // Due again: the next attempt, then a failure on the last one.
    let (_, _, later) = post(
        &http,
        &format!("{url}/acquire"),
        &json!({"scope": "your_workflow_name", "idempotency_key": "order-x"}),
    )
    .await;
    assert_eq!(later["decision"], "RETRY_LATER");
    assert_eq!(
        later["retry_after_seconds"].as_u64().map(|s| s > 110),
        Some(true)
    );
}

#[tokio::test]
async fn an_exhausted_record_answers_conflict_and_says_why() {
    let app = http_app().await;
    let http = client();
    let url = base(&app);
    let acquire_once = json!({"scope": "s", "idempotency_key": "k", "max_attempts": 1});
    post(&http, &format!("{url}/acquire"), &acquire_once).await;
    let (_, _, failed) = post(
        &http,
        &format!("{url}/complete"),
        &json!({"scope": "s", "idempotency_key": "k", "final_status": "FAILED",
                "error_message": "boom", "base_retry_seconds": 0}),
    )
    .await;
    assert_eq!(failed["ok"], true, "{failed}");
    // The last attempt: failed for good, so no retry is promised.
    assert_eq!(failed["coordinator_status"], "FAILED_PERMANENT", "{failed}");
    assert_eq!(failed.get("retry_after_seconds"), None, "{failed}");
    let (_, _, answer) = post(&http, &format!("{url}/acquire"), &acquire_once).await;
    assert_eq!(answer["decision"], "CONFLICT", "{answer}");
    assert_eq!(answer["coordinator_decision"], "EXHAUSTED");
    assert_eq!(answer["last_error"], "boom");

    // CONFLICT as a final status: failed for good, and read back so.
    post(
        &http,
        &format!("{url}/acquire"),
        &json!({"scope": "s", "idempotency_key": "c"}),
    )
    .await;
    let (_, _, conflicted) = post(
        &http,
        &format!("{url}/complete"),
        &json!({"scope": "s", "idempotency_key": "c", "final_status": "CONFLICT",
                "error_message": "payload changed"}),
    )
    .await;
    assert_eq!(conflicted["status"], "CONFLICT", "{conflicted}");
    let record = get_record(&mut app.client.clone(), get_req("s", "c")).await;
    assert_eq!(status_of(&record), Status::FailedPermanent);
    assert_eq!(record.last_error, "CONFLICT: payload changed");
}

#[tokio::test]
async fn the_two_ports_share_every_key_both_ways() {
    let app = http_app().await;
    let http = client();
    let url = base(&app);
    let mut grpc = app.client.clone();

    // gRPC holds, HTTP waits, gRPC completes, HTTP skips.
    let held = proceed(&mut grpc, acquire("mixed", "a")).await;
    let body = json!({"scope": "mixed", "idempotency_key": "a"});
    let (_, _, seen) = post(&http, &format!("{url}/acquire"), &body).await;
    assert_eq!(seen["decision"], "RETRY_LATER");
    complete_ok(
        &mut grpc,
        complete("mixed", "a", &token(&held), success(b"ok")),
    )
    .await;
    let (_, _, seen) = post(&http, &format!("{url}/acquire"), &body).await;
    assert_eq!(seen["decision"], "SKIP_ALREADY_DONE");

    // HTTP holds, gRPC waits, HTTP completes, gRPC replays.
    let body = json!({"scope": "mixed", "idempotency_key": "b"});
    let (_, _, seen) = post(&http, &format!("{url}/acquire"), &body).await;
    assert_eq!(seen["decision"], "PROCEED");
    let answer = grpc
        .acquire(acquire("mixed", "b"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(decision(&answer), Decision::InProgress);
    let (_, _, done) = post(
        &http,
        &format!("{url}/complete"),
        &json!({"scope": "mixed", "idempotency_key": "b", "final_status": "DONE"}),
    )
    .await;
    assert_eq!(done["ok"], true, "{done}");
    let answer = grpc
        .acquire(acquire("mixed", "b"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(decision(&answer), Decision::AlreadyDone);
}

#[tokio::test]
async fn a_caller_that_carries_the_token_completes_only_its_own_lease() {
    let app = http_app().await;
    let http = client();
    let url = base(&app);
    let body = json!({"scope": "s", "idempotency_key": "k", "ttl_seconds": 5,
                      "return_lease_token": "true"});
    let (_, _, first) = post(&http, &format!("{url}/acquire"), &body).await;
    let stale = first["lease_token"]
        .as_str()
        .expect("a token when asked")
        .to_owned();
    app.clock.advance(Duration::from_secs(6));
    let (_, _, second) = post(&http, &format!("{url}/acquire"), &body).await;
    assert_eq!(second["decision"], "PROCEED");
    assert_eq!(second["attempt_count"], 2);

    let (status, _, refused) = post(
        &http,
        &format!("{url}/complete"),
        &json!({"scope": "s", "idempotency_key": "k", "final_status": "DONE", "lease_token": stale}),
    )
    .await;
    assert_eq!(status, 409, "{refused}");
    assert_eq!(refused["ok"], false);
    assert_eq!(refused["reason"], "LEASE_LOST");

    // Without a token the latest lease is completed, whoever holds it.
    let (status, _, done) = post(
        &http,
        &format!("{url}/complete"),
        &json!({"scope": "s", "idempotency_key": "k", "final_status": "DONE"}),
    )
    .await;
    assert_eq!((status, &done["status"]), (200, &json!("DONE")));

    // A key nobody acquired.
    let (status, _, missing) = post(
        &http,
        &format!("{url}/complete"),
        &json!({"scope": "s", "idempotency_key": "nobody", "final_status": "DONE"}),
    )
    .await;
    assert_eq!(status, 404, "{missing}");
    assert_eq!(missing["reason"], "RECORD_NOT_FOUND");
}

/// What n8n sends in practice: a numeric ID from "Using Fields Below" is a
/// JSON number, and a body may carry fields the route does not read (as the
/// service these routes replace allowed). Both work; and a Complete from an
/// error branch that lost the key hears where to take it from.
#[tokio::test]
async fn the_workflow_routes_take_numeric_keys_and_ignore_fields_they_do_not_read() {
    let app = http_app().await;
    let http = client();
    let url = base(&app);
    let (status, _, acquired) = post(
        &http,
        &format!("{url}/acquire"),
        &json!({"scope": "orders", "idempotency_key": 424242, "lock_ttl_seconds": 900, "note": {"a": 1}}),
    )
    .await;
    assert_eq!(
        (status, &acquired["decision"]),
        (200, &json!("PROCEED")),
        "{acquired}"
    );
    // The same key as text is the same record.
    let (_, _, again) = post(
        &http,
        &format!("{url}/acquire"),
        &json!({"scope": "orders", "idempotency_key": "424242"}),
    )
    .await;
    assert_eq!(again["decision"], json!("RETRY_LATER"), "{again}");
    let (status, _, done) = post(
        &http,
        &format!("{url}/complete"),
        &json!({"scope": "orders", "idempotency_key": 424242, "final_status": "DONE", "run": "x"}),
    )
    .await;
    assert_eq!((status, &done["status"]), (200, &json!("DONE")), "{done}");

    let (status, _, refused) = post(
        &http,
        &format!("{url}/complete"),
        &json!({"scope": "orders", "idempotency_key": "", "final_status": "FAILED"}),
    )
    .await;
    assert_eq!(status, 400, "{refused}");
    let said = refused["error"].as_str().unwrap_or_default();
    assert!(
        said.contains("idempotency_key") && said.contains("$('") && said.contains(".body."),
        "{refused}"
    );

    // An n8n Webhook trigger puts the POST body under `body`: an Acquire
    // built with `{{ $json.unique_id }}` renders an empty key, and hears
    // where the key is.
    let (status, _, refused) = post(
        &http,
        &format!("{url}/acquire"),
        &json!({"scope": "orders", "idempotency_key": ""}),
    )
    .await;
    assert_eq!(status, 400, "{refused}");
    assert_eq!(refused["field"], "idempotency_key", "{refused}");
    let said = refused["error"].as_str().unwrap_or_default();
    assert!(said.contains("$json.body.unique_id"), "{refused}");
}

/// A `/complete` that carries no token reads the key's lease through
/// admission, as a Get like any other call: counted, traced, held to the
/// readiness gate. One that carries its token reads nothing.
#[tokio::test]
async fn a_tokenless_complete_reads_the_lease_as_a_counted_get() {
    use crate::metrics::{metrics_addr, scrape, until_ready};
    let db = TestDatabase::create().await;
    let server = ServerProcess::start_with(
        &db.url,
        &[
            "--http-listen",
            "127.0.0.1:0",
            "--metrics-listen",
            "127.0.0.1:0",
            "--sweep-interval",
            "0",
        ],
    )
    .await;
    let metrics = metrics_addr(&server);
    until_ready(metrics).await;
    let url = format!("http://{}", server.logged_addr("serving HTTP/JSON"));
    let http = client();
    let gets = |s: &crate::metrics::Scrape| {
        let labels = [
            ("service", "idempotency.v1.Coordinator"),
            ("method", "Get"),
            ("code", "OK"),
        ];
        s.value("idempotency_rpcs_total", &labels).unwrap_or(0.0)
    };

    let key = json!({"scope": "s", "idempotency_key": "no-token"});
    let (status, _, answer) = post(&http, &format!("{url}/acquire"), &key).await;
    assert_eq!((status, &answer["decision"]), (200, &json!("PROCEED")));
    assert_eq!(gets(&scrape(metrics).await), 0.0);
    let done = json!({"scope": "s", "idempotency_key": "no-token", "final_status": "DONE"});
    let (status, _, answer) = post(&http, &format!("{url}/complete"), &done).await;
    assert_eq!(
        (status, &answer["record_status"]),
        (200, &json!("DONE")),
        "{answer}"
    );
    assert_eq!(gets(&scrape(metrics).await), 1.0);

    let asks = json!({"scope": "s", "idempotency_key": "token", "return_lease_token": true});
    let (_, _, answer) = post(&http, &format!("{url}/acquire"), &asks).await;
    let token = answer["lease_token"]
        .as_str()
        .expect("asked for")
        .to_owned();
    let done = json!({"scope": "s", "idempotency_key": "token", "final_status": "DONE",
                      "lease_token": token});
    let (status, _, answer) = post(&http, &format!("{url}/complete"), &done).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(gets(&scrape(metrics).await), 1.0);
}

//! The HTTP/JSON door: the workflow API replayed as n8n calls it (string
//! numbers included) with the documented answers and backoff figures, both
//! ports on one key, the Connect gateway, and refusals that write nothing.

use std::time::Duration;

use idempotency_coordinator::proto::{Decision, Status};
use serde_json::{Value, json};

use crate::helpers::*;

async fn http_app() -> TestApp {
    spawn_app_with(|c| c.http_listen = Some("127.0.0.1:0".parse().unwrap())).await
}

/// An HTTP/1.1 client (the process's TLS provider installed, as reqwest
/// asks).
fn client() -> reqwest::Client {
    idempotency_coordinator::tls::install_crypto_provider();
    reqwest::Client::new()
}

fn base(app: &TestApp) -> String {
    format!("http://{}", app.http_addr.expect("the HTTP port is served"))
}

/// POSTs `body` as JSON; returns the status, headers and JSON answer.
async fn post(
    client: &reqwest::Client,
    url: &str,
    body: &Value,
) -> (u16, reqwest::header::HeaderMap, Value) {
    send(
        client
            .post(url)
            .header("content-type", "application/json")
            .body(body.to_string()),
    )
    .await
}

async fn send(request: reqwest::RequestBuilder) -> (u16, reqwest::header::HeaderMap, Value) {
    let response = request.send().await.expect("an HTTP answer");
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let bytes = response.bytes().await.expect("a body");
    let value: Value = serde_json::from_slice(&bytes)
        .unwrap_or_else(|_| panic!("a JSON body, got {:?}", String::from_utf8_lossy(&bytes)));
    (status, headers, value)
}

fn rfc3339(v: &Value) -> chrono::DateTime<chrono::Utc> {
    chrono::DateTime::parse_from_rfc3339(v.as_str().expect("a timestamp"))
        .expect("RFC 3339")
        .with_timezone(&chrono::Utc)
}

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

#[tokio::test]
async fn the_connect_gateway_speaks_canonical_json_and_http_semantics_on_request() {
    let app = http_app().await;
    let http = client();
    let acquire_url = format!("{}/idempotency.v1.Coordinator/Acquire", base(&app));
    let complete_url = format!("{}/idempotency.v1.Coordinator/Complete", base(&app));
    let (status, _, answer) = post(
        &http,
        &acquire_url,
        &json!({"scope": "email.welcome", "key": "user-1", "lease_ttl": "30s", "fingerprint": "f1"}),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["decision"], "DECISION_PROCEED");
    assert_eq!(answer["record"]["status"], "STATUS_PROCESSING");
    assert!(
        answer["lease"]["fencingToken"].is_string(),
        "uint64 as a string"
    );
    let token = answer["lease"]["token"].as_str().unwrap().to_owned();

    // Held: 200 by default; 409 with Retry-After when HTTP semantics are asked for.
    let again = json!({"scope": "email.welcome", "key": "user-1", "fingerprint": "f1"});
    let (status, _, held) = post(&http, &acquire_url, &again).await;
    assert_eq!(
        (status, &held["decision"]),
        (200, &json!("DECISION_IN_PROGRESS"))
    );
    let (status, headers, held) = send(
        http.post(&acquire_url)
            .header("content-type", "application/json")
            .header("prefer", "idempotency-http-status")
            .body(again.to_string()),
    )
    .await;
    assert_eq!(status, 409, "{held}");
    let retry_after: u64 = headers["retry-after"].to_str().unwrap().parse().unwrap();
    assert!((29..=30).contains(&retry_after), "{retry_after}");
    assert_eq!(held["decision"], "DECISION_IN_PROGRESS");

    let (status, _, done) = send(
        http.post(&complete_url)
            .header("content-type", "application/json; charset=utf-8")
            .header("connect-protocol-version", "1")
            .header("connect-timeout-ms", "5000")
            .body(
                json!({"scope": "email.welcome", "key": "user-1", "leaseToken": token,
                       "success": {"result": "c2VudA==", "contentType": "text/plain"}})
                .to_string(),
            ),
    )
    .await;
    assert_eq!(status, 200, "{done}");
    assert_eq!(done["record"]["status"], "STATUS_SUCCEEDED");

    let (status, headers, replay) = post(&http, &acquire_url, &again).await;
    assert_eq!(status, 200);
    assert_eq!(headers["idempotent-replayed"], "true");
    assert_eq!(replay["record"]["result"]["result"], "c2VudA==");

    // Another fingerprint: 422 with HTTP semantics.
    let (status, _, conflict) = send(
        http.post(&acquire_url)
            .header("content-type", "application/json")
            .header("prefer", "idempotency-http-status")
            .body(
                json!({"scope": "email.welcome", "key": "user-1", "fingerprint": "f2"}).to_string(),
            ),
    )
    .await;
    assert_eq!(
        (status, &conflict["decision"]),
        (422, &json!("DECISION_CONFLICT"))
    );

    // Errors: Connect's shape, the reason readable.
    let (status, _, error) = post(
        &http,
        &acquire_url,
        &json!({"scope": "email welcome", "key": ""}),
    )
    .await;
    assert_eq!(status, 400);
    assert_eq!(error["code"], "invalid_argument");
    let details = error["details"].as_array().unwrap();
    let info = details
        .iter()
        .find(|d| d["type"] == "google.rpc.ErrorInfo")
        .unwrap();
    assert_eq!(info["debug"]["reason"], "INVALID_ARGUMENT");
    assert!(info["value"].is_string());
    let bad = details
        .iter()
        .find(|d| d["type"] == "google.rpc.BadRequest")
        .unwrap();
    assert_eq!(bad["debug"]["fieldViolations"][0]["field"], "scope");

    let (status, _, missing) = post(
        &http,
        &format!("{}/idempotency.v1.Coordinator/Get", base(&app)),
        &json!({"scope": "s", "key": "none"}),
    )
    .await;
    assert_eq!((status, &missing["code"]), (404, &json!("not_found")));

    let (status, _, unknown) = post(
        &http,
        &format!("{}/idempotency.v1.Coordinator/Nothing", base(&app)),
        &json!({}),
    )
    .await;
    assert_eq!((status, &unknown["code"]), (404, &json!("not_found")));
}

#[tokio::test]
async fn watch_streams_the_record_as_server_sent_events() {
    let app = http_app().await;
    let http = client();
    let url = base(&app);
    let (_, _, acquired) = post(
        &http,
        &format!("{url}/acquire"),
        &json!({"scope": "s", "idempotency_key": "watched", "return_lease_token": true}),
    )
    .await;
    let token = acquired["lease_token"].as_str().unwrap().to_owned();
    let mut response = http
        .post(format!("{url}/idempotency.v1.Coordinator/Watch"))
        .header("content-type", "application/json")
        .body(json!({"scope": "s", "key": "watched", "timeout": "20s"}).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["content-type"], "text/event-stream");
    let mut text = String::new();
    let first = response
        .chunk()
        .await
        .unwrap()
        .expect("the record as it stands");
    text.push_str(std::str::from_utf8(&first).unwrap());
    assert!(text.contains("STATUS_PROCESSING"), "{text}");
    let mut grpc = app.client.clone();
    complete_ok(&mut grpc, complete("s", "watched", &token, success(b"ok"))).await;
    while let Some(chunk) = tokio::time::timeout(Duration::from_secs(15), response.chunk())
        .await
        .expect("the stream ends once the record leaves PROCESSING")
        .unwrap()
    {
        text.push_str(std::str::from_utf8(&chunk).unwrap());
    }
    let events: Vec<Value> = text
        .split("\n\n")
        .filter_map(|e| e.strip_prefix("data: "))
        .map(|data| serde_json::from_str(data).unwrap())
        .collect();
    assert_eq!(events.len(), 2, "{text}");
    assert_eq!(events[1]["record"]["status"], "STATUS_SUCCEEDED");

    // Refused before it starts: a unary error.
    let (status, _, error) = post(
        &http,
        &format!("{url}/idempotency.v1.Coordinator/Watch"),
        &json!({"scope": "s", "key": "nobody"}),
    )
    .await;
    assert_eq!((status, &error["code"]), (404, &json!("not_found")));
}

#[tokio::test]
async fn http2_with_prior_knowledge_is_served_too() {
    let app = http_app().await;
    let http = {
        idempotency_coordinator::tls::install_crypto_provider();
        reqwest::Client::builder()
            .http2_prior_knowledge()
            .build()
            .unwrap()
    };
    let response = http
        .post(format!("{}/acquire", base(&app)))
        .header("content-type", "application/json")
        .body(json!({"scope": "s", "idempotency_key": "h2"}).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(response.version(), reqwest::Version::HTTP_2);
    let answer: Value = serde_json::from_slice(&response.bytes().await.unwrap()).unwrap();
    assert_eq!(answer["decision"], "PROCEED");
}

/// Every refusal: a 4xx, a JSON body naming the fault, and no record.
#[tokio::test]
async fn bad_requests_are_refused_with_json_and_write_nothing() {
    let tokens = TokenFile::new("tenant-a-secret-token-1 tenant-a\n");
    let path = tokens.path.clone();
    let app = spawn_app_with(move |c| {
        c.http_listen = Some("127.0.0.1:0".parse().unwrap());
        c.auth_tokens = Some(path);
        c.max_request_bytes = 1024 * 1024 + 64 * 1024;
    })
    .await;
    let http = client();
    let url = base(&app);
    let auth = "Bearer tenant-a-secret-token-1";
    let raw = |path: &str, body: String| {
        http.post(format!("{url}{path}"))
            .header("authorization", auth)
            .header("content-type", "application/json")
            .body(body)
    };

    let cases: Vec<(&str, String, u16, Option<&str>)> = vec![
        ("/acquire", "{\"scope\": \"s\",".into(), 400, None),
        (
            "/acquire",
            r#"{"scope":"s","idempotency_key":"k","ttl_seconds":"soon"}"#.into(),
            400,
            Some("ttl_seconds"),
        ),
        (
            "/acquire",
            r#"{"scope":"s","idempotency_key":"k","max_attempts":true}"#.into(),
            400,
            Some("max_attempts"),
        ),
        (
            "/acquire",
            r#"{"scope":"s","idempotency_key":true}"#.into(),
            400,
            Some("idempotency_key"),
        ),
        (
            "/complete",
            r#"{"scope":"s","idempotency_key":"","final_status":"FAILED"}"#.into(),
            400,
            Some("idempotency_key"),
        ),
        (
            "/acquire",
            r#"{"scope":"s","idempotency_key":"k","ttl_seconds":0}"#.into(),
            400,
            Some("ttl_seconds"),
        ),
        (
            "/acquire",
            r#"{"scope":"s s","idempotency_key":"k"}"#.into(),
            400,
            Some("scope"),
        ),
        (
            "/acquire",
            r#"{"scope":"s","idempotency_key":"k","payload_fingerprint":"a b"}"#.into(),
            400,
            Some("payload_fingerprint"),
        ),
        (
            "/complete",
            r#"{"scope":"s","idempotency_key":"k","final_status":"MAYBE"}"#.into(),
            400,
            Some("final_status"),
        ),
        ("/idempotency.v1.Coordinator/Acquire", "{".into(), 400, None),
        (
            "/idempotency.v1.Coordinator/Acquire",
            r#"{"scope":"s","key":"k","colour":1}"#.into(),
            400,
            None,
        ),
        (
            "/idempotency.v1.Coordinator/Acquire",
            r#"{"scope":"s","key":5}"#.into(),
            400,
            None,
        ),
    ];
    for (path, body, expected, field) in cases {
        let (status, _, answer) = send(raw(path, body.clone())).await;
        assert_eq!(status, expected, "{path} {body}: {answer}");
        if let Some(field) = field {
            assert_eq!(answer["field"], field, "{path} {body}: {answer}");
        }
        if path.starts_with("/idempotency") {
            assert_eq!(answer["code"], "invalid_argument", "{answer}");
        } else {
            assert_eq!(answer["ok"], false, "{answer}");
            assert!(answer["error"].is_string(), "{answer}");
        }
    }

    // Over twice --max-request-bytes: refused from its declared length, and
    // when it is sent without one.
    let big = format!(
        r#"{{"scope":"s","idempotency_key":"k","payload_fingerprint":"{}"}}"#,
        "a".repeat(3 * 1024 * 1024)
    );
    let (status, _, answer) = send(raw("/acquire", big.clone())).await;
    assert_eq!(status, 413, "{answer}");
    assert_eq!(answer["reason"], "REQUEST_TOO_LARGE");
    let chunks = futures::stream::iter(
        big.into_bytes()
            .chunks(64 * 1024)
            .map(|c| Ok::<_, std::io::Error>(c.to_vec()))
            .collect::<Vec<_>>(),
    );
    let (status, _, answer) = send(
        http.post(format!("{url}/idempotency.v1.Coordinator/Acquire"))
            .header("authorization", auth)
            .header("content-type", "application/json")
            .body(reqwest::Body::wrap_stream(chunks)),
    )
    .await;
    assert_eq!(status, 413, "{answer}");
    assert_eq!(answer["code"], "resource_exhausted");

    // No credentials, or unknown ones.
    let body = json!({"scope": "s", "idempotency_key": "k"}).to_string();
    for header in [None, Some("Bearer not-a-known-token-at-all")] {
        let mut request = http
            .post(format!("{url}/acquire"))
            .header("content-type", "application/json")
            .body(body.clone());
        if let Some(h) = header {
            request = request.header("authorization", h);
        }
        let (status, _, answer) = send(request).await;
        assert_eq!(status, 401, "{answer}");
        assert_eq!(answer["reason"], "UNAUTHENTICATED");
    }
    let (status, _, answer) = send(
        http.post(format!("{url}/complete"))
            .header("content-type", "application/json")
            .body(
                json!({"scope": "s", "idempotency_key": "k", "final_status": "DONE"}).to_string(),
            ),
    )
    .await;
    assert_eq!(
        (status, &answer["reason"]),
        (401, &json!("UNAUTHENTICATED"))
    );
    let (status, _, answer) = send(
        http.post(format!("{url}/idempotency.v1.Coordinator/Acquire"))
            .header("content-type", "application/json")
            .body(json!({"scope": "s", "key": "k"}).to_string()),
    )
    .await;
    assert_eq!((status, &answer["code"]), (401, &json!("unauthenticated")));

    // Wrong media type, wrong method, no route.
    let (status, _, _) = send(
        http.post(format!("{url}/idempotency.v1.Coordinator/Acquire"))
            .header("authorization", auth)
            .header("content-type", "text/plain")
            .body("{}"),
    )
    .await;
    assert_eq!(status, 415);
    let (status, _, _) = send(http.get(format!("{url}/acquire"))).await;
    assert_eq!(status, 405);
    let (status, _, _) = send(http.get(format!("{url}/nowhere"))).await;
    assert_eq!(status, 404);

    assert_eq!(app.db.count_records().await, 0, "nothing was written");

    // And the same credentials work.
    let (status, _, answer) = send(raw("/acquire", body)).await;
    assert_eq!((status, &answer["decision"]), (200, &json!("PROCEED")));
}

#[tokio::test]
async fn a_slow_body_is_refused_with_408() {
    let app = spawn_app_with(|c| {
        c.http_listen = Some("127.0.0.1:0".parse().unwrap());
        c.request_body_timeout = Duration::from_millis(300);
    })
    .await;
    let http = client();
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Vec<u8>, std::io::Error>>(1);
    tx.send(Ok(b"{\"scope\":".to_vec())).await.unwrap();
    let stream = tokio_stream::wrappers::ReceiverStream::new(rx);
    let (status, _, answer) = send(
        http.post(format!("{}/acquire", base(&app)))
            .header("content-type", "application/json")
            .body(reqwest::Body::wrap_stream(stream)),
    )
    .await;
    drop(tx);
    assert_eq!(status, 408, "{answer}");
    assert_eq!(answer["reason"], "REQUEST_TOO_SLOW");
    assert_eq!(app.db.count_records().await, 0);
}

#[tokio::test]
async fn a_connection_that_sends_nothing_or_half_a_preface_is_closed_at_the_handshake_limit() {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let app = spawn_app_with(|c| {
        c.http_listen = Some("127.0.0.1:0".parse().unwrap());
        c.connections.handshake_timeout = Duration::from_millis(300);
    })
    .await;
    for sent in [
        &b""[..],
        b"PRI * HTTP/2.0\r\n",
        b"POST /acquire HTTP/1.1\r\nHost: x\r\n",
    ] {
        let mut tcp = tokio::net::TcpStream::connect(app.http_addr.unwrap())
            .await
            .unwrap();
        tcp.write_all(sent).await.unwrap();
        let mut buf = Vec::new();
        let closed = tokio::time::timeout(Duration::from_secs(5), tcp.read_to_end(&mut buf)).await;
        assert!(closed.is_ok(), "closed after sending {sent:?}");
    }
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
        said.contains("idempotency_key") && said.contains("$('"),
        "{refused}"
    );
}

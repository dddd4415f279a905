//! The Connect gateway: canonical proto3 JSON, HTTP semantics when asked
//! for, and Connect's error shape.

use serde_json::json;

use super::{base, client, http_app, post, send};

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

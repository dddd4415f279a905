//! Watch as Server-Sent Events.

use std::time::Duration;

use serde_json::{Value, json};

use super::{base, client, http_app, post};
use crate::helpers::*;

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

//! The HTTP/JSON door, one file per door as the server has them: the
//! workflow API as n8n calls it (`workflow`), the Connect gateway
//! (`connect`), the streaming methods as Server-Sent Events (`events`), and
//! what the door checks on every route before and while it reads a body
//! (`checks`). Here: what they share.

mod checks;
mod connect;
mod events;
mod workflow;

use serde_json::Value;

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

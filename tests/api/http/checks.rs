//! What the door checks on every route, before and while it reads a body:
//! HTTP/1.1 and HTTP/2 framing, credentials, media type, method and route,
//! body size and time limits; every refusal a JSON body that writes nothing.

use std::time::Duration;

use serde_json::{Value, json};

use super::{base, client, http_app, send};
use crate::helpers::*;

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

const TOKEN: &str = "tenant-a-secret-token-1";
const AUTH: &str = "Bearer tenant-a-secret-token-1";

/// A server that asks for credentials, and a client that has them.
struct Guarded {
    app: TestApp,
    http: reqwest::Client,
    url: String,
    _tokens: TokenFile,
}

impl Guarded {
    async fn start() -> Self {
        let tokens = TokenFile::new(&format!("{TOKEN} tenant-a\n"));
        let path = tokens.path.clone();
        let app = spawn_app_with(move |c| {
            c.http_listen = Some("127.0.0.1:0".parse().unwrap());
            c.auth_tokens = Some(path);
            c.max_request_bytes = 1024 * 1024 + 64 * 1024;
        })
        .await;
        let url = base(&app);
        Guarded {
            app,
            http: client(),
            url,
            _tokens: tokens,
        }
    }

    /// A JSON POST of `body` to `path` without credentials.
    fn anonymous(&self, path: &str, body: impl Into<reqwest::Body>) -> reqwest::RequestBuilder {
        self.http
            .post(format!("{}{path}", self.url))
            .header("content-type", "application/json")
            .body(body)
    }

    /// The same with the caller's credentials.
    fn authorized(&self, path: &str, body: impl Into<reqwest::Body>) -> reqwest::RequestBuilder {
        self.anonymous(path, body).header("authorization", AUTH)
    }
}

/// Bodies that are not JSON, or hold a field of the wrong type or value:
/// 400, the field named, in the error shape of the route's API.
async fn refuses_malformed_bodies(door: &Guarded) {
    let cases: Vec<(&str, &str, Option<&str>)> = vec![
        ("/acquire", "{\"scope\": \"s\",", None),
        (
            "/acquire",
            r#"{"scope":"s","idempotency_key":"k","ttl_seconds":"soon"}"#,
            Some("ttl_seconds"),
        ),
        (
            "/acquire",
            r#"{"scope":"s","idempotency_key":"k","max_attempts":true}"#,
            Some("max_attempts"),
        ),
        (
            "/acquire",
            r#"{"scope":"s","idempotency_key":true}"#,
            Some("idempotency_key"),
        ),
        (
            "/complete",
            r#"{"scope":"s","idempotency_key":"","final_status":"FAILED"}"#,
            Some("idempotency_key"),
        ),
        (
            "/acquire",
            r#"{"scope":"s","idempotency_key":"k","ttl_seconds":0}"#,
            Some("ttl_seconds"),
        ),
        (
            "/acquire",
            r#"{"scope":"s s","idempotency_key":"k"}"#,
            Some("scope"),
        ),
        (
            "/acquire",
            r#"{"scope":"s","idempotency_key":"k","payload_fingerprint":"a b"}"#,
            Some("payload_fingerprint"),
        ),
        (
            "/complete",
            r#"{"scope":"s","idempotency_key":"k","final_status":"MAYBE"}"#,
            Some("final_status"),
        ),
        ("/idempotency.v1.Coordinator/Acquire", "{", None),
        (
            "/idempotency.v1.Coordinator/Acquire",
            r#"{"scope":"s","key":"k","colour":1}"#,
            None,
        ),
        (
            "/idempotency.v1.Coordinator/Acquire",
            r#"{"scope":"s","key":5}"#,
            None,
        ),
    ];
    for (path, body, field) in cases {
        let (status, _, answer) = send(door.authorized(path, body)).await;
        assert_eq!(status, 400, "{path} {body}: {answer}");
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
}

/// Over twice --max-request-bytes: refused from its declared length, and
/// when it is sent without one.
async fn refuses_oversized_bodies(door: &Guarded) {
    let big = format!(
        r#"{{"scope":"s","idempotency_key":"k","payload_fingerprint":"{}"}}"#,
        "a".repeat(3 * 1024 * 1024)
    );
    let (status, _, answer) = send(door.authorized("/acquire", big.clone())).await;
    assert_eq!(status, 413, "{answer}");
    assert_eq!(answer["reason"], "REQUEST_TOO_LARGE");
    let chunks = futures::stream::iter(
        big.into_bytes()
            .chunks(64 * 1024)
            .map(|c| Ok::<_, std::io::Error>(c.to_vec()))
            .collect::<Vec<_>>(),
    );
    let (status, _, answer) = send(door.authorized(
        "/idempotency.v1.Coordinator/Acquire",
        reqwest::Body::wrap_stream(chunks),
    ))
    .await;
    assert_eq!(status, 413, "{answer}");
    assert_eq!(answer["code"], "resource_exhausted");
}

/// No credentials, or unknown ones: 401 on every route, in the route's
/// error shape.
async fn refuses_missing_or_unknown_credentials(door: &Guarded) {
    let body = json!({"scope": "s", "idempotency_key": "k"}).to_string();
    for header in [None, Some("Bearer not-a-known-token-at-all")] {
        let mut request = door.anonymous("/acquire", body.clone());
        if let Some(h) = header {
            request = request.header("authorization", h);
        }
        let (status, _, answer) = send(request).await;
        assert_eq!(status, 401, "{answer}");
        assert_eq!(answer["reason"], "UNAUTHENTICATED");
    }
    let (status, _, answer) = send(door.anonymous(
        "/complete",
        json!({"scope": "s", "idempotency_key": "k", "final_status": "DONE"}).to_string(),
    ))
    .await;
    assert_eq!(
        (status, &answer["reason"]),
        (401, &json!("UNAUTHENTICATED"))
    );
    let (status, _, answer) = send(door.anonymous(
        "/idempotency.v1.Coordinator/Acquire",
        json!({"scope": "s", "key": "k"}).to_string(),
    ))
    .await;
    assert_eq!((status, &answer["code"]), (401, &json!("unauthenticated")));
}

/// Wrong media type, wrong method, no route.
async fn refuses_wrong_media_type_method_and_route(door: &Guarded) {
    let (status, _, _) = send(
        door.http
            .post(format!("{}/idempotency.v1.Coordinator/Acquire", door.url))
            .header("authorization", AUTH)
            .header("content-type", "text/plain")
            .body("{}"),
    )
    .await;
    assert_eq!(status, 415);
    let (status, _, _) = send(door.http.get(format!("{}/acquire", door.url))).await;
    assert_eq!(status, 405);
    let (status, _, _) = send(door.http.get(format!("{}/nowhere", door.url))).await;
    assert_eq!(status, 404);
}

/// Every refusal: a 4xx, a JSON body naming the fault, and no record.
#[tokio::test]
async fn bad_requests_are_refused_with_json_and_write_nothing() {
    let door = Guarded::start().await;
    refuses_malformed_bodies(&door).await;
    refuses_oversized_bodies(&door).await;
    refuses_missing_or_unknown_credentials(&door).await;
    refuses_wrong_media_type_method_and_route(&door).await;
    assert_eq!(door.app.db.count_records().await, 0, "nothing was written");

    // And the same credentials work.
    let body = json!({"scope": "s", "idempotency_key": "k"}).to_string();
    let (status, _, answer) = send(door.authorized("/acquire", body)).await;
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

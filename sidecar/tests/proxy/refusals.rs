//! Requests refused before anything is stored or forwarded.

use http::{Method, StatusCode};

use crate::support::{Env, fresh_key};

#[tokio::test]
async fn a_required_route_without_a_key_is_400() {
    let env = Env::start(&["--route", "POST /pay require scope=payments"]).await;
    let reply = env.client.send(Method::POST, "/pay", None, "{}", &[]).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        reply.problem_type(),
        "https://docs.test/sidecar.md#missing-key"
    );
    assert_eq!(env.upstream.count("/pay"), 0);
    assert_eq!(env.records().await, 0);
}

#[tokio::test]
async fn hostile_keys_are_400_and_nothing_is_stored_or_forwarded() {
    let env = Env::start(&["--route", "POST /pay require"]).await;
    let long = "k".repeat(10 * 1024);
    let hostile = [
        long.as_str(),
        "\"unterminated",
        "\"a\"b",
        "\"tab\there\"",
        "two words",
        "\"\"",
        "k;param=1",
    ];
    for key in hostile {
        let reply = env.client.post("/pay", key, "{}").await;
        assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{key:?}: {reply:?}");
        assert!(reply.problem_type().ends_with("#invalid-key"), "{key:?}");
    }
    // Control characters never make a header value on the wire here, so
    // one is sent raw.
    let raw = raw_request(
        env.sidecar.addr,
        b"POST /pay HTTP/1.1\r\nhost: x\r\nidempotency-key: \"a\x7fb\"\r\ncontent-length: 2\r\n\r\n{}",
    )
    .await;
    assert!(raw.starts_with("HTTP/1.1 400"), "{raw}");
    assert_eq!(env.upstream.count("/pay"), 0);
    assert_eq!(env.records().await, 0);
}

#[tokio::test]
async fn a_body_over_the_limit_is_413_and_nothing_is_stored_or_forwarded() {
    // The route's limit, not the sidecar's (8 MiB here), applies.
    let env = Env::start(&[
        "--route",
        "POST /pay accept max-body=1048576",
        "--max-request-body",
        "8388608",
    ])
    .await;
    let key = fresh_key();
    let body = vec![b'x'; 2 * 1024 * 1024];
    let reply = env
        .client
        .post("/pay", &key, std::str::from_utf8(&body).unwrap())
        .await;
    assert_eq!(reply.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert!(reply.problem_type().ends_with("#body-too-large"));
    // 100 MB announced: refused before a byte of it is read.
    let raw = raw_request(
        env.sidecar.addr,
        format!(
            "POST /pay HTTP/1.1\r\nhost: x\r\nidempotency-key: {key}\r\ncontent-length: {}\r\n\r\n",
            100 * 1024 * 1024
        )
        .as_bytes(),
    )
    .await;
    assert!(raw.starts_with("HTTP/1.1 413"), "{raw}");
    assert_eq!(env.upstream.count("/pay"), 0);
    assert_eq!(env.records().await, 0);
}

/// Writes `request` as it is and reads the answer's head.
async fn raw_request(addr: std::net::SocketAddr, request: &[u8]) -> String {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream.write_all(request).await.unwrap();
    let mut buffer = vec![0; 4096];
    let n = tokio::time::timeout(std::time::Duration::from_secs(20), stream.read(&mut buffer))
        .await
        .expect("an answer within 20 s")
        .unwrap();
    String::from_utf8_lossy(&buffer[..n]).into_owned()
}

#[tokio::test]
async fn bodies_past_the_in_flight_budget_are_503_until_room_is_made() {
    let env = Env::start(&["--max-inflight-body-mib", "1"]).await;
    let body = "x".repeat(600 * 1024);
    let held = {
        let (client, body) = (env.client.clone(), body.clone());
        tokio::spawn(async move { client.post("/gate", &fresh_key(), &body).await })
    };
    crate::polling::eventually(
        "the upstream to see the first request",
        std::time::Duration::from_secs(10),
        || async { (env.upstream.count("/gate") == 1).then_some(()) },
    )
    .await;
    let refused = env.client.post("/pay", &fresh_key(), &body).await;
    assert_eq!(refused.status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(refused.problem_type().ends_with("#busy"));
    assert!(refused.headers.contains_key("retry-after"));
    // A small body still fits.
    let small = env.client.post("/pay", &fresh_key(), "{}").await;
    assert_eq!(small.status, StatusCode::CREATED);
    env.upstream.open_gate();
    assert_eq!(held.await.unwrap().status, StatusCode::CREATED);
    let room = env.client.post("/pay", &fresh_key(), &body).await;
    assert_eq!(room.status, StatusCode::CREATED);
    assert_eq!(env.upstream.count("/pay"), 2);
}

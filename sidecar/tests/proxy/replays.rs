//! Replays, fingerprints, pass-through, tenants.

use http::{Method, StatusCode};

use crate::support::{Env, TestClient, fresh_key};

#[tokio::test]
async fn a_replay_is_byte_identical_and_marked_as_one() {
    let env = Env::start(&[]).await;
    let key = fresh_key();
    let first = env.client.post("/pay", &key, "{\"amount\":1}").await;
    assert_eq!(first.status, StatusCode::CREATED);
    assert!(!first.replayed());
    // The first client gets every header, the cookie too.
    assert!(first.headers.contains_key("set-cookie"));
    let again = env.client.post("/pay", &key, "{\"amount\":1}").await;
    assert_eq!(again.status, StatusCode::CREATED);
    assert!(again.replayed());
    assert_eq!(again.body, first.body);
    assert_eq!(again.headers["location"], first.headers["location"]);
    assert_eq!(again.headers["etag"], first.headers["etag"]);
    assert_eq!(again.headers["content-type"], "application/json");
    assert!(
        !again.headers.contains_key("set-cookie"),
        "never stored unless allowed"
    );
    // Over h2c too, byte for byte.
    let h2 = TestClient::h2c(env.sidecar.addr)
        .post("/pay", &key, "{\"amount\":1}")
        .await;
    assert!(h2.replayed());
    assert_eq!(h2.body, first.body);
    assert_eq!(env.upstream.count("/pay"), 1);
}

#[tokio::test]
async fn the_same_key_with_another_body_is_422() {
    let env = Env::start(&[]).await;
    let key = fresh_key();
    let first = env.client.post("/pay", &key, "{\"amount\":1}").await;
    assert_eq!(first.status, StatusCode::CREATED);
    let other = env.client.post("/pay", &key, "{\"amount\":2}").await;
    assert_eq!(other.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(
        other.problem_type(),
        "https://docs.test/sidecar.md#fingerprint-mismatch"
    );
    let elsewhere = env.client.post("/pay?to=b", &key, "{\"amount\":1}").await;
    assert_eq!(elsewhere.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(env.upstream.count("/pay"), 1);
}

#[tokio::test]
async fn canonical_json_routes_ignore_key_order_and_space() {
    let env = Env::start(&["--route", "POST /pay require json=canonical"]).await;
    let key = fresh_key();
    let first = env.client.post("/pay", &key, "{\"a\":1,\"b\":2}").await;
    let again = env
        .client
        .post("/pay", &key, "{ \"b\": 2, \"a\": 1 }")
        .await;
    assert_eq!(first.status, StatusCode::CREATED);
    assert!(again.replayed());
    assert_eq!(env.upstream.count("/pay"), 1);
}

#[tokio::test]
async fn a_get_passes_through_uncoordinated() {
    let env = Env::start(&[]).await;
    let key = fresh_key();
    for _ in 0..2 {
        let reply = env
            .client
            .send(Method::GET, "/items", Some(&key), "", &[])
            .await;
        assert_eq!(reply.status, StatusCode::OK);
        assert!(!reply.replayed());
    }
    assert_eq!(env.upstream.count("/items"), 2);
    assert!(
        env.upstream
            .seen()
            .iter()
            .all(|s| s.fencing_token.is_none())
    );
    assert_eq!(env.records().await, 0);
}

#[tokio::test]
async fn a_post_without_a_key_on_an_accepting_route_passes_through() {
    let env = Env::start(&[]).await;
    for _ in 0..2 {
        let reply = env.client.send(Method::POST, "/pay", None, "{}", &[]).await;
        assert_eq!(reply.status, StatusCode::CREATED);
    }
    assert_eq!(env.upstream.count("/pay"), 2);
    assert_eq!(env.records().await, 0);
}

#[tokio::test]
async fn the_upstream_sees_the_key_the_fencing_token_and_the_attempt() {
    let env = Env::start(&[]).await;
    let reply = env.client.post("/pay", "\"abc-1\"", "{}").await;
    assert_eq!(reply.status, StatusCode::CREATED);
    let seen = env.upstream.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].path, "/pay");
    assert_eq!(seen[0].key.as_deref(), Some("\"abc-1\""));
    assert!(seen[0].fencing_token.is_some_and(|t| t > 0));
    assert_eq!(seen[0].attempt, Some(1));
}

#[tokio::test]
async fn two_tenants_never_share_a_key() {
    let env = Env::start(&["--tenant-header", "x-api-key"]).await;
    let key = fresh_key();
    let send = |tenant: &'static str, body: &'static str| {
        let client = env.client.clone();
        let key = key.clone();
        async move {
            client
                .send(
                    Method::POST,
                    "/pay",
                    Some(&key),
                    body,
                    &[("x-api-key", tenant)],
                )
                .await
        }
    };
    assert_eq!(
        send("client-a", "{\"a\":1}").await.status,
        StatusCode::CREATED
    );
    let b = send("client-b", "{\"b\":2}").await;
    assert_eq!(b.status, StatusCode::CREATED);
    assert!(!b.replayed());
    assert!(send("client-a", "{\"a\":1}").await.replayed());
    assert_eq!(env.upstream.count("/pay"), 2);
}

#[tokio::test]
async fn an_h2c_upstream_is_spoken_to_in_http2() {
    let env = Env::start(&["--upstream-h2c"]).await;
    let key = fresh_key();
    let first = env.client.post("/pay", &key, "{}").await;
    assert_eq!(first.status, StatusCode::CREATED);
    assert!(env.client.post("/pay", &key, "{}").await.replayed());
    let passed = env.client.send(Method::GET, "/items", None, "", &[]).await;
    assert_eq!(passed.status, StatusCode::OK);
    let seen = env.upstream.seen();
    assert_eq!(seen.len(), 2);
    assert!(
        seen.iter().all(|s| s.version == http::Version::HTTP_2),
        "{seen:?}"
    );
}

//! Under the default settings no caller is answered with another caller's
//! stored answer: keys live in the namespace of the caller's credentials,
//! 401 and 403 are never stored, per-caller headers are replayed only where
//! a route allows them, and an upstream cannot mark its answer a replay.

use http::{Method, StatusCode};

use crate::support::{Env, Reply, TestClient, fresh_key};

const BODY: &str = "{\"card\":\"4242\"}";

async fn as_caller(client: &TestClient, key: &str, authorization: Option<&str>) -> Reply {
    let headers: Vec<(&str, &str)> = authorization
        .map(|a| vec![("authorization", a)])
        .unwrap_or_default();
    client
        .send(Method::POST, "/account", Some(key), BODY, &headers)
        .await
}

#[tokio::test]
async fn a_caller_without_alices_credentials_never_gets_her_answer_0_replays() {
    let env = Env::start(&[]).await;
    let key = fresh_key();
    let alice = as_caller(&env.client, &key, Some("Bearer alice")).await;
    assert_eq!(alice.status, StatusCode::CREATED);
    assert!(alice.text().contains("Bearer alice"));
    // Her key and body, no credentials: the upstream decides (401), and
    // nothing of hers comes back.
    let stranger = as_caller(&env.client, &key, None).await;
    assert_eq!(
        stranger.status,
        StatusCode::UNAUTHORIZED,
        "1 stranger got {stranger:?}"
    );
    assert!(!stranger.replayed() && !stranger.text().contains("alice"));
    // Another caller with credentials of his own runs his own request.
    let bob = as_caller(&env.client, &key, Some("Bearer bob")).await;
    assert_eq!(bob.status, StatusCode::CREATED);
    assert!(
        !bob.replayed() && bob.text().contains("Bearer bob"),
        "{bob:?}"
    );
    // Alice's retry is still hers.
    let again = as_caller(&env.client, &key, Some("Bearer alice")).await;
    assert!(again.replayed());
    assert_eq!(again.body, alice.body);
    assert_eq!(env.upstream.count("/account"), 3, "alice, stranger, bob");
}

#[tokio::test]
async fn a_401_is_not_stored_so_a_squatted_key_still_works_for_its_owner() {
    let env = Env::start(&[]).await;
    let key = fresh_key();
    for _ in 0..2 {
        let squat = as_caller(&env.client, &key, None).await;
        assert_eq!(squat.status, StatusCode::UNAUTHORIZED);
        assert!(!squat.replayed(), "a 401 is never replayed: {squat:?}");
    }
    assert_eq!(env.upstream.count("/account"), 2, "each 401 ran upstream");
    let alice = as_caller(&env.client, &key, Some("Bearer alice")).await;
    assert_eq!(alice.status, StatusCode::CREATED, "{alice:?}");
    // The same holds where keys are global by the operator's word: the
    // squatter's 401 did not take the key.
    let global = Env::start(&["--credential-headers", "-"]).await;
    let key = fresh_key();
    assert_eq!(
        as_caller(&global.client, &key, None).await.status,
        StatusCode::UNAUTHORIZED
    );
    let owner = as_caller(&global.client, &key, Some("Bearer alice")).await;
    assert_eq!(owner.status, StatusCode::CREATED, "{owner:?}");
    assert_eq!(global.records().await, 1, "only alice's answer is stored");
}

#[tokio::test]
async fn set_cookie_is_replayed_only_where_a_route_stores_it_and_only_to_its_caller() {
    let env = Env::start(&[
        "--route",
        "POST /account require store-headers=content-type,set-cookie",
    ])
    .await;
    let key = fresh_key();
    let first = as_caller(&env.client, &key, Some("Bearer alice")).await;
    let cookie = first.headers["set-cookie"].clone();
    let again = as_caller(&env.client, &key, Some("Bearer alice")).await;
    assert!(again.replayed());
    assert_eq!(again.headers["set-cookie"], cookie);
    let stranger = as_caller(&env.client, &key, None).await;
    assert!(!stranger.headers.contains_key("set-cookie"), "{stranger:?}");
    // By default (and with `store-headers=*`) it is never stored.
    let default = Env::start(&["--route", "POST /account require store-headers=*"]).await;
    let key = fresh_key();
    as_caller(&default.client, &key, Some("Bearer alice")).await;
    let replay = as_caller(&default.client, &key, Some("Bearer alice")).await;
    assert!(replay.replayed() && !replay.headers.contains_key("set-cookie"));
}

#[tokio::test]
async fn a_named_session_cookie_identifies_the_caller() {
    let env = Env::start(&["--route", "POST /pay require credential-cookies=session"]).await;
    let key = fresh_key();
    let post = |cookie: &'static str| {
        let (client, key) = (env.client.clone(), key.clone());
        async move {
            client
                .send(
                    Method::POST,
                    "/pay",
                    Some(&key),
                    "{}",
                    &[("cookie", cookie)],
                )
                .await
        }
    };
    let first = post("session=alice; seen=1").await;
    assert_eq!(first.status, StatusCode::CREATED);
    assert!(
        post("seen=2; session=alice").await.replayed(),
        "other cookies do not count"
    );
    assert!(!post("session=mallory; seen=1").await.replayed());
    assert_eq!(env.upstream.count("/pay"), 2);
}

#[tokio::test]
async fn an_upstreams_own_replayed_marker_never_reaches_the_client() {
    let env = Env::start(&[]).await;
    let key = fresh_key();
    let first = env.client.post("/marked", &key, "{}").await;
    assert_eq!(first.status, StatusCode::CREATED);
    assert!(
        !first.headers.contains_key("idempotent-replayed"),
        "{first:?}"
    );
    let passed = env.client.send(Method::GET, "/marked", None, "", &[]).await;
    assert!(
        !passed.headers.contains_key("idempotent-replayed"),
        "{passed:?}"
    );
    let replay = env.client.post("/marked", &key, "{}").await;
    assert!(replay.replayed(), "the sidecar's own marker stays");
    assert_eq!(env.upstream.count("/marked"), 2, "one POST, one GET");
}

//! A route holds however its path and method are spelled: the sidecar
//! matches, fingerprints and forwards the request as the upstream reads
//! it, and refuses a path that upstreams read in different ways.

use http::{Method, StatusCode};

use crate::support::{Env, fresh_key};

const ROUTE: [&str; 2] = ["--route", "POST /payments require"];

#[tokio::test]
async fn no_spelling_of_a_required_route_reaches_the_upstream_without_a_key_0_of_6() {
    let env = Env::start(&ROUTE).await;
    let post = Method::POST;
    let lower = Method::from_bytes(b"post").unwrap();
    let spellings = [
        (&post, "/payments;x"),
        (&post, "/%70ayments"),
        (&post, "/x/../payments"),
        (&post, "/Payments"),
        (&post, "//payments/"),
        (&lower, "/payments"),
    ];
    for (method, path) in spellings {
        let reply = env.client.send(method.clone(), path, None, "{}", &[]).await;
        assert_eq!(
            reply.status,
            StatusCode::BAD_REQUEST,
            "{method} {path}: {reply:?}"
        );
        assert!(
            reply.problem_type().ends_with("#missing-key"),
            "{method} {path}"
        );
    }
    let reached = env.upstream.seen();
    assert!(
        reached.is_empty(),
        "{} of 6 reached the upstream: {reached:?}",
        reached.len()
    );
}

#[tokio::test]
async fn paths_upstreams_read_differently_are_refused() {
    let env = Env::start(&ROUTE).await;
    for path in [
        "/payments%2Fx",
        "/x/..;/payments",
        "/x%5C..%5Cpayments",
        "/pay%zzments",
    ] {
        let reply = env.client.send(Method::POST, path, None, "{}", &[]).await;
        assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{path}: {reply:?}");
        assert!(reply.problem_type().ends_with("#invalid-path"), "{path}");
    }
    // A GET, which no route coordinates, passes as it came.
    let get = env
        .client
        .send(Method::GET, "/items%2Fx", None, "", &[])
        .await;
    assert_ne!(get.status, StatusCode::BAD_REQUEST, "{get:?}");
    let seen = env.upstream.seen();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(seen[0].path, "/items%2Fx");
}

#[tokio::test]
async fn the_upstream_gets_the_path_that_was_matched_and_spellings_share_a_key() {
    let env = Env::start(&ROUTE).await;
    let key = fresh_key();
    let first = env
        .client
        .send(Method::POST, "/x/../%70ayments", Some(&key), "{}", &[])
        .await;
    assert_eq!(first.status, StatusCode::CREATED);
    assert_eq!(env.upstream.seen()[0].path, "/payments");
    let lower = Method::from_bytes(b"post").unwrap();
    let again = env
        .client
        .send(lower, "/payments", Some(&key), "{}", &[])
        .await;
    assert!(again.replayed(), "{again:?}");
    assert_eq!(env.upstream.count("/payments"), 1);
}

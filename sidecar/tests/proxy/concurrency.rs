//! Many clients with one key at once: the upstream runs once.

use std::collections::HashSet;

use futures_util::future::join_all;
use http::{Method, StatusCode};

use crate::support::{Env, fresh_key};

const CLIENTS: usize = 50;

#[tokio::test]
async fn fifty_concurrent_posts_with_one_key_run_the_upstream_once() {
    let env = Env::start(&[]).await;
    let key = fresh_key();
    let replies = join_all((0..CLIENTS).map(|_| {
        let client = env.client.clone();
        let key = key.clone();
        async move {
            client
                .post("/pay?hold_ms=300", &key, "{\"amount\":1}")
                .await
        }
    }))
    .await;
    assert_eq!(env.upstream.count("/pay"), 1);
    let answered: Vec<_> = replies
        .iter()
        .filter(|r| r.status != StatusCode::CONFLICT)
        .collect();
    assert!(!answered.is_empty(), "someone got the answer");
    let distinct: HashSet<_> = answered
        .iter()
        .map(|r| (r.status, r.body.clone()))
        .collect();
    assert_eq!(distinct.len(), 1, "one answer for all: {distinct:?}");
    assert_eq!(answered[0].status, StatusCode::CREATED);
    for conflict in replies.iter().filter(|r| r.status == StatusCode::CONFLICT) {
        assert!(conflict.headers.contains_key("retry-after"));
        assert!(conflict.problem_type().ends_with("#in-progress"));
    }
}

#[tokio::test]
async fn fifty_concurrent_posts_that_prefer_to_wait_all_get_the_one_answer() {
    let env = Env::start(&[]).await;
    let key = fresh_key();
    let replies = join_all((0..CLIENTS).map(|_| {
        let client = env.client.clone();
        let key = key.clone();
        async move {
            client
                .send(
                    Method::POST,
                    "/pay?hold_ms=300",
                    Some(&key),
                    "{\"amount\":1}",
                    &[("prefer", "wait=20")],
                )
                .await
        }
    }))
    .await;
    assert_eq!(env.upstream.count("/pay"), 1);
    let distinct: HashSet<_> = replies.iter().map(|r| (r.status, r.body.clone())).collect();
    assert_eq!(distinct.len(), 1, "one answer for all: {distinct:?}");
    assert_eq!(replies[0].status, StatusCode::CREATED);
    assert_eq!(replies.iter().filter(|r| !r.replayed()).count(), 1);
}

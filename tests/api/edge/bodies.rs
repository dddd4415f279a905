//! Request bodies: refused before they arrive when the caller has no
//! credentials or declares too much, cut off when they come too slowly, and
//! held to the in-flight byte budget as they arrive.

use std::time::{Duration, Instant};

use bytes::Bytes;
use idempotency_coordinator::proto;

use super::{
    ACQUIRE, TOKEN, assert_an_authenticated_call_proceeds, grpc_request, grpc_status, h2_connect,
    prefix, token_file,
};
use crate::helpers::*;

#[tokio::test]
async fn unauthenticated_streams_with_large_bodies_are_refused_before_their_body() {
    let db = TestDatabase::create().await;
    let file = token_file();
    let path = file.path.to_str().unwrap();
    let server = ServerProcess::start_with(&db.url, &["--auth-tokens", path]).await;
    let pid = server.pid();
    // Warm: one connection's worth of refusals first.
    let mut warm = h2_connect(server.addr).await;
    let (answer, _stream) = warm
        .send
        .send_request(grpc_request(ACQUIRE, None), false)
        .unwrap();
    assert_eq!(grpc_status(answer).await.0, 16);
    let before = resident_kib(pid);

    // 5 connections x 100 streams, each declaring a message just under the
    // 4 MiB limit and sending all of it but the last byte, never ending.
    let body = Bytes::from(vec![0u8; 4 * 1024 * 1024 - 2]);
    let mut connections = Vec::new();
    let mut answers = Vec::new();
    for _ in 0..5 {
        let mut c = h2_connect(server.addr).await;
        for _ in 0..100 {
            c.send = c.send.ready().await.expect("ready");
            let (answer, mut stream) = c
                .send
                .send_request(grpc_request(ACQUIRE, None), false)
                .unwrap();
            let _ = stream.send_data(prefix(4 * 1024 * 1024 - 1), false);
            let _ = stream.send_data(body.clone(), false);
            answers.push((answer, stream));
        }
        connections.push(c);
    }
    // Every stream is answered UNAUTHENTICATED although none ended.
    let started = Instant::now();
    let mut streams = Vec::new();
    for (answer, stream) in answers {
        let (code, message) = tokio::time::timeout(Duration::from_secs(10), grpc_status(answer))
            .await
            .expect("an answer before the body ends");
        assert_eq!(code, 16, "{message}");
        streams.push(stream);
    }
    println!("500 refusals in {:?}", started.elapsed());

    // Held open for 20 s: the server's memory stays within 16 MiB of where
    // it was.
    let mut peak = before;
    let until = Instant::now() + Duration::from_secs(20);
    while Instant::now() < until {
        peak = peak.max(resident_kib(pid));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    println!("server memory: {before} KiB before, {peak} KiB at most while held");
    assert!(
        peak < before + 16 * 1024,
        "the server grew from {before} KiB to {peak} KiB"
    );
    drop(streams);
    drop(connections);
}

#[tokio::test]
async fn a_slow_authenticated_body_is_cut_off_and_an_oversized_one_refused_at_its_prefix() {
    let db = TestDatabase::create().await;
    let file = token_file();
    let path = file.path.to_str().unwrap();
    let server = ServerProcess::start_with(
        &db.url,
        &["--auth-tokens", path, "--request-body-timeout", "1s"],
    )
    .await;
    let mut c = h2_connect(server.addr).await;

    // Ten bytes of a hundred, then nothing.
    let started = Instant::now();
    let (answer, mut stream) = c
        .send
        .send_request(grpc_request(ACQUIRE, Some(TOKEN)), false)
        .unwrap();
    stream.send_data(prefix(100), false).unwrap();
    stream.send_data(Bytes::from(vec![0u8; 10]), false).unwrap();
    let (code, message) = tokio::time::timeout(Duration::from_secs(10), grpc_status(answer))
        .await
        .expect("an answer");
    let took = started.elapsed();
    assert_eq!(code, 4, "DEADLINE_EXCEEDED: {message}");
    assert!(message.contains("--request-body-timeout"), "{message}");
    assert!(took >= Duration::from_millis(900), "cut after {took:?}");
    assert!(took < Duration::from_secs(5), "cut after {took:?}");

    // A message declared over --max-request-bytes: refused at its prefix.
    let (answer, mut stream) = c
        .send
        .send_request(grpc_request(ACQUIRE, Some(TOKEN)), false)
        .unwrap();
    stream.send_data(prefix(5 * 1024 * 1024), false).unwrap();
    let (code, message) = tokio::time::timeout(Duration::from_millis(900), grpc_status(answer))
        .await
        .expect("an answer before the body timeout");
    assert_eq!(code, 8, "RESOURCE_EXHAUSTED: {message}");
    assert!(message.contains("--max-request-bytes"), "{message}");

    // The connection still serves whole requests.
    assert_an_authenticated_call_proceeds(&server, "after").await;
}

#[tokio::test]
async fn arriving_request_bytes_are_held_to_the_budget() {
    let db = TestDatabase::create().await;
    let server = ServerProcess::start_with(
        &db.url,
        &[
            "--max-inflight-request-mib",
            "1",
            "--request-body-timeout",
            "3s",
        ],
    )
    .await;
    let mut c = h2_connect(server.addr).await;
    // Five unfinished bodies of 300 KiB do not fit in a 1 MiB budget: the
    // ones that cross it are refused at once, the others cut off by the
    // body time limit.
    let part = Bytes::from(vec![0u8; 300 * 1024]);
    let started = Instant::now();
    let mut answers = Vec::new();
    for _ in 0..5 {
        c.send = c.send.clone().ready().await.expect("ready");
        let (answer, mut stream) = c
            .send
            .send_request(grpc_request(ACQUIRE, None), false)
            .unwrap();
        stream.send_data(prefix(1024 * 1024), false).unwrap();
        stream.send_data(part.clone(), false).unwrap();
        answers.push(tokio::spawn(async move {
            let status = grpc_status(answer).await;
            drop(stream);
            (status, started.elapsed())
        }));
    }
    let mut refused = 0;
    for answer in answers {
        let ((code, message), after) = answer.await.unwrap();
        match code {
            8 => {
                assert!(message.contains("too many requests"), "{message}");
                assert!(after < Duration::from_secs(2), "refused after {after:?}");
                refused += 1;
            }
            4 => assert!(after >= Duration::from_millis(2900), "cut after {after:?}"),
            other => panic!("code {other}: {message}"),
        }
    }
    assert!((2..=4).contains(&refused), "{refused} of 5 refused");
    // The budget is free again.
    let mut client = server.client().await;
    let answer = client.acquire(acquire("s", "after")).await.unwrap();
    assert_eq!(decision(&answer.into_inner()), proto::Decision::Proceed);
}

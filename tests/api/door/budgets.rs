//! Byte budgets: credentials checked before a byte of budget is spent,
//! budgets grown as bytes arrive and shared out by tenant, and JSON values
//! counted before they are parsed.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use idempotency_coordinator::proto::Decision;
use idempotency_coordinator::proto::acquire_request::RequestFingerprint;
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt as _;
use tokio::net::TcpStream;

use super::{
    TOKEN_A, TOKEN_B, grpc_client, guarded_server, head, http_client, sample, scrape, status_of,
    tokens,
};
use crate::helpers::*;

#[tokio::test]
async fn peers_that_declare_large_bodies_and_send_a_byte_lock_no_tenant_out_on_either_port() {
    let db = TestDatabase::create().await;
    let tokens = tokens();
    let (server, http) = guarded_server(&db, &tokens).await;

    // 16 connections without credentials, each declaring the largest body
    // (by Content-Length, or chunked) and sending one byte of it: answered
    // 401 at once from their headers, their body never read.
    let mut held = Vec::new();
    for i in 0..16 {
        let framing = if i % 2 == 0 {
            "Content-Length: 8388608\r\n\r\n{"
        } else {
            "Transfer-Encoding: chunked\r\n\r\n1\r\n{\r\n"
        };
        let path = ["/acquire", "/idempotency.v1.Coordinator/Acquire"][i % 4 / 2];
        let mut tcp = TcpStream::connect(http).await.unwrap();
        tcp.write_all(head(path, framing).as_bytes()).await.unwrap();
        assert_eq!(status_of(&mut tcp).await, Some(401), "connection {i}");
        held.push(tcp);
    }
    // And over HTTP/2 (h2c), streams of one connection that never end.
    idempotency_coordinator::tls::install_crypto_provider();
    let h2c = reqwest::Client::builder()
        .http2_prior_knowledge()
        .build()
        .unwrap();
    let mut open_bodies = Vec::new();
    for i in 0..8 {
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Vec<u8>, std::io::Error>>(1);
        tx.send(Ok(b"{".to_vec())).await.unwrap();
        open_bodies.push(tx);
        let answer = tokio::time::timeout(
            Duration::from_secs(5),
            h2c.post(format!("http://{http}/acquire"))
                .header("content-type", "application/json")
                .header("content-length", "8388608")
                .body(reqwest::Body::wrap_stream(
                    tokio_stream::wrappers::ReceiverStream::new(rx),
                ))
                .send(),
        )
        .await
        .unwrap_or_else(|_| panic!("h2c stream {i} was not answered at once"))
        .unwrap();
        assert_eq!(answer.version(), reqwest::Version::HTTP_2);
        assert_eq!(answer.status(), 401, "h2c stream {i}");
    }

    // 16 more of tenant a, with credentials, that hold their bodies open:
    // each holds the byte it sent, not the 8 MiB it declared.
    for i in 0..16 {
        let framing = if i % 2 == 0 {
            "Content-Length: 8388608\r\n\r\n{"
        } else {
            "Transfer-Encoding: chunked\r\n\r\n1\r\n{\r\n"
        };
        let auth = format!("Authorization: Bearer {TOKEN_A}\r\n{framing}");
        let mut tcp = TcpStream::connect(http).await.unwrap();
        tcp.write_all(head("/acquire", &auth).as_bytes())
            .await
            .unwrap();
        held.push(tcp);
    }

    // Meanwhile every call of tenant b succeeds, on both ports, and so do
    // tenant a's own.
    let mut b = grpc_client(&server, TOKEN_B).await;
    let mut a = grpc_client(&server, TOKEN_A).await;
    for i in 0..20 {
        let answer = b
            .acquire(acquire("s", &format!("grpc-{i}")))
            .await
            .expect("tenant b's gRPC call is served")
            .into_inner();
        assert_eq!(decision(&answer), Decision::Proceed);
    }
    let answer = a.acquire(acquire("s", "a-grpc")).await.expect("tenant a");
    assert_eq!(decision(&answer.into_inner()), Decision::Proceed);
    let client = http_client();
    for i in 0..20 {
        let response = client
            .post(format!("http://{http}/acquire"))
            .header("authorization", format!("Bearer {TOKEN_B}"))
            .header("content-type", "application/json")
            .body(json!({"scope": "s", "idempotency_key": format!("http-{i}")}).to_string())
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200, "tenant b's HTTP call {i}");
        let answer: Value = response.json().await.unwrap();
        assert_eq!(answer["decision"], "PROCEED");
    }

    // Every refusal is counted.
    let scrape = scrape(&server).await;
    let refused = sample(
        &scrape,
        r#"idempotency_requests_refused_total{port="http",reason="unauthenticated"}"#,
    );
    assert!(refused >= 24.0, "{refused} refusals counted");
    drop((held, open_bodies));
}

#[tokio::test]
async fn one_tenant_holds_at_most_half_the_budget_and_its_refusals_are_counted_and_logged() {
    let db = TestDatabase::create().await;
    let tokens = tokens();
    let (server, http) = guarded_server(&db, &tokens).await;

    // Tenant a sends four bodies of the largest size but their last 128
    // KiB, and holds them open: all of its half of the 64 MiB budget but
    // about 0.5 MiB (each call also counts 8 KiB and its headers twice).
    // Four whole bodies would not fit, and the last would be refused
    // part-way: how full the share stayed would depend on timing.
    let mut held = Vec::new();
    for _ in 0..4 {
        let framing = format!("Authorization: Bearer {TOKEN_A}\r\nContent-Length: 8388608\r\n\r\n");
        let mut tcp = TcpStream::connect(http).await.unwrap();
        tcp.write_all(head("/acquire", &framing).as_bytes())
            .await
            .unwrap();
        tcp.write_all(&vec![b' '; 8 * 1024 * 1024 - 128 * 1024])
            .await
            .unwrap();
        held.push(tcp);
    }
    // Once they are in, tenant a's next call that carries 1 MiB is refused
    // 429: more than the room left in its share.
    let padding = "x".repeat(1024 * 1024);
    let client = http_client();
    let mut n = 0;
    // 32 MiB to read in: on a loaded machine that takes a while.
    eventually(
        "tenant a's share to be full",
        Duration::from_secs(30),
        || {
            n += 1;
            let request = client
                .post(format!("http://{http}/acquire"))
                .header("authorization", format!("Bearer {TOKEN_A}"))
                .header("content-type", "application/json")
                .body(
                    json!({"scope": "s", "idempotency_key": format!("a-{n}"), "padding": padding})
                        .to_string(),
                )
                .send();
            async move {
                let response = request.await.unwrap();
                (response.status() == 429).then_some(())
            }
        },
    )
    .await;

    // Meanwhile tenant a's share is full on the gRPC port too, and tenant b
    // is served on both.
    let mut a = grpc_client(&server, TOKEN_A).await;
    let mut large = acquire("s", "a");
    large.request_fingerprint = Some(RequestFingerprint::JsonPayload(format!("\"{padding}\"")));
    let refused = a.acquire(large).await.unwrap_err();
    assert_eq!(
        refused.code(),
        tonic::Code::ResourceExhausted,
        "{refused:?}"
    );
    let mut b = grpc_client(&server, TOKEN_B).await;
    let answer = b.acquire(acquire("s", "b")).await.expect("tenant b");
    assert_eq!(decision(&answer.into_inner()), Decision::Proceed);
    let response = client
        .post(format!("http://{http}/acquire"))
        .header("authorization", format!("Bearer {TOKEN_B}"))
        .header("content-type", "application/json")
        .body(json!({"scope": "s", "idempotency_key": "b-http"}).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);

    let scrape = scrape(&server).await;
    for port in ["http", "grpc"] {
        let refused = sample(
            &scrape,
            &format!(
                r#"idempotency_requests_refused_total{{port="{port}",reason="tenant_share"}}"#
            ),
        );
        assert!(refused >= 1.0, "{port}: {refused}");
    }
    eventually(
        "an info line about the full budget",
        Duration::from_secs(10),
        || async {
            server
                .logs()
                .iter()
                .any(|line| {
                    line.contains("\"level\":\"INFO\"")
                        && line.contains(
                            "request refused: no room in the in-flight request byte budget",
                        )
                })
                .then_some(())
        },
    )
    .await;
    drop(held);
}

/// An 8 MiB JSON body of four million values: `[ 0,0,…,0]`.
fn many_values() -> Vec<u8> {
    const LEN: usize = 8 * 1024 * 1024;
    let mut body = b"[ ".to_vec();
    while body.len() < LEN - 2 {
        body.extend_from_slice(b"0,");
    }
    body.extend_from_slice(b"0]");
    assert_eq!(body.len(), LEN);
    body
}

#[tokio::test]
async fn json_bodies_of_millions_of_values_are_refused_unparsed_and_memory_stays_flat() {
    let db = TestDatabase::create().await;
    let tokens = tokens();
    let (server, http) = guarded_server(&db, &tokens).await;
    let pid = server.pid();
    let body = Arc::new(many_values());

    // Warm: one ordinary call on each route.
    let client = http_client();
    for path in ["/acquire", "/idempotency.v1.Coordinator/Get"] {
        let response = client
            .post(format!("http://{http}{path}"))
            .header("authorization", format!("Bearer {TOKEN_A}"))
            .header("content-type", "application/json")
            .body(json!({"scope": "s", "idempotency_key": "warm", "key": "warm"}).to_string())
            .send()
            .await
            .unwrap();
        assert!(response.status().as_u16() < 500);
    }
    let before = resident_kib(pid);
    let peak = Arc::new(AtomicU64::new(before));
    let sampler = {
        let peak = Arc::clone(&peak);
        tokio::spawn(async move {
            loop {
                peak.fetch_max(resident_kib(pid), Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
    };

    // Eight senders: four without credentials, four with (two tenants),
    // on the workflow and Connect routes; each sends all 8 MiB unless the
    // server has answered and closed first.
    let senders = (0..8).map(|i| {
        let body = Arc::clone(&body);
        tokio::spawn(async move {
            let path = ["/acquire", "/idempotency.v1.Coordinator/Acquire"][i % 2];
            let auth = match i % 4 {
                0 | 1 => String::new(),
                2 => format!("Authorization: Bearer {TOKEN_A}\r\n"),
                _ => format!("Authorization: Bearer {TOKEN_B}\r\n"),
            };
            let framing = format!("{auth}Content-Length: {}\r\n\r\n", body.len());
            let tcp = TcpStream::connect(http).await.unwrap();
            let (mut read, mut write) = tcp.into_split();
            write
                .write_all(head(path, &framing).as_bytes())
                .await
                .unwrap();
            let writing = tokio::spawn(async move {
                for piece in body.chunks(64 * 1024) {
                    if write.write_all(piece).await.is_err() {
                        return;
                    }
                }
                // Hold the connection until the answer is read.
                std::future::pending::<()>().await;
            });
            let status = status_of(&mut read).await;
            writing.abort();
            (i % 4 < 2, status)
        })
    });
    for answer in futures::future::join_all(senders).await {
        let (anonymous, status) = answer.unwrap();
        if anonymous {
            assert_eq!(status, Some(401), "a sender without credentials");
        } else {
            assert!(
                matches!(status, Some(400 | 413)),
                "an authenticated sender: {status:?}"
            );
        }
    }
    sampler.abort();
    let peak = peak.load(Ordering::Relaxed);
    println!("server memory: {before} KiB before, {peak} KiB at most while the bodies arrived");
    assert!(peak < before + 64 * 1024, "grew by {} KiB", peak - before);

    // The refusal names the limit.
    let response = client
        .post(format!("http://{http}/acquire"))
        .header("authorization", format!("Bearer {TOKEN_A}"))
        .header("content-type", "application/json")
        .body(format!("[{}0]", "0,".repeat(2000)))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 400);
    let answer: Value = response.json().await.unwrap();
    assert_eq!(answer["reason"], "TOO_MANY_JSON_VALUES", "{answer}");
    assert!(
        answer["error"].as_str().unwrap().contains("1000"),
        "{answer}"
    );
    let mut a = grpc_client(&server, TOKEN_A).await;
    let answer = a
        .acquire(acquire("s", "after"))
        .await
        .expect("still serving");
    assert_eq!(decision(&answer.into_inner()), Decision::Proceed);
}

//! Connections that send nothing: closed at the header read timeout (one
//! that sends only the HTTP/2 preface, at the idle timeout), and a full
//! connection table sheds the one idle the longest for a newcomer, so a
//! keyed POST is answered at once however many are open.

use std::time::{Duration, Instant};

use futures_util::future::join_all;
use http::StatusCode;
use tokio::net::TcpStream;

use crate::raw::{more_files, open, until_closed};
use crate::support::{Env, fresh_key};

const SILENT: usize = 2_000;
const TABLE: &str = "500";

/// The HTTP/2 connection preface and an empty SETTINGS frame.
const H2_START: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00";

#[tokio::test]
async fn a_keyed_post_is_answered_within_1s_with_2000_silent_connections_open() {
    more_files();
    let env = Env::start(&["--max-connections", TABLE, "--header-read-timeout", "60s"]).await;
    // At once, each within 3 s: past the table and the listen queue, a
    // connect that is never accepted does not hold the test up.
    let silent = join_all((0..SILENT).map(|_| {
        tokio::time::timeout(Duration::from_secs(3), TcpStream::connect(env.sidecar.addr))
    }))
    .await;
    // The table is full of them before the keyed POST comes. A connect
    // that timed out above may still be accepted, find its peer gone and
    // close, leaving the table a few short: top it up until it is full.
    let table: usize = TABLE.parse().unwrap();
    let mut topped = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let open = open_connections(&env).await;
        if open >= table {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the connection table holds {open} of {table} after 30 s"
        );
        for _ in open..table {
            if let Ok(tcp) = TcpStream::connect(env.sidecar.addr).await {
                topped.push(tcp);
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let started = Instant::now();
    let reply = tokio::time::timeout(
        Duration::from_secs(5),
        env.client.post("/pay", &fresh_key(), "{\"amount\":1}"),
    )
    .await;
    let took = started.elapsed();
    let reply = reply.unwrap_or_else(|_| {
        panic!("no answer to a keyed POST within 5 s with {SILENT} silent connections open")
    });
    assert_eq!(reply.status, StatusCode::CREATED, "{reply:?}");
    assert!(
        took < Duration::from_secs(1),
        "a keyed POST took {took:?} with {SILENT} silent connections open"
    );
    drop((silent, topped));
}

/// The sidecar's count of open client connections, from its metrics.
async fn open_connections(env: &Env) -> usize {
    let metrics = env.ops("/metrics").await.text();
    metrics
        .lines()
        .find_map(|line| line.strip_prefix("idempotency_sidecar_connections "))
        .and_then(|n| n.trim().parse().ok())
        .expect("the connection gauge")
}

#[tokio::test]
async fn a_connection_that_sends_nothing_is_closed_at_the_header_read_timeout() {
    let env = Env::start(&["--header-read-timeout", "1s"]).await;
    let mut silent = open(env.sidecar.addr, b"").await;
    let closed = until_closed(&mut silent, Duration::from_secs(5)).await;
    let (_, took) =
        closed.expect("a silent connection still open after 5 s (header read timeout 1 s)");
    assert!(took >= Duration::from_millis(900), "closed after {took:?}");
}

#[tokio::test]
async fn an_http2_connection_idle_after_its_preface_is_closed_at_the_idle_timeout() {
    let env = Env::start(&["--idle-timeout", "1s"]).await;
    let mut idle = open(env.sidecar.addr, H2_START).await;
    let closed = until_closed(&mut idle, Duration::from_secs(5)).await;
    let (_, took) =
        closed.expect("an idle HTTP/2 connection still open after 5 s (idle timeout 1 s)");
    assert!(took >= Duration::from_millis(900), "closed after {took:?}");
}

#[tokio::test]
async fn a_keep_alive_connection_between_requests_is_closed_at_the_idle_timeout() {
    let env = Env::start(&["--idle-timeout", "1s"]).await;
    let mut kept = open(env.sidecar.addr, b"GET /items HTTP/1.1\r\nhost: x\r\n\r\n").await;
    let closed = until_closed(&mut kept, Duration::from_secs(5)).await;
    let (answer, took) =
        closed.expect("a kept-alive connection still open after 5 s (idle timeout 1 s)");
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(took >= Duration::from_millis(900), "closed after {took:?}");
}

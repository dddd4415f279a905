//! Large upstream answers at once: the sidecar's binary, in a process of
//! its own so that its memory can be read, holds no more of them than its
//! answer budget allows, whatever their number.

use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures_util::future::join_all;
use http::StatusCode;

use crate::polling::eventually;
use crate::support::{Coordinator, TestClient, fresh_key};
use crate::upstream::TestUpstream;

const ANSWERS: usize = 200;
const ANSWER_BYTES: usize = 990_000;
/// What docs/limits.md states for this wave, above the idle sidecar.
const STATED_MIB: u64 = 250;

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|kib| kib.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

fn free_port() -> std::net::SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap()
}

#[tokio::test]
async fn two_hundred_one_megabyte_answers_keep_the_sidecar_under_its_stated_memory() {
    let coordinator = Coordinator::start().await;
    let upstream = TestUpstream::start().await;
    let (listen, metrics) = (free_port(), free_port());
    let mut sidecar = tokio::process::Command::new(env!("CARGO_BIN_EXE_idempotency-sidecar"))
        .args([
            "--listen",
            &listen.to_string(),
            "--metrics-listen",
            &metrics.to_string(),
        ])
        // Answers wait for room in the budget within the upstream timeout;
        // a debug build on a busy machine stores 200 MB slowly.
        .args(["--upstream-timeout", "300s"])
        .args([
            "--upstream",
            &upstream.url(),
            "--coordinator",
            &coordinator.endpoint(),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("start the sidecar binary");
    let pid = sidecar.id().expect("the sidecar's pid");
    let client = TestClient::new(listen);
    eventually("the sidecar listening", Duration::from_secs(30), || async {
        tokio::net::TcpStream::connect(listen)
            .await
            .ok()
            .map(|_| ())
    })
    .await;
    // One answer first: the idle figure is taken warm.
    let path = format!("/big?bytes={ANSWER_BYTES}");
    assert_eq!(
        client.post(&path, &fresh_key(), "{}").await.status,
        StatusCode::OK
    );
    let idle = rss_kib(pid);
    let peak = Arc::new(AtomicU64::new(idle));
    let sampling = tokio::spawn({
        let peak = Arc::clone(&peak);
        async move {
            loop {
                peak.fetch_max(rss_kib(pid), Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    });
    let started = std::time::Instant::now();
    let replies = join_all((0..ANSWERS).map(|_| post(listen, &path))).await;
    let took = started.elapsed();
    sampling.abort();
    let peak = peak.load(Ordering::Relaxed).max(rss_kib(pid));
    let after = rss_kib(pid);
    for (status, len) in &replies {
        assert_eq!((*status, *len), (StatusCode::OK, ANSWER_BYTES));
    }
    let grew_mib = peak.saturating_sub(idle) / 1024;
    eprintln!(
        "sidecar RSS: idle {} MiB, peak {} MiB (+{grew_mib} MiB), after {} MiB, over {ANSWERS} answers of {ANSWER_BYTES} bytes in {took:?}",
        idle / 1024,
        peak / 1024,
        after / 1024
    );
    assert!(
        grew_mib < STATED_MIB,
        "the sidecar grew by {grew_mib} MiB over {ANSWERS} answers of {ANSWER_BYTES} bytes; docs/limits.md states under {STATED_MIB} MiB"
    );
    let _ = sidecar.start_kill();
}

/// A keyed POST on a connection of its own, answered within 5 minutes (a
/// debug build on a busy machine stores 200 MB slowly): its status and
/// body length.
async fn post(addr: std::net::SocketAddr, path: &str) -> (StatusCode, usize) {
    use http_body_util::BodyExt as _;
    let stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let io = hyper_util::rt::TokioIo::new(stream);
    let (mut sender, connection) = hyper::client::conn::http1::handshake(io)
        .await
        .expect("handshake");
    tokio::spawn(connection);
    let request = http::Request::post(path)
        .header("host", "sidecar")
        .header("idempotency-key", fresh_key())
        .body(http_body_util::Full::new(bytes::Bytes::from_static(b"{}")))
        .unwrap();
    let answered = tokio::time::timeout(Duration::from_secs(300), async {
        let response = sender.send_request(request).await.expect("an answer");
        let status = response.status();
        let body = response.into_body().collect().await.expect("the body");
        (status, body.to_bytes().len())
    });
    answered.await.expect("an answer within 5 minutes")
}

//! Health, readiness, metrics, and the binary's drain on SIGTERM.

use std::net::SocketAddr;
use std::time::Duration;

use http::{Method, StatusCode};
use tokio::io::{AsyncBufReadExt as _, BufReader};

use crate::polling::eventually;
use crate::support::{Coordinator, Env, TestClient, fresh_key};
use crate::upstream::TestUpstream;

#[tokio::test]
async fn readiness_follows_the_coordinators_health() {
    let env = Env::start(&[]).await;
    assert_eq!(env.ops("/healthz").await.status, StatusCode::OK);
    eventually("ready", Duration::from_secs(10), || async {
        (env.ops("/readyz").await.status == StatusCode::OK).then_some(())
    })
    .await;
    let Env {
        sidecar,
        coordinator,
        upstream: _upstream,
        ..
    } = env;
    let metrics = TestClient::new(sidecar.metrics_addr);
    coordinator.server.kill().await;
    eventually("not ready", Duration::from_secs(10), || async {
        let reply = metrics.send(Method::GET, "/readyz", None, "", &[]).await;
        (reply.status == StatusCode::SERVICE_UNAVAILABLE).then_some(())
    })
    .await;
    let alive = metrics.send(Method::GET, "/healthz", None, "", &[]).await;
    assert_eq!(alive.status, StatusCode::OK);
}

#[tokio::test]
async fn metrics_count_requests_by_route_and_outcome() {
    let env = Env::start(&["--route", "POST /pay require scope=payments"]).await;
    let key = fresh_key();
    env.client.post("/pay", &key, "{}").await;
    env.client.post("/pay", &key, "{}").await;
    env.client.post("/pay", &key, "{\"other\":1}").await;
    env.client.send(Method::GET, "/items", None, "", &[]).await;
    let text = env.ops("/metrics").await.text();
    for line in [
        "idempotency_sidecar_requests_total{route=\"POST /pay\",outcome=\"stored\"} 1",
        "idempotency_sidecar_requests_total{route=\"POST /pay\",outcome=\"replayed\"} 1",
        "idempotency_sidecar_requests_total{route=\"POST /pay\",outcome=\"fingerprint-mismatch\"} 1",
        "idempotency_sidecar_requests_total{route=\"default\",outcome=\"passed\"} 1",
        "idempotency_sidecar_replays_total{route=\"POST /pay\"} 1",
        "idempotency_sidecar_upstream_latency_seconds_count 2",
    ] {
        assert!(text.contains(line), "{line} in {text}");
    }
}

/// The client address the sidecar binary logged.
pub async fn listening_addr(child: &mut tokio::process::Child) -> SocketAddr {
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let addr = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(line) = lines.next_line().await.unwrap() {
            let Ok(entry) = serde_json::from_str::<serde_json::Value>(&line) else {
                continue;
            };
            if entry["fields"]["message"] == "listening" {
                return entry["fields"]["addr"].as_str().unwrap().parse().unwrap();
            }
        }
        panic!("the sidecar exited before listening");
    })
    .await
    .expect("the sidecar listening within 30 s");
    // Keep reading so the sidecar never blocks on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    addr
}

#[tokio::test]
async fn sigterm_drains_requests_in_flight_then_exits() {
    let coordinator = Coordinator::start().await;
    let upstream = TestUpstream::start().await;
    let mut sidecar = tokio::process::Command::new(env!("CARGO_BIN_EXE_idempotency-sidecar"))
        .args(["--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"])
        .args([
            "--upstream",
            &upstream.url(),
            "--coordinator",
            &coordinator.endpoint(),
        ])
        // The one-thread runtime: a request and the drain on it too.
        .args(["--log-format", "json", "--worker-threads", "1"])
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start the sidecar binary");
    let addr = listening_addr(&mut sidecar).await;
    let client = TestClient::new(addr);
    let in_flight = tokio::spawn(async move { client.post("/gate", &fresh_key(), "{}").await });
    eventually(
        "the upstream to see the request",
        Duration::from_secs(10),
        || async { (upstream.count("/gate") == 1).then_some(()) },
    )
    .await;
    let pid = sidecar.id().unwrap();
    let sent = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap();
    assert!(sent.success());
    // New connections are refused once draining.
    eventually("the listener closed", Duration::from_secs(10), || async {
        tokio::net::TcpStream::connect(addr)
            .await
            .is_err()
            .then_some(())
    })
    .await;
    upstream.open_gate();
    let reply = in_flight.await.unwrap();
    assert_eq!(reply.status, StatusCode::CREATED);
    let status = tokio::time::timeout(Duration::from_secs(30), sidecar.wait())
        .await
        .expect("the sidecar exits after draining")
        .unwrap();
    assert!(status.success(), "{status:?}");
}

#[tokio::test]
async fn over_tls_the_sidecar_coordinates_and_follows_the_coordinators_health() {
    use crate::pki::{PemFiles, pki};
    let server_pki = pki(&["localhost", "127.0.0.1"]);
    let files = PemFiles::new();
    let [cert, key, ca] = [
        files.write("server.pem", &server_pki.cert),
        files.write("server.key", &server_pki.key),
        files.write("ca.pem", &server_pki.ca),
    ]
    .map(|path| path.display().to_string());
    let db = crate::database::TestDatabase::create().await;
    let launch = crate::process::Launch {
        binary: Some(crate::binary::path()),
        ..crate::process::Launch::default()
    };
    let flags = [
        "--tls-cert",
        &cert,
        "--tls-key",
        &key,
        "--health-interval",
        "200ms",
    ];
    let server = crate::process::ServerProcess::launch(&db.url, &flags, launch).await;
    let upstream = TestUpstream::start().await;
    let endpoint = format!("https://{}", server.addr);
    let sidecar =
        crate::support::start_sidecar(&upstream.url(), &endpoint, &["--coordinator-ca", &ca]).await;
    let client = TestClient::new(sidecar.addr);
    let key = fresh_key();
    assert_eq!(
        client.post("/pay", &key, "{}").await.status,
        StatusCode::CREATED
    );
    assert!(client.post("/pay", &key, "{}").await.replayed());
    let ops = TestClient::new(sidecar.metrics_addr);
    eventually("ready over TLS", Duration::from_secs(10), || async {
        let reply = ops.send(Method::GET, "/readyz", None, "", &[]).await;
        (reply.status == StatusCode::OK).then_some(())
    })
    .await;
}

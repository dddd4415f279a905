//! Health for Kubernetes probes: liveness ("") follows the process, readiness
//! (idempotency.v1.Coordinator) follows the database.

use std::time::Duration;

use idempotency_coordinator::config::ServeConfig;
use tonic::Code;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};

use crate::helpers::*;

#[tokio::test]
async fn liveness_and_readiness_are_serving_while_the_database_answers() {
    let app = spawn_app().await;
    assert_eq!(health(&app, "").await, ServingStatus::Serving);
    until_health(&app, READINESS, ServingStatus::Serving).await;
}

#[tokio::test]
async fn with_the_database_unreachable_the_server_is_live_not_ready_and_answers_unavailable() {
    // Nothing listens on port 1 of the loopback address.
    let mut config = ServeConfig::new(
        "127.0.0.1:0".parse().unwrap(),
        "postgres://postgres@127.0.0.1:1/none",
    );
    config.run_migrations = false;
    config.store.connect_wait = Duration::from_millis(200);
    let server = start_server(config).await;

    assert_eq!(health(&server, "").await, ServingStatus::Serving);
    assert_eq!(health(&server, READINESS).await, ServingStatus::NotServing);

    let mut c = server.client.clone();
    let err = c.acquire(acquire("s", "k")).await.unwrap_err();
    assert_eq!(err.code(), Code::Unavailable);
    assert_eq!(reason(&err), "DATABASE_UNAVAILABLE");
    use tonic_types::StatusExt;
    assert!(
        err.get_error_details().retry_info().is_some(),
        "RetryInfo tells when"
    );
    assert!(
        !err.message().contains("127.0.0.1"),
        "no internals: {}",
        err.message()
    );
}

#[tokio::test]
async fn readiness_follows_the_database_away_and_back_on_its_own() {
    let db = TestDatabase::create().await;
    let proxy = DatabaseProxy::start(database_addr()).await;
    let mut config = ServeConfig::new("127.0.0.1:0".parse().unwrap(), proxy.url_for(&db));
    config.store.connect_wait = Duration::from_millis(300);
    let server = start_server(config).await;
    let mut c = server.client.clone();
    until_health(&server, READINESS, ServingStatus::Serving).await;
    proceed(&mut c, acquire("s", "before")).await;

    proxy.cut();
    until_health(&server, READINESS, ServingStatus::NotServing).await;
    assert_eq!(
        health(&server, "").await,
        ServingStatus::Serving,
        "still live"
    );
    let err = c.acquire(acquire("s", "during")).await.unwrap_err();
    assert_eq!(err.code(), Code::Unavailable);

    proxy.restore();
    until_health(&server, READINESS, ServingStatus::Serving).await;
    // Pooled connections that died with the cut are replaced.
    let resp = eventually(
        "an acquire to succeed again",
        Duration::from_secs(10),
        || {
            let mut c = c.clone();
            async move {
                c.acquire(acquire("s", "after"))
                    .await
                    .ok()
                    .map(|r| r.into_inner())
            }
        },
    )
    .await;
    assert_eq!(
        decision(&resp),
        idempotency_coordinator::proto::Decision::Proceed
    );
}

#[tokio::test]
async fn on_shutdown_readiness_turns_not_serving_while_calls_are_still_answered() {
    let app = spawn_app_with(|c| c.shutdown_delay = Duration::from_secs(30)).await;
    until_health(&app, READINESS, ServingStatus::Serving).await;
    // Open the connections before shutdown starts: a draining server takes
    // no new ones once the delay is over, but keeps these.
    let mut health_client = HealthClient::new(app.channel().await);
    let mut c = app.client.clone();

    let TestApp { server, db: _db } = app;
    let stopped = tokio::spawn(server.stop());

    eventually("readiness NOT_SERVING", Duration::from_secs(10), || {
        let mut h = health_client.clone();
        async move {
            let s = h
                .check(HealthCheckRequest {
                    service: READINESS.into(),
                })
                .await
                .ok()?
                .into_inner()
                .status;
            (s == ServingStatus::NotServing as i32).then_some(())
        }
    })
    .await;
    let live = health_client
        .check(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .unwrap()
        .into_inner()
        .status;
    assert_eq!(live, ServingStatus::NotServing as i32, "shutting down");
    proceed(&mut c, acquire("s", "during-drain")).await;
    stopped.abort();
}

#[tokio::test]
async fn the_health_command_exits_zero_only_while_the_server_is_ready() {
    let db = TestDatabase::create().await;
    let server = ServerProcess::start(&db.url).await;
    let health = |target: String| async move {
        tokio::process::Command::new(env!("CARGO_BIN_EXE_idempotency-coordinator"))
            .args(["health", "--target", &target])
            .output()
            .await
            .expect("run the health command")
    };
    let ready = eventually("readiness", std::time::Duration::from_secs(10), || {
        let target = server.addr.to_string();
        async move {
            let out = health(target).await;
            out.status.success().then_some(out)
        }
    })
    .await;
    assert!(ready.status.success());
    let addr = server.addr;
    assert!(server.terminate().await.success());
    let gone = health(addr.to_string()).await;
    assert!(!gone.status.success());
    let said = String::from_utf8_lossy(&gone.stderr);
    assert!(
        said.contains(&format!("{addr} is not serving: connection refused")),
        "{said}"
    );
    assert!(!said.contains("configuration"), "{said}");
    assert_eq!(
        said.matches("refused").count(),
        1,
        "one cause, once: {said}"
    );
}

/// The image's health check runs `health` with the environment `serve`
/// reads: it asks the address the server listens on (an unspecified one on
/// loopback), over TLS with the server's own certificate, presenting it as
/// a client certificate when the server requires one.
#[tokio::test]
async fn the_health_command_reads_the_servers_address_and_tls_from_the_environment() {
    let db = TestDatabase::create().await;
    let pki = pki(&["coordinator.internal"]);
    let files = PemFiles::new();
    let cert = files.write("cert.pem", &pki.cert);
    let key = files.write("key.pem", &pki.key);
    let ca = files.write("ca.pem", &pki.ca);
    let (cert, key, ca) = (
        cert.to_str().unwrap(),
        key.to_str().unwrap(),
        ca.to_str().unwrap(),
    );
    let server = ServerProcess::launch(
        &db.url,
        &["--tls-cert", cert, "--tls-key", key, "--tls-client-ca", ca],
        Launch::default(),
    )
    .await;
    let listen = format!("0.0.0.0:{}", server.addr.port());
    let health = |env: Vec<(&'static str, String)>| async move {
        tokio::process::Command::new(env!("CARGO_BIN_EXE_idempotency-coordinator"))
            .arg("health")
            .env_clear()
            .envs(env)
            .output()
            .await
            .expect("run the health command")
    };
    let env = vec![
        ("IDEMPOTENCY_LISTEN", listen.clone()),
        ("IDEMPOTENCY_TLS_CERT", cert.to_owned()),
        ("IDEMPOTENCY_TLS_KEY", key.to_owned()),
        ("IDEMPOTENCY_TLS_CLIENT_CA", ca.to_owned()),
    ];
    let ready = eventually("readiness", std::time::Duration::from_secs(10), || {
        let env = env.clone();
        async move {
            let out = health(env).await;
            out.status.success().then_some(out)
        }
    })
    .await;
    assert!(ready.status.success());
    // Plaintext to a TLS port is not serving.
    let plain = health(vec![("IDEMPOTENCY_LISTEN", listen)]).await;
    assert!(!plain.status.success());
    assert!(server.terminate().await.success());
}

/// What the TLS deployment's probes run (deploy/kubernetes/tls): started
/// against a database that does not answer yet, the server is live (the
/// port answers, liveness SERVING) and not ready: the `health` command, as
/// the readiness probe runs it over TLS, exits non-zero and names
/// NOT_SERVING, from the first moment the port is served.
#[tokio::test]
async fn under_tls_the_readiness_probe_fails_until_the_database_answers() {
    let pki = pki(&["localhost"]);
    let files = PemFiles::new();
    let cert = files.write("cert.pem", &pki.cert);
    let key = files.write("key.pem", &pki.key);
    let (cert, key) = (cert.to_str().unwrap(), key.to_str().unwrap());
    // Nothing listens on port 1 of the loopback address.
    let server = ServerProcess::launch(
        "postgres://postgres@127.0.0.1:1/none",
        &["--tls-cert", cert, "--tls-key", key],
        Launch {
            before_database: true,
            ..Launch::default()
        },
    )
    .await;
    let target = server.addr.to_string();
    let probe = |service: &'static str| {
        let target = target.clone();
        async move {
            tokio::process::Command::new(env!("CARGO_BIN_EXE_idempotency-coordinator"))
                .args(["health", "--target", &target, "--service", service])
                .args(["--tls-cert", cert, "--tls-key", key])
                .env_clear()
                .output()
                .await
                .expect("run the health command")
        }
    };
    let readiness = probe("idempotency.v1.Coordinator").await;
    let said = String::from_utf8_lossy(&readiness.stderr);
    assert!(
        !readiness.status.success(),
        "ready without a database: {said}"
    );
    assert!(said.contains("is not serving: NOT_SERVING"), "{said}");
    let liveness = probe("").await;
    assert!(
        liveness.status.success(),
        "live while waiting: {}",
        String::from_utf8_lossy(&liveness.stderr)
    );
    assert!(server.terminate().await.success());
}

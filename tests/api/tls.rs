//! TLS with certificates made here (rcgen): trusted clients connect,
//! plaintext and untrusting clients are refused, and with mutual TLS so are
//! clients without a certificate.

use std::time::Duration;

use idempotency_coordinator::config::ServeConfig;
use idempotency_coordinator::proto::{Decision, coordinator_client::CoordinatorClient};
use idempotency_coordinator::startup::Application;
use idempotency_coordinator::tls::TlsFiles;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};

use crate::helpers::*;

/// A TLS server on a fresh database, until dropped.
async fn tls_server(
    db: &TestDatabase,
    files: TlsFiles,
) -> (Serving, std::sync::Arc<idempotency_coordinator::tls::Tls>) {
    let mut config = ServeConfig::new("127.0.0.1:0".parse().unwrap(), db.url.clone());
    config.tls = Some(files);
    let app = Application::build(config).await.expect("build with TLS");
    let tls = app.tls_handle().expect("TLS configured");
    (serve(app), tls)
}

async fn connect(
    addr: std::net::SocketAddr,
    tls: Option<ClientTlsConfig>,
) -> Result<CoordinatorClient<Channel>, tonic::transport::Error> {
    let scheme = if tls.is_some() { "https" } else { "http" };
    let mut endpoint = Channel::from_shared(format!("{scheme}://{addr}"))
        .unwrap()
        .connect_timeout(Duration::from_secs(5));
    if let Some(tls) = tls {
        endpoint = endpoint.tls_config(tls)?;
    }
    Ok(CoordinatorClient::new(endpoint.connect().await?))
}

fn trusting(ca: &str) -> ClientTlsConfig {
    ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(ca))
        .domain_name("localhost")
}

/// Whether a call over `client` gets an answer.
async fn answers(client: Result<CoordinatorClient<Channel>, tonic::transport::Error>) -> bool {
    match client {
        Ok(mut c) => c.acquire(acquire("s", "tls-probe")).await.is_ok(),
        Err(_) => false,
    }
}

#[tokio::test]
async fn a_client_that_trusts_the_ca_connects_and_others_are_refused() {
    let db = TestDatabase::create().await;
    let server_pki = pki(&["localhost", "127.0.0.1"]);
    let stranger = pki(&["localhost"]);
    let files = PemFiles::new();
    let (serving, _tls) = tls_server(
        &db,
        TlsFiles {
            cert: files.write("server.pem", &server_pki.cert),
            key: files.write("server.key", &server_pki.key),
            client_ca: None,
        },
    )
    .await;

    let mut trusted = connect(serving.addr, Some(trusting(&server_pki.ca)))
        .await
        .expect("a client trusting the CA connects");
    let answer = trusted
        .acquire(acquire("s", "k"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(decision(&answer), Decision::Proceed);

    assert!(
        !answers(connect(serving.addr, None).await).await,
        "plaintext refused"
    );
    assert!(
        !answers(connect(serving.addr, Some(trusting(&stranger.ca))).await).await,
        "a client trusting another CA refuses the server"
    );
}

#[tokio::test]
async fn with_mutual_tls_a_client_needs_a_certificate_from_the_client_ca() {
    let db = TestDatabase::create().await;
    let server_pki = pki(&["localhost"]);
    let client_pki = pki(&["client.example"]);
    let stranger = pki(&["client.example"]);
    let files = PemFiles::new();
    let (serving, _tls) = tls_server(
        &db,
        TlsFiles {
            cert: files.write("server.pem", &server_pki.cert),
            key: files.write("server.key", &server_pki.key),
            client_ca: Some(files.write("clients.pem", &client_pki.ca)),
        },
    )
    .await;

    let anonymous = connect(serving.addr, Some(trusting(&server_pki.ca))).await;
    assert!(!answers(anonymous).await, "no client certificate: refused");

    let with_stranger =
        trusting(&server_pki.ca).identity(Identity::from_pem(&stranger.cert, &stranger.key));
    assert!(
        !answers(connect(serving.addr, Some(with_stranger)).await).await,
        "a certificate from another CA: refused"
    );

    let with_cert =
        trusting(&server_pki.ca).identity(Identity::from_pem(&client_pki.cert, &client_pki.key));
    assert!(answers(connect(serving.addr, Some(with_cert)).await).await);
}

#[tokio::test]
async fn certificates_are_read_again_on_reload_and_a_bad_file_changes_nothing() {
    let db = TestDatabase::create().await;
    let old = pki(&["localhost"]);
    let new = pki(&["localhost"]);
    let files = PemFiles::new();
    let tls_files = TlsFiles {
        cert: files.write("server.pem", &old.cert),
        key: files.write("server.key", &old.key),
        client_ca: None,
    };
    let (serving, tls) = tls_server(&db, tls_files).await;
    // A connection made before the reload keeps working after it.
    let mut before = connect(serving.addr, Some(trusting(&old.ca)))
        .await
        .unwrap();

    files.write("server.pem", "not a certificate");
    assert!(tls.reload().is_err());
    assert!(answers(connect(serving.addr, Some(trusting(&old.ca))).await).await);

    files.write("server.pem", &new.cert);
    files.write("server.key", &new.key);
    tls.reload().expect("reload the new certificate");
    assert!(answers(connect(serving.addr, Some(trusting(&new.ca))).await).await);
    assert!(!answers(connect(serving.addr, Some(trusting(&old.ca))).await).await);
    before
        .acquire(acquire("s", "still-connected"))
        .await
        .expect("open connections survive a reload");
}

#[tokio::test]
async fn the_http_port_serves_http1_and_http2_over_tls_by_alpn() {
    let db = TestDatabase::create().await;
    let server_pki = pki(&["localhost", "127.0.0.1"]);
    let files = PemFiles::new();
    let mut config = ServeConfig::new("127.0.0.1:0".parse().unwrap(), db.url.clone());
    config.http_listen = Some("127.0.0.1:0".parse().unwrap());
    config.tls = Some(TlsFiles {
        cert: files.write("server.pem", &server_pki.cert),
        key: files.write("server.key", &server_pki.key),
        client_ca: None,
    });
    let app = Application::build(config).await.expect("build with TLS");
    let port = app.http_addr().expect("the HTTP port").port();
    let _serving = serve(app);
    idempotency_coordinator::tls::install_crypto_provider();
    let ca = reqwest::Certificate::from_pem(server_pki.ca.as_bytes()).unwrap();
    let url = format!("https://localhost:{port}/acquire");
    for (key, http1_only, version) in [
        ("tls-1", true, reqwest::Version::HTTP_11),
        ("tls-2", false, reqwest::Version::HTTP_2),
    ] {
        let mut builder = reqwest::Client::builder()
            .tls_certs_only([ca.clone()])
            .resolve("localhost", ([127, 0, 0, 1], port).into());
        if http1_only {
            builder = builder.http1_only();
        }
        let response = builder
            .build()
            .unwrap()
            .post(&url)
            .header("content-type", "application/json")
            .body(format!(r#"{{"scope":"s","idempotency_key":"{key}"}}"#))
            .send()
            .await
            .expect("a client trusting the CA is answered");
        assert_eq!(response.version(), version);
        let answer: serde_json::Value =
            serde_json::from_slice(&response.bytes().await.unwrap()).unwrap();
        assert_eq!(answer["decision"], "PROCEED");
    }
    let plaintext = reqwest::Client::new()
        .post(format!("http://127.0.0.1:{port}/acquire"))
        .body("{}")
        .send()
        .await;
    assert!(
        plaintext.is_err() || !plaintext.unwrap().status().is_success(),
        "plaintext is not served on a TLS port"
    );
}

//! The recovery webhook over HTTPS: the server binary POSTs a due record to
//! a TLS receiver whose certificate a private CA signed
//! (`--recovery-webhook-ca`), refuses a receiver it does not trust, and
//! refuses to start with a webhook configuration that cannot work.
//!
//! A test binary of its own, so that it can start the server binary with
//! exactly the flags and environment an operator would use.

use test_support::helpers::{database, process};

use std::sync::Arc;
use std::time::Duration;

use idempotency_coordinator::proto::{self, complete_request::Outcome};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::{self, pki_types::PrivateKeyDer, pki_types::pem::PemObject};

use database::TestDatabase;
use process::{Launch, ServerProcess};
use test_support::helpers::{PemFiles, Pki, pki};

/// What the receiver saw on one connection.
#[derive(Debug)]
enum Seen {
    /// A request over TLS, and its JSON body.
    Post(serde_json::Value),
    /// The client broke off the handshake (it did not trust us).
    HandshakeFailed(String),
}

/// An HTTPS receiver on 127.0.0.1 that answers every request 204.
struct TlsWebhook {
    url: String,
    seen: mpsc::UnboundedReceiver<Seen>,
}

impl TlsWebhook {
    async fn start(pki: &Pki) -> Self {
        let certs = rustls::pki_types::CertificateDer::pem_slice_iter(pki.cert.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .unwrap();
        let key = PrivateKeyDer::from_pem_slice(pki.key.as_bytes()).unwrap();
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .unwrap();
        let acceptor = TlsAcceptor::from(Arc::new(config));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("https://{}/recover", listener.local_addr().unwrap());
        let (tx, seen) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok((socket, _)) = listener.accept().await {
                let (acceptor, tx) = (acceptor.clone(), tx.clone());
                tokio::spawn(async move {
                    match acceptor.accept(socket).await {
                        Ok(stream) => serve(stream, tx).await,
                        Err(e) => {
                            let _ = tx.send(Seen::HandshakeFailed(e.to_string()));
                        }
                    }
                });
            }
        });
        TlsWebhook { url, seen }
    }

    /// The next thing seen, within 10 s.
    async fn next(&mut self) -> Seen {
        tokio::time::timeout(Duration::from_secs(10), self.seen.recv())
            .await
            .expect("the webhook was called within 10 s")
            .expect("the receiver runs")
    }
}

/// Reads HTTP/1.1 requests (headers, then content-length bytes) and answers
/// each 204.
async fn serve(
    mut stream: tokio_rustls::server::TlsStream<tokio::net::TcpStream>,
    tx: mpsc::UnboundedSender<Seen>,
) {
    let mut buffer = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => buffer.extend_from_slice(&chunk[..n]),
        }
        let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") else {
            continue;
        };
        let head = String::from_utf8_lossy(&buffer[..end]).to_string();
        let length = head
            .lines()
            .find_map(|l| {
                let (name, value) = l.split_once(':')?;
                name.eq_ignore_ascii_case("content-length")
                    .then(|| value.trim().parse::<usize>().ok())?
            })
            .unwrap_or(0);
        if buffer.len() < end + 4 + length {
            continue;
        }
        let body = serde_json::from_slice(&buffer[end + 4..end + 4 + length])
            .unwrap_or(serde_json::Value::Null);
        let _ = tx.send(Seen::Post(body));
        if stream
            .write_all(b"HTTP/1.1 204 No Content\r\n\r\n")
            .await
            .is_err()
        {
            return;
        }
        buffer.drain(..end + 4 + length);
    }
}

/// Acquires `key` in scope `jobs` and fails it with a retry due at once, so
/// the next sweep hands it to the webhook.
async fn make_due(server: &ServerProcess, key: &str) {
    let mut client = server.client().await;
    let granted = client
        .acquire(proto::AcquireRequest {
            scope: "jobs".into(),
            key: key.into(),
            ..Default::default()
        })
        .await
        .expect("acquire")
        .into_inner();
    let token = granted.lease.expect("a lease").token;
    client
        .complete(proto::CompleteRequest {
            scope: "jobs".into(),
            key: key.into(),
            lease_token: token,
            outcome: Some(Outcome::Failure(proto::Failure {
                error: "upstream 503".into(),
                permanent: false,
                retry_after: Some(prost_types::Duration {
                    seconds: 0,
                    nanos: 0,
                }),
            })),
        })
        .await
        .expect("complete");
}

#[tokio::test]
async fn a_due_record_reaches_an_https_webhook_signed_by_the_given_ca() {
    let db = TestDatabase::create().await;
    let pki = pki(&["127.0.0.1"]);
    let files = PemFiles::new();
    let ca = files.write("ca.pem", &pki.ca).display().to_string();
    let mut hook = TlsWebhook::start(&pki).await;
    let server = ServerProcess::start_with(
        &db.url,
        &[
            "--sweep-interval",
            "100ms",
            "--recovery-webhook",
            &hook.url,
            "--recovery-webhook-ca",
            &ca,
        ],
    )
    .await;
    make_due(&server, "invoice-7").await;

    match hook.next().await {
        Seen::Post(body) => {
            assert_eq!(body["scope"], "jobs");
            assert_eq!(body["key"], "invoice-7");
            assert_eq!(body["reason"], "RETRY_DUE");
            assert_eq!(body["last_error"], "upstream 503");
        }
        other => panic!("a POST over TLS expected, got {other:?}"),
    }
}

#[tokio::test]
async fn an_https_webhook_whose_certificate_is_not_trusted_gets_nothing() {
    let db = TestDatabase::create().await;
    let (ours, stranger) = (pki(&["127.0.0.1"]), pki(&["127.0.0.1"]));
    let files = PemFiles::new();
    // The server trusts only the stranger's CA, as its system roots.
    let roots = files.write("roots.pem", &stranger.ca).display().to_string();
    let system = [("SSL_CERT_FILE", roots.as_str()), ("SSL_CERT_DIR", "")];
    let mut hook = TlsWebhook::start(&ours).await;
    let server = ServerProcess::launch(
        &db.url,
        &["--sweep-interval", "100ms", "--recovery-webhook", &hook.url],
        Launch {
            env: &system,
            ..Launch::default()
        },
    )
    .await;
    make_due(&server, "invoice-8").await;

    match hook.next().await {
        Seen::HandshakeFailed(why) => assert!(why.contains("alert"), "{why}"),
        other => panic!("the handshake should fail, got {other:?}"),
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !server
        .logs()
        .iter()
        .any(|l| l.contains("recovery webhook unreachable"))
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no warning logged: {:#?}",
            server.logs()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Nothing was ever POSTed.
    while let Ok(seen) = hook.seen.try_recv() {
        assert!(matches!(seen, Seen::HandshakeFailed(_)), "{seen:?}");
    }
}

/// Runs `serve` with `flags` and `env` and returns what it printed on exit;
/// panics if it starts.
async fn refused(flags: &[&str], env: &[(&str, &str)]) -> String {
    let out = tokio::time::timeout(
        Duration::from_secs(30),
        tokio::process::Command::new(env!("CARGO_BIN_EXE_idempotency-coordinator"))
            .args(["serve", "--listen", "127.0.0.1:0"])
            // Never reached: the webhook is checked first.
            .args(["--database-url", "postgres://nobody@127.0.0.1:1/none"])
            .args(flags)
            .env_remove("RUST_LOG")
            .envs(env.iter().copied())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("the server exited at once")
    .expect("run the server binary");
    assert!(!out.status.success(), "the server must refuse to start");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[tokio::test]
async fn a_webhook_that_cannot_work_stops_the_server_at_start() {
    let files = PemFiles::new();
    let not_pem = files
        .write("not.pem", "no certificate here\n")
        .display()
        .to_string();
    let missing = files.0.join("missing.pem");
    let missing = missing.to_str().unwrap();
    let https = "https://127.0.0.1:9/recover";
    for (flags, says) in [
        (
            vec!["--recovery-webhook", "ftp://127.0.0.1/recover"],
            "must be an http:// or https:// URL, got ftp://",
        ),
        (
            vec![
                "--recovery-webhook",
                https,
                "--recovery-webhook-ca",
                missing,
            ],
            "cannot read the recovery webhook's CA",
        ),
        (
            vec![
                "--recovery-webhook",
                https,
                "--recovery-webhook-ca",
                &not_pem,
            ],
            "holds no PEM certificate",
        ),
        (
            vec![
                "--recovery-webhook",
                "http://127.0.0.1:9/recover",
                "--recovery-webhook-ca",
                &not_pem,
            ],
            "only used with an https:// URL",
        ),
    ] {
        let stderr = refused(&flags, &[]).await;
        assert!(stderr.contains(says), "{flags:?}: {stderr}");
    }
}

#[tokio::test]
async fn an_http_webhook_needs_no_root_certificates() {
    // A machine without a CA bundle (SSL_CERT_FILE names an empty file,
    // no SSL_CERT_DIR): an https:// webhook cannot be verified and is
    // refused at start, while an http:// one loads no roots and starts.
    let db = TestDatabase::create().await;
    let files = PemFiles::new();
    let empty = files.write("empty.pem", "").display().to_string();
    let system = [("SSL_CERT_FILE", empty.as_str()), ("SSL_CERT_DIR", "")];
    let stderr = refused(
        &["--recovery-webhook", "https://127.0.0.1:9/recover"],
        &system,
    )
    .await;
    assert!(
        stderr.contains("No CA certificates were loaded from the system"),
        "{stderr}"
    );
    let server = ServerProcess::launch(
        &db.url,
        &["--recovery-webhook", "http://127.0.0.1:9/recover"],
        Launch {
            env: &system,
            ..Launch::default()
        },
    )
    .await;
    server.terminate().await;
}

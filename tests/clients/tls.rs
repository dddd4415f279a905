//! TLS with certificates made here (rcgen): the client trusts the server
//! through the CA it is given, and presents its own certificate for mutual
//! TLS; without one it is refused.

use idempotency_client::{
    Client, ClientOptions, Fingerprint, RunOnceError, RunOptions, TlsOptions, WorkError,
};

use crate::database::TestDatabase;
use crate::pki::{PemFiles, pki};
use crate::process::ServerProcess;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_mutual_tls_a_client_with_a_certificate_runs_and_one_without_is_refused() {
    let (server_pki, client_pki) = (pki(&["localhost"]), pki(&["billing-service"]));
    let files = PemFiles::new();
    let [cert, key, ca] = [
        files.write("server.pem", &server_pki.cert),
        files.write("server.key", &server_pki.key),
        files.write("clients.pem", &client_pki.ca),
    ]
    .map(|path| path.display().to_string());
    let db = TestDatabase::create().await;
    let server = ServerProcess::start_with(
        &db.url,
        &[
            "--tls-cert",
            &cert,
            "--tls-key",
            &key,
            "--tls-client-ca",
            &ca,
        ],
    )
    .await;
    let endpoint = format!("https://{}", server.addr);
    let tls = TlsOptions {
        ca_pem: Some(server_pki.ca.clone()),
        domain: Some("localhost".into()),
        ..TlsOptions::default()
    };

    let client = Client::connect(
        endpoint.clone(),
        ClientOptions {
            tls: Some(TlsOptions {
                client_cert_pem: Some(client_pki.cert.clone()),
                client_key_pem: Some(client_pki.key.clone()),
                ..tls.clone()
            }),
            ..ClientOptions::default()
        },
    )
    .await
    .expect("connect over mutual TLS");
    let done = client
        .run_once(
            "tls.check",
            "k1",
            Fingerprint::None,
            &RunOptions::default(),
            |_| async { Ok::<_, WorkError<String>>(7) },
        )
        .await
        .expect("a call over mutual TLS");
    assert_eq!(done.value, 7);

    // Without a client certificate the server refuses the connection (at
    // the handshake, or at the first call under TLS 1.3).
    let without = ClientOptions {
        tls: Some(tls),
        ..ClientOptions::default()
    };
    let refused = match Client::connect(endpoint, without).await {
        Err(_) => true,
        Ok(client) => {
            let options = RunOptions {
                max_retries: 0,
                ..RunOptions::default()
            };
            matches!(
                client
                    .run_once("tls.check", "k2", Fingerprint::None, &options, |_| async {
                        Ok::<_, WorkError<String>>(8)
                    })
                    .await,
                Err(RunOnceError::Call(_))
            )
        }
    };
    assert!(refused, "a client without a certificate is refused");
}

//! TLS with certificates made here (rcgen): the client trusts the server
//! through the CA it is given, and presents its own certificate for mutual
//! TLS; without one it is refused.

use std::path::PathBuf;

use idempotency_client::{
    Client, ClientOptions, Fingerprint, RunOnceError, RunOptions, TlsOptions, WorkError,
};
use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};

use crate::database::TestDatabase;
use crate::process::ServerProcess;

/// A CA, and two certificates it signed (PEM): the server's and a client's.
struct Pki {
    ca: String,
    server: (String, String),
    client: (String, String),
}

fn pki() -> Pki {
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca_params, ca_key);
    let sign = |name: &str| {
        let key = KeyPair::generate().unwrap();
        let cert = CertificateParams::new(vec![name.to_owned()])
            .unwrap()
            .signed_by(&key, &issuer)
            .unwrap();
        (cert.pem(), key.serialize_pem())
    };
    Pki {
        ca: ca.pem(),
        server: sign("localhost"),
        client: sign("billing-service"),
    }
}

/// PEM files in a directory of their own, removed on drop.
struct Files(PathBuf);

impl Files {
    fn write(&self, name: &str, pem: &str) -> String {
        let path = self.0.join(name);
        std::fs::write(&path, pem).unwrap();
        path.to_str().unwrap().to_owned()
    }
}

impl Drop for Files {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_mutual_tls_a_client_with_a_certificate_runs_and_one_without_is_refused() {
    let pki = pki();
    let files =
        Files(std::env::temp_dir().join(format!("idem-client-tls-{}", uuid::Uuid::new_v4())));
    std::fs::create_dir_all(&files.0).unwrap();
    let (cert, key, ca) = (
        files.write("server.pem", &pki.server.0),
        files.write("server.key", &pki.server.1),
        files.write("ca.pem", &pki.ca),
    );
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
        ca_pem: Some(pki.ca.clone()),
        domain: Some("localhost".into()),
        ..TlsOptions::default()
    };

    let client = Client::connect(
        endpoint.clone(),
        ClientOptions {
            tls: Some(TlsOptions {
                client_cert_pem: Some(pki.client.0.clone()),
                client_key_pem: Some(pki.client.1.clone()),
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

//! TLS on the gRPC port and the HTTP port (rustls), and mutual TLS when a
//! client CA is given. Both ports share the certificates; they differ in
//! the protocols they offer by ALPN (gRPC: `h2`; HTTP: `h2` and `http/1.1`).
//! Certificates are read again on SIGHUP: each new connection's handshake
//! uses the configuration in force when it arrives, so a reload never drops
//! a connection. A reload that fails keeps the old configuration.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::server::WebPkiClientVerifier;
use tokio_rustls::rustls::{self, RootCertStore, ServerConfig};

/// Makes ring the process's rustls crypto provider, for the HTTP clients
/// that leave the choice to the process (the webhook's, and the download of
/// PostgreSQL's binaries). Idempotent.
pub fn install_crypto_provider() {
    // An error only says a provider is installed already.
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// Where the server's certificate, key and (for mutual TLS) client CA live.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    /// PEM certificate chain, leaf first.
    pub cert: PathBuf,
    /// PEM private key.
    pub key: PathBuf,
    /// PEM CA certificates that client certificates must chain to; when set,
    /// clients without a valid certificate are refused.
    pub client_ca: Option<PathBuf>,
}

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {path}")]
    Read {
        /// The PEM file.
        path: PathBuf,
        /// Why it could not be read or parsed.
        #[source]
        source: rustls::pki_types::pem::Error,
    },
    #[error("{0} holds no certificate")]
    NoCertificate(PathBuf),
    #[error("the TLS configuration is not usable")]
    Rustls(#[from] rustls::Error),
    #[error("the client CA is not usable")]
    ClientCa(#[from] rustls::server::VerifierBuilderError),
}

fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let read = |source| TlsError::Read {
        path: path.to_owned(),
        source,
    };
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(read)?
        .collect::<Result<Vec<_>, _>>()
        .map_err(read)?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate(path.to_owned()));
    }
    Ok(certs)
}

/// Which port a configuration is for: what it offers by ALPN.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Port {
    /// gRPC runs over HTTP/2 alone.
    Grpc,
    /// The HTTP/JSON port speaks HTTP/2 and HTTP/1.1.
    Http,
}

fn server_config(files: &TlsFiles, port: Port) -> Result<ServerConfig, TlsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let certs = certificates(&files.cert)?;
    let key = PrivateKeyDer::from_pem_file(&files.key).map_err(|source| TlsError::Read {
        path: files.key.clone(),
        source,
    })?;
    let builder = ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()?;
    let builder = match &files.client_ca {
        Some(ca) => {
            let mut roots = RootCertStore::empty();
            for cert in certificates(ca)? {
                roots.add(cert)?;
            }
            let verifier =
                WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider).build()?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let mut config = builder.with_single_cert(certs, key)?;
    // gRPC runs over HTTP/2, which TLS clients ask for by ALPN; HTTP/JSON
    // clients may ask for either version (a client that asks for none gets
    // HTTP/1.1 or, with prior knowledge, HTTP/2).
    config.alpn_protocols = match port {
        Port::Grpc => vec![b"h2".to_vec()],
        Port::Http => vec![b"h2".to_vec(), b"http/1.1".to_vec()],
    };
    Ok(config)
}

/// The TLS configuration in force, replaceable while the server runs.
pub struct Tls {
    files: TlsFiles,
    /// The gRPC port's and the HTTP port's, replaced together.
    acceptors: RwLock<Acceptors>,
}

struct Acceptors {
    grpc: TlsAcceptor,
    http: TlsAcceptor,
}

impl Acceptors {
    fn load(files: &TlsFiles) -> Result<Self, TlsError> {
        Ok(Acceptors {
            grpc: TlsAcceptor::from(Arc::new(server_config(files, Port::Grpc)?)),
            http: TlsAcceptor::from(Arc::new(server_config(files, Port::Http)?)),
        })
    }
}

impl Tls {
    pub fn load(files: TlsFiles) -> Result<Self, TlsError> {
        let acceptors = Acceptors::load(&files)?;
        Ok(Tls {
            files,
            acceptors: RwLock::new(acceptors),
        })
    }

    /// Reads the files again; on failure the old configuration stays.
    pub fn reload(&self) -> Result<(), TlsError> {
        let fresh = Acceptors::load(&self.files)?;
        *self.acceptors.write().unwrap_or_else(|e| e.into_inner()) = fresh;
        Ok(())
    }

    /// The acceptor for a new gRPC connection's handshake.
    pub fn acceptor(&self) -> TlsAcceptor {
        self.acceptors
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .grpc
            .clone()
    }

    /// The acceptor for a new HTTP/JSON connection's handshake.
    pub fn http_acceptor(&self) -> TlsAcceptor {
        self.acceptors
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .http
            .clone()
    }
}

/// A client configuration that trusts exactly the server certificate in
/// `files` (its leaf, compared byte for byte, and the handshake signed by
/// its key): for a process that asks its own server, on loopback, whether
/// it serves (the `health` command), where no name or CA says more than
/// that. With a client CA (mutual TLS) it presents the same certificate and
/// key as its own, which the server accepts when one CA issued both.
pub fn own_server_client_config(files: &TlsFiles) -> Result<rustls::ClientConfig, TlsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let certs = certificates(&files.cert)?;
    let verifier = Arc::new(OwnCertificate {
        leaf: certs[0].clone(),
        algorithms: provider.signature_verification_algorithms,
    });
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .dangerous()
        .with_custom_certificate_verifier(verifier);
    let mut config = match &files.client_ca {
        Some(_) => {
            let key =
                PrivateKeyDer::from_pem_file(&files.key).map_err(|source| TlsError::Read {
                    path: files.key.clone(),
                    source,
                })?;
            builder.with_client_auth_cert(certs, key)?
        }
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(config)
}

/// Accepts the one certificate the server was configured with.
#[derive(Debug)]
struct OwnCertificate {
    leaf: CertificateDer<'static>,
    algorithms: rustls::crypto::WebPkiSupportedAlgorithms,
}

impl rustls::client::danger::ServerCertVerifier for OwnCertificate {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &rustls::pki_types::ServerName<'_>,
        _ocsp_response: &[u8],
        _now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        if end_entity.as_ref() == self.leaf.as_ref() {
            Ok(rustls::client::danger::ServerCertVerified::assertion())
        } else {
            Err(rustls::Error::InvalidCertificate(
                rustls::CertificateError::ApplicationVerificationFailure,
            ))
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

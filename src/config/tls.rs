//! TLS on the gRPC and HTTP ports, and for `health` to reach them.

use std::path::PathBuf;

use clap::Args;

use crate::tls::TlsFiles;

/// The TLS flags, shared by `serve` and `health` (which reads the same
/// files to reach the server as a container's health check).
#[derive(Debug, Clone, Args)]
pub struct TlsArgs {
    /// Serve TLS with this PEM certificate chain (needs --tls-key); read
    /// again on SIGHUP. Without it the port speaks plaintext.
    #[arg(long, env = "IDEMPOTENCY_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,

    /// The PEM private key of --tls-cert.
    #[arg(long, env = "IDEMPOTENCY_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,

    /// Require client certificates that chain to these PEM CA certificates
    /// (mutual TLS; needs --tls-cert).
    #[arg(long, env = "IDEMPOTENCY_TLS_CLIENT_CA", requires = "tls_cert")]
    pub tls_client_ca: Option<PathBuf>,
}

impl TlsArgs {
    /// The certificate files, when TLS is on.
    pub fn files(&self) -> Option<TlsFiles> {
        let (cert, key) = (self.tls_cert.clone()?, self.tls_key.clone()?);
        Some(TlsFiles {
            cert,
            key,
            client_ca: self.tls_client_ca.clone(),
        })
    }
}

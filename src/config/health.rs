//! The `health` command: which server to ask, and which of its services.

use std::net::SocketAddr;

use clap::Args;

use super::TlsArgs;

#[derive(Debug, Clone, Args)]
pub struct HealthArgs {
    /// The server's gRPC address: the address `serve` listens on (the same
    /// flag and environment variable), an unspecified one (0.0.0.0, [::])
    /// asked on loopback.
    #[arg(long, env = "IDEMPOTENCY_LISTEN", default_value = "127.0.0.1:50051")]
    pub listen: SocketAddr,
    /// Ask this address instead (host:port).
    #[arg(long)]
    pub target: Option<String>,
    /// The health service to ask: `idempotency.v1.Coordinator` is readiness
    /// (the database answers), `""` liveness.
    #[arg(long, default_value = "idempotency.v1.Coordinator")]
    pub service: String,
    /// TLS as `serve` has it (the same flags and environment variables):
    /// ask over TLS, trusting exactly the server's own certificate, and
    /// present it as a client certificate when the server requires one.
    #[command(flatten)]
    pub tls: TlsArgs,
}

impl HealthArgs {
    /// Where to ask: `--target`, or the listen address (on loopback when it
    /// names every interface).
    pub fn target(&self) -> String {
        if let Some(target) = &self.target {
            return target.clone();
        }
        let mut addr = self.listen;
        if addr.ip().is_unspecified() {
            addr.set_ip(match addr {
                SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
                SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
            });
        }
        addr.to_string()
    }
}

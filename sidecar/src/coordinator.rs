//! How the sidecar reaches the coordinator: over TCP (`http://HOST:PORT`,
//! or `https://` with TLS), or over a Unix socket (`unix:PATH`) when the
//! two share a pod or host and the coordinator serves one
//! (`--unix-socket`): no TCP stack on either side of each call.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use hyper_util::rt::TokioIo;
use idempotency_client::{Client, ClientOptions, ConnectError};
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint};

use crate::config::{Args, ConfigError};

/// The prefix of `--coordinator` that names a Unix socket.
pub const UNIX: &str = "unix:";

/// Where the coordinator is.
#[derive(Debug, Clone)]
pub enum Coordinator {
    /// A gRPC endpoint over TCP.
    Tcp(String),
    /// A Unix socket's path.
    Unix(Arc<Path>),
}

impl Coordinator {
    /// What `--coordinator` names.
    pub fn of(args: &Args) -> Coordinator {
        match args.coordinator.strip_prefix(UNIX) {
            Some(path) => Coordinator::Unix(PathBuf::from(path).into()),
            None => Coordinator::Tcp(args.coordinator.clone()),
        }
    }

    /// A client (connecting on its first call, and again as needed).
    pub fn client(&self, options: ClientOptions) -> Result<Client, ConnectError> {
        match self {
            Coordinator::Tcp(endpoint) => Client::connect_lazy(endpoint.clone(), options),
            Coordinator::Unix(path) => {
                let channel = unix_channel(path, &options);
                Client::new(channel, options)
            }
        }
    }

    /// The channel the coordinator's health is asked on, with the client
    /// library's TLS.
    pub fn health_channel(
        &self,
        args: &Args,
        options: &ClientOptions,
    ) -> Result<Channel, ConfigError> {
        match self {
            Coordinator::Tcp(_) => Ok(args.health_endpoint(options)?.connect_lazy()),
            Coordinator::Unix(path) => Ok(unix_channel(path, options)),
        }
    }
}

/// A channel whose every connection is to the Unix socket at `path`.
fn unix_channel(path: &Arc<Path>, options: &ClientOptions) -> Channel {
    let path = Arc::clone(path);
    // The URI names no host: every connection goes to the socket.
    Endpoint::from_static("http://localhost")
        .connect_timeout(options.connect_timeout)
        .connect_with_connector_lazy(tower::service_fn(move |_: http::Uri| {
            let path = Arc::clone(&path);
            async move { UnixStream::connect(&*path).await.map(TokioIo::new) }
        }))
}

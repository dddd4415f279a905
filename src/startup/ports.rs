//! The ports: bound first, before anything starts; the connection limit
//! each client port gets from the open file limit; and the client ports
//! served, stopping together.

use std::net::SocketAddr;
use std::os::unix::fs::FileTypeExt as _;
use std::path::Path;
use std::sync::Arc;

use tokio::net::{TcpListener, UnixListener};
use tokio_util::sync::CancellationToken;

use super::StartupError;
use super::http_door::HttpDoor;
use crate::config::ServeConfig;
use crate::metrics;
use crate::tls::Tls;
use crate::transport::{self, Admission, ConnectionLimits};

/// Open files the server needs besides client connections: its database
/// connections, the listener, the runtime's own, the webhook's and logs.
const RESERVED_FILES: usize = 64;

/// The connection limit in force on each client port: the configured one,
/// lowered (with a warning) so that every port at its limit together, the
/// metrics port's connections and the database connections fit in the open
/// file limit. One budget of descriptors, shared out equally between the
/// client ports (`ports`: the gRPC port, and the HTTP port if served), so
/// that a flood on one port cannot take the descriptors another port's
/// connections need.
fn connection_cap(config: &ServeConfig, ports: usize, metrics_port: bool) -> usize {
    let wanted = config.connections.max_connections;
    let Some(files) = transport::raise_open_file_limit() else {
        return wanted;
    };
    let scrapers = if metrics_port {
        metrics::MAX_SCRAPE_CONNECTIONS
    } else {
        0
    };
    let reserved =
        RESERVED_FILES + config.store.pool_size + config.store.shared_connections + scrapers;
    let fits = (usize::try_from(files)
        .unwrap_or(usize::MAX)
        .saturating_sub(reserved)
        / ports.max(1))
    .max(1);
    if fits < wanted {
        tracing::warn!(
            max_connections = fits,
            configured = wanted,
            open_file_limit = files,
            ports,
            "the open file limit lowers the connection limit"
        );
    }
    wanted.min(fits)
}

/// What a failed bind says: for a port in use, which flag moves it.
pub(super) fn bind_failure(addr: &SocketAddr, flag: &str, source: &std::io::Error) -> String {
    if source.kind() == std::io::ErrorKind::AddrInUse {
        format!("{addr} is in use; pass {flag} ADDR (or stop the other server)")
    } else {
        format!("cannot listen on {addr} ({flag})")
    }
}

/// The ports a server serves, bound first, before anything is started (a
/// private PostgreSQL included): a port in use is said at once.
pub struct Listeners {
    pub(super) grpc: TcpListener,
    pub(super) metrics: Option<TcpListener>,
    pub(super) http: Option<TcpListener>,
}

impl Listeners {
    /// Binds the gRPC port (`--listen`), and the HTTP/JSON and metrics
    /// ports when given.
    pub async fn bind(
        listen: SocketAddr,
        http_listen: Option<SocketAddr>,
        metrics_listen: Option<SocketAddr>,
    ) -> Result<Self, StartupError> {
        async fn one(addr: SocketAddr, flag: &'static str) -> Result<TcpListener, StartupError> {
            TcpListener::bind(addr)
                .await
                .map_err(|source| StartupError::Bind { addr, flag, source })
        }
        let grpc = one(listen, "--listen").await?;
        let http = match http_listen {
            Some(addr) => Some(one(addr, "--http-listen").await?),
            None => None,
        };
        let metrics = match metrics_listen {
            Some(addr) => Some(one(addr, "--metrics-listen").await?),
            None => None,
        };
        Ok(Listeners {
            grpc,
            metrics,
            http,
        })
    }
}

/// Binds the Unix socket at `path` (`--unix-socket`). A socket file left
/// by a server that stopped is replaced; one a live server answers on, or
/// any other file, is not.
pub(super) fn bind_unix(path: &Path) -> Result<UnixListener, StartupError> {
    let failed = |source| StartupError::BindUnix {
        path: path.to_owned(),
        source,
    };
    let stale = std::fs::symlink_metadata(path).is_ok_and(|meta| meta.file_type().is_socket());
    if stale {
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            return Err(failed(std::io::ErrorKind::AddrInUse.into()));
        }
        std::fs::remove_file(path).map_err(failed)?;
    }
    UnixListener::bind(path).map_err(failed)
}

/// The connection limits of the client ports: the configured ones, with
/// the connection cap [`connection_cap`] allows (`http`: the HTTP port is
/// served besides the gRPC port; `metrics_port`: the metrics port is).
pub(super) fn connection_limits(
    config: &ServeConfig,
    http: bool,
    metrics_port: bool,
) -> ConnectionLimits {
    let ports = if http { 2 } else { 1 };
    let mut connections = config.connections;
    connections.max_connections = connection_cap(config, ports, metrics_port);
    connections
}

/// The client ports, ready to serve: the gRPC port and, when configured,
/// the HTTP/JSON door, with the same TLS and connection limits, and the
/// gRPC Unix socket (no TLS).
pub(super) struct ClientPorts {
    pub(super) grpc: TcpListener,
    /// gRPC on a Unix socket too (`--unix-socket`), plaintext.
    pub(super) unix: Option<UnixListener>,
    /// What answers the gRPC port's calls.
    pub(super) admission: Arc<Admission>,
    pub(super) http: Option<HttpDoor>,
    pub(super) tls: Option<Arc<Tls>>,
    pub(super) connections: ConnectionLimits,
}

impl ClientPorts {
    /// Serves both ports until `closing` is cancelled, then returns once
    /// the calls in flight on both have finished.
    pub(super) async fn serve(self, closing: &CancellationToken) {
        let (unix, admission) = (self.unix, Arc::clone(&self.admission));
        let (connections, closed) = (self.connections, closing.clone().cancelled_owned());
        let unix = async move {
            if let Some(unix) = unix {
                transport::serve_unix(unix, admission, connections, closed).await;
            }
        };
        tokio::join!(
            unix,
            transport::serve(
                self.grpc,
                self.tls.clone(),
                self.admission,
                self.connections,
                closing.clone().cancelled_owned(),
            ),
            HttpDoor::serve(
                self.http,
                self.tls,
                self.connections,
                closing.clone().cancelled_owned(),
            ),
        );
    }
}

//! The HTTP/JSON door's wiring (`--http-listen`): the door built on the
//! gRPC port's admission, so that its requests become in-process gRPC
//! calls and nothing about callers is decided twice, and served on its own
//! port with the gRPC port's TLS and connection limits.

use std::future::Future;
use std::sync::Arc;

use tokio::net::TcpListener;

use super::StartupError;
use crate::auth::Authenticator;
use crate::config::ServeConfig;
use crate::http::{Door, DoorSecurity, DoorServices, Handler};
use crate::tls::Tls;
use crate::transport::{self, ConnectionLimits};

/// The door, ready to serve.
pub(super) struct HttpDoor {
    listener: TcpListener,
    handler: Arc<Handler>,
}

impl HttpDoor {
    /// The door on `listener`, when there is one: its calls go through
    /// the services' admission as the caller `auth` authenticates. Fails when the
    /// contract's descriptors cannot be read.
    pub(super) fn open(
        listener: Option<TcpListener>,
        services: DoorServices,
        auth: Arc<Authenticator>,
        config: &ServeConfig,
    ) -> Result<Option<HttpDoor>, StartupError> {
        let Some(listener) = listener else {
            return Ok(None);
        };
        let door = Door::new(
            services,
            auth,
            config.max_request_bytes,
            config.request_body_timeout,
            config.console,
            DoorSecurity {
                tls: config.tls.is_some(),
                allowed_hosts: config.http_allowed_hosts.clone(),
            },
        )?;
        Ok(Some(HttpDoor {
            listener,
            handler: Arc::new(Handler(door)),
        }))
    }

    /// Serves `door` until `stop` resolves, then returns once its calls
    /// have finished (as [`transport::serve_http`] does); without a door,
    /// returns at once.
    pub(super) async fn serve(
        door: Option<HttpDoor>,
        tls: Option<Arc<Tls>>,
        connections: ConnectionLimits,
        stop: impl Future<Output = ()>,
    ) {
        let Some(HttpDoor { listener, handler }) = door else {
            return;
        };
        if let Ok(addr) = listener.local_addr() {
            tracing::info!(%addr, tls = tls.is_some(), "serving HTTP/JSON");
        }
        transport::serve_http(listener, tls, handler, connections, stop).await;
    }
}

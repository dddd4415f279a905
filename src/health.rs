//! The `health` command: asks a server's health service once, as a
//! container's health check does, reading the same flags and environment as
//! `serve` (its address, and TLS with the server's own certificate), and
//! says in one sentence why a server is not serving.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};

use crate::config::HealthArgs;

/// How long the whole check may take.
const CHECK_TIMEOUT: Duration = Duration::from_secs(5);

/// Why a server is not healthy.
#[derive(Debug, thiserror::Error)]
#[error("{target} is not serving: {why}")]
pub struct Unhealthy {
    target: String,
    why: String,
}

/// Asks the server `args` names; `Ok` when it answers SERVING.
pub async fn check(args: &HealthArgs) -> Result<(), Unhealthy> {
    let target = args.target();
    let unhealthy = |why: String| Unhealthy {
        target: target.clone(),
        why,
    };
    let check = async {
        let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{target}"))
            .map_err(|e| unhealthy(e.to_string()))?;
        let channel = match args.tls.files() {
            None => endpoint.connect().await,
            Some(files) => {
                let config = crate::tls::own_server_client_config(&files)
                    .map_err(|e| unhealthy(crate::telemetry::cause_chain(&e)))?;
                endpoint
                    .connect_with_connector(OwnServer {
                        target: target.clone(),
                        tls: TlsConnector::from(Arc::new(config)),
                    })
                    .await
            }
        }
        .map_err(|e| unhealthy(root_cause(&e)))?;
        let answer = HealthClient::new(channel)
            .check(HealthCheckRequest {
                service: args.service.clone(),
            })
            .await
            .map_err(|status| unhealthy(status.message().to_owned()))?
            .into_inner();
        match answer.status() {
            ServingStatus::Serving => Ok(()),
            other => Err(unhealthy(other.as_str_name().to_owned())),
        }
    };
    tokio::time::timeout(CHECK_TIMEOUT, check)
        .await
        .unwrap_or_else(|_| Err(unhealthy(format!("no answer within {CHECK_TIMEOUT:?}"))))
}

/// The innermost cause of a failed connection, said once ("connection
/// refused", not three layers of "transport error: tcp connect error").
fn root_cause(error: &(dyn std::error::Error + 'static)) -> String {
    let mut cause = error;
    while let Some(next) = cause.source() {
        cause = next;
    }
    if let Some(io) = cause.downcast_ref::<std::io::Error>() {
        return match io.kind() {
            std::io::ErrorKind::ConnectionRefused => "connection refused".into(),
            _ => io.to_string(),
        };
    }
    cause.to_string()
}

/// Connects to the server over TLS, trusting its own certificate.
#[derive(Clone)]
struct OwnServer {
    target: String,
    tls: TlsConnector,
}

type Connecting =
    Pin<Box<dyn Future<Output = std::io::Result<TokioIo<TlsStream<TcpStream>>>> + Send>>;

impl tower_service::Service<http::Uri> for OwnServer {
    type Response = TokioIo<TlsStream<TcpStream>>;
    type Error = std::io::Error;
    type Future = Connecting;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _uri: http::Uri) -> Self::Future {
        let this = self.clone();
        Box::pin(async move {
            let tcp = TcpStream::connect(&this.target).await?;
            // The name is not checked (the certificate is); any valid one.
            let name = rustls_name(&this.target);
            let tls = this.tls.connect(name, tcp).await?;
            Ok(TokioIo::new(tls))
        })
    }
}

/// The server name sent by SNI: the target's host when it is a name or an
/// address, else `localhost`.
fn rustls_name(target: &str) -> tokio_rustls::rustls::pki_types::ServerName<'static> {
    let host = target
        .rsplit_once(':')
        .map_or(target, |(host, _)| host)
        .trim_start_matches('[')
        .trim_end_matches(']');
    tokio_rustls::rustls::pki_types::ServerName::try_from(host.to_owned()).unwrap_or_else(|_| {
        tokio_rustls::rustls::pki_types::ServerName::try_from("localhost").expect("a valid name")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_connection_is_said_once() {
        let io = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        #[derive(Debug, thiserror::Error)]
        #[error("transport error")]
        struct Outer(#[source] std::io::Error);
        assert_eq!(root_cause(&Outer(io)), "connection refused");
    }
}

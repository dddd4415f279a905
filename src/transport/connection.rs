//! One client connection: gRPC over HTTP/2 on the gRPC port (its calls go
//! through [`Admission`]; the answers of one batch leave in one write,
//! [`Coalesced`]), HTTP/1.1 or HTTP/2 on the HTTP/JSON port (its
//! requests go to the [`HttpHandler`] startup hands it). Either is closed
//! gracefully (GOAWAY or `Connection: close`, requests in flight finish) when
//! it has had no request for the idle timeout or when the server drains,
//! and an HTTP/2 one is dropped when its peer stops answering keepalive
//! pings.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::combinators::UnsyncBoxBody;
use hyper::body::Incoming;
use hyper::server::conn::http2;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;
use tracing::Instrument as _;

use super::ConnectionLimits;
use super::accept::{Protocol, read_preface, read_start, within};
use super::activity::{Activity, OpenCall};
use super::admission::Admission;
use super::body::{ByteBudget, Full};
use super::coalesce::Coalesced;
use crate::telemetry::cause_chain;
use crate::tls::Tls;

/// Resolves once the connection has had no open call for `timeout`.
async fn idle(activity: &Activity, timeout: Duration) {
    // While calls are open, look again every quarter of the timeout; once
    // none is, sleep until the timeout would run out and check again.
    let tick = (timeout / 4).max(Duration::from_millis(10));
    loop {
        match activity.idle_for() {
            Some(idle) if idle >= timeout => return,
            Some(idle) => tokio::time::sleep(timeout - idle).await,
            None => tokio::time::sleep(tick).await,
        }
    }
}

/// The HTTP/2 settings every gRPC connection is served with.
pub fn http2_builder(limits: &ConnectionLimits) -> http2::Builder<TokioExecutor> {
    let mut builder = http2::Builder::new(TokioExecutor::new());
    builder
        .timer(TokioTimer::new())
        .max_concurrent_streams(limits.max_concurrent_streams)
        .max_header_list_size(limits.max_header_list_bytes)
        .initial_stream_window_size(limits.window_bytes)
        .initial_connection_window_size(limits.window_bytes)
        .max_local_error_reset_streams(super::MAX_LOCAL_RESETS)
        .keep_alive_interval(limits.keepalive_interval)
        .keep_alive_timeout(limits.keepalive_timeout);
    builder
}

/// The gRPC port: HTTP/2 only, its preface read within the handshake time
/// limit, every call through admission.
#[derive(Clone)]
pub struct Grpc {
    /// The HTTP/2 settings each connection is served with.
    pub builder: http2::Builder<TokioExecutor>,
    /// The admission limits every call passes through, shared by all
    /// connections.
    pub admission: Arc<Admission>,
    /// A connection with no call open for this long is closed gracefully;
    /// `None`: never.
    pub idle_timeout: Option<Duration>,
}

impl Protocol for Grpc {
    fn tls_acceptor(tls: &Tls) -> TlsAcceptor {
        tls.acceptor()
    }

    async fn serve<IO>(
        self,
        io: IO,
        peer: SocketAddr,
        handshake_left: Duration,
        draining: watch::Receiver<bool>,
    ) where
        IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let Some(io) = within(handshake_left, peer, read_preface(io)).await else {
            return;
        };
        let activity = Activity::new();
        let admission = self.admission;
        let service = {
            let activity = Arc::clone(&activity);
            // Boxed: the connection holds each stream's task for as long as
            // the stream lasts, sized for the largest thing it holds, and
            // admission's future (288 bytes) is gone once the answer's
            // headers are: a call that waits keeps only its answer's body.
            hyper::service::service_fn(move |request: http::Request<Incoming>| {
                Box::pin(admission.call(request, activity.start()))
            })
        };
        let connection = self.builder.serve_connection(TokioIo::new(io), service);
        // A batch's answers on this connection leave in one write.
        Coalesced::new(
            drive(
                connection,
                |c| c.graceful_shutdown(),
                &activity,
                self.idle_timeout,
                draining,
            )
            .instrument(tracing::info_span!("connection", %peer)),
        )
        .await;
    }
}

/// The body of an HTTP/JSON answer: whole (a JSON document) or a stream of
/// Server-Sent Events.
pub type HttpBody = UnsyncBoxBody<Bytes, Infallible>;

/// The address an HTTP request came from, in its extensions (what the
/// console counts failed logins by).
#[derive(Debug, Clone, Copy)]
pub struct Peer(pub SocketAddr);

/// What answers the requests of the HTTP/JSON port; `call` keeps the
/// connection marked busy until it has been answered (a stream's body
/// holds it until the stream ends).
pub trait HttpHandler: Send + Sync + 'static {
    fn handle(
        &self,
        request: http::Request<Incoming>,
        call: OpenCall,
    ) -> Pin<Box<dyn Future<Output = http::Response<HttpBody>> + Send>>;

    /// The request body bytes one connection may hold at once, if bounded:
    /// each request then carries its connection's [`ConnectionShare`] in
    /// its extensions.
    fn connection_share_bytes(&self) -> Option<usize> {
        None
    }
}

/// The share of the in-flight byte budget that the requests of one HTTP/JSON
/// connection hold at most together, so that one peer (an HTTP/2 connection
/// of many streams) cannot fill the pool; found in each request's
/// extensions.
#[derive(Clone)]
pub struct ConnectionShare(pub Arc<ByteBudget>);

/// The settings every HTTP/JSON connection is served with: HTTP/2 as on the
/// gRPC port; HTTP/1.1 with keep-alive, its request head read within the
/// handshake time limit and held to the header list limit.
pub fn http_builder(limits: &ConnectionLimits) -> auto::Builder<TokioExecutor> {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.handshake_timeout)
        .keep_alive(true)
        .max_buf_size((limits.max_header_list_bytes as usize).max(8 * 1024));
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(limits.max_concurrent_streams)
        .max_header_list_size(limits.max_header_list_bytes)
        .initial_stream_window_size(limits.window_bytes)
        .initial_connection_window_size(limits.window_bytes)
        .max_local_error_reset_streams(super::MAX_LOCAL_RESETS)
        .keep_alive_interval(limits.keepalive_interval)
        .keep_alive_timeout(limits.keepalive_timeout);
    builder
}

/// The HTTP/JSON port: HTTP/1.1 or HTTP/2 (by ALPN under TLS, by the
/// preface in plaintext), every request to the handler.
#[derive(Clone)]
pub struct Http {
    /// The HTTP/1.1 and HTTP/2 settings each connection is served with.
    pub builder: Arc<auto::Builder<TokioExecutor>>,
    /// What answers every request on the port.
    pub handler: Arc<dyn HttpHandler>,
    /// A connection with no request open for this long is closed gracefully;
    /// `None`: never.
    pub idle_timeout: Option<Duration>,
}

impl Protocol for Http {
    fn tls_acceptor(tls: &Tls) -> TlsAcceptor {
        tls.http_acceptor()
    }

    async fn serve<IO>(
        self,
        io: IO,
        peer: SocketAddr,
        handshake_left: Duration,
        draining: watch::Receiver<bool>,
    ) where
        IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        // The start (HTTP/2's whole preface, or HTTP/1.1's first bytes)
        // within the handshake limit; HTTP/1.1's header read timeout bounds
        // the rest of each request head.
        let Some(io) = within(handshake_left, peer, read_start(io)).await else {
            return;
        };
        let activity = Activity::new();
        let handler = self.handler;
        let share = handler
            .connection_share_bytes()
            .map(|bytes| ConnectionShare(ByteBudget::share(bytes, Full::Connection)));
        let service = {
            let activity = Arc::clone(&activity);
            hyper::service::service_fn(move |mut request: http::Request<Incoming>| {
                if let Some(share) = &share {
                    request.extensions_mut().insert(share.clone());
                }
                request.extensions_mut().insert(Peer(peer));
                let answer = handler.handle(request, activity.start());
                async move { Ok::<_, Infallible>(answer.await) }
            })
        };
        let connection = self.builder.serve_connection(TokioIo::new(io), service);
        drive(
            connection,
            |c| c.graceful_shutdown(),
            &activity,
            self.idle_timeout,
            draining,
        )
        .instrument(tracing::info_span!("http_connection", %peer))
        .await;
    }
}

/// Runs `connection` until it ends, asking it to close gracefully once it
/// has been idle for `idle_timeout` or when `drain` turns true.
async fn drive<C, E>(
    connection: C,
    graceful: fn(Pin<&mut C>),
    activity: &Activity,
    idle_timeout: Option<Duration>,
    mut drain: watch::Receiver<bool>,
) where
    C: Future<Output = Result<(), E>>,
    E: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    tokio::pin!(connection);
    let mut closing = false;
    loop {
        tokio::select! {
            served = &mut connection => {
                if let Err(e) = served {
                    let e: Box<dyn std::error::Error + Send + Sync> = e.into();
                    let error = super::printable(&cause_chain(e.as_ref())).into_owned();
                    tracing::debug!(%error, "connection closed with an error");
                }
                return;
            }
            () = async {
                match idle_timeout {
                    Some(timeout) => idle(activity, timeout).await,
                    None => std::future::pending().await,
                }
            }, if !closing => {
                tracing::debug!("closing an idle connection");
                graceful(connection.as_mut());
                closing = true;
            }
            _ = drain.wait_for(|draining| *draining), if !closing => {
                graceful(connection.as_mut());
                closing = true;
            }
        }
    }
}

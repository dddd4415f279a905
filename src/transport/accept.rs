//! The one accept loop, for plaintext and TLS alike: at most
//! `max_connections` connections at once (past that, new ones wait in the
//! listen queue), a back-off when `accept` fails (out of file descriptors,
//! say) instead of a spin, and a handshake time limit, so that a connection
//! that sends nothing holds its descriptor for a few seconds at most.
//!
//! What is served on an accepted connection is a [`Protocol`]: gRPC over
//! HTTP/2 on the gRPC port, HTTP/1.1 and HTTP/2 on the HTTP/JSON port.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use tokio::sync::{Semaphore, watch};

use tokio_rustls::TlsAcceptor;

use super::ConnectionLimits;
use crate::tls::Tls;

/// What one port serves on each connection it accepts, once the TLS
/// handshake (if any) is done.
pub trait Protocol: Clone + Send + 'static {
    /// The TLS acceptor of this port (it says what ALPN offers).
    fn tls_acceptor(tls: &Tls) -> TlsAcceptor;

    /// Serves `io` until the peer goes, the connection idles out, or
    /// `draining` turns true and its calls have finished. Whatever the
    /// protocol's own handshake reads must arrive within `handshake_left`.
    fn serve<IO>(
        self,
        io: IO,
        peer: SocketAddr,
        handshake_left: Duration,
        draining: watch::Receiver<bool>,
    ) -> impl Future<Output = ()> + Send
    where
        IO: AsyncRead + AsyncWrite + Unpin + Send + 'static;
}

/// The first bytes of every HTTP/2 connection (RFC 9113, 3.4).
const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// The first pause after `accept` fails; it doubles up to
/// [`MAX_ACCEPT_BACKOFF`] while failures go on.
const FIRST_ACCEPT_BACKOFF: Duration = Duration::from_millis(5);
const MAX_ACCEPT_BACKOFF: Duration = Duration::from_secs(1);

/// Raises this process's soft limit on open files to its hard limit, and
/// returns the limit in force (`None` where it cannot be read).
pub fn raise_open_file_limit() -> Option<u64> {
    let (soft, hard) = rlimit::Resource::NOFILE.get().ok()?;
    if soft >= hard {
        tracing::info!(limit = soft, "open file limit");
        return Some(soft);
    }
    match rlimit::Resource::NOFILE.set(hard, hard) {
        Ok(()) => {
            tracing::info!(limit = hard, raised_from = soft, "open file limit raised");
            Some(hard)
        }
        Err(e) => {
            tracing::warn!(limit = soft, hard, error = %e, "cannot raise the open file limit");
            Some(soft)
        }
    }
}

/// Errors of one connection that say nothing about the listener.
fn is_connection_error(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
    )
}

/// A listening socket the accept loop takes connections from: TCP, or a
/// Unix socket (for a client in the same pod or host).
pub trait Listen: Send + 'static {
    /// One accepted connection.
    type Io: AsyncRead + AsyncWrite + Unpin + Send + 'static;

    /// The next connection and where it came from.
    fn accept_one(&self) -> impl Future<Output = io::Result<(Self::Io, SocketAddr)>> + Send;

    /// Sets the connection's socket options.
    fn configure(io: &Self::Io, limits: &ConnectionLimits);
}

impl Listen for TcpListener {
    type Io = TcpStream;

    fn accept_one(&self) -> impl Future<Output = io::Result<(TcpStream, SocketAddr)>> + Send {
        self.accept()
    }

    fn configure(io: &TcpStream, limits: &ConnectionLimits) {
        configure(io, limits);
    }
}

/// What a Unix socket's peer is logged as: it has no address.
const UNIX_PEER: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED), 0);

impl Listen for UnixListener {
    type Io = UnixStream;

    async fn accept_one(&self) -> io::Result<(UnixStream, SocketAddr)> {
        let (io, _) = self.accept().await?;
        Ok((io, UNIX_PEER))
    }

    fn configure(_: &UnixStream, _: &ConnectionLimits) {}
}

/// Accepts connections until `shutdown` resolves, then stops accepting,
/// closes every connection gracefully, and returns once their calls have
/// finished.
pub async fn serve<L: Listen, P: Protocol>(
    listener: L,
    tls: Option<Arc<Tls>>,
    protocol: P,
    limits: ConnectionLimits,
    shutdown: impl Future<Output = ()>,
) {
    let (drain, draining) = watch::channel(false);
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let mut backoff = FIRST_ACCEPT_BACKOFF;
    tokio::pin!(shutdown);
    loop {
        let slot = tokio::select! {
            () = &mut shutdown => break,
            slot = Arc::clone(&slots).acquire_owned() => slot.expect("the slots are never closed"),
        };
        let accepted = tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept_one() => accepted,
        };
        let (tcp, peer) = match accepted {
            Ok(accepted) => {
                backoff = FIRST_ACCEPT_BACKOFF;
                accepted
            }
            Err(e) if is_connection_error(&e) => continue,
            Err(e) => {
                tracing::warn!(error = %e, pause = ?backoff, "cannot accept a connection");
                tokio::select! {
                    () = &mut shutdown => break,
                    () = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(MAX_ACCEPT_BACKOFF);
                continue;
            }
        };
        L::configure(&tcp, &limits);
        let protocol = protocol.clone();
        let draining = draining.clone();
        let handshake = limits.handshake_timeout;
        // One task type per kind of connection: a plaintext connection's task
        // does not carry the room a TLS session takes.
        match &tls {
            None => tokio::spawn(async move {
                let _slot = slot;
                protocol.serve(tcp, peer, handshake, draining).await;
            }),
            Some(tls) => {
                let acceptor = P::tls_acceptor(tls);
                tokio::spawn(async move {
                    let _slot = slot;
                    let started = tokio::time::Instant::now();
                    if let Some(io) = within(handshake, peer, acceptor.accept(tcp)).await {
                        let left = handshake.saturating_sub(started.elapsed());
                        protocol.serve(io, peer, left, draining).await;
                    }
                })
            }
        };
    }
    drop(listener);
    let _ = drain.send(true);
    drop(draining);
    drain.closed().await;
}

/// Runs a handshake within `limit`; a failed or late one closes the
/// connection.
pub(super) async fn within<T>(
    limit: Duration,
    peer: SocketAddr,
    handshake: impl Future<Output = io::Result<T>>,
) -> Option<T> {
    match tokio::time::timeout(limit, handshake).await {
        Ok(Ok(io)) => Some(io),
        Ok(Err(e)) => {
            tracing::debug!(%peer, error = %e, "handshake failed");
            None
        }
        Err(_) => {
            tracing::debug!(%peer, "no handshake within the time limit");
            None
        }
    }
}

fn configure(tcp: &TcpStream, limits: &ConnectionLimits) {
    let _ = tcp.set_nodelay(true);
    if let Some(idle) = limits.tcp_keepalive {
        let keepalive = socket2::TcpKeepalive::new()
            .with_time(idle)
            .with_interval(idle.min(Duration::from_secs(10)))
            .with_retries(3);
        if let Err(e) = socket2::SockRef::from(tcp).set_tcp_keepalive(&keepalive) {
            tracing::debug!(error = %e, "cannot set TCP keepalive");
        }
    }
}

/// Reads the HTTP/2 preface, so that a client that connects and sends
/// nothing (or not HTTP/2) is closed at the handshake time limit; the
/// preface is then replayed to the HTTP/2 server.
pub(super) async fn read_preface<IO: AsyncRead + Unpin>(mut io: IO) -> io::Result<Prefaced<IO>> {
    let mut preface = [0u8; PREFACE.len()];
    io.read_exact(&mut preface).await?;
    if &preface != PREFACE {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "not an HTTP/2 connection preface",
        ));
    }
    Ok(Prefaced {
        io,
        head: preface,
        len: PREFACE.len(),
        replayed: 0,
    })
}

/// Reads the start of an HTTP/1.1 or HTTP/2 connection: the whole HTTP/2
/// preface, or bytes up to the first that departs from it (an HTTP/1.1
/// request line), so that a client that connects and sends nothing, or a
/// part of the preface, is closed at the handshake time limit (HTTP/1.1's
/// header read timeout then bounds the rest of the request head). What was
/// read is replayed to the server.
pub(super) async fn read_start<IO: AsyncRead + Unpin>(mut io: IO) -> io::Result<Prefaced<IO>> {
    let mut head = [0u8; PREFACE.len()];
    let mut len = 0;
    while len < PREFACE.len() && head[..len] == PREFACE[..len] {
        let n = io.read(&mut head[len..]).await?;
        if n == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        len += n;
    }
    Ok(Prefaced {
        io,
        head,
        len,
        replayed: 0,
    })
}

/// A connection whose first bytes have been read, and are read again.
pub struct Prefaced<IO> {
    io: IO,
    head: [u8; PREFACE.len()],
    /// Bytes of `head` read.
    len: usize,
    replayed: usize,
}

impl<IO: AsyncRead + Unpin> AsyncRead for Prefaced<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.replayed < this.len {
            let rest = &this.head[this.replayed..this.len];
            let n = rest.len().min(buf.remaining());
            buf.put_slice(&rest[..n]);
            this.replayed += n;
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.io).poll_read(cx, buf)
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Prefaced<IO> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt as _;

    #[tokio::test]
    async fn the_preface_is_read_then_replayed_before_the_rest() {
        let (mut client, server) = tokio::io::duplex(64);
        client.write_all(PREFACE).await.unwrap();
        client.write_all(b"rest").await.unwrap();
        drop(client);
        let mut io = read_preface(server).await.unwrap();
        let mut all = Vec::new();
        io.read_to_end(&mut all).await.unwrap();
        assert_eq!(&all[..24], PREFACE);
        assert_eq!(&all[24..], b"rest");
    }

    #[tokio::test]
    async fn the_start_of_either_http_version_is_read_then_replayed() {
        for sent in [
            &PREFACE[..],
            b"GET /health HTTP/1.1\r\n\r\n",
            b"PRI * HTTP/1.1\r\n",
        ] {
            let (mut client, server) = tokio::io::duplex(64);
            client.write_all(sent).await.unwrap();
            client.write_all(b"rest").await.unwrap();
            drop(client);
            let mut io = read_start(server).await.unwrap();
            let mut all = Vec::new();
            io.read_to_end(&mut all).await.unwrap();
            assert_eq!(&all[..sent.len()], sent);
            assert_eq!(&all[sent.len()..], b"rest");
        }
    }

    #[tokio::test]
    async fn a_part_of_the_preface_is_not_a_start() {
        let (mut client, server) = tokio::io::duplex(64);
        client.write_all(&PREFACE[..10]).await.unwrap();
        let started = tokio::time::timeout(Duration::from_millis(50), read_start(server)).await;
        assert!(
            started.is_err(),
            "still waiting for the rest of the preface"
        );
        drop(client);
    }

    #[tokio::test]
    async fn anything_but_http2_is_refused() {
        let (mut client, server) = tokio::io::duplex(64);
        client
            .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        assert!(read_preface(server).await.is_err());
    }
}

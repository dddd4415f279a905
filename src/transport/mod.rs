//! The network edge, where no caller is trusted yet: accepting connections
//! (`accept`), serving each over HTTP/2 with keepalive and an idle timeout
//! (`connection`; a gRPC connection writes the answers of one batch
//! together: `coalesce`), and admitting each call on its headers before any
//! of its body is read (`admission`), its bytes held to a server-wide budget
//! and a time limit while they arrive (`body`). The HTTP/JSON port shares
//! the accept loop and the limits, and reaches the Coordinator through the
//! same admission.
//!
//! Everything a client can make the server hold is bounded here; README,
//! "Limits", adds the bounds up.

mod accept;
mod activity;
mod admission;
mod body;
mod coalesce;
mod connection;
mod later;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, UnixListener};

use crate::tls::Tls;

pub use accept::raise_open_file_limit;
pub use activity::OpenCall;
pub use admission::{
    Admission, CALL_OVERHEAD_BYTES, CallDeadline, FromHttpPort, OPEN_SERVICES_BUDGET_BYTES,
    SMALL_MESSAGE_BYTES, TENANT_SHARE_DIVISOR, refused,
};
pub use body::{ByteBudget, Full, Reservation};
pub use connection::{ConnectionShare, HttpBody, HttpHandler, Peer};
pub use later::{AnswerLater, answer_later};

/// `text` with every character that could forge or disturb a log line
/// escaped (`\n`, `\r`, ESC as `\u{1b}`, the other control characters,
/// Unicode line and paragraph separators and bidirectional overrides):
/// for every string a client controls that goes into a log line.
pub fn printable(text: &str) -> std::borrow::Cow<'_, str> {
    fn risky(c: char) -> bool {
        c.is_control()
            || matches!(c, '\u{2028}' | '\u{2029}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
    }
    if !text.chars().any(risky) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut escaped = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if risky(c) {
            escaped.extend(c.escape_default());
        } else {
            escaped.push(c);
        }
    }
    std::borrow::Cow::Owned(escaped)
}

/// The HTTP/2 header list a call may send, in bytes (as HTTP/2 counts it).
pub const MAX_HEADER_LIST_BYTES: u32 = 16 * 1024;
/// The HTTP/2 flow-control window of each stream and of each connection:
/// what a client may send before the server has read it.
pub const WINDOW_BYTES: u32 = 1024 * 1024;
/// The streams an HTTP/2 connection may make the server reset on its own
/// over its life before the server closes it (ENHANCE_YOUR_CALM). A call
/// refused before its body was read is reset, and the body's bytes
/// already sent (up to a window) arrive after it; once more than 50 such
/// streams were reset within 30 s, the HTTP/2 library has forgotten the
/// oldest, and each late frame for one counts here too. At the library's
/// 1,024, a client retrying 800 refused 1 MB Completes over 8 connections
/// lost every connection in 10 s, with the calls in flight on them; 64
/// times as many still bounds what a peer can make the server do for free.
pub const MAX_LOCAL_RESETS: usize = 64 * 1024;

/// How connections are accepted and kept.
#[derive(Debug, Clone, Copy)]
pub struct ConnectionLimits {
    /// Connections served at once; more wait in the listen queue.
    pub max_connections: usize,
    /// Calls (HTTP/2 streams) open at once on one connection.
    pub max_concurrent_streams: u32,
    /// The longest the TLS handshake and the HTTP/2 preface may take.
    pub handshake_timeout: Duration,
    /// A connection with no call open for this long is closed; `None`: never.
    pub idle_timeout: Option<Duration>,
    /// How long a connection may be silent before the server pings it;
    /// `None`: no pings.
    pub keepalive_interval: Option<Duration>,
    /// How long a ping may go unanswered before the connection is dropped.
    pub keepalive_timeout: Duration,
    /// TCP keepalive probes after this much silence; `None`: off.
    pub tcp_keepalive: Option<Duration>,
    /// The largest header list a request may send, in bytes as HTTP/2 counts
    /// it; on HTTP/1.1 it sizes the read buffer (at least 8 KiB).
    pub max_header_list_bytes: u32,
    /// The HTTP/2 flow-control window of each stream and each connection, in
    /// bytes.
    pub window_bytes: u32,
}

/// Serves gRPC on `listener` until `shutdown` resolves, then closes every
/// connection gracefully and returns once their calls have finished.
pub async fn serve(
    listener: TcpListener,
    tls: Option<Arc<Tls>>,
    admission: Arc<Admission>,
    limits: ConnectionLimits,
    shutdown: impl Future<Output = ()>,
) {
    let grpc = connection::Grpc {
        builder: connection::http2_builder(&limits),
        admission,
        idle_timeout: limits.idle_timeout,
    };
    accept::serve(listener, tls, grpc, limits, shutdown).await;
}

/// Serves gRPC in plaintext on the Unix socket `listener` (a client in
/// the same pod or host: no TCP on either side), with the same admission
/// and limits as the gRPC port; stops as [`serve`] does.
pub async fn serve_unix(
    listener: UnixListener,
    admission: Arc<Admission>,
    limits: ConnectionLimits,
    shutdown: impl Future<Output = ()>,
) {
    let grpc = connection::Grpc {
        builder: connection::http2_builder(&limits),
        admission,
        idle_timeout: limits.idle_timeout,
    };
    accept::serve(listener, None, grpc, limits, shutdown).await;
}

/// Serves HTTP/1.1 and HTTP/2 on `listener` with the same limits as the
/// gRPC port (a connection cap of the same size, of its own), every request
/// answered by `handler`; stops as [`serve`] does.
pub async fn serve_http(
    listener: TcpListener,
    tls: Option<Arc<Tls>>,
    handler: Arc<dyn HttpHandler>,
    limits: ConnectionLimits,
    shutdown: impl Future<Output = ()>,
) {
    let http = connection::Http {
        builder: Arc::new(connection::http_builder(&limits)),
        handler,
        idle_timeout: limits.idle_timeout,
    };
    accept::serve(listener, tls, http, limits, shutdown).await;
}

#[cfg(test)]
mod tests {
    use super::printable;

    #[test]
    fn printable_escapes_what_could_forge_or_colour_a_log_line() {
        assert_eq!(
            printable("plain text, \"quoted\""),
            "plain text, \"quoted\""
        );
        assert_eq!(
            printable("a\nINJECTED fake\r\u{1b}[31mred\u{2028}\u{202e}x"),
            "a\\nINJECTED fake\\r\\u{1b}[31mred\\u{2028}\\u{202e}x"
        );
        assert!(!printable("\u{0}\u{7f}\t").chars().any(char::is_control));
    }
}

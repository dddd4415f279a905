//! The network edge, where no caller is trusted yet: accepting connections
//! (`accept`), serving each over HTTP/2 with keepalive and an idle timeout
//! (`connection`), and admitting each call on its headers before any of its
//! body is read (`admission`), its bytes held to a server-wide budget and a
//! time limit while they arrive (`body`).
//!
//! Everything a client can make the server hold is bounded here; README,
//! "Limits", adds the bounds up.

mod accept;
mod activity;
mod admission;
mod body;
mod connection;

use std::time::Duration;

pub use accept::{raise_open_file_limit, serve};
pub use admission::{
    Admission, CALL_OVERHEAD_BYTES, CallDeadline, OPEN_SERVICES_BUDGET_BYTES, SMALL_MESSAGE_BYTES,
};

/// The HTTP/2 header list a call may send, in bytes (as HTTP/2 counts it).
pub const MAX_HEADER_LIST_BYTES: u32 = 16 * 1024;
/// The HTTP/2 flow-control window of each stream and of each connection:
/// what a client may send before the server has read it.
pub const WINDOW_BYTES: u32 = 1024 * 1024;

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
    pub max_header_list_bytes: u32,
    pub window_bytes: u32,
}

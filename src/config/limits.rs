//! What one server holds at once: waiters, request bytes and time,
//! connections and how long they are kept.

use std::time::Duration;

use clap::Args;
use clap::builder::TypedValueParser;

use super::{hd, nonzero};
use crate::domain::WaiterLimits;
use crate::transport::{ConnectionLimits, MAX_HEADER_LIST_BYTES, WINDOW_BYTES};

/// Calls that may wait at once on one server, and per tenant.
pub const DEFAULT_WAITER_LIMITS: WaiterLimits = WaiterLimits {
    total: 50_000,
    per_tenant: 10_000,
};
/// Concurrent HTTP/2 streams (calls) one client connection may open.
pub const DEFAULT_MAX_STREAMS: u32 = 1000;
/// The largest request the server decodes.
pub const DEFAULT_MAX_REQUEST_BYTES: usize = 4 * 1024 * 1024;
/// Bytes of Coordinator calls the server holds at once, in MiB: each
/// call's request from its arrival until its answer has been sent, then its
/// answer instead.
pub const DEFAULT_MAX_INFLIGHT_REQUEST_MIB: usize = 64;
/// How long a request's body may take to arrive.
pub const DEFAULT_REQUEST_BODY_TIMEOUT: Duration = Duration::from_secs(10);
/// Client connections served at once.
pub const DEFAULT_MAX_CONNECTIONS: usize = 4096;
/// How long a new connection may take to send its TLS handshake and HTTP/2
/// preface.
pub const DEFAULT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a connection with no call open is kept.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(300);
/// Silence on a connection after which the server pings it.
pub const DEFAULT_HTTP2_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(60);
/// How long a ping may go unanswered before the connection is dropped.
pub const DEFAULT_HTTP2_KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(20);
/// Silence after which TCP keepalive probes start.
pub const DEFAULT_TCP_KEEPALIVE: Duration = Duration::from_secs(60);

/// Waiters, requests and connections one server holds at once.
#[derive(Debug, Clone, Args)]
pub struct LimitsArgs {
    /// Calls (Acquire with wait, Watch) that may wait at once on this server;
    /// beyond it calls get RESOURCE_EXHAUSTED.
    #[arg(long, env = "IDEMPOTENCY_MAX_WAITERS", default_value_t = DEFAULT_WAITER_LIMITS.total)]
    pub max_waiters: usize,

    /// Calls of one tenant that may wait at once on this server.
    #[arg(long, env = "IDEMPOTENCY_MAX_WAITERS_PER_TENANT", default_value_t = DEFAULT_WAITER_LIMITS.per_tenant)]
    pub max_waiters_per_tenant: usize,

    /// Concurrent calls (HTTP/2 streams) one client connection may have open.
    #[arg(long, env = "IDEMPOTENCY_MAX_CONCURRENT_STREAMS", default_value_t = DEFAULT_MAX_STREAMS)]
    pub max_concurrent_streams: u32,

    /// The largest request message the server accepts, in bytes (at least the
    /// result limit plus 64 KiB).
    #[arg(long, env = "IDEMPOTENCY_MAX_REQUEST_BYTES", default_value_t = DEFAULT_MAX_REQUEST_BYTES)]
    pub max_request_bytes: usize,

    /// Bytes, in MiB, of Coordinator calls the server holds at once (with a
    /// share per call for its headers and state), on both ports together:
    /// each call's request from its arrival until its answer has been sent
    /// (decoded, and waiting for the database), then its answer's bytes
    /// instead until the client has taken them; past it calls get
    /// RESOURCE_EXHAUSTED (HTTP 429) at once. With --auth-tokens one tenant holds at most half of
    /// it, and one HTTP/JSON connection at most two of the largest bodies
    /// (4 × --max-request-bytes). Health and reflection calls have 8 MiB
    /// of their own.
    #[arg(long, env = "IDEMPOTENCY_MAX_INFLIGHT_REQUEST_MIB", default_value_t = DEFAULT_MAX_INFLIGHT_REQUEST_MIB,
          value_parser = TypedValueParser::map(clap::value_parser!(u32).range(1..=65536), |v| v as usize))]
    pub max_inflight_request_mib: usize,

    /// How long a request's body may take to arrive after its headers
    /// (DEADLINE_EXCEEDED after that, and the call does not run).
    #[arg(long, env = "IDEMPOTENCY_REQUEST_BODY_TIMEOUT", default_value_t = hd(DEFAULT_REQUEST_BODY_TIMEOUT))]
    pub request_body_timeout: humantime::Duration,

    /// Client connections served at once (lowered to fit the open file
    /// limit); more wait in the listen queue.
    #[arg(long, env = "IDEMPOTENCY_MAX_CONNECTIONS", default_value_t = DEFAULT_MAX_CONNECTIONS)]
    pub max_connections: usize,

    /// How long a new connection may take to complete its TLS handshake and
    /// send the HTTP/2 preface before it is closed.
    #[arg(long, env = "IDEMPOTENCY_HANDSHAKE_TIMEOUT", default_value_t = hd(DEFAULT_HANDSHAKE_TIMEOUT))]
    pub handshake_timeout: humantime::Duration,

    /// Close a connection that has had no call open for this long (GOAWAY;
    /// clients reconnect on their next call); 0 keeps idle connections.
    #[arg(long, env = "IDEMPOTENCY_IDLE_TIMEOUT", default_value_t = hd(DEFAULT_IDLE_TIMEOUT))]
    pub idle_timeout: humantime::Duration,

    /// Ping a connection that has been silent this long, and drop it if the
    /// ping is not answered within --http2-keepalive-timeout; 0: no pings.
    #[arg(long, env = "IDEMPOTENCY_HTTP2_KEEPALIVE_INTERVAL", default_value_t = hd(DEFAULT_HTTP2_KEEPALIVE_INTERVAL))]
    pub http2_keepalive_interval: humantime::Duration,

    /// How long a keepalive ping may go unanswered.
    #[arg(long, env = "IDEMPOTENCY_HTTP2_KEEPALIVE_TIMEOUT", default_value_t = hd(DEFAULT_HTTP2_KEEPALIVE_TIMEOUT))]
    pub http2_keepalive_timeout: humantime::Duration,

    /// TCP keepalive probes after this much silence on a connection (the
    /// kernel drops it after three unanswered probes); 0: off.
    #[arg(long, env = "IDEMPOTENCY_TCP_KEEPALIVE", default_value_t = hd(DEFAULT_TCP_KEEPALIVE))]
    pub tcp_keepalive: humantime::Duration,
}

impl LimitsArgs {
    /// How many calls may wait at once.
    pub(super) fn waiter_limits(&self) -> WaiterLimits {
        WaiterLimits {
            total: self.max_waiters,
            per_tenant: self.max_waiters_per_tenant,
        }
    }

    /// Accepting and keeping connections.
    pub(super) fn connections(&self) -> ConnectionLimits {
        ConnectionLimits {
            max_connections: self.max_connections,
            max_concurrent_streams: self.max_concurrent_streams,
            handshake_timeout: self.handshake_timeout.into(),
            idle_timeout: nonzero(self.idle_timeout.into()),
            keepalive_interval: nonzero(self.http2_keepalive_interval.into()),
            keepalive_timeout: self.http2_keepalive_timeout.into(),
            tcp_keepalive: nonzero(self.tcp_keepalive.into()),
            max_header_list_bytes: MAX_HEADER_LIST_BYTES,
            window_bytes: WINDOW_BYTES,
        }
    }
}

/// Accepting and keeping connections, by default.
pub(super) fn default_connections() -> ConnectionLimits {
    ConnectionLimits {
        max_connections: DEFAULT_MAX_CONNECTIONS,
        max_concurrent_streams: DEFAULT_MAX_STREAMS,
        handshake_timeout: DEFAULT_HANDSHAKE_TIMEOUT,
        idle_timeout: Some(DEFAULT_IDLE_TIMEOUT),
        keepalive_interval: Some(DEFAULT_HTTP2_KEEPALIVE_INTERVAL),
        keepalive_timeout: DEFAULT_HTTP2_KEEPALIVE_TIMEOUT,
        tcp_keepalive: Some(DEFAULT_TCP_KEEPALIVE),
        max_header_list_bytes: MAX_HEADER_LIST_BYTES,
        window_bytes: WINDOW_BYTES,
    }
}

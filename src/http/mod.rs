//! The HTTP/JSON door (`--http-listen`): the Coordinator for callers that
//! cannot speak gRPC, on the same state, tenants, credentials, limits and
//! TLS as the gRPC port.
//!
//! - [`workflow`]: the workflow API (`POST /acquire`, `POST /complete`,
//!   `GET /health`), request and response shapes as low-code tools such as
//!   n8n send and read them;
//! - [`connect`]: every unary RPC in the Connect protocol's shape
//!   (`POST /idempotency.v1.Coordinator/Acquire`, canonical proto3 JSON);
//! - `connect_stream`: the streaming methods (Watch, WatchDue) in the
//!   Connect protocol's streaming shape (`application/connect+json`,
//!   `application/connect+proto`);
//! - [`events`]: the streaming methods as Server-Sent Events;
//! - [`json`]: canonical JSON by reflection over the embedded descriptors;
//! - `inprocess`: how the door makes a Coordinator call;
//! - `refusal`: why the door refused a request ([`DoorError`]), as a status,
//!   a JSON body, a log line and a metric;
//! - `hosts`: the `Host` names answered (against DNS rebinding).
//!
//! Every Coordinator call the door makes goes through the gRPC port's
//! [`Admission`] in process (the caller's `authorization` passed through):
//! credentials, tenants, byte budgets, deadlines, metrics, traces and the
//! database gate apply exactly as to gRPC callers. A unary call enters by
//! admission's typed entry, the request a typed message handed to the
//! service's own method (no protobuf framed, encoded or decoded on the
//! way); a streaming one as an in-process gRPC request. The one read the
//! workflow API makes for itself (a token-less `/complete` needs the
//! current lease token) is such a call too: a Get that asks, in the
//! request's extensions no network caller can set, for the token. Before
//! a byte of a body is read, the door checks the headers: HTTP/1.1 framing
//! as RFC 9112 has it, no browser's cross-site request, the caller's
//! credentials, the content type. The body is then held to twice
//! `--max-request-bytes` (base64 grows bytes by 4/3), `--request-body-timeout`
//! and [`MAX_JSON_VALUES`] (counted as it arrives), and charged to
//! admission's byte budget (and the tenant's and the connection's shares)
//! by the bytes that have arrived, until it has become protobuf; large
//! bodies are parsed on the blocking pool.

pub mod connect;
mod connect_stream;
mod console;
mod discard;
pub mod events;
mod hosts;
mod inprocess;
pub mod json;
mod refusal;
pub mod workflow;

use inprocess::{Asks, failed};
pub use refusal::{DoorError, http_status};
use refusal::{json_response, log_refusal, violations};

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Method, Request, Response, Version, header};
use http_body_util::BodyExt as _;
use hyper::body::Incoming;
use tokio::sync::Semaphore;
use tonic_health::server::HealthService;

use crate::auth::{Authenticator, Caller};
use crate::domain::JsonValues;
use crate::service::CoordinatorService;
use crate::telemetry::cause_chain;
use crate::transport::{
    Admission, ConnectionShare, HttpBody, HttpHandler, OpenCall, Reservation, printable,
};
use json::Schema;

/// The most JSON values (objects, arrays and scalars) a request body may
/// hold; counted before the body is parsed, so that a body of many small
/// values (`[0,0,0,…]`) is refused without building them. The contract's
/// largest request has a few dozen (payloads travel as strings or bytes).
pub const MAX_JSON_VALUES: usize = 1_000;

/// Bodies longer than this are parsed on the blocking pool, two at a time,
/// never on the workers that answer calls.
pub const INLINE_JSON_BYTES: usize = 16 * 1024;

/// Large bodies parsed at once, at most; more wait their turn without
/// holding a thread.
static JSON_WORK: Semaphore = Semaphore::const_new(2);

/// The request bodies one HTTP/JSON connection may hold at once, in bodies
/// of the largest size: a connection of many HTTP/2 streams cannot take
/// more of the budget than this.
pub const CONNECTION_SHARE_BODIES: usize = 2;

/// A request body read whole, its bytes still charged to the budget.
struct HeldBody {
    bytes: Bytes,
    /// Given back when the body has become protobuf and is dropped.
    _held: Reservation,
}

impl std::ops::Deref for HeldBody {
    type Target = Bytes;
    fn deref(&self) -> &Bytes {
        &self.bytes
    }
}

/// What a body is, for how it is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Media {
    /// JSON: its values are counted as it arrives.
    Json,
    /// Protobuf: bytes only.
    Proto,
}

/// Parses a JSON body (its values counted as it arrived: see
/// [`Door::read_body`]) with `parse`; a body over [`INLINE_JSON_BYTES`] on
/// the blocking pool, at most [`JSON_WORK`] at a time. The body stays
/// charged to the budget meanwhile.
async fn parse_json<T, F>(body: &HeldBody, parse: F) -> Result<T, DoorError>
where
    T: Send + 'static,
    F: FnOnce(&[u8]) -> Result<T, DoorError> + Send + 'static,
{
    if body.len() <= INLINE_JSON_BYTES {
        return parse(&body.bytes);
    }
    let _turn = JSON_WORK.acquire().await.expect("never closed");
    let text = body.bytes.clone();
    tokio::task::spawn_blocking(move || parse(&text))
        .await
        .unwrap_or_else(|_| Err(DoorError::Syntax("the body could not be parsed".into())))
}

/// What RFC 9112 requires of an HTTP/1.1 request that hyper lets through:
/// exactly one `Host` header (section 3.2), and no transfer coding but
/// `chunked` (section 6.1: hyper refuses a list that does not end in
/// `chunked`, and would hand `gzip, chunked` on still gzipped).
fn well_formed<B>(request: &Request<B>) -> Result<(), DoorError> {
    if request.version() != Version::HTTP_11 {
        return Ok(());
    }
    if request.headers().get_all(header::HOST).iter().count() != 1 {
        return Err(DoorError::Malformed(
            "an HTTP/1.1 request carries exactly one Host header",
        ));
    }
    let mut codings = request
        .headers()
        .get_all(header::TRANSFER_ENCODING)
        .iter()
        .flat_map(|v| v.as_bytes().split(|b| *b == b','))
        .map(<[u8]>::trim_ascii)
        .filter(|c| !c.is_empty());
    match (codings.next(), codings.next()) {
        (None, _) => Ok(()),
        (Some(only), None) if only.eq_ignore_ascii_case(b"chunked") => Ok(()),
        _ => Err(DoorError::TransferCoding),
    }
}

/// What the door needs, shared by every connection of the HTTP port.
pub struct Door {
    /// The gRPC port's admission, which every Coordinator call goes through.
    admission: Arc<Admission>,
    /// The Coordinator, whose methods admission's typed entry calls.
    coordinator: CoordinatorService,
    /// The health service, which `/health` asks.
    health: HealthService,
    /// Who the caller is, read from the headers before the body.
    auth: Arc<Authenticator>,
    /// Canonical JSON of the contract's messages.
    schema: Schema,
    /// The largest JSON body read.
    max_body_bytes: usize,
    /// The longest a body may take to arrive.
    body_timeout: Duration,
    /// The operator console's sessions and failed logins, when it is
    /// served at `/console/` (`--console`).
    console: Option<console::Console>,
    /// The port serves TLS: the console's cookies are `Secure` and its
    /// answers carry HSTS.
    tls: bool,
    /// The `Host` names answered besides addresses and localhost.
    hosts: hosts::AllowedHosts,
}

/// How the door guards browsers: TLS, and the host names it answers to.
#[derive(Debug, Clone, Default)]
pub struct DoorSecurity {
    /// The HTTP port serves TLS (`--tls-cert`).
    pub tls: bool,
    /// `--http-allowed-hosts`.
    pub allowed_hosts: Vec<String>,
}

/// What the door calls: admission, and behind it the services its typed
/// entry runs.
pub struct DoorServices {
    pub admission: Arc<Admission>,
    pub coordinator: CoordinatorService,
    pub health: HealthService,
}

impl Door {
    pub fn new(
        services: DoorServices,
        auth: Arc<Authenticator>,
        max_request_bytes: usize,
        body_timeout: Duration,
        console: bool,
        security: DoorSecurity,
    ) -> Result<Arc<Self>, prost_reflect::DescriptorError> {
        Ok(Arc::new(Door {
            admission: services.admission,
            coordinator: services.coordinator,
            health: services.health,
            auth,
            schema: Schema::load()?,
            max_body_bytes: max_request_bytes.saturating_mul(2),
            body_timeout,
            console: console.then(console::Console::default),
            tls: security.tls,
            hosts: hosts::AllowedHosts::new(&security.allowed_hosts),
        }))
    }
}

/// The door as the HTTP port's handler.
pub struct Handler(pub Arc<Door>);

impl HttpHandler for Handler {
    fn handle(
        &self,
        request: Request<Incoming>,
        call: OpenCall,
    ) -> Pin<Box<dyn Future<Output = Response<HttpBody>> + Send>> {
        let door = Arc::clone(&self.0);
        Box::pin(async move { door.route(request, call).await })
    }

    fn connection_share_bytes(&self) -> Option<usize> {
        Some(
            self.0
                .max_body_bytes
                .saturating_mul(CONNECTION_SHARE_BODIES),
        )
    }
}

impl Door {
    async fn route(
        self: Arc<Self>,
        request: Request<Incoming>,
        call: OpenCall,
    ) -> Response<HttpBody> {
        let path = request.uri().path().to_owned();
        let method = request.method().clone();
        if let Err(e) = well_formed(&request) {
            return match path.starts_with(inprocess::SERVICE_PREFIX) {
                true => connect::refuse(&self, &e),
                false => workflow::refuse(&self, &e),
            };
        }
        let console = self.console.is_some() && path.starts_with(console::PREFIX);
        if (console || !self.auth.is_on()) && !self.hosts.allow(&request) {
            return hosts::misdirected(self.admission.metrics());
        }
        if console {
            return console::serve(&self, request, call).await;
        }
        if let Some(rpc) = path.strip_prefix(inprocess::SERVICE_PREFIX) {
            // The streaming methods in Connect's streaming protocol (asked
            // for by its content types) or as Server-Sent Events, the rest
            // in Connect's unary shape; all answer errors in Connect's JSON.
            return match connect::STREAMING.iter().find(|(name, ..)| *name == rpc) {
                Some(&(method, input, output))
                    if connect_stream::is_connect_streaming(request.headers()) =>
                {
                    connect_stream::serve(&self, method, (input, output), request, call).await
                }
                Some(&(method, input, output)) => {
                    events::serve(&self, method, input, output, request, call)
                        .await
                        .unwrap_or_else(|e| connect::refuse(&self, &e))
                }
                None => connect::serve(&self, rpc, request, call).await,
            };
        }
        match (path.as_str(), method) {
            ("/acquire", Method::POST) => workflow::acquire(&self, request, call).await,
            ("/complete", Method::POST) => workflow::complete(&self, request, call).await,
            ("/health", Method::GET | Method::HEAD) => {
                workflow::health(&self, &request, call).await
            }
            ("/acquire" | "/complete", _) => workflow::refuse(&self, &DoorError::MethodNotAllowed),
            ("/health", _) => workflow::refuse(&self, &DoorError::MethodNotAllowed),
            _ => workflow::refuse(&self, &DoorError::NoRoute),
        }
    }

    /// The caller of a request that carries a body, from its headers
    /// alone, before a byte of the body is read or of the budget taken: a
    /// browser's cross-site request is refused, and so is a request without
    /// valid credentials (when they are required).
    fn caller(&self, headers: &HeaderMap) -> Result<Caller, DoorError> {
        let cross_site = headers
            .get_all("sec-fetch-site")
            .iter()
            .any(|v| v.as_bytes().eq_ignore_ascii_case(b"cross-site"));
        if cross_site {
            return Err(DoorError::CrossSite);
        }
        self.auth
            .caller_from_headers(headers)
            .map_err(DoorError::Unauthenticated)
    }

    /// Reads a request's body: at most `max_body_bytes` (a larger declared
    /// length is refused before a byte is read), within the body timeout; a
    /// JSON body is refused as soon as it holds more than
    /// [`MAX_JSON_VALUES`].
    /// Its bytes are charged to admission's budget (and to `caller`'s
    /// tenant's and the connection's shares) as they arrive, never their
    /// declared length, and held until the returned body is dropped.
    async fn read_body(
        &self,
        body: Incoming,
        parts: &http::request::Parts,
        caller: &Caller,
        media: Media,
    ) -> Result<HeldBody, DoorError> {
        let declared = parts
            .headers
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        if declared.is_some_and(|n| n > self.max_body_bytes as u64) {
            return Err(DoorError::TooLarge(self.max_body_bytes));
        }
        let shares = parts
            .extensions
            .get::<ConnectionShare>()
            .map(|share| vec![Arc::clone(&share.0)])
            .unwrap_or_default();
        let mut held = self.admission.hold_for(caller, shares);
        let mut whole: Vec<u8> = Vec::new();
        let mut values = JsonValues::default();
        let mut body = body;
        let read = async {
            while let Some(frame) = body.frame().await {
                let frame = frame.map_err(|e| {
                    let error = printable(&cause_chain(&e)).into_owned();
                    tracing::debug!(%error, "cannot read a request body");
                    DoorError::BodyUnreadable
                })?;
                let Ok(data) = frame.into_data() else {
                    continue;
                };
                let len = whole.len() + data.len();
                if len > self.max_body_bytes {
                    return Err(DoorError::TooLarge(self.max_body_bytes));
                }
                // The budget holds the buffer's capacity, grown (doubling,
                // up to the largest body) only as bytes arrive.
                if len > whole.capacity() {
                    let target = len
                        .max(whole.capacity().saturating_mul(2))
                        .min(self.max_body_bytes);
                    held.grow(target - whole.capacity())
                        .map_err(DoorError::Overloaded)?;
                    whole.reserve_exact(target - whole.len());
                }
                whole.extend_from_slice(&data);
                if media == Media::Json && values.feed(&data, MAX_JSON_VALUES + 1) {
                    return Err(DoorError::TooManyValues(MAX_JSON_VALUES));
                }
            }
            Ok(())
        };
        match tokio::time::timeout(self.body_timeout, read).await {
            Err(_) => return Err(DoorError::TooSlow(self.body_timeout)),
            Ok(read) => read?,
        }
        let bytes = Bytes::from(whole);
        Ok(HeldBody { bytes, _held: held })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::StatusCode;

    fn request(version: Version, headers: &[(&str, &str)]) -> Request<()> {
        let mut builder = Request::builder().version(version).uri("/acquire");
        for (name, value) in headers {
            builder = builder.header(*name, *value);
        }
        builder.body(()).unwrap()
    }

    #[test]
    fn http_1_1_requests_carry_one_host_and_no_coding_but_chunked() {
        let ok = |headers: &[(&str, &str)]| well_formed(&request(Version::HTTP_11, headers));
        assert!(ok(&[("host", "x")]).is_ok());
        assert!(ok(&[("host", "x"), ("transfer-encoding", "Chunked")]).is_ok());
        assert!(matches!(ok(&[]), Err(DoorError::Malformed(_))));
        assert!(matches!(
            ok(&[("host", "x"), ("host", "y")]),
            Err(DoorError::Malformed(_))
        ));
        for coding in ["gzip, chunked", "chunked, chunked", "identity"] {
            assert!(
                matches!(
                    ok(&[("host", "x"), ("transfer-encoding", coding)]),
                    Err(DoorError::TransferCoding)
                ),
                "{coding}"
            );
        }
        assert_eq!(
            DoorError::TransferCoding.code_and_status().1,
            StatusCode::NOT_IMPLEMENTED
        );
        // HTTP/2 carries the authority in the request's URI instead.
        assert!(well_formed(&request(Version::HTTP_2, &[])).is_ok());
    }
}

//! The HTTP/JSON door (`--http-listen`): the Coordinator for callers that
//! cannot speak gRPC, on the same state, tenants, credentials, limits and
//! TLS as the gRPC port.
//!
//! - [`workflow`]: the workflow API (`POST /acquire`, `POST /complete`,
//!   `GET /health`), request and response shapes as low-code tools such as
//!   n8n send and read them;
//! - [`connect`]: every unary RPC in the Connect protocol's shape
//!   (`POST /idempotency.v1.Coordinator/Acquire`, canonical proto3 JSON);
//! - [`events`]: the streaming methods (Watch, WatchDue) as Server-Sent
//!   Events;
//! - [`json`]: canonical JSON by reflection over the embedded descriptors.
//!
//! Every Coordinator call the door makes goes through the gRPC port's
//! [`Admission`] in process, as a gRPC request (the caller's `authorization`
//! passed through): credentials, tenants, byte budgets, deadlines, metrics,
//! traces and the database gate apply exactly as to gRPC callers. Before
//! a byte of a body is read, the door checks the headers: HTTP/1.1 framing
//! as RFC 9112 has it, no browser's cross-site request, the caller's
//! credentials, the content type. The body is then held to twice
//! `--max-request-bytes` (base64 grows bytes by 4/3), `--request-body-timeout`
//! and [`MAX_JSON_VALUES`] (counted as it arrives), and charged to
//! admission's byte budget (and the tenant's and the connection's shares)
//! by the bytes that have arrived, until it has become protobuf; large
//! bodies are parsed on the blocking pool.

pub mod connect;
pub mod events;
pub mod json;
pub mod workflow;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::{BufMut as _, Bytes, BytesMut};
use http::{HeaderMap, HeaderValue, Method, Request, Response, StatusCode, Version, header};
use http_body_util::{BodyExt as _, Full};
use hyper::body::Incoming;
use tokio::sync::Semaphore;
use tonic::{Code, Status};

use crate::auth::{AuthError, Authenticator, Caller};
use crate::domain::JsonValues;
use crate::error::cause_chain;
use crate::metrics;
use crate::store::Store;
use crate::transport::{
    Admission, ConnectionShare, FromHttpPort, Full as BudgetFull, HttpBody, HttpHandler, OpenCall,
    Reservation, printable,
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
    /// Who the caller is, for the one read the workflow API makes itself.
    auth: Arc<Authenticator>,
    /// That read: the key's latest lease, for callers that carry no token.
    store: Store,
    /// Canonical JSON of the contract's messages.
    schema: Schema,
    /// The largest JSON body read.
    max_body_bytes: usize,
    /// The longest a body may take to arrive.
    body_timeout: Duration,
}

impl Door {
    pub fn new(
        admission: Arc<Admission>,
        auth: Arc<Authenticator>,
        store: Store,
        max_request_bytes: usize,
        body_timeout: Duration,
    ) -> Result<Arc<Self>, prost_reflect::DescriptorError> {
        Ok(Arc::new(Door {
            admission,
            auth,
            store,
            schema: Schema::load()?,
            max_body_bytes: max_request_bytes.saturating_mul(2),
            body_timeout,
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
            return match path.starts_with(connect::SERVICE_PREFIX) {
                true => connect::refuse(&self, &e),
                false => workflow::refuse(&e),
            };
        }
        if let Some(rpc) = path.strip_prefix(connect::SERVICE_PREFIX) {
            // The streaming methods as Server-Sent Events, the rest in
            // Connect's unary shape; both answer errors in Connect's JSON.
            return match connect::STREAMING.iter().find(|(name, ..)| *name == rpc) {
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
            ("/acquire" | "/complete", _) => workflow::refuse(&DoorError::MethodNotAllowed),
            ("/health", _) => workflow::refuse(&DoorError::MethodNotAllowed),
            _ => workflow::refuse(&DoorError::NoRoute),
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

    /// Makes one Coordinator call through admission, in process, as a gRPC
    /// request carrying `message` (protobuf), the caller the door already
    /// authenticated (if any: admission then does not read the credentials
    /// again), the caller's credentials, trace context and deadline;
    /// returns the answer's message or the status it was refused with.
    async fn call_coordinator(
        &self,
        path: &str,
        message: &[u8],
        headers: &HeaderMap,
        caller: Option<&Caller>,
        timeout: Option<Duration>,
        call: OpenCall,
    ) -> Result<Bytes, Status> {
        let body = self
            .open_call(path, message, headers, caller, timeout, call)
            .await?;
        let collected = body.collect().await?;
        if let Some(trailers) = collected.trailers() {
            failed(trailers)?;
        }
        let mut bytes = collected.to_bytes();
        if bytes.len() < 5 || bytes[0] != 0 {
            return Err(Status::internal(
                "the answer is not one uncompressed message",
            ));
        }
        let _ = bytes.split_to(5);
        Ok(bytes)
    }

    /// Starts one Coordinator call as [`Door::call_coordinator`] does and
    /// returns the answer's gRPC body (messages, then trailers) once its
    /// headers say it was not refused.
    async fn open_call(
        &self,
        path: &str,
        message: &[u8],
        headers: &HeaderMap,
        caller: Option<&Caller>,
        timeout: Option<Duration>,
        call: OpenCall,
    ) -> Result<tonic::body::Body, Status> {
        let mut framed = BytesMut::with_capacity(5 + message.len());
        framed.put_u8(0);
        framed.put_u32(
            u32::try_from(message.len())
                .map_err(|_| Status::resource_exhausted("the request message is too large"))?,
        );
        framed.put_slice(message);
        let mut request = Request::builder()
            .method(Method::POST)
            .uri(path)
            .version(http::Version::HTTP_2)
            .header(header::CONTENT_TYPE, "application/grpc")
            .header(header::TE, "trailers")
            .body(Full::new(framed.freeze()))
            .map_err(|e| Status::internal(format!("cannot build the call: {e}")))?;
        request.extensions_mut().insert(FromHttpPort);
        if let Some(caller) = caller {
            request.extensions_mut().insert(caller.clone());
        }
        for name in ["authorization", "traceparent", "tracestate"] {
            if let Some(value) = headers.get(name) {
                request.headers_mut().insert(name, value.clone());
            }
        }
        if let Some(timeout) = timeout {
            // grpc-timeout allows 8 digits.
            let ms = timeout.as_millis().min(99_999_999);
            if let Ok(value) = HeaderValue::from_str(&format!("{ms}m")) {
                request.headers_mut().insert("grpc-timeout", value);
            }
        }
        let response = match self.admission.call(request, call).await {
            Ok(response) => response,
            Err(never) => match never {},
        };
        let (parts, body) = response.into_parts();
        failed(&parts.headers)?;
        Ok(body)
    }
}

/// The status in a gRPC answer's headers or trailers, if it is an error.
fn failed(headers: &HeaderMap) -> Result<(), Status> {
    match Status::from_header_map(headers) {
        Some(status) if status.code() != Code::Ok => Err(status),
        _ => Ok(()),
    }
}

/// Why the door refused a request, before or after the Coordinator saw it.
#[derive(Debug, thiserror::Error)]
pub enum DoorError {
    #[error("the body is not valid JSON: {0}")]
    Syntax(String),
    /// A field with the wrong type, an unknown field, or a bad value.
    #[error("{field}: {message}")]
    Field { field: String, message: String },
    #[error("{0}")]
    Shape(String),
    #[error("the request body is larger than {0} bytes (twice --max-request-bytes)")]
    TooLarge(usize),
    #[error("the request body did not arrive within {0:?} (--request-body-timeout)")]
    TooSlow(Duration),
    #[error("the request body could not be read")]
    BodyUnreadable,
    #[error("{}", overloaded(*.0))]
    Overloaded(BudgetFull),
    /// The media types the route reads.
    #[error("send Content-Type: {0}")]
    MediaType(&'static str),
    /// Credentials missing or unknown (when they are required).
    #[error("{0}")]
    Unauthenticated(AuthError),
    /// A browser's request from another site (`Sec-Fetch-Site: cross-site`).
    #[error(
        "cross-site requests are refused: call this API from a server, not from another site's page"
    )]
    CrossSite,
    #[error("the body holds more than {0} JSON values")]
    TooManyValues(usize),
    /// An HTTP/1.1 request RFC 9112 says to refuse.
    #[error("malformed request: {0}")]
    Malformed(&'static str),
    #[error("transfer codings other than chunked are not implemented")]
    TransferCoding,
    #[error("no such route")]
    NoRoute,
    #[error("method not allowed on this route")]
    MethodNotAllowed,
    /// The Coordinator's answer.
    #[error("{}", .0.message())]
    Coordinator(Status),
}

impl From<Status> for DoorError {
    fn from(status: Status) -> Self {
        DoorError::Coordinator(status)
    }
}

impl From<json::JsonError> for DoorError {
    fn from(error: json::JsonError) -> Self {
        match error {
            json::JsonError::Syntax(m) => DoorError::Syntax(m),
            json::JsonError::Shape(m) => DoorError::Shape(m),
        }
    }
}

/// What a refusal for want of room in the budget says.
fn overloaded(full: BudgetFull) -> &'static str {
    match full {
        BudgetFull::Server => {
            "the server is receiving too many requests at once; try again shortly"
        }
        BudgetFull::Tenant => {
            "this tenant's requests arriving now hold its whole share of the server; try again shortly"
        }
        BudgetFull::Connection => {
            "this connection's requests arriving now hold its whole share; send fewer at once"
        }
    }
}

impl DoorError {
    /// The reason label of the refusal metric for the door's own refusals;
    /// `None` for the Coordinator's answers, which admission and the
    /// service count.
    fn metric_reason(&self) -> Option<&'static str> {
        Some(match self {
            DoorError::Syntax(_)
            | DoorError::Field { .. }
            | DoorError::Shape(_)
            | DoorError::BodyUnreadable => "invalid",
            DoorError::TooLarge(_) => "too_large",
            DoorError::TooSlow(_) => "too_slow",
            DoorError::Overloaded(full) => full.reason(),
            DoorError::MediaType(_) => "media_type",
            DoorError::Unauthenticated(_) => "unauthenticated",
            DoorError::CrossSite => "cross_site",
            DoorError::TooManyValues(_) => "too_many_values",
            DoorError::Malformed(_) | DoorError::TransferCoding => "malformed",
            DoorError::NoRoute => "not_found",
            DoorError::MethodNotAllowed => "method",
            DoorError::Coordinator(_) => return None,
        })
    }

    /// The gRPC code that says the same, and the HTTP status it is
    /// answered with: the Connect protocol's mapping of codes to statuses,
    /// in this one place.
    pub fn code_and_status(&self) -> (Code, StatusCode) {
        let code = match self {
            DoorError::Syntax(_)
            | DoorError::Field { .. }
            | DoorError::Shape(_)
            | DoorError::TooManyValues(_)
            | DoorError::Malformed(_)
            | DoorError::BodyUnreadable => Code::InvalidArgument,
            DoorError::Unauthenticated(_) => Code::Unauthenticated,
            DoorError::CrossSite => Code::PermissionDenied,
            DoorError::TransferCoding => Code::Unimplemented,
            DoorError::MediaType(_) => {
                return (Code::InvalidArgument, StatusCode::UNSUPPORTED_MEDIA_TYPE);
            }
            DoorError::TooLarge(_) => {
                return (Code::ResourceExhausted, StatusCode::PAYLOAD_TOO_LARGE);
            }
            DoorError::TooSlow(_) => {
                return (Code::DeadlineExceeded, StatusCode::REQUEST_TIMEOUT);
            }
            DoorError::Overloaded(_) => Code::ResourceExhausted,
            DoorError::NoRoute => return (Code::NotFound, StatusCode::NOT_FOUND),
            DoorError::MethodNotAllowed => {
                return (Code::Unimplemented, StatusCode::METHOD_NOT_ALLOWED);
            }
            DoorError::Coordinator(status) => status.code(),
        };
        (code, http_status(code))
    }

    /// The stable reason: the ErrorInfo reason of a Coordinator answer, or
    /// the door's own.
    pub fn reason(&self) -> String {
        match self {
            DoorError::Syntax(_) => "INVALID_JSON".into(),
            DoorError::Field { .. } | DoorError::Shape(_) | DoorError::BodyUnreadable => {
                "INVALID_ARGUMENT".into()
            }
            DoorError::TooLarge(_) => "REQUEST_TOO_LARGE".into(),
            DoorError::TooSlow(_) => "REQUEST_TOO_SLOW".into(),
            DoorError::Overloaded(_) => "OVERLOADED".into(),
            DoorError::MediaType(_) => "UNSUPPORTED_MEDIA_TYPE".into(),
            DoorError::Unauthenticated(_) => "UNAUTHENTICATED".into(),
            DoorError::CrossSite => "CROSS_SITE_REQUEST".into(),
            DoorError::TooManyValues(_) => "TOO_MANY_JSON_VALUES".into(),
            DoorError::Malformed(_) => "MALFORMED_REQUEST".into(),
            DoorError::TransferCoding => "UNSUPPORTED_TRANSFER_CODING".into(),
            DoorError::NoRoute => "NOT_FOUND".into(),
            DoorError::MethodNotAllowed => "METHOD_NOT_ALLOWED".into(),
            DoorError::Coordinator(status) => error_info(status)
                .map(|info| info.reason)
                .unwrap_or_else(|| format!("{:?}", status.code()).to_uppercase()),
        }
    }
}

/// Counts a refusal of the door's own, and says why a request was refused
/// in the log (debug: callers' mistakes are theirs; the Coordinator logged
/// its own failures with their causes), every client-controlled character
/// escaped (a field name may hold a newline).
fn log_refusal(error: &DoorError) {
    if let Some(reason) = error.metric_reason() {
        crate::transport::refused(metrics::Port::Http, reason);
    }
    let (message, reason) = refusal_log_fields(error);
    tracing::debug!(error = %message, %reason, "HTTP request refused");
}

/// The error and reason of the refusal's log line, escaped.
fn refusal_log_fields(error: &DoorError) -> (String, String) {
    (
        printable(&cause_chain(error)).into_owned(),
        printable(&error.reason()).into_owned(),
    )
}

/// The Connect protocol's HTTP status for each code.
pub fn http_status(code: Code) -> StatusCode {
    match code {
        Code::Ok => StatusCode::OK,
        Code::Cancelled => StatusCode::from_u16(499).unwrap_or(StatusCode::BAD_REQUEST),
        Code::Unknown | Code::Internal | Code::DataLoss => StatusCode::INTERNAL_SERVER_ERROR,
        Code::InvalidArgument | Code::FailedPrecondition | Code::OutOfRange => {
            StatusCode::BAD_REQUEST
        }
        Code::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
        Code::NotFound => StatusCode::NOT_FOUND,
        Code::AlreadyExists | Code::Aborted => StatusCode::CONFLICT,
        Code::PermissionDenied => StatusCode::FORBIDDEN,
        Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
        Code::Unimplemented => StatusCode::NOT_IMPLEMENTED,
        Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        Code::Unauthenticated => StatusCode::UNAUTHORIZED,
    }
}

/// The `google.rpc.ErrorInfo` of a status, if it carries one.
fn error_info(status: &Status) -> Option<tonic_types::ErrorInfo> {
    use tonic_types::StatusExt as _;
    status.get_details_error_info()
}

/// The `google.rpc.BadRequest` field violations of a status.
fn violations(status: &Status) -> Vec<(String, String)> {
    use tonic_types::StatusExt as _;
    status
        .get_details_bad_request()
        .map(|bad| {
            bad.field_violations
                .into_iter()
                .map(|v| (v.field, v.description))
                .collect()
        })
        .unwrap_or_default()
}

/// A JSON answer, ending in a newline (so that a shell prompt after `curl`
/// starts on a line of its own).
fn json_response(status: StatusCode, body: &serde_json::Value) -> Response<HttpBody> {
    let mut bytes = serde_json::to_vec(body).unwrap_or_else(|_| b"{}".to_vec());
    bytes.push(b'\n');
    let mut response = Response::new(Full::new(Bytes::from(bytes)).boxed_unsync());
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusals_log_fields_escape_what_the_client_wrote() {
        let error = DoorError::Field {
            field: "a\nINJECTED fake\u{1b}[2J".to_owned(),
            message: "is not a field of this request".to_owned(),
        };
        let (message, reason) = refusal_log_fields(&error);
        assert!(!message.chars().any(char::is_control), "{message:?}");
        assert_eq!(
            message,
            "a\\nINJECTED fake\\u{1b}[2J: is not a field of this request"
        );
        assert_eq!(reason, "INVALID_ARGUMENT");
    }

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

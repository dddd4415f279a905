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
//! traces and the database gate apply exactly as to gRPC callers. The JSON
//! body is read first, held to twice `--max-request-bytes` (base64 grows
//! bytes by 4/3) and `--request-body-timeout`, and charged to admission's
//! byte budget while it is held.

pub mod connect;
pub mod events;
pub mod json;
pub mod workflow;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::{BufMut as _, Bytes, BytesMut};
use http::{HeaderMap, HeaderValue, Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt as _, Full, LengthLimitError, Limited};
use hyper::body::Incoming;
use tonic::{Code, Status};

use crate::auth::Authenticator;
use crate::error::cause_chain;
use crate::store::Store;
use crate::transport::{Admission, HttpBody, HttpHandler, OpenCall};
use json::Schema;

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
}

impl Door {
    async fn route(
        self: Arc<Self>,
        request: Request<Incoming>,
        call: OpenCall,
    ) -> Response<HttpBody> {
        let path = request.uri().path().to_owned();
        let method = request.method().clone();
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

    /// Reads a request's body: at most `max_body_bytes` (a larger declared
    /// length is refused before a byte is read), within the body timeout,
    /// its bytes held in admission's budget until the reservation drops.
    async fn read_body(&self, body: Incoming, headers: &HeaderMap) -> Result<Bytes, DoorError> {
        let declared = headers
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<usize>().ok());
        if declared.is_some_and(|n| n > self.max_body_bytes) {
            return Err(DoorError::TooLarge(self.max_body_bytes));
        }
        let _held = self
            .admission
            .hold(declared.unwrap_or(self.max_body_bytes))
            .ok_or(DoorError::Overloaded)?;
        let read = Limited::new(body, self.max_body_bytes).collect();
        match tokio::time::timeout(self.body_timeout, read).await {
            Err(_) => Err(DoorError::TooSlow(self.body_timeout)),
            Ok(Err(e)) if e.downcast_ref::<LengthLimitError>().is_some() => {
                Err(DoorError::TooLarge(self.max_body_bytes))
            }
            Ok(Err(e)) => {
                tracing::debug!(error = %cause_chain(e.as_ref()), "cannot read a request body");
                Err(DoorError::BodyUnreadable)
            }
            Ok(Ok(collected)) => Ok(collected.to_bytes()),
        }
    }

    /// Makes one Coordinator call through admission, in process, as a gRPC
    /// request carrying `message` (protobuf) and the caller's credentials,
    /// trace context and deadline; returns the answer's message or the
    /// status it was refused with.
    async fn call_coordinator(
        &self,
        path: &str,
        message: &[u8],
        headers: &HeaderMap,
        timeout: Option<Duration>,
        call: OpenCall,
    ) -> Result<Bytes, Status> {
        let body = self
            .open_call(path, message, headers, timeout, call)
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
    #[error("the server is receiving too many requests at once; try again shortly")]
    Overloaded,
    #[error("send Content-Type: application/json (or application/proto)")]
    MediaType,
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

impl DoorError {
    /// The gRPC code that says the same, and the HTTP status it is
    /// answered with: the Connect protocol's mapping of codes to statuses,
    /// in this one place.
    pub fn code_and_status(&self) -> (Code, StatusCode) {
        let code = match self {
            DoorError::Syntax(_)
            | DoorError::Field { .. }
            | DoorError::Shape(_)
            | DoorError::BodyUnreadable => Code::InvalidArgument,
            DoorError::MediaType => {
                return (Code::InvalidArgument, StatusCode::UNSUPPORTED_MEDIA_TYPE);
            }
            DoorError::TooLarge(_) => {
                return (Code::ResourceExhausted, StatusCode::PAYLOAD_TOO_LARGE);
            }
            DoorError::TooSlow(_) => {
                return (Code::DeadlineExceeded, StatusCode::REQUEST_TIMEOUT);
            }
            DoorError::Overloaded => Code::ResourceExhausted,
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
            DoorError::Overloaded => "OVERLOADED".into(),
            DoorError::MediaType => "UNSUPPORTED_MEDIA_TYPE".into(),
            DoorError::NoRoute => "NOT_FOUND".into(),
            DoorError::MethodNotAllowed => "METHOD_NOT_ALLOWED".into(),
            DoorError::Coordinator(status) => error_info(status)
                .map(|info| info.reason)
                .unwrap_or_else(|| format!("{:?}", status.code()).to_uppercase()),
        }
    }
}

/// Says why a request was refused, in the log (debug: callers' mistakes
/// are theirs; the Coordinator logged its own failures with their causes).
fn log_refusal(error: &DoorError) {
    tracing::debug!(
        error = %cause_chain(error),
        reason = %error.reason(),
        "HTTP request refused"
    );
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

/// A JSON answer.
fn json_response(status: StatusCode, body: &serde_json::Value) -> Response<HttpBody> {
    let bytes = serde_json::to_vec(body).unwrap_or_else(|_| b"{}".to_vec());
    let mut response = Response::new(Full::new(Bytes::from(bytes)).boxed_unsync());
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

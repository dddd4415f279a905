//! The door's Coordinator calls, each through the gRPC port's admission,
//! so that credentials, budgets, deadlines, the readiness gate, metrics and
//! traces apply to it exactly as to a call from the network: a unary call
//! through admission's typed entry ([`Door::call_typed`]: the service's own
//! method called with the typed message, nothing encoded on the way in or
//! out), a streaming one as an in-process gRPC request ([`Door::open_call`]).

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use bytes::{BufMut as _, BytesMut};
use http::{HeaderMap, HeaderValue, Method, Request, header};
use http_body_util::Full;
use tonic::{Code, Status};

use super::Door;
use crate::auth::Caller;
use crate::proto::{self, coordinator_server::Coordinator as _};
use crate::service::CoordinatorService;
use crate::transport::{FromHttpPort, OpenCall};

/// Paths of the Coordinator's methods start with this.
pub const SERVICE_PREFIX: &str = "/idempotency.v1.Coordinator/";

impl Door {
    /// Makes one unary call through admission's typed entry
    /// ([`crate::transport::Admission::call_typed`]): `message` to the
    /// method at `path`, answered by `run` (the service's method), with
    /// what the door `asks` (the caller it already authenticated, if any:
    /// admission then does not read the credentials again), the caller's
    /// credentials, trace context and deadline from `headers` and
    /// `timeout`; returns the service's answer, extensions included, or
    /// the status it was refused with.
    #[expect(
        clippy::too_many_arguments,
        reason = "one call's whole description; grouping them would only rename it"
    )]
    pub(super) async fn call_typed<M, R, F, Fut>(
        &self,
        path: &str,
        message: M,
        headers: &HeaderMap,
        asks: Asks,
        timeout: Option<Duration>,
        call: OpenCall,
        run: F,
    ) -> Result<tonic::Response<R>, Status>
    where
        M: prost::Message,
        R: Send + 'static,
        F: FnOnce(tonic::Request<M>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<R>, Status>>,
    {
        let request = in_process(path, headers, asks, timeout)
            .body(message)
            .map_err(|e| Status::internal(format!("cannot build the call: {e}")))?;
        self.admission.call_typed(request, call, run).await
    }

    /// Starts one Coordinator call as an in-process gRPC request carrying
    /// `message` (protobuf), as [`Door::call_typed`] describes its other
    /// arguments, and returns the answer's gRPC body (messages, then
    /// trailers) once its headers say it was not refused, with the answer's
    /// extensions: for the streaming methods.
    pub(super) async fn open_call(
        &self,
        path: &str,
        message: &[u8],
        headers: &HeaderMap,
        asks: Asks,
        timeout: Option<Duration>,
        call: OpenCall,
    ) -> Result<(http::Extensions, tonic::body::Body), Status> {
        let mut framed = BytesMut::with_capacity(5 + message.len());
        framed.put_u8(0);
        framed.put_u32(
            u32::try_from(message.len())
                .map_err(|_| Status::resource_exhausted("the request message is too large"))?,
        );
        framed.put_slice(message);
        let request = in_process(path, headers, asks, timeout)
            .header(header::CONTENT_TYPE, "application/grpc")
            .header(header::TE, "trailers")
            .body(Full::new(framed.freeze()))
            .map_err(|e| Status::internal(format!("cannot build the call: {e}")))?;
        let response = match self.admission.call(request, call).await {
            Ok(response) => response,
            Err(never) => match never {},
        };
        let (parts, body) = response.into_parts();
        failed(&parts.headers)?;
        Ok((parts.extensions, body))
    }
}

/// A service method's answer to come.
pub(super) type Answering<'a, R> =
    Pin<Box<dyn Future<Output = Result<tonic::Response<R>, Status>> + Send + 'a>>;

/// A Coordinator request the door sends by its type: the method's name,
/// its answer's type, and the service's method that answers it.
pub(super) trait Unary: prost::Message + Default + 'static {
    type Answer: Send + 'static;
    const METHOD: &'static str;
    fn run(
        service: &CoordinatorService,
        request: tonic::Request<Self>,
    ) -> Answering<'_, Self::Answer>;
}

macro_rules! unary {
    ($($request:ident => $answer:ident, $method:ident, $name:literal;)*) => {$(
        impl Unary for proto::$request {
            type Answer = proto::$answer;
            const METHOD: &'static str = $name;
            fn run(
                service: &CoordinatorService,
                request: tonic::Request<Self>,
            ) -> Answering<'_, Self::Answer> {
                service.$method(request)
            }
        }
    )*};
}

unary! {
    AcquireRequest => AcquireResponse, acquire, "Acquire";
    CompleteRequest => CompleteResponse, complete, "Complete";
    ExtendLeaseRequest => ExtendLeaseResponse, extend_lease, "ExtendLease";
    GetRequest => GetResponse, get, "Get";
    SweepRequest => SweepResponse, sweep, "Sweep";
    ReleaseLeaseRequest => ReleaseLeaseResponse, release_lease, "ReleaseLease";
    RetryNowRequest => RetryNowResponse, retry_now, "RetryNow";
    FailPermanentlyRequest => FailPermanentlyResponse, fail_permanently, "FailPermanently";
    DeleteRecordRequest => DeleteRecordResponse, delete_record, "DeleteRecord";
    ListRecordsRequest => ListRecordsResponse, list_records, "ListRecords";
    SummarizeRequest => SummarizeResponse, summarize, "Summarize";
}

impl Door {
    /// One unary Coordinator call of `request`'s method, as
    /// [`Door::call_typed`] makes it.
    pub(super) async fn unary<Q: Unary>(
        &self,
        request: Q,
        headers: &HeaderMap,
        asks: Asks,
        timeout: Option<Duration>,
        call: OpenCall,
    ) -> Result<tonic::Response<Q::Answer>, Status> {
        let path = format!("{SERVICE_PREFIX}{}", Q::METHOD);
        self.call_typed(&path, request, headers, asks, timeout, call, |request| {
            Q::run(&self.coordinator, request)
        })
        .await
    }
}

/// An in-process request to `path`, marked as the HTTP port's, with what
/// the door `asks` in its extensions, and from the caller's `headers` its
/// credentials and trace context; `timeout` as its `grpc-timeout`.
fn in_process(
    path: &str,
    headers: &HeaderMap,
    asks: Asks,
    timeout: Option<Duration>,
) -> http::request::Builder {
    let mut request = Request::builder()
        .method(Method::POST)
        .uri(path)
        .version(http::Version::HTTP_2)
        .extension(FromHttpPort);
    if let Some(extensions) = request.extensions_mut() {
        extensions.extend(asks.0);
    }
    for name in ["authorization", "traceparent", "tracestate"] {
        if let Some(value) = headers.get(name) {
            request = request.header(name, value.clone());
        }
    }
    if let Some(timeout) = timeout {
        // grpc-timeout allows 8 digits.
        let ms = timeout.as_millis().min(99_999_999);
        if let Ok(value) = HeaderValue::from_str(&format!("{ms}m")) {
            request = request.header("grpc-timeout", value);
        }
    }
    request
}

/// What the door tells the Coordinator about an in-process call beyond its
/// message, in the request's extensions (which no network caller can set):
/// the caller it authenticated, and asks such as
/// [`crate::service::WantLeaseToken`].
#[derive(Default)]
pub(super) struct Asks(http::Extensions);

impl Asks {
    /// The call is `caller`'s, authenticated by the door.
    pub(super) fn caller(caller: &Caller) -> Self {
        Asks::default().with(caller.clone())
    }

    /// One more thing asked of the service.
    pub(super) fn with<T: Clone + Send + Sync + 'static>(mut self, ask: T) -> Self {
        self.0.insert(ask);
        self
    }
}

/// The status in a gRPC answer's headers or trailers, if it is an error.
pub(super) fn failed(headers: &HeaderMap) -> Result<(), Status> {
    match Status::from_header_map(headers) {
        Some(status) if status.code() != Code::Ok => Err(status),
        _ => Ok(()),
    }
}

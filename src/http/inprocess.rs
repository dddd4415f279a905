//! The door's Coordinator calls: each one a gRPC request made in process
//! through the gRPC port's admission, so that credentials, budgets,
//! deadlines, the readiness gate, metrics and traces apply to it exactly as
//! to a call from the network.

use std::time::Duration;

use bytes::{BufMut as _, Bytes, BytesMut};
use http::{HeaderMap, HeaderValue, Method, Request, header};
use http_body_util::{BodyExt as _, Full};
use tonic::{Code, Status};

use super::Door;
use crate::auth::Caller;
use crate::transport::{FromHttpPort, OpenCall};

impl Door {
    /// Makes one Coordinator call through admission, in process, as a gRPC
    /// request carrying `message` (protobuf), what the door `asks` (the
    /// caller it already authenticated, if any: admission then does not
    /// read the credentials again), the caller's credentials, trace context
    /// and deadline; returns the answer's message or the status it was
    /// refused with.
    pub(super) async fn call_coordinator(
        &self,
        path: &str,
        message: &[u8],
        headers: &HeaderMap,
        asks: Asks,
        timeout: Option<Duration>,
        call: OpenCall,
    ) -> Result<Bytes, Status> {
        let (answer, _) = self
            .call_coordinator_answering(path, message, headers, asks, timeout, call)
            .await?;
        Ok(answer)
    }

    /// [`Door::call_coordinator`], with the answer's extensions: what the
    /// service answered in process beyond the message (see [`Asks`]).
    pub(super) async fn call_coordinator_answering(
        &self,
        path: &str,
        message: &[u8],
        headers: &HeaderMap,
        asks: Asks,
        timeout: Option<Duration>,
        call: OpenCall,
    ) -> Result<(Bytes, http::Extensions), Status> {
        let (extensions, body) = self
            .open_call(path, message, headers, asks, timeout, call)
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
        Ok((bytes, extensions))
    }

    /// Starts one Coordinator call as [`Door::call_coordinator`] does and
    /// returns the answer's gRPC body (messages, then trailers) once its
    /// headers say it was not refused, with the answer's extensions.
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
        let mut request = Request::builder()
            .method(Method::POST)
            .uri(path)
            .version(http::Version::HTTP_2)
            .header(header::CONTENT_TYPE, "application/grpc")
            .header(header::TE, "trailers")
            .body(Full::new(framed.freeze()))
            .map_err(|e| Status::internal(format!("cannot build the call: {e}")))?;
        request.extensions_mut().extend(asks.0);
        request.extensions_mut().insert(FromHttpPort);
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
        Ok((parts.extensions, body))
    }
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

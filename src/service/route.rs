//! Acquire's own route, which admission calls ahead of the router
//! ([`DirectMethod`]): a call that waits keeps, for its whole window, the
//! service's future and a few words of this one, instead of the router's
//! and the generated server's futures around it (about 2.7 KB a call,
//! which was half of a waiting call's memory).
//!
//! Nothing else differs. The request is decoded by tonic's own unary
//! handler behind the same readiness gate (the gate first, then the
//! message limit, compression refused, trailers merged), in a future that
//! is dropped once the request is out; the answer is encoded as that
//! handler encodes it.

use std::convert::Infallible;
use std::future::{Future, Pending};
use std::pin::{Pin, pin};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use tonic::body::Body;
use tonic::codec::{Codec as _, EncodeBody, SingleMessageCompressionOverride};
use tonic::server::{Grpc, UnaryService};
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::{Request, Response, Status};
use tonic_prost::ProstCodec;
use tower_service::Service;

use super::CoordinatorService;
use crate::proto::coordinator_server::Coordinator as _;
use crate::proto::{AcquireRequest, AcquireResponse};
use crate::transport::DirectMethod;

/// The path Acquire is called at.
pub const ACQUIRE_PATH: &str = "/idempotency.v1.Coordinator/Acquire";

/// Acquire, served directly: see the module's documentation.
pub struct AcquireRoute<G> {
    /// Shared by every call, which keeps a reference for its life.
    service: Arc<CoordinatorService>,
    /// The gate every Coordinator call passes (refusing them while the
    /// database is not ready), as on the router's route.
    gate: G,
    /// The largest request message, as the router's route is configured.
    max_request_bytes: usize,
}

impl<G> AcquireRoute<G> {
    pub fn new(service: CoordinatorService, gate: G, max_request_bytes: usize) -> Self {
        AcquireRoute {
            service: Arc::new(service),
            gate,
            max_request_bytes,
        }
    }
}

impl<G> DirectMethod for AcquireRoute<G>
where
    G: Interceptor + Clone + Send + Sync + 'static,
{
    fn call(
        &self,
        request: http::Request<Body>,
    ) -> Pin<Box<dyn Future<Output = http::Response<Body>> + Send>> {
        let service = Arc::clone(&self.service);
        // Boxed, so that the decoding's state (the request's head, the
        // decoder, tonic's handler) is freed once the request is out rather
        // than sizing the future that waits.
        let decoding = Box::pin(decode(self.gate.clone(), self.max_request_bytes, request));
        Box::pin(async move {
            let request = match decoding.await {
                Ok(request) => request,
                Err(refused) => return refused,
            };
            encode(service.acquire(request).await)
        })
    }
}

/// Where tonic's handler leaves the decoded request.
type Slot = Arc<Mutex<Option<Request<AcquireRequest>>>>;

/// The request, decoded by tonic's unary handler behind `gate` exactly as
/// on the router's route; or the answer that refused it.
async fn decode<G: Interceptor>(
    gate: G,
    max_request_bytes: usize,
    request: http::Request<Body>,
) -> Result<Request<AcquireRequest>, http::Response<Body>> {
    let slot = Slot::default();
    let decoder = Decoder {
        slot: Arc::clone(&slot),
        max_request_bytes,
    };
    let mut handler = InterceptedService::new(decoder, gate);
    let mut answer = pin!(handler.call(request));
    // The handler answers by itself only to refuse; once it has handed the
    // request over it waits for ever (`Capture`), and is dropped.
    std::future::poll_fn(|cx: &mut Context<'_>| match answer.as_mut().poll(cx) {
        Poll::Ready(Ok(refused)) => Poll::Ready(Err(refused.map(Body::new))),
        Poll::Ready(Err(never)) => match never {},
        Poll::Pending => match slot.lock().unwrap_or_else(|e| e.into_inner()).take() {
            Some(request) => Poll::Ready(Ok(request)),
            None => Poll::Pending,
        },
    })
    .await
}

/// tonic's unary handler, configured as the generated server configures
/// Acquire's, with [`Capture`] as its service.
struct Decoder {
    slot: Slot,
    max_request_bytes: usize,
}

impl Service<http::Request<Body>> for Decoder {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<http::Response<Body>, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let capture = Capture(Arc::clone(&self.slot));
        let max = self.max_request_bytes;
        Box::pin(async move {
            let mut grpc = Grpc::new(ProstCodec::<AcquireResponse, AcquireRequest>::default())
                .apply_max_message_size_config(Some(max), None);
            Ok(grpc.unary(capture, request).await)
        })
    }
}

/// Takes the decoded request out of tonic's handler, which then never
/// answers.
struct Capture(Slot);

impl UnaryService<AcquireRequest> for Capture {
    type Response = AcquireResponse;
    type Future = Pending<Result<Response<AcquireResponse>, Status>>;

    fn call(&mut self, request: Request<AcquireRequest>) -> Self::Future {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = Some(request);
        std::future::pending()
    }
}

/// The answer as tonic's unary handler encodes it: a status alone, or the
/// message with the metadata (less the headers gRPC reserves) and the
/// extensions, `grpc-status` in the trailers.
fn encode(answer: Result<Response<AcquireResponse>, Status>) -> http::Response<Body> {
    let answer = match answer {
        Ok(answer) => answer,
        Err(status) => return status.into_http(),
    };
    let (metadata, message, extensions) = answer.into_parts();
    let mut headers = metadata.into_headers();
    for reserved in [
        "te",
        "content-type",
        "grpc-message",
        "grpc-message-type",
        "grpc-status",
    ] {
        headers.remove(reserved);
    }
    headers.insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/grpc"),
    );
    let body = EncodeBody::new_server(
        ProstCodec::<AcquireResponse, AcquireRequest>::default().encoder(),
        tokio_stream::once(Ok(message)),
        None,
        SingleMessageCompressionOverride::default(),
        None,
    );
    let mut response = http::Response::new(Body::new(body));
    *response.version_mut() = http::Version::HTTP_2;
    *response.headers_mut() = headers;
    *response.extensions_mut() = extensions;
    response
}

//! Admission's typed entry, for calls made in process (the HTTP door's):
//! the same decisions as for a call from the network, then the service's
//! own method called with the typed message.

use std::future::Future;

use http::Request;
use tracing::Instrument as _;

use super::{Admission, Service, refused, service_of};
use crate::auth::Caller;
use crate::error::Error;
use crate::metrics;
use crate::telemetry::CallSpan;
use crate::transport::activity::OpenCall;
use crate::transport::later::AnswerLater;

impl Admission {
    /// Admits or refuses one call made in process with a typed message
    /// (the HTTP door's), on the same decisions as [`Admission::call`]: the
    /// caller, the gate, the budget (its headers' charge, and the message's
    /// encoded length until the service has answered), the deadline, its
    /// span and metrics; then `run` answers it, the service's own method
    /// called with the request as the routes would hand it over. No bytes
    /// are framed, encoded or decoded on the way in or out; a call its
    /// service parked is answered with the parked call's message.
    pub async fn call_typed<M, R, F, Fut>(
        &self,
        mut request: Request<M>,
        call: OpenCall,
        run: F,
    ) -> Result<tonic::Response<R>, tonic::Status>
    where
        M: prost::Message,
        R: Send + 'static,
        F: FnOnce(tonic::Request<M>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<R>, tonic::Status>>,
    {
        let rpc = metrics::Rpc::start(&self.metrics, request.uri().path());
        let service = service_of(request.uri().path());
        let admitted = self.admit(&mut request, service);
        let span = match service {
            Service::Coordinator => {
                let tenant = request.extensions().get::<Caller>();
                let tenant = tenant.map(|caller| caller.tenant.as_str());
                CallSpan::start(request.uri().path(), request.headers(), tenant)
            }
            _ => CallSpan::none(),
        };
        let answer: Result<tonic::Response<R>, tonic::Status> = async {
            let (mut reservation, limits, deadline) = admitted?;
            let bytes = request.body().encoded_len();
            if bytes > limits.max_message {
                refused(&self.metrics, limits.port, "too_large");
                return Err(Error::RequestTooLarge {
                    declared: bytes,
                    limit: limits.max_message,
                    flag: limits.max_message_flag,
                }
                .into());
            }
            if let Err(full) = reservation.grow(bytes) {
                refused(&self.metrics, limits.port, full.reason());
                return Err(Error::Overloaded.into());
            }
            let (parts, message) = request.into_parts();
            let metadata = tonic::metadata::MetadataMap::from_headers(parts.headers);
            let request = tonic::Request::from_parts(metadata, parts.extensions, message);
            let answered = async {
                let response = run(request).await;
                // The request is gone: its bytes leave the budget.
                drop(reservation);
                let (metadata, message, mut extensions) = response?.into_parts();
                let message = match extensions.remove::<AnswerLater>() {
                    Some(later) => later.message().await?,
                    None => message,
                };
                Ok(tonic::Response::from_parts(metadata, message, extensions))
            };
            match deadline {
                None => answered.await,
                Some(deadline) => tokio::time::timeout(deadline, answered)
                    .await
                    .unwrap_or_else(|_| Err(Error::DeadlineExceeded.into())),
            }
        }
        .instrument(span.span().clone())
        .await;
        let code = match &answer {
            Ok(_) => tonic::Code::Ok,
            Err(status) => {
                span.answered(status.clone().into_http::<()>().headers());
                status.code()
            }
        };
        rpc.finish(code);
        drop(call);
        answer
    }
}

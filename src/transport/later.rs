//! Answers that follow their headers. A call that waits (an Acquire in its
//! window) is parked by its service, which answers at once with the answer's
//! headers and an [`AnswerLater`] in the response's extensions holding the
//! parked call's future; admission sends the headers and, in place of the
//! body the service's handler made, a body that polls that future and then
//! is its answer. While it waits, a call holds no handler's future, no task
//! and no channel: only the future its service parked, inside the body that
//! the connection polls. A caller that goes away drops the body, and with it
//! the parked call.

use std::any::Any;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, ready};

use http_body::Frame;
use tonic::Status;
use tonic::body::Body;
use tonic::codec::{EncodeBody, SingleMessageCompressionOverride};
use tonic_prost::ProstEncoder;

/// A parked call, put in the response's extensions by the service, taken
/// out by admission ([`AnswerLater::into_body`]) or by an in-process caller
/// ([`AnswerLater::message`]). Shared (extensions must be `Clone`), but only
/// its one holder gets the call: a copy left anywhere else answers INTERNAL.
#[derive(Clone)]
pub struct AnswerLater(Arc<Mutex<Option<Parked>>>);

/// The parked call's future, its answer's type erased.
type Parked = Pin<Box<dyn ParkedCall>>;

/// A future that ends in a `Result<M, Status>` for some message `M`.
trait ParkedCall: Send {
    fn poll_answer(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Box<dyn Answer>>;
}

impl<M, F> ParkedCall for F
where
    F: Future<Output = Result<M, Status>> + Send,
    M: prost::Message + Send + 'static,
{
    fn poll_answer(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Box<dyn Answer>> {
        self.poll(cx)
            .map(|answer| Box::new(answer) as Box<dyn Answer>)
    }
}

/// Parks `call`: its answer follows the headers. Boxed once, as it is.
pub fn answer_later<M, F>(call: F) -> AnswerLater
where
    F: Future<Output = Result<M, Status>> + Send + 'static,
    M: prost::Message + Send + 'static,
{
    AnswerLater(Arc::new(Mutex::new(Some(Box::pin(call)))))
}

/// A parked call's answer, a message or a status, kept as it is until its
/// reader says how it wants it: encoded for the network, or as it is for
/// an in-process caller.
trait Answer: Send + 'static {
    /// Encoded as tonic's unary handler encodes it: the message, then the
    /// status in the trailers.
    fn into_body(self: Box<Self>) -> Body;
    /// As it is: a `Result<M, Status>`.
    fn into_any(self: Box<Self>) -> Box<dyn Any + Send>;
}

impl<M: prost::Message + Send + 'static> Answer for Result<M, Status> {
    fn into_body(self: Box<Self>) -> Body {
        Body::new(EncodeBody::new_server(
            ProstEncoder::<M>::default(),
            tokio_stream::once(*self),
            None,
            SingleMessageCompressionOverride::default(),
            None,
        ))
    }

    fn into_any(self: Box<Self>) -> Box<dyn Any + Send> {
        self
    }
}

/// What a parked call that ended without answering is answered.
fn unanswered() -> Status {
    Status::internal("the call ended without an answer")
}

/// Polls `parked` once; a panic in it ends the call (`None`), as a
/// handler's panic would have ended its task, and is not the connection's.
fn poll_parked(parked: &mut Parked, cx: &mut Context<'_>) -> Poll<Option<Box<dyn Answer>>> {
    match std::panic::catch_unwind(AssertUnwindSafe(|| parked.as_mut().poll_answer(cx))) {
        Ok(polled) => polled.map(Some),
        Err(_) => Poll::Ready(None),
    }
}

impl AnswerLater {
    fn take(self) -> Option<Parked> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).take()
    }

    /// The answer's body: the parked call, polled until it answers, then
    /// its message encoded.
    pub fn into_body(self) -> Body {
        Body::new(match self.take() {
            Some(parked) => Later::Parked(parked),
            None => Later::Unanswered,
        })
    }

    /// The parked call's answer as it is, for an in-process caller.
    pub async fn message<M: Send + 'static>(self) -> Result<M, Status> {
        let mut parked = self.take().ok_or_else(unanswered)?;
        let answer = std::future::poll_fn(|cx| poll_parked(&mut parked, cx))
            .await
            .ok_or_else(unanswered)?;
        match answer.into_any().downcast::<Result<M, Status>>() {
            Ok(answer) => *answer,
            Err(_) => Err(Status::internal("the answer is not of the method's type")),
        }
    }
}

/// Polls the parked call, then is its answer's body.
enum Later {
    Parked(Parked),
    Answer(Body),
    /// The parked call ended without answering (it panicked, or was taken
    /// by someone else): INTERNAL in the trailers, then nothing.
    Unanswered,
    Ended,
}

impl http_body::Body for Later {
    type Data = bytes::Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<bytes::Bytes>, Status>>> {
        let this = &mut *self;
        if let Later::Parked(parked) = this {
            *this = match ready!(poll_parked(parked, cx)) {
                Some(answer) => Later::Answer(answer.into_body()),
                None => Later::Unanswered,
            };
        }
        match this {
            Later::Parked(_) => unreachable!("polled above until it answered"),
            Later::Answer(body) => Pin::new(body).poll_frame(cx),
            Later::Unanswered => {
                *this = Later::Ended;
                let (head, ()) = unanswered().into_http::<()>().into_parts();
                Poll::Ready(Some(Ok(Frame::trailers(head.headers))))
            }
            Later::Ended => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        matches!(self, Later::Ended)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt as _;

    fn seven() -> prost_types::Duration {
        prost_types::Duration {
            seconds: 7,
            nanos: 0,
        }
    }

    #[tokio::test]
    async fn the_parked_calls_answer_is_the_body() {
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let later = answer_later(async move {
            rx.await.unwrap();
            Ok(seven())
        });
        let body = later.into_body();
        tx.send(()).unwrap();
        let collected = body.collect().await.unwrap();
        let trailers = collected.trailers().cloned().unwrap();
        assert_eq!(trailers.get("grpc-status").unwrap(), "0");
        let bytes = collected.to_bytes();
        // One uncompressed message: flag, length, then the message.
        assert_eq!(bytes[0], 0);
        let message = <prost_types::Duration as prost::Message>::decode(&bytes[5..]).unwrap();
        assert_eq!(message.seconds, 7);
    }

    #[tokio::test]
    async fn an_in_process_caller_takes_the_message_as_it_is() {
        let later = answer_later(async { Ok(seven()) });
        let message: prost_types::Duration = later.message().await.unwrap();
        assert_eq!(message.seconds, 7);
    }

    async fn internal(body: Body) {
        let collected = body.collect().await.unwrap();
        let trailers = collected.trailers().cloned().unwrap();
        assert_eq!(
            Status::from_header_map(&trailers).unwrap().code(),
            tonic::Code::Internal
        );
    }

    #[tokio::test]
    async fn a_parked_call_that_panics_ends_internal() {
        let later = answer_later(async {
            if true {
                panic!("the parked call fails");
            }
            Ok(seven())
        });
        internal(later.into_body()).await;
    }

    #[tokio::test]
    async fn only_the_first_taker_gets_the_parked_call() {
        let later = answer_later(async { Ok(seven()) });
        let copy = later.clone();
        let body = later.into_body();
        internal(copy.into_body()).await;
        assert!(body.collect().await.unwrap().trailers().is_some());
    }

    #[tokio::test]
    async fn a_caller_that_leaves_drops_the_parked_call() {
        let (tx, mut rx) = tokio::sync::oneshot::channel::<()>();
        let later = answer_later(async move {
            std::future::pending::<()>().await;
            drop(tx);
            Ok(seven())
        });
        let mut body = later.into_body();
        let polled = futures::poll!(body.frame());
        assert!(polled.is_pending());
        assert!(
            rx.try_recv()
                .is_err_and(|e| e == tokio::sync::oneshot::error::TryRecvError::Empty)
        );
        drop(body);
        assert_eq!(
            rx.try_recv(),
            Err(tokio::sync::oneshot::error::TryRecvError::Closed)
        );
    }
}

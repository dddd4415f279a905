//! Answers that follow their headers. A call that waits (an Acquire in its
//! window) is parked by its service, which answers at once with the answer's
//! headers and an [`AnswerLater`] in the response's extensions; admission
//! sends the headers and, in place of the body the service's handler made,
//! the message the parked call hands to its [`Reply`]. While it waits, a
//! call holds no handler's future: only what its service parked, and this
//! body's channel.

use std::any::Any;
use std::future::Future as _;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use http_body::Frame;
use tokio::sync::oneshot;
use tonic::Status;
use tonic::body::Body;
use tonic::codec::{EncodeBody, SingleMessageCompressionOverride};
use tonic_prost::ProstEncoder;

/// Where a parked call's answer arrives; put in the response's extensions
/// by the service, taken out by admission ([`AnswerLater::into_body`]) or by
/// an in-process caller ([`AnswerLater::message`]). Shared (extensions must
/// be `Clone`), but only its one holder gets the answer: a copy left
/// anywhere else answers INTERNAL.
#[derive(Clone)]
pub struct AnswerLater(Arc<oneshot::Receiver<Box<dyn Answer>>>);

/// The parked call's side: answers once, or hears that the caller left.
pub struct Reply(oneshot::Sender<Box<dyn Answer>>);

/// A channel for one answer that follows its headers.
pub fn answer_later() -> (Reply, AnswerLater) {
    let (reply, later) = oneshot::channel();
    (Reply(reply), AnswerLater(Arc::new(later)))
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

impl Reply {
    /// Answers `answer` (a caller that left has dropped the reader).
    pub fn send<M: prost::Message + Send + 'static>(self, answer: Result<M, Status>) {
        let _ = self.0.send(Box::new(answer));
    }

    /// Resolves when the caller has gone away (its stream reset, or the
    /// connection closed): nobody will read the answer.
    pub async fn closed(&mut self) {
        self.0.closed().await;
    }
}

impl AnswerLater {
    fn receiver(self) -> Option<oneshot::Receiver<Box<dyn Answer>>> {
        Arc::try_unwrap(self.0).ok()
    }

    /// The answer's body: the parked call's message, encoded once it has
    /// been handed over.
    pub fn into_body(self) -> Body {
        Body::new(Later {
            answer: self.receiver(),
            body: None,
        })
    }

    /// The parked call's answer as it is, for an in-process caller.
    pub async fn message<M: Send + 'static>(self) -> Result<M, Status> {
        let answer = self.receiver().ok_or_else(unanswered)?;
        let answer = answer.await.map_err(|_| unanswered())?;
        match answer.into_any().downcast::<Result<M, Status>>() {
            Ok(answer) => *answer,
            Err(_) => Err(Status::internal("the answer is not of the method's type")),
        }
    }
}

/// Waits for the parked call's body, then is that body.
struct Later {
    answer: Option<oneshot::Receiver<Box<dyn Answer>>>,
    body: Option<Body>,
}

impl http_body::Body for Later {
    type Data = bytes::Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<bytes::Bytes>, Status>>> {
        let this = &mut *self;
        if this.body.is_none() {
            let received = match &mut this.answer {
                Some(answer) => ready!(Pin::new(answer).poll(cx)).ok(),
                None => None,
            };
            this.answer = None;
            match received {
                Some(answer) => this.body = Some(answer.into_body()),
                None => {
                    // The parked call ended without answering (it panicked,
                    // or the server is going down): the body ends at once,
                    // answering INTERNAL in the trailers, and then nothing.
                    this.body = Some(Body::empty());
                    let (head, ()) = unanswered().into_http::<()>().into_parts();
                    return Poll::Ready(Some(Ok(Frame::trailers(head.headers))));
                }
            }
        }
        match &mut this.body {
            Some(body) => Pin::new(body).poll_frame(cx),
            None => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt as _;

    #[tokio::test]
    async fn the_parked_calls_answer_is_the_body() {
        let (reply, later) = answer_later();
        let body = later.into_body();
        reply.send(Ok(prost_types::Duration {
            seconds: 7,
            nanos: 0,
        }));
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
        let (reply, later) = answer_later();
        reply.send(Ok(prost_types::Duration {
            seconds: 7,
            nanos: 0,
        }));
        let message: prost_types::Duration = later.message().await.unwrap();
        assert_eq!(message.seconds, 7);
    }

    #[tokio::test]
    async fn a_call_parked_and_never_answered_ends_internal() {
        let (reply, later) = answer_later();
        let body = later.into_body();
        drop(reply);
        let collected = body.collect().await.unwrap();
        let trailers = collected.trailers().cloned().unwrap();
        assert_eq!(
            Status::from_header_map(&trailers).unwrap().code(),
            tonic::Code::Internal
        );
    }

    #[tokio::test]
    async fn the_parked_call_hears_that_its_caller_left() {
        let (mut reply, later) = answer_later();
        drop(later.into_body());
        tokio::time::timeout(std::time::Duration::from_secs(5), reply.closed())
            .await
            .expect("the reply hears the body was dropped");
    }
}

//! The server-streaming methods, Watch and WatchDue, as Server-Sent Events:
//! `POST /idempotency.v1.Coordinator/Watch` with the request as canonical
//! JSON (`Content-Type: application/json`, as for unary calls; the Connect
//! protocol's streaming content types are served by `connect_stream`) answers
//! `text/event-stream`, one `data:` event per message in canonical JSON, and
//! an `event: error` whose data is Connect's error JSON if the stream ends
//! with an error. A call refused before its stream starts is answered as a
//! unary call's error. `curl -N` and browsers' `EventSource` read it.

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::{Buf as _, BufMut as _, Bytes, BytesMut};
use http::{HeaderValue, Method, Request, Response, header};
use http_body::{Body, Frame};
use http_body_util::BodyExt as _;
use hyper::body::Incoming;
use prost_reflect::MessageDescriptor;
use tonic::Status;

use super::connect::{Codec, codec, connect_timeout, error_json};
use super::inprocess::SERVICE_PREFIX;
use super::json::Schema;
use super::{Asks, Door, DoorError, Media, failed, parse_json};
use crate::transport::{HttpBody, OpenCall};

pub(super) async fn serve(
    door: &Door,
    method: &str,
    input: &str,
    output: &str,
    request: Request<Incoming>,
    call: OpenCall,
) -> Result<Response<HttpBody>, DoorError> {
    if request.method() != Method::POST {
        return Err(DoorError::MethodNotAllowed);
    }
    let caller = door.caller(request.headers())?;
    if codec(request.headers()) != Some(Codec::Json) {
        return Err(DoorError::MediaType("application/json"));
    }
    let (input, output) = match (
        door.schema.message(&format!("idempotency.v1.{input}")),
        door.schema.message(&format!("idempotency.v1.{output}")),
    ) {
        (Some(input), Some(output)) => (input, output),
        _ => return Err(DoorError::NoRoute),
    };
    let (parts, body) = request.into_parts();
    let body = door.read_body(body, &parts, &caller, Media::Json).await?;
    let schema = door.schema.clone();
    let message = parse_json(&body, move |text| Ok(schema.json_to_proto(input, text)?)).await?;
    // The body is protobuf now: its share of the budget goes back.
    drop(body);
    let (_, stream) = door
        .open_call(
            &format!("{SERVICE_PREFIX}{method}"),
            &message,
            &parts.headers,
            Asks::caller(&caller),
            connect_timeout(&parts.headers),
            call,
        )
        .await?;
    Ok(event_stream(door, stream, output))
}

/// A Coordinator call's streamed answer as Server-Sent Events, one `data:`
/// event per message in canonical JSON.
pub(super) fn event_stream(
    door: &Door,
    stream: tonic::body::Body,
    output: MessageDescriptor,
) -> Response<HttpBody> {
    let events = Events {
        stream,
        pending: BytesMut::new(),
        schema: door.schema.clone(),
        output,
        done: false,
    };
    let mut response = Response::new(events.boxed_unsync());
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    // Proxies that buffer answers would hold the events back.
    headers.insert("x-accel-buffering", HeaderValue::from_static("no"));
    response
}

/// A gRPC answer's messages as Server-Sent Events.
struct Events {
    /// The gRPC answer (it keeps the call open until it ends).
    stream: tonic::body::Body,
    /// Bytes of a message not yet whole.
    pending: BytesMut,
    schema: Schema,
    output: MessageDescriptor,
    done: bool,
}

/// The next whole gRPC message of `pending`, unframed; `None` until one
/// has arrived whole. A compressed one is refused.
pub(super) fn next_message(pending: &mut BytesMut) -> Result<Option<Bytes>, Status> {
    let Some(head) = pending.get(..5) else {
        return Ok(None);
    };
    let len = u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
    if pending.len() < 5 + len {
        return Ok(None);
    }
    if head[0] != 0 {
        return Err(Status::internal("a compressed message in the stream"));
    }
    pending.advance(5);
    Ok(Some(pending.split_to(len).freeze()))
}

/// A streamed message as JSON.
pub(super) fn message_json(
    schema: &Schema,
    output: &MessageDescriptor,
    message: Bytes,
) -> Result<serde_json::Value, Status> {
    schema.proto_to_json(output.clone(), message).map_err(|e| {
        tracing::error!(error = %e, "cannot write a streamed message as JSON");
        Status::internal("cannot write a message as JSON")
    })
}

impl Events {
    /// The events of the whole messages received so far.
    fn whole_messages(&mut self) -> Result<Bytes, Status> {
        let mut out = BytesMut::new();
        while let Some(message) = next_message(&mut self.pending)? {
            let json = message_json(&self.schema, &self.output, message)?;
            out.put_slice(b"data: ");
            out.put_slice(json.to_string().as_bytes());
            out.put_slice(b"\n\n");
        }
        Ok(out.freeze())
    }

    fn error_event(&mut self, status: Status) -> Bytes {
        self.done = true;
        let json = error_json(&self.schema, &DoorError::Coordinator(status));
        Bytes::from(format!("event: error\ndata: {json}\n\n"))
    }
}

impl Body for Events {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let this = self.get_mut();
        loop {
            if this.done {
                return Poll::Ready(None);
            }
            let frame = match ready!(Pin::new(&mut this.stream).poll_frame(cx)) {
                None => {
                    this.done = true;
                    return Poll::Ready(None);
                }
                Some(Err(status)) => {
                    return Poll::Ready(Some(Ok(Frame::data(this.error_event(status)))));
                }
                Some(Ok(frame)) => frame,
            };
            match frame.into_data() {
                Ok(data) => {
                    this.pending.extend_from_slice(&data);
                    match this.whole_messages() {
                        Ok(events) if events.is_empty() => {}
                        Ok(events) => return Poll::Ready(Some(Ok(Frame::data(events)))),
                        Err(status) => {
                            return Poll::Ready(Some(Ok(Frame::data(this.error_event(status)))));
                        }
                    }
                }
                Err(frame) => {
                    this.done = true;
                    if let Some(trailers) = frame.trailers_ref()
                        && let Err(status) = failed(trailers)
                    {
                        return Poll::Ready(Some(Ok(Frame::data(this.error_event(status)))));
                    }
                    return Poll::Ready(None);
                }
            }
        }
    }
}

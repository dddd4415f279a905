//! The server-streaming methods (Watch, WatchDue) in the Connect protocol's
//! streaming shape, as `buf curl --protocol connect` and Connect-ES's
//! `createConnectTransport` call them: `POST
//! /idempotency.v1.Coordinator/Watch` with `Content-Type:
//! application/connect+json` (canonical proto3 JSON) or
//! `application/connect+proto`, the request as one enveloped message (a
//! flags byte, a 4-byte big-endian length, the message). The answer is
//! `200` with the same content type: one enveloped message per event, then
//! the end-of-stream message (flags `0x02`), always JSON: `{}` when the call
//! succeeded, `{"error": {...}}` (Connect's error JSON, as the unary routes
//! answer it) when it failed, with the call's trailers under `metadata`.
//! `Connect-Timeout-Ms` becomes the call's deadline.
//!
//! A request refused after its content type was read (credentials, body,
//! the Coordinator's refusal) is answered the same way, `200` and an
//! end-of-stream message carrying the error, as the protocol asks; only a
//! method other than POST or a codec other than JSON or protobuf is
//! refused with an HTTP status. Compression is not served: a
//! `Connect-Content-Encoding` other than `identity` is `unimplemented`.

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::{BufMut as _, Bytes, BytesMut};
use http::{HeaderMap, HeaderValue, Method, Request, Response, header};
use http_body::{Body, Frame};
use http_body_util::BodyExt as _;
use hyper::body::Incoming;
use prost_reflect::MessageDescriptor;
use serde_json::{Map, Value, json};
use tonic::Status;

use super::connect::{connect_timeout, error_json};
use super::discard::discard;
use super::events::{message_json, next_message};
use super::inprocess::SERVICE_PREFIX;
use super::json::Schema;
use super::{Asks, Door, DoorError, HeldBody, MAX_JSON_VALUES, Media, failed, parse_json};
use crate::auth::Caller;
use crate::domain::JsonValues;
use crate::transport::{HttpBody, OpenCall};

/// The content types of Connect's streaming calls start with this.
pub(super) const STREAMING_PREFIX: &str = "application/connect+";

/// What the streaming routes read, in the Connect protocol.
const CONNECT_JSON_OR_PROTO: &str = "application/connect+json (or application/connect+proto)";

/// The envelope flag of a compressed message.
const COMPRESSED: u8 = 0x01;
/// The envelope flag of the end-of-stream message.
const END_STREAM: u8 = 0x02;

/// How the messages of a Connect stream are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Codec {
    Json,
    Proto,
}

impl Codec {
    fn content_type(self) -> &'static str {
        match self {
            Codec::Json => "application/connect+json",
            Codec::Proto => "application/connect+proto",
        }
    }
}

/// Whether a request asks for Connect's streaming protocol (its content
/// type starts with `application/connect+`).
pub(super) fn is_connect_streaming(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.as_bytes().get(..STREAMING_PREFIX.len()))
        .is_some_and(|start| start.eq_ignore_ascii_case(STREAMING_PREFIX.as_bytes()))
}

fn codec(headers: &HeaderMap) -> Option<Codec> {
    let value = headers.get(header::CONTENT_TYPE)?.to_str().ok()?;
    let essence = value.split(';').next()?.trim().to_ascii_lowercase();
    match essence.as_str() {
        "application/connect+json" => Some(Codec::Json),
        "application/connect+proto" => Some(Codec::Proto),
        _ => None,
    }
}

/// Serves one server-streaming call (`method`, taking `input`, answering
/// `output`) in Connect's streaming protocol.
pub(super) async fn serve(
    door: &Door,
    method: &str,
    (input, output): (&str, &str),
    request: Request<Incoming>,
    call: OpenCall,
) -> Response<HttpBody> {
    if request.method() != Method::POST {
        return super::connect::refuse(door, &DoorError::MethodNotAllowed);
    }
    let Some(codec) = codec(request.headers()) else {
        return super::connect::refuse(door, &DoorError::MediaType(CONNECT_JSON_OR_PROTO));
    };
    let messages = match (
        door.schema.message(&format!("idempotency.v1.{input}")),
        door.schema.message(&format!("idempotency.v1.{output}")),
    ) {
        (Some(input), Some(output)) => (input, output),
        _ => return super::connect::refuse(door, &DoorError::NoRoute),
    };
    let (parts, body) = request.into_parts();
    let answer = match admit(door, &parts.headers) {
        Ok(caller) => open(door, (method, codec), messages, caller, (parts, body), call).await,
        Err(e) => {
            // Refused from its headers alone: the body is read and dropped
            // first (a little of it, briefly), so that an HTTP/1.1 client
            // still sending it reads the answer rather than a closed
            // connection.
            discard(body).await;
            Err(e)
        }
    };
    match answer {
        Ok(response) => response,
        Err(e) => {
            super::log_refusal(door, &e);
            let end = end_stream(Some(&error_json(&door.schema, &e)), &HeaderMap::new());
            let body = http_body_util::Full::new(end).boxed_unsync();
            streaming_response(codec, body)
        }
    }
}

/// The caller, from the request's headers, if they do not refuse it: valid
/// credentials (when required), no cross-site browser request, and no
/// compression.
fn admit(door: &Door, headers: &HeaderMap) -> Result<Caller, DoorError> {
    let caller = door.caller(headers)?;
    let encoding = headers
        .get("connect-content-encoding")
        .map(|v| v.as_bytes().trim_ascii());
    if encoding.is_some_and(|e| !e.eq_ignore_ascii_case(b"identity")) {
        return Err(DoorError::Coordinator(Status::unimplemented(
            "compressed requests are not served: send Connect-Content-Encoding: identity",
        )));
    }
    Ok(caller)
}

/// Reads the request, opens the call, and answers its stream.
async fn open(
    door: &Door,
    (method, codec): (&str, Codec),
    (input, output): (MessageDescriptor, MessageDescriptor),
    caller: Caller,
    (parts, body): (http::request::Parts, Incoming),
    call: OpenCall,
) -> Result<Response<HttpBody>, DoorError> {
    let HeldBody { bytes, _held } = door.read_body(body, &parts, &caller, Media::Proto).await?;
    // The message alone, still charged to the budget.
    let body = HeldBody {
        bytes: only_message(&bytes)?,
        _held,
    };
    let message = match codec {
        Codec::Proto => body.to_vec(),
        Codec::Json => {
            if JsonValues::default().feed(&body, MAX_JSON_VALUES + 1) {
                return Err(DoorError::TooManyValues(MAX_JSON_VALUES));
            }
            let schema = door.schema.clone();
            parse_json(&body, move |text| Ok(schema.json_to_proto(input, text)?)).await?
        }
    };
    // The body is protobuf now: its share of the budget goes back.
    drop((body, bytes));
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
    let envelopes = Envelopes {
        stream,
        pending: BytesMut::new(),
        schema: door.schema.clone(),
        output,
        codec,
        done: false,
    };
    Ok(streaming_response(codec, envelopes.boxed_unsync()))
}

/// The one enveloped message of a server-streaming request.
fn only_message(body: &Bytes) -> Result<Bytes, DoorError> {
    let shape = |m: &str| DoorError::Shape(m.to_owned());
    if body.len() < 5 {
        return Err(shape(
            "the request carries no enveloped message (a flags byte, a 4-byte length, the message)",
        ));
    }
    let flags = body[0];
    let len = u32::from_be_bytes([body[1], body[2], body[3], body[4]]) as usize;
    if flags & COMPRESSED != 0 {
        return Err(shape("the request message is flagged compressed"));
    }
    if flags != 0 {
        return Err(shape("a request message's envelope flags must be 0"));
    }
    match (body.len() - 5).cmp(&len) {
        std::cmp::Ordering::Less => Err(shape(
            "the request message is shorter than its envelope says",
        )),
        std::cmp::Ordering::Greater => Err(shape(
            "a server-streaming call takes exactly one request message",
        )),
        std::cmp::Ordering::Equal => Ok(body.slice(5..)),
    }
}

fn streaming_response(codec: Codec, body: HttpBody) -> Response<HttpBody> {
    let mut response = Response::new(body);
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(codec.content_type()),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    // Proxies that buffer answers would hold the messages back.
    headers.insert("x-accel-buffering", HeaderValue::from_static("no"));
    response
}

fn envelope(flags: u8, message: &[u8], out: &mut BytesMut) {
    out.put_u8(flags);
    out.put_u32(u32::try_from(message.len()).unwrap_or(u32::MAX));
    out.put_slice(message);
}

/// The end-of-stream message: the error, if the call failed, and the
/// call's trailers (but gRPC's own) as `metadata`.
fn end_stream(error: Option<&Value>, trailers: &HeaderMap) -> Bytes {
    let mut end = json!({});
    if let Some(error) = error {
        end["error"] = error.clone();
    }
    let mut metadata = Map::new();
    for name in trailers.keys() {
        if name.as_str().starts_with("grpc-") {
            continue;
        }
        let values: Vec<Value> = trailers
            .get_all(name)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .map(|v| Value::String(v.to_owned()))
            .collect();
        metadata.insert(name.as_str().to_owned(), Value::Array(values));
    }
    if !metadata.is_empty() {
        end["metadata"] = Value::Object(metadata);
    }
    let mut out = BytesMut::new();
    envelope(END_STREAM, end.to_string().as_bytes(), &mut out);
    out.freeze()
}

/// A gRPC answer's messages as Connect's enveloped messages.
struct Envelopes {
    /// The gRPC answer (it keeps the call open until it ends).
    stream: tonic::body::Body,
    /// Bytes of a message not yet whole.
    pending: BytesMut,
    schema: Schema,
    output: MessageDescriptor,
    codec: Codec,
    done: bool,
}

impl Envelopes {
    /// The envelopes of the whole messages received so far.
    fn whole_messages(&mut self) -> Result<Bytes, Status> {
        let mut out = BytesMut::new();
        while let Some(message) = next_message(&mut self.pending)? {
            match self.codec {
                Codec::Proto => envelope(0, &message, &mut out),
                Codec::Json => {
                    let json = message_json(&self.schema, &self.output, message)?;
                    envelope(0, json.to_string().as_bytes(), &mut out);
                }
            }
        }
        Ok(out.freeze())
    }

    /// The end of the stream, failed with `status` or (without one) not.
    fn end(&mut self, status: Option<Status>, trailers: &HeaderMap) -> Bytes {
        self.done = true;
        let error = status.map(|s| error_json(&self.schema, &DoorError::Coordinator(s)));
        end_stream(error.as_ref(), trailers)
    }
}

impl Body for Envelopes {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let this = self.get_mut();
        let none = HeaderMap::new();
        loop {
            if this.done {
                return Poll::Ready(None);
            }
            let frame = match ready!(Pin::new(&mut this.stream).poll_frame(cx)) {
                // An answer without trailers ended cleanly.
                None => return Poll::Ready(Some(Ok(Frame::data(this.end(None, &none))))),
                Some(Err(status)) => {
                    return Poll::Ready(Some(Ok(Frame::data(this.end(Some(status), &none)))));
                }
                Some(Ok(frame)) => frame,
            };
            match frame.into_data() {
                Ok(data) => {
                    this.pending.extend_from_slice(&data);
                    match this.whole_messages() {
                        Ok(messages) if messages.is_empty() => {}
                        Ok(messages) => return Poll::Ready(Some(Ok(Frame::data(messages)))),
                        Err(status) => {
                            let end = this.end(Some(status), &none);
                            return Poll::Ready(Some(Ok(Frame::data(end))));
                        }
                    }
                }
                Err(frame) => {
                    let trailers = frame.into_trailers().unwrap_or_default();
                    let status = failed(&trailers).err();
                    return Poll::Ready(Some(Ok(Frame::data(this.end(status, &trailers)))));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn enveloped(flags: u8, message: &[u8]) -> Bytes {
        let mut out = BytesMut::new();
        envelope(flags, message, &mut out);
        out.freeze()
    }

    #[test]
    fn a_request_is_exactly_one_uncompressed_envelope() {
        let one = enveloped(0, b"{}");
        assert_eq!(only_message(&one).unwrap(), Bytes::from_static(b"{}"));
        let empty = enveloped(0, b"");
        assert_eq!(only_message(&empty).unwrap(), Bytes::new());
        let mut two = BytesMut::from(&one[..]);
        two.extend_from_slice(&one);
        for refused in [
            Bytes::new(),
            Bytes::from_static(&[0, 0, 0]),
            enveloped(COMPRESSED, b"{}"),
            enveloped(END_STREAM, b"{}"),
            one.slice(..one.len() - 1),
            two.freeze(),
        ] {
            assert!(
                matches!(only_message(&refused), Err(DoorError::Shape(_))),
                "{refused:?}"
            );
        }
    }

    #[test]
    fn the_end_of_stream_carries_the_error_and_the_trailers_but_grpcs_own() {
        let mut trailers = HeaderMap::new();
        trailers.insert("grpc-status", HeaderValue::from_static("5"));
        trailers.insert("x-served-by", HeaderValue::from_static("a"));
        trailers.append("x-served-by", HeaderValue::from_static("b"));
        let end = end_stream(Some(&json!({"code": "not_found"})), &trailers);
        assert_eq!(end[0], END_STREAM);
        let len = u32::from_be_bytes([end[1], end[2], end[3], end[4]]) as usize;
        assert_eq!(end.len(), 5 + len);
        let value: Value = serde_json::from_slice(&end[5..]).unwrap();
        assert_eq!(
            value,
            json!({"error": {"code": "not_found"}, "metadata": {"x-served-by": ["a", "b"]}})
        );
        let clean = end_stream(None, &HeaderMap::new());
        assert_eq!(&clean[..], b"\x02\x00\x00\x00\x02{}");
    }

    #[test]
    fn only_connect_content_types_are_streamed_in_connect() {
        let with = |v: &'static str| {
            let mut h = HeaderMap::new();
            h.insert(header::CONTENT_TYPE, HeaderValue::from_static(v));
            h
        };
        assert!(is_connect_streaming(&with("application/connect+json")));
        assert!(is_connect_streaming(&with("Application/Connect+Proto")));
        assert!(is_connect_streaming(&with("application/connect+thrift")));
        assert!(!is_connect_streaming(&with("application/json")));
        assert_eq!(
            codec(&with("application/connect+json; charset=utf-8")),
            Some(Codec::Json)
        );
        assert_eq!(codec(&with("application/connect+thrift")), None);
    }
}

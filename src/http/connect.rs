//! The contract over plain HTTP in the Connect protocol's unary shape:
//! `POST /idempotency.v1.Coordinator/<Method>` with `Content-Type:
//! application/json` (canonical proto3 JSON, as grpcurl shows it) or
//! `application/proto`; `Connect-Protocol-Version: 1` accepted but not
//! required, so curl works as it is; `Connect-Timeout-Ms` becomes the
//! call's deadline. Connect-ES's `createConnectTransport` speaks it as is.
//!
//! Errors are Connect's JSON error (`code`, `message`, `details` with each
//! `google.rpc` detail's bytes in `value` and its JSON in `debug`), with
//! Connect's HTTP status for the code.
//!
//! Acquire answers 200 with its AcquireResponse whatever the decision
//! (decisions are data), with `Idempotent-Replayed: true` on ALREADY_DONE.
//! A caller that sends `Prefer: idempotency-http-status` gets the README's
//! gateway mapping instead: 409 with `Retry-After` for IN_PROGRESS and
//! RETRY_LATER, 422 for CONFLICT and EXHAUSTED (the body still the
//! AcquireResponse, and `Preference-Applied` says so).

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD_NO_PAD;
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt as _, Full};
use hyper::body::Incoming;
use prost::Message as _;
use serde_json::{Value, json};
use std::time::Duration;

use super::inprocess::Unary;
use super::{Asks, Door, DoorError, Media, json_response, parse_json};
use crate::proto::{self, Decision};
use crate::transport::{HttpBody, OpenCall};

/// The preference that asks for the gateway mapping of decisions.
pub const PREFER_HTTP_STATUS: &str = "idempotency-http-status";

/// What the Connect routes read.
pub(super) const JSON_OR_PROTO: &str = "application/json (or application/proto)";

/// The unary methods, with their request and response types.
const UNARY: [(&str, &str, &str); 11] = [
    ("Acquire", "AcquireRequest", "AcquireResponse"),
    ("Complete", "CompleteRequest", "CompleteResponse"),
    ("ExtendLease", "ExtendLeaseRequest", "ExtendLeaseResponse"),
    ("Get", "GetRequest", "GetResponse"),
    ("Sweep", "SweepRequest", "SweepResponse"),
    (
        "ReleaseLease",
        "ReleaseLeaseRequest",
        "ReleaseLeaseResponse",
    ),
    ("RetryNow", "RetryNowRequest", "RetryNowResponse"),
    (
        "FailPermanently",
        "FailPermanentlyRequest",
        "FailPermanentlyResponse",
    ),
    (
        "DeleteRecord",
        "DeleteRecordRequest",
        "DeleteRecordResponse",
    ),
    ("ListRecords", "ListRecordsRequest", "ListRecordsResponse"),
    ("Summarize", "SummarizeRequest", "SummarizeResponse"),
];

/// The server-streaming methods, answered as Server-Sent Events.
pub(super) const STREAMING: [(&str, &str, &str); 2] = [
    ("Watch", "WatchRequest", "WatchEvent"),
    ("WatchDue", "WatchDueRequest", "DueRecord"),
];

#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Codec {
    Json,
    Proto,
}

pub(super) fn codec(headers: &HeaderMap) -> Option<Codec> {
    let value = headers.get(header::CONTENT_TYPE)?.to_str().ok()?;
    let essence = value.split(';').next()?.trim().to_ascii_lowercase();
    match essence.as_str() {
        "application/json" => Some(Codec::Json),
        "application/proto" => Some(Codec::Proto),
        _ => None,
    }
}

/// `Connect-Timeout-Ms`: at most 10 digits.
pub(super) fn connect_timeout(headers: &HeaderMap) -> Option<Duration> {
    let value = headers.get("connect-timeout-ms")?.to_str().ok()?;
    if value.is_empty() || value.len() > 10 || !value.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    value.parse().ok().map(Duration::from_millis)
}

fn prefers_http_status(headers: &HeaderMap) -> bool {
    headers
        .get_all("prefer")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|p| p.trim().eq_ignore_ascii_case(PREFER_HTTP_STATUS))
}

pub(super) async fn serve(
    door: &Door,
    rpc: &str,
    request: Request<Incoming>,
    call: OpenCall,
) -> Response<HttpBody> {
    match answer(door, rpc, request, call).await {
        Ok(response) => response,
        Err(e) => refuse(door, &e),
    }
}

/// The caller and the codec, from the request's headers, unless they
/// refuse it.
fn admit(
    door: &Door,
    parts: &http::request::Parts,
) -> Result<(crate::auth::Caller, Codec), DoorError> {
    if parts.method != Method::POST {
        return Err(DoorError::MethodNotAllowed);
    }
    let caller = door.caller(&parts.headers)?;
    let codec = codec(&parts.headers).ok_or(DoorError::MediaType(JSON_OR_PROTO))?;
    Ok((caller, codec))
}

async fn answer(
    door: &Door,
    rpc: &str,
    request: Request<Incoming>,
    call: OpenCall,
) -> Result<Response<HttpBody>, DoorError> {
    let Some(&(method, input, output)) = UNARY.iter().find(|(name, ..)| *name == rpc) else {
        return Err(DoorError::NoRoute);
    };
    let (parts, body) = request.into_parts();
    let (caller, codec) = match admit(door, &parts) {
        Ok(admitted) => admitted,
        Err(e) => {
            // Refused from its headers alone: a little of the body is read
            // and dropped first, so that an HTTP/1.1 client still sending
            // it reads the refusal rather than a closed connection.
            super::discard::discard(body).await;
            return Err(e);
        }
    };
    let media = match codec {
        Codec::Json => Media::Json,
        Codec::Proto => Media::Proto,
    };
    let body = door.read_body(body, &parts, &caller, media).await?;
    let input = door
        .schema
        .message(&format!("idempotency.v1.{input}"))
        .ok_or(DoorError::NoRoute)?;
    let output = door
        .schema
        .message(&format!("idempotency.v1.{output}"))
        .ok_or(DoorError::NoRoute)?;
    let message = match codec {
        Codec::Json => {
            let schema = door.schema.clone();
            parse_json(&body, move |text| Ok(schema.json_to_proto(input, text)?)).await?
        }
        Codec::Proto => body.to_vec(),
    };
    // The body is protobuf now: its share of the budget goes back.
    drop(body);
    let head = Head {
        headers: &parts.headers,
        asks: Asks::caller(&caller),
        timeout: connect_timeout(&parts.headers),
        call,
    };
    let (answer, acquired) = dispatch(door, method, &message, head).await?;
    let mut status = StatusCode::OK;
    let mut extra = HeaderMap::new();
    if let Some(acquired) = acquired {
        decision_headers(
            &acquired,
            prefers_http_status(&parts.headers),
            &mut status,
            &mut extra,
        );
    }
    let mut response = match codec {
        Codec::Json => {
            let value = door.schema.proto_to_json(output, answer).map_err(|e| {
                tracing::error!(error = %e, "cannot write the answer as JSON");
                DoorError::Coordinator(tonic::Status::internal("cannot write the answer as JSON"))
            })?;
            json_response(status, &value)
        }
        Codec::Proto => {
            let mut response = Response::new(Full::new(answer).boxed_unsync());
            *response.status_mut() = status;
            response.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/proto"),
            );
            response
        }
    };
    response.headers_mut().extend(extra);
    Ok(response)
}

/// What a Connect call carries besides its message.
struct Head<'a> {
    headers: &'a HeaderMap,
    asks: Asks,
    timeout: Option<Duration>,
    call: OpenCall,
}

/// An Acquire's decision, for the answer's headers.
struct Decided {
    decision: Decision,
    retry_after: Option<prost_types::Duration>,
}

/// Calls `method` with `message` (its request's protobuf, as the caller
/// sent it or as its JSON reads) through admission's typed entry, the
/// service's own method answering; returns the answer's protobuf and, for
/// an Acquire, its decision.
async fn dispatch(
    door: &Door,
    method: &str,
    message: &[u8],
    head: Head<'_>,
) -> Result<(Bytes, Option<Decided>), DoorError> {
    async fn call<Q: Unary>(
        door: &Door,
        message: &[u8],
        head: Head<'_>,
    ) -> Result<Q::Answer, DoorError> {
        let request = Q::decode(message).map_err(|e| {
            DoorError::Shape(format!(
                "the body is not a valid {} request: {e}",
                Q::METHOD
            ))
        })?;
        let answer = door
            .unary(request, head.headers, head.asks, head.timeout, head.call)
            .await?;
        Ok(answer.into_inner())
    }
    fn bytes(message: &impl prost::Message) -> Bytes {
        Bytes::from(message.encode_to_vec())
    }
    use proto::*;
    Ok(match method {
        "Acquire" => {
            let acquired = call::<AcquireRequest>(door, message, head).await?;
            let decided = Decided {
                decision: acquired.decision(),
                retry_after: acquired.retry_after,
            };
            (bytes(&acquired), Some(decided))
        }
        "Complete" => (
            bytes(&call::<CompleteRequest>(door, message, head).await?),
            None,
        ),
        "ExtendLease" => (
            bytes(&call::<ExtendLeaseRequest>(door, message, head).await?),
            None,
        ),
        "Get" => (bytes(&call::<GetRequest>(door, message, head).await?), None),
        "Sweep" => (
            bytes(&call::<SweepRequest>(door, message, head).await?),
            None,
        ),
        "ReleaseLease" => (
            bytes(&call::<ReleaseLeaseRequest>(door, message, head).await?),
            None,
        ),
        "RetryNow" => (
            bytes(&call::<RetryNowRequest>(door, message, head).await?),
            None,
        ),
        "FailPermanently" => (
            bytes(&call::<FailPermanentlyRequest>(door, message, head).await?),
            None,
        ),
        "DeleteRecord" => (
            bytes(&call::<DeleteRecordRequest>(door, message, head).await?),
            None,
        ),
        "ListRecords" => (
            bytes(&call::<ListRecordsRequest>(door, message, head).await?),
            None,
        ),
        "Summarize" => (
            bytes(&call::<SummarizeRequest>(door, message, head).await?),
            None,
        ),
        _ => return Err(DoorError::NoRoute),
    })
}

/// The replay marker, and with HTTP semantics asked for, the gateway
/// mapping's status and `Retry-After`.
fn decision_headers(
    acquired: &Decided,
    http_semantics: bool,
    status: &mut StatusCode,
    headers: &mut HeaderMap,
) {
    let decision = acquired.decision;
    if decision == Decision::AlreadyDone {
        headers.insert("idempotent-replayed", HeaderValue::from_static("true"));
    }
    if !http_semantics {
        return;
    }
    headers.insert(
        "preference-applied",
        HeaderValue::from_static(PREFER_HTTP_STATUS),
    );
    match decision {
        Decision::InProgress | Decision::RetryLater => {
            *status = StatusCode::CONFLICT;
            let seconds = acquired.retry_after.map_or(0, retry_after_seconds);
            headers.insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        Decision::Conflict | Decision::Exhausted => *status = StatusCode::UNPROCESSABLE_ENTITY,
        Decision::Proceed | Decision::AlreadyDone | Decision::Unspecified => {}
    }
}

/// A duration rounded up to whole seconds.
pub(super) fn retry_after_seconds(d: prost_types::Duration) -> u64 {
    let seconds = d.seconds.max(0).unsigned_abs();
    if d.nanos > 0 { seconds + 1 } else { seconds }
}

/// Connect's name for a code.
fn connect_code(code: tonic::Code) -> &'static str {
    use tonic::Code;
    match code {
        Code::Ok => "ok",
        Code::Cancelled => "canceled",
        Code::Unknown => "unknown",
        Code::InvalidArgument => "invalid_argument",
        Code::DeadlineExceeded => "deadline_exceeded",
        Code::NotFound => "not_found",
        Code::AlreadyExists => "already_exists",
        Code::PermissionDenied => "permission_denied",
        Code::ResourceExhausted => "resource_exhausted",
        Code::FailedPrecondition => "failed_precondition",
        Code::Aborted => "aborted",
        Code::OutOfRange => "out_of_range",
        Code::Unimplemented => "unimplemented",
        Code::Internal => "internal",
        Code::Unavailable => "unavailable",
        Code::DataLoss => "data_loss",
        Code::Unauthenticated => "unauthenticated",
    }
}

/// Connect's JSON error. A refusal of the door's own carries an ErrorInfo
/// in `debug` only (no bytes to decode), so that the reason is always at
/// `details[].debug.reason`.
pub(super) fn refuse(door: &Door, error: &DoorError) -> Response<HttpBody> {
    super::log_refusal(door, error);
    let (_, status) = error.code_and_status();
    json_response(status, &error_json(&door.schema, error))
}

/// Connect's error JSON for `error`.
pub(super) fn error_json(schema: &super::json::Schema, error: &DoorError) -> Value {
    let (code, _) = error.code_and_status();
    let details: Vec<Value> = match error {
        DoorError::Coordinator(status) => {
            let decoded = tonic_types::pb::Status::decode(status.details()).unwrap_or_default();
            decoded
                .details
                .iter()
                .map(|any| {
                    let name = any.type_url.rsplit('/').next().unwrap_or_default();
                    let mut detail = json!({
                        "type": name,
                        "value": STANDARD_NO_PAD.encode(&any.value),
                    });
                    if let Some(debug) = schema.any_to_json(&any.type_url, &any.value) {
                        detail["debug"] = debug;
                    }
                    detail
                })
                .collect()
        }
        other => {
            let info = tonic_types::pb::ErrorInfo {
                reason: other.reason(),
                domain: crate::error::ERROR_DOMAIN.to_owned(),
                metadata: Default::default(),
            };
            vec![json!({
                "type": "google.rpc.ErrorInfo",
                "value": STANDARD_NO_PAD.encode(info.encode_to_vec()),
                "debug": {"reason": info.reason, "domain": info.domain},
            })]
        }
    };
    let mut body = json!({"code": connect_code(code), "message": error.to_string()});
    if !details.is_empty() {
        body["details"] = Value::Array(details);
    }
    body
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_rounds_up_to_seconds() {
        let d = |seconds, nanos| prost_types::Duration { seconds, nanos };
        assert_eq!(retry_after_seconds(d(0, 0)), 0);
        assert_eq!(retry_after_seconds(d(0, 1)), 1);
        assert_eq!(retry_after_seconds(d(4, 500_000_000)), 5);
        assert_eq!(retry_after_seconds(d(7, 0)), 7);
    }

    #[test]
    fn the_http_status_preference_is_found_among_others() {
        let mut h = HeaderMap::new();
        h.insert(
            "prefer",
            HeaderValue::from_static("respond-async, idempotency-http-status"),
        );
        assert!(prefers_http_status(&h));
        h.insert("prefer", HeaderValue::from_static("return=minimal"));
        assert!(!prefers_http_status(&h));
    }
}

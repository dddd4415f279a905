//! The workflow API: `POST /acquire`, `POST /complete` and `GET /health`
//! with the request and response shapes of the FastAPI idempotency service
//! that n8n workflows call from HTTP Request nodes, so such a workflow
//! switches to the coordinator by changing its base URL.
//!
//! Requests are read leniently, as n8n renders its expressions: a number
//! may arrive as a string of digits (`"attempt_count": "3"`), an empty
//! string (or null) stands for an absent field, and the flag
//! `return_lease_token` may be `true` or `"true"`. Everything else (bad
//! JSON, another type, an unknown field) is refused with 400 and the
//! error body every refusal of this API has:
//! `{"ok": false, "error": "...", "reason": "...", "field": "ttl_seconds"}`
//! (`field` only when one field is at fault).
//!
//! Decisions, mapped onto the four this API knows: PROCEED → PROCEED,
//! ALREADY_DONE → SKIP_ALREADY_DONE, IN_PROGRESS and RETRY_LATER →
//! RETRY_LATER, CONFLICT → CONFLICT, and EXHAUSTED → CONFLICT: a workflow
//! only goes on after PROCEED, and CONFLICT is the answer that asks for a
//! person to look, which a record out of attempts (or failed for good)
//! needs; retrying it would never succeed. Every answer also carries the
//! coordinator's own decision (`coordinator_decision`), `retry_after_seconds`
//! and `last_error` where they apply; clients of the old API ignore them.
//!
//! This API carries no lease token. Without one, `/complete` completes the
//! key's latest lease (read from the record just before): a holder whose
//! lease ran out and was taken over then completes the new holder's lease,
//! which the gRPC API's tokens prevent (no fencing). A caller that can carry
//! the token asks for it (`"return_lease_token": true` on `/acquire`) and
//! sends it back (`"lease_token"` on `/complete`), and then completes
//! exactly its own lease (409 `LEASE_LOST` when it was taken over).

use std::time::Duration;

use http::{HeaderMap, Request, Response, StatusCode};
use hyper::body::Incoming;
use serde_json::{Value, json};
use tonic::Code;
use tonic_health::pb::health_server::Health as _;

mod fields;

use fields::{Fields, field};

use super::connect::retry_after_seconds;
use super::connect::{Codec, codec};
use super::{Asks, Door, DoorError, HeldBody, Media, json_response, parse_json, violations};
use crate::auth::Caller;
use crate::domain::Status;
use crate::proto::{
    self, AcquireRequest, AcquireResponse, CompleteRequest, Decision, GetRequest,
    acquire_request::RequestFingerprint, complete_request::Outcome,
};
use crate::service::{CurrentLeaseToken, WantLeaseToken};
use crate::transport::{HttpBody, OpenCall};

/// The longest FAILED backoff, and the exponent's cap, of the old API:
/// `min(base_retry_seconds × 2^min(attempt_count, 6), 3600)`.
const MAX_BACKOFF_SECONDS: u64 = 3600;
const MAX_BACKOFF_EXPONENT: u64 = 6;
/// `base_retry_seconds` when the request leaves it out (the old API's
/// example value).
const DEFAULT_BASE_RETRY_SECONDS: u64 = 60;
/// How `/complete` `CONFLICT` marks the record's last error, so that the
/// record reads back as CONFLICT.
const CONFLICT_PREFIX: &str = "CONFLICT: ";

/// `/acquire` without a key. In n8n the commonest cause is a Webhook
/// trigger's data: it puts the POST body under `body`.
const ACQUIRE_KEY_HINT: &str = "is required: the business ID to run once, such as an order number (in n8n, a Webhook trigger puts the POST body under body: {{ $json.body.unique_id }}, not {{ $json.unique_id }})";
/// `/complete` without a key. In n8n, on an error branch `$json` is the
/// error, and a Webhook trigger's fields are under `body`.
const COMPLETE_KEY_HINT: &str = "is required: send the key the Acquire was for (in n8n, on an error branch $json is the error, so take the key from the node that received it, e.g. {{ $('Webhook').item.json.body.unique_id }} for a Webhook trigger)";

/// The old API's wait before retry number `attempt_count + 1`.
pub fn backoff_seconds(base: u64, attempt_count: u64) -> u64 {
    let factor = 1u64 << attempt_count.min(MAX_BACKOFF_EXPONENT);
    base.saturating_mul(factor).min(MAX_BACKOFF_SECONDS)
}

/// This API's name for a field of the contract.
fn our_name(proto_field: &str) -> &str {
    match proto_field {
        "key" => "idempotency_key",
        "fingerprint" | "request_fingerprint" => "payload_fingerprint",
        "lease_ttl" => "ttl_seconds",
        "failure.error" => "error_message",
        "failure.retry_after" => "base_retry_seconds",
        other => other,
    }
}

/// This API's error body; `status` is the record's status where known.
fn refusal(door: &Door, error: &DoorError, status: Option<&str>) -> Response<HttpBody> {
    super::log_refusal(door, error);
    let (code, mut http) = error.code_and_status();
    // A Complete of another kind than the holder's first: the record is in
    // a state that conflicts with the request.
    if code == Code::FailedPrecondition {
        http = StatusCode::CONFLICT;
    }
    let (message, field) = match error {
        DoorError::Field { field, .. } => (error.to_string(), Some(field.clone())),
        DoorError::Coordinator(status) => match violations(status).first() {
            Some((f, description)) => {
                let ours = our_name(f);
                (format!("{ours}: {description}"), Some(ours.to_owned()))
            }
            None => (status.message().to_owned(), None),
        },
        other => (other.to_string(), None),
    };
    let mut body = json!({"ok": false, "error": message, "reason": error.reason()});
    if let Some(field) = field {
        body["field"] = Value::String(field);
    }
    if let Some(status) = status {
        body["status"] = Value::String(status.to_owned());
    }
    json_response(http, &body)
}

pub(super) fn refuse(door: &Door, error: &DoorError) -> Response<HttpBody> {
    refusal(door, error, None)
}

/// The old API's status of a record.
fn old_status(status: Status, last_error: &str) -> &'static str {
    match status {
        Status::Processing => "PROCESSING",
        Status::Succeeded => "DONE",
        Status::Failed => "FAILED",
        Status::FailedPermanent if last_error.starts_with(CONFLICT_PREFIX) => "CONFLICT",
        Status::FailedPermanent => "FAILED",
    }
}

fn old_status_of(record: &proto::Record) -> &'static str {
    let status = match record.status() {
        proto::Status::Processing => Status::Processing,
        proto::Status::Succeeded => Status::Succeeded,
        proto::Status::Failed => Status::Failed,
        proto::Status::FailedPermanent | proto::Status::Unspecified => Status::FailedPermanent,
    };
    old_status(status, &record.last_error)
}

fn rfc3339(t: Option<&prost_types::Timestamp>) -> Value {
    t.and_then(|t| chrono::DateTime::from_timestamp(t.seconds, u32::try_from(t.nanos).unwrap_or(0)))
        .map_or(Value::Null, |t| {
            Value::String(t.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true))
        })
}

/// The checks of `/acquire` and `/complete` on their headers (not
/// cross-site, credentials, `Content-Type: application/json`: a browser
/// sends the other types cross-site without asking first), then the body,
/// read under the budget.
async fn json_request(
    door: &Door,
    request: Request<Incoming>,
) -> Result<(http::request::Parts, Caller, HeldBody), DoorError> {
    let caller = door.caller(request.headers())?;
    if codec(request.headers()) != Some(Codec::Json) {
        return Err(DoorError::MediaType("application/json"));
    }
    let (parts, body) = request.into_parts();
    let body = door.read_body(body, &parts, &caller, Media::Json).await?;
    Ok((parts, caller, body))
}

const ACQUIRE_FIELDS: [&str; 6] = [
    "scope",
    "idempotency_key",
    "payload_fingerprint",
    "ttl_seconds",
    "max_attempts",
    "return_lease_token",
];

pub(super) async fn acquire(
    door: &Door,
    request: Request<Incoming>,
    call: OpenCall,
) -> Response<HttpBody> {
    match try_acquire(door, request, call).await {
        Ok(response) => response,
        Err(e) => refuse(door, &e),
    }
}

async fn try_acquire(
    door: &Door,
    request: Request<Incoming>,
    call: OpenCall,
) -> Result<Response<HttpBody>, DoorError> {
    let (parts, caller, body) = json_request(door, request).await?;
    let fields = parse_json(&body, |text| Fields::parse(text, &ACQUIRE_FIELDS)).await?;
    // The fields are read: the body's share of the budget goes back.
    drop(body);
    let ttl = fields
        .number("ttl_seconds")?
        .map(|s| {
            // The contract reads a zero lease as "the default"; here it can
            // only be a mistake.
            if s == 0 {
                return Err(field("ttl_seconds", "must be at least 1"));
            }
            i64::try_from(s)
                .map(|seconds| prost_types::Duration { seconds, nanos: 0 })
                .map_err(|_| field("ttl_seconds", "is too large"))
        })
        .transpose()?;
    let max_attempts = match fields.number("max_attempts")? {
        None => 0,
        Some(n) => u32::try_from(n).map_err(|_| field("max_attempts", "is too large"))?,
    };
    let acquire = AcquireRequest {
        scope: fields.string("scope")?.unwrap_or_default(),
        key: fields
            .string("idempotency_key")?
            .ok_or_else(|| field("idempotency_key", ACQUIRE_KEY_HINT))?,
        request_fingerprint: fields
            .string("payload_fingerprint")?
            .map(RequestFingerprint::Fingerprint),
        lease_ttl: ttl,
        max_attempts,
        ..AcquireRequest::default()
    };
    let return_token = fields.flag("return_lease_token")?;
    let acquired = door
        .unary(acquire, &parts.headers, Asks::caller(&caller), None, call)
        .await?
        .into_inner();
    Ok(json_response(
        StatusCode::OK,
        &acquire_answer(&acquired, return_token),
    ))
}

fn acquire_answer(acquired: &AcquireResponse, return_token: bool) -> Value {
    let decision = acquired.decision();
    let (ours, theirs) = match decision {
        Decision::Proceed => ("PROCEED", "PROCEED"),
        Decision::AlreadyDone => ("SKIP_ALREADY_DONE", "ALREADY_DONE"),
        Decision::InProgress => ("RETRY_LATER", "IN_PROGRESS"),
        Decision::RetryLater => ("RETRY_LATER", "RETRY_LATER"),
        Decision::Conflict => ("CONFLICT", "CONFLICT"),
        Decision::Exhausted | Decision::Unspecified => ("CONFLICT", "EXHAUSTED"),
    };
    let record = acquired.record.clone().unwrap_or_default();
    let lease = acquired
        .lease
        .as_ref()
        .filter(|_| decision == Decision::Proceed);
    let mut answer = json!({
        "decision": ours,
        "attempt_count": record.attempt_count,
        "lock_expires_at": rfc3339(lease.and_then(|l| l.expires_at.as_ref())),
        "coordinator_decision": theirs,
        "status": old_status_of(&record),
    });
    if let Some(retry_after) = acquired.retry_after {
        answer["retry_after_seconds"] = json!(retry_after_seconds(retry_after));
    }
    if !record.last_error.is_empty() {
        answer["last_error"] = Value::String(record.last_error.clone());
    }
    if return_token && let Some(lease) = lease {
        answer["lease_token"] = Value::String(lease.token.clone());
    }
    answer
}

const COMPLETE_FIELDS: [&str; 7] = [
    "scope",
    "idempotency_key",
    "final_status",
    "error_message",
    "attempt_count",
    "base_retry_seconds",
    "lease_token",
];

#[derive(Clone, Copy, PartialEq, Eq)]
enum FinalStatus {
    Done,
    Failed,
    Conflict,
}

impl FinalStatus {
    fn name(self) -> &'static str {
        match self {
            FinalStatus::Done => "DONE",
            FinalStatus::Failed => "FAILED",
            FinalStatus::Conflict => "CONFLICT",
        }
    }
}

pub(super) async fn complete(
    door: &Door,
    request: Request<Incoming>,
    call: OpenCall,
) -> Response<HttpBody> {
    let mut known = None;
    match try_complete(door, request, call, &mut known).await {
        Ok(response) => response,
        Err(e) => refusal(door, &e, known),
    }
}

async fn try_complete(
    door: &Door,
    request: Request<Incoming>,
    call: OpenCall,
    known: &mut Option<&'static str>,
) -> Result<Response<HttpBody>, DoorError> {
    let (parts, caller, body) = json_request(door, request).await?;
    let fields = parse_json(&body, |text| Fields::parse(text, &COMPLETE_FIELDS)).await?;
    // The fields are read: the body's share of the budget goes back.
    drop(body);
    let scope = fields.required("scope")?;
    let key = fields
        .string("idempotency_key")?
        .ok_or_else(|| field("idempotency_key", COMPLETE_KEY_HINT))?;
    let final_status = match fields.required("final_status")?.as_str() {
        "DONE" => FinalStatus::Done,
        "FAILED" => FinalStatus::Failed,
        "CONFLICT" => FinalStatus::Conflict,
        _ => return Err(field("final_status", "must be DONE, FAILED or CONFLICT")),
    };
    let error_message = fields.string("error_message")?.unwrap_or_default();
    let attempt_count = fields.number("attempt_count")?;
    let base = fields
        .number("base_retry_seconds")?
        .unwrap_or(DEFAULT_BASE_RETRY_SECONDS);
    let token = fields.string("lease_token")?;

    // Without a token, the key's latest lease; without an attempt count for
    // a failure's backoff, the record's.
    let record = if token.is_none()
        || (final_status == FinalStatus::Failed && attempt_count.is_none())
    {
        let get = GetRequest {
            scope: scope.clone(),
            key: key.clone(),
        };
        let (record, current) = latest(door, &parts.headers, &caller, get, call.another()).await?;
        *known = Some(old_status_of(&record));
        Some((record, current))
    } else {
        None
    };
    let token = match (token, &record) {
        (Some(token), _) => token,
        (None, Some((_, current))) => current.clone(),
        (None, None) => String::new(),
    };
    let record = record.map(|(record, _)| record);
    let attempt_count = attempt_count
        .or_else(|| record.as_ref().map(|r| u64::from(r.attempt_count)))
        .unwrap_or(0);
    let delay = backoff_seconds(base, attempt_count);
    let outcome = match final_status {
        FinalStatus::Done => Outcome::Success(proto::Success::default()),
        FinalStatus::Failed => Outcome::Failure(proto::Failure {
            error: error_message,
            permanent: false,
            retry_after: Some(prost_types::Duration {
                seconds: i64::try_from(delay).unwrap_or(i64::MAX),
                nanos: 0,
            }),
        }),
        FinalStatus::Conflict => Outcome::Failure(proto::Failure {
            error: format!("{CONFLICT_PREFIX}{error_message}"),
            permanent: true,
            retry_after: None,
        }),
    };
    let complete = CompleteRequest {
        scope,
        key,
        lease_token: token,
        outcome: Some(outcome),
    };
    let completed = door
        .unary(complete, &parts.headers, Asks::caller(&caller), None, call)
        .await?
        .into_inner();
    let record = completed.record.unwrap_or_default();
    // The coordinator's own status says what the seed's vocabulary cannot:
    // a FAILED on the last attempt is FAILED_PERMANENT, and is not retried.
    let coordinator_status = record.status().as_str_name();
    let mut body = json!({
        "ok": true,
        "status": final_status.name(),
        "attempt_count": record.attempt_count,
        "record_status": old_status_of(&record),
        "coordinator_status": coordinator_status.strip_prefix("STATUS_").unwrap_or(coordinator_status),
    });
    if final_status == FinalStatus::Failed && record.status() == proto::Status::Failed {
        body["retry_after_seconds"] = json!(delay);
        body["next_retry_at"] = rfc3339(record.next_retry_at.as_ref());
    }
    Ok(json_response(StatusCode::OK, &body))
}

/// The caller's record for `scope` and `key`, as it stands, and its current
/// lease token: a Get through admission like any other call, which also
/// asks the service for the token ([`WantLeaseToken`]).
async fn latest(
    door: &Door,
    headers: &HeaderMap,
    caller: &Caller,
    get: GetRequest,
    call: OpenCall,
) -> Result<(proto::Record, String), DoorError> {
    let answer = door
        .unary(
            get,
            headers,
            Asks::caller(caller).with(WantLeaseToken),
            None,
            call,
        )
        .await?;
    let token = answer
        .extensions()
        .get::<CurrentLeaseToken>()
        .map(|token| token.0.clone())
        .unwrap_or_default();
    let record = answer.into_inner().record.unwrap_or_default();
    Ok((record, token))
}

/// The health service's Check, which `/health` asks.
const HEALTH_CHECK_PATH: &str = "/grpc.health.v1.Health/Check";

pub(super) async fn health(
    door: &Door,
    request: &Request<Incoming>,
    call: OpenCall,
) -> Response<HttpBody> {
    let check = tonic_health::pb::HealthCheckRequest {
        service: "idempotency.v1.Coordinator".to_owned(),
    };
    let serving = door
        .call_typed(
            HEALTH_CHECK_PATH,
            check,
            request.headers(),
            Asks::default(),
            Some(Duration::from_secs(5)),
            call,
            |request| door.health.check(request),
        )
        .await
        .is_ok_and(|answer| {
            answer.get_ref().status()
                == tonic_health::pb::health_check_response::ServingStatus::Serving
        });
    if serving {
        json_response(StatusCode::OK, &json!({"status": "ok", "db": "connected"}))
    } else {
        json_response(
            StatusCode::SERVICE_UNAVAILABLE,
            &json!({"status": "unavailable", "db": "disconnected"}),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_follows_the_old_apis_formula() {
        let seconds: Vec<u64> = (0..=8).map(|a| backoff_seconds(60, a)).collect();
        assert_eq!(seconds, [60, 120, 240, 480, 960, 1920, 3600, 3600, 3600]);
        assert_eq!(backoff_seconds(10, 6), 640);
        assert_eq!(backoff_seconds(u64::MAX, 3), 3600);
    }
}

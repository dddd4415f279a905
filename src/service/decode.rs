//! Requests into validated commands. Every field is checked and every
//! violation reported at once, named as in the proto, so a caller fixes its
//! request in one go.

use std::time::Duration;

use crate::domain::{
    AcquireCommand, CompleteCommand, ErrorText, ExtendCommand, Fingerprint, InvalidInput, Key,
    LeaseToken, Outcome, Policy, RecordId, RequestId, Scope, StoredResult, Tenant,
};
use crate::error::{Error, Violation};
use crate::proto;
use crate::proto::acquire_request::RequestFingerprint;
use crate::proto::complete_request::Outcome as ProtoOutcome;

/// The longest `content_type` stored with a result.
const MAX_CONTENT_TYPE_CHARS: usize = 255;
/// The longest `result_ref` stored with a result.
const MAX_RESULT_REF_CHARS: usize = 2048;

/// Collects violations while fields are checked.
#[derive(Default)]
struct Violations(Vec<Violation>);

impl Violations {
    fn check<T>(&mut self, field: &str, result: Result<T, InvalidInput>) -> Option<T> {
        result
            .map_err(|e| {
                self.0.push(Violation {
                    field: field.to_owned(),
                    description: e.0,
                })
            })
            .ok()
    }

    fn into_error(self) -> Error {
        Error::InvalidArgument(self.0)
    }
}

/// A protobuf Duration as a std one; `None` when unset.
fn duration(value: Option<prost_types::Duration>) -> Result<Option<Duration>, InvalidInput> {
    let Some(d) = value else { return Ok(None) };
    if d.seconds < 0 || d.nanos < 0 {
        return Err(InvalidInput("must not be negative".to_owned()));
    }
    if d.nanos > 999_999_999 {
        return Err(InvalidInput(
            "is not a valid duration (nanos above 999,999,999)".to_owned(),
        ));
    }
    Ok(Some(Duration::new(
        d.seconds.unsigned_abs(),
        d.nanos.unsigned_abs(),
    )))
}

/// Like [`duration`], with zero meaning "unset".
fn optional_duration(
    value: Option<prost_types::Duration>,
) -> Result<Option<Duration>, InvalidInput> {
    Ok(duration(value)?.filter(|d| !d.is_zero()))
}

fn text_limit(value: &str, max: usize) -> Result<(), InvalidInput> {
    no_nul(value)?;
    let chars = value.chars().count();
    if chars > max {
        return Err(InvalidInput(format!(
            "must be at most {max} characters, got {chars}"
        )));
    }
    Ok(())
}

/// PostgreSQL text cannot hold NUL characters.
fn no_nul(value: &str) -> Result<(), InvalidInput> {
    if value.contains('\0') {
        return Err(InvalidInput("must not contain NUL characters".to_owned()));
    }
    Ok(())
}

fn record_id(v: &mut Violations, tenant: Tenant, scope: String, key: String) -> Option<RecordId> {
    let scope = v.check("scope", Scope::try_from(scope));
    let key = v.check("key", Key::try_from(key));
    Some(RecordId {
        tenant,
        scope: scope?,
        key: key?,
    })
}

/// `json_payload`s longer than this are canonicalised on the blocking
/// pool ([`json_fingerprint`]) rather than on an async worker.
pub const INLINE_JSON_BYTES: usize = 16 * 1024;

/// Large JSON canonicalisations running at once, at most; more wait their
/// turn without holding a thread.
static JSON_WORK: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(2);

/// The fingerprint of a large `json_payload`, computed on the blocking pool
/// behind [`JSON_WORK`], so that one caller's large JSON never stalls the
/// workers that answer everyone else.
pub async fn json_fingerprint(text: String) -> Result<Fingerprint, InvalidInput> {
    let _turn = JSON_WORK.acquire().await.expect("never closed");
    tokio::task::spawn_blocking(move || Fingerprint::of_json(&text))
        .await
        .unwrap_or_else(|_| Err(InvalidInput("cannot be canonicalised".to_owned())))
}

#[cfg(test)]
pub fn acquire(
    tenant: Tenant,
    req: proto::AcquireRequest,
    policy: &Policy,
) -> Result<AcquireCommand, Error> {
    acquire_with(tenant, req, policy, None)
}

/// An Acquire decoded, with the `json_payload`'s fingerprint already computed
/// (when `json` is given, the request's own `json_payload` is not read).
pub fn acquire_with(
    tenant: Tenant,
    req: proto::AcquireRequest,
    policy: &Policy,
    json: Option<Result<Fingerprint, InvalidInput>>,
) -> Result<AcquireCommand, Error> {
    let mut v = Violations::default();
    let id = record_id(&mut v, tenant, req.scope, req.key);
    let fingerprint = match req.request_fingerprint {
        None => Some(Fingerprint::default()),
        Some(RequestFingerprint::Fingerprint(f)) => {
            v.check("fingerprint", Fingerprint::from_client(f))
        }
        Some(RequestFingerprint::Payload(bytes)) => Some(Fingerprint::of_payload(&bytes)),
        Some(RequestFingerprint::JsonPayload(text)) => v.check(
            "json_payload",
            json.unwrap_or_else(|| Fingerprint::of_json(&text)),
        ),
    };
    let lease_ttl = v.check(
        "lease_ttl",
        optional_duration(req.lease_ttl).and_then(|d| policy.lease_ttl(d)),
    );
    let max_attempts = v.check("max_attempts", policy.max_attempts(req.max_attempts));
    let retention = v.check(
        "retention",
        optional_duration(req.retention).and_then(|d| policy.retention(d)),
    );
    let wait = v.check("wait", duration(req.wait).map(|d| policy.wait(d)));
    let request_id = v.check("request_id", RequestId::try_from(req.request_id));

    let (Some(id), Some(fingerprint), Some(lease_ttl), Some(max_attempts), Some(retention)) =
        (id, fingerprint, lease_ttl, max_attempts, retention)
    else {
        return Err(v.into_error());
    };
    let (Some(wait), Some(request_id)) = (wait, request_id) else {
        return Err(v.into_error());
    };
    Ok(AcquireCommand {
        id,
        fingerprint,
        request_id,
        lease_ttl,
        max_attempts,
        retention,
        wait,
        answer_by: None,
    })
}

fn success(v: &mut Violations, s: proto::Success, policy: &Policy) -> Option<Outcome> {
    let result = v.check("success.result", policy.result_size(s.result.len()));
    let content_type = v.check(
        "success.content_type",
        text_limit(&s.content_type, MAX_CONTENT_TYPE_CHARS),
    );
    let result_ref = v.check(
        "success.result_ref",
        text_limit(&s.result_ref, MAX_RESULT_REF_CHARS),
    );
    result?;
    content_type?;
    result_ref?;
    Some(Outcome::Success(StoredResult {
        result: s.result,
        content_type: s.content_type,
        status_code: s.status_code,
        result_ref: s.result_ref,
    }))
}

pub fn complete(
    tenant: Tenant,
    req: proto::CompleteRequest,
    policy: &Policy,
) -> Result<CompleteCommand, Error> {
    let mut v = Violations::default();
    let id = record_id(&mut v, tenant, req.scope, req.key);
    let token = v.check("lease_token", LeaseToken::try_from(req.lease_token));
    let outcome = match req.outcome {
        None => v.check(
            "outcome",
            Err(InvalidInput(
                "exactly one of success, failure or release is required".to_owned(),
            )),
        ),
        Some(ProtoOutcome::Success(s)) => success(&mut v, s, policy),
        Some(ProtoOutcome::Failure(f)) => {
            let error = v.check("failure.error", no_nul(&f.error));
            let retry_after = v.check(
                "failure.retry_after",
                duration(f.retry_after).and_then(|d| d.map(|d| policy.retry_after(d)).transpose()),
            );
            error.and(retry_after).map(|retry_after| Outcome::Failure {
                error: ErrorText::new(f.error),
                permanent: f.permanent,
                retry_after,
            })
        }
        Some(ProtoOutcome::Release(proto::Release {})) => Some(Outcome::Release),
    };
    let (Some(id), Some(token), Some(outcome)) = (id, token, outcome) else {
        return Err(v.into_error());
    };
    Ok(CompleteCommand { id, token, outcome })
}

pub fn extend_lease(
    tenant: Tenant,
    req: proto::ExtendLeaseRequest,
    policy: &Policy,
) -> Result<ExtendCommand, Error> {
    let mut v = Violations::default();
    let id = record_id(&mut v, tenant, req.scope, req.key);
    let token = v.check("lease_token", LeaseToken::try_from(req.lease_token));
    let extend_by = v.check(
        "extend_by",
        optional_duration(req.extend_by).and_then(|d| policy.extend_by(d)),
    );
    let checkpoint = match req.checkpoint {
        None => Some(None),
        Some(bytes) => v
            .check("checkpoint", policy.checkpoint_size(bytes.len()))
            .map(|()| Some(bytes)),
    };
    let (Some(id), Some(token), Some(extend_by), Some(checkpoint)) =
        (id, token, extend_by, checkpoint)
    else {
        return Err(v.into_error());
    };
    Ok(ExtendCommand {
        id,
        token,
        extend_by,
        checkpoint,
    })
}

pub fn get(tenant: Tenant, req: proto::GetRequest) -> Result<RecordId, Error> {
    let mut v = Violations::default();
    record_id(&mut v, tenant, req.scope, req.key).ok_or_else(|| v.into_error())
}

/// The record to follow and for how long (before the call's deadline).
pub fn watch(
    tenant: Tenant,
    req: proto::WatchRequest,
    policy: &Policy,
) -> Result<(RecordId, Duration), Error> {
    let mut v = Violations::default();
    let id = record_id(&mut v, tenant, req.scope, req.key);
    let window = v.check(
        "timeout",
        optional_duration(req.timeout).map(|d| policy.watch_window(d)),
    );
    match (id, window) {
        (Some(id), Some(window)) => Ok((id, window)),
        _ => Err(v.into_error()),
    }
}

pub fn watch_due(req: proto::WatchDueRequest) -> Result<Scope, Error> {
    let mut v = Violations::default();
    v.check("scope", Scope::try_from(req.scope))
        .ok_or_else(|| v.into_error())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request() -> proto::AcquireRequest {
        proto::AcquireRequest {
            scope: "s".into(),
            key: "k".into(),
            ..Default::default()
        }
    }

    fn fields(error: Error) -> Vec<String> {
        match error {
            Error::InvalidArgument(v) => v.into_iter().map(|v| v.field).collect(),
            other => panic!("expected InvalidArgument, got {other:?}"),
        }
    }

    #[test]
    fn every_bad_field_is_reported_at_once() {
        let req = proto::AcquireRequest {
            scope: "a*b".into(),
            key: String::new(),
            lease_ttl: Some(prost_types::Duration {
                seconds: -1,
                nanos: 0,
            }),
            max_attempts: 5000,
            ..request()
        };
        let error = acquire(Tenant::default_tenant(), req, &Policy::default()).unwrap_err();
        assert_eq!(fields(error), ["scope", "key", "lease_ttl", "max_attempts"]);
    }

    #[test]
    fn unset_durations_take_the_policy_defaults() {
        let cmd = acquire(Tenant::default_tenant(), request(), &Policy::default()).unwrap();
        assert_eq!(cmd.lease_ttl, Duration::from_secs(900));
        assert_eq!(cmd.retention, Duration::from_secs(86400));
        assert_eq!(cmd.max_attempts, 10);
        assert_eq!(cmd.wait, Duration::ZERO);
    }

    #[test]
    fn a_complete_without_an_outcome_names_the_outcome_field() {
        let req = proto::CompleteRequest {
            scope: "s".into(),
            key: "k".into(),
            lease_token: uuid::Uuid::nil().to_string(),
            outcome: None,
        };
        let error = complete(Tenant::default_tenant(), req, &Policy::default()).unwrap_err();
        assert_eq!(fields(error), ["outcome"]);
    }
}

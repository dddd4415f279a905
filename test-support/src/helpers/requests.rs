//! Requests with defaults for unnamed fields, readers of answers and errors, short call runs.

use std::time::Duration;

use idempotency_coordinator::proto::coordinator_client::CoordinatorClient;
use idempotency_coordinator::proto::{self, acquire_request, complete_request};
use tonic::transport::Channel;

use super::server::TestApp;

// Request builders: the fields a test does not name take their defaults.

pub fn acquire(scope: &str, key: &str) -> proto::AcquireRequest {
    proto::AcquireRequest {
        scope: scope.into(),
        key: key.into(),
        ..Default::default()
    }
}

pub fn with_fingerprint(mut req: proto::AcquireRequest, fp: &str) -> proto::AcquireRequest {
    req.request_fingerprint = Some(acquire_request::RequestFingerprint::Fingerprint(fp.into()));
    req
}

pub fn secs(s: i64) -> Option<prost_types::Duration> {
    Some(prost_types::Duration {
        seconds: s,
        nanos: 0,
    })
}

pub fn success(result: &[u8]) -> complete_request::Outcome {
    complete_request::Outcome::Success(proto::Success {
        result: result.to_vec(),
        content_type: "application/json".into(),
        status_code: 201,
        result_ref: String::new(),
    })
}

pub fn failure(error: &str) -> complete_request::Outcome {
    complete_request::Outcome::Failure(proto::Failure {
        error: error.into(),
        permanent: false,
        retry_after: None,
    })
}

pub fn complete(
    scope: &str,
    key: &str,
    token: &str,
    outcome: complete_request::Outcome,
) -> proto::CompleteRequest {
    proto::CompleteRequest {
        scope: scope.into(),
        key: key.into(),
        lease_token: token.into(),
        outcome: Some(outcome),
    }
}

pub fn decision(resp: &proto::AcquireResponse) -> proto::Decision {
    proto::Decision::try_from(resp.decision).expect("known decision")
}

pub fn status_of(record: &proto::Record) -> proto::Status {
    proto::Status::try_from(record.status).expect("known status")
}

/// The ErrorInfo reason of a failed call.
pub fn reason(status: &tonic::Status) -> String {
    use tonic_types::StatusExt;
    status
        .get_error_details()
        .error_info()
        .map(|i| i.reason.clone())
        .unwrap_or_default()
}

/// The fields a BadRequest names.
pub fn bad_fields(status: &tonic::Status) -> Vec<String> {
    use tonic_types::StatusExt;
    status
        .get_error_details()
        .bad_request()
        .map(|b| b.field_violations.iter().map(|v| v.field.clone()).collect())
        .unwrap_or_default()
}

/// Seconds between two timestamps, as a float.
pub fn seconds_between(a: &prost_types::Timestamp, b: &prost_types::Timestamp) -> f64 {
    (b.seconds - a.seconds) as f64 + f64::from(b.nanos - a.nanos) / 1e9
}

/// PROCEEDs on a fresh key and returns the lease's token.
pub async fn proceed(
    client: &mut CoordinatorClient<Channel>,
    req: proto::AcquireRequest,
) -> proto::AcquireResponse {
    let resp = client.acquire(req).await.expect("acquire").into_inner();
    assert_eq!(decision(&resp), proto::Decision::Proceed, "{resp:?}");
    resp
}

pub fn token(resp: &proto::AcquireResponse) -> String {
    resp.lease.as_ref().expect("lease").token.clone()
}

pub fn get_req(scope: &str, key: &str) -> proto::GetRequest {
    proto::GetRequest {
        scope: scope.into(),
        key: key.into(),
    }
}

pub fn waiting(scope: &str, key: &str, wait_secs: i64) -> proto::AcquireRequest {
    proto::AcquireRequest {
        wait: secs(wait_secs),
        ..acquire(scope, key)
    }
}

/// The record as Get returns it; the call must succeed.
pub async fn get_record(
    c: &mut CoordinatorClient<Channel>,
    req: proto::GetRequest,
) -> proto::Record {
    c.get(req)
        .await
        .expect("get")
        .into_inner()
        .record
        .expect("record")
}

/// The record as a successful Complete returns it.
pub async fn complete_ok(
    c: &mut CoordinatorClient<Channel>,
    req: proto::CompleteRequest,
) -> proto::Record {
    c.complete(req)
        .await
        .expect("complete")
        .into_inner()
        .record
        .expect("record")
}

pub fn sweep_req(dry_run: bool, limit: u32) -> proto::SweepRequest {
    proto::SweepRequest { dry_run, limit }
}

/// A holder of (s, k) whose 5 s lease ran out and was taken over: returns
/// the stale holder's answer and the new holder's.
pub async fn taken_over(app: &TestApp) -> (proto::AcquireResponse, proto::AcquireResponse) {
    let mut c = app.client.clone();
    let mut req = acquire("s", "k");
    req.lease_ttl = secs(5);
    let stale = proceed(&mut c, req.clone()).await;
    app.clock.advance(Duration::from_secs(6));
    let fresh = proceed(&mut c, req).await;
    (stale, fresh)
}

//! A lost reply: the first Acquire reaches the server, which grants the
//! lease, but its response is dropped on the way back and the caller sees
//! UNAVAILABLE. The retry, with the same request id, gets the same lease.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use http_body_util::BodyExt as _;
use idempotency_client::proto::{AcquireResponse, Decision, Status};
use idempotency_client::{Client, ClientOptions, Fingerprint, RunOptions, WorkError};
use prost::Message as _;
use tonic::body::Body;
use tonic::transport::Channel;

use crate::support::*;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A channel that lets the first Acquire through, reads the server's reply,
/// and answers the caller UNAVAILABLE instead.
#[derive(Clone)]
struct LoseFirstAcquireReply {
    inner: Channel,
    acquires: Arc<AtomicU32>,
    lost: Arc<Mutex<Option<AcquireResponse>>>,
}

impl tower_service::Service<http::Request<Body>> for LoseFirstAcquireReply {
    type Response = http::Response<Body>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let first = request.uri().path() == "/idempotency.v1.Coordinator/Acquire"
            && self.acquires.fetch_add(1, Ordering::SeqCst) == 0;
        let response = self.inner.call(request);
        let lost = Arc::clone(&self.lost);
        Box::pin(async move {
            let response = response.await?;
            if !first {
                return Ok(response);
            }
            // The server answered (and so granted the lease): keep what it
            // said, for the test, and lose it.
            let body = response.into_body().collect().await?.to_bytes();
            let message = AcquireResponse::decode(&body[5..])?; // past gRPC's frame header
            *lost.lock().unwrap() = Some(message);
            Err(Box::new(tonic::Status::unavailable("the reply was lost on the way")) as BoxError)
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_acquire_reply_is_recovered_with_the_same_request_id() {
    let fixture = Fixture::start().await;
    let channel = Channel::from_shared(fixture.endpoint())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let transport = LoseFirstAcquireReply {
        inner: channel,
        acquires: Arc::new(AtomicU32::new(0)),
        lost: Arc::new(Mutex::new(None)),
    };
    let client = Client::from_service(transport.clone(), ClientOptions::default()).unwrap();
    let key = fresh_key();
    let runs = AtomicU32::new(0);
    let granted = Mutex::new(None);
    let (runs_ref, granted_ref) = (&runs, &granted);

    let done = within(
        "run_once",
        Duration::from_secs(30),
        client.run_once(
            "payments.charge",
            &key,
            Fingerprint::None,
            &RunOptions::default(),
            |lease| async move {
                runs_ref.fetch_add(1, Ordering::SeqCst);
                *granted_ref.lock().unwrap() = Some((
                    lease.token().to_owned(),
                    lease.attempt(),
                    lease.fencing_token(),
                ));
                Ok::<_, WorkError<String>>("charged".to_owned())
            },
        ),
    )
    .await
    .expect("the retry gets the lease the lost reply carried");

    assert!(!done.replayed);
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the work ran once");
    assert_eq!(
        transport.acquires.load(Ordering::SeqCst),
        2,
        "the lost Acquire and its retry"
    );
    let lost = transport
        .lost
        .lock()
        .unwrap()
        .take()
        .expect("a reply was lost");
    assert_eq!(
        lost.decision(),
        Decision::Proceed,
        "the lost reply granted the lease"
    );
    let lost_lease = lost.lease.expect("the lost lease");
    let (token, attempt, fencing) = granted.lock().unwrap().take().unwrap();
    assert_eq!(token, lost_lease.token, "the same lease came back");
    assert_eq!(attempt, 1);
    assert_eq!(fencing, lost_lease.fencing_token);

    let record = fixture.record("payments.charge", &key).await;
    assert_eq!(record.status(), Status::Succeeded);
    assert_eq!(record.attempt_count, 1, "no second lease");
}

//! Clients that send a deadline (grpc-timeout) and let the server answer it:
//! tonic's own Channel would end the call itself at the deadline, with
//! CANCELLED, and hide what the server does. Every call is recorded in a
//! history; a call the server never answers is given up on a little after
//! its deadline and recorded as NO_ANSWER.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use hyper::client::conn::http2::SendRequest;
use hyper_util::rt::{TokioExecutor, TokioIo};
use idempotency_bench::history::Entry;
use idempotency_bench::recorder::{self, Timing};
use idempotency_coordinator::proto;
use idempotency_coordinator::proto::coordinator_client::CoordinatorClient;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};

/// One HTTP/2 connection, as a tower service tonic's clients can use.
#[derive(Clone)]
pub struct H2(SendRequest<tonic::body::Body>);

impl tower_service::Service<http::Request<tonic::body::Body>> for H2 {
    type Response = http::Response<hyper::body::Incoming>;
    type Error = hyper::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, hyper::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), hyper::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
        Box::pin(self.0.send_request(req))
    }
}

pub async fn h2(addr: SocketAddr) -> H2 {
    let stream = tokio::net::TcpStream::connect(addr)
        .await
        .expect("connect to the server");
    stream.set_nodelay(true).unwrap();
    let (send, connection) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
        .handshake(TokioIo::new(stream))
        .await
        .expect("HTTP/2 handshake");
    tokio::spawn(connection);
    H2(send)
}

pub fn origin(addr: SocketAddr) -> http::Uri {
    format!("http://{addr}").parse().unwrap()
}

/// How long after its deadline a call is given up on.
pub const GIVE_UP_AFTER: Duration = Duration::from_secs(3);

/// A Coordinator client on one server that records every call.
#[derive(Clone)]
pub struct Recording {
    pub addr: SocketAddr,
    client: CoordinatorClient<H2>,
    history: Arc<Mutex<Vec<Entry>>>,
}

fn with_deadline<T>(message: T, deadline: Duration) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.set_timeout(deadline);
    request
}

/// Runs `call` with `deadline`, giving up a while after it.
async fn timed<T>(
    deadline: Duration,
    call: impl Future<Output = Result<tonic::Response<T>, tonic::Status>>,
) -> (Timing, Option<Result<T, tonic::Status>>) {
    let start_us = recorder::now_us();
    let answer = tokio::time::timeout(deadline + GIVE_UP_AFTER, call)
        .await
        .ok()
        .map(|r| r.map(tonic::Response::into_inner));
    let timing = Timing {
        start_us,
        end_us: recorder::now_us(),
        deadline: Some(deadline),
    };
    (timing, answer)
}

impl Recording {
    pub async fn connect(addr: SocketAddr, history: Arc<Mutex<Vec<Entry>>>) -> Recording {
        Recording {
            addr,
            client: CoordinatorClient::with_origin(h2(addr).await, origin(addr)),
            history,
        }
    }

    fn record(&self, mut call: idempotency_bench::history::Call) {
        call.server = self.addr.to_string();
        self.history.lock().unwrap().push(Entry::Call(call));
    }

    pub async fn acquire(
        &mut self,
        req: proto::AcquireRequest,
        deadline: Duration,
    ) -> Option<Result<proto::AcquireResponse, tonic::Status>> {
        let (t, answer) = timed(
            deadline,
            self.client.acquire(with_deadline(req.clone(), deadline)),
        )
        .await;
        self.record(recorder::acquire(
            &req,
            t,
            answer.as_ref().map(Result::as_ref),
        ));
        answer
    }

    pub async fn complete(
        &mut self,
        req: proto::CompleteRequest,
        deadline: Duration,
    ) -> Option<Result<proto::CompleteResponse, tonic::Status>> {
        let (t, answer) = timed(
            deadline,
            self.client.complete(with_deadline(req.clone(), deadline)),
        )
        .await;
        self.record(recorder::complete(
            &req,
            t,
            answer.as_ref().map(Result::as_ref),
        ));
        answer
    }

    pub async fn get(
        &mut self,
        req: proto::GetRequest,
        deadline: Duration,
    ) -> Option<Result<proto::GetResponse, tonic::Status>> {
        let (t, answer) = timed(
            deadline,
            self.client.get(with_deadline(req.clone(), deadline)),
        )
        .await;
        self.record(recorder::get(&req, t, answer.as_ref().map(Result::as_ref)));
        answer
    }
}

/// The health service of one server.
#[derive(Clone)]
pub struct Health(HealthClient<H2>);

impl Health {
    pub async fn connect(addr: SocketAddr) -> Health {
        Health(HealthClient::with_origin(h2(addr).await, origin(addr)))
    }

    /// `service`'s status, or None when the check failed or took over 1 s.
    pub async fn check(&mut self, service: &str) -> Option<ServingStatus> {
        let request = with_deadline(
            HealthCheckRequest {
                service: service.into(),
            },
            Duration::from_secs(1),
        );
        let answer = tokio::time::timeout(Duration::from_secs(1), self.0.check(request))
            .await
            .ok()?
            .ok()?;
        ServingStatus::try_from(answer.into_inner().status).ok()
    }
}

/// The Complete a load cycle sends once its work is done: one pick in five
/// releases the lease; the others succeed with a result naming `who` and
/// the lease's fencing token, so that a replay shows whose result it is.
pub fn cycle_complete(
    scope: &str,
    key: &str,
    lease: proto::Lease,
    pick: u128,
    who: &str,
) -> proto::CompleteRequest {
    use proto::complete_request::Outcome;
    let outcome = if pick % 5 == 1 {
        Outcome::Release(proto::Release {})
    } else {
        Outcome::Success(proto::Success {
            result: format!("{who}-f{}", lease.fencing_token).into_bytes(),
            content_type: "text/plain".into(),
            status_code: 200,
            result_ref: String::new(),
        })
    };
    proto::CompleteRequest {
        scope: scope.into(),
        key: key.into(),
        lease_token: lease.token,
        outcome: Some(outcome),
    }
}

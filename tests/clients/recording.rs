//! A client library whose calls are written down as a history, for the
//! benchmark's history checker (`bench/src/history`): its Acquires as they
//! crossed the wire (a tower service around the channel, see
//! `Client::from_service`), the completions it ran inside a transaction as
//! the test saw them commit, and a final read of each key.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use http_body::Frame;
use http_body_util::{BodyExt, Full, StreamBody};
use idempotency_coordinator::proto;
use prost::Message;
use tonic::body::Body;
use tonic::transport::Channel;
use tower_service::Service;

use crate::history::{Entry, Violation};
use crate::recorder::{self, Timing, now_us};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// What the clients saw, in the order they saw it.
pub type History = Arc<Mutex<Vec<Entry>>>;

/// A channel that records every Acquire and its answer.
#[derive(Clone)]
struct Recording {
    channel: Channel,
    history: History,
}

/// A gRPC message's bytes without its 5-byte frame header.
fn message(frame: &[u8]) -> &[u8] {
    frame.get(5..).unwrap_or_default()
}

impl Service<http::Request<Body>> for Recording {
    type Response = http::Response<Body>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.channel.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        // The channel made ready goes with the call; a clone stays.
        let ready = self.channel.clone();
        let mut channel = std::mem::replace(&mut self.channel, ready);
        let history = self.history.clone();
        Box::pin(async move {
            if !request.uri().path().ends_with("/Acquire") {
                return Ok(channel.call(request).await?);
            }
            let (parts, body) = request.into_parts();
            let sent = body.collect().await?.to_bytes();
            let asked = proto::AcquireRequest::decode(message(&sent))?;
            let start_us = now_us();
            let request = http::Request::from_parts(parts, Body::new(Full::new(sent)));
            let (parts, body) = channel.call(request).await?.into_parts();
            let collected = body.collect().await?;
            let end_us = now_us();
            let trailers = collected.trailers().cloned();
            let data = collected.to_bytes();
            let status =
                tonic::Status::from_header_map(trailers.as_ref().unwrap_or(&parts.headers))
                    .filter(|status| status.code() != tonic::Code::Ok);
            let answered = match &status {
                Some(_) => None,
                None => Some(proto::AcquireResponse::decode(message(&data))?),
            };
            let answer = match (&status, &answered) {
                (Some(status), _) => Some(Err(status)),
                (None, answered) => answered.as_ref().map(Ok),
            };
            let timing = Timing {
                start_us,
                end_us,
                deadline: None,
            };
            let call = recorder::acquire(&asked, timing, answer);
            history.lock().unwrap().push(Entry::Call(call));
            let mut frames = vec![Ok::<_, std::convert::Infallible>(Frame::data(data))];
            frames.extend(trailers.map(|t| Ok(Frame::trailers(t))));
            let body = StreamBody::new(futures::stream::iter(frames));
            Ok(http::Response::from_parts(parts, Body::new(body)))
        })
    }
}

/// A client library on `endpoint` whose Acquires go into `history`.
pub async fn client(endpoint: &str, history: &History) -> idempotency_client::Client {
    let channel = Channel::from_shared(endpoint.to_owned())
        .expect("an endpoint")
        .connect()
        .await
        .expect("connect the channel");
    let recording = Recording {
        channel,
        history: history.clone(),
    };
    idempotency_client::Client::from_service(recording, Default::default())
        .expect("a client on the recording channel")
}

/// A success completed inside a transaction, sent with `lease_token` and
/// the result bytes `result` between `start_us` and `end_us`: `committed`
/// is the record as the commit left it, or `None` when the transaction
/// never answered (its process died before its commit).
pub fn completed_in_transaction(
    history: &History,
    (scope, key): (&str, &str),
    lease_token: &str,
    result: Vec<u8>,
    (start_us, end_us): (i64, i64),
    committed: Option<&idempotency_client::proto::Record>,
) {
    let request = proto::CompleteRequest {
        scope: scope.into(),
        key: key.into(),
        lease_token: lease_token.into(),
        outcome: Some(proto::complete_request::Outcome::Success(proto::Success {
            result,
            ..Default::default()
        })),
    };
    // The client library's record, read as the server's (one contract).
    let answered = committed.map(|record| proto::CompleteResponse {
        record: Some(proto::Record::decode(record.encode_to_vec().as_slice()).unwrap()),
    });
    let timing = Timing {
        start_us,
        end_us,
        deadline: None,
    };
    let call = recorder::complete(&request, timing, answered.as_ref().map(Ok));
    history.lock().unwrap().push(Entry::Call(call));
}

/// The history so far with a final read of (scope, key) from `db` (the
/// default tenant's), held to the coordinator's promises.
pub async fn violations(
    history: &History,
    db: &tokio_postgres::Client,
    (scope, key): (&str, &str),
) -> Vec<Violation> {
    let read = recorder::final_read(db, "default", scope, key)
        .await
        .expect("read the key");
    let mut entries = history.lock().unwrap().clone();
    entries.push(read);
    crate::history::check(&entries)
}

//! Whatever a client sends: arbitrary field values are answered or refused
//! with INVALID_ARGUMENT (and refusals write nothing); malformed, oversized
//! and abandoned calls leave the server answering, its memory near where it
//! started, and its table holding only what valid calls created.

use std::collections::HashSet;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Buf, BufMut};
use idempotency_coordinator::proto::{
    self, AcquireRequest, acquire_request::RequestFingerprint, complete_request::Outcome,
};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use tonic::Code;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tower_service::Service;

use crate::helpers::*;

fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        "[A-Za-z0-9._:/-]{1,20}",
        "[!-~]{0,260}",
        ".{0,140}",
        Just(String::new()),
    ]
}

fn duration() -> impl Strategy<Value = Option<prost_types::Duration>> {
    prop_oneof![
        Just(None),
        (-5i64..200_000, -5i32..1_000_000_005)
            .prop_map(|(seconds, nanos)| Some(prost_types::Duration { seconds, nanos })),
        any::<(i64, i32)>()
            .prop_map(|(seconds, nanos)| Some(prost_types::Duration { seconds, nanos })),
    ]
}

/// `wait` only as something to refuse or nothing: a valid wait would sleep.
fn no_wait() -> impl Strategy<Value = Option<prost_types::Duration>> {
    prop_oneof![
        Just(None),
        Just(Some(prost_types::Duration {
            seconds: 0,
            nanos: 0
        })),
        (i64::MIN..0).prop_map(|seconds| Some(prost_types::Duration { seconds, nanos: 0 })),
    ]
}

fn fingerprint() -> impl Strategy<Value = Option<RequestFingerprint>> {
    prop_oneof![
        Just(None),
        text().prop_map(|f| Some(RequestFingerprint::Fingerprint(f))),
        prop::collection::vec(any::<u8>(), 0..64)
            .prop_map(|p| Some(RequestFingerprint::Payload(p))),
        prop_oneof![".{0,40}", Just(r#"{"b":[1,2],"a":{"c":null}}"#.to_owned())]
            .prop_map(|j| Some(RequestFingerprint::JsonPayload(j))),
    ]
}

fn acquire_request() -> impl Strategy<Value = AcquireRequest> {
    (
        text(),
        text(),
        fingerprint(),
        duration(),
        prop_oneof![Just(0u32), 1u32..1100, any::<u32>()],
        duration(),
        no_wait(),
        text(),
    )
        .prop_map(
            |(
                scope,
                key,
                request_fingerprint,
                lease_ttl,
                max_attempts,
                retention,
                wait,
                request_id,
            )| {
                AcquireRequest {
                    scope,
                    key,
                    request_fingerprint,
                    lease_ttl,
                    max_attempts,
                    retention,
                    wait,
                    request_id,
                }
            },
        )
}

#[test]
fn arbitrary_acquires_are_answered_or_refused_and_refusals_write_nothing() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let app = rt.block_on(spawn_app_without_sweeper());
    let mut runner = TestRunner::new(Config {
        cases: 400,
        failure_persistence: None,
        ..Config::default()
    });
    let created = std::cell::RefCell::new(HashSet::new());
    runner
        .run(&acquire_request(), |req| {
            let mut c = app.client.clone();
            let id = (req.scope.clone(), req.key.clone());
            match rt.block_on(c.acquire(req)) {
                Ok(answer) => {
                    if answer.into_inner().decision == proto::Decision::Proceed as i32 {
                        created.borrow_mut().insert(id);
                    }
                }
                Err(status) => {
                    prop_assert_eq!(status.code(), Code::InvalidArgument, "{:?}", status);
                    prop_assert!(!bad_fields(&status).is_empty(), "a field is named");
                }
            }
            Ok(())
        })
        .unwrap();
    let rows = rt.block_on(app.db.count_records());
    assert_eq!(
        rows as usize,
        created.borrow().len(),
        "only accepted Acquires wrote"
    );
    drop(app);
}

#[test]
fn arbitrary_completes_extends_and_gets_never_fail_otherwise_than_as_specified() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let app = rt.block_on(spawn_app_without_sweeper());
    // One real record, so that some calls reach it.
    let mut c = app.client.clone();
    let live = rt.block_on(proceed(&mut c, acquire("s", "k")));
    let live_token = token(&live);
    let token_text = prop_oneof![
        Just(live_token.clone()),
        text(),
        Just(uuid::Uuid::nil().to_string())
    ];
    let outcome = prop_oneof![
        Just(None),
        (
            prop::collection::vec(any::<u8>(), 0..32),
            text(),
            any::<i32>(),
            text()
        )
            .prop_map(|(result, content_type, status_code, result_ref)| Some(
                Outcome::Success(proto::Success {
                    result,
                    content_type,
                    status_code,
                    result_ref,
                })
            )),
        (text(), any::<bool>(), duration()).prop_map(|(error, permanent, retry_after)| Some(
            Outcome::Failure(proto::Failure {
                error,
                permanent,
                retry_after
            })
        )),
        Just(Some(Outcome::Release(proto::Release {}))),
    ];
    let case = (
        prop_oneof![Just("s".to_owned()), text()],
        prop_oneof![Just("k".to_owned()), text()],
        token_text,
        outcome,
        duration(),
        prop::option::of(prop::collection::vec(any::<u8>(), 0..70_000)),
    );
    let mut runner = TestRunner::new(Config {
        cases: 300,
        failure_persistence: None,
        ..Config::default()
    });
    let allowed = [
        Code::Ok,
        Code::InvalidArgument,
        Code::NotFound,
        Code::Aborted,
        Code::FailedPrecondition,
    ];
    runner
        .run(
            &case,
            |(scope, key, lease_token, outcome, extend_by, checkpoint)| {
                let mut c = app.client.clone();
                let codes = rt.block_on(async {
                    let complete = c
                        .complete(proto::CompleteRequest {
                            scope: scope.clone(),
                            key: key.clone(),
                            lease_token: lease_token.clone(),
                            outcome,
                        })
                        .await;
                    let extend = c
                        .extend_lease(proto::ExtendLeaseRequest {
                            scope: scope.clone(),
                            key: key.clone(),
                            lease_token,
                            extend_by,
                            checkpoint,
                        })
                        .await;
                    let get = c.get(proto::GetRequest { scope, key }).await;
                    [
                        complete.err().map_or(Code::Ok, |s| s.code()),
                        extend.err().map_or(Code::Ok, |s| s.code()),
                        get.err().map_or(Code::Ok, |s| s.code()),
                    ]
                });
                for code in codes {
                    prop_assert!(allowed.contains(&code), "{:?}", code);
                }
                Ok(())
            },
        )
        .unwrap();
    assert_eq!(
        rt.block_on(app.db.count_records()),
        1,
        "nothing but the real record"
    );
}

/// Sends raw bytes as a gRPC message, whatever they are.
#[derive(Clone, Default)]
struct RawCodec;

impl Codec for RawCodec {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = RawCodec;
    type Decoder = RawCodec;
    fn encoder(&mut self) -> Self::Encoder {
        RawCodec
    }
    fn decoder(&mut self) -> Self::Decoder {
        RawCodec
    }
}

impl Encoder for RawCodec {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn encode(&mut self, item: Vec<u8>, dst: &mut EncodeBuf<'_>) -> Result<(), tonic::Status> {
        dst.put_slice(&item);
        Ok(())
    }
}

impl Decoder for RawCodec {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Vec<u8>>, tonic::Status> {
        let bytes = src.copy_to_bytes(src.remaining()).to_vec();
        Ok(Some(bytes))
    }
}

async fn raw_call(channel: tonic::transport::Channel, method: &'static str, body: Vec<u8>) -> Code {
    let mut grpc = tonic::client::Grpc::new(channel);
    if grpc.ready().await.is_err() {
        return Code::Unavailable;
    }
    let path = http::uri::PathAndQuery::from_static(method);
    match grpc.unary(tonic::Request::new(body), path, RawCodec).await {
        Ok(_) => Code::Ok,
        Err(status) => status.code(),
    }
}

/// Waits and streams (half each) that one round of abuse abandons.
const ABANDONED: usize = 300;

/// A channel that counts the requests whose message it has handed whole to
/// the connection: the last frame of their body taken by the HTTP/2 stream.
#[derive(Clone)]
struct CountSent {
    channel: tonic::transport::Channel,
    sent: Arc<AtomicUsize>,
}

impl Service<http::Request<tonic::body::Body>> for CountSent {
    type Response = http::Response<tonic::body::Body>;
    type Error = tonic::transport::Error;
    type Future = tonic::transport::channel::ResponseFuture;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.channel.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        let sent = Some(Arc::clone(&self.sent));
        self.channel
            .call(request.map(|body| tonic::body::Body::new(Counted { body, sent })))
    }
}

/// A request body that adds one to `sent` once its last frame is taken.
struct Counted {
    body: tonic::body::Body,
    sent: Option<Arc<AtomicUsize>>,
}

impl http_body::Body for Counted {
    type Data = bytes::Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        let frame = std::task::ready!(Pin::new(&mut self.body).poll_frame(cx));
        if (frame.is_none() || self.body.is_end_stream())
            && let Some(sent) = self.sent.take()
        {
            sent.fetch_add(1, Ordering::SeqCst);
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

/// One round of abuse: garbage messages to every method, oversized messages,
/// abandoned waits and streams, and raw connections that send junk.
async fn abuse(server: &ServerProcess, seed: u64) {
    use rand_like::Lcg;
    let channel = tonic::transport::Channel::from_shared(format!("http://{}", server.addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let methods = [
        "/idempotency.v1.Coordinator/Acquire",
        "/idempotency.v1.Coordinator/Complete",
        "/idempotency.v1.Coordinator/ExtendLease",
        "/idempotency.v1.Coordinator/Get",
        "/idempotency.v1.Coordinator/Sweep",
    ];
    let mut rng = Lcg(seed);
    let bodies: Vec<Vec<u8>> = (0..2000)
        .map(|_| {
            let len = (rng.next() % 300) as usize;
            (0..len).map(|_| rng.next() as u8).collect()
        })
        .collect();
    for (n, chunk) in bodies.chunks(200).enumerate() {
        let calls = chunk.iter().enumerate().map(|(i, body)| {
            raw_call(
                channel.clone(),
                methods[(n + i) % methods.len()],
                body.clone(),
            )
        });
        let results = futures::future::join_all(calls).await;
        assert!(results.iter().all(|c| *c != Code::Unknown), "{results:?}");
    }
    // Oversized messages are refused by the transport.
    for _ in 0..5 {
        let code = raw_call(channel.clone(), methods[0], vec![0x0a; 8 * 1024 * 1024]).await;
        assert_ne!(code, Code::Ok);
    }
    // Waits and streams that the client abandons.
    let mut client = proto::coordinator_client::CoordinatorClient::new(channel.clone());
    let held = format!("held-{seed}");
    let _ = client.acquire(acquire("hostile", &held)).await;
    let sent = Arc::new(AtomicUsize::new(0));
    let watches_answered = Arc::new(AtomicUsize::new(0));
    let counted = proto::coordinator_client::CoordinatorClient::new(CountSent {
        channel: channel.clone(),
        sent: Arc::clone(&sent),
    });
    let abandoned: Vec<_> = (0..ABANDONED)
        .map(|i| {
            let mut c = counted.clone();
            let held = held.clone();
            let watches_answered = Arc::clone(&watches_answered);
            tokio::spawn(async move {
                if i % 2 == 0 {
                    let _ = c.acquire(waiting("hostile", &held, 60)).await;
                } else {
                    let req = proto::WatchRequest {
                        scope: "hostile".into(),
                        key: held,
                        timeout: secs(60),
                    };
                    let answer = c.watch(req).await;
                    watches_answered.fetch_add(1, Ordering::SeqCst);
                    if let Ok(stream) = answer {
                        drop(stream);
                    }
                }
            })
        })
        .collect();
    // Abandon the calls only once they have reached the server. The server
    // answers a Watch only after it has registered the watcher and read the
    // record (or refused the call), so an answered Watch is one the server
    // has taken in. A waiting Acquire parked on the server shows nothing
    // outside its process: it is answered when its window ends, holds no
    // database connection while it sleeps, and the server counts its waiters
    // in memory only. For those the condition is the client's: each request
    // handed whole to the HTTP/2 connection, which sends it before the
    // cancellation that aborting the call queues behind it.
    eventually(
        "the abandoned calls to reach the server",
        Duration::from_secs(10),
        || async {
            let sent = sent.load(Ordering::SeqCst);
            let answered = watches_answered.load(Ordering::SeqCst);
            (sent == ABANDONED && answered == ABANDONED / 2).then_some(())
        },
    )
    .await;
    for call in &abandoned {
        call.abort();
    }
    // Raw connections: junk, a half HTTP/2 preface, nothing at all.
    for i in 0..200 {
        if let Ok(mut tcp) = tokio::net::TcpStream::connect(server.addr).await {
            use tokio::io::AsyncWriteExt;
            let junk: &[u8] = match i % 3 {
                0 => b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
                1 => b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x12\x04",
                _ => b"",
            };
            let _ = tcp.write_all(junk).await;
        }
    }
}

mod rand_like {
    /// A tiny deterministic generator: the abuse is the same on every run.
    pub struct Lcg(pub u64);

    impl Lcg {
        pub fn next(&mut self) -> u64 {
            self.0 = self
                .0
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            self.0 >> 33
        }
    }
}

#[tokio::test]
async fn a_hostile_client_leaves_the_server_answering_with_its_memory_and_table_intact() {
    let db = TestDatabase::create().await;
    let server = ServerProcess::start_with(&db.url, &["--sweep-interval", "0s"]).await;
    let pid = server.pid();

    // One round first, so allocator pools and caches are warm.
    abuse(&server, 1).await;
    let warm = resident_kib(pid);
    for seed in 2..5 {
        abuse(&server, seed).await;
    }
    let after = eventually("memory to settle", Duration::from_secs(20), || async {
        let now = resident_kib(pid);
        (now <= warm + 32 * 1024).then_some(now)
    })
    .await;
    println!("server memory: {warm} KiB after one round of abuse, {after} KiB after four");

    let channel = tonic::transport::Channel::from_shared(format!("http://{}", server.addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
    let live = health
        .check(tonic_health::pb::HealthCheckRequest {
            service: String::new(),
        })
        .await
        .expect("health answers")
        .into_inner();
    assert_eq!(live.status, 1, "SERVING");
    let mut c = server.client().await;
    let fresh = c
        .acquire(acquire("s", "after-abuse"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(decision(&fresh), proto::Decision::Proceed);

    let rows = statuses(&db).await;
    let garbage: Vec<_> = rows
        .iter()
        .filter(|(key, _)| !key.starts_with("held-") && key != "after-abuse")
        .collect();
    assert!(
        garbage
            .iter()
            .all(|(key, _)| key.chars().all(|c| ('!'..='~').contains(&c))),
        "every row has a valid key: {garbage:?}"
    );
}

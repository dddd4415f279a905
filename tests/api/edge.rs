//! The network edge against clients that do not play by the rules, spoken
//! to in raw HTTP/2 or raw TCP: what a client without credentials, a slow
//! client, a silent one or a vanished one can make the server hold.

use std::time::{Duration, Instant};

use bytes::Bytes;
use http::Request;
use idempotency_coordinator::proto;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::helpers::*;

const ACQUIRE: &str = "/idempotency.v1.Coordinator/Acquire";
const HEALTH_CHECK: &str = "/grpc.health.v1.Health/Check";
const HEALTH_WATCH: &str = "/grpc.health.v1.Health/Watch";
const TOKEN: &str = "edge-token-0123456789";

fn token_file() -> TokenFile {
    TokenFile::new(&format!("{TOKEN} edge\n"))
}

/// A fresh client with [`TOKEN`] is served: its Acquire on `key` PROCEEDs.
async fn assert_an_authenticated_call_proceeds(server: &ServerProcess, key: &str) {
    let channel = tonic::transport::Channel::from_shared(format!("http://{}", server.addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let bearer = Bearer(format!("Bearer {TOKEN}").parse().unwrap());
    let mut client =
        proto::coordinator_client::CoordinatorClient::with_interceptor(channel, bearer);
    let answer = client.acquire(acquire("s", key)).await.unwrap();
    assert_eq!(decision(&answer.into_inner()), proto::Decision::Proceed);
}

/// A raw HTTP/2 connection and the task that drives it (it ends when the
/// server closes the connection).
struct H2 {
    send: h2::client::SendRequest<Bytes>,
    driver: tokio::task::JoinHandle<Result<(), h2::Error>>,
}

async fn h2_connect(addr: std::net::SocketAddr) -> H2 {
    let tcp = TcpStream::connect(addr).await.expect("connect");
    let (send, connection) = h2::client::handshake(tcp).await.expect("HTTP/2 handshake");
    let driver = tokio::spawn(connection);
    let send = send.ready().await.expect("ready");
    H2 { send, driver }
}

fn grpc_request(path: &str, token: Option<&str>) -> Request<()> {
    let mut request = Request::post(format!("http://edge{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers");
    if let Some(token) = token {
        request = request.header("authorization", format!("Bearer {token}"));
    }
    request.body(()).unwrap()
}

/// The 5-byte gRPC prefix of a message of `len` bytes.
fn prefix(len: u32) -> Bytes {
    let mut p = vec![0u8];
    p.extend_from_slice(&len.to_be_bytes());
    Bytes::from(p)
}

/// A call's gRPC status code and message, from its headers (trailers-only
/// answer) or its trailers.
async fn grpc_status(response: h2::client::ResponseFuture) -> (i32, String) {
    let response = response.await.expect("an HTTP/2 response");
    let read = |headers: &http::HeaderMap| {
        let code = headers.get("grpc-status")?.to_str().ok()?.parse().ok()?;
        let message = percent_decoded(
            headers
                .get("grpc-message")
                .and_then(|m| m.to_str().ok())
                .unwrap_or_default(),
        );
        Some((code, message))
    };
    if let Some(status) = read(response.headers()) {
        return status;
    }
    let mut body = response.into_body();
    while let Some(chunk) = body.data().await {
        let chunk = chunk.expect("body");
        let _ = body.flow_control().release_capacity(chunk.len());
    }
    let trailers = body.trailers().await.expect("trailers").expect("some");
    read(&trailers).expect("grpc-status in the trailers")
}

/// `grpc-message` is percent-encoded on the wire.
fn percent_decoded(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok());
        match (bytes[i], hex.and_then(|h| u8::from_str_radix(h, 16).ok())) {
            (b'%', Some(b)) => {
                out.push(b);
                i += 3;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// CPU time the process has used, user and system.
fn cpu_time(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the command name (which may hold spaces) in parentheses.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = rest.split(' ').collect();
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    Duration::from_millis(ticks * 10) // USER_HZ is 100 on Linux.
}

#[tokio::test]
async fn unauthenticated_streams_with_large_bodies_are_refused_before_their_body() {
    let db = TestDatabase::create().await;
    let file = token_file();
    let path = file.path.to_str().unwrap();
    let server = ServerProcess::start_with(&db.url, &["--auth-tokens", path]).await;
    let pid = server.pid();
    // Warm: one connection's worth of refusals first.
    let mut warm = h2_connect(server.addr).await;
    let (answer, _stream) = warm
        .send
        .send_request(grpc_request(ACQUIRE, None), false)
        .unwrap();
    assert_eq!(grpc_status(answer).await.0, 16);
    let before = resident_kib(pid);

    // 5 connections x 100 streams, each declaring a message just under the
    // 4 MiB limit and sending all of it but the last byte, never ending.
    let body = Bytes::from(vec![0u8; 4 * 1024 * 1024 - 2]);
    let mut connections = Vec::new();
    let mut answers = Vec::new();
    for _ in 0..5 {
        let mut c = h2_connect(server.addr).await;
        for _ in 0..100 {
            c.send = c.send.ready().await.expect("ready");
            let (answer, mut stream) = c
                .send
                .send_request(grpc_request(ACQUIRE, None), false)
                .unwrap();
            let _ = stream.send_data(prefix(4 * 1024 * 1024 - 1), false);
            let _ = stream.send_data(body.clone(), false);
            answers.push((answer, stream));
        }
        connections.push(c);
    }
    // Every stream is answered UNAUTHENTICATED although none ended.
    let started = Instant::now();
    let mut streams = Vec::new();
    for (answer, stream) in answers {
        let (code, message) = tokio::time::timeout(Duration::from_secs(10), grpc_status(answer))
            .await
            .expect("an answer before the body ends");
        assert_eq!(code, 16, "{message}");
        streams.push(stream);
    }
    println!("500 refusals in {:?}", started.elapsed());

    // Held open for 20 s: the server's memory stays within 16 MiB of where
    // it was.
    let mut peak = before;
    let until = Instant::now() + Duration::from_secs(20);
    while Instant::now() < until {
        peak = peak.max(resident_kib(pid));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    println!("server memory: {before} KiB before, {peak} KiB at most while held");
    assert!(
        peak < before + 16 * 1024,
        "the server grew from {before} KiB to {peak} KiB"
    );
    drop(streams);
    drop(connections);
}

#[tokio::test]
async fn a_slow_authenticated_body_is_cut_off_and_an_oversized_one_refused_at_its_prefix() {
    let db = TestDatabase::create().await;
    let file = token_file();
    let path = file.path.to_str().unwrap();
    let server = ServerProcess::start_with(
        &db.url,
        &["--auth-tokens", path, "--request-body-timeout", "1s"],
    )
    .await;
    let mut c = h2_connect(server.addr).await;

    // Ten bytes of a hundred, then nothing.
    let started = Instant::now();
    let (answer, mut stream) = c
        .send
        .send_request(grpc_request(ACQUIRE, Some(TOKEN)), false)
        .unwrap();
    stream.send_data(prefix(100), false).unwrap();
    stream.send_data(Bytes::from(vec![0u8; 10]), false).unwrap();
    let (code, message) = tokio::time::timeout(Duration::from_secs(10), grpc_status(answer))
        .await
        .expect("an answer");
    let took = started.elapsed();
    assert_eq!(code, 4, "DEADLINE_EXCEEDED: {message}");
    assert!(message.contains("--request-body-timeout"), "{message}");
    assert!(took >= Duration::from_millis(900), "cut after {took:?}");
    assert!(took < Duration::from_secs(5), "cut after {took:?}");

    // A message declared over --max-request-bytes: refused at its prefix.
    let (answer, mut stream) = c
        .send
        .send_request(grpc_request(ACQUIRE, Some(TOKEN)), false)
        .unwrap();
    stream.send_data(prefix(5 * 1024 * 1024), false).unwrap();
    let (code, message) = tokio::time::timeout(Duration::from_millis(900), grpc_status(answer))
        .await
        .expect("an answer before the body timeout");
    assert_eq!(code, 8, "RESOURCE_EXHAUSTED: {message}");
    assert!(message.contains("--max-request-bytes"), "{message}");

    // The connection still serves whole requests.
    assert_an_authenticated_call_proceeds(&server, "after").await;
}

#[tokio::test]
async fn arriving_request_bytes_are_held_to_the_budget() {
    let db = TestDatabase::create().await;
    let server = ServerProcess::start_with(
        &db.url,
        &[
            "--max-inflight-request-mib",
            "1",
            "--request-body-timeout",
            "3s",
        ],
    )
    .await;
    let mut c = h2_connect(server.addr).await;
    // Five unfinished bodies of 300 KiB do not fit in a 1 MiB budget: the
    // ones that cross it are refused at once, the others cut off by the
    // body time limit.
    let part = Bytes::from(vec![0u8; 300 * 1024]);
    let started = Instant::now();
    let mut answers = Vec::new();
    for _ in 0..5 {
        c.send = c.send.clone().ready().await.expect("ready");
        let (answer, mut stream) = c
            .send
            .send_request(grpc_request(ACQUIRE, None), false)
            .unwrap();
        stream.send_data(prefix(1024 * 1024), false).unwrap();
        stream.send_data(part.clone(), false).unwrap();
        answers.push(tokio::spawn(async move {
            let status = grpc_status(answer).await;
            drop(stream);
            (status, started.elapsed())
        }));
    }
    let mut refused = 0;
    for answer in answers {
        let ((code, message), after) = answer.await.unwrap();
        match code {
            8 => {
                assert!(message.contains("too many requests"), "{message}");
                assert!(after < Duration::from_secs(2), "refused after {after:?}");
                refused += 1;
            }
            4 => assert!(after >= Duration::from_millis(2900), "cut after {after:?}"),
            other => panic!("code {other}: {message}"),
        }
    }
    assert!((2..=4).contains(&refused), "{refused} of 5 refused");
    // The budget is free again.
    let mut client = server.client().await;
    let answer = client.acquire(acquire("s", "after")).await.unwrap();
    assert_eq!(decision(&answer.into_inner()), proto::Decision::Proceed);
}

#[tokio::test]
async fn out_of_descriptors_the_server_does_not_spin_and_serves_again() {
    let db = TestDatabase::create().await;
    let server = ServerProcess::launch(
        &db.url,
        &["--handshake-timeout", "2s", "--sweep-interval", "0s"],
        Launch {
            open_files: Some(256),
            ..Launch::default()
        },
    )
    .await;
    let pid = server.pid();
    let logs = server.logs();
    assert!(
        logs.iter()
            .any(|l| l.contains("the open file limit lowers the connection limit")),
        "the lowered connection limit is logged"
    );

    // More silent connections than the server has descriptors.
    let mut silent = Vec::new();
    for _ in 0..400 {
        if let Ok(Ok(tcp)) =
            tokio::time::timeout(Duration::from_secs(2), TcpStream::connect(server.addr)).await
        {
            silent.push(tcp);
        }
    }
    let cpu_before = cpu_time(pid);
    let wall = Instant::now();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let share = (cpu_time(pid) - cpu_before).as_secs_f64() / wall.elapsed().as_secs_f64();
    println!("server CPU while flooded: {:.0}% of a core", share * 100.0);
    assert!(
        share < 0.2,
        "the server used {:.0}% of a core",
        share * 100.0
    );

    // A well-behaved client is served within 15 s.
    let started = Instant::now();
    eventually("a call to succeed", Duration::from_secs(15), || async {
        let channel = tonic::transport::Channel::from_shared(format!("http://{}", server.addr))
            .unwrap()
            .connect_timeout(Duration::from_secs(1))
            .timeout(Duration::from_secs(2));
        let channel = channel.connect().await.ok()?;
        let mut client = proto::coordinator_client::CoordinatorClient::new(channel);
        client.acquire(acquire("s", "served")).await.ok()
    })
    .await;
    println!("served again after {:?}", started.elapsed());
    drop(silent);
}

#[tokio::test]
async fn silent_idle_and_unresponsive_connections_are_closed() {
    let db = TestDatabase::create().await;
    let server = ServerProcess::start_with(
        &db.url,
        &[
            "--handshake-timeout",
            "1s",
            "--idle-timeout",
            "1s",
            "--http2-keepalive-interval",
            "1s",
            "--http2-keepalive-timeout",
            "1s",
        ],
    )
    .await;

    // A TCP connection that sends nothing is closed at the handshake limit.
    let mut tcp = TcpStream::connect(server.addr).await.unwrap();
    let mut buf = [0u8; 64];
    let read = tokio::time::timeout(Duration::from_secs(5), tcp.read(&mut buf))
        .await
        .expect("closed within 5 s");
    assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");

    // A peer that sends the preface, then never answers a ping, is dropped.
    let mut mute = TcpStream::connect(server.addr).await.unwrap();
    mute.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0")
        .await
        .unwrap();

    // A client that answers pings is kept while a call is open past the
    // idle timeout...
    let mut polite = h2_connect(server.addr).await;
    let (answer, mut stream) = polite
        .send
        .send_request(grpc_request(HEALTH_WATCH, None), false)
        .unwrap();
    stream.send_data(prefix(0), true).unwrap();
    let response = answer.await.expect("the watch starts");
    assert_eq!(response.status(), 200);

    let started = Instant::now();
    let mut sink = Vec::new();
    let dropped = tokio::time::timeout(Duration::from_secs(10), mute.read_to_end(&mut sink)).await;
    assert!(dropped.is_ok(), "an unresponsive peer is dropped");
    println!("unresponsive peer dropped after {:?}", started.elapsed());
    assert!(
        !polite.driver.is_finished(),
        "a call open keeps its connection"
    );

    // ...and closed once it has had no call for the idle timeout.
    drop(response);
    drop(stream);
    let closed = tokio::time::timeout(Duration::from_secs(5), &mut polite.driver).await;
    assert!(closed.is_ok(), "an idle connection is closed");

    // A connection that has just answered a call stays usable.
    let mut fresh = h2_connect(server.addr).await;
    let (answer, mut stream) = fresh
        .send
        .send_request(grpc_request(HEALTH_CHECK, None), false)
        .unwrap();
    stream.send_data(prefix(0), true).unwrap();
    assert_eq!(grpc_status(answer).await.0, 0);
}

#[tokio::test]
async fn a_debug_log_of_a_whole_cycle_holds_no_token_result_or_error_text() {
    let db = TestDatabase::create().await;
    let server = ServerProcess::launch(
        &db.url,
        &["--sweep-interval", "0s", "--backoff-base", "100ms"],
        Launch {
            env: &[("RUST_LOG", "debug")],
            ..Launch::default()
        },
    )
    .await;
    let mut c = server.client().await;
    let first = proceed(&mut c, acquire("s", "k")).await;
    let first_token = token(&first);
    c.complete(complete(
        "s",
        "k",
        &first_token,
        failure("error-text-secret-31337"),
    ))
    .await
    .unwrap();
    let retry = acquire("s", "k");
    let second = eventually("the retry to be due", Duration::from_secs(10), || {
        let mut c = c.clone();
        let retry = retry.clone();
        async move {
            let a = c.acquire(retry).await.ok()?.into_inner();
            (decision(&a) == proto::Decision::Proceed).then_some(a)
        }
    })
    .await;
    let second_token = token(&second);
    c.complete(complete(
        "s",
        "k",
        &second_token,
        success(b"result-secret-27182"),
    ))
    .await
    .unwrap();
    c.acquire(acquire("s", "k")).await.unwrap();
    c.get(proto::GetRequest {
        scope: "s".into(),
        key: "k".into(),
    })
    .await
    .unwrap();

    let logs = eventually("debug lines", Duration::from_secs(5), || async {
        let logs = server.logs();
        logs.iter().any(|l| l.contains("DEBUG")).then_some(logs)
    })
    .await;
    let secret_bytes = format!("{:?}", &b"result-secret-27182"[..6]);
    let secret_bytes = secret_bytes.trim_end_matches(']');
    for line in &logs {
        for secret in [
            first_token.as_str(),
            &first_token.replace('-', ""),
            second_token.as_str(),
            &second_token.replace('-', ""),
            "result-secret",
            secret_bytes,
            "error-text-secret",
        ] {
            assert!(!line.contains(secret), "{secret:?} logged: {line}");
        }
    }
}

#[tokio::test]
async fn a_deadline_that_passes_in_the_server_is_deadline_exceeded() {
    use prost::Message as _;
    let db = TestDatabase::create().await;
    let server = ServerProcess::start(&db.url).await;
    // Another transaction creates the same record and does not commit: the
    // call's statement waits on it past the call's deadline.
    let mut blocker = db.connect().await;
    let open = blocker.transaction().await.unwrap();
    open.execute(
        "SELECT idempotency_acquire('default', 's', 'late', '', '', 60000, 3, 60000, 0, 0)",
        &[],
    )
    .await
    .unwrap();
    let mut c = h2_connect(server.addr).await;
    let mut request = grpc_request(ACQUIRE, None);
    request
        .headers_mut()
        .insert("grpc-timeout", "1500m".parse().unwrap());
    let message = acquire("s", "late").encode_to_vec();
    let (answer, mut stream) = c.send.send_request(request, false).unwrap();
    stream
        .send_data(prefix(u32::try_from(message.len()).unwrap()), false)
        .unwrap();
    stream.send_data(Bytes::from(message), true).unwrap();
    let (code, message) = grpc_status(answer).await;
    assert_eq!(code, 4, "DEADLINE_EXCEEDED, not CANCELLED: {message}");
    assert!(message.contains("deadline"), "{message}");
    open.rollback().await.unwrap();
}

#[tokio::test]
async fn streams_anyone_may_open_cannot_take_the_room_of_coordinator_calls() {
    let db = TestDatabase::create().await;
    let file = token_file();
    let path = file.path.to_str().unwrap();
    let server = ServerProcess::start_with(&db.url, &["--auth-tokens", path]).await;
    // Health Watch streams, open to anyone and held open, until the server
    // refuses more of them.
    let mut held = Vec::new();
    let mut watching = Vec::new();
    let mut refused = None;
    'open: for _ in 0..3 {
        let mut c = h2_connect(server.addr).await;
        for _ in 0..900 {
            c.send = c
                .send
                .clone()
                .ready()
                .await
                .unwrap_or_else(|e| panic!("ready after {}: {e}", watching.len()));
            let (answer, mut stream) = c
                .send
                .send_request(grpc_request(HEALTH_WATCH, None), false)
                .unwrap();
            stream.send_data(prefix(0), true).unwrap();
            let response = answer.await.expect("an answer");
            if let Some(code) = response.headers().get("grpc-status") {
                refused = Some(code.to_str().unwrap().to_owned());
                held.push(c);
                break 'open;
            }
            // Read the first status it streams (the client's HTTP/2 refuses
            // to keep many small frames unread).
            let mut body = response.into_body();
            body.data().await.expect("a status").expect("a status");
            watching.push(body);
        }
        held.push(c);
    }
    assert_eq!(refused.as_deref(), Some("8"), "health streams are bounded");
    println!(
        "{} health streams held before one was refused",
        watching.len()
    );
    // Coordinator calls still have all their room.
    assert_an_authenticated_call_proceeds(&server, "room").await;
}

#[tokio::test]
async fn a_tonic_client_whose_deadline_passes_hears_deadline_exceeded_not_its_own_cancelled() {
    // tonic reports its own timer running out as CANCELLED ("Timeout
    // expired"); the server answers first, so the caller sees the code it
    // retries on.
    let db = TestDatabase::create().await;
    let server = ServerProcess::start(&db.url).await;
    let mut blocker = db.connect().await;
    let open = blocker.transaction().await.unwrap();
    open.execute(
        "SELECT idempotency_acquire('default', 's', 'late', '', '', 60000, 3, 60000, 0, 0)",
        &[],
    )
    .await
    .unwrap();
    let client = server.client().await;
    let calls = (0..8).map(|_| {
        let mut client = client.clone();
        async move {
            let mut request = tonic::Request::new(acquire("s", "late"));
            request.set_timeout(Duration::from_millis(1500));
            client.acquire(request).await.unwrap_err()
        }
    });
    // The calls a batch worker took wait on the lock past their deadline;
    // those still queued for a worker when their deadline comes hear
    // UNAVAILABLE, as `--connect-wait` cut by the deadline promises.
    let codes: Vec<tonic::Code> = futures::future::join_all(calls)
        .await
        .iter()
        .map(tonic::Status::code)
        .collect();
    assert!(
        codes
            .iter()
            .all(|c| matches!(c, tonic::Code::DeadlineExceeded | tonic::Code::Unavailable)),
        "{codes:?}"
    );
    assert!(codes.contains(&tonic::Code::DeadlineExceeded), "{codes:?}");
    open.rollback().await.unwrap();
}

/// The ports share one budget of descriptors: under a 256 open file limit,
/// the HTTP port full of connections that hold half a request head and 70
/// held gRPC connections leave the descriptors a new gRPC client needs.
#[tokio::test]
async fn a_full_http_port_leaves_the_grpc_port_its_descriptors() {
    let db = TestDatabase::create().await;
    let server = ServerProcess::launch(
        &db.url,
        &["--http-listen", "127.0.0.1:0", "--sweep-interval", "0s"],
        Launch {
            open_files: Some(256),
            ..Launch::default()
        },
    )
    .await;
    let http = server.logged_addr("serving HTTP/JSON");
    let mut held = Vec::new();
    for _ in 0..200 {
        let Ok(Ok(mut tcp)) =
            tokio::time::timeout(Duration::from_secs(2), TcpStream::connect(http)).await
        else {
            continue;
        };
        let _ = tcp.write_all(b"GET /health HTTP/1.1\r\nHo").await;
        held.push(tcp);
    }
    for _ in 0..70 {
        let mut tcp = TcpStream::connect(server.addr).await.unwrap();
        tcp.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
            .await
            .unwrap();
        held.push(tcp);
    }
    let channel = tonic::transport::Channel::from_shared(format!("http://{}", server.addr))
        .unwrap()
        .connect_timeout(Duration::from_secs(3))
        .timeout(Duration::from_secs(3));
    let channel = channel.connect().await.expect("a new gRPC connection");
    let mut client = proto::coordinator_client::CoordinatorClient::new(channel);
    let answer = client.acquire(acquire("s", "one-budget")).await;
    assert!(answer.is_ok(), "{answer:?}");
    drop(held);
}

//! Connections and streams: a flood of silent connections past the
//! descriptor limit, silent, idle and unresponsive peers, streams anyone may
//! open, and the descriptors the two ports share.

use std::time::{Duration, Instant};

use idempotency_coordinator::proto;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::{
    HEALTH_CHECK, HEALTH_WATCH, assert_an_authenticated_call_proceeds, grpc_request, grpc_status,
    h2_connect, prefix, token_file,
};
use crate::helpers::*;

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

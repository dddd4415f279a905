//! The network edge against clients that do not play by the rules, spoken
//! to in raw HTTP/2 or raw TCP: what a client without credentials, a slow
//! client, a silent one or a vanished one can make the server hold. Request
//! bodies in `bodies`, connections and streams in `connections`, what a call
//! hears and what the log keeps of it in `calls`; here, what they share.

mod bodies;
mod calls;
mod connections;

use bytes::Bytes;
use http::Request;
use idempotency_coordinator::proto;
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

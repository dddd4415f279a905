//! The HTTP/JSON door against what a hostile peer sends: credentials
//! before a byte of budget, budgets grown as bytes arrive and shared out by
//! tenant and connection, JSON counted before it is parsed, browsers'
//! cross-site requests, and HTTP/1.1 as RFC 9112 has it. Byte budgets and
//! the JSON limit in `budgets`, what is refused from a request's head or
//! field names in `requests`; here, what they share.

mod budgets;
mod requests;

use std::net::SocketAddr;
use std::time::Duration;

use idempotency_coordinator::proto::coordinator_client::CoordinatorClient;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

use crate::helpers::*;

const TOKEN_A: &str = "tenant-a-secret-token-1";
const TOKEN_B: &str = "tenant-b-secret-token-2";

/// A server process requiring credentials (tenants a and b), with its
/// HTTP/JSON and metrics ports.
async fn guarded_server(db: &TestDatabase, tokens: &TokenFile) -> (ServerProcess, SocketAddr) {
    let path = tokens.path.to_str().unwrap();
    let server = ServerProcess::start_with(
        &db.url,
        &[
            "--auth-tokens",
            path,
            "--http-listen",
            "127.0.0.1:0",
            "--metrics-listen",
            "127.0.0.1:0",
            "--sweep-interval",
            "0s",
            // The bodies these tests hold open must stay held for the
            // whole test, however slowly a loaded machine runs it: the
            // default 10 s would free a tenant's share in the middle.
            "--request-body-timeout",
            "300s",
        ],
    )
    .await;
    let http = server.logged_addr("serving HTTP/JSON");
    (server, http)
}

fn tokens() -> TokenFile {
    TokenFile::new(&format!("{TOKEN_A} tenant-a\n{TOKEN_B} tenant-b\n"))
}

/// The head of a POST to `path` (Content-Type JSON), with `extra` header
/// lines (each ending in CRLF) and no blank line after them yet.
/// A request's head, to a Host the door answers without credentials
/// (`--http-allowed-hosts`: IP addresses and localhost).
fn head(path: &str, extra: &str) -> String {
    format!("POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n{extra}")
}

/// Reads an answer's status code from `tcp`, if one arrives within 5 s.
async fn status_of(tcp: &mut (impl tokio::io::AsyncRead + Unpin)) -> Option<u16> {
    let mut answer = Vec::new();
    let read = async {
        let mut buf = [0u8; 4096];
        loop {
            let n = tcp.read(&mut buf).await.ok()?;
            if n == 0 {
                return None;
            }
            answer.extend_from_slice(&buf[..n]);
            if answer.windows(4).any(|w| w == b"\r\n\r\n") {
                let text = String::from_utf8_lossy(&answer);
                return text.split(' ').nth(1)?.parse().ok();
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(5), read)
        .await
        .ok()
        .flatten()
}

/// Sends `bytes` on a new connection to `addr` and reads the answer's
/// status.
async fn raw(addr: SocketAddr, bytes: &[u8]) -> Option<u16> {
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    tcp.write_all(bytes).await.unwrap();
    status_of(&mut tcp).await
}

fn http_client() -> reqwest::Client {
    idempotency_coordinator::tls::install_crypto_provider();
    reqwest::Client::new()
}

async fn scrape(server: &ServerProcess) -> String {
    let addr = server.logged_addr("serving metrics at /metrics");
    http_client()
        .get(format!("http://{addr}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

/// The value of the sample line that starts with `series`.
fn sample(scrape: &str, series: &str) -> f64 {
    scrape
        .lines()
        .find_map(|line| line.strip_prefix(series))
        .and_then(|rest| rest.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {series} in\n{scrape}"))
}

async fn grpc_client(server: &ServerProcess, token: &str) -> AuthedClient {
    let channel = tonic::transport::Channel::from_shared(format!("http://{}", server.addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let value = format!("Bearer {token}").parse().unwrap();
    CoordinatorClient::with_interceptor(channel, Bearer(value))
}

async fn http_app() -> TestApp {
    spawn_app_with(|c| c.http_listen = Some("127.0.0.1:0".parse().unwrap())).await
}

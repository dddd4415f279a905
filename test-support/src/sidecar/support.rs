//! A coordinator process on a fresh database, a counting upstream, the
//! sidecar between them (in this process, started as the binary starts
//! it), and an HTTP client.

use std::time::Duration;

use bytes::Bytes;
use clap::Parser as _;
use http::{HeaderMap, Method, Request, StatusCode};
use http_body_util::{BodyExt as _, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use idempotency_sidecar::config::Args;

use super::upstream::TestUpstream;
use crate::faults::binary;
use crate::helpers::{Launch, ServerProcess, TestDatabase};

/// The coordinator binary on a database of its own.
pub struct Coordinator {
    pub server: ServerProcess,
    pub db: TestDatabase,
}

impl Coordinator {
    pub async fn start() -> Coordinator {
        Coordinator::start_with(&[]).await
    }

    /// With `flags` beyond the health interval.
    pub async fn start_with(flags: &[&str]) -> Coordinator {
        let db = TestDatabase::create().await;
        let launch = Launch {
            binary: Some(binary::path()),
            ..Launch::default()
        };
        let mut all = vec!["--health-interval", "200ms"];
        all.extend_from_slice(flags);
        let server = ServerProcess::launch(&db.url, &all, launch).await;
        Coordinator { server, db }
    }

    pub fn endpoint(&self) -> String {
        format!("http://{}", self.server.addr)
    }
}

/// Everything one test needs.
pub struct Env {
    pub sidecar: idempotency_sidecar::Running,
    pub upstream: TestUpstream,
    pub coordinator: Coordinator,
    pub client: TestClient,
}

impl Env {
    /// The sidecar with `flags` beyond where it listens and what it fronts.
    pub async fn start(flags: &[&str]) -> Env {
        let coordinator = Coordinator::start().await;
        let upstream = TestUpstream::start().await;
        let sidecar = start_sidecar(&upstream.url(), &coordinator.endpoint(), flags).await;
        let client = TestClient::new(sidecar.addr);
        Env {
            sidecar,
            upstream,
            coordinator,
            client,
        }
    }

    pub async fn records(&self) -> i64 {
        self.coordinator.db.count_records().await
    }

    /// The metrics listener's answer on `path`.
    pub async fn ops(&self, path: &str) -> Reply {
        TestClient::new(self.sidecar.metrics_addr)
            .send(Method::GET, path, None, "", &[])
            .await
    }
}

pub async fn start_sidecar(
    upstream: &str,
    coordinator: &str,
    flags: &[&str],
) -> idempotency_sidecar::Running {
    let mut args = vec![
        "idempotency-sidecar",
        "--listen",
        "127.0.0.1:0",
        "--metrics-listen",
        "127.0.0.1:0",
        "--upstream",
        upstream,
        "--coordinator",
        coordinator,
        "--health-interval",
        "200ms",
        "--problem-docs",
        "https://docs.test/sidecar.md",
    ];
    args.extend_from_slice(flags);
    let args = Args::try_parse_from(args).expect("the sidecar's flags");
    idempotency_sidecar::start(&args)
        .await
        .expect("start the sidecar")
}

/// An answer, whole.
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Reply {
    pub fn replayed(&self) -> bool {
        self.headers
            .get("idempotent-replayed")
            .is_some_and(|v| v == "true")
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The `type` of a problem answer.
    pub fn problem_type(&self) -> String {
        assert_eq!(
            self.headers["content-type"], "application/problem+json",
            "{self:?}"
        );
        let problem: serde_json::Value = serde_json::from_slice(&self.body).unwrap();
        problem["type"].as_str().unwrap().to_owned()
    }
}

/// An HTTP/1.1 client of one address.
#[derive(Clone)]
pub struct TestClient {
    addr: std::net::SocketAddr,
    client: Client<HttpConnector, Full<Bytes>>,
}

impl TestClient {
    pub fn new(addr: std::net::SocketAddr) -> TestClient {
        TestClient {
            addr,
            client: Client::builder(TokioExecutor::new()).build(HttpConnector::new()),
        }
    }

    pub fn h2c(addr: std::net::SocketAddr) -> TestClient {
        TestClient {
            addr,
            client: Client::builder(TokioExecutor::new())
                .http2_only(true)
                .build(HttpConnector::new()),
        }
    }

    /// `method path` with `key` (sent as it is: quote it for an
    /// sf-string), `body`, and `headers`.
    pub async fn send(
        &self,
        method: Method,
        path: &str,
        key: Option<&str>,
        body: impl Into<Bytes>,
        headers: &[(&str, &str)],
    ) -> Reply {
        let mut request = Request::builder()
            .method(method)
            .uri(format!("http://{}{path}", self.addr))
            .header("content-type", "application/json");
        if let Some(key) = key {
            request = request.header("idempotency-key", key);
        }
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let request = request.body(Full::new(body.into())).unwrap();
        let response = tokio::time::timeout(Duration::from_secs(60), self.client.request(request))
            .await
            .expect("an answer within 60 s")
            .expect("an answer");
        let (head, body) = response.into_parts();
        let body = body.collect().await.expect("the whole body").to_bytes();
        Reply {
            status: head.status,
            headers: head.headers,
            body,
        }
    }

    pub async fn post(&self, path: &str, key: &str, body: &str) -> Reply {
        self.send(Method::POST, path, Some(key), body.to_owned(), &[])
            .await
    }
}

/// A unique key per test.
pub fn fresh_key() -> String {
    format!("\"k-{}\"", uuid::Uuid::new_v4().simple())
}

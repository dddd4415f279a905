//! A real Prometheus in a temporary directory, scraping one server every
//! second, with the alert rules loaded; asked through its HTTP API.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt as _, Empty};
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tokio::net::TcpStream;
use tokio::process::{Child, Command};

/// The Prometheus binary, if there is one; without it, and without `CI`,
/// says that the test is skipped.
pub fn binary() -> Option<PathBuf> {
    let path = std::env::var_os("PROMETHEUS").map_or_else(
        || {
            PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("target/ci-tools/prometheus/usr/bin/prometheus")
        },
        PathBuf::from,
    );
    if path.exists() {
        return Some(path);
    }
    crate::helpers::skip_without(
        &format!("Prometheus ({}; or name one in PROMETHEUS)", path.display()),
        "the dashboard test",
        "bash .ci/prometheus",
    );
    None
}

pub struct Prometheus {
    child: Child,
    addr: SocketAddr,
    _dir: TempDir,
}

/// A directory removed on drop.
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// GET `path` from `addr`: the status and the body as JSON.
async fn get(addr: SocketAddr, path: &str) -> Option<(u16, Value)> {
    let stream = TcpStream::connect(addr).await.ok()?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .ok()?;
    tokio::spawn(connection);
    let request = http::Request::builder()
        .uri(path)
        .header("host", addr.to_string())
        .body(Empty::<Bytes>::new())
        .ok()?;
    let response = sender.send_request(request).await.ok()?;
    let status = response.status().as_u16();
    let body = response.into_body().collect().await.ok()?.to_bytes();
    Some((status, serde_json::from_slice(&body).unwrap_or(Value::Null)))
}

impl Prometheus {
    pub async fn start(binary: &Path, target: SocketAddr) -> Prometheus {
        let dir = std::env::temp_dir().join(format!("prometheus-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        let rules = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("deploy/prometheus/alerts.yaml");
        let config = format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
             rule_files:\n  - {}\n\
             scrape_configs:\n  - job_name: idempotency\n    static_configs:\n      - targets: ['{target}']\n",
            rules.display()
        );
        std::fs::write(dir.join("prometheus.yml"), config).unwrap();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        drop(listener);
        let child = Command::new(binary)
            .arg(format!(
                "--config.file={}",
                dir.join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .arg("--log.level=warn")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .expect("start prometheus");
        let prometheus = Prometheus {
            child,
            addr,
            _dir: TempDir(dir),
        };
        for _ in 0..300 {
            if let Some((200, _)) = get(addr, "/-/ready").await {
                return prometheus;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("Prometheus did not become ready");
    }

    /// Whether `expr` parses and, within `within`, returns at least one
    /// series.
    pub async fn returns_data(&self, expr: &str, within: Duration) -> bool {
        let query: String = form_urlencoded::Serializer::new(String::new())
            .append_pair("query", expr)
            .finish();
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let answer = get(self.addr, &format!("/api/v1/query?{query}")).await;
            if let Some((status, body)) = &answer {
                assert!(*status != 400, "{expr} does not parse: {body}");
                let series = body["data"]["result"].as_array().map_or(0, Vec::len);
                if body["status"] == "success" && series > 0 {
                    return true;
                }
            }
            if tokio::time::Instant::now() > deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// The rule groups Prometheus loaded.
    pub async fn rule_groups(&self) -> Vec<String> {
        let (_, body) = get(self.addr, "/api/v1/rules").await.expect("the rules");
        body["data"]["groups"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|g| g["name"].as_str().map(str::to_owned))
            .collect()
    }

    pub async fn stop(mut self) {
        let _ = self.child.kill().await;
    }
}

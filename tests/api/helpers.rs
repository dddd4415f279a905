//! Boots the real server against a fresh database of its own, on port 0.

use std::future::Future;
use std::net::SocketAddr;
use std::process::Stdio;
use std::sync::{Arc, Once};
use std::time::{Duration, Instant};

use idempotency_coordinator::config::ServeConfig;
use idempotency_coordinator::notify::Hub;
use idempotency_coordinator::proto::coordinator_client::CoordinatorClient;
use idempotency_coordinator::proto::{self, acquire_request, complete_request};
use idempotency_coordinator::startup::Application;
use idempotency_coordinator::store::{Clock, Store};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::sync::oneshot;
use tonic::transport::Channel;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};

pub const DEFAULT_DATABASE_URL: &str = "postgres://postgres@127.0.0.1:5432/postgres";

pub fn database_url() -> String {
    std::env::var("DATABASE_URL").unwrap_or_else(|_| DEFAULT_DATABASE_URL.to_owned())
}

/// `url` pointing at database `name` instead (URL or key=value form).
fn with_database(url: &str, name: &str) -> String {
    if let Some(rest) = url
        .strip_prefix("postgres://")
        .or_else(|| url.strip_prefix("postgresql://"))
    {
        let (authority_and_path, query) = rest.split_once('?').unwrap_or((rest, ""));
        let authority = authority_and_path.split('/').next().unwrap_or_default();
        let query = if query.is_empty() {
            String::new()
        } else {
            format!("?{query}")
        };
        format!("postgres://{authority}/{name}{query}")
    } else {
        format!("{url} dbname={name}")
    }
}

fn init_tracing() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        if std::env::var_os("TEST_LOG").is_some() {
            tracing_subscriber::fmt()
                .with_env_filter("debug,h2=info,tower=info,hyper=info")
                .with_test_writer()
                .init();
        }
    });
}

async fn admin_connect(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap_or_else(|e| panic!("cannot connect to PostgreSQL at {url}: {e}. Is it running?"));
    tokio::spawn(connection);
    client
}

/// A database created for one test and dropped when the test ends.
pub struct TestDatabase {
    pub name: String,
    pub url: String,
}

impl TestDatabase {
    pub async fn create() -> Self {
        let admin_url = database_url();
        let name = format!("idem_test_{}", uuid::Uuid::new_v4().simple());
        let admin = admin_connect(&admin_url).await;
        admin
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .await
            .expect("create test database");
        TestDatabase {
            url: with_database(&admin_url, &name),
            name,
        }
    }

    pub async fn connect(&self) -> tokio_postgres::Client {
        admin_connect(&self.url).await
    }

    pub async fn count_records(&self) -> i64 {
        self.connect()
            .await
            .query_one("SELECT count(*) FROM idempotency_keys", &[])
            .await
            .expect("count records")
            .get(0)
    }
}

impl Drop for TestDatabase {
    fn drop(&mut self) {
        let name = self.name.clone();
        // Drop runs outside any async context we could borrow, so clean up on
        // a thread with a runtime of its own.
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("cleanup runtime");
            rt.block_on(async move {
                if let Ok((client, connection)) =
                    tokio_postgres::connect(&database_url(), tokio_postgres::NoTls).await
                {
                    tokio::spawn(connection);
                    let _ = client
                        .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                        .await;
                }
            });
        })
        .join();
    }
}

/// One in-process server, as production builds it.
pub struct TestServer {
    pub addr: SocketAddr,
    pub client: CoordinatorClient<Channel>,
    /// The server's clock offset: advance it instead of sleeping.
    pub clock: Clock,
    /// The server's waiter registry, to see how many calls wait.
    pub hub: Arc<Hub>,
    /// The server's store, to see how many calls wait for a batch.
    pub store: Store,
    shutdown: Option<oneshot::Sender<()>>,
    handle: Option<tokio::task::JoinHandle<()>>,
}

impl TestServer {
    pub async fn channel(&self) -> Channel {
        Channel::from_shared(format!("http://{}", self.addr))
            .unwrap()
            .connect()
            .await
            .expect("connect to the test server")
    }

    /// Asks the server to stop, then waits until it has.
    pub async fn stop(mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(handle) = self.handle.take() {
            handle.await.expect("server task");
        }
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
    }
}

pub async fn start_server(config: ServeConfig) -> TestServer {
    init_tracing();
    let app = Application::build(config).await.expect("build the server");
    run_app(app).await
}

/// Runs a built server in the background until the returned handle stops it.
pub async fn run_app(app: Application) -> TestServer {
    let addr = app.local_addr();
    let clock = app.clock();
    let hub = app.hub();
    let store = app.store();
    let (tx, rx) = oneshot::channel();
    let handle = tokio::spawn(async move {
        app.run_until(async {
            let _ = rx.await;
        })
        .await
        .expect("server run");
    });
    let client = CoordinatorClient::connect(format!("http://{addr}"))
        .await
        .expect("connect to the test server");
    TestServer {
        addr,
        client,
        clock,
        hub,
        store,
        shutdown: Some(tx),
        handle: Some(handle),
    }
}

/// A fresh database and a server on it; the database lives as long as the
/// returned guard.
pub struct TestApp {
    pub server: TestServer,
    pub db: TestDatabase,
}

impl std::ops::Deref for TestApp {
    type Target = TestServer;
    fn deref(&self) -> &TestServer {
        &self.server
    }
}

pub async fn spawn_app() -> TestApp {
    spawn_app_with(|_| {}).await
}

pub async fn spawn_app_with(configure: impl FnOnce(&mut ServeConfig)) -> TestApp {
    let db = TestDatabase::create().await;
    let mut config = ServeConfig::new("127.0.0.1:0".parse().unwrap(), db.url.clone());
    configure(&mut config);
    let server = start_server(config).await;
    TestApp { server, db }
}

/// The server binary in a process of its own.
pub struct ServerProcess {
    pub addr: SocketAddr,
    child: tokio::process::Child,
    /// Every line the server has logged so far.
    logs: Arc<std::sync::Mutex<Vec<String>>>,
}

/// How a server process is started, beyond its flags.
#[derive(Default)]
pub struct Launch<'a> {
    /// Environment variables set for the server (`RUST_LOG` is otherwise
    /// removed).
    pub env: &'a [(&'a str, &'a str)],
    /// The server's open file limit (soft and hard), when set.
    pub open_files: Option<u64>,
}

impl ServerProcess {
    pub async fn start(database_url: &str) -> Self {
        Self::start_with(database_url, &[]).await
    }

    pub async fn start_with(database_url: &str, extra: &[&str]) -> Self {
        Self::launch(database_url, extra, Launch::default()).await
    }

    pub async fn launch(database_url: &str, extra: &[&str], launch: Launch<'_>) -> Self {
        let mut command =
            tokio::process::Command::new(env!("CARGO_BIN_EXE_idempotency-coordinator"));
        command
            .args(["--log-format", "json", "serve", "--listen", "127.0.0.1:0"])
            .args(["--database-url", database_url])
            .args(extra)
            .env_remove("RUST_LOG")
            .envs(launch.env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        if let Some(files) = launch.open_files {
            // SAFETY: setrlimit is async-signal-safe and touches no memory
            // of the parent.
            unsafe {
                command.pre_exec(move || {
                    rlimit::Resource::NOFILE.set(files, files)?;
                    Ok(())
                });
            }
        }
        let mut child = command.spawn().expect("start the server binary");
        let logs = Arc::new(std::sync::Mutex::new(Vec::new()));
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let addr = tokio::time::timeout(Duration::from_secs(30), async {
            while let Some(line) = lines.next_line().await.expect("server log") {
                logs.lock().unwrap().push(line.clone());
                let Ok(entry) = serde_json::from_str::<serde_json::Value>(&line) else {
                    continue;
                };
                if entry["fields"]["message"] == "listening" {
                    let addr = entry["fields"]["addr"].as_str().expect("addr field");
                    return addr.parse::<SocketAddr>().expect("socket address");
                }
            }
            panic!("the server exited before listening");
        })
        .await
        .expect("the server did not start listening within 30 s");
        // Keep reading so the server never blocks on a full pipe.
        let kept = Arc::clone(&logs);
        tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_line().await {
                kept.lock().unwrap().push(line);
            }
        });
        ServerProcess { addr, child, logs }
    }

    /// The lines logged so far.
    pub fn logs(&self) -> Vec<String> {
        self.logs.lock().unwrap().clone()
    }

    pub async fn client(&self) -> CoordinatorClient<Channel> {
        CoordinatorClient::connect(format!("http://{}", self.addr))
            .await
            .expect("connect to the server process")
    }

    pub fn pid(&self) -> u32 {
        self.child.id().expect("running")
    }

    /// Sends `signal` (a name kill(1) knows, like HUP) to the process.
    pub fn signal(&self, signal: &str) {
        let pid = self.child.id().expect("running");
        let sent = std::process::Command::new("kill")
            .args([format!("-{signal}"), pid.to_string()])
            .status()
            .expect("run kill");
        assert!(sent.success(), "kill -{signal} {pid}");
    }

    /// Sends SIGTERM (as Kubernetes does) and waits for the process to
    /// exit; returns its status.
    pub async fn terminate(mut self) -> std::process::ExitStatus {
        self.signal("TERM");
        tokio::time::timeout(Duration::from_secs(30), self.child.wait())
            .await
            .expect("the server did not exit within 30 s of SIGTERM")
            .expect("wait for the server")
    }
}

/// Resident memory of process `pid`, in KiB (Linux).
pub fn resident_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS")
}

/// Polls `check` until it returns `Some`, failing the test at `deadline`.
pub async fn eventually<T, F, Fut>(what: &str, deadline: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let start = Instant::now();
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(
            start.elapsed() < deadline,
            "timed out after {deadline:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

// Request builders: the fields a test does not name take their defaults.

pub fn acquire(scope: &str, key: &str) -> proto::AcquireRequest {
    proto::AcquireRequest {
        scope: scope.into(),
        key: key.into(),
        ..Default::default()
    }
}

pub fn with_fingerprint(mut req: proto::AcquireRequest, fp: &str) -> proto::AcquireRequest {
    req.request_fingerprint = Some(acquire_request::RequestFingerprint::Fingerprint(fp.into()));
    req
}

pub fn secs(s: i64) -> Option<prost_types::Duration> {
    Some(prost_types::Duration {
        seconds: s,
        nanos: 0,
    })
}

pub fn success(result: &[u8]) -> complete_request::Outcome {
    complete_request::Outcome::Success(proto::Success {
        result: result.to_vec(),
        content_type: "application/json".into(),
        status_code: 201,
        result_ref: String::new(),
    })
}

pub fn failure(error: &str) -> complete_request::Outcome {
    complete_request::Outcome::Failure(proto::Failure {
        error: error.into(),
        permanent: false,
        retry_after: None,
    })
}

pub fn complete(
    scope: &str,
    key: &str,
    token: &str,
    outcome: complete_request::Outcome,
) -> proto::CompleteRequest {
    proto::CompleteRequest {
        scope: scope.into(),
        key: key.into(),
        lease_token: token.into(),
        outcome: Some(outcome),
    }
}

pub fn decision(resp: &proto::AcquireResponse) -> proto::Decision {
    proto::Decision::try_from(resp.decision).expect("known decision")
}

pub fn status_of(record: &proto::Record) -> proto::Status {
    proto::Status::try_from(record.status).expect("known status")
}

/// The ErrorInfo reason of a failed call.
pub fn reason(status: &tonic::Status) -> String {
    use tonic_types::StatusExt;
    status
        .get_error_details()
        .error_info()
        .map(|i| i.reason.clone())
        .unwrap_or_default()
}

/// The fields a BadRequest names.
pub fn bad_fields(status: &tonic::Status) -> Vec<String> {
    use tonic_types::StatusExt;
    status
        .get_error_details()
        .bad_request()
        .map(|b| b.field_violations.iter().map(|v| v.field.clone()).collect())
        .unwrap_or_default()
}

/// Seconds between two timestamps, as a float.
pub fn seconds_between(a: &prost_types::Timestamp, b: &prost_types::Timestamp) -> f64 {
    (b.seconds - a.seconds) as f64 + f64::from(b.nanos - a.nanos) / 1e9
}

/// PROCEEDs on a fresh key and returns the lease's token.
pub async fn proceed(
    client: &mut CoordinatorClient<Channel>,
    req: proto::AcquireRequest,
) -> proto::AcquireResponse {
    let resp = client.acquire(req).await.expect("acquire").into_inner();
    assert_eq!(decision(&resp), proto::Decision::Proceed, "{resp:?}");
    resp
}

pub fn token(resp: &proto::AcquireResponse) -> String {
    resp.lease.as_ref().expect("lease").token.clone()
}

pub fn get_req(scope: &str, key: &str) -> proto::GetRequest {
    proto::GetRequest {
        scope: scope.into(),
        key: key.into(),
    }
}

/// A TCP proxy in front of PostgreSQL that a test can cut and restore, to
/// play a database that goes away and comes back.
pub struct DatabaseProxy {
    pub port: u16,
    open: tokio::sync::watch::Sender<bool>,
}

impl DatabaseProxy {
    pub async fn start(target: SocketAddr) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (open, watch) = tokio::sync::watch::channel(true);
        tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                if !*watch.borrow() {
                    continue; // dropped: the connection is refused
                }
                let mut closed = watch.clone();
                tokio::spawn(async move {
                    let Ok(mut outbound) = tokio::net::TcpStream::connect(target).await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                        _ = closed.wait_for(|open| !*open) => {}
                    }
                });
            }
        });
        DatabaseProxy { port, open }
    }

    /// Drops every proxied connection and refuses new ones.
    pub fn cut(&self) {
        self.open.send_replace(false);
    }

    pub fn restore(&self) {
        self.open.send_replace(true);
    }

    /// `url` (a test database URL) rewritten to go through this proxy.
    pub fn url_for(&self, db: &TestDatabase) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{}", self.port, db.name)
    }
}

/// Waits until `count(hub)` reaches `n`, saying where it stood on failure.
async fn until_count(server: &TestServer, n: usize, what: &str, count: fn(&Hub) -> usize) {
    let start = Instant::now();
    while count(&server.hub) != n {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "timed out waiting for {n} {what}: {} now ({} waiters, {} parked)",
            count(&server.hub),
            server.hub.waiters(),
            server.hub.parked(),
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until `n` calls wait on `server`.
pub async fn until_waiters(server: &TestServer, n: usize) {
    until_count(server, n, "waiters", Hub::waiters).await;
}

/// Waits until `n` calls on `server` have read their record and sleep
/// until it changes.
pub async fn until_parked(server: &TestServer, n: usize) {
    until_count(server, n, "parked waiters", Hub::parked).await;
}

/// `n` separate connections to `addr`, so that many concurrent calls are not
/// limited by one connection's stream limit.
pub async fn clients(addr: SocketAddr, n: usize) -> Vec<CoordinatorClient<Channel>> {
    let mut all = Vec::with_capacity(n);
    for _ in 0..n {
        all.push(
            CoordinatorClient::connect(format!("http://{addr}"))
                .await
                .expect("connect"),
        );
    }
    all
}

pub fn waiting(scope: &str, key: &str, wait_secs: i64) -> proto::AcquireRequest {
    proto::AcquireRequest {
        wait: secs(wait_secs),
        ..acquire(scope, key)
    }
}

/// The record as Get returns it; the call must succeed.
pub async fn get_record(
    c: &mut CoordinatorClient<Channel>,
    req: proto::GetRequest,
) -> proto::Record {
    c.get(req)
        .await
        .expect("get")
        .into_inner()
        .record
        .expect("record")
}

/// The record as a successful Complete returns it.
pub async fn complete_ok(
    c: &mut CoordinatorClient<Channel>,
    req: proto::CompleteRequest,
) -> proto::Record {
    c.complete(req)
        .await
        .expect("complete")
        .into_inner()
        .record
        .expect("record")
}

/// A server with the background sweeper off, so tests drive Sweep alone.
pub async fn spawn_app_without_sweeper() -> TestApp {
    spawn_app_with(|c| c.sweep_interval = Duration::ZERO).await
}

/// Records in the database right now, by status.
pub async fn statuses(db: &TestDatabase) -> Vec<(String, String)> {
    db.connect()
        .await
        .query(
            "SELECT idempotency_key, status FROM idempotency_keys ORDER BY idempotency_key",
            &[],
        )
        .await
        .expect("read statuses")
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
}

pub fn sweep_req(dry_run: bool, limit: u32) -> proto::SweepRequest {
    proto::SweepRequest { dry_run, limit }
}

/// A server and its background sweeper's totals.
pub struct TotalsServer {
    pub server: TestServer,
    pub totals: Arc<idempotency_coordinator::sweeper::SweepTotals>,
}

pub async fn start_server_with_totals(config: ServeConfig) -> TotalsServer {
    init_tracing();
    let app = Application::build(config).await.expect("build the server");
    let totals = app.sweep_totals();
    TotalsServer {
        server: run_app(app).await,
        totals,
    }
}

/// How the test webhook answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WebhookMode {
    Ok,
    Fail,
    Hang,
}

/// A minimal HTTP/1.1 server on 127.0.0.1 that records each request body.
pub struct TestWebhook {
    pub url: String,
    pub bodies: tokio::sync::mpsc::UnboundedReceiver<serde_json::Value>,
}

impl TestWebhook {
    pub async fn start(mode: WebhookMode) -> Self {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/recover", listener.local_addr().unwrap());
        let (tx, bodies) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                let tx = tx.clone();
                tokio::spawn(async move {
                    let mut buffer = Vec::new();
                    let mut chunk = [0u8; 4096];
                    loop {
                        let Ok(n) = socket.read(&mut chunk).await else {
                            return;
                        };
                        if n == 0 {
                            return;
                        }
                        buffer.extend_from_slice(&chunk[..n]);
                        let text = String::from_utf8_lossy(&buffer).to_string();
                        let Some(end) = text.find("\r\n\r\n") else {
                            continue;
                        };
                        let length = text[..end]
                            .lines()
                            .find_map(|l| {
                                let (name, value) = l.split_once(':')?;
                                name.eq_ignore_ascii_case("content-length")
                                    .then(|| value.trim().parse::<usize>().ok())?
                            })
                            .unwrap_or(0);
                        if buffer.len() < end + 4 + length {
                            continue;
                        }
                        let body = &buffer[end + 4..end + 4 + length];
                        if let Ok(json) = serde_json::from_slice(body) {
                            let _ = tx.send(json);
                        }
                        match mode {
                            WebhookMode::Hang => {
                                tokio::time::sleep(Duration::from_secs(3600)).await;
                            }
                            WebhookMode::Fail => {
                                let _ = socket
                                    .write_all(b"HTTP/1.1 500 Internal Server Error\r\ncontent-length: 0\r\n\r\n")
                                    .await;
                            }
                            WebhookMode::Ok => {
                                let _ = socket.write_all(b"HTTP/1.1 204 No Content\r\n\r\n").await;
                            }
                        }
                        buffer.clear();
                    }
                });
            }
        });
        TestWebhook { url, bodies }
    }
}

/// Adds `authorization: Bearer <token>` to every call.
#[derive(Clone)]
pub struct Bearer(pub tonic::metadata::MetadataValue<tonic::metadata::Ascii>);

impl tonic::service::Interceptor for Bearer {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        request
            .metadata_mut()
            .insert("authorization", self.0.clone());
        Ok(request)
    }
}

pub type AuthedClient =
    CoordinatorClient<tonic::service::interceptor::InterceptedService<Channel, Bearer>>;

/// A client of `server` that presents `token`.
pub async fn client_with_token(server: &TestServer, token: &str) -> AuthedClient {
    let value = format!("Bearer {token}").parse().expect("ascii token");
    CoordinatorClient::with_interceptor(server.channel().await, Bearer(value))
}

/// A credentials file in the temporary directory, removed on drop.
pub struct TokenFile {
    pub path: std::path::PathBuf,
}

impl TokenFile {
    pub fn new(contents: &str) -> Self {
        let path = std::env::temp_dir().join(format!("idem-tokens-{}", uuid::Uuid::new_v4()));
        std::fs::write(&path, contents).expect("write the credentials file");
        TokenFile { path }
    }

    pub fn rewrite(&self, contents: &str) {
        std::fs::write(&self.path, contents).expect("rewrite the credentials file");
    }
}

impl Drop for TokenFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// A server running in the background without a client of its own (for TLS
/// servers, whose clients need their own settings); stops when dropped.
pub struct Serving {
    pub addr: SocketAddr,
    shutdown: Option<oneshot::Sender<()>>,
}

pub fn serve(app: Application) -> Serving {
    let addr = app.local_addr();
    let (tx, rx) = oneshot::channel();
    tokio::spawn(async move {
        app.run_until(async {
            let _ = rx.await;
        })
        .await
        .expect("server run");
    });
    Serving {
        addr,
        shutdown: Some(tx),
    }
}

impl Drop for Serving {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
    }
}

/// A holder of (s, k) whose 5 s lease ran out and was taken over: returns
/// the stale holder's answer and the new holder's.
pub async fn taken_over(app: &TestApp) -> (proto::AcquireResponse, proto::AcquireResponse) {
    let mut c = app.client.clone();
    let mut req = acquire("s", "k");
    req.lease_ttl = secs(5);
    let stale = proceed(&mut c, req.clone()).await;
    app.clock.advance(Duration::from_secs(6));
    let fresh = proceed(&mut c, req).await;
    (stale, fresh)
}

/// The readiness service name Kubernetes probes ask about.
pub const READINESS: &str = "idempotency.v1.Coordinator";

/// `server`'s health as a probe of `service` sees it.
pub async fn health(server: &TestServer, service: &str) -> ServingStatus {
    let mut client = HealthClient::new(server.channel().await);
    let resp = client
        .check(HealthCheckRequest {
            service: service.into(),
        })
        .await
        .expect("health check")
        .into_inner();
    ServingStatus::try_from(resp.status).unwrap()
}

/// Waits until `server` reports `wanted` for `service`.
pub async fn until_health(server: &TestServer, service: &str, wanted: ServingStatus) {
    eventually(
        &format!("{service:?} to be {wanted:?}"),
        Duration::from_secs(10),
        || async { (health(server, service).await == wanted).then_some(()) },
    )
    .await;
}

//! The server in-process, built as production builds it, on a fresh database of its own.

use std::net::SocketAddr;
use std::sync::{Arc, Once};
use std::time::Duration;

use idempotency_coordinator::config::ServeConfig;
use idempotency_coordinator::notify::Hub;
use idempotency_coordinator::proto::coordinator_client::CoordinatorClient;
use idempotency_coordinator::startup::Application;
use idempotency_coordinator::store::{Clock, Store};
use tokio::sync::oneshot;
use tonic::transport::Channel;

use super::database::TestDatabase;

pub fn init_tracing() {
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

/// One in-process server, as production builds it.
pub struct TestServer {
    pub addr: SocketAddr,
    /// The HTTP/JSON door's address, when the server serves it.
    pub http_addr: Option<SocketAddr>,
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
    let http_addr = app.http_addr();
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
        http_addr,
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

/// A server with the background sweeper off, so tests drive Sweep alone.
pub async fn spawn_app_without_sweeper() -> TestApp {
    spawn_app_with(|c| c.sweep_interval = Duration::ZERO).await
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

//! A test's own Citus cluster, a database on it, and the server in-process
//! on the coordinator's database, with small timeouts so that faults show
//! within seconds.

use std::net::SocketAddr;
use std::time::Duration;

use idempotency_coordinator::config::ServeConfig;
use idempotency_coordinator::startup::Application;
use tokio::sync::oneshot;

use crate::harness::{self, CitusDatabase};

/// One fault test at a time: each starts a cluster, and their timings are
/// the point.
pub async fn serial() -> tokio::sync::MutexGuard<'static, ()> {
    static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    SERIAL.lock().await
}

/// A private cluster, its database, and a server on it.
pub struct Env {
    pub db: CitusDatabase,
    pub addr: SocketAddr,
    /// The server's waiters, to see when one is parked.
    pub hub: std::sync::Arc<idempotency_coordinator::notify::Hub>,
    shutdown: Option<oneshot::Sender<()>>,
    server: Option<tokio::task::JoinHandle<()>>,
}

impl Env {
    /// `None` when Citus is not installed (the test is skipped).
    pub async fn start() -> Option<Env> {
        let cluster = Env::cluster().await?;
        Some(Env::start_on(CitusDatabase::create_on(cluster).await).await)
    }

    /// A private cluster for [`Env::start_on`]; `None` when Citus is not
    /// installed.
    pub async fn cluster() -> Option<std::sync::Arc<harness::Cluster>> {
        tokio::task::spawn_blocking(harness::private_cluster)
            .await
            .expect("start the cluster")
    }

    /// The server on `db`.
    pub async fn start_on(db: CitusDatabase) -> Env {
        crate::server_log::keep();
        let mut config = ServeConfig::new("127.0.0.1:0".parse().unwrap(), db.url.clone());
        config.store.connect_wait = Duration::from_millis(300);
        config.store.query_timeout = Duration::from_secs(1);
        config.health_interval = Duration::from_millis(200);
        // Sweeping spans shards: not on Citus yet (docs/scaling.md).
        config.sweep_interval = Duration::ZERO;
        let app = Application::build(config).await.expect("build the server");
        assert!(
            app.store().distributed(),
            "the server found the Citus coordinator"
        );
        let addr = app.local_addr();
        let hub = app.hub();
        let (tx, rx) = oneshot::channel();
        let server = tokio::spawn(async move {
            app.run_until(async {
                let _ = rx.await;
            })
            .await
            .expect("server run");
        });
        Env {
            db,
            addr,
            hub,
            shutdown: Some(tx),
            server: Some(server),
        }
    }

    /// Stops the server, then (on drop) the database and the cluster.
    pub async fn stop(mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(server) = self.server.take() {
            let _ = tokio::time::timeout(Duration::from_secs(10), server).await;
        }
    }

    /// Runs a blocking cluster operation (starting or stopping a node) off
    /// the runtime's threads.
    pub async fn on_cluster<T: Send + 'static>(
        &self,
        op: impl FnOnce(&harness::Cluster) -> T + Send + 'static,
    ) -> T {
        let cluster = std::sync::Arc::clone(&self.db.cluster);
        tokio::task::spawn_blocking(move || op(&cluster))
            .await
            .expect("cluster operation")
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        if let Some(server) = self.server.take() {
            server.abort();
        }
    }
}

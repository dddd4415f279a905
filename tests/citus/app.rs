//! The server in-process (as `tests/api` starts it) on a fresh database of
//! the Citus cluster, through the coordinator node.

use idempotency_coordinator::config::ServeConfig;

use crate::harness::CitusDatabase;
use crate::helpers::{TestServer, start_server};

pub struct CitusApp {
    pub server: TestServer,
    pub db: CitusDatabase,
}

impl std::ops::Deref for CitusApp {
    type Target = TestServer;
    fn deref(&self) -> &TestServer {
        &self.server
    }
}

/// Another server on `db`, its configuration changed by `configure`.
pub async fn server_on(db: &CitusDatabase, configure: impl FnOnce(&mut ServeConfig)) -> TestServer {
    let mut config = ServeConfig::new("127.0.0.1:0".parse().unwrap(), db.url.clone());
    configure(&mut config);
    let server = start_server(config).await;
    assert!(server.store.distributed(), "the server recognised Citus");
    server
}

/// A server on a fresh Citus database; `None` when the cluster is skipped.
pub async fn spawn_citus_app() -> Option<CitusApp> {
    spawn_citus_app_with(|_| {}).await
}

/// [`spawn_citus_app`] with the server's configuration changed by
/// `configure`.
pub async fn spawn_citus_app_with(configure: impl FnOnce(&mut ServeConfig)) -> Option<CitusApp> {
    let db = CitusDatabase::create().await?;
    let server = server_on(&db, configure).await;
    Some(CitusApp { server, db })
}

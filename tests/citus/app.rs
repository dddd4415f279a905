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

/// A server on a fresh Citus database; `None` when the cluster is skipped.
pub async fn spawn_citus_app() -> Option<CitusApp> {
    spawn_citus_app_with(|_| {}).await
}

/// The same, configured by `configure`.
pub async fn spawn_citus_app_with(configure: impl FnOnce(&mut ServeConfig)) -> Option<CitusApp> {
    let db = CitusDatabase::create().await?;
    let mut config = ServeConfig::new("127.0.0.1:0".parse().unwrap(), db.url.clone());
    configure(&mut config);
    let server = start_server(config).await;
    assert!(
        server.store.distributed(),
        "the server recognised the Citus coordinator"
    );
    Some(CitusApp { server, db })
}

/// The port of the worker that holds `key`'s shard.
pub async fn worker_of(db: &CitusDatabase, key: &str) -> u16 {
    let port: i32 = db
        .connect()
        .await
        .query_one(
            "SELECT n.nodeport FROM pg_dist_placement p JOIN pg_dist_node n USING (groupid) \
             WHERE p.shardid = get_shard_id_for_distribution_column('idempotency_keys', $1::text)",
            &[&key],
        )
        .await
        .expect("read the key's placement")
        .get(0);
    u16::try_from(port).unwrap()
}

/// The fencing token range of the node group a worker belongs to: Citus
/// starts group g's copy of a bigint sequence at g * 2^48 + 1.
pub fn range_of_group(group: u64) -> std::ops::Range<u64> {
    (group << 48) + 1..((group + 1) << 48) + 1
}

/// The node group of the worker on `port`.
pub async fn group_of(db: &CitusDatabase, port: u16) -> u64 {
    let group: i32 = db
        .connect()
        .await
        .query_one(
            "SELECT groupid FROM pg_dist_node WHERE nodeport = $1",
            &[&i32::from(port)],
        )
        .await
        .expect("read the node's group")
        .get(0);
    u64::try_from(group).unwrap()
}

//! Where the matrix runs: a fresh database on one PostgreSQL
//! ([`TestDatabase`]) or on the shared Citus cluster ([`CitusDatabase`]),
//! the paths that database adds, its gate and how many transactions wrote a
//! group commit's rows on each node.

use std::collections::{BTreeMap, BTreeSet};

use tokio_postgres::Client;

use super::Path;
use crate::citus::harness::CitusDatabase;
use crate::citus::placement;
use crate::helpers::{Gate, TestDatabase, install_gate, writers};

/// A database the matrix runs on.
// The matrix runs each test on one runtime thread: its futures need not be
// `Send`, so the trait's async fns need no bound on them.
#[allow(async_fn_in_trait)]
pub trait Backend: Sized {
    /// Paths of this database's own, besides those every database has.
    const PATHS: &'static [Path];

    /// A fresh database; `None` when this backend is skipped here.
    async fn create() -> Option<Self>;

    /// The address the servers are given.
    fn url(&self) -> &str;

    /// A connection for the test's own statements.
    async fn connect(&self) -> Client;

    /// Installs the gate trigger (`helpers::gate`), its lock held.
    async fn gate(&self) -> Gate;

    /// For each node holding some of `keys`, how many transactions last
    /// wrote their rows there.
    async fn writers_per_node(&self, keys: &[String]) -> Vec<i64>;
}

/// One PostgreSQL: no paths of its own, one node.
impl Backend for TestDatabase {
    const PATHS: &'static [Path] = &[];

    async fn create() -> Option<Self> {
        Some(TestDatabase::create().await)
    }

    fn url(&self) -> &str {
        &self.url
    }

    async fn connect(&self) -> Client {
        TestDatabase::connect(self).await
    }

    /// The gate's lock held from a connection of its own.
    async fn gate(&self) -> Gate {
        let holder = TestDatabase::connect(self).await;
        install_gate(&holder).await;
        Gate::held_by(vec![holder])
    }

    async fn writers_per_node(&self, keys: &[String]) -> Vec<i64> {
        vec![writers(&TestDatabase::connect(self).await, keys).await]
    }
}

/// A Citus cluster: the servers are given the coordinator node's address.
impl Backend for CitusDatabase {
    /// The defaults, but each call sent through the coordinator node rather
    /// than straight to the worker holding its key
    /// (`--citus-via-coordinator`).
    const PATHS: &'static [Path] = &[("via the coordinator node", |c| {
        c.store.citus_direct = false;
    })];

    /// `None` when the cluster is skipped.
    async fn create() -> Option<Self> {
        CitusDatabase::create().await
    }

    fn url(&self) -> &str {
        &self.url
    }

    async fn connect(&self) -> Client {
        CitusDatabase::connect(self).await
    }

    /// The gate trigger on `idempotency_keys`, which Citus creates on every
    /// shard: a gate key's statement then waits on the worker holding its
    /// shard. So the gate's lock is held from a connection to each worker.
    async fn gate(&self) -> Gate {
        let coordinator = CitusDatabase::connect(self).await;
        // Citus creates triggers on a distributed table only when told to:
        // it cannot check what a trigger does on the shards.
        coordinator
            .batch_execute("SET citus.enable_unsafe_triggers = on")
            .await
            .expect("allow triggers on distributed tables");
        install_gate(&coordinator).await;
        let mut holders = Vec::new();
        for port in self.cluster.workers() {
            holders.push(self.connect_worker(port).await);
        }
        Gate::held_by(holders)
    }

    /// Transaction ids are each node's own: counted per worker.
    async fn writers_per_node(&self, keys: &[String]) -> Vec<i64> {
        let writers = placement::writers(self).await;
        let mut by_node: BTreeMap<u16, BTreeSet<&str>> = BTreeMap::new();
        for key in keys {
            let (port, xmin) = writers
                .get(key)
                .unwrap_or_else(|| panic!("{key} has a row"));
            by_node.entry(*port).or_default().insert(xmin);
        }
        by_node
            .values()
            .map(|xmins| i64::try_from(xmins.len()).unwrap())
            .collect()
    }
}

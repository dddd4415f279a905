//! Where the conformance matrix (`tests/api/conformance.rs`) runs in the
//! Citus suite: a fresh database on the shared cluster, the servers given
//! the coordinator node's address. The same items as the API suite's
//! `backend` (`tests/api/conformance/backend.rs`), for a cluster.

use std::collections::{BTreeMap, BTreeSet};

use crate::conformance::Path;
use crate::harness::CitusDatabase;
use crate::helpers::{Gate, install_gate};
use crate::placement::writers;

pub type Database = CitusDatabase;

/// Paths of a cluster's own, besides those every database has: the
/// defaults, but each call sent through the coordinator node rather than
/// straight to the worker holding its key (`--citus-via-coordinator`).
pub const PATHS: &[Path] = &[("via the coordinator node", |c| {
    c.store.citus_direct = false;
})];

/// A fresh Citus database; `None` when the cluster is skipped.
pub async fn database() -> Option<Database> {
    CitusDatabase::create().await
}

/// Installs the gate trigger (`helpers::gate`) on `idempotency_keys`, which
/// Citus creates on every shard: a gate key's statement then waits on the
/// worker holding its shard. So the gate's lock is held from a connection
/// to each worker.
pub async fn gate(db: &Database) -> Gate {
    let coordinator = db.connect().await;
    // Citus creates triggers on a distributed table only when told to: it
    // cannot check what a trigger does on the shards.
    coordinator
        .batch_execute("SET citus.enable_unsafe_triggers = on")
        .await
        .expect("allow triggers on distributed tables");
    install_gate(&coordinator).await;
    let mut holders = Vec::new();
    for port in db.cluster.workers() {
        holders.push(db.connect_worker(port).await);
    }
    Gate::held_by(holders)
}

/// For each worker holding some of `keys`, how many transactions last wrote
/// their rows there (transaction ids are each node's own).
pub async fn writers_per_node(db: &Database, keys: &[String]) -> Vec<i64> {
    let writers = writers(db).await;
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

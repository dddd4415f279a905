//! Where the conformance matrix (`conformance`) runs in the API suite: a
//! fresh database on one PostgreSQL. The Citus suite runs the same matrix
//! on a Citus cluster through a module of the same name and items
//! (`tests/citus/backend.rs`).

use crate::conformance::Path;
use crate::helpers::{Gate, TestDatabase, install_gate, writers};

pub type Database = TestDatabase;

/// Paths of this database's own, besides those every database has: none.
pub const PATHS: &[Path] = &[];

/// A fresh database; always there.
pub async fn database() -> Option<Database> {
    Some(TestDatabase::create().await)
}

/// Installs the gate trigger (`helpers::gate`) in `db`, its lock held from
/// a connection of its own.
pub async fn gate(db: &Database) -> Gate {
    let holder = db.connect().await;
    install_gate(&holder).await;
    Gate::held_by(vec![holder])
}

/// For each node holding some of `keys`, how many transactions last wrote
/// their rows there: one PostgreSQL is one node.
pub async fn writers_per_node(db: &Database, keys: &[String]) -> Vec<i64> {
    vec![writers(&db.connect().await, keys).await]
}

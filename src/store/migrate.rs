//! Numbered migrations from `sql/`, embedded in the binary and applied in
//! order, each once.
//!
//! Several replicas may start at the same moment: all of them run this, and a
//! transaction-level advisory lock makes them take turns, so the first applies
//! what is missing and the others find nothing left to do. A transaction-level
//! lock (not a session-level one) is released by the commit even if the
//! connection goes back to a pool.

use sha2::{Digest, Sha256};
use tokio_postgres::Client;

use super::{CallTime, Store, StoreError};

/// One numbered SQL file.
pub struct Migration {
    pub version: i32,
    pub name: &'static str,
    pub sql: &'static str,
}

/// Every migration this binary knows, in order. A released migration is never
/// edited, not even to fix a comment: a database that applied it keeps its
/// checksum, and the server refuses to start against a changed one
/// (`MigrateError::Changed`). A change is a new file, which may
/// `CREATE OR REPLACE` what an earlier one created (0005 re-creates
/// `idempotency_acquire` that way).
pub const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        name: "schema",
        sql: include_str!("../../sql/0001_schema.sql"),
    },
    Migration {
        version: 2,
        name: "functions",
        sql: include_str!("../../sql/0002_functions.sql"),
    },
    Migration {
        version: 3,
        name: "maintenance",
        sql: include_str!("../../sql/0003_maintenance.sql"),
    },
    Migration {
        version: 4,
        name: "batches",
        sql: include_str!("../../sql/0004_batches.sql"),
    },
    Migration {
        version: 5,
        name: "final_decision",
        sql: include_str!("../../sql/0005_final_decision.sql"),
    },
    Migration {
        version: 6,
        name: "statement_deadline",
        sql: include_str!("../../sql/0006_statement_deadline.sql"),
    },
    Migration {
        version: 7,
        name: "batch_fast_paths",
        sql: include_str!("../../sql/0007_batch_fast_paths.sql"),
    },
    Migration {
        version: 8,
        name: "no_check_constraints",
        sql: include_str!("../../sql/0008_no_check_constraints.sql"),
    },
    Migration {
        version: 9,
        name: "single_key",
        sql: include_str!("../../sql/0009_single_key.sql"),
    },
];

/// An arbitrary constant naming our advisory lock among any others the
/// database's users take ("idemmigr" in ASCII).
const MIGRATION_LOCK: i64 = 0x6964_656d_6d69_6772;

#[derive(Debug, thiserror::Error)]
pub enum MigrateError {
    #[error("cannot reach the database")]
    Connect(#[source] StoreError),
    #[error("a migration statement failed")]
    Database(#[from] tokio_postgres::Error),
    #[error(
        "migration {version} ({name}) was applied with different contents; released migrations must not be edited"
    )]
    Changed { version: i32, name: &'static str },
}

fn checksum(sql: &str) -> String {
    hex::encode(Sha256::digest(sql.as_bytes()))
}

impl Store {
    /// Applies the migrations the database lacks over one pooled connection
    /// (see [`migrate`]).
    pub async fn migrate(&self) -> Result<Vec<i32>, MigrateError> {
        let mut client = self
            .connection(CallTime::default())
            .await
            .map_err(MigrateError::Connect)?;
        migrate(&mut client).await
    }
}

/// Applies the migrations the database lacks, in one transaction; returns the
/// versions applied now (empty when the schema was already current).
pub async fn migrate(client: &mut Client) -> Result<Vec<i32>, MigrateError> {
    let tx = client.transaction().await?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
        .await?;
    // Quiet: PostgreSQL's NOTICE that the table already exists would reach
    // the log at every start.
    tx.batch_execute(
        "SET LOCAL client_min_messages = warning;
         CREATE TABLE IF NOT EXISTS idempotency_schema_migrations (
             version    integer     PRIMARY KEY,
             name       text        NOT NULL,
             checksum   text        NOT NULL,
             applied_at timestamptz NOT NULL DEFAULT now()
         )",
    )
    .await?;
    let applied = tx
        .query(
            "SELECT version, checksum FROM idempotency_schema_migrations",
            &[],
        )
        .await?;
    let mut done = Vec::new();
    for migration in MIGRATIONS {
        let stored = applied
            .iter()
            .find(|row| row.get::<_, i32>("version") == migration.version);
        match stored {
            Some(row) if row.get::<_, String>("checksum") == checksum(migration.sql) => {}
            Some(_) => {
                return Err(MigrateError::Changed {
                    version: migration.version,
                    name: migration.name,
                });
            }
            None => {
                tx.batch_execute(migration.sql).await?;
                tx.execute(
                    "INSERT INTO idempotency_schema_migrations (version, name, checksum)
                     VALUES ($1, $2, $3)",
                    &[
                        &migration.version,
                        &migration.name,
                        &checksum(migration.sql),
                    ],
                )
                .await?;
                done.push(migration.version);
            }
        }
    }
    tx.commit().await?;
    Ok(done)
}

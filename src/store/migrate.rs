//! The schema and the functions of `sql/`, embedded in the binary and applied
//! at start (or by `idempotency-coordinator migrate`).
//!
//! Two kinds of file, as Flyway's versioned and repeatable migrations:
//!
//! - `sql/migrations/NNNN_name.sql` ([`MIGRATIONS`]) change the schema:
//!   tables, sequences, indexes, types. Each is applied once, in order, and
//!   recorded with its checksum in `idempotency_schema_migrations`. A
//!   released migration is never edited, not even a comment: the server
//!   refuses to start against a database that applied different contents
//!   ([`MigrateError::Changed`]). A schema change is a new numbered file.
//! - `sql/functions/*.sql` ([`FUNCTIONS`]) hold the functions, each defined
//!   in exactly one file with `CREATE OR REPLACE FUNCTION`: the only copy,
//!   edited in place. After the numbered migrations, every file whose
//!   checksum differs from the one recorded in `idempotency_schema_functions`
//!   is applied again. `CREATE OR REPLACE` cannot change a function's
//!   argument types, argument names or return type: a file that changes one
//!   begins with `DROP FUNCTION IF EXISTS name(old argument types);`, so the
//!   old definition does not live on beside the new one. A function removed
//!   for good is dropped by a numbered migration. Numbered migrations run
//!   before the functions and must not call them; the function files must
//!   not depend on each other's order either (PL/pgSQL bodies are checked
//!   when they run, and our SQL-language functions call none of ours).
//!
//! The function files are the running build's: a build started against a
//! database that another build migrated applies its own files where they
//! differ. Rolling back to an older build therefore restores its functions,
//! and during a rolling upgrade the replicas of both builds share whichever
//! functions the last replica to start applied, so a function change must
//! keep answering the older build's calls correctly (as a schema change
//! must).
//!
//! A database migrated by the pre-release chain of numbered migrations
//! (`0001_schema` .. `0009_single_key`, which defined the functions
//! themselves; a frozen copy is in `tests/fixtures/legacy-chain/`) is
//! recognised by its recorded versions, names and checksums
//! ([`PRERELEASE_CHAIN`]): `sql/prerelease_chain.sql` brings it to the
//! baseline's schema, its rows are replaced by the baseline's, and the
//! function files are applied as on a fresh database.
//!
//! On a Citus coordinator (the database has the `citus` extension), each
//! migration also distributes `idempotency_keys` by `idempotency_key` after
//! the numbered migrations and, after the function files, creates the
//! maintenance functions that run per shard or per key, delegates the
//! single-key functions to the node holding their key, and the batches'
//! routed forms to the node of their routing key (`sql/citus/`, see
//! [`super::citus`]); all do nothing new when already done. Plain
//! PostgreSQL gets exactly the above.
//!
//! Several replicas may start at the same moment: all of them run this, and a
//! transaction-level advisory lock makes them take turns, so the first applies
//! what is missing and the others find nothing left to do. A transaction-level
//! lock (not a session-level one) is released by the commit even if the
//! connection goes back to a pool. Everything is one transaction: a failure
//! anywhere leaves the database as it was.

use sha2::{Digest, Sha256};
use tokio_postgres::{Client, Transaction};

use super::{CallTime, Store, StoreError, citus};

/// One numbered schema migration.
pub struct Migration {
    /// Its place in the order, and its key in `idempotency_schema_migrations`.
    pub version: i32,
    /// The file name's words, recorded beside the version for readers.
    pub name: &'static str,
    /// The file's contents, embedded at build time.
    pub sql: &'static str,
}

/// Every numbered migration this binary knows, in order. Released ones are
/// never edited (see the module documentation).
pub const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        name: "baseline",
        sql: include_str!("../../sql/migrations/0001_baseline.sql"),
    },
    Migration {
        version: 2,
        name: "admin",
        sql: include_str!("../../sql/migrations/0002_admin.sql"),
    },
    Migration {
        version: 3,
        name: "less_wal_per_cycle",
        sql: include_str!("../../sql/migrations/0003_less_wal_per_cycle.sql"),
    },
    Migration {
        version: 4,
        name: "complete_logs_what_it_changes",
        sql: include_str!("../../sql/migrations/0004_complete_logs_what_it_changes.sql"),
    },
    Migration {
        version: 6,
        name: "processing_by_tenant_and_scope",
        sql: include_str!("../../sql/migrations/0006_processing_by_tenant_and_scope.sql"),
    },
    Migration {
        version: 7,
        name: "one_index_of_leases",
        sql: include_str!("../../sql/migrations/0007_one_index_of_leases.sql"),
    },
];

/// One file of functions, applied again whenever its contents change.
pub struct FunctionFile {
    /// The file's name without `.sql`, its key in
    /// `idempotency_schema_functions`.
    pub name: &'static str,
    /// The file's contents, embedded at build time.
    pub sql: &'static str,
}

/// Every function file, in the order they are applied (which does not
/// matter, see the module documentation).
pub const FUNCTIONS: &[FunctionFile] = &[
    FunctionFile {
        name: "common",
        sql: include_str!("../../sql/functions/common.sql"),
    },
    FunctionFile {
        name: "deadline",
        sql: include_str!("../../sql/functions/deadline.sql"),
    },
    FunctionFile {
        name: "acquire",
        sql: include_str!("../../sql/functions/acquire.sql"),
    },
    FunctionFile {
        name: "complete",
        sql: include_str!("../../sql/functions/complete.sql"),
    },
    FunctionFile {
        name: "complete_in_tx",
        sql: include_str!("../../sql/functions/complete_in_tx.sql"),
    },
    FunctionFile {
        name: "extend_lease",
        sql: include_str!("../../sql/functions/extend_lease.sql"),
    },
    FunctionFile {
        name: "get",
        sql: include_str!("../../sql/functions/get.sql"),
    },
    FunctionFile {
        name: "watch",
        sql: include_str!("../../sql/functions/watch.sql"),
    },
    FunctionFile {
        name: "batches",
        sql: include_str!("../../sql/functions/batches.sql"),
    },
    FunctionFile {
        name: "sweep",
        sql: include_str!("../../sql/functions/sweep.sql"),
    },
    FunctionFile {
        name: "due",
        sql: include_str!("../../sql/functions/due.sql"),
    },
    FunctionFile {
        name: "admin",
        sql: include_str!("../../sql/functions/admin.sql"),
    },
];

/// One migration of the pre-release chain, as a database that applied it
/// recorded it.
pub struct PrereleaseMigration {
    /// The version it was recorded under.
    pub version: i32,
    /// The name it was recorded under.
    pub name: &'static str,
    /// The checksums of the contents it had at any time (0007, 0008 and 0009
    /// were edited after they landed: 0007's functions, 0008's and 0009's
    /// comments; the schema they made never changed).
    pub checksums: &'static [&'static str],
}

/// The pre-release chain that [`MIGRATIONS`]' baseline replaces. A database
/// whose recorded migrations are a prefix of it, at least up to 0003 (the
/// last that created schema the later ones did not touch), is upgraded to
/// the baseline.
pub const PRERELEASE_CHAIN: &[PrereleaseMigration] = &[
    PrereleaseMigration {
        version: 1,
        name: "schema",
        checksums: &["310f3801020bb834bc815cc56fbd2be8da88c3c701378c219b833e720a62d7b1"],
    },
    PrereleaseMigration {
        version: 2,
        name: "functions",
        checksums: &["e9cc587dcbbed6789de4687c252f4ca34b9a92650fe0f716bcf86d0e442bb218"],
    },
    PrereleaseMigration {
        version: 3,
        name: "maintenance",
        checksums: &["7d95299c76f5a26d529ce19a8aebcd2587f86b1ee978371fc768e3a7006b7b74"],
    },
    PrereleaseMigration {
        version: 4,
        name: "batches",
        checksums: &["2b63a5c39c87bd6c369692bc729fdf4ef80ba565b37886ea257b53b58c5994c2"],
    },
    PrereleaseMigration {
        version: 5,
        name: "final_decision",
        checksums: &["d779b8c81ea28d2248f8f7839bbba6747ee3335962067348a73221d64a353da4"],
    },
    PrereleaseMigration {
        version: 6,
        name: "statement_deadline",
        checksums: &["e03575c697f9ef5748a78acd270cc9501c8f357d476f43af02996afe1be30a3c"],
    },
    PrereleaseMigration {
        version: 7,
        name: "batch_fast_paths",
        checksums: &[
            "ea54cd283775a5f55bbe489f305301018cb137947fb49085205bf757653472cb",
            "66ed9d1d1de2d2b42b0c41f9ab0be7b976ee483243e4841d7604d0bad2ea9912",
        ],
    },
    PrereleaseMigration {
        version: 8,
        name: "no_check_constraints",
        checksums: &[
            "cae9957cd97a1178647e4c92dca62a4b8c94bdb67e3f291f3dc601796fbefb4e",
            "6c884a7e8e481124273f05955e7e43f0a5450408685f09ae96293737a3a5eb47",
        ],
    },
    PrereleaseMigration {
        version: 9,
        name: "single_key",
        checksums: &[
            "5adaaba52ed780caa29d57b30a46bfa1516867aa35db23b5d89c659daa009e1e",
            "6e948accecaafc2204eecb8df25c7a337cc11731d4a01f0bf2ae9211c9c435e5",
        ],
    },
];

/// The shortest prefix of [`PRERELEASE_CHAIN`] that holds the whole schema
/// but for what `sql/prerelease_chain.sql` does.
const PRERELEASE_MINIMUM: usize = 3;

const PRERELEASE_UPGRADE: &str = include_str!("../../sql/prerelease_chain.sql");

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
    Changed { version: i32, name: String },
    #[error(
        "the database holds migrations this server does not know ({found}); it was migrated by another build"
    )]
    Unknown { found: String },
}

/// What one run applied; all empty when the database was current.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Applied {
    /// A pre-release chain was recognised and replaced by the baseline.
    pub prerelease_chain_upgraded: bool,
    /// The numbered migrations applied now.
    pub migrations: Vec<i32>,
    /// The function files applied now (new or changed).
    pub functions: Vec<&'static str>,
}

impl Applied {
    pub fn is_empty(&self) -> bool {
        self == &Applied::default()
    }
}

/// The checksum recorded for a file's contents: SHA-256, in hex.
pub fn checksum(sql: &str) -> String {
    hex::encode(Sha256::digest(sql.as_bytes()))
}

impl Store {
    /// Applies what the database lacks over one pooled connection (see
    /// [`migrate`]).
    pub async fn migrate(&self) -> Result<Applied, MigrateError> {
        let mut client = self
            .connection(CallTime::default())
            .await
            .map_err(MigrateError::Connect)?;
        migrate(&mut client).await
    }
}

/// Applies the numbered migrations the database lacks and the function files
/// that changed, in one transaction; returns what it applied.
pub async fn migrate(client: &mut Client) -> Result<Applied, MigrateError> {
    let tx = client.transaction().await?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
        .await?;
    // On a Citus coordinator the table is distributed after the numbered
    // migrations and the single-key functions delegated after the function
    // files (`sql/citus/`), at every migration, so that a function file
    // applied again leaves them delegated. Citus creates objects on the
    // workers within this transaction only over one connection per node.
    let citus = citus::present(&tx).await?;
    if citus {
        tx.batch_execute("SET LOCAL citus.multi_shard_modify_mode = 'sequential'")
            .await?;
    }
    // Quiet: PostgreSQL's NOTICE that a table already exists would reach
    // the log at every start.
    tx.batch_execute(
        "SET LOCAL client_min_messages = warning;
         CREATE TABLE IF NOT EXISTS idempotency_schema_migrations (
             version    integer     PRIMARY KEY,
             name       text        NOT NULL,
             checksum   text        NOT NULL,
             applied_at timestamptz NOT NULL DEFAULT now()
         );
         CREATE TABLE IF NOT EXISTS idempotency_schema_functions (
             name       text        PRIMARY KEY,
             checksum   text        NOT NULL,
             applied_at timestamptz NOT NULL DEFAULT now()
         )",
    )
    .await?;
    let mut applied = Applied {
        prerelease_chain_upgraded: upgrade_prerelease_chain(&tx).await?,
        ..Applied::default()
    };
    applied.migrations = apply_migrations(&tx).await?;
    if citus {
        tx.batch_execute(citus::DISTRIBUTE_TABLE).await?;
    }
    applied.functions = apply_functions(&tx).await?;
    if citus {
        tx.batch_execute(citus::MAINTENANCE).await?;
        tx.batch_execute(citus::DELEGATE_FUNCTIONS).await?;
        tx.batch_execute(citus::BATCH_ROUTES).await?;
    }
    tx.commit().await?;
    Ok(applied)
}

/// The recorded migrations, by version.
async fn recorded(tx: &Transaction<'_>) -> Result<Vec<(i32, String, String)>, MigrateError> {
    Ok(tx
        .query(
            "SELECT version, name, checksum FROM idempotency_schema_migrations ORDER BY version",
            &[],
        )
        .await?
        .iter()
        .map(|row| (row.get(0), row.get(1), row.get(2)))
        .collect())
}

/// When the database was migrated by the pre-release chain, brings its
/// schema to the baseline's and records the baseline in the chain's place;
/// says whether it did. Version 1 recorded as `schema` (the baseline's is
/// `baseline`) marks that chain; then every recorded row must be one of its
/// migrations, in order from 1, with contents it had.
async fn upgrade_prerelease_chain(tx: &Transaction<'_>) -> Result<bool, MigrateError> {
    let rows = recorded(tx).await?;
    let Some((1, first, _)) = rows.first() else {
        return Ok(false);
    };
    if first != PRERELEASE_CHAIN[0].name {
        return Ok(false);
    }
    for (i, (version, name, sum)) in rows.iter().enumerate() {
        let Some(known) = PRERELEASE_CHAIN.get(i) else {
            return Err(MigrateError::Unknown {
                found: format!("{version} ({name}) after the pre-release chain"),
            });
        };
        if *version != known.version || name != known.name {
            return Err(MigrateError::Unknown {
                found: format!("{version} ({name}) in the pre-release chain's place"),
            });
        }
        if !known.checksums.contains(&sum.as_str()) {
            return Err(MigrateError::Changed {
                version: *version,
                name: name.clone(),
            });
        }
    }
    if rows.len() < PRERELEASE_MINIMUM {
        return Err(MigrateError::Unknown {
            found: format!(
                "only the pre-release chain's first {} of {} migrations",
                rows.len(),
                PRERELEASE_CHAIN.len()
            ),
        });
    }
    tx.batch_execute(PRERELEASE_UPGRADE).await?;
    tx.execute("DELETE FROM idempotency_schema_migrations", &[])
        .await?;
    let baseline = &MIGRATIONS[0];
    record_migration(tx, baseline).await?;
    Ok(true)
}

async fn record_migration(tx: &Transaction<'_>, migration: &Migration) -> Result<(), MigrateError> {
    tx.execute(
        "INSERT INTO idempotency_schema_migrations (version, name, checksum) VALUES ($1, $2, $3)",
        &[
            &migration.version,
            &migration.name,
            &checksum(migration.sql),
        ],
    )
    .await?;
    Ok(())
}

/// Applies the numbered migrations not recorded yet, refusing a database
/// whose recorded contents differ; returns the versions applied.
async fn apply_migrations(tx: &Transaction<'_>) -> Result<Vec<i32>, MigrateError> {
    let rows = recorded(tx).await?;
    let mut done = Vec::new();
    for migration in MIGRATIONS {
        match rows
            .iter()
            .find(|(version, ..)| *version == migration.version)
        {
            Some((_, _, sum)) if *sum == checksum(migration.sql) => {}
            Some(_) => {
                return Err(MigrateError::Changed {
                    version: migration.version,
                    name: migration.name.to_owned(),
                });
            }
            None => {
                tx.batch_execute(migration.sql).await?;
                record_migration(tx, migration).await?;
                done.push(migration.version);
            }
        }
    }
    Ok(done)
}

/// Applies every function file that is new or changed since it was last
/// applied; returns their names. Rows of files this binary does not know (a
/// newer build's, or a removed file's) are left alone.
async fn apply_functions(tx: &Transaction<'_>) -> Result<Vec<&'static str>, MigrateError> {
    let rows = tx
        .query(
            "SELECT name, checksum FROM idempotency_schema_functions",
            &[],
        )
        .await?;
    let mut done = Vec::new();
    for file in FUNCTIONS {
        let sum = checksum(file.sql);
        let current = rows
            .iter()
            .any(|row| row.get::<_, &str>(0) == file.name && row.get::<_, &str>(1) == sum);
        if current {
            continue;
        }
        tx.batch_execute(file.sql).await?;
        tx.execute(
            "INSERT INTO idempotency_schema_functions (name, checksum) VALUES ($1, $2)
             ON CONFLICT (name) DO UPDATE SET checksum = excluded.checksum, applied_at = now()",
            &[&file.name, &sum],
        )
        .await?;
        done.push(file.name);
    }
    Ok(done)
}

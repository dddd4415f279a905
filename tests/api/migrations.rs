//! Migrations: numbered schema migrations applied once and never edited,
//! function files applied again when they change, replicas that start
//! together taking turns, and a database of the pre-release chain upgraded
//! to the same schema as a fresh one.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use futures::future::join_all;
use idempotency_coordinator::config::ServeConfig;
use idempotency_coordinator::proto::{Decision, Status};
use idempotency_coordinator::store::migrate::{self, Applied};
use idempotency_coordinator::store::{Clock, Store, StoreConfig};
use tokio_postgres::{Client, SimpleQueryMessage};

use crate::helpers::*;

/// Every released numbered migration and its checksum. A released migration
/// is never edited: a database that applied it keeps the checksum and the
/// server refuses to start against other contents. A new migration is added
/// here when it lands.
const RELEASED: &[(i32, &str, &str)] = &[
    (
        1,
        "baseline",
        "f5821483c565c7ba08319573356b37918100c82ce5a23766665a684da0d3e461",
    ),
    (
        2,
        "admin",
        "7d800ac6d386928a8ced3f50fb9aa1e4ea502ec6bf1f2f1de5830b44be0c8885",
    ),
    (
        3,
        "less_wal_per_cycle",
        "69ca2de1101a270349e1b07c1d7d09647b0128899ea85870fd5909035bf6e222",
    ),
    (
        4,
        "complete_logs_what_it_changes",
        "f30292acc6f8c95eaf981c27646d29fc954dabaabab309b1a98829af2dc848b1",
    ),
    (
        6,
        "processing_by_tenant_and_scope",
        "4b41e8d03effa2e3202215a8e654193181a9036174fdb26fbb7f2a1c3d2b7769",
    ),
    (
        7,
        "one_index_of_leases",
        "88417e1b987a67417e137402f4506bff7f62947e3b5b2f503fdc08cceee779f6",
    ),
];

#[test]
fn released_migrations_keep_their_checksums() {
    let built: Vec<(i32, &str, String)> = migrate::MIGRATIONS
        .iter()
        .map(|m| (m.version, m.name, migrate::checksum(m.sql)))
        .collect();
    let pinned: Vec<(i32, &str, String)> = RELEASED
        .iter()
        .map(|(v, n, c)| (*v, *n, (*c).to_owned()))
        .collect();
    assert_eq!(
        built, pinned,
        "a released migration was edited (make a new numbered file instead), \
         or a new one is not pinned here yet"
    );
}

#[test]
fn every_function_is_defined_in_exactly_one_file() {
    let mut defined: BTreeMap<String, Vec<&str>> = BTreeMap::new();
    for file in migrate::FUNCTIONS {
        for name in functions_created(file.sql) {
            defined.entry(name).or_default().push(file.name);
        }
        assert!(
            !file.sql.contains("CREATE FUNCTION"),
            "{}: functions are written CREATE OR REPLACE, so that a change is applied again",
            file.name
        );
    }
    for (name, files) in &defined {
        assert_eq!(files.len(), 1, "{name} is defined in {files:?}");
    }
    assert!(defined.contains_key("idempotency_acquire"), "{defined:?}");
    for migration in migrate::MIGRATIONS {
        assert!(
            functions_created(migration.sql).is_empty()
                && !migration.sql.contains("CREATE FUNCTION"),
            "migration {} defines a function: functions belong in sql/functions/",
            migration.name
        );
    }
}

#[tokio::test]
async fn a_migrated_database_has_each_function_of_the_files_once() {
    let db = TestDatabase::create().await;
    let mut client = db.connect().await;
    migrate::migrate(&mut client).await.unwrap();
    let in_files: Vec<String> = {
        let mut all: Vec<String> = migrate::FUNCTIONS
            .iter()
            .flat_map(|f| functions_created(f.sql))
            .collect();
        all.sort();
        all
    };
    let in_database: Vec<String> = client
        .query(
            "SELECT proname::text FROM pg_proc
              WHERE pronamespace = 'public'::regnamespace ORDER BY 1",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    // Equal lists also mean no overloads: one definition per name.
    assert_eq!(in_database, in_files);
}

#[tokio::test]
async fn replicas_migrating_at_the_same_moment_apply_everything_once() {
    let db = TestDatabase::create().await;
    let config = StoreConfig::for_migrations(db.url.clone());
    let runs = (0..6).map(|_| {
        let store = Store::new(&config, Clock::default()).unwrap();
        async move { store.migrate().await.expect("migrate") }
    });
    let applied: Vec<Applied> = join_all(runs).await;
    let everything = Applied {
        prerelease_chain_upgraded: false,
        migrations: migrate::MIGRATIONS.iter().map(|m| m.version).collect(),
        functions: migrate::FUNCTIONS.iter().map(|f| f.name).collect(),
    };
    assert_eq!(
        applied.iter().filter(|a| **a == everything).count(),
        1,
        "{applied:?}"
    );
    assert_eq!(
        applied.iter().filter(|a| a.is_empty()).count(),
        5,
        "{applied:?}"
    );

    let client = db.connect().await;
    let versions: Vec<i32> = client
        .query(
            "SELECT version FROM idempotency_schema_migrations ORDER BY version",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(versions, everything.migrations);
    let functions: i64 = client
        .query_one("SELECT count(*) FROM idempotency_schema_functions", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(functions, migrate::FUNCTIONS.len() as i64);
}

#[tokio::test]
async fn an_edited_migration_is_refused() {
    let db = TestDatabase::create().await;
    let mut client = db.connect().await;
    migrate::migrate(&mut client).await.unwrap();
    client
        .execute(
            "UPDATE idempotency_schema_migrations SET checksum = 'x' WHERE version = 1",
            &[],
        )
        .await
        .unwrap();
    let err = migrate::migrate(&mut client).await.unwrap_err();
    assert!(err.to_string().contains("different contents"), "{err}");
}

#[tokio::test]
async fn a_changed_function_file_is_applied_again_and_only_it() {
    let db = TestDatabase::create().await;
    let mut client = db.connect().await;
    migrate::migrate(&mut client).await.unwrap();
    let fresh = schema(&client).await;
    // What an older build's file left: another body, another checksum.
    client
        .batch_execute(
            "CREATE OR REPLACE FUNCTION idempotency_get(
                 p_tenant text, p_scope text, p_key text, p_clock_offset_ms bigint)
             RETURNS SETOF idempotency_keys LANGUAGE sql STABLE AS $$
                 SELECT * FROM idempotency_keys WHERE false
             $$;
             UPDATE idempotency_schema_functions SET checksum = 'older' WHERE name = 'get';",
        )
        .await
        .unwrap();
    let applied = migrate::migrate(&mut client).await.unwrap();
    assert_eq!(applied.functions, ["get"], "{applied:?}");
    assert!(applied.migrations.is_empty(), "{applied:?}");
    assert_same(schema(&client).await, fresh);
    assert!(migrate::migrate(&mut client).await.unwrap().is_empty());
}

#[test]
fn the_frozen_prerelease_chain_is_the_one_the_server_recognises() {
    let files = prerelease_files();
    assert_eq!(files.len(), migrate::PRERELEASE_CHAIN.len());
    for ((version, name, sql), known) in files.iter().zip(migrate::PRERELEASE_CHAIN) {
        assert_eq!((*version, name.as_str()), (known.version, known.name));
        assert!(
            known.checksums.contains(&migrate::checksum(sql).as_str()),
            "{version} {name}: the frozen copy is not among the checksums recognised"
        );
    }
}

#[tokio::test]
async fn a_database_of_the_prerelease_chain_upgrades_to_a_fresh_databases_schema() {
    let fresh_db = TestDatabase::create().await;
    let mut fresh = fresh_db.connect().await;
    migrate::migrate(&mut fresh).await.unwrap();

    let db = TestDatabase::create().await;
    let mut client = db.connect().await;
    apply_prerelease_chain(&client, migrate::PRERELEASE_CHAIN.len()).await;
    // A record written by the pre-release functions lives on.
    client
        .execute(
            "SELECT idempotency_acquire('t', 's', 'before', '', '', 60000, 3, 3600000, 0, 0)",
            &[],
        )
        .await
        .unwrap();

    let applied = migrate::migrate(&mut client).await.unwrap();
    assert_eq!(
        applied,
        Applied {
            prerelease_chain_upgraded: true,
            // The baseline stands for the chain; the later ones are applied.
            migrations: migrate::MIGRATIONS
                .iter()
                .skip(1)
                .map(|m| m.version)
                .collect(),
            functions: migrate::FUNCTIONS.iter().map(|f| f.name).collect(),
        }
    );
    assert_same(schema(&client).await, schema(&fresh).await);
    assert_eq!(bookkeeping(&client).await, bookkeeping(&fresh).await);
    assert!(migrate::migrate(&mut client).await.unwrap().is_empty());
    assert_eq!(db.count_records().await, 1);
    drop(client);

    // A server started on the database finds it current and answers.
    serves_cycles(&db.url, &["k"]).await;
    assert_eq!(db.count_records().await, 2);
}

/// A server started on the database at `url` runs a cycle on each of
/// `keys` (new, or FAILED and due) and replays and reads its result.
async fn serves_cycles(url: &str, keys: &[&str]) {
    let server = start_server(ServeConfig::new(
        "127.0.0.1:0".parse().unwrap(),
        url.to_owned(),
    ))
    .await;
    let mut c = server.client.clone();
    for key in keys {
        let lease = proceed(&mut c, acquire("s", key)).await;
        let record = complete_ok(&mut c, complete("s", key, &token(&lease), success(b"ok"))).await;
        assert_eq!(status_of(&record), Status::Succeeded);
        let replay = c.acquire(acquire("s", key)).await.unwrap().into_inner();
        assert_eq!(decision(&replay), Decision::AlreadyDone);
        let got = get_record(&mut c, get_req("s", key)).await;
        assert_eq!(got.result.map(|r| r.result), Some(b"ok".to_vec()));
    }
    server.stop().await;
}

/// Columns of the records table in the order they are stored.
async fn column_order(client: &Client) -> Vec<String> {
    text_rows(
        client,
        "SELECT column_name FROM information_schema.columns
          WHERE table_schema = 'public' AND table_name = 'idempotency_keys'
          ORDER BY ordinal_position",
    )
    .await
}

/// A new database stores the columns a successful Complete changes after
/// those it never changes, so that its UPDATE logs only the end of the row;
/// a database whose table is in use keeps its order and answers alike.
#[tokio::test]
async fn a_new_table_stores_what_a_complete_changes_last_and_one_in_use_keeps_its_order() {
    let db = TestDatabase::create().await;
    let server = start_server(ServeConfig::new(
        "127.0.0.1:0".parse().unwrap(),
        db.url.clone(),
    ))
    .await;
    let mut c = server.client.clone();
    let lease = proceed(&mut c, acquire("s", "k")).await;
    let client = db.connect().await;
    let before: Vec<String> =
        text_rows(&client, "SELECT to_jsonb(k) FROM idempotency_keys k").await;
    complete_ok(&mut c, complete("s", "k", &token(&lease), success(b"ok"))).await;
    server.stop().await;
    let after: Vec<String> = text_rows(&client, "SELECT to_jsonb(k) FROM idempotency_keys k").await;
    let (before, after): (serde_json::Value, serde_json::Value) = (
        serde_json::from_str(&before[0]).unwrap(),
        serde_json::from_str(&after[0]).unwrap(),
    );
    let order = column_order(&client).await;
    let changed: Vec<usize> = order
        .iter()
        .enumerate()
        .filter(|(_, column)| before[column.as_str()] != after[column.as_str()])
        .map(|(position, _)| position)
        .collect();
    // Columns a Complete keeps that hold bytes (not NULL, not empty)
    // must all come before the first one it changes.
    let empty = |v: &serde_json::Value| v.is_null() || v == "" || v == "\\x";
    let kept_among_changed: Vec<&str> = order
        .iter()
        .enumerate()
        .skip(changed[0])
        .filter(|(position, column)| {
            !changed.contains(position) && !empty(&before[column.as_str()])
        })
        .map(|(_, column)| column.as_str())
        .collect();
    assert!(
        kept_among_changed.is_empty(),
        "a Complete would log again what it keeps: {kept_among_changed:?} in {order:?}"
    );

    // A database that the release before 0004 migrated and served: its
    // table holds a record when 0004 comes, so it keeps the baseline's
    // order, and a server on it answers as on a new one.
    let used = TestDatabase::create().await;
    let mut client = used.connect().await;
    let before_0004 = migrate::MIGRATIONS
        .iter()
        .take_while(|m| m.version < 4)
        .map(|m| (m.version, m.name.to_owned(), m.sql.to_owned()));
    apply_recorded(&client, before_0004).await;
    client
        .batch_execute(
            "INSERT INTO idempotency_keys (tenant, scope, idempotency_key, status, fingerprint,
                 attempt_count, max_attempts, retention, lease_token, lease_request_id,
                 next_retry_at, created_at, updated_at, expires_at)
             VALUES ('default', 's', 'old', 'FAILED', '', 1, 3, '1 hour', gen_random_uuid(), '',
                 now(), now(), now(), now() + interval '1 hour')",
        )
        .await
        .unwrap();
    let baseline = column_order(&client).await;
    assert_ne!(baseline, order, "a new table is stored in another order");
    migrate::migrate(&mut client).await.unwrap();
    assert_eq!(column_order(&client).await, baseline, "kept");
    drop(client);

    serves_cycles(&used.url, &["k", "old"]).await;
}

/// The hot calls read the record as one composite value, field by field
/// against the row type: a column dropped from the table (a later
/// migration's, which leaves its place behind) and one an operator added
/// are neither read nor in the way.
#[tokio::test]
async fn a_table_with_a_column_dropped_and_one_added_serves_alike() {
    let db = TestDatabase::create().await;
    let mut client = db.connect().await;
    migrate::migrate(&mut client).await.unwrap();
    client
        .batch_execute(
            "ALTER TABLE idempotency_keys ADD COLUMN gone integer;
             ALTER TABLE idempotency_keys ADD COLUMN operator_note text DEFAULT 'n';
             ALTER TABLE idempotency_keys DROP COLUMN gone;",
        )
        .await
        .unwrap();
    drop(client);
    serves_cycles(&db.url, &["k"]).await;
}

#[tokio::test]
async fn a_database_of_part_of_the_prerelease_chain_upgrades_too() {
    let fresh_db = TestDatabase::create().await;
    let mut fresh = fresh_db.connect().await;
    migrate::migrate(&mut fresh).await.unwrap();

    // 0001 .. 0006: the CHECK constraints still there, no column default.
    let db = TestDatabase::create().await;
    let mut client = db.connect().await;
    apply_prerelease_chain(&client, 6).await;
    let applied = migrate::migrate(&mut client).await.unwrap();
    assert!(applied.prerelease_chain_upgraded, "{applied:?}");
    assert_same(schema(&client).await, schema(&fresh).await);
    assert_eq!(bookkeeping(&client).await, bookkeeping(&fresh).await);
}

#[tokio::test]
async fn a_prerelease_migration_with_unknown_contents_is_refused() {
    let db = TestDatabase::create().await;
    let mut client = db.connect().await;
    apply_prerelease_chain(&client, migrate::PRERELEASE_CHAIN.len()).await;
    client
        .execute(
            "UPDATE idempotency_schema_migrations SET checksum = 'x' WHERE version = 4",
            &[],
        )
        .await
        .unwrap();
    let before = schema(&client).await;
    let err = migrate::migrate(&mut client).await.unwrap_err();
    assert!(err.to_string().contains("different contents"), "{err}");
    assert_eq!(schema(&client).await, before, "a refusal changes nothing");
}

/// The names a file of SQL creates functions under.
fn functions_created(sql: &str) -> Vec<String> {
    sql.lines()
        .filter_map(|line| line.strip_prefix("CREATE OR REPLACE FUNCTION "))
        .map(|rest| {
            rest.split(|c: char| c == '(' || c.is_whitespace())
                .next()
                .unwrap_or_default()
                .to_owned()
        })
        .collect()
}

fn prerelease_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/legacy-chain")
}

/// The frozen pre-release chain: (version, name, contents), in order.
fn prerelease_files() -> Vec<(i32, String, String)> {
    let mut files: Vec<(i32, String, String)> = std::fs::read_dir(prerelease_dir())
        .expect("tests/fixtures/legacy-chain")
        .map(|entry| {
            let path = entry.unwrap().path();
            let stem = path.file_stem().unwrap().to_str().unwrap().to_owned();
            let (version, name) = stem.split_once('_').unwrap();
            let sql = std::fs::read_to_string(&path).unwrap();
            (version.parse().unwrap(), name.to_owned(), sql)
        })
        .collect();
    files.sort_by_key(|(version, ..)| *version);
    files
}

/// Migrates the database as the pre-release runner did: the first `n`
/// migrations of the chain, each recorded with its checksum.
async fn apply_prerelease_chain(client: &Client, n: usize) {
    apply_recorded(client, prerelease_files().into_iter().take(n)).await;
}

/// Applies `migrations` (version, name, contents) in order, each recorded
/// with its checksum as the runner records it, into a database without a
/// record of any.
async fn apply_recorded(
    client: &Client,
    migrations: impl IntoIterator<Item = (i32, String, String)>,
) {
    client
        .batch_execute(
            "CREATE TABLE idempotency_schema_migrations (
                 version    integer     PRIMARY KEY,
                 name       text        NOT NULL,
                 checksum   text        NOT NULL,
                 applied_at timestamptz NOT NULL DEFAULT now()
             )",
        )
        .await
        .unwrap();
    for (version, name, sql) in migrations {
        client.batch_execute(&sql).await.unwrap();
        client
            .execute(
                "INSERT INTO idempotency_schema_migrations (version, name, checksum)
                 VALUES ($1, $2, $3)",
                &[&version, &name, &migrate::checksum(&sql)],
            )
            .await
            .unwrap();
    }
}

/// The schema as the catalog describes it: columns, constraints, indexes,
/// sequences, types and every function's full definition, one line each.
/// Columns by name, not by position: a table in use keeps its columns'
/// order (0004_complete_logs_what_it_changes.sql), and every reader and
/// writer names them.
async fn schema(client: &Client) -> Vec<String> {
    let queries = [
        "SELECT table_name, column_name, data_type, is_nullable, column_default
           FROM information_schema.columns WHERE table_schema = 'public'
          ORDER BY table_name, column_name",
        "SELECT conrelid::regclass::text, conname, contype, pg_get_constraintdef(oid)
           FROM pg_constraint WHERE connamespace = 'public'::regnamespace
          ORDER BY 1, 2",
        "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = 'public'
          ORDER BY indexname",
        "SELECT sequencename, data_type, start_value, min_value, max_value,
                increment_by, cycle, cache_size
           FROM pg_sequences WHERE schemaname = 'public' ORDER BY sequencename",
        "SELECT typname, typtype FROM pg_type WHERE typnamespace = 'public'::regnamespace
          ORDER BY typname",
        "SELECT p.proname, pg_get_function_identity_arguments(p.oid), pg_get_functiondef(p.oid)
           FROM pg_proc p WHERE p.pronamespace = 'public'::regnamespace
          ORDER BY 1, 2",
    ];
    let mut lines = Vec::new();
    for query in queries {
        lines.extend(text_rows(client, query).await);
    }
    lines
}

/// Fails naming only the lines that differ (a schema is long).
fn assert_same(upgraded: Vec<String>, fresh: Vec<String>) {
    let only_upgraded: Vec<&String> = upgraded.iter().filter(|l| !fresh.contains(l)).collect();
    let only_fresh: Vec<&String> = fresh.iter().filter(|l| !upgraded.contains(l)).collect();
    assert!(
        only_upgraded.is_empty() && only_fresh.is_empty(),
        "only here: {only_upgraded:#?}\nonly in the fresh database: {only_fresh:#?}"
    );
    assert_eq!(upgraded, fresh, "the same lines in another order");
}

/// What the migration tables record, but for when.
async fn bookkeeping(client: &Client) -> Vec<String> {
    let mut lines = text_rows(
        client,
        "SELECT version, name, checksum FROM idempotency_schema_migrations ORDER BY version",
    )
    .await;
    lines.extend(
        text_rows(
            client,
            "SELECT name, checksum FROM idempotency_schema_functions ORDER BY name",
        )
        .await,
    );
    lines
}

async fn text_rows(client: &Client, query: &str) -> Vec<String> {
    client
        .simple_query(query)
        .await
        .unwrap()
        .into_iter()
        .filter_map(|message| match message {
            SimpleQueryMessage::Row(row) => Some(
                (0..row.len())
                    .map(|i| row.get(i).unwrap_or("NULL"))
                    .collect::<Vec<_>>()
                    .join(" | "),
            ),
            _ => None,
        })
        .collect()
}

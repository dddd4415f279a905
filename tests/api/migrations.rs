//! Migrations: each applied once, even when replicas start together.

use futures::future::join_all;
use idempotency_coordinator::store::{Clock, Store, StoreConfig, migrate};

use crate::helpers::*;

#[tokio::test]
async fn replicas_migrating_at_the_same_moment_apply_each_migration_once() {
    let db = TestDatabase::create().await;
    let config = StoreConfig::for_migrations(db.url.clone());
    let runs = (0..6).map(|_| {
        let store = Store::new(&config, Clock::default()).unwrap();
        async move { store.migrate().await.expect("migrate") }
    });
    let applied: Vec<Vec<i32>> = join_all(runs).await;
    let all: Vec<i32> = migrate::MIGRATIONS.iter().map(|m| m.version).collect();
    assert_eq!(
        applied.iter().filter(|a| **a == all).count(),
        1,
        "{applied:?}"
    );
    assert_eq!(
        applied.iter().filter(|a| a.is_empty()).count(),
        5,
        "{applied:?}"
    );

    let rows = db
        .connect()
        .await
        .query(
            "SELECT version FROM idempotency_schema_migrations ORDER BY version",
            &[],
        )
        .await
        .unwrap();
    let versions: Vec<i32> = rows.iter().map(|r| r.get(0)).collect();
    assert_eq!(versions, all);
}

#[tokio::test]
async fn an_edited_migration_is_refused() {
    let db = TestDatabase::create().await;
    let client = db.connect().await;
    let mut client = client;
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

//! Maintenance on the cluster: Sweep and the background sweeper run shard
//! by shard on the workers, the due count adds up every shard, and the
//! recovery feed hands each due record on any worker to one subscriber.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use idempotency_coordinator::domain::{
    AcquireCommand, Fingerprint, Key, RecordId, RequestId, Scope, Tenant,
};
use idempotency_coordinator::proto::{self, complete_request::Outcome};
use idempotency_coordinator::recovery::WebhookConfig;
use idempotency_coordinator::store::CallTime;
use tokio_stream::StreamExt;

use crate::app::{CitusApp, spawn_citus_app_with};
use crate::helpers::*;
use crate::placement::worker_of;

/// Keys named `prefix-0` ... `prefix-7`, checked to live on both workers.
async fn spread(app: &CitusApp, prefix: &str) -> Vec<String> {
    let keys: Vec<String> = (0..8).map(|i| format!("{prefix}-{i}")).collect();
    let mut workers = BTreeSet::new();
    for key in &keys {
        workers.insert(worker_of(&app.db, key).await);
    }
    assert_eq!(workers.len(), 2, "{prefix}'s keys span both workers");
    keys
}

/// A record that succeeded with `retention_secs` of retention.
async fn done(app: &CitusApp, key: &str, retention_secs: i64) {
    let mut c = app.client.clone();
    let mut req = acquire("s", key);
    req.retention = secs(retention_secs);
    let granted = proceed(&mut c, req).await;
    complete_ok(&mut c, complete("s", key, &token(&granted), success(b"ok"))).await;
}

/// A record whose holder has a lease of `lease_secs`.
async fn held(app: &CitusApp, key: &str, lease_secs: i64) {
    let mut c = app.client.clone();
    let mut req = acquire("s", key);
    req.lease_ttl = secs(lease_secs);
    req.max_attempts = 3;
    proceed(&mut c, req).await;
}

/// A record that failed and is due for a retry now.
async fn failed_due(app: &CitusApp, key: &str) {
    let mut c = app.client.clone();
    let granted = proceed(&mut c, acquire("s", key)).await;
    let fail = Outcome::Failure(proto::Failure {
        error: "boom".into(),
        permanent: false,
        retry_after: secs(0),
    });
    complete_ok(&mut c, complete("s", key, &token(&granted), fail)).await;
}

/// Every record's key and status, read through the coordinator.
async fn statuses(app: &CitusApp) -> BTreeMap<String, String> {
    let rows = app
        .db
        .connect()
        .await
        .query("SELECT idempotency_key, status FROM idempotency_keys", &[])
        .await
        .expect("read the records");
    rows.iter().map(|r| (r.get(0), r.get(1))).collect()
}

fn without_sweeper(c: &mut idempotency_coordinator::config::ServeConfig) {
    c.sweep_interval = Duration::ZERO;
}

#[tokio::test]
async fn sweep_deletes_expired_records_and_reclaims_dead_leases_on_both_workers() {
    let Some(app) = spawn_citus_app_with(without_sweeper).await else {
        return;
    };
    let gone = spread(&app, "gone").await;
    let dead = spread(&app, "dead").await;
    for key in &gone {
        done(&app, key, 60).await;
    }
    for key in &dead {
        held(&app, key, 5).await;
    }
    done(&app, "kept", 3600).await;
    held(&app, "busy", 3600).await;
    failed_due(&app, "due").await;
    app.clock.advance(Duration::from_secs(61));

    let mut c = app.client.clone();
    let dry = c.sweep(sweep_req(true, 0)).await.unwrap().into_inner();
    assert_eq!((dry.expired_deleted, dry.leases_reclaimed), (8, 8));
    assert_eq!(statuses(&app).await.len(), 19, "a dry run changes nothing");

    let swept = c.sweep(sweep_req(false, 0)).await.unwrap().into_inner();
    assert_eq!((swept.expired_deleted, swept.leases_reclaimed), (8, 8));
    assert_eq!(swept.retries_due, 9, "the reclaimed records and `due`");
    let mut expected: BTreeMap<String, String> =
        dead.iter().map(|k| (k.clone(), "FAILED".into())).collect();
    expected.insert("kept".into(), "SUCCEEDED".into());
    expected.insert("busy".into(), "PROCESSING".into());
    expected.insert("due".into(), "FAILED".into());
    assert_eq!(statuses(&app).await, expected);

    let again = c.sweep(sweep_req(false, 0)).await.unwrap().into_inner();
    assert_eq!((again.expired_deleted, again.leases_reclaimed), (0, 0));
    assert_eq!(again.retries_due, 9);
}

#[tokio::test]
async fn a_limit_bounds_the_sweep_across_all_shards() {
    let Some(app) = spawn_citus_app_with(without_sweeper).await else {
        return;
    };
    for key in spread(&app, "gone").await {
        done(&app, &key, 60).await;
    }
    app.clock.advance(Duration::from_secs(61));
    let mut c = app.client.clone();
    let dry = c.sweep(sweep_req(true, 3)).await.unwrap().into_inner();
    assert_eq!(dry.expired_deleted, 3);
    let first = c.sweep(sweep_req(false, 3)).await.unwrap().into_inner();
    assert_eq!(first.expired_deleted, 3);
    assert_eq!(statuses(&app).await.len(), 5);
    let rest = c.sweep(sweep_req(false, 0)).await.unwrap().into_inner();
    assert_eq!(rest.expired_deleted, 5);
    assert!(statuses(&app).await.is_empty());
}

/// An expired record of tenant `other`, written through the store.
async fn other_tenants(app: &CitusApp, key: &str) {
    let cmd = AcquireCommand {
        id: RecordId {
            tenant: Tenant::new("other"),
            scope: Scope::try_from("s".to_owned()).unwrap(),
            key: Key::try_from(key.to_owned()).unwrap(),
        },
        fingerprint: Fingerprint::of_payload(b"x"),
        request_id: RequestId::default(),
        lease_ttl: Duration::from_secs(5),
        max_attempts: 3,
        retention: Duration::from_secs(60),
        wait: Duration::ZERO,
        answer_by: None,
    };
    app.store
        .acquire(&cmd, Duration::ZERO, CallTime::default())
        .await
        .expect("acquire for tenant other");
}

#[tokio::test]
async fn the_background_sweeper_sweeps_every_tenant_on_both_workers() {
    let Some(app) = spawn_citus_app_with(|c| c.sweep_interval = Duration::from_millis(100)).await
    else {
        return;
    };
    let gone = spread(&app, "gone").await;
    for key in &gone {
        done(&app, key, 60).await;
    }
    let dead = spread(&app, "dead").await;
    for key in &dead {
        held(&app, key, 5).await;
    }
    other_tenants(&app, "elsewhere").await;
    done(&app, "kept", 3600).await;
    app.clock.advance(Duration::from_secs(600));

    let mut expected: BTreeMap<String, String> =
        dead.iter().map(|k| (k.clone(), "FAILED".into())).collect();
    expected.insert("kept".into(), "SUCCEEDED".into());
    eventually("the sweeper's rounds", Duration::from_secs(20), || async {
        (statuses(&app).await == expected).then_some(())
    })
    .await;
}

#[tokio::test]
async fn sweep_sweeps_only_the_callers_tenant() {
    let Some(app) = spawn_citus_app_with(without_sweeper).await else {
        return;
    };
    other_tenants(&app, "elsewhere").await;
    done(&app, "mine", 60).await;
    app.clock.advance(Duration::from_secs(600));
    let mut c = app.client.clone();
    let swept = c.sweep(sweep_req(false, 0)).await.unwrap().into_inner();
    assert_eq!((swept.expired_deleted, swept.leases_reclaimed), (1, 0));
    assert_eq!(
        statuses(&app).await.into_keys().collect::<Vec<_>>(),
        ["elsewhere"]
    );
}

#[tokio::test]
async fn watch_due_hands_each_due_record_of_both_workers_to_one_subscriber_once() {
    let Some(app) = spawn_citus_app_with(|c| {
        c.sweep_interval = Duration::ZERO;
        c.feed.poll = Duration::from_millis(50);
    })
    .await
    else {
        return;
    };
    let keys = spread(&app, "due").await;
    for key in &keys {
        failed_due(&app, key).await;
    }
    let subscribe = || {
        let mut c = app.client.clone();
        async move {
            c.watch_due(proto::WatchDueRequest { scope: "s".into() })
                .await
                .expect("watch_due")
                .into_inner()
        }
    };
    let mut feeds = [subscribe().await, subscribe().await];
    let mut seen: Vec<String> = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while seen.len() < keys.len() {
        let (first, second) = feeds.split_at_mut(1);
        let next = tokio::time::timeout_at(deadline, async {
            tokio::select! {
                due = first[0].next() => due,
                due = second[0].next() => due,
            }
        })
        .await
        .unwrap_or_else(|_| panic!("only {seen:?} of {keys:?} were offered"));
        seen.push(
            next.expect("the feed goes on")
                .expect("a due record")
                .record
                .unwrap()
                .key,
        );
    }
    let offered: BTreeSet<String> = seen.iter().cloned().collect();
    assert_eq!(
        offered.len(),
        seen.len(),
        "no record offered twice: {seen:?}"
    );
    assert_eq!(offered, keys.iter().cloned().collect());
    // Within the offer, nothing is offered again.
    for feed in &mut feeds {
        let more = tokio::time::timeout(Duration::from_millis(500), feed.next()).await;
        assert!(more.is_err(), "offered again: {more:?}");
    }
}

#[tokio::test]
async fn the_recovery_webhook_receives_each_due_record_of_both_workers_once() {
    let mut hook = TestWebhook::start(WebhookMode::Ok).await;
    let url = hook.url.parse().unwrap();
    let Some(app) = spawn_citus_app_with(|c| {
        c.sweep_interval = Duration::from_millis(100);
        c.webhook = Some(WebhookConfig {
            url,
            ca: None,
            timeout: Duration::from_millis(300),
            attempts: 2,
            offer: Duration::from_secs(30),
        });
    })
    .await
    else {
        return;
    };
    let keys = spread(&app, "hook").await;
    for key in &keys {
        failed_due(&app, key).await;
    }
    let mut posted = Vec::new();
    while posted.len() < keys.len() {
        let body = tokio::time::timeout(Duration::from_secs(20), hook.bodies.recv())
            .await
            .unwrap_or_else(|_| panic!("only {posted:?} of {keys:?} were posted"))
            .expect("a POST");
        assert_eq!(body["reason"], "RETRY_DUE");
        posted.push(body["key"].as_str().expect("the key").to_owned());
    }
    let once: BTreeSet<String> = posted.iter().cloned().collect();
    assert_eq!(
        once.len(),
        posted.len(),
        "no record posted twice: {posted:?}"
    );
    assert_eq!(once, keys.iter().cloned().collect());
    let more = tokio::time::timeout(Duration::from_millis(500), hook.bodies.recv()).await;
    assert!(more.is_err(), "posted again within the offer: {more:?}");
}

#[tokio::test]
async fn what_a_departed_subscriber_was_offered_is_offered_again() {
    let Some(app) = spawn_citus_app_with(|c| {
        c.sweep_interval = Duration::ZERO;
        c.feed.poll = Duration::from_millis(50);
    })
    .await
    else {
        return;
    };
    let keys = spread(&app, "due").await;
    for key in &keys {
        failed_due(&app, key).await;
    }
    let mut c = app.client.clone();
    let mut subscribe = async || {
        c.watch_due(proto::WatchDueRequest { scope: "s".into() })
            .await
            .expect("watch_due")
            .into_inner()
    };
    let next = async |feed: &mut tonic::Streaming<proto::DueRecord>| {
        tokio::time::timeout(Duration::from_secs(20), feed.next())
            .await
            .expect("a due record in time")
            .expect("the feed goes on")
            .expect("a due record")
            .record
            .unwrap()
            .key
    };
    let mut first = subscribe().await;
    let mut taken = BTreeSet::new();
    for _ in 0..3 {
        taken.insert(next(&mut first).await);
    }
    drop(first);
    // Long before the first offers run out, the second subscriber gets
    // every record, those the first was offered too.
    let mut second = subscribe().await;
    let mut got = BTreeSet::new();
    while got.len() < keys.len() {
        got.insert(next(&mut second).await);
    }
    assert!(taken.is_subset(&got));
}

/// What the maintenance decided about each record, in key order: the
/// columns the sweep and the recovery feed's claim write, without the
/// instants (each side reads its own clock).
async fn decided(client: &tokio_postgres::Client) -> Vec<(String, String, i32, bool, String)> {
    let rows = client
        .query(
            "SELECT idempotency_key, status, attempt_count, next_retry_at IS NOT NULL, last_error
               FROM idempotency_keys ORDER BY idempotency_key COLLATE \"C\"",
            &[],
        )
        .await
        .expect("read the records");
    rows.iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4)))
        .collect()
}

/// A database on the single PostgreSQL the API tests use, migrated, with a
/// copy of every record of the cluster as its coordinator reads it.
async fn single_node_copy(app: &CitusApp) -> (TestDatabase, tokio_postgres::Client) {
    let plain = TestDatabase::create().await;
    let mut client = plain.connect().await;
    idempotency_coordinator::store::migrate::migrate(&mut client)
        .await
        .expect("migrate the single-node copy");
    let rows = app
        .db
        .connect()
        .await
        .query("SELECT row_to_json(k)::text FROM idempotency_keys k", &[])
        .await
        .expect("read the cluster's records");
    for row in rows {
        let record: String = row.get(0);
        client
            .execute(
                "INSERT INTO idempotency_keys
                 SELECT * FROM json_populate_record(NULL::idempotency_keys, $1::text::json)",
                &[&record],
            )
            .await
            .expect("copy a record");
    }
    (plain, client)
}

/// The keys a claim of the recovery feed offered, sorted.
async fn claimed(client: &tokio_postgres::Client, function: &str, offset_ms: i64) -> Vec<String> {
    let subscriber = uuid::Uuid::new_v4();
    let rows = client
        .query(
            &format!("SELECT idempotency_key FROM {function}(NULL, NULL, $1, 60000, 100, $2)"),
            &[&subscriber, &offset_ms],
        )
        .await
        .unwrap_or_else(|e| panic!("{function}: {e}"));
    let mut keys: Vec<String> = rows.iter().map(|r| r.get(0)).collect();
    keys.sort();
    keys
}

/// The conformance of the Citus maintenance functions
/// (sql/citus/maintenance.sql: the sweep shard by shard, the claim key by
/// key) with the single-node ones (sql/functions/sweep.sql, due.sql): the
/// same records, copied to one PostgreSQL, get the same claims, the same
/// counts and the same records after sweeping.
#[tokio::test]
async fn the_cluster_sweeps_and_claims_as_one_postgresql_does_on_the_same_records() {
    let Some(app) = spawn_citus_app_with(without_sweeper).await else {
        return;
    };
    for key in spread(&app, "gone").await {
        done(&app, &key, 60).await;
    }
    for key in spread(&app, "dead").await {
        held(&app, &key, 5).await;
    }
    done(&app, "kept", 3600).await;
    held(&app, "busy", 3600).await;
    failed_due(&app, "due").await;
    app.clock.advance(Duration::from_secs(61));
    let offset = app.clock.offset_ms();
    let (_plain, single) = single_node_copy(&app).await;
    let cluster = app.db.connect().await;
    assert_eq!(decided(&cluster).await, decided(&single).await, "the copy");

    let on_cluster = claimed(&cluster, "idempotency_claim_due_by_key", offset).await;
    let on_single = claimed(&single, "idempotency_claim_due", offset).await;
    assert_eq!(on_cluster.len(), 9, "the dead leases and `due`");
    assert_eq!(on_cluster, on_single);

    let mut c = app.client.clone();
    let sweep_single = |dry_run: bool| {
        let single = &single;
        async move {
            let row = single
                .query_one(
                    "SELECT expired_deleted, leases_reclaimed
                       FROM idempotency_sweep_batch(NULL, 1000, $1, false, $2)",
                    &[&dry_run, &offset],
                )
                .await
                .expect("sweep the single-node copy");
            let count = |i: usize| u64::try_from(row.get::<_, i64>(i)).expect("a count");
            (count(0), count(1))
        }
    };
    let dry = c.sweep(sweep_req(true, 0)).await.unwrap().into_inner();
    assert_eq!(
        (dry.expired_deleted, dry.leases_reclaimed),
        sweep_single(true).await
    );
    let swept = c.sweep(sweep_req(false, 0)).await.unwrap().into_inner();
    assert_eq!((swept.expired_deleted, swept.leases_reclaimed), (8, 8));
    assert_eq!((8, 8), sweep_single(false).await);
    assert_eq!(
        decided(&cluster).await,
        decided(&single).await,
        "after sweeping"
    );
}

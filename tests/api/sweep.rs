//! Sweep and the background sweeper: expired records out, dead leases
//! reclaimed, nothing else touched.

use std::time::Duration;

use idempotency_coordinator::domain::{
    self, AcquireCommand, Fingerprint, Key, RecordId, RequestId, Scope, Tenant,
};
use idempotency_coordinator::proto::{Decision, Status};
use idempotency_coordinator::store::CallTime;

use crate::helpers::*;

/// A record that succeeded with `retention_secs` of retention.
async fn done(app: &TestApp, key: &str, retention_secs: i64) {
    let mut c = app.client.clone();
    let mut req = acquire("s", key);
    req.retention = secs(retention_secs);
    let granted = proceed(&mut c, req).await;
    complete_ok(&mut c, complete("s", key, &token(&granted), success(b"ok"))).await;
}

/// A record whose holder has a lease of `lease_secs`.
async fn held(app: &TestApp, key: &str, lease_secs: i64, max_attempts: u32) -> String {
    let mut c = app.client.clone();
    let mut req = acquire("s", key);
    req.lease_ttl = secs(lease_secs);
    req.max_attempts = max_attempts;
    token(&proceed(&mut c, req).await)
}

#[tokio::test]
async fn sweep_deletes_expired_records_and_only_those() {
    let app = spawn_app_without_sweeper().await;
    done(&app, "short", 60).await;
    done(&app, "long", 3600).await;
    app.clock.advance(Duration::from_secs(61));

    let mut c = app.client.clone();
    let swept = c.sweep(sweep_req(false, 0)).await.unwrap().into_inner();
    assert_eq!((swept.expired_deleted, swept.leases_reclaimed), (1, 0));
    assert_eq!(
        statuses(&app.db).await,
        [("long".into(), "SUCCEEDED".into())]
    );
}

#[tokio::test]
async fn a_live_lease_is_never_reclaimed() {
    let app = spawn_app_without_sweeper().await;
    held(&app, "busy", 60, 3).await;
    app.clock.advance(Duration::from_secs(59));
    let mut c = app.client.clone();
    let swept = c.sweep(sweep_req(false, 0)).await.unwrap().into_inner();
    assert_eq!(swept.leases_reclaimed, 0);
    assert_eq!(
        statuses(&app.db).await,
        [("busy".into(), "PROCESSING".into())]
    );
}

#[tokio::test]
async fn a_dead_lease_is_reclaimed_with_its_attempt_counted() {
    let app = spawn_app_without_sweeper().await;
    held(&app, "retry", 5, 3).await;
    held(&app, "last", 5, 1).await;
    app.clock.advance(Duration::from_secs(6));

    let mut c = app.client.clone();
    let swept = c.sweep(sweep_req(false, 0)).await.unwrap().into_inner();
    assert_eq!(swept.leases_reclaimed, 2);
    assert_eq!(swept.retries_due, 1, "the reclaimed record is due at once");
    assert_eq!(
        statuses(&app.db).await,
        [
            ("last".into(), "FAILED_PERMANENT".into()),
            ("retry".into(), "FAILED".into())
        ]
    );
    let record = get_record(&mut c, get_req("s", "retry")).await;
    assert_eq!(record.attempt_count, 1);
    assert!(
        record.last_error.contains("ran out"),
        "{}",
        record.last_error
    );
    let next = proceed(&mut c, acquire("s", "retry")).await;
    assert_eq!(
        next.lease.unwrap().attempt,
        2,
        "the abandoned attempt counted"
    );
    let resp = c.acquire(acquire("s", "last")).await.unwrap().into_inner();
    assert_eq!(decision(&resp), Decision::Exhausted);
}

#[tokio::test]
async fn a_holder_whose_lease_the_sweeper_reclaimed_can_still_complete_if_nobody_took_over() {
    let app = spawn_app_without_sweeper().await;
    let lease = held(&app, "late", 5, 3).await;
    app.clock.advance(Duration::from_secs(6));
    let mut c = app.client.clone();
    c.sweep(sweep_req(false, 0)).await.unwrap();

    let record = complete_ok(
        &mut c,
        complete("s", "late", &lease, success(b"done after all")),
    )
    .await;
    assert_eq!(status_of(&record), Status::Succeeded);
}

/// The sweeper writes the last error of a lease it reclaimed
/// (`idempotency_sweep_batch`), and the next holder's PROCEED is read as a
/// takeover by how that error begins (`Acquired::took_over`): the SQL's
/// words and the prefix Rust matches change together, or this fails.
#[tokio::test]
async fn the_next_holder_after_the_sweeper_reclaimed_a_lease_took_over() {
    let app = spawn_app_without_sweeper().await;
    let cmd = AcquireCommand {
        id: RecordId {
            tenant: Tenant::default_tenant(),
            scope: Scope::try_from("s".to_owned()).unwrap(),
            key: Key::try_from("reclaimed".to_owned()).unwrap(),
        },
        fingerprint: Fingerprint::of_payload(b"order 1"),
        request_id: RequestId::default(),
        lease_ttl: Duration::from_secs(5),
        max_attempts: 3,
        retention: Duration::from_secs(3600),
        wait: Duration::ZERO,
        answer_by: None,
    };
    let acquire = || app.store.acquire(&cmd, Duration::ZERO, CallTime::default());
    let first = acquire().await.expect("first acquire");
    assert_eq!(first.decision, domain::Decision::Proceed);
    assert!(!first.took_over());

    app.clock.advance(Duration::from_secs(6));
    let swept = app
        .store
        .sweep_batch(None, 100, false, false)
        .await
        .expect("sweep")
        .expect("not exclusive, so it sweeps");
    assert_eq!(swept.leases_reclaimed, 1);

    let next = acquire().await.expect("next acquire");
    assert_eq!(next.decision, domain::Decision::Proceed);
    assert_eq!(next.record.lease.attempt, 2);
    assert!(
        next.took_over(),
        "the sweeper's last error is not read as a reclaimed lease: {:?}",
        next.record.last_error
    );
}

#[tokio::test]
async fn a_succeeded_record_is_kept_for_its_retention_after_completion() {
    let app = spawn_app_without_sweeper().await;
    let mut c = app.client.clone();
    let mut req = acquire("s", "k");
    req.retention = secs(60);
    req.lease_ttl = secs(3600);
    let granted = proceed(&mut c, req).await;
    app.clock.advance(Duration::from_secs(50));
    complete_ok(&mut c, complete("s", "k", &token(&granted), success(b"x"))).await;
    app.clock.advance(Duration::from_secs(50));

    let swept = c.sweep(sweep_req(false, 0)).await.unwrap().into_inner();
    assert_eq!(
        swept.expired_deleted, 0,
        "100 s after creation, 50 s after completion"
    );
    get_record(&mut c, get_req("s", "k")).await;

    app.clock.advance(Duration::from_secs(11));
    let swept = c.sweep(sweep_req(false, 0)).await.unwrap().into_inner();
    assert_eq!(swept.expired_deleted, 1);
}

#[tokio::test]
async fn a_dry_run_counts_and_changes_nothing() {
    let app = spawn_app_without_sweeper().await;
    done(&app, "old", 60).await;
    held(&app, "dead", 5, 3).await;
    app.clock.advance(Duration::from_secs(61));
    let before = statuses(&app.db).await;

    let mut c = app.client.clone();
    let dry = c.sweep(sweep_req(true, 0)).await.unwrap().into_inner();
    assert_eq!((dry.expired_deleted, dry.leases_reclaimed), (1, 1));
    assert_eq!(statuses(&app.db).await, before);

    let real = c.sweep(sweep_req(false, 0)).await.unwrap().into_inner();
    assert_eq!((real.expired_deleted, real.leases_reclaimed), (1, 1));
}

#[tokio::test]
async fn a_limit_bounds_the_work_of_one_sweep() {
    let app = spawn_app_without_sweeper().await;
    for i in 0..5 {
        done(&app, &format!("k{i}"), 60).await;
    }
    app.clock.advance(Duration::from_secs(61));
    let mut c = app.client.clone();
    let mut deleted = Vec::new();
    for _ in 0..4 {
        deleted.push(
            c.sweep(sweep_req(false, 2))
                .await
                .unwrap()
                .into_inner()
                .expired_deleted,
        );
    }
    assert_eq!(deleted, [2, 2, 1, 0]);
}

#[tokio::test]
async fn sweeping_a_dead_lease_wakes_its_waiters() {
    // A window longer than the clock jump below, so the waiter still watches
    // the record by the database's moved clock.
    let app = spawn_app_with(|c| {
        c.sweep_interval = Duration::ZERO;
        c.policy.max_wait = Duration::from_secs(300);
    })
    .await;
    held(&app, "k", 60, 3).await;
    let mut waiter = app.client.clone();
    let waiting_call = tokio::spawn(async move { waiter.acquire(waiting("s", "k", 200)).await });
    until_parked(&app, 1).await;

    // The lease is over by the database's clock; the waiter's own timer
    // (real time) would not fire for a minute: only the sweep wakes it.
    app.clock.advance(Duration::from_secs(61));
    let mut c = app.client.clone();
    c.sweep(sweep_req(false, 0)).await.unwrap();
    let answer = tokio::time::timeout(Duration::from_secs(10), waiting_call)
        .await
        .expect("woken by the sweep")
        .unwrap()
        .unwrap()
        .into_inner();
    assert_eq!(decision(&answer), Decision::Proceed);
    assert_eq!(answer.lease.unwrap().attempt, 2);
}

#[tokio::test]
async fn two_replicas_sweeping_reclaim_each_dead_lease_once() {
    let db = TestDatabase::create().await;
    let fast = |c: &mut idempotency_coordinator::config::ServeConfig| {
        c.sweep_interval = Duration::from_millis(50);
        c.sweep_batch = 7;
    };
    let mut config = idempotency_coordinator::config::ServeConfig::new(
        "127.0.0.1:0".parse().unwrap(),
        db.url.clone(),
    );
    fast(&mut config);
    let a = start_server_with_totals(config.clone()).await;
    let b = start_server_with_totals(config).await;
    let mut c = a.server.client.clone();
    for i in 0..100 {
        let mut req = acquire("s", &format!("k{i}"));
        req.lease_ttl = secs(5);
        proceed(&mut c, req).await;
    }
    a.server.clock.advance(Duration::from_secs(6));
    b.server.clock.advance(Duration::from_secs(6));

    let reclaimed = || {
        a.totals
            .leases_reclaimed
            .load(std::sync::atomic::Ordering::SeqCst)
            + b.totals
                .leases_reclaimed
                .load(std::sync::atomic::Ordering::SeqCst)
    };
    eventually("100 leases reclaimed", Duration::from_secs(20), || async {
        (reclaimed() >= 100).then_some(())
    })
    .await;
    // Both keep sweeping; nothing is reclaimed twice.
    let rounds = |t: &TotalsServer| t.totals.rounds.load(std::sync::atomic::Ordering::SeqCst);
    let (ra, rb) = (rounds(&a), rounds(&b));
    eventually("more sweep rounds", Duration::from_secs(10), || async {
        (rounds(&a) + rounds(&b) > ra + rb + 4).then_some(())
    })
    .await;
    assert_eq!(reclaimed(), 100);
    assert!(
        statuses(&db).await.iter().all(|(_, s)| s == "FAILED"),
        "every dead lease reclaimed"
    );
}

#[tokio::test]
async fn fencing_tokens_keep_growing_after_the_sweeper_deleted_a_record() {
    let app = spawn_app_without_sweeper().await;
    let mut c = app.client.clone();
    let mut req = acquire("s", "k");
    req.retention = secs(60);
    let first = proceed(&mut c, req).await;
    complete_ok(&mut c, complete("s", "k", &token(&first), success(b"x"))).await;
    app.clock.advance(Duration::from_secs(61));
    let swept = c.sweep(sweep_req(false, 0)).await.unwrap().into_inner();
    assert_eq!(swept.expired_deleted, 1);

    let again = proceed(&mut c, acquire("s", "k")).await;
    assert!(
        again.lease.unwrap().fencing_token > first.lease.unwrap().fencing_token,
        "a stale holder of the deleted record can still be refused downstream"
    );
}

/// `n` PROCESSING records of `scope` whose lease ran out a minute ago and
/// whose record expires `expires` from now (an interval).
fn ran_out(scope: &str, n: i32, expires: &str) -> String {
    format!(
        "INSERT INTO idempotency_keys (tenant, scope, idempotency_key, fingerprint,
             created_at, retention, max_attempts, attempt_count, lease_token,
             lease_request_id, updated_at, expires_at, status, lease_expires_at)
         SELECT 't', '{scope}', 'k' || i, '', now() - interval '1 hour', '1 day', 5, 1,
                gen_random_uuid(), '', now() - interval '1 hour', now() + interval '{expires}',
                'PROCESSING', now() - interval '1 minute'
           FROM generate_series(1, {n}) i"
    )
}

/// One batch of the background sweeper, 100 rows of each kind at most:
/// (expired records deleted, leases reclaimed).
async fn sweep_batch_of_100(db: &tokio_postgres::Client) -> (i64, i64) {
    let row = db
        .query_one(
            "SELECT expired_deleted, leases_reclaimed
               FROM idempotency_sweep_batch(NULL, 100, false, false, 0)",
            &[],
        )
        .await
        .unwrap();
    (row.get(0), row.get(1))
}

/// After an outage, 20,000 leases that ran out wait to be reclaimed: a
/// batch of 100 reads about what it takes, not the backlog (looking for
/// records that expired in progress once read every lease that ran out).
#[tokio::test]
async fn a_sweep_batch_reads_what_it_takes_not_the_backlog_of_dead_leases() {
    let (_db, client) = migrated_with(&[
        &ran_out("a", 10_000, "1 day"),
        &ran_out("b", 10_000, "1 day"),
        "ANALYZE idempotency_keys",
    ])
    .await;

    let before = index_entries_read(&client).await;
    assert_eq!(sweep_batch_of_100(&client).await, (0, 100));
    let read = index_entries_read(&client).await - before;
    assert!(
        read < 1_000,
        "a batch of 100 read {read} index entries (20,000 leases ran out)"
    );
}

/// Records that expired in progress, behind 300 leases that ran out in
/// the index's order, are still deleted, each batch doing all it may.
#[tokio::test]
async fn records_that_expired_in_progress_behind_dead_leases_are_deleted() {
    let (db, client) =
        migrated_with(&[&ran_out("a", 300, "1 day"), &ran_out("b", 5, "-1 second")]).await;

    let mut batches = Vec::new();
    loop {
        let batch = sweep_batch_of_100(&client).await;
        if batch == (0, 0) {
            break;
        }
        batches.push(batch);
    }
    assert_eq!(batches, [(0, 100), (0, 100), (5, 100)]);
    assert_eq!(
        statuses(&db)
            .await
            .iter()
            .filter(|(_, s)| s == "FAILED")
            .count(),
        300
    );
}

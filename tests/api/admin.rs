//! The admin RPCs: an admin credential's actions on its own tenant's
//! records, each recorded on the record; pages of a scope's keys; the
//! counts per scope. Anyone else is refused.

use std::time::Duration;

use idempotency_coordinator::proto::{self, Status};
use tonic::Code;

use crate::helpers::*;

const ALICE: &str = "alice-token-0123456789";
const ADMIN_A: &str = "alice-admin-0123456789";
const ADMIN_B: &str = "bob-admin-0123456789ab";

fn tokens() -> String {
    format!("{ALICE} tenant-a\n{ADMIN_A} tenant-a admin\n{ADMIN_B} tenant-b admin\n")
}

async fn app_with_tokens(file: &TokenFile) -> TestApp {
    let path = file.path.clone();
    spawn_app_with(move |c| {
        c.auth_tokens = Some(path);
        c.sweep_interval = Duration::ZERO;
    })
    .await
}

fn target(scope: &str, key: &str, reason: &str) -> Option<proto::AdminTarget> {
    Some(proto::AdminTarget {
        scope: scope.into(),
        key: key.into(),
        reason: reason.into(),
        operator: "ops-alice".into(),
    })
}

/// Acquires (scope, key) and returns the lease token.
async fn lease(client: &mut AuthedClient, scope: &str, key: &str) -> String {
    let answer = client
        .acquire(acquire(scope, key))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(decision(&answer), proto::Decision::Proceed);
    answer.lease.unwrap().token
}

#[tokio::test]
async fn a_released_lease_refuses_its_holders_complete_and_the_record_says_who_released_it() {
    let file = TokenFile::new(&tokens());
    let app = app_with_tokens(&file).await;
    let mut worker = client_with_token(&app, ALICE).await;
    let mut admin = client_with_token(&app, ADMIN_A).await;
    let token = lease(&mut worker, "pay", "order-1").await;

    let record = admin
        .release_lease(proto::ReleaseLeaseRequest {
            target: target("pay", "order-1", "holder is stuck"),
        })
        .await
        .expect("release")
        .into_inner()
        .record
        .unwrap();
    assert_eq!(status_of(&record), Status::Failed);
    let note = record.admin_action.expect("recorded");
    assert_eq!(note.action, "RELEASE_LEASE");
    assert_eq!(note.reason, "holder is stuck");
    assert!(
        note.actor.starts_with("credential sha256:"),
        "{}",
        note.actor
    );
    assert!(note.actor.ends_with("operator ops-alice"), "{}", note.actor);
    assert!(!note.actor.contains(ADMIN_A), "the token is never recorded");

    let err = worker
        .complete(complete("pay", "order-1", &token, success(b"late")))
        .await
        .unwrap_err();
    assert_eq!(reason(&err), "LEASE_LOST");
    // The record is due at once: the next Acquire gets a new lease.
    let again = worker
        .acquire(acquire("pay", "order-1"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(decision(&again), proto::Decision::Proceed);
    assert!(again.lease.unwrap().fencing_token > record.fencing_token);
}

#[tokio::test]
async fn retry_now_fail_permanently_and_delete_change_the_record_as_asked() {
    let file = TokenFile::new(&tokens());
    let app = app_with_tokens(&file).await;
    let mut worker = client_with_token(&app, ALICE).await;
    let mut admin = client_with_token(&app, ADMIN_A).await;
    let token = lease(&mut worker, "pay", "k").await;
    let mut failed = failure("card declined");
    if let proto::complete_request::Outcome::Failure(f) = &mut failed {
        f.retry_after = secs(3600);
    }
    worker
        .complete(complete("pay", "k", &token, failed))
        .await
        .unwrap();
    let later = worker
        .acquire(acquire("pay", "k"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(decision(&later), proto::Decision::RetryLater);

    admin
        .retry_now(proto::RetryNowRequest {
            target: target("pay", "k", "the card was fixed"),
        })
        .await
        .expect("retry now");
    let token = lease(&mut worker, "pay", "k").await;

    let err = admin
        .fail_permanently(proto::FailPermanentlyRequest {
            target: target("pay", "k", ""),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert_eq!(bad_fields(&err), ["target.reason"]);
    let record = admin
        .fail_permanently(proto::FailPermanentlyRequest {
            target: target("pay", "k", "fraud: never charge"),
        })
        .await
        .expect("fail permanently")
        .into_inner()
        .record
        .unwrap();
    assert_eq!(status_of(&record), Status::FailedPermanent);
    assert_eq!(record.last_error, "fraud: never charge");
    let err = worker
        .complete(complete("pay", "k", &token, success(b"x")))
        .await
        .unwrap_err();
    assert_eq!(reason(&err), "LEASE_LOST");

    // Retry now is for FAILED records only; the record is left as it is.
    let err = admin
        .retry_now(proto::RetryNowRequest {
            target: target("pay", "k", ""),
        })
        .await
        .unwrap_err();
    assert_eq!(
        (err.code(), reason(&err).as_str()),
        (Code::FailedPrecondition, "WRONG_STATUS")
    );

    admin
        .delete_record(proto::DeleteRecordRequest {
            target: target("pay", "k", "start over"),
        })
        .await
        .expect("delete");
    let err = worker
        .get(proto::GetRequest {
            scope: "pay".into(),
            key: "k".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    let err = admin
        .delete_record(proto::DeleteRecordRequest {
            target: target("pay", "k", ""),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
}

#[tokio::test]
async fn only_admins_act_and_only_on_their_own_tenants_records() {
    let file = TokenFile::new(&tokens());
    let app = app_with_tokens(&file).await;
    let mut worker = client_with_token(&app, ALICE).await;
    lease(&mut worker, "pay", "k").await;

    let err = worker
        .release_lease(proto::ReleaseLeaseRequest {
            target: target("pay", "k", ""),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied);
    let err = worker
        .summarize(proto::SummarizeRequest::default())
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied);
    let mut anonymous = app.client.clone();
    let err = anonymous
        .list_records(proto::ListRecordsRequest {
            scope: "pay".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated);

    // Another tenant's admin finds nothing of tenant-a.
    let mut other = client_with_token(&app, ADMIN_B).await;
    let err = other
        .release_lease(proto::ReleaseLeaseRequest {
            target: target("pay", "k", ""),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    let page = other
        .list_records(proto::ListRecordsRequest {
            scope: "pay".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(page.records.is_empty());
    let summary = other
        .summarize(proto::SummarizeRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert!(summary.scopes.is_empty());
}

#[tokio::test]
async fn keys_are_listed_by_prefix_page_by_page_and_counted_per_scope() {
    let file = TokenFile::new(&tokens());
    let app = app_with_tokens(&file).await;
    let mut worker = client_with_token(&app, ALICE).await;
    let mut admin = client_with_token(&app, ADMIN_A).await;
    for i in 0..7 {
        lease(&mut worker, "pay", &format!("order-{i}")).await;
    }
    lease(&mut worker, "pay", "order").await;
    lease(&mut worker, "pay", "other-1").await;
    let token = lease(&mut worker, "mail", "welcome-1").await;
    worker
        .complete(complete("mail", "welcome-1", &token, success(b"sent")))
        .await
        .unwrap();

    let mut keys = Vec::new();
    let mut page_token = String::new();
    loop {
        let page = admin
            .list_records(proto::ListRecordsRequest {
                scope: "pay".into(),
                key_prefix: "order".into(),
                page_token: page_token.clone(),
                page_size: 3,
                status: 0,
            })
            .await
            .unwrap()
            .into_inner();
        assert!(page.records.len() <= 3);
        keys.extend(page.records.into_iter().map(|r| r.key));
        if page.next_page_token.is_empty() {
            break;
        }
        page_token = page.next_page_token;
    }
    let mut expected: Vec<String> = (0..7).map(|i| format!("order-{i}")).collect();
    expected.insert(0, "order".into());
    assert_eq!(keys, expected);

    let err = admin
        .list_records(proto::ListRecordsRequest {
            scope: "bad scope".into(),
            page_size: 501,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(bad_fields(&err), ["scope", "page_size"]);

    let summary = admin
        .summarize(proto::SummarizeRequest::default())
        .await
        .unwrap()
        .into_inner();
    let counts: Vec<(&str, u64, u64, bool)> = summary
        .scopes
        .iter()
        .map(|s| (s.scope.as_str(), s.processing, s.records, s.records_capped))
        .collect();
    assert_eq!(counts, [("mail", 0, 1, false), ("pay", 9, 9, false)]);
    app.clock.advance(Duration::from_secs(16 * 60));
    let summary = admin
        .summarize(proto::SummarizeRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        summary.scopes[1].leases_expired, 9,
        "leases of 15 minutes ran out"
    );
}

#[tokio::test]
async fn a_deleted_succeeded_record_is_not_replayed_from_the_cache() {
    let app = spawn_app_with(|c| c.store.replay_cache_bytes = 1 << 20).await;
    let mut client = app.client.clone();
    let answer = client
        .acquire(acquire("pay", "k"))
        .await
        .unwrap()
        .into_inner();
    let token = answer.lease.unwrap().token;
    client
        .complete(complete("pay", "k", &token, success(b"done")))
        .await
        .unwrap();
    let replay = client
        .acquire(acquire("pay", "k"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(decision(&replay), proto::Decision::AlreadyDone);

    client
        .delete_record(proto::DeleteRecordRequest {
            target: target("pay", "k", "redo"),
        })
        .await
        .expect("delete (authentication off: everyone is an admin)");
    let again = client
        .acquire(acquire("pay", "k"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(decision(&again), proto::Decision::Proceed);
}

/// Another tenant's work in flight is not one tenant's cost: with 100,000
/// PROCESSING records of tenant B (before 0006 the summary read every one
/// of them through idempotency_keys_leases, 102,222 index entries), tenant
/// A's summary of its 12 records reads about as many entries as A has.
#[tokio::test]
async fn a_summary_reads_none_of_another_tenants_100000_processing_records() {
    let insert = |tenant: &str, scopes: i32, n: i32, status: &str| {
        format!(
            "INSERT INTO idempotency_keys (tenant, scope, idempotency_key, fingerprint,
                 created_at, retention, max_attempts, attempt_count, lease_token,
                 lease_request_id, updated_at, expires_at, status, lease_expires_at)
             SELECT '{tenant}', 'scope-' || (i % {scopes}), '{status}-' || i, '', now(),
                    '1 day', 5, 1, gen_random_uuid(), '', now(), now() + interval '1 day',
                    '{status}', CASE WHEN '{status}' = 'PROCESSING'
                                     THEN now() + (i - {n} / 2) * interval '1 minute' END
               FROM generate_series(1, {n}) i"
        )
    };
    let (_db, client) = migrated_with(&[
        &insert("tenant-b", 10, 100_000, "PROCESSING"),
        &insert("tenant-a", 2, 4, "PROCESSING"),
        &insert("tenant-a", 2, 8, "SUCCEEDED"),
        "ANALYZE idempotency_keys",
    ])
    .await;

    let before = index_entries_read(&client).await;
    let rows = client
        .query(
            "SELECT scope, processing, leases_expired, records
               FROM idempotency_admin_summary('tenant-a', '', 100, 1000, 0)",
            &[],
        )
        .await
        .unwrap();
    let read = index_entries_read(&client).await - before;
    let counts: Vec<(String, i64, i64, i64)> = rows
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
        .collect();
    assert_eq!(
        counts,
        [
            ("scope-0".to_owned(), 2, 1, 6),
            ("scope-1".to_owned(), 2, 1, 6)
        ]
    );
    assert!(
        read < 100,
        "tenant A's summary read {read} index entries (tenant B has 100,000 in flight)"
    );
}

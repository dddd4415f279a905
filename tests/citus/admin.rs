//! The admin calls on Citus: a lease released on the worker holding the
//! key (the holder's Complete then refused), a scope's keys listed by
//! prefix and the counts per scope, read over every shard, as on one
//! PostgreSQL.

use std::time::Duration;

use idempotency_coordinator::proto::{self, Decision, Status};

use crate::app::spawn_citus_app_with;
use crate::helpers::*;

const WORKER: &str = "alice-token-0123456789";
const ADMIN: &str = "alice-admin-0123456789";

#[tokio::test]
async fn an_admin_releases_a_lease_lists_a_scope_and_counts_it_across_the_shards() {
    let file = TokenFile::new(&format!("{WORKER} tenant-a\n{ADMIN} tenant-a admin\n"));
    let path = file.path.clone();
    let Some(app) = spawn_citus_app_with(move |c| {
        c.auth_tokens = Some(path);
        c.sweep_interval = Duration::ZERO;
    })
    .await
    else {
        return;
    };
    let mut worker = client_with_token(&app, WORKER).await;
    let mut admin = client_with_token(&app, ADMIN).await;
    let mut tokens = Vec::new();
    for i in 0..12 {
        let answer = worker
            .acquire(acquire("pay", &format!("order-{i:02}")))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(decision(&answer), Decision::Proceed);
        tokens.push(answer.lease.unwrap().token);
    }

    let released = admin
        .release_lease(proto::ReleaseLeaseRequest {
            target: Some(proto::AdminTarget {
                scope: "pay".into(),
                key: "order-03".into(),
                reason: "holder is stuck".into(),
                operator: "ops".into(),
            }),
        })
        .await
        .expect("release")
        .into_inner()
        .record
        .unwrap();
    assert_eq!(status_of(&released), Status::Failed);
    let err = worker
        .complete(complete("pay", "order-03", &tokens[3], success(b"late")))
        .await
        .unwrap_err();
    assert_eq!(reason(&err), "LEASE_LOST");

    let mut keys = Vec::new();
    let mut page_token = String::new();
    loop {
        let page = admin
            .list_records(proto::ListRecordsRequest {
                scope: "pay".into(),
                key_prefix: "order-0".into(),
                page_token: page_token.clone(),
                page_size: 4,
                status: 0,
            })
            .await
            .expect("a page")
            .into_inner();
        keys.extend(page.records.into_iter().map(|r| r.key));
        if page.next_page_token.is_empty() {
            break;
        }
        page_token = page.next_page_token;
    }
    let expected: Vec<String> = (0..10).map(|i| format!("order-{i:02}")).collect();
    assert_eq!(keys, expected, "in key order over every shard");

    let summary = admin
        .summarize(proto::SummarizeRequest::default())
        .await
        .expect("a summary")
        .into_inner();
    let counts: Vec<(&str, u64, u64)> = summary
        .scopes
        .iter()
        .map(|s| (s.scope.as_str(), s.processing, s.records))
        .collect();
    assert_eq!(counts, [("pay", 11, 12)]);
}

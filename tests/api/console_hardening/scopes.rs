//! A tenant of thousands of scopes: Summarize and the console's home page
//! a page of scopes at a time, bounded in size and time; and nothing of
//! other tenants' records told.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use idempotency_coordinator::proto;

use super::*;

const SCOPES: usize = 2_000;
/// The most a page of the home page may take.
const PAGE_BYTES: usize = 64 * 1024;
/// The longest a page of the home page may take to come.
const PAGE_TIME: Duration = Duration::from_secs(2);

/// One record in each of `n` scopes `s-0000`, `s-0001`, ...
async fn scopes(console: &Console, n: usize) {
    let mut tasks = tokio::task::JoinSet::new();
    for lane in 0..8 {
        let mut worker = grpc(&console.server, WORKER).await;
        tasks.spawn(async move {
            for i in (lane..n).step_by(8) {
                worker
                    .acquire(acquire(&format!("s-{i:04}"), "k"))
                    .await
                    .unwrap();
            }
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.unwrap();
    }
}

/// The scopes a home page lists, and its next page's path.
fn listed(page: &str) -> (Vec<String>, Option<String>) {
    let names = page
        .split("\">s-")
        .skip(1)
        .map(|rest| format!("s-{}", &rest[..4]))
        .collect();
    let next = page
        .split("rel=\"next\" href=\"/console/")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .map(str::to_owned);
    (names, next)
}

#[tokio::test]
async fn a_tenant_of_2000_scopes_gets_its_home_page_in_pages_of_at_most_64_kib_and_2_s() {
    let db = TestDatabase::create().await;
    let file = tokens();
    let console = Console::start(&db, Some(&file), &[]).await;
    scopes(&console, SCOPES).await;
    let cookie = console.session().await;
    let mut seen = BTreeSet::new();
    let mut path = Some(String::new());
    let mut pages = 0;
    while let Some(here) = path {
        let start = Instant::now();
        let page = console.get(&here, &cookie).await;
        assert_eq!(page.status(), 200);
        let page = page.text().await.unwrap();
        let took = start.elapsed();
        assert!(
            page.len() <= PAGE_BYTES && took <= PAGE_TIME,
            "a home page of a tenant of {SCOPES} scopes: {} bytes in {took:?}",
            page.len()
        );
        let (names, next) = listed(&page);
        assert!(names.len() <= 100, "{} scopes on a page", names.len());
        seen.extend(names);
        pages += 1;
        assert!(pages <= 21, "pages of 100 scopes");
        path = next;
    }
    assert_eq!(seen.len(), SCOPES, "every scope on some page");

    // Summarize itself: 100 scopes unless asked, at most 500.
    let mut admin = grpc(&console.server, ADMIN).await;
    let first = admin
        .summarize(proto::SummarizeRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(first.scopes.len(), 100);
    assert_eq!(first.next_page_token, "s-0099");
    let second = admin
        .summarize(proto::SummarizeRequest {
            page_token: first.next_page_token,
            page_size: 500,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(second.scopes[0].scope, "s-0100");
    assert_eq!(second.scopes.len(), 500);
    let refused = admin
        .summarize(proto::SummarizeRequest {
            page_token: String::new(),
            page_size: 501,
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::InvalidArgument);
    assert_eq!(bad_fields(&refused), ["page_size"]);
}

#[tokio::test]
async fn an_admin_is_told_nothing_of_the_table_size_of_other_tenants() {
    let db = TestDatabase::create().await;
    let file = TokenFile::new(&format!(
        "{WORKER} shop\n{ADMIN} shop admin\nother-token-0123456789 bank\n"
    ));
    let console = Console::start(&db, Some(&file), &[]).await;
    let mut bank = grpc(&console.server, "other-token-0123456789").await;
    for i in 0..500 {
        bank.acquire(acquire("ledger", &format!("k-{i}")))
            .await
            .unwrap();
    }
    let mut worker = grpc(&console.server, WORKER).await;
    worker.acquire(acquire("pay", "k")).await.unwrap();
    db.connect()
        .await
        .batch_execute("ANALYZE idempotency_keys")
        .await
        .unwrap();

    let mut admin = grpc(&console.server, ADMIN).await;
    let summary = admin
        .summarize(proto::SummarizeRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(summary.scopes.len(), 1);
    assert_eq!(
        summary.estimated_table_records, 0,
        "shop's admin is told the table holds {} records of all tenants",
        summary.estimated_table_records
    );
    let cookie = console.session().await;
    let page = console.get("", &cookie).await.text().await.unwrap();
    assert!(!page.contains("of all tenants"), "{page}");
}

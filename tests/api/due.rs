//! WatchDue, the recovery feed: each due record offered to one subscriber at
//! a time, across replicas; what a subscriber leaves is offered again.

use std::collections::HashSet;
use std::time::Duration;

use idempotency_coordinator::config::ServeConfig;
use idempotency_coordinator::proto::{self, DueReason, complete_request::Outcome};
use tokio_stream::StreamExt;
use tonic::Streaming;

use crate::helpers::*;

fn feed_config(c: &mut ServeConfig) {
    c.sweep_interval = Duration::ZERO;
    c.feed.poll = Duration::from_millis(50);
}

/// `n` records of scope `s` that failed and are due for a retry now.
async fn failed_due(c: &mut Client, n: usize) {
    for i in 0..n {
        let key = format!("k{i:03}");
        let granted = proceed(c, acquire("s", &key)).await;
        let fail = Outcome::Failure(proto::Failure {
            error: "boom".into(),
            permanent: false,
            retry_after: secs(0),
        });
        complete_ok(c, complete("s", &key, &token(&granted), fail)).await;
    }
}

type Client = idempotency_coordinator::proto::coordinator_client::CoordinatorClient<
    tonic::transport::Channel,
>;

async fn subscribe(c: &mut Client, scope: &str) -> Streaming<proto::DueRecord> {
    c.watch_due(proto::WatchDueRequest {
        scope: scope.into(),
    })
    .await
    .expect("watch_due")
    .into_inner()
}

async fn next_key(feed: &mut Streaming<proto::DueRecord>) -> Option<(String, DueReason)> {
    let due = tokio::time::timeout(Duration::from_secs(10), feed.next())
        .await
        .ok()??
        .expect("a due record");
    let reason = DueReason::try_from(due.reason).unwrap();
    Some((due.record.unwrap().key, reason))
}

#[tokio::test]
async fn two_subscribers_on_two_replicas_split_the_due_records_without_overlap() {
    let app = spawn_app_with(feed_config).await;
    let mut config = ServeConfig::new("127.0.0.1:0".parse().unwrap(), app.db.url.clone());
    feed_config(&mut config);
    let other = start_server(config).await;
    let mut c = app.client.clone();
    failed_due(&mut c, 100).await;

    let mut feed_a = subscribe(&mut c, "s").await;
    let mut feed_b = subscribe(&mut other.client.clone(), "s").await;
    let (mut got_a, mut got_b) = (Vec::new(), Vec::new());
    while got_a.len() + got_b.len() < 100 {
        tokio::select! {
            Some((key, reason)) = next_key(&mut feed_a) => {
                assert_eq!(reason, DueReason::RetryDue);
                got_a.push(key);
            }
            Some((key, reason)) = next_key(&mut feed_b) => {
                assert_eq!(reason, DueReason::RetryDue);
                got_b.push(key);
            }
            else => panic!("a feed ended early"),
        }
    }
    let a: HashSet<_> = got_a.iter().collect();
    let b: HashSet<_> = got_b.iter().collect();
    assert_eq!(a.len() + b.len(), 100, "nobody got a record twice");
    assert!(a.is_disjoint(&b), "each record went to one subscriber");
    assert!(
        !a.is_empty() && !b.is_empty(),
        "both replicas fed: {} and {}",
        a.len(),
        b.len()
    );
}

#[tokio::test]
async fn what_a_departed_subscriber_was_offered_is_offered_again() {
    let app = spawn_app_with(feed_config).await;
    let mut c = app.client.clone();
    failed_due(&mut c, 20).await;

    let mut first = subscribe(&mut c, "s").await;
    let mut taken = HashSet::new();
    for _ in 0..5 {
        taken.insert(next_key(&mut first).await.unwrap().0);
    }
    drop(first);

    let mut second = subscribe(&mut c, "s").await;
    let mut got = HashSet::new();
    while got.len() < 20 {
        let (key, _) = next_key(&mut second).await.expect("all 20 offered again");
        got.insert(key);
    }
    assert!(taken.is_subset(&got));
}

#[tokio::test]
async fn a_record_that_gets_acquired_is_not_offered_again() {
    let app = spawn_app_with(|c| {
        feed_config(c);
        c.feed.offer = Duration::from_millis(300);
    })
    .await;
    let mut c = app.client.clone();
    failed_due(&mut c, 2).await;
    let mut feed = subscribe(&mut c, "s").await;
    let (first, _) = next_key(&mut feed).await.unwrap();
    let (second, _) = next_key(&mut feed).await.unwrap();
    // Re-drive the first one; leave the second.
    proceed(&mut c, acquire("s", &first)).await;

    // The second comes back when its offer runs out; the first never does.
    for _ in 0..3 {
        let (again, _) = next_key(&mut feed).await.expect("offered again");
        assert_eq!(again, second);
    }
}

#[tokio::test]
async fn a_dead_holders_record_is_offered_as_lease_expired() {
    let app = spawn_app_with(feed_config).await;
    let mut c = app.client.clone();
    let mut req = acquire("s", "dead");
    req.lease_ttl = secs(5);
    proceed(&mut c, req).await;
    let mut feed = subscribe(&mut c, "s").await;
    app.clock.advance(Duration::from_secs(6));
    let (key, reason) = next_key(&mut feed).await.expect("offered");
    assert_eq!((key.as_str(), reason), ("dead", DueReason::LeaseExpired));
}

#[tokio::test]
async fn the_sweepers_finds_reach_an_idle_feed_without_waiting_for_its_poll() {
    let app = spawn_app_with(|c| {
        c.sweep_interval = Duration::from_millis(100);
        c.feed.poll = Duration::from_secs(600);
    })
    .await;
    let mut c = app.client.clone();
    let mut req = acquire("s", "dead");
    req.lease_ttl = secs(5);
    proceed(&mut c, req).await;
    failed_due(&mut c, 1).await;
    let mut feed = subscribe(&mut c, "s").await;
    // Receiving the record that is due already shows the feed has looked;
    // it now sleeps for its (long) poll, and only an announcement wakes it.
    assert_eq!(next_key(&mut feed).await.unwrap().0, "k000");
    app.clock.advance(Duration::from_secs(6));
    let (key, reason) = next_key(&mut feed).await.expect("announced by the sweeper");
    assert_eq!((key.as_str(), reason), ("dead", DueReason::LeaseExpired));
}

#[tokio::test]
async fn feeds_see_only_their_scope() {
    let app = spawn_app_with(feed_config).await;
    let mut c = app.client.clone();
    failed_due(&mut c, 1).await;
    let mut other_scope = subscribe(&mut c, "other").await;
    let nothing = tokio::time::timeout(Duration::from_millis(500), other_scope.next()).await;
    assert!(nothing.is_err(), "nothing due in scope 'other'");
}

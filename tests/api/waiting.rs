//! Acquire's wait window: callers that find the work IN_PROGRESS get the
//! answer the moment it changes, on whichever replica they are connected to.

use std::time::{Duration, Instant};

use futures::future::join_all;
use idempotency_coordinator::config::ServeConfig;
use idempotency_coordinator::proto::{self, Decision, complete_request::Outcome};
use tonic_health::pb::health_check_response::ServingStatus;

use crate::helpers::*;

#[tokio::test]
async fn two_hundred_waiters_on_one_replica_get_the_result_completed_on_another() {
    let app = spawn_app().await; // replica B, in this process
    let replica_a = ServerProcess::start(&app.db.url).await;
    let mut a = replica_a.client().await;
    let holder = proceed(&mut a, acquire("fanout", "k")).await;

    let clients = clients(app.addr, 4).await;
    let waiters: Vec<_> = (0..200)
        .map(|i| {
            let mut c = clients[i % clients.len()].clone();
            tokio::spawn(async move { c.acquire(waiting("fanout", "k", 60)).await })
        })
        .collect();
    until_parked(&app, 200).await;

    let result = b"{\"charged\":true}".to_vec();
    a.complete(complete("fanout", "k", &token(&holder), success(&result)))
        .await
        .unwrap();
    for answer in join_all(waiters).await {
        let answer = answer.unwrap().expect("acquire").into_inner();
        assert_eq!(decision(&answer), Decision::AlreadyDone);
        assert_eq!(answer.record.unwrap().result.unwrap().result, result);
    }
    until_waiters(&app, 0).await;
}

#[tokio::test]
async fn a_waiter_takes_over_as_soon_as_a_dead_holders_lease_runs_out() {
    let app = spawn_app().await;
    let mut c = app.client.clone();
    let mut req = acquire("s", "k");
    req.lease_ttl = secs(2);
    let holder = proceed(&mut c, req).await;

    let started = Instant::now();
    let answer = c.acquire(waiting("s", "k", 20)).await.unwrap().into_inner();
    let waited = started.elapsed();
    assert_eq!(decision(&answer), Decision::Proceed);
    assert_eq!(answer.lease.as_ref().unwrap().attempt, 2);
    assert!(
        waited < Duration::from_secs(4),
        "woken at the lease's end, not the window's: {waited:?}"
    );
    assert_ne!(token(&answer), token(&holder));
}

#[tokio::test]
async fn a_holder_failing_with_a_retry_due_now_hands_over_to_a_waiter() {
    let app = spawn_app().await;
    let mut c = app.client.clone();
    let holder = proceed(&mut c, acquire("s", "k")).await;
    let mut waiter = c.clone();
    let waiting_call = tokio::spawn(async move { waiter.acquire(waiting("s", "k", 30)).await });
    until_parked(&app, 1).await;

    let started = Instant::now();
    let fail = Outcome::Failure(proto::Failure {
        error: "gateway timeout".into(),
        permanent: false,
        retry_after: secs(0),
    });
    c.complete(complete("s", "k", &token(&holder), fail))
        .await
        .unwrap();
    let answer = waiting_call.await.unwrap().unwrap().into_inner();
    assert_eq!(decision(&answer), Decision::Proceed);
    assert_eq!(answer.lease.unwrap().attempt, 2);
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[tokio::test]
async fn a_window_that_ends_with_the_holder_still_working_answers_in_progress() {
    let app = spawn_app().await;
    let mut c = app.client.clone();
    proceed(&mut c, acquire("s", "k")).await;

    let started = Instant::now();
    let answer = c.acquire(waiting("s", "k", 1)).await.unwrap().into_inner();
    let waited = started.elapsed();
    assert_eq!(decision(&answer), Decision::InProgress);
    assert!(answer.retry_after.is_some());
    assert!(
        (Duration::from_millis(950)..Duration::from_secs(3)).contains(&waited),
        "{waited:?}"
    );
    until_waiters(&app, 0).await;
}

#[tokio::test]
async fn the_calls_deadline_cuts_a_longer_wait_and_still_gets_an_answer() {
    let app = spawn_app().await;
    let mut c = app.client.clone();
    proceed(&mut c, acquire("s", "k")).await;

    let mut request = tonic::Request::new(waiting("s", "k", 30));
    request.set_timeout(Duration::from_millis(1500));
    let started = Instant::now();
    let answer = c
        .acquire(request)
        .await
        .expect("an answer, not DEADLINE_EXCEEDED");
    assert_eq!(decision(answer.get_ref()), Decision::InProgress);
    assert!(started.elapsed() < Duration::from_millis(1500));
}

#[tokio::test]
async fn waiters_survive_the_server_losing_every_database_connection() {
    let app = spawn_app().await;
    let mut c = app.client.clone();
    let holder = proceed(&mut c, acquire("s", "k")).await;
    let waiters: Vec<_> = (0..20)
        .map(|_| {
            let mut w = c.clone();
            tokio::spawn(async move { w.acquire(waiting("s", "k", 60)).await })
        })
        .collect();
    until_parked(&app, 20).await;

    let admin = app.db.connect().await;
    let killed: i64 = admin
        .query_one(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
              WHERE datname = $1 AND pid <> pg_backend_pid()",
            &[&app.db.name],
        )
        .await
        .unwrap()
        .get(0);
    assert!(killed >= 2, "the listener and pooled connections: {killed}");

    // Complete is idempotent, so a client retries it while the server
    // replaces its connections.
    let call = complete("s", "k", &token(&holder), success(b"survived"));
    eventually("Complete to go through", Duration::from_secs(15), || {
        let mut c = c.clone();
        let call = call.clone();
        async move { c.complete(call).await.ok() }
    })
    .await;
    for answer in join_all(waiters).await {
        let answer = answer.unwrap().expect("acquire").into_inner();
        assert_eq!(decision(&answer), Decision::AlreadyDone);
        assert_eq!(answer.record.unwrap().result.unwrap().result, b"survived");
    }
}

#[tokio::test]
async fn a_thousand_cancelled_waiters_leave_no_waiter_behind() {
    let app = spawn_app().await;
    let mut c = app.client.clone();
    proceed(&mut c, acquire("s", "k")).await;

    let clients = clients(app.addr, 10).await;
    let calls: Vec<_> = (0..1000)
        .map(|i| {
            let mut c = clients[i % clients.len()].clone();
            tokio::spawn(async move { c.acquire(waiting("s", "k", 60)).await })
        })
        .collect();
    until_parked(&app, 1000).await;
    assert_eq!(app.hub.waiters(), 1000);
    assert_eq!(app.hub.watched_records(), 1);

    for call in &calls {
        call.abort();
    }
    until_waiters(&app, 0).await;
    assert_eq!(app.hub.parked(), 0);
    assert_eq!(app.hub.watched_records(), 0);
}

#[tokio::test]
async fn without_waiters_completing_sends_no_notification() {
    let app = spawn_app().await;
    let mut c = app.client.clone();
    let holder = proceed(&mut c, acquire("s", "k")).await;
    c.complete(complete("s", "k", &token(&holder), success(b"x")))
        .await
        .unwrap();
    let watched: i64 = app
        .db
        .connect()
        .await
        .query_one(
            "SELECT count(*) FROM idempotency_keys WHERE watch_until IS NOT NULL",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(watched, 0, "the plain path never marks a record watched");
}

#[tokio::test]
async fn a_heartbeat_keeps_waiters_waiting_until_the_extended_lease_ends() {
    let app = spawn_app().await;
    let mut c = app.client.clone();
    let mut req = acquire("s", "k");
    req.lease_ttl = secs(2);
    // Before the Acquire: the lease is counted from a moment after this,
    // however long its answer takes to come back on a busy machine.
    let started = Instant::now();
    let holder = proceed(&mut c, req).await;
    let mut waiter = c.clone();
    let waiting_call = tokio::spawn(async move { waiter.acquire(waiting("s", "k", 20)).await });
    until_parked(&app, 1).await;

    let lease = c
        .extend_lease(proto::ExtendLeaseRequest {
            scope: "s".into(),
            key: "k".into(),
            lease_token: token(&holder),
            extend_by: secs(2),
            checkpoint: None,
        })
        .await
        .unwrap()
        .into_inner()
        .lease
        .unwrap();
    let extended = seconds_between(
        holder.lease.as_ref().unwrap().expires_at.as_ref().unwrap(),
        lease.expires_at.as_ref().unwrap(),
    );
    assert!((1.99..=2.01).contains(&extended), "{extended}");

    let answer = waiting_call.await.unwrap().unwrap().into_inner();
    let waited = started.elapsed();
    assert_eq!(decision(&answer), Decision::Proceed);
    assert!(
        (Duration::from_millis(3900)..Duration::from_secs(6)).contains(&waited),
        "taken over when the extended lease ended, not the original one: {waited:?}"
    );
}

#[tokio::test]
async fn waiters_of_a_replica_whose_listener_is_down_hear_a_change_even_while_it_stops() {
    let db = TestDatabase::create().await;
    let mut slow_to_reconnect = ServeConfig::new("127.0.0.1:0".parse().unwrap(), db.url.clone());
    slow_to_reconnect.health_interval = Duration::from_secs(5);
    let a = start_server(slow_to_reconnect).await;
    let b = start_server(ServeConfig::new(
        "127.0.0.1:0".parse().unwrap(),
        db.url.clone(),
    ))
    .await;
    until_health(&a, READINESS, ServingStatus::Serving).await;
    let mut cb = b.client.clone();
    let holder = proceed(&mut cb, acquire("s", "k")).await;
    let mut wa = a.client.clone();
    let waiter = tokio::spawn(async move { wa.acquire(waiting("s", "k", 20)).await });
    until_parked(&a, 1).await;

    // A loses its listener (and reconnects only after 5 s), then is asked to
    // stop while its waiter still waits: notifications cannot reach it.
    db.connect()
        .await
        .query_one(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
              WHERE datname = $1 AND pid <> pg_backend_pid()",
            &[&db.name],
        )
        .await
        .unwrap();
    until_health(&a, READINESS, ServingStatus::NotServing).await;
    let stopping = tokio::spawn(a.stop());

    let call = complete("s", "k", &token(&holder), success(b"done"));
    eventually(
        "Complete to go through on B",
        Duration::from_secs(10),
        || {
            let mut c = cb.clone();
            let call = call.clone();
            async move { c.complete(call).await.ok() }
        },
    )
    .await;
    let completed = Instant::now();
    let answer = waiter.await.unwrap().expect("acquire").into_inner();
    assert_eq!(decision(&answer), Decision::AlreadyDone);
    assert!(
        completed.elapsed() < Duration::from_secs(3),
        "heard by polling, not at the window's end: {:?}",
        completed.elapsed()
    );
    stopping.await.unwrap();
}

//! A holder whose lease lapsed and was taken over: its heartbeat hears
//! LEASE_LOST and the work is told (and dropped, unless it is let finish);
//! with no heartbeat, its own Complete is refused. Either way nothing of
//! A's is stored, and a value A's work returned comes back to A as
//! NOT_RECORDED.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use idempotency_client::proto::{
    CompleteRequest, Decision, Lease, Status, Success, complete_request,
};
use idempotency_client::{
    CallError, Client, Code, Done, Fingerprint, Heartbeat, RunOnceError, RunOptions, WhenLeaseLost,
    WorkError,
};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::support::*;

/// Sets its flag when dropped: shows the work's future was dropped.
struct SetOnDrop(Arc<AtomicBool>);

impl Drop for SetOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// B: bare Acquires until the lapsed lease is taken over.
async fn take_over(fixture: &Fixture, scope: &str, key: &str) -> Lease {
    eventually(
        "B to take the lease over",
        Duration::from_secs(10),
        || async {
            let answer = fixture
                .bare_acquire(scope, key, Duration::from_secs(60), "holder-b")
                .await;
            match answer.decision() {
                Decision::Proceed => answer.lease,
                Decision::InProgress => None,
                other => panic!("B expected PROCEED or IN_PROGRESS, got {other:?}"),
            }
        },
    )
    .await
}

/// A's `run_once` of `work` on ("jobs.export", `key`), in a task of its
/// own.
fn run_a<F, Fut>(
    client: Client,
    key: String,
    options: RunOptions,
    work: F,
) -> JoinHandle<Result<Done<String>, RunOnceError<String, String>>>
where
    F: FnOnce(idempotency_client::Lease) -> Fut + Send + 'static,
    Fut: Future<Output = Result<String, WorkError<String>>> + Send + 'static,
{
    tokio::spawn(async move {
        client
            .run_once("jobs.export", &key, Fingerprint::None, &options, work)
            .await
    })
}

/// A's outcome gives back A's value, unrecorded because the lease was
/// lost, and the record is still B's, with nothing of A's stored.
async fn not_recorded_and_held_by_b(
    outcome: Result<Done<String>, RunOnceError<String, String>>,
    fixture: &Fixture,
    key: &str,
    lease_b: &Lease,
) {
    match outcome {
        Err(RunOnceError::NotRecorded { value, error }) => {
            assert_eq!(value, "from A", "A's value comes back to A");
            assert!(error.is_lease_lost(), "{error}");
        }
        other => panic!("expected NotRecorded, got {other:?}"),
    }
    let record = fixture.record("jobs.export", key).await;
    assert_eq!(record.status(), Status::Processing, "A stored nothing");
    assert_eq!(record.fencing_token, lease_b.fencing_token);
    assert!(record.result.is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_whose_lease_was_taken_over_is_told_and_its_late_complete_refused() {
    let fixture = Fixture::start().await;
    let client = fixture.client().await;
    let key = fresh_key();
    // The heartbeat comes only after the lease has lapsed.
    let options = RunOptions {
        lease_ttl: Duration::from_secs(1),
        heartbeat: Heartbeat::Every(Duration::from_millis(2000)),
        ..RunOptions::default()
    };
    let (started, lease_of_a) = oneshot::channel();
    let told = Arc::new(AtomicBool::new(false));
    let dropped = Arc::new(AtomicBool::new(false));

    let a = {
        let (told, dropped) = (told.clone(), dropped.clone());
        run_a(client, key.clone(), options, |lease| async move {
            let _dropped = SetOnDrop(dropped);
            let cancelled = lease.cancellation_token();
            tokio::spawn(async move {
                cancelled.cancelled().await;
                told.store(true, Ordering::SeqCst);
            });
            started
                .send((lease.token().to_owned(), lease.fencing_token()))
                .unwrap();
            // A work that would never end on its own.
            std::future::pending::<()>().await;
            Ok("from A".to_owned())
        })
    };
    let (token_a, fencing_a) = within("A's work to start", Duration::from_secs(10), lease_of_a)
        .await
        .unwrap();

    let lease_b = take_over(&fixture, "jobs.export", &key).await;
    assert_eq!(lease_b.attempt, 2);
    assert!(lease_b.fencing_token > fencing_a);

    let outcome = within("A's run_once to end", Duration::from_secs(10), a)
        .await
        .unwrap();
    assert!(
        matches!(outcome, Err(RunOnceError::LeaseLost)),
        "{outcome:?}"
    );
    assert!(dropped.load(Ordering::SeqCst), "A's work was dropped");
    eventually(
        "A's cancellation token to fire",
        Duration::from_secs(5),
        || async { told.load(Ordering::SeqCst).then_some(()) },
    )
    .await;

    // A completed nothing: the record is B's.
    let record = fixture.record("jobs.export", &key).await;
    assert_eq!(record.status(), Status::Processing);
    assert_eq!(record.fencing_token, lease_b.fencing_token);
    assert!(record.result.is_none());

    // A late Complete with A's token is refused.
    let late = fixture
        .stub()
        .await
        .complete(CompleteRequest {
            scope: "jobs.export".into(),
            key: key.clone(),
            lease_token: token_a,
            outcome: Some(complete_request::Outcome::Success(Success {
                result: b"\"from A\"".to_vec(),
                ..Success::default()
            })),
        })
        .await
        .expect_err("A's late Complete is refused");
    let late = CallError::from(late);
    assert_eq!(late.code, Code::Aborted);
    assert_eq!(late.reason.as_deref(), Some("LEASE_LOST"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_heartbeat_a_late_holder_hears_lease_lost_from_its_complete() {
    let fixture = Fixture::start().await;
    let client = fixture.client().await;
    let key = fresh_key();
    let options = RunOptions {
        lease_ttl: Duration::from_secs(1),
        heartbeat: Heartbeat::Off,
        ..RunOptions::default()
    };
    let (started, a_started) = oneshot::channel();
    let (taken_over, b_took_over) = oneshot::channel::<()>();

    let a = run_a(client, key.clone(), options, |lease| async move {
        started.send(lease.fencing_token()).unwrap();
        // The work returns only once B holds the key.
        b_took_over.await.unwrap();
        assert!(!lease.is_lost(), "nobody told A: no heartbeat");
        Ok("from A".to_owned())
    });
    let fencing_a = within("A's work to start", Duration::from_secs(10), a_started)
        .await
        .unwrap();
    let lease_b = take_over(&fixture, "jobs.export", &key).await;
    assert!(lease_b.fencing_token > fencing_a);
    taken_over.send(()).unwrap();

    let outcome = within("A's run_once to end", Duration::from_secs(10), a)
        .await
        .unwrap();
    not_recorded_and_held_by_b(outcome, &fixture, &key, &lease_b).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn work_let_finish_after_its_lease_was_lost_is_told_runs_on_and_keeps_its_value() {
    let fixture = Fixture::start().await;
    let client = fixture.client().await;
    let key = fresh_key();
    let options = RunOptions {
        lease_ttl: Duration::from_secs(1),
        heartbeat: Heartbeat::Every(Duration::from_millis(2000)),
        when_lease_lost: WhenLeaseLost::LetFinish,
        ..RunOptions::default()
    };
    let (started, a_started) = oneshot::channel();
    let (finish, finished) = oneshot::channel::<()>();
    let dropped = Arc::new(AtomicBool::new(false));

    let a = {
        let dropped = dropped.clone();
        run_a(client, key.clone(), options, |lease| async move {
            let _dropped = SetOnDrop(dropped);
            started.send(lease.clone()).unwrap();
            // Like a request already sent to another service:
            // it ends when that service answers.
            finished.await.unwrap();
            Ok("from A".to_owned())
        })
    };
    let lease_a = within("A's work to start", Duration::from_secs(10), a_started)
        .await
        .unwrap();
    let lease_b = take_over(&fixture, "jobs.export", &key).await;
    assert!(lease_b.fencing_token > lease_a.fencing_token());
    within(
        "A's work to be told its lease is lost",
        Duration::from_secs(10),
        lease_a.lost(),
    )
    .await;
    assert!(
        !dropped.load(Ordering::SeqCst),
        "the work runs on after its lease was lost"
    );
    finish.send(()).unwrap();

    let outcome = within("A's run_once to end", Duration::from_secs(10), a)
        .await
        .unwrap();
    not_recorded_and_held_by_b(outcome, &fixture, &key, &lease_b).await;
}

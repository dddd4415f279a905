//! The template's happy paths and failures: run once then replay, one run
//! among concurrent callers, a lease kept alive by heartbeats, retryable and
//! permanent failures, a conflicting request.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use idempotency_client::proto::{Decision, Status};
use idempotency_client::{Fingerprint, RunOnceError, RunOptions, WorkError};
use serde::{Deserialize, Serialize};

use crate::support::*;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Receipt {
    charge_id: String,
    amount: u64,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_call_runs_the_work_and_the_second_replays_it() {
    let fixture = Fixture::start().await;
    let client = fixture.client().await;
    let key = fresh_key();
    let runs = Arc::new(AtomicU32::new(0));
    let options = RunOptions::default();

    let run = || {
        let runs = Arc::clone(&runs);
        client.run_once(
            "payments.charge",
            &key,
            Fingerprint::Exact("order-1".into()),
            &options,
            move |lease| async move {
                runs.fetch_add(1, Ordering::SeqCst);
                assert_eq!(lease.attempt(), 1);
                assert!(lease.fencing_token() > 0);
                Ok::<_, WorkError<String>>(Receipt {
                    charge_id: uuid::Uuid::new_v4().to_string(),
                    amount: 4200,
                })
            },
        )
    };

    let first = run().await.expect("the first call");
    assert!(!first.replayed, "the first call ran the work");
    assert_eq!(first.record.status(), Status::Succeeded);

    let second = run().await.expect("the second call");
    assert!(second.replayed, "the second call is a replay");
    assert_eq!(second.value, first.value, "the same result");
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the work ran once");

    let record = fixture.record("payments.charge", &key).await;
    assert_eq!(record.attempt_count, 1);
    let stored = record.result.expect("a stored result");
    assert_eq!(stored.content_type, "application/json");
    assert_eq!(
        serde_json::from_slice::<Receipt>(&stored.result).unwrap(),
        first.value
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_concurrent_calls_run_the_work_once_and_return_one_result() {
    let fixture = Fixture::start().await;
    let client = fixture.client().await;
    let key = fresh_key();
    let runs = Arc::new(AtomicU32::new(0));

    let calls: Vec<_> = (0..20)
        .map(|_| {
            let client = client.clone();
            let key = key.clone();
            let runs = Arc::clone(&runs);
            tokio::spawn(async move {
                client
                    .run_once(
                        "email.welcome",
                        &key,
                        Fingerprint::None,
                        &RunOptions::default(),
                        move |_lease| async move {
                            runs.fetch_add(1, Ordering::SeqCst);
                            // Long enough for every other caller to arrive
                            // and wait on the holder.
                            tokio::time::sleep(Duration::from_millis(300)).await;
                            Ok::<_, WorkError<String>>(uuid::Uuid::new_v4().to_string())
                        },
                    )
                    .await
            })
        })
        .collect();

    let mut values = Vec::new();
    let mut fresh = 0;
    for call in calls {
        let done = within("a concurrent call", Duration::from_secs(30), call)
            .await
            .unwrap()
            .expect("every call gets the result");
        fresh += usize::from(!done.replayed);
        values.push(done.value);
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the work ran once");
    assert_eq!(fresh, 1, "one call ran it, the others replayed it");
    assert!(values.iter().all(|v| *v == values[0]), "{values:?}");
    assert_eq!(fixture.record("email.welcome", &key).await.attempt_count, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_work_longer_than_the_lease_keeps_it_through_heartbeats() {
    let fixture = Fixture::start().await;
    let client = fixture.client().await;
    let key = fresh_key();
    let ttl = Duration::from_secs(1);
    let options = RunOptions {
        lease_ttl: ttl,
        ..RunOptions::default()
    };

    let fixture_ref = &fixture;
    let key_ref = &key;
    let done = client
        .run_once(
            "reports.build",
            &key,
            Fingerprint::None,
            &options,
            |lease| async move {
                let first_expiry = lease.expires_at().expect("an expiry");
                let started = Instant::now();
                // Work for well past the TTL; every so often another caller
                // asks for the key, and must find it held.
                while started.elapsed() < ttl * 3 {
                    tokio::time::sleep(Duration::from_millis(250)).await;
                    let other = fixture_ref
                        .bare_acquire("reports.build", key_ref, ttl, "someone-else")
                        .await;
                    assert_eq!(
                        other.decision(),
                        Decision::InProgress,
                        "after {:?} the lease is still held",
                        started.elapsed()
                    );
                }
                assert!(!lease.is_lost());
                assert!(
                    lease.expires_at().unwrap() > first_expiry,
                    "heartbeats moved the expiry"
                );
                Ok::<_, WorkError<String>>("built".to_owned())
            },
        )
        .await
        .expect("the work completes under its lease");
    assert!(!done.replayed);
    assert_eq!(done.value, "built");
    let record = fixture.record("reports.build", &key).await;
    assert_eq!(record.status(), Status::Succeeded);
    assert_eq!(record.attempt_count, 1, "nobody took over");
    assert_eq!(record.fencing_token, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeats_keep_the_lease_one_ttl_ahead_instead_of_growing_it() {
    let fixture = Fixture::start().await;
    let client = fixture.client().await;
    let key = fresh_key();
    let ttl = Duration::from_secs(3);
    let options = RunOptions {
        lease_ttl: ttl,
        ..RunOptions::default()
    };
    let (fixture_ref, key_ref) = (&fixture, &key);
    client
        .run_once(
            "reports.build",
            &key,
            Fingerprint::None,
            &options,
            |_lease| async move {
                // Four heartbeats (every third of the TTL): had each added a
                // whole TTL, the lease would now run ~12 s past its last
                // change.
                tokio::time::sleep(Duration::from_millis(4_300)).await;
                let record = fixture_ref.record("reports.build", key_ref).await;
                let ahead = timestamp_secs(record.lease_expires_at.as_ref())
                    - timestamp_secs(record.updated_at.as_ref());
                assert!(
                    ahead <= ttl.as_secs_f64() + 1.0,
                    "the lease runs {ahead:.2} s past its last extension (TTL {ttl:?})"
                );
                Ok::<_, WorkError<String>>(())
            },
        )
        .await
        .expect("the work completes under its lease");
}

fn timestamp_secs(at: Option<&prost_types::Timestamp>) -> f64 {
    let at = at.expect("a timestamp");
    at.seconds as f64 + f64::from(at.nanos) / 1e9
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_work_leaves_the_key_retryable_and_a_later_call_runs_it_again() {
    let fixture = Fixture::start_with(&["--backoff-base", "1s"]).await;
    let client = fixture.client().await;
    let key = fresh_key();
    let options = RunOptions::default();

    let failed = client
        .run_once(
            "payments.charge",
            &key,
            Fingerprint::None,
            &options,
            |_lease| async move {
                Err::<String, _>(WorkError::Retryable("card network timed out".to_owned()))
            },
        )
        .await;
    match failed {
        Err(RunOnceError::Work(error)) => assert_eq!(error, "card network timed out"),
        other => panic!("expected the work's error, got {other:?}"),
    }
    let record = fixture.record("payments.charge", &key).await;
    assert_eq!(record.status(), Status::Failed);
    assert_eq!(record.last_error, "card network timed out");

    // Right after: the retry is not due yet.
    let early = client
        .run_once(
            "payments.charge",
            &key,
            Fingerprint::None,
            &options,
            |_lease| async move { Ok::<_, WorkError<String>>("too early".to_owned()) },
        )
        .await;
    match early {
        Err(RunOnceError::RetryLater { retry_after, .. }) => {
            assert!(retry_after.is_some_and(|d| d > Duration::ZERO));
        }
        other => panic!("expected RETRY_LATER, got {other:?}"),
    }

    // Once it is due, a call runs the work again, as attempt 2.
    let done = eventually("the retry to come due", Duration::from_secs(15), || async {
        match client
            .run_once(
                "payments.charge",
                &key,
                Fingerprint::None,
                &options,
                |lease| async move {
                    assert_eq!(lease.attempt(), 2);
                    Ok::<_, WorkError<String>>("charged".to_owned())
                },
            )
            .await
        {
            Ok(done) => Some(done),
            Err(RunOnceError::RetryLater { .. }) => None,
            Err(other) => panic!("expected RETRY_LATER or a run, got {other:?}"),
        }
    })
    .await;
    assert!(!done.replayed);
    assert_eq!(done.value, "charged");
    assert_eq!(done.record.attempt_count, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permanent_failure_makes_the_key_exhausted() {
    let fixture = Fixture::start().await;
    let client = fixture.client().await;
    let key = fresh_key();
    let options = RunOptions::default();

    let failed =
        client
            .run_once(
                "payments.charge",
                &key,
                Fingerprint::None,
                &options,
                |_lease| async move {
                    Err::<String, _>(WorkError::Permanent("card declined".to_owned()))
                },
            )
            .await;
    assert!(
        matches!(failed, Err(RunOnceError::Work(ref e)) if e == "card declined"),
        "{failed:?}"
    );

    let runs = AtomicU32::new(0);
    let next = client
        .run_once(
            "payments.charge",
            &key,
            Fingerprint::None,
            &options,
            |_lease| async {
                runs.fetch_add(1, Ordering::SeqCst);
                Ok::<_, WorkError<String>>("charged".to_owned())
            },
        )
        .await;
    match next {
        Err(RunOnceError::Exhausted { last_error, record }) => {
            assert_eq!(last_error, "card declined");
            assert_eq!(record.status(), Status::FailedPermanent);
        }
        other => panic!("expected EXHAUSTED, got {other:?}"),
    }
    assert_eq!(runs.load(Ordering::SeqCst), 0, "the work did not run");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_key_with_another_request_is_a_conflict() {
    let fixture = Fixture::start().await;
    let client = fixture.client().await;
    let key = fresh_key();
    let options = RunOptions::default();
    let request =
        |amount: u64| Fingerprint::json(&serde_json::json!({ "amount": amount })).unwrap();

    client
        .run_once("payments.charge", &key, request(10), &options, |_| async {
            Ok::<_, WorkError<String>>(10)
        })
        .await
        .expect("the first request");
    // The same request written differently is the same request.
    let same = Fingerprint::Json(r#"{ "amount" : 10 }"#.into());
    let replay = client
        .run_once("payments.charge", &key, same, &options, |_| async {
            Ok::<_, WorkError<String>>(0)
        })
        .await
        .expect("a replay");
    assert!(replay.replayed);
    assert_eq!(replay.value, 10);

    let other = client
        .run_once("payments.charge", &key, request(99), &options, |_| async {
            Ok::<_, WorkError<String>>(99)
        })
        .await;
    assert!(
        matches!(other, Err(RunOnceError::Conflict { .. })),
        "{other:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_reaches_the_next_attempt_and_raw_bytes_are_stored_as_they_are() {
    let fixture = Fixture::start().await;
    let client = fixture.client().await;
    let key = fresh_key();
    let options = RunOptions::default();
    let codec = idempotency_client::Raw::<Vec<u8>>::with_content_type("text/plain");

    let failed = client
        .run_once_with_codec(
            &codec,
            "files.upload",
            &key,
            Fingerprint::None,
            &options,
            |lease| async move {
                assert!(lease.checkpoint().is_empty());
                lease
                    .save_checkpoint(b"part-3".to_vec())
                    .await
                    .expect("save a checkpoint");
                // Due again at once.
                Err::<Vec<u8>, _>(WorkError::RetryAfter(
                    "connection reset".to_owned(),
                    Duration::ZERO,
                ))
            },
        )
        .await;
    assert!(matches!(failed, Err(RunOnceError::Work(_))), "{failed:?}");

    let done = client
        .run_once_with_codec(
            &codec,
            "files.upload",
            &key,
            Fingerprint::None,
            &options,
            |lease| async move {
                assert_eq!(lease.attempt(), 2);
                assert_eq!(lease.checkpoint(), b"part-3", "the next attempt resumes");
                Ok::<_, WorkError<String>>(b"uploaded".to_vec())
            },
        )
        .await
        .expect("the second attempt");
    assert_eq!(done.value, b"uploaded");
    let stored = fixture.record("files.upload", &key).await.result.unwrap();
    assert_eq!(stored.result, b"uploaded");
    assert_eq!(stored.content_type, "text/plain");
}

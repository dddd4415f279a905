//! What a call hears when its deadline passes in the server, and what a
//! debug log keeps of a whole cycle of calls.

use std::time::Duration;

use bytes::Bytes;
use idempotency_coordinator::proto;

use super::{ACQUIRE, grpc_request, grpc_status, h2_connect, prefix};
use crate::helpers::*;

#[tokio::test]
async fn a_debug_log_of_a_whole_cycle_holds_no_token_result_or_error_text() {
    let db = TestDatabase::create().await;
    let server = ServerProcess::launch(
        &db.url,
        &["--sweep-interval", "0s", "--backoff-base", "100ms"],
        Launch {
            env: &[("RUST_LOG", "debug")],
            ..Launch::default()
        },
    )
    .await;
    let mut c = server.client().await;
    let first = proceed(&mut c, acquire("s", "k")).await;
    let first_token = token(&first);
    c.complete(complete(
        "s",
        "k",
        &first_token,
        failure("error-text-secret-31337"),
    ))
    .await
    .unwrap();
    let retry = acquire("s", "k");
    let second = eventually("the retry to be due", Duration::from_secs(10), || {
        let mut c = c.clone();
        let retry = retry.clone();
        async move {
            let a = c.acquire(retry).await.ok()?.into_inner();
            (decision(&a) == proto::Decision::Proceed).then_some(a)
        }
    })
    .await;
    let second_token = token(&second);
    c.complete(complete(
        "s",
        "k",
        &second_token,
        success(b"result-secret-27182"),
    ))
    .await
    .unwrap();
    c.acquire(acquire("s", "k")).await.unwrap();
    c.get(proto::GetRequest {
        scope: "s".into(),
        key: "k".into(),
    })
    .await
    .unwrap();

    let logs = eventually("debug lines", Duration::from_secs(5), || async {
        let logs = server.logs();
        logs.iter().any(|l| l.contains("DEBUG")).then_some(logs)
    })
    .await;
    let secret_bytes = format!("{:?}", &b"result-secret-27182"[..6]);
    let secret_bytes = secret_bytes.trim_end_matches(']');
    for line in &logs {
        for secret in [
            first_token.as_str(),
            &first_token.replace('-', ""),
            second_token.as_str(),
            &second_token.replace('-', ""),
            "result-secret",
            secret_bytes,
            "error-text-secret",
        ] {
            assert!(!line.contains(secret), "{secret:?} logged: {line}");
        }
    }
}

#[tokio::test]
async fn a_deadline_that_passes_in_the_server_is_deadline_exceeded() {
    use prost::Message as _;
    let db = TestDatabase::create().await;
    let server = ServerProcess::start(&db.url).await;
    // Another transaction creates the same record and does not commit: the
    // call's statement waits on it past the call's deadline (200 ms, before
    // the shared connections' 300 ms lock_timeout would end the wait).
    let mut blocker = db.connect().await;
    let open = blocker.transaction().await.unwrap();
    open.execute(
        "SELECT idempotency_acquire('default', 's', 'late', '', '', 60000, 3, 60000, 0, 0)",
        &[],
    )
    .await
    .unwrap();
    let mut c = h2_connect(server.addr).await;
    let mut request = grpc_request(ACQUIRE, None);
    request
        .headers_mut()
        .insert("grpc-timeout", "200m".parse().unwrap());
    let message = acquire("s", "late").encode_to_vec();
    let (answer, mut stream) = c.send.send_request(request, false).unwrap();
    stream
        .send_data(prefix(u32::try_from(message.len()).unwrap()), false)
        .unwrap();
    stream.send_data(Bytes::from(message), true).unwrap();
    let (code, message) = grpc_status(answer).await;
    assert_eq!(code, 4, "DEADLINE_EXCEEDED, not CANCELLED: {message}");
    assert!(message.contains("deadline"), "{message}");
    open.rollback().await.unwrap();
}

#[tokio::test]
async fn a_tonic_client_whose_deadline_passes_hears_deadline_exceeded_not_its_own_cancelled() {
    // tonic reports its own timer running out as CANCELLED ("Timeout
    // expired"); the server answers first, so the caller sees the code it
    // retries on.
    let db = TestDatabase::create().await;
    let server = ServerProcess::start(&db.url).await;
    let mut blocker = db.connect().await;
    let open = blocker.transaction().await.unwrap();
    open.execute(
        "SELECT idempotency_acquire('default', 's', 'late', '', '', 60000, 3, 60000, 0, 0)",
        &[],
    )
    .await
    .unwrap();
    let client = server.client().await;
    let calls = (0..8).map(|_| {
        let mut client = client.clone();
        async move {
            let mut request = tonic::Request::new(acquire("s", "late"));
            request.set_timeout(Duration::from_millis(1500));
            client.acquire(request).await.unwrap_err()
        }
    });
    // The calls a batch worker took wait on the lock past their deadline;
    // those still queued for a worker when their deadline comes hear
    // UNAVAILABLE, as `--connect-wait` cut by the deadline promises.
    let codes: Vec<tonic::Code> = futures::future::join_all(calls)
        .await
        .iter()
        .map(tonic::Status::code)
        .collect();
    assert!(
        codes
            .iter()
            .all(|c| matches!(c, tonic::Code::DeadlineExceeded | tonic::Code::Unavailable)),
        "{codes:?}"
    );
    assert!(codes.contains(&tonic::Code::DeadlineExceeded), "{codes:?}");
    open.rollback().await.unwrap();
}

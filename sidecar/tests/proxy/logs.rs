//! The binary's text logs as a log file or a collector gets them.

use std::time::Duration;

use tokio::io::{AsyncBufReadExt as _, BufReader};

use crate::support::Coordinator;
use crate::upstream::TestUpstream;

#[tokio::test]
async fn text_logs_written_to_a_pipe_carry_no_colour_codes() {
    let coordinator = Coordinator::start().await;
    let upstream = TestUpstream::start().await;
    let mut sidecar = tokio::process::Command::new(env!("CARGO_BIN_EXE_idempotency-sidecar"))
        .args(["--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"])
        .args([
            "--upstream",
            &upstream.url(),
            "--coordinator",
            &coordinator.endpoint(),
        ])
        .args(["--log-format", "text"])
        .env_remove("RUST_LOG")
        .env_remove("NO_COLOR")
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start the sidecar binary");
    let mut lines = BufReader::new(sidecar.stderr.take().unwrap()).lines();
    let listening = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(line) = lines.next_line().await.unwrap() {
            if line.contains("listening") {
                return line;
            }
        }
        panic!("the sidecar exited before listening");
    })
    .await
    .expect("the sidecar listening within 30 s");
    assert!(
        !listening.contains('\u{1b}'),
        "an escape sequence in a log line written to a pipe: {listening:?}"
    );
    assert!(listening.contains("INFO"), "{listening:?}");
}

//! The coordinator reached over its Unix socket (`--unix-socket` on the
//! coordinator, `--coordinator unix:PATH` on the sidecar), as when the two
//! share a pod: decisions, stored answers and replays as over TCP.

use http::StatusCode;

use crate::support::{Coordinator, TestClient, fresh_key, start_sidecar};
use crate::upstream::TestUpstream;

#[tokio::test]
async fn over_the_coordinators_unix_socket_an_answer_is_stored_once_and_replayed() {
    let socket = std::env::temp_dir().join(format!("idem-{}.sock", uuid::Uuid::new_v4()));
    let path = socket.to_str().expect("a UTF-8 temporary directory");
    let coordinator = Coordinator::start_with(&["--unix-socket", path]).await;
    let upstream = TestUpstream::start().await;
    let sidecar = start_sidecar(&upstream.url(), &format!("unix:{path}"), &[]).await;
    let client = TestClient::new(sidecar.addr);
    let key = fresh_key();
    let first = client.post("/pay", &key, "{\"amount\":1}").await;
    assert_eq!(first.status, StatusCode::CREATED, "{first:?}");
    assert!(!first.replayed());
    let again = client.post("/pay", &key, "{\"amount\":1}").await;
    assert_eq!(again.status, StatusCode::CREATED, "{again:?}");
    assert!(again.replayed(), "answered from the stored record");
    assert_eq!(again.body, first.body);
    assert_eq!(upstream.count("/pay"), 1, "the upstream ran once");
    assert_eq!(coordinator.db.count_records().await, 1);
    let _ = std::fs::remove_file(&socket);
}

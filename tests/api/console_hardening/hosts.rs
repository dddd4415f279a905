//! DNS rebinding: a page whose name was pointed at this server sends its
//! own name as `Host`. The console, and the whole door of a server without
//! credentials, answer only addresses, localhost and the names of
//! `--http-allowed-hosts`.

use super::*;

const REBOUND: &str = "rebind.evil.example";

#[tokio::test]
async fn a_rebound_host_name_is_refused_421_by_the_console_and_a_door_without_credentials() {
    let db = TestDatabase::create().await;
    let console =
        Console::start(&db, None, &["--http-allowed-hosts", "coordinator.internal"]).await;
    let mut client = console.server.client().await;
    client.acquire(acquire("pay", "k")).await.unwrap();
    let port = console.http.port();
    let send = |host: String, path: &'static str| {
        let request = if path.starts_with("/idempotency") {
            console
                .client
                .post(format!("http://{}{path}", console.http))
                .header("content-type", "application/json")
                .body(r#"{"target":{"scope":"pay","key":"k"}}"#)
        } else {
            console.client.get(format!("http://{}{path}", console.http))
        };
        request.header("host", host).send()
    };
    let confirm = "/console/confirm?action=delete&scope=pay&key=k";
    let delete = "/idempotency.v1.Coordinator/DeleteRecord";
    for (host, path) in [
        (REBOUND.to_owned(), confirm),
        (format!("{REBOUND}:{port}"), confirm),
        (format!("{REBOUND}:{port}"), delete),
    ] {
        let answer = send(host.clone(), path).await.unwrap();
        assert_eq!(answer.status(), 421, "Host {host} on {path}");
        assert!(
            !answer.text().await.unwrap().contains(REBOUND),
            "the host is not echoed"
        );
    }
    client
        .get(get_req("pay", "k"))
        .await
        .expect("the record is still there");
    assert_eq!(console.refusals("unknown_host").await, 3.0);

    for host in [
        format!("127.0.0.1:{port}"),
        format!("localhost:{port}"),
        format!("Coordinator.Internal:{port}"),
    ] {
        let answer = send(host.clone(), confirm).await.unwrap();
        assert_eq!(answer.status(), 200, "Host {host}");
    }
    let answer = send(format!("127.0.0.1:{port}"), delete).await.unwrap();
    assert_eq!(answer.status(), 200);
    let gone = client.get(get_req("pay", "k")).await.unwrap_err();
    assert_eq!(gone.code(), tonic::Code::NotFound);
}

#[tokio::test]
async fn with_credentials_the_door_answers_any_host_and_the_console_does_not() {
    let db = TestDatabase::create().await;
    let file = tokens();
    let console = Console::start(&db, Some(&file), &[]).await;
    let acquire = console
        .client
        .post(format!("http://{}/acquire", console.http))
        .header("host", "coordinator.internal")
        .header("authorization", format!("Bearer {WORKER}"))
        .header("content-type", "application/json")
        .body(r#"{"scope":"s","idempotency_key":"k"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(acquire.status(), 200, "a service calling by its DNS name");
    let login = console
        .client
        .get(console.url("login"))
        .header("host", REBOUND)
        .send()
        .await
        .unwrap();
    assert_eq!(login.status(), 421);
}

//! Requests refused from their head or their field names: what browsers
//! send cross-site, HTTP/1.1 that RFC 9112 refuses, and field names that
//! would forge or colour a log line.

use std::net::SocketAddr;
use std::time::Duration;

use serde_json::{Value, json};

use super::{head, http_app, http_client, raw};
use crate::helpers::*;

#[tokio::test]
async fn the_workflow_routes_take_json_only_and_no_cross_site_request() {
    let app = http_app().await;
    let url = format!("http://{}", app.http_addr.unwrap());
    let client = http_client();
    let body = json!({"scope": "s", "idempotency_key": "k", "final_status": "DONE"}).to_string();
    // What a browser sends cross-site without asking first.
    for path in ["/acquire", "/complete"] {
        for content_type in [
            Some("text/plain"),
            Some("application/x-www-form-urlencoded"),
            None,
        ] {
            let mut request = client.post(format!("{url}{path}")).body(body.clone());
            if let Some(content_type) = content_type {
                request = request.header("content-type", content_type);
            }
            let response = request.send().await.unwrap();
            assert_eq!(response.status(), 415, "{path} {content_type:?}");
            let answer: Value = response.json().await.unwrap();
            assert_eq!(answer["reason"], "UNSUPPORTED_MEDIA_TYPE");
            assert!(
                answer["error"]
                    .as_str()
                    .unwrap()
                    .contains("application/json")
            );
        }
    }
    for path in ["/acquire", "/idempotency.v1.Coordinator/Acquire"] {
        let response = client
            .post(format!("{url}{path}"))
            .header("content-type", "application/json")
            .header("sec-fetch-site", "cross-site")
            .body(json!({"scope": "s", "idempotency_key": "k", "key": "k"}).to_string())
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 403, "{path}");
    }
    assert_eq!(app.db.count_records().await, 0, "nothing was written");

    // JSON with parameters, from the same site or a tool, is served.
    let response = client
        .post(format!("{url}/acquire"))
        .header("content-type", "application/json; charset=utf-8")
        .header("sec-fetch-site", "same-origin")
        .body(json!({"scope": "s", "idempotency_key": "k"}).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(app.db.count_records().await, 1);
}

#[tokio::test]
async fn http_1_1_requests_rfc_9112_refuses_are_refused_and_write_nothing() {
    let app = http_app().await;
    let addr = app.http_addr.unwrap();
    let json = r#"{"scope":"s","idempotency_key":"k"}"#;

    // No Host.
    let no_host = format!(
        "POST /acquire HTTP/1.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{json}",
        json.len()
    );
    assert_eq!(raw(addr, no_host.as_bytes()).await, Some(400));
    // Two of them.
    let two_hosts = format!(
        "{}Host: other\r\nContent-Length: {}\r\n\r\n{json}",
        head("/acquire", ""),
        json.len()
    );
    assert_eq!(raw(addr, two_hosts.as_bytes()).await, Some(400));
    // A transfer coding the server does not implement, before chunked.
    let gzip = format!(
        "{}Transfer-Encoding: gzip, chunked\r\n\r\n{:x}\r\n{json}\r\n0\r\n\r\n",
        head("/acquire", ""),
        json.len()
    );
    assert_eq!(raw(addr, gzip.as_bytes()).await, Some(501));
    // Lengths past any body: too large (ours), or not a length (hyper's).
    for (length, status) in [("18446744073709551613", 413), ("99999999999999999999", 400)] {
        let huge = format!("{}Content-Length: {length}\r\n\r\n{{", head("/acquire", ""));
        assert_eq!(raw(addr, huge.as_bytes()).await, Some(status), "{length}");
    }
    assert_eq!(app.db.count_records().await, 0, "nothing was written");

    // And a well-formed one is served, chunked too.
    let chunked = format!(
        "{}Transfer-Encoding: chunked\r\n\r\n{:x}\r\n{json}\r\n0\r\n\r\n",
        head("/acquire", ""),
        json.len()
    );
    assert_eq!(raw(addr, chunked.as_bytes()).await, Some(200));
    assert_eq!(app.db.count_records().await, 1);
}

#[tokio::test]
async fn a_field_name_with_a_newline_or_escape_cannot_forge_or_colour_a_log_line() {
    use std::process::Stdio;
    use tokio::io::{AsyncBufReadExt as _, BufReader};

    let db = TestDatabase::create().await;
    // Text logs at debug, as an operator reads them.
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_idempotency-coordinator"))
        .args(["--log-format", "text", "serve", "--listen", "127.0.0.1:0"])
        .args(["--http-listen", "127.0.0.1:0", "--database-url", &db.url])
        .env("RUST_LOG", "debug,h2=info,hyper=info,tokio_postgres=info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let mut next_line = async || {
        tokio::time::timeout(Duration::from_secs(30), lines.next_line())
            .await
            .expect("a log line within 30 s")
            .unwrap()
            .expect("the server is running")
    };
    let mut http = None;
    loop {
        let line = next_line().await;
        if line.contains("serving HTTP/JSON") {
            let addr = line
                .split("addr=")
                .nth(1)
                .unwrap()
                .split(' ')
                .next()
                .unwrap();
            http = Some(addr.parse::<SocketAddr>().unwrap());
        }
        if line.contains("database ready") && http.is_some() {
            break;
        }
    }
    let response = http_client()
        .post(format!("http://{}/acquire", http.unwrap()))
        .header("content-type", "application/json")
        .body(r#"{"a\nINJECTED fake line\u001b[31m":1}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 400);
    let mut seen = Vec::new();
    loop {
        let line = next_line().await;
        assert!(!line.contains('\u{1b}'), "a raw ESC in {line:?}");
        assert!(
            !line.starts_with("INJECTED"),
            "a forged line after {seen:#?}"
        );
        // The workflow routes ignore fields they do not read, and name
        // them at debug.
        let named = line.contains("fields this route does not read");
        seen.push(line);
        if named {
            break;
        }
    }
    let named = seen.last().unwrap();
    assert!(
        named.contains(r"a\nINJECTED fake line\u{1b}[31m"),
        "{named}"
    );
}

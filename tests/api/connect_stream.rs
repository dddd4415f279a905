//! Watch and WatchDue in the Connect protocol's streaming shape, against a
//! server process that requires credentials: enveloped messages in JSON and
//! protobuf, the end-of-stream message with its error, tenants kept apart,
//! `Connect-Timeout-Ms`; and `buf curl --protocol connect` following a
//! Watch until the record completes (buf from `.ci/buf`, as `.ci/contract`
//! installs it; skipped with a notice elsewhere, failed under `CI`).

use std::net::SocketAddr;
use std::process::Stdio;
use std::time::{Duration, Instant};

use idempotency_coordinator::proto;
use prost::Message as _;
use serde_json::{Value, json};

use crate::helpers::*;

const TOKEN_A: &str = "connect-stream-tenant-a-token";
const TOKEN_B: &str = "connect-stream-tenant-b-token";
const WATCH: &str = "/idempotency.v1.Coordinator/Watch";
const END_STREAM: u8 = 0x02;

/// A server process requiring credentials (tenants a and b) with its HTTP
/// port; the database and credentials file live as long as it.
struct Guarded {
    _server: ServerProcess,
    http: SocketAddr,
    _db: TestDatabase,
    _tokens: TokenFile,
}

async fn guarded() -> Guarded {
    let db = TestDatabase::create().await;
    let tokens = TokenFile::new(&format!("{TOKEN_A} tenant-a\n{TOKEN_B} tenant-b\n"));
    let path = tokens.path.to_str().unwrap().to_owned();
    let server = ServerProcess::start_with(
        &db.url,
        &["--auth-tokens", &path, "--http-listen", "127.0.0.1:0"],
    )
    .await;
    let http = server.logged_addr("serving HTTP/JSON");
    Guarded {
        _server: server,
        http,
        _db: db,
        _tokens: tokens,
    }
}

fn client() -> reqwest::Client {
    idempotency_coordinator::tls::install_crypto_provider();
    reqwest::Client::new()
}

/// `message` in one envelope.
fn enveloped(message: &[u8]) -> Vec<u8> {
    let mut out = vec![0];
    out.extend_from_slice(&u32::try_from(message.len()).unwrap().to_be_bytes());
    out.extend_from_slice(message);
    out
}

/// A Connect streaming answer, read envelope by envelope.
struct Envelopes {
    response: reqwest::Response,
    buf: Vec<u8>,
}

impl Envelopes {
    /// The next envelope's flags and message; `None` once the body ends.
    /// Fails if one does not arrive within 15 s.
    async fn next(&mut self) -> Option<(u8, Vec<u8>)> {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            if self.buf.len() >= 5 {
                let len = u32::from_be_bytes(self.buf[1..5].try_into().unwrap()) as usize;
                if self.buf.len() >= 5 + len {
                    let flags = self.buf[0];
                    let message = self.buf[5..5 + len].to_vec();
                    self.buf.drain(..5 + len);
                    return Some((flags, message));
                }
            }
            let left = deadline.saturating_duration_since(Instant::now());
            let chunk = tokio::time::timeout(left, self.response.chunk())
                .await
                .expect("an envelope within 15 s")
                .expect("the body reads");
            match chunk {
                Some(bytes) => self.buf.extend_from_slice(&bytes),
                None => {
                    assert!(self.buf.is_empty(), "a truncated envelope: {:?}", self.buf);
                    return None;
                }
            }
        }
    }

    /// The messages up to the end-of-stream message (JSON), which must be
    /// the last thing in the body.
    async fn until_end(&mut self) -> (Vec<Vec<u8>>, Value) {
        let mut messages = Vec::new();
        loop {
            let (flags, message) = self.next().await.expect("an end-of-stream message");
            if flags == END_STREAM {
                assert!(self.next().await.is_none(), "nothing after the end");
                return (messages, serde_json::from_slice(&message).unwrap());
            }
            assert_eq!(flags, 0, "a message's flags");
            messages.push(message);
        }
    }
}

/// Opens a Connect streaming call to `path` with `content_type`.
async fn open(
    http: &reqwest::Client,
    g: &Guarded,
    path: &str,
    content_type: &str,
    headers: &[(&str, &str)],
    body: Vec<u8>,
) -> Envelopes {
    let mut request = http
        .post(format!("http://{}{path}", g.http))
        .header("content-type", content_type)
        .header("connect-protocol-version", "1")
        .body(body);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = request.send().await.expect("an answer");
    assert_eq!(
        response.status(),
        200,
        "streams answer 200, errors included"
    );
    assert_eq!(response.headers()["content-type"], content_type);
    Envelopes {
        response,
        buf: Vec::new(),
    }
}

/// A Watch in JSON, as tenant a unless `headers` say otherwise.
async fn watch_json(
    http: &reqwest::Client,
    g: &Guarded,
    body: Value,
    headers: &[(&str, &str)],
) -> Envelopes {
    let bearer = format!("Bearer {TOKEN_A}");
    let mut all = vec![("authorization", bearer.as_str())];
    all.extend_from_slice(headers);
    if headers.iter().any(|(n, _)| *n == "authorization") {
        all.remove(0);
    }
    let body = enveloped(body.to_string().as_bytes());
    open(http, g, WATCH, "application/connect+json", &all, body).await
}

/// A unary Connect call as tenant a.
async fn unary(http: &reqwest::Client, g: &Guarded, method: &str, body: Value) -> Value {
    let response = http
        .post(format!(
            "http://{}/idempotency.v1.Coordinator/{method}",
            g.http
        ))
        .header("content-type", "application/json")
        .header("authorization", format!("Bearer {TOKEN_A}"))
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    response.json().await.unwrap()
}

fn json_of(message: &[u8]) -> Value {
    serde_json::from_slice(message).unwrap()
}

#[tokio::test]
async fn watch_streams_enveloped_messages_until_the_record_completes() {
    let g = guarded().await;
    let http = client();
    let acquired = unary(&http, &g, "Acquire", json!({"scope": "s", "key": "k"})).await;
    let token = acquired["lease"]["token"].as_str().unwrap().to_owned();

    let mut stream = watch_json(
        &http,
        &g,
        json!({"scope": "s", "key": "k", "timeout": "20s"}),
        &[],
    )
    .await;
    let (flags, first) = stream.next().await.expect("the record as it stands");
    assert_eq!(flags, 0);
    assert_eq!(json_of(&first)["record"]["status"], "STATUS_PROCESSING");
    unary(
        &http,
        &g,
        "Complete",
        json!({"scope": "s", "key": "k", "lease_token": token, "success": {"result": "b2s="}}),
    )
    .await;
    let (messages, end) = stream.until_end().await;
    assert_eq!(messages.len(), 1, "one event: the record completed");
    assert_eq!(
        json_of(&messages[0])["record"]["status"],
        "STATUS_SUCCEEDED"
    );
    assert_eq!(end, json!({}), "a clean end");

    // The same, in protobuf: the completed record, then the end.
    let request = proto::WatchRequest {
        scope: "s".into(),
        key: "k".into(),
        timeout: None,
    };
    let bearer = format!("Bearer {TOKEN_A}");
    let mut stream = open(
        &http,
        &g,
        WATCH,
        "application/connect+proto",
        &[("authorization", &bearer)],
        enveloped(&request.encode_to_vec()),
    )
    .await;
    let (messages, end) = stream.until_end().await;
    assert_eq!(messages.len(), 1);
    let event = proto::WatchEvent::decode(messages[0].as_slice()).expect("a WatchEvent");
    assert_eq!(event.record.unwrap().status(), proto::Status::Succeeded);
    assert_eq!(end, json!({}));
}

#[tokio::test]
async fn refusals_arrive_as_the_end_of_stream_error() {
    let g = guarded().await;
    let http = client();
    unary(&http, &g, "Acquire", json!({"scope": "s", "key": "mine"})).await;

    // No credentials.
    let body = enveloped(json!({"scope": "s", "key": "mine"}).to_string().as_bytes());
    let mut stream = open(&http, &g, WATCH, "application/connect+json", &[], body).await;
    let (messages, end) = stream.until_end().await;
    assert!(messages.is_empty());
    assert_eq!(end["error"]["code"], "unauthenticated", "{end}");

    // An invalid argument, the field named.
    let mut stream = watch_json(&http, &g, json!({"scope": "", "key": "mine"}), &[]).await;
    let (messages, end) = stream.until_end().await;
    assert!(messages.is_empty());
    assert_eq!(end["error"]["code"], "invalid_argument", "{end}");
    let violations = end["error"]["details"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["type"] == "google.rpc.BadRequest")
        .unwrap_or_else(|| panic!("a BadRequest detail: {end}"));
    assert_eq!(
        violations["debug"]["fieldViolations"][0]["field"], "scope",
        "{end}"
    );

    // A field the message does not have, in the JSON, is the door's own refusal.
    let mut stream = watch_json(&http, &g, json!({"scope": "s", "kee": "mine"}), &[]).await;
    let (_, end) = stream.until_end().await;
    assert_eq!(end["error"]["code"], "invalid_argument", "{end}");
    assert!(
        end["error"]["message"].as_str().unwrap().contains("kee"),
        "{end}"
    );

    // Tenant b does not see tenant a's record.
    let bearer_b = format!("Bearer {TOKEN_B}");
    let mut stream = watch_json(
        &http,
        &g,
        json!({"scope": "s", "key": "mine"}),
        &[("authorization", &bearer_b)],
    )
    .await;
    let (messages, end) = stream.until_end().await;
    assert!(messages.is_empty());
    assert_eq!(end["error"]["code"], "not_found", "{end}");

    // Two messages where a server stream takes one.
    let one = enveloped(json!({"scope": "s", "key": "mine"}).to_string().as_bytes());
    let bearer_a = format!("Bearer {TOKEN_A}");
    let mut stream = open(
        &http,
        &g,
        WATCH,
        "application/connect+json",
        &[("authorization", &bearer_a)],
        [one.clone(), one].concat(),
    )
    .await;
    let (_, end) = stream.until_end().await;
    assert_eq!(end["error"]["code"], "invalid_argument", "{end}");

    // Compression is not served.
    let mut stream = watch_json(
        &http,
        &g,
        json!({"scope": "s", "key": "mine"}),
        &[("connect-content-encoding", "gzip")],
    )
    .await;
    let (_, end) = stream.until_end().await;
    assert_eq!(end["error"]["code"], "unimplemented", "{end}");

    // A codec the door does not speak: 415, before anything else.
    let response = http
        .post(format!("http://{}{WATCH}", g.http))
        .header("content-type", "application/connect+thrift")
        .body(vec![0, 0, 0, 0, 0])
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 415);
}

#[tokio::test]
async fn connect_timeout_ms_ends_the_watch() {
    let g = guarded().await;
    let http = client();
    unary(&http, &g, "Acquire", json!({"scope": "s", "key": "held"})).await;
    let started = Instant::now();
    let mut stream = watch_json(
        &http,
        &g,
        json!({"scope": "s", "key": "held", "timeout": "60s"}),
        &[("connect-timeout-ms", "1000")],
    )
    .await;
    let (messages, end) = stream.until_end().await;
    let took = started.elapsed();
    // The window ends a margin before the deadline, so that its last
    // event arrives in time.
    assert!(took >= Duration::from_millis(500), "ended early: {took:?}");
    assert!(
        took < Duration::from_secs(10),
        "the deadline ended it: {took:?}"
    );
    let last = json_of(messages.last().expect("the record as it stood"));
    assert_eq!(last["record"]["status"], "STATUS_PROCESSING");
    assert_eq!(last["timedOut"], true, "{last}");
    assert_eq!(end, json!({}));
}

/// A WatchDue in JSON, as tenant a.
async fn watch_due(http: &reqwest::Client, g: &Guarded, scope: &str) -> Envelopes {
    let bearer = format!("Bearer {TOKEN_A}");
    let body = enveloped(json!({ "scope": scope }).to_string().as_bytes());
    let path = "/idempotency.v1.Coordinator/WatchDue";
    let headers = [("authorization", bearer.as_str())];
    open(http, g, path, "application/connect+json", &headers, body).await
}

#[tokio::test]
async fn watch_due_streams_in_connect_too() {
    let g = guarded().await;
    let http = client();
    let acquired = unary(&http, &g, "Acquire", json!({"scope": "s", "key": "due"})).await;
    let failure = json!({"error": "boom", "retry_after": "0s"});
    let token = acquired["lease"]["token"].as_str().unwrap().to_owned();
    let complete = json!({"scope": "s", "key": "due", "lease_token": token, "failure": failure});
    unary(&http, &g, "Complete", complete).await;
    let mut feed = watch_due(&http, &g, "s").await;
    let (flags, due) = feed.next().await.expect("the due record");
    assert_eq!(flags, 0);
    let due = json_of(&due);
    assert_eq!(due["record"]["key"], "due", "{due}");
    assert_eq!(due["record"]["status"], "STATUS_FAILED", "{due}");
    drop(feed);

    let (messages, end) = watch_due(&http, &g, "").await.until_end().await;
    assert!(messages.is_empty());
    assert_eq!(end["error"]["code"], "invalid_argument", "{end}");
}

/// `.ci/buf`'s buf, if `npm ci --prefix .ci/buf` installed it.
fn buf() -> Option<std::path::PathBuf> {
    let buf =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(".ci/buf/node_modules/.bin/buf");
    let runs = std::process::Command::new(&buf)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if runs {
        return Some(buf);
    }
    skip_without(
        "buf (.ci/buf)",
        "the buf curl test",
        "npm ci --prefix .ci/buf",
    );
    None
}

#[tokio::test]
async fn buf_curl_follows_a_watch_until_the_record_completes() {
    let Some(buf) = buf() else {
        return;
    };
    let g = guarded().await;
    let http = client();
    let acquired = unary(&http, &g, "Acquire", json!({"scope": "s", "key": "curl"})).await;
    let token = acquired["lease"]["token"].as_str().unwrap().to_owned();
    let root = env!("CARGO_MANIFEST_DIR");
    let mut curl = tokio::process::Command::new(buf)
        .args(["curl", "--protocol", "connect"])
        .args(["--schema", &format!("{root}/proto")])
        .args(["-H", &format!("Authorization: Bearer {TOKEN_A}")])
        .args(["-d", r#"{"scope":"s","key":"curl","timeout":"30s"}"#])
        .arg(format!("http://{}{WATCH}", g.http))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("buf runs");
    // buf prints the record as it stands once the stream has begun.
    let mut stdout = curl.stdout.take().unwrap();
    let mut seen = Vec::new();
    let first = async {
        use tokio::io::AsyncReadExt as _;
        let mut chunk = [0u8; 4096];
        while !String::from_utf8_lossy(&seen).contains("STATUS_PROCESSING") {
            let n = stdout.read(&mut chunk).await.unwrap();
            assert!(n > 0, "buf ended early: {}", String::from_utf8_lossy(&seen));
            seen.extend_from_slice(&chunk[..n]);
        }
    };
    tokio::time::timeout(Duration::from_secs(30), first)
        .await
        .expect("buf prints the first event");
    unary(
        &http,
        &g,
        "Complete",
        json!({"scope": "s", "key": "curl", "lease_token": token, "success": {"result": "b2s="}}),
    )
    .await;
    let out = tokio::time::timeout(Duration::from_secs(30), async {
        use tokio::io::AsyncReadExt as _;
        stdout.read_to_end(&mut seen).await.unwrap();
        curl.wait_with_output().await.unwrap()
    })
    .await
    .expect("buf ends once the record completes");
    let text = String::from_utf8_lossy(&seen);
    assert!(
        out.status.success(),
        "buf curl failed: {text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("STATUS_SUCCEEDED"), "{text}");
}

/// A unary Connect call refused from its headers alone (no credentials)
/// from an HTTP/1.1 client that sends its body after its headers, as
/// Connect clients do: the body is still taken, and the client reads the
/// refusal rather than a closed connection (EPIPE, "socket hang up").
#[tokio::test]
async fn a_unary_call_refused_from_its_headers_takes_a_body_sent_after_them() {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    let server = guarded().await;
    let half = vec![b' '; 8 * 1024];
    let mut stream = tokio::net::TcpStream::connect(server.http).await.unwrap();
    let head = format!(
        "POST /idempotency.v1.Coordinator/Get HTTP/1.1\r\nHost: 127.0.0.1\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        2 * half.len()
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    for _ in 0..2 {
        // Within the second the server gives a refused body.
        tokio::time::sleep(Duration::from_millis(150)).await;
        stream
            .write_all(&half)
            .await
            .expect("the body is still taken after a refusal from the headers");
    }
    let mut answer = vec![0; 4096];
    let n = tokio::time::timeout(Duration::from_secs(10), stream.read(&mut answer))
        .await
        .expect("answered within 10 s")
        .expect("the refusal arrives, not a reset");
    let text = String::from_utf8_lossy(&answer[..n]);
    assert!(
        text.starts_with("HTTP/1.1 401") && text.contains("unauthenticated"),
        "{text}"
    );
}

//! The `http-cycle` scenario: the cycle an n8n workflow makes, over the
//! HTTP door's drop-in routes (seed 004): `POST /acquire`, then
//! `POST /complete` with `final_status: DONE`, on fresh keys. Each of
//! `--connections` HTTP/1.1 keep-alive connections runs one cycle at a time,
//! back to back, on hyper's bare connection API (no pool, no retries), so
//! the client costs little and the numbers are the server's.
//!
//! A cycle counts only when both answers are 200, the first with decision
//! PROCEED and the second with ok true. Every other cycle is counted as
//! failed, by kind, and the first answer of each kind is printed.

use std::collections::BTreeMap;
use std::pin::Pin;
use std::time::{Duration, Instant};

use http::{Method, Request, StatusCode, Uri, header};
use hyper::body::{Body as _, Incoming};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;

use idempotency_coordinator::telemetry::cause_chain;

use crate::Args;
use crate::report::{CycleStats, histogram, ms, report_line};

/// The scope every cycle uses.
const SCOPE: &str = "bench";

/// Where the HTTP door listens.
#[derive(Debug, Clone)]
pub(crate) struct Target {
    /// As given, for messages.
    url: String,
    /// host:port, to connect to and to send as Host.
    authority: String,
    /// The path the routes hang under, without a trailing slash.
    base: String,
}

impl Target {
    /// An `http://host:port[/base]` URL (the bench speaks plain HTTP only).
    pub(crate) fn parse(url: &str) -> Result<Self, String> {
        let uri: Uri = url
            .parse()
            .map_err(|e| format!("--http-target {url}: not a URL: {e}"))?;
        if uri.scheme_str() != Some("http") {
            return Err(format!(
                "--http-target {url}: must be an http:// URL (the bench does not speak TLS)"
            ));
        }
        let authority = uri
            .authority()
            .ok_or_else(|| format!("--http-target {url}: no host"))?;
        let authority = match authority.port_u16() {
            Some(_) => authority.to_string(),
            None => format!("{authority}:80"),
        };
        Ok(Target {
            url: url.to_owned(),
            authority,
            base: uri.path().trim_end_matches('/').to_owned(),
        })
    }
}

/// One HTTP/1.1 connection, ready for the next request.
async fn open(target: &Target) -> Result<SendRequest<String>, String> {
    let tcp = tokio::net::TcpStream::connect(&target.authority)
        .await
        .map_err(|e| format!("cannot connect to {}: {e}", target.url))?;
    let _ = tcp.set_nodelay(true);
    let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .map_err(|e| format!("HTTP/1.1 handshake with {} failed: {e}", target.url))?;
    // Drives the connection; it ends when the sender is dropped or the
    // server closes, which the next request then reports.
    tokio::spawn(connection);
    Ok(sender)
}

/// Reads a whole response body.
async fn read_body(mut body: Incoming) -> Result<Vec<u8>, hyper::Error> {
    let mut bytes = Vec::new();
    while let Some(frame) = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await {
        if let Ok(data) = frame?.into_data() {
            bytes.extend_from_slice(&data);
        }
    }
    Ok(bytes)
}

/// Why a cycle did not count.
#[derive(Debug)]
enum Failure {
    /// The connection failed (reset, closed by the server).
    Transport(String),
    /// A new connection could not be opened after one failed.
    Unreachable(String),
    /// An answer that is not the one a fresh key gets.
    Answer {
        route: &'static str,
        status: StatusCode,
        body: String,
    },
}

impl Failure {
    /// The kind failures are counted by.
    fn kind(&self) -> String {
        match self {
            Failure::Transport(_) => "connection failed".to_owned(),
            Failure::Unreachable(_) => "cannot reconnect".to_owned(),
            Failure::Answer { route, status, .. } if *status != StatusCode::OK => {
                format!("{route} answered {status}")
            }
            Failure::Answer { route, .. } => format!("{route} answered 200 but not as expected"),
        }
    }

    /// What the first failure of its kind showed.
    fn example(&self) -> String {
        match self {
            Failure::Transport(e) | Failure::Unreachable(e) => e.clone(),
            Failure::Answer { body, .. } => {
                let body: String = body.chars().take(300).collect();
                format!("body: {body}")
            }
        }
    }
}

/// POSTs `json` to `route` and returns the status and body.
async fn post(
    sender: &mut SendRequest<String>,
    target: &Target,
    route: &'static str,
    json: String,
) -> Result<(StatusCode, Vec<u8>), Failure> {
    let transport = |e: hyper::Error| Failure::Transport(format!("{route}: {}", cause_chain(&e)));
    sender.ready().await.map_err(transport)?;
    let request = Request::builder()
        .method(Method::POST)
        .uri(format!("{}{route}", target.base))
        .header(header::HOST, &target.authority)
        .header(header::CONTENT_TYPE, "application/json")
        .body(json)
        .expect("a valid request");
    let response = sender.send_request(request).await.map_err(transport)?;
    let status = response.status();
    let body = read_body(response.into_body()).await.map_err(transport)?;
    Ok((status, body))
}

#[derive(serde::Deserialize)]
struct Acquired {
    decision: String,
}

#[derive(serde::Deserialize)]
struct Completed {
    ok: bool,
}

/// One cycle on `key`: the time /acquire took, or why the cycle failed.
async fn cycle(
    sender: &mut SendRequest<String>,
    target: &Target,
    key: &str,
) -> Result<Duration, Failure> {
    let t0 = Instant::now();
    let (status, body) = post(
        sender,
        target,
        "/acquire",
        format!(
            r#"{{"scope":"{SCOPE}","idempotency_key":"{key}","ttl_seconds":900,"max_attempts":10}}"#
        ),
    )
    .await?;
    let proceed = status == StatusCode::OK
        && serde_json::from_slice::<Acquired>(&body).is_ok_and(|a| a.decision == "PROCEED");
    if !proceed {
        return Err(Failure::Answer {
            route: "/acquire",
            status,
            body: String::from_utf8_lossy(&body).into_owned(),
        });
    }
    let acquired = t0.elapsed();
    let (status, body) = post(
        sender,
        target,
        "/complete",
        format!(r#"{{"scope":"{SCOPE}","idempotency_key":"{key}","final_status":"DONE"}}"#),
    )
    .await?;
    let done =
        status == StatusCode::OK && serde_json::from_slice::<Completed>(&body).is_ok_and(|c| c.ok);
    if !done {
        return Err(Failure::Answer {
            route: "/complete",
            status,
            body: String::from_utf8_lossy(&body).into_owned(),
        });
    }
    Ok(acquired)
}

/// Failed cycles by kind: how many, and what the first showed.
type Failures = BTreeMap<String, (u64, String)>;

fn count(failures: &mut Failures, failure: &Failure) {
    failures
        .entry(failure.kind())
        .or_insert_with(|| (0, failure.example()))
        .0 += 1;
}

/// Runs `http-cycle` and prints its lines; returns whether every cycle
/// succeeded. Exits at once when the door cannot be reached at all.
pub(crate) async fn http_cycle(args: &Args, target: &Target, run: &str) -> bool {
    let connections = args.connections.max(1);
    let mut senders = Vec::with_capacity(connections);
    for _ in 0..connections {
        match open(target).await {
            Ok(sender) => senders.push(sender),
            Err(e) => {
                eprintln!("http-cycle: {e} (is the coordinator serving --http-listen there?)");
                std::process::exit(1);
            }
        }
    }
    let start = Instant::now();
    let end = start + Duration::from_secs(args.seconds);
    let tasks: Vec<_> = senders
        .into_iter()
        .enumerate()
        .map(|(i, sender)| {
            let target = target.clone();
            let run = run.to_owned();
            tokio::spawn(async move {
                let (mut cycle_h, mut acquire_h, mut complete_h) =
                    (histogram(), histogram(), histogram());
                let (mut done, mut n) = (0u64, 0u64);
                let mut failures = Failures::new();
                // `None` after the connection failed, until a new one opens.
                let mut sender = Some(sender);
                while Instant::now() < end {
                    if sender.as_ref().is_some_and(SendRequest::is_closed) {
                        sender = None; // the server closed it between cycles
                    }
                    let key = format!("{run}-{i}-{n}");
                    n += 1;
                    let t0 = Instant::now();
                    let result = match &mut sender {
                        Some(open) => cycle(open, &target, &key).await,
                        None => match open(&target).await {
                            Ok(fresh) => cycle(sender.insert(fresh), &target, &key).await,
                            Err(e) => {
                                // Nothing listens: pause before trying again.
                                tokio::time::sleep(Duration::from_millis(100)).await;
                                Err(Failure::Unreachable(e))
                            }
                        },
                    };
                    match result {
                        Ok(acquired) => {
                            let took = t0.elapsed();
                            acquire_h.saturating_record(acquired.as_micros() as u64);
                            complete_h.saturating_record((took - acquired).as_micros() as u64);
                            cycle_h.saturating_record(took.as_micros() as u64);
                            done += 1;
                        }
                        Err(failure) => {
                            if let Failure::Transport(_) = failure {
                                sender = None;
                            }
                            count(&mut failures, &failure);
                        }
                    }
                }
                (done, cycle_h, acquire_h, complete_h, failures)
            })
        })
        .collect();
    let mut stats = CycleStats::empty();
    let mut failures = Failures::new();
    for task in tasks {
        let (done, cycle_h, acquire_h, complete_h, theirs) = task.await.expect("connection task");
        stats.cycles += done;
        stats.cycle.add(cycle_h).expect("same bounds");
        stats.acquire.add(acquire_h).expect("same bounds");
        stats.complete.add(complete_h).expect("same bounds");
        for (kind, (n, example)) in theirs {
            failures.entry(kind).or_insert((0, example)).0 += n;
        }
    }
    stats.elapsed = start.elapsed();
    let failed: u64 = failures.values().map(|(n, _)| n).sum();
    for (kind, (n, example)) in &failures {
        println!("http-cycle: {n} failed: {kind}; first: {example}");
    }
    let per_s = stats.cycles as f64 / stats.elapsed.as_secs_f64();
    report_line(
        "http-cycle",
        connections,
        args.seconds,
        per_s,
        &stats.cycle,
        &format!(
            " acquire_p99_ms={:.2} complete_p99_ms={:.2} failed={failed}",
            ms(&stats.acquire, 0.99),
            ms(&stats.complete, 0.99)
        ),
    );
    failed == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_target_is_a_plain_http_url_with_an_optional_base_path() {
        let t = Target::parse("http://127.0.0.1:8080").unwrap();
        assert_eq!(
            (t.authority.as_str(), t.base.as_str()),
            ("127.0.0.1:8080", "")
        );
        let t = Target::parse("http://coordinator/idem/").unwrap();
        assert_eq!(
            (t.authority.as_str(), t.base.as_str()),
            ("coordinator:80", "/idem")
        );
        assert!(Target::parse("https://127.0.0.1:8080").is_err());
        assert!(Target::parse("127.0.0.1:8080").is_err());
    }

    /// A stand-in for the door: answers each request with the next of
    /// `answers` (status, body), over HTTP/1.1 keep-alive.
    async fn stand_in(answers: Vec<(u16, &'static str)>) -> Target {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut buffer = Vec::new();
            let mut chunk = [0u8; 4096];
            for (status, body) in answers {
                // One request: headers, then content-length bytes.
                loop {
                    let n = socket.read(&mut chunk).await.unwrap();
                    assert!(n > 0, "the client closed early");
                    buffer.extend_from_slice(&chunk[..n]);
                    let text = String::from_utf8_lossy(&buffer).to_string();
                    if let Some(end) = text.find("\r\n\r\n") {
                        let length: usize = text[..end]
                            .lines()
                            .find_map(|l| l.strip_prefix("content-length: "))
                            .map_or(0, |v| v.trim().parse().unwrap());
                        if buffer.len() >= end + 4 + length {
                            buffer.drain(..end + 4 + length);
                            break;
                        }
                    }
                }
                let reply = format!(
                    "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                    body.len()
                );
                socket.write_all(reply.as_bytes()).await.unwrap();
            }
        });
        Target::parse(&url).unwrap()
    }

    #[tokio::test]
    async fn a_cycle_counts_when_both_answers_are_the_fresh_keys() {
        let target = stand_in(vec![
            (
                200,
                r#"{"decision":"PROCEED","attempt_count":1,"lock_expires_at":"x"}"#,
            ),
            (200, r#"{"ok":true,"status":"DONE"}"#),
        ])
        .await;
        let mut sender = open(&target).await.unwrap();
        cycle(&mut sender, &target, "k1").await.unwrap();
    }

    #[tokio::test]
    async fn a_cycle_fails_on_another_decision_or_status() {
        let target = stand_in(vec![
            (200, r#"{"decision":"SKIP_ALREADY_DONE","attempt_count":1}"#),
            (404, r#"{"detail":"Not Found"}"#),
            (200, r#"{"decision":"PROCEED","attempt_count":1}"#),
            (200, r#"{"ok":false}"#),
        ])
        .await;
        let mut sender = open(&target).await.unwrap();
        let mut failures = Failures::new();
        for key in ["a", "b", "c"] {
            count(
                &mut failures,
                &cycle(&mut sender, &target, key).await.unwrap_err(),
            );
        }
        let kinds: Vec<&str> = failures.keys().map(String::as_str).collect();
        assert_eq!(
            kinds,
            [
                "/acquire answered 200 but not as expected",
                "/acquire answered 404 Not Found",
                "/complete answered 200 but not as expected",
            ]
        );
        assert!(
            failures["/acquire answered 404 Not Found"]
                .1
                .contains("Not Found")
        );
    }

    #[tokio::test]
    async fn a_door_that_is_not_there_is_named_in_the_error() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        drop(listener);
        let e = open(&Target::parse(&url).unwrap()).await.unwrap_err();
        assert!(e.contains(&url) && e.contains("refused"), "{e}");
    }
}

//! Prometheus metrics, scraped from a server process of its own: a known
//! sequence of calls shows in exact counts. Each server has a registry of
//! its own, so in-process servers count apart too.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use idempotency_coordinator::proto::coordinator_client::CoordinatorClient;
use idempotency_coordinator::proto::{self, Decision};
use tonic::Code;
use tonic::transport::Channel;

use crate::helpers::*;

const TOKEN: &str = "metrics-token-0123456789";

/// A label set, sorted by name.
type Labels = BTreeMap<String, String>;

/// One scrape in the Prometheus text format: every sample line.
pub(crate) struct Scrape {
    text: String,
    samples: Vec<(String, Labels, f64)>,
}

impl Scrape {
    /// Reads `name{label="value",...} value` lines; `#` lines are comments.
    pub(crate) fn parse(text: String) -> Self {
        let samples = text
            .lines()
            .filter(|line| !line.is_empty() && !line.starts_with('#'))
            .map(|line| parse_sample(line).unwrap_or_else(|| panic!("bad sample line {line:?}")))
            .collect();
        Scrape { text, samples }
    }

    /// The value of the series `name` with exactly `labels`.
    pub(crate) fn value(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let wanted: Labels = labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        self.samples
            .iter()
            .find(|(n, l, _)| n == name && *l == wanted)
            .map(|(_, _, v)| *v)
    }

    /// Like `value`, but the series must exist.
    fn get(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.value(name, labels)
            .unwrap_or_else(|| panic!("no series {name}{labels:?} in\n{}", self.text))
    }

    /// Every series of `name`, with its labels.
    fn series(&self, name: &str) -> Vec<(Labels, f64)> {
        self.samples
            .iter()
            .filter(|(n, _, _)| n == name)
            .map(|(_, l, v)| (l.clone(), *v))
            .collect()
    }
}

fn parse_sample(line: &str) -> Option<(String, Labels, f64)> {
    let name_end = line.find(['{', ' '])?;
    let name = line[..name_end].to_owned();
    let mut labels = Labels::new();
    let mut rest = &line[name_end..];
    if let Some(mut inner) = rest.strip_prefix('{') {
        loop {
            if let Some(after) = inner.strip_prefix('}') {
                rest = after;
                break;
            }
            // name="value", the value with \\, \" and \n escaped
            let eq = inner.find('=')?;
            let label = inner[..eq].to_owned();
            let quoted = inner[eq + 1..].strip_prefix('"')?;
            let mut value = String::new();
            let mut chars = quoted.char_indices();
            let end = loop {
                match chars.next()? {
                    (i, '"') => break i,
                    (_, '\\') => match chars.next()?.1 {
                        'n' => value.push('\n'),
                        c => value.push(c),
                    },
                    (_, c) => value.push(c),
                }
            };
            labels.insert(label, value);
            inner = &quoted[end + 1..];
            inner = inner.strip_prefix(',').unwrap_or(inner);
        }
    }
    let value = rest.split_whitespace().next()?.parse().ok()?;
    Some((name, labels, value))
}

/// Where `server` serves metrics, from its log.
pub(crate) fn metrics_addr(server: &ServerProcess) -> SocketAddr {
    server
        .logs()
        .iter()
        .find_map(|line| {
            let entry: serde_json::Value = serde_json::from_str(line).ok()?;
            if entry["fields"]["message"] != "serving metrics at /metrics" {
                return None;
            }
            entry["fields"]["addr"].as_str()?.parse().ok()
        })
        .expect("the server logs where it serves metrics")
}

async fn get(addr: SocketAddr, path: &str, accept: Option<&str>) -> reqwest::Response {
    // reqwest is built with rustls and no provider of its own.
    idempotency_coordinator::tls::install_crypto_provider();
    let mut request = reqwest::Client::new().get(format!("http://{addr}{path}"));
    if let Some(accept) = accept {
        request = request.header("accept", accept);
    }
    request.send().await.expect("the metrics listener answers")
}

/// One scrape in the Prometheus text format (what curl gets).
pub(crate) async fn scrape(addr: SocketAddr) -> Scrape {
    let response = get(addr, "/metrics", None).await;
    assert_eq!(response.status(), 200);
    let content_type = response.headers()["content-type"].to_str().unwrap();
    assert!(
        content_type.starts_with("text/plain; version=0.0.4"),
        "{content_type}"
    );
    Scrape::parse(response.text().await.unwrap())
}

/// Lints a scrape with `promtool check metrics` when PROMTOOL names it
/// (`.ci/run` does).
fn lint(scrape: &Scrape) {
    let Ok(promtool) = std::env::var("PROMTOOL") else {
        return;
    };
    use std::io::Write as _;
    let mut child = std::process::Command::new(&promtool)
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {promtool}: {e}"));
    child
        .stdin
        .take()
        .unwrap()
        .write_all(scrape.text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool check metrics: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Waits until the server is ready: its listener connected (which has read
/// the database's clock) and the calls' connections answering.
pub(crate) async fn until_ready(addr: SocketAddr) {
    eventually(
        "the server to be ready",
        Duration::from_secs(30),
        || async {
            let s = scrape(addr).await;
            let listening = s.value("idempotency_listener_connected", &[]) == Some(1.0);
            (listening && s.value("idempotency_ready", &[]) == Some(1.0)).then_some(())
        },
    )
    .await;
}

const COORDINATOR: &str = "idempotency.v1.Coordinator";

/// The calls whose counts the scrape is held to: three leases, two
/// successes, two replays (one from the database, one from the replay
/// cache), an invalid Acquire, an unauthenticated one, and a Complete with
/// a token that is no lease's.
async fn make_the_known_calls(server: &ServerProcess) {
    let channel = Channel::from_shared(format!("http://{}", server.addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let bearer = Bearer(format!("Bearer {TOKEN}").parse().unwrap());
    let mut client = CoordinatorClient::with_interceptor(channel, bearer);

    let mut leases = Vec::new();
    for key in ["a", "b", "c"] {
        let resp = client
            .acquire(acquire("s", key))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(decision(&resp), Decision::Proceed);
        leases.push(token(&resp));
    }
    for (key, lease) in ["a", "b"].into_iter().zip(&leases) {
        client
            .complete(complete("s", key, lease, success(b"done")))
            .await
            .expect("complete");
    }
    // The first from the database, the second from the replay cache.
    for _ in 0..2 {
        let resp = client
            .acquire(acquire("s", "a"))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(decision(&resp), Decision::AlreadyDone);
    }
    let err = client.acquire(acquire("", "a")).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    let err = server
        .client()
        .await
        .acquire(acquire("s", "a"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated);
    let stranger = uuid::Uuid::new_v4().to_string();
    let err = client
        .complete(complete("s", "c", &stranger, success(b"x")))
        .await
        .unwrap_err();
    assert_eq!(reason(&err), "LEASE_LOST");
}

/// Calls by method and code, and their durations' counts.
fn assert_rpc_counts(s: &Scrape) {
    let mut rpcs: Vec<(String, String, f64)> = s
        .series("idempotency_rpcs_total")
        .into_iter()
        .map(|(labels, v)| {
            assert_eq!(labels["service"], COORDINATOR, "{labels:?}");
            (labels["method"].clone(), labels["code"].clone(), v)
        })
        .collect();
    rpcs.sort_by(|a, b| (&a.0, &a.1).cmp(&(&b.0, &b.1)));
    let expected = [
        ("Acquire", "INVALID_ARGUMENT", 1.0),
        ("Acquire", "OK", 5.0),
        ("Acquire", "UNAUTHENTICATED", 1.0),
        ("Complete", "ABORTED", 1.0),
        ("Complete", "OK", 2.0),
    ]
    .map(|(m, c, v)| (m.to_owned(), c.to_owned(), v));
    assert_eq!(rpcs, expected);

    for (method, calls) in [("Acquire", 7.0), ("Complete", 3.0)] {
        let labels = [("service", COORDINATOR), ("method", method)];
        assert_eq!(
            s.get("idempotency_rpc_duration_seconds_count", &labels),
            calls
        );
        let inf = [("service", COORDINATOR), ("method", method), ("le", "+Inf")];
        assert_eq!(
            s.get("idempotency_rpc_duration_seconds_bucket", &inf),
            calls
        );
    }
}

/// Acquire decisions (no scope label unless asked for), takeovers and
/// Complete refusals.
fn assert_decisions_and_refusals(s: &Scrape) {
    for (decision, n) in [
        ("PROCEED", 3.0),
        ("ALREADY_DONE", 2.0),
        ("IN_PROGRESS", 0.0),
        ("RETRY_LATER", 0.0),
        ("CONFLICT", 0.0),
        ("EXHAUSTED", 0.0),
    ] {
        let labels = [("decision", decision)];
        assert_eq!(
            s.get("idempotency_acquire_decisions_total", &labels),
            n,
            "{decision}"
        );
    }
    assert!(
        s.series("idempotency_acquire_decisions_by_scope_total")
            .is_empty(),
        "scopes are no label unless asked for"
    );
    assert_eq!(s.get("idempotency_lease_takeovers_total", &[]), 0.0);
    for (reason, n) in [
        ("LEASE_LOST", 1.0),
        ("LEASE_EXPIRED", 0.0),
        ("ALREADY_COMPLETED", 0.0),
        ("RECORD_NOT_FOUND", 0.0),
    ] {
        assert_eq!(
            s.get("idempotency_refusals_total", &[("reason", reason)]),
            n
        );
    }
}

/// The replay cache, the batches, the database's connections and errors.
fn assert_cache_batches_and_database(s: &Scrape) {
    assert_eq!(
        s.get(
            "idempotency_replay_cache_lookups_total",
            &[("result", "miss")]
        ),
        4.0
    );
    assert_eq!(
        s.get(
            "idempotency_replay_cache_lookups_total",
            &[("result", "hit")]
        ),
        1.0
    );
    assert!(s.get("idempotency_replay_cache_bytes", &[]) > 0.0);
    // Calls one after another: every statement carries one call.
    for (kind, statements) in [("acquire", 4.0), ("complete", 3.0)] {
        let labels = [("kind", kind)];
        assert_eq!(s.get("idempotency_batch_size_count", &labels), statements);
        assert_eq!(s.get("idempotency_batch_size_sum", &labels), statements);
        assert_eq!(s.get("idempotency_group_commits_total", &labels), 0.0);
    }
    let errors = s.series("idempotency_database_errors_total");
    assert_eq!(errors.len(), 6, "every kind, at zero: {errors:?}");
    assert!(errors.iter().all(|(_, v)| *v == 0.0), "{errors:?}");
    assert_eq!(s.get("idempotency_db_pool_max_size", &[]), 5.0);
    assert_eq!(s.get("idempotency_db_shared_connections", &[]), 2.0);
    assert_eq!(
        s.get("idempotency_db_shared_connections_connected", &[]),
        2.0
    );
    assert_eq!(s.get("idempotency_batch_queued_calls", &[]), 0.0);
}

/// Waiters, sweeps, the listener and the build; no credential or tenant in
/// any label.
fn assert_the_rest_of_the_process(s: &Scrape) {
    assert_eq!(s.get("idempotency_waiters", &[]), 0.0);
    for outcome in ["swept", "skipped", "failed"] {
        assert_eq!(
            s.get("idempotency_sweeps_total", &[("outcome", outcome)]),
            0.0
        );
    }
    assert_eq!(s.get("idempotency_listener_connections_total", &[]), 1.0);
    let version = env!("CARGO_PKG_VERSION");
    assert_eq!(
        s.get("idempotency_build_info", &[("version", version)]),
        1.0
    );
    assert!(
        !s.text.contains(TOKEN) && !s.text.contains("tenant-a"),
        "no credential or tenant in a label"
    );
}

/// Prometheus asks for OpenMetrics, and gets it; other paths are not
/// metrics.
async fn assert_openmetrics_on_request(metrics: SocketAddr) {
    let open = get(
        metrics,
        "/metrics",
        Some("application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"),
    )
    .await;
    assert!(
        open.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("application/openmetrics-text")
    );
    let text = open.text().await.unwrap();
    assert!(text.ends_with("# EOF\n"));
    assert!(text.contains(
        "idempotency_rpcs_total{service=\"idempotency.v1.Coordinator\",method=\"Complete\",code=\"OK\"} 2\n"
    ));
    assert_eq!(get(metrics, "/", None).await.status(), 404);
}

#[tokio::test]
async fn a_known_sequence_of_calls_shows_in_exact_counts() {
    let db = TestDatabase::create().await;
    let credentials = TokenFile::new(&format!("{TOKEN} tenant-a\n"));
    let server = ServerProcess::start_with(
        &db.url,
        &[
            "--auth-tokens",
            credentials.path.to_str().unwrap(),
            "--metrics-listen",
            "127.0.0.1:0",
            "--sweep-interval",
            "0",
            "--pool-size",
            "5",
        ],
    )
    .await;
    let metrics = metrics_addr(&server);
    // The replay cache answers once the listener has read the database's
    // clock.
    until_ready(metrics).await;

    make_the_known_calls(&server).await;

    let s = scrape(metrics).await;
    assert_rpc_counts(&s);
    assert_decisions_and_refusals(&s);
    assert_cache_batches_and_database(&s);
    assert_the_rest_of_the_process(&s);
    lint(&s);
    assert_openmetrics_on_request(metrics).await;
}

#[tokio::test]
async fn waiters_streams_and_takeovers_show_while_they_last() {
    let db = TestDatabase::create().await;
    let server = ServerProcess::start_with(
        &db.url,
        &[
            "--metrics-listen",
            "127.0.0.1:0",
            "--sweep-interval",
            "0",
            "--metrics-scope-labels",
        ],
    )
    .await;
    let metrics = metrics_addr(&server);
    until_ready(metrics).await;
    let mut client = server.client().await;

    // A holder whose 3 s lease runs out, a Watch on its record and a waiter
    // that takes the key over when the lease has run out.
    let mut held = acquire("payments", "t");
    held.lease_ttl = secs(3);
    proceed(&mut client, held).await;
    let mut watch = client
        .watch(proto::WatchRequest {
            scope: "payments".into(),
            key: "t".into(),
            timeout: secs(60),
        })
        .await
        .unwrap()
        .into_inner();
    watch.message().await.unwrap().expect("the record as it is");
    let waiter = tokio::spawn({
        let mut client = client.clone();
        async move { client.acquire(waiting("payments", "t", 30)).await }
    });
    eventually("a Watch and a waiter", Duration::from_secs(10), || async {
        let s = scrape(metrics).await;
        let open = s.get("idempotency_streams_open", &[("method", "Watch")]);
        let waiters = s.get("idempotency_waiters", &[]);
        let records = s.get("idempotency_watched_records", &[]);
        (open == 1.0 && waiters == 2.0 && records == 1.0).then_some(())
    })
    .await;

    let taken = waiter
        .await
        .unwrap()
        .expect("the waiter's answer")
        .into_inner();
    assert_eq!(decision(&taken), Decision::Proceed);
    assert_eq!(taken.lease.as_ref().unwrap().attempt, 2);
    let s = scrape(metrics).await;
    assert_eq!(s.get("idempotency_lease_takeovers_total", &[]), 1.0);
    let by_scope = [("decision", "PROCEED"), ("scope", "payments")];
    assert_eq!(
        s.get("idempotency_acquire_decisions_by_scope_total", &by_scope),
        2.0
    );
    assert_eq!(
        s.get(
            "idempotency_acquire_decisions_total",
            &[("decision", "IN_PROGRESS")]
        ),
        0.0,
        "a waiter counts its final answer only"
    );

    // The caller goes away: the stream closes, counted CANCELLED.
    drop(watch);
    eventually("the Watch to close", Duration::from_secs(10), || async {
        let s = scrape(metrics).await;
        let open = s.get("idempotency_streams_open", &[("method", "Watch")]);
        let cancelled = [
            ("service", COORDINATOR),
            ("method", "Watch"),
            ("code", "CANCELLED"),
        ];
        let waiters = s.get("idempotency_waiters", &[]);
        (open == 0.0
            && waiters == 0.0
            && s.value("idempotency_rpcs_total", &cancelled) == Some(1.0))
        .then_some(())
    })
    .await;
}

#[test]
fn the_parser_reads_escaped_label_values() {
    let s = Scrape::parse(
        "# HELP x y\nplain 3\nwith{a=\"1\",b=\"q\\\"uo\\\\te,}\\n\"} 2.5\nempty{} 1\n".to_owned(),
    );
    assert_eq!(s.value("plain", &[]), Some(3.0));
    assert_eq!(
        s.value("with", &[("a", "1"), ("b", "q\"uo\\te,}\n")]),
        Some(2.5)
    );
    assert_eq!(s.value("with", &[("a", "1")]), None, "labels match exactly");
    assert_eq!(s.value("empty", &[]), Some(1.0));
}

/// Peers that open connections to the metrics port and send half a request
/// head, opening a new one as each closes, do not keep a scraper out: every
/// scrape meanwhile answers within two seconds.
#[tokio::test]
async fn half_open_request_heads_do_not_keep_scrapes_out() {
    let db = TestDatabase::create().await;
    let server = ServerProcess::start_with(&db.url, &["--metrics-listen", "127.0.0.1:0"]).await;
    let metrics = metrics_addr(&server);
    until_ready(metrics).await;
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut holders = tokio::task::JoinSet::new();
    for _ in 0..200 {
        let stop = Arc::clone(&stop);
        holders.spawn(async move {
            use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let Ok(mut tcp) = tokio::net::TcpStream::connect(metrics).await else {
                    continue;
                };
                let _ = tcp.write_all(b"GET /metrics HTTP/1.1\r\nHo").await;
                // Held until the server closes it (or the test ends).
                let mut sink = [0u8; 64];
                let _ = tokio::time::timeout(Duration::from_secs(5), tcp.read(&mut sink)).await;
            }
        });
    }
    // Let the half-open heads take every place first.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut took = Vec::new();
    for _ in 0..4 {
        let started = std::time::Instant::now();
        let scraped = tokio::time::timeout(Duration::from_secs(2), scrape(metrics)).await;
        took.push(started.elapsed());
        assert!(
            scraped.is_ok(),
            "a scrape did not finish within 2 s while half-open heads were held: {took:?}"
        );
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    holders.abort_all();
}

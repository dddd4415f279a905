//! A database pause longer than the sidecar's `--call-timeout` and its
//! `--lease-ttl`, with requests in flight and more arriving: every answer
//! the upstream gave is stored, no key runs the upstream twice, and every
//! 2xx a client received is the one later replayed.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use http::StatusCode;

use crate::binary;
use crate::database::TestDatabase;
use crate::faults_proxy::{Mode, Proxy};
use crate::polling::eventually;
use crate::process::{Launch, ServerProcess};
use crate::support::{Reply, TestClient, start_sidecar};
use crate::upstream::TestUpstream;

/// The local PostgreSQL's socket, which the pausing proxy fronts.
const SOCKET: &str = "/var/run/postgresql/.s.PGSQL.5432";
const IN_FLIGHT: usize = 30;
const DURING: usize = 10;
const PAUSE: Duration = Duration::from_secs(12);

fn key(i: usize) -> String {
    format!("\"outage-{i}-{}\"", uuid::Uuid::new_v4().simple())
}

#[tokio::test]
async fn a_12s_database_pause_runs_no_key_twice_and_replays_every_2xx_clients_got() {
    let db = TestDatabase::create().await;
    let pause = Proxy::start(SOCKET.into()).await;
    let url = format!("postgres://postgres@127.0.0.1:{}/{}", pause.port, db.name);
    let launch = Launch {
        binary: Some(binary::path()),
        ..Launch::default()
    };
    let server = ServerProcess::launch(&url, &["--health-interval", "200ms"], launch).await;
    let upstream = TestUpstream::start().await;
    let flags = ["--lease-ttl", "6s", "--call-timeout", "10s"];
    let coordinator = format!("http://{}", server.addr);
    let sidecar = start_sidecar(&upstream.url(), &coordinator, &flags).await;
    let client = TestClient::new(sidecar.addr);
    let send = |key: String| {
        let client = client.clone();
        tokio::spawn(async move {
            let reply = client.post("/pay?hold_ms=300", &key, "{}").await;
            (key, reply)
        })
    };
    // Requests whose upstream call is under way when the database stops.
    let mut first: Vec<_> = (0..IN_FLIGHT).map(|i| send(key(i))).collect();
    eventually(
        "the upstream to see every request",
        Duration::from_secs(30),
        || async { (upstream.count("/pay") == IN_FLIGHT).then_some(()) },
    )
    .await;
    pause.set(Mode::Blackhole);
    let paused = Instant::now();
    // More load while it is paused.
    first.extend((IN_FLIGHT..IN_FLIGHT + DURING).map(|i| send(key(i))));
    tokio::time::sleep(PAUSE).await;
    pause.set(Mode::Pass);
    let mut replies: Vec<(String, Reply)> = Vec::new();
    for task in first {
        replies.push(task.await.unwrap());
    }
    let held = paused.elapsed();
    // Every key asked again once the database is back.
    let mut broken = Vec::new();
    for (key, reply) in &replies {
        let again = client.post("/pay?hold_ms=300", key, "{}").await;
        if reply.status.is_success() && !(again.replayed() && again.body == reply.body) {
            broken.push(format!("{key}: got {} then {again:?}", reply.text()));
        }
    }
    let mut runs: HashMap<String, usize> = HashMap::new();
    for seen in upstream.seen() {
        *runs.entry(seen.key.unwrap_or_default()).or_default() += 1;
    }
    let twice: Vec<_> = runs.iter().filter(|(_, n)| **n > 1).collect();
    let ok = replies
        .iter()
        .filter(|(_, r)| r.status == StatusCode::CREATED)
        .count();
    assert!(
        twice.is_empty(),
        "{} of {} keys ran the upstream twice: {twice:?}",
        twice.len(),
        replies.len()
    );
    assert!(
        broken.is_empty(),
        "{} of {ok} 2xx answers were not the one replayed: {broken:?}",
        broken.len()
    );
    assert!(
        replies[..IN_FLIGHT]
            .iter()
            .all(|(_, r)| r.status == StatusCode::CREATED),
        "every in-flight request's answer was held until stored: {:?}",
        replies.iter().map(|(_, r)| r.status).collect::<Vec<_>>()
    );
    eprintln!(
        "{ok} of {} first answers 201 after a {PAUSE:?} pause (all in {held:?}); 0 keys ran twice",
        replies.len()
    );
}

//! With no database URL the server runs on a private PostgreSQL in its data
//! dir: as root here (as in containers and CI), surviving restarts and
//! SIGKILL, leaving no database process behind on SIGTERM, and refusing a
//! second server on the same data dir.

use std::path::{Path, PathBuf};
use std::time::Duration;

use idempotency_coordinator::proto::{self, coordinator_client::CoordinatorClient};
use tonic::transport::Channel;

use crate::helpers::*;

/// A fresh data dir, removed when dropped.
struct DataDir(PathBuf);

impl DataDir {
    fn new() -> Self {
        DataDir(std::env::temp_dir().join(format!("idem-embedded-{}", uuid::Uuid::new_v4())))
    }
}

impl Drop for DataDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

async fn start(dir: &Path) -> ServerProcess {
    ServerProcess::launch(
        "",
        &["--sweep-interval", "0s"],
        Launch {
            data_dir: Some(dir),
            ..Launch::default()
        },
    )
    .await
}

/// Processes whose command line names `dir` (the private PostgreSQL's).
fn processes_of(dir: &Path) -> Vec<String> {
    let dir = dir.to_string_lossy().into_owned();
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().parse::<u32>().is_ok())
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
        .filter(|c| c.contains(&dir) && c.contains("postgres"))
        .collect()
}

async fn answer(client: &mut CoordinatorClient<Channel>, key: &str) -> proto::AcquireResponse {
    client
        .acquire(acquire("s", key))
        .await
        .unwrap()
        .into_inner()
}

#[tokio::test]
async fn the_private_database_keeps_records_across_restarts_and_stops_with_the_server() {
    let dir = DataDir::new();
    let server = start(&dir.0).await;
    assert!(
        server
            .logs()
            .iter()
            .any(|l| l.contains("local development only")),
        "the server says what this mode is for"
    );
    let mut c = server.client().await;
    let granted = proceed(&mut c, acquire("s", "kept")).await;
    c.complete(complete("s", "kept", &token(&granted), success(b"done")))
        .await
        .unwrap();
    assert_eq!(
        decision(&answer(&mut c, "kept").await),
        proto::Decision::AlreadyDone
    );
    assert!(!processes_of(&dir.0).is_empty(), "its PostgreSQL runs");
    assert!(server.terminate().await.success());
    assert_eq!(
        processes_of(&dir.0),
        Vec::<String>::new(),
        "none left behind"
    );

    let again = start(&dir.0).await;
    let mut c = again.client().await;
    let replay = answer(&mut c, "kept").await;
    assert_eq!(decision(&replay), proto::Decision::AlreadyDone);
    assert_eq!(replay.record.unwrap().result.unwrap().result, b"done");
    assert!(again.terminate().await.success());
}

#[tokio::test]
async fn a_server_killed_with_sigkill_leaves_a_data_dir_the_next_start_recovers() {
    let dir = DataDir::new();
    let server = start(&dir.0).await;
    let mut c = server.client().await;
    let granted = proceed(&mut c, acquire("s", "survives")).await;
    c.complete(complete("s", "survives", &token(&granted), success(b"ok")))
        .await
        .unwrap();
    server.kill().await;

    let next = start(&dir.0).await;
    let mut c = next.client().await;
    assert_eq!(
        decision(&answer(&mut c, "survives").await),
        proto::Decision::AlreadyDone
    );
    assert!(next.terminate().await.success());
    eventually(
        "no PostgreSQL of the data dir left",
        Duration::from_secs(10),
        || async { processes_of(&dir.0).is_empty().then_some(()) },
    )
    .await;
}

#[tokio::test]
async fn a_second_server_on_the_same_data_dir_fails_fast_naming_it() {
    let dir = DataDir::new();
    let server = start(&dir.0).await;
    let second = tokio::time::timeout(
        Duration::from_secs(10),
        tokio::process::Command::new(env!("CARGO_BIN_EXE_idempotency-coordinator"))
            .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
            .arg(&dir.0)
            .env_remove("DATABASE_URL")
            .output(),
    )
    .await
    .expect("the second server exits at once")
    .unwrap();
    assert!(!second.status.success());
    let said = String::from_utf8_lossy(&second.stderr);
    assert!(said.contains("in use"), "{said}");
    assert!(said.contains(&*dir.0.to_string_lossy()), "{said}");
    // The first one is unharmed.
    let mut c = server.client().await;
    proceed(&mut c, acquire("s", "still")).await;
    assert!(server.terminate().await.success());
}

/// Ctrl-C in a terminal interrupts the whole foreground job: the server
/// drains (a waiting Acquire gets its normal answer) while its private
/// PostgreSQL, in a process group of its own, keeps serving; the server
/// then stops the database and exits.
#[tokio::test]
async fn ctrl_c_to_the_process_group_drains_before_the_database_stops() {
    let dir = DataDir::new();
    let server = ServerProcess::launch(
        "",
        &["--sweep-interval", "0s"],
        Launch {
            data_dir: Some(&dir.0),
            process_group: true,
            ..Launch::default()
        },
    )
    .await;
    let mut c = server.client().await;
    proceed(&mut c, acquire("s", "held")).await;
    let mut waiting = acquire("s", "held");
    waiting.wait = secs(3);
    let mut waiter_client = c.clone();
    let waiter = tokio::spawn(async move { waiter_client.acquire(waiting).await });
    // The waiter's first decision has marked the record watched.
    let url = idempotency_coordinator::embedded::database_url(&dir.0);
    let (db, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .expect("connect to the private database");
    tokio::spawn(connection);
    eventually("the waiter to wait", Duration::from_secs(10), || async {
        let row = db
            .query_one(
                "SELECT coalesce(watch_until > clock_timestamp(), false) FROM idempotency_keys WHERE idempotency_key = 'held'",
                &[],
            )
            .await
            .ok()?;
        row.get::<_, bool>(0).then_some(())
    })
    .await;
    drop(db);

    server.signal_group("INT");
    let answer = waiter.await.unwrap();
    let answer = answer.expect("the waiter's normal answer, not an error");
    assert_eq!(decision(&answer.into_inner()), proto::Decision::InProgress);
    assert!(server.exited().await.success());
    assert_eq!(
        processes_of(&dir.0),
        Vec::<String>::new(),
        "the server stopped its database"
    );
}

/// The server and its database both killed with SIGKILL (a container
/// stopped hard, say), then started again at once: the next start waits
/// for what the killed database left behind and comes up.
#[tokio::test]
async fn a_restart_right_after_both_were_killed_comes_up() {
    let dir = DataDir::new();
    let server = start(&dir.0).await;
    let mut c = server.client().await;
    let granted = proceed(&mut c, acquire("s", "kept")).await;
    c.complete(complete("s", "kept", &token(&granted), success(b"ok")))
        .await
        .unwrap();
    let postmaster: i32 = std::fs::read_to_string(dir.0.join("postgres/postmaster.pid"))
        .unwrap()
        .lines()
        .next()
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // SAFETY: kill has no memory effects.
    unsafe {
        libc::kill(postmaster, libc::SIGKILL);
    }
    server.kill().await;

    let next = start(&dir.0).await;
    let mut c = next.client().await;
    assert_eq!(
        decision(&answer(&mut c, "kept").await),
        proto::Decision::AlreadyDone
    );
    assert!(next.terminate().await.success());
}

/// A port in use is found before anything is started: `serve` on a fresh
/// data dir exits within a second, naming the flag that moves the port,
/// and starts no PostgreSQL (nor creates its files). For each port.
#[tokio::test]
async fn a_port_in_use_is_said_at_once_naming_its_flag_and_nothing_starts() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let busy = taken.local_addr().unwrap().to_string();
    for (flag, args) in [
        ("--listen", vec!["--listen", busy.as_str()]),
        (
            "--http-listen",
            vec!["--listen", "127.0.0.1:0", "--http-listen", busy.as_str()],
        ),
        (
            "--metrics-listen",
            vec!["--listen", "127.0.0.1:0", "--metrics-listen", busy.as_str()],
        ),
    ] {
        let dir = DataDir::new();
        let started = std::time::Instant::now();
        let out = tokio::time::timeout(
            Duration::from_secs(5),
            tokio::process::Command::new(env!("CARGO_BIN_EXE_idempotency-coordinator"))
                .arg("serve")
                .args(&args)
                .arg("--data-dir")
                .arg(&dir.0)
                .env_remove("DATABASE_URL")
                .output(),
        )
        .await
        .expect("serve exits")
        .unwrap();
        let took = started.elapsed();
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{flag}: {said}");
        assert!(
            took < Duration::from_secs(1),
            "{flag}: exited after {took:?}"
        );
        assert!(
            said.contains(&format!("{busy} is in use; pass {flag} ADDR")),
            "{flag}: {said}"
        );
        assert!(
            !dir.0.join("postgres").exists(),
            "{flag}: the private PostgreSQL's files were created"
        );
        assert_eq!(processes_of(&dir.0), Vec::<String>::new(), "{flag}");
    }
    drop(taken);
}

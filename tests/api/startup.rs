//! Start-up against a database that is not there yet or is misconfigured:
//! each connection failure said once, naming where the server tried and
//! what to check (never the password); a URL that cannot work exits at
//! once; `serve` serves its port while it waits, and becomes ready when the
//! database comes.
//!
//! Authentication failures (28P01) cannot be had from the local PostgreSQL,
//! which trusts 127.0.0.1: their sentence is tested on the SQLSTATE in
//! `store::connect_error`'s unit tests. A password in these tests' URLs is
//! ignored by that trust, so it is there only to show it never appears.

use std::net::SocketAddr;
use std::process::Output;
use std::time::Duration;

use tokio_postgres::config::Host;
use tonic::Code;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};
use tonic_types::StatusExt;

use crate::helpers::*;

const PASSWORD: &str = "s3cret-never-logged";

/// Host, port and user of the test PostgreSQL (DATABASE_URL).
fn postgres() -> (String, u16, String) {
    let config: tokio_postgres::Config = database_url().parse().expect("DATABASE_URL parses");
    let host = match config.get_hosts().first() {
        Some(Host::Tcp(host)) => host.clone(),
        other => panic!("these tests need DATABASE_URL over TCP, not {other:?}"),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    let user = config.get_user().unwrap_or("postgres").to_owned();
    (host, port, user)
}

/// A URL with a password for `user` and `database` on the test PostgreSQL.
fn url_to(user: &str, database: &str) -> String {
    let (host, port, _) = postgres();
    format!("postgres://{user}:{PASSWORD}@{host}:{port}/{database}")
}

/// A port on 127.0.0.1 that nothing listens on, held for the test: the
/// socket is bound but not listening, so a connection there is refused,
/// and no other test's listener (nor an outgoing connection's local port)
/// can take it while the test runs. A port that was merely free a moment
/// ago could be taken by a parallel test and answer for it.
struct ReservedPort(tokio::net::TcpSocket);

impl ReservedPort {
    fn new() -> ReservedPort {
        let socket = tokio::net::TcpSocket::new_v4().expect("a socket");
        socket
            .bind(SocketAddr::from(([127, 0, 0, 1], 0)))
            .expect("bind a port on 127.0.0.1");
        ReservedPort(socket)
    }

    fn port(&self) -> u16 {
        self.0.local_addr().expect("the bound address").port()
    }
}

/// Runs the binary with `args` to its end, within `limit`.
async fn run_binary(args: &[&str], limit: Duration) -> Output {
    let run = tokio::process::Command::new(env!("CARGO_BIN_EXE_idempotency-coordinator"))
        .args(["--log-format", "json"])
        .args(args)
        .env_remove("RUST_LOG")
        .env_remove("DATABASE_URL")
        .kill_on_drop(true)
        .output();
    tokio::time::timeout(limit, run)
        .await
        .unwrap_or_else(|_| panic!("{args:?} did not exit within {limit:?}"))
        .expect("run the server binary")
}

/// The `error` of the line a failed run exits with, checking that it
/// failed and never logged the password.
fn exit_error(out: &Output) -> String {
    assert!(!out.status.success(), "expected a failure: {out:?}");
    let logs = String::from_utf8_lossy(&out.stderr);
    assert!(!logs.contains(PASSWORD), "the password was logged: {logs}");
    logs.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|entry| entry["fields"]["message"] == "exiting")
        .and_then(|entry| entry["fields"]["error"].as_str().map(str::to_owned))
        .unwrap_or_else(|| panic!("no exit line in: {logs}"))
}

/// `migrate` (one attempt) against `url`: the sentence it exits with.
async fn migrate_fails(url: &str) -> String {
    exit_error(&run_binary(&["migrate", "--database-url", url], Duration::from_secs(20)).await)
}

/// Asserts that `said` holds `part` exactly once: the chain does not
/// repeat itself.
fn once(said: &str, part: &str) {
    assert_eq!(said.matches(part).count(), 1, "{part:?} once in: {said}");
}

#[tokio::test]
async fn a_refused_connection_names_host_port_database_and_user_and_says_nothing_listens() {
    let reserved = ReservedPort::new();
    let port = reserved.port();
    let said = migrate_fails(&format!(
        "postgres://postgres:{PASSWORD}@127.0.0.1:{port}/orders"
    ))
    .await;
    assert!(
        said.starts_with(&format!(
            "cannot connect to PostgreSQL at 127.0.0.1:{port} (database \"orders\", user \"postgres\"): \
             the connection was refused, so nothing listens there."
        )),
        "{said}"
    );
    assert!(said.contains("Check that PostgreSQL is running"), "{said}");
    once(&said, "refused");
    assert!(!said.contains("creating a new object"), "{said}");
}

#[tokio::test]
async fn an_unknown_database_is_named_with_what_to_do() {
    let missing = format!("idem_missing_{}", uuid::Uuid::new_v4().simple());
    let (_, _, user) = postgres();
    let said = migrate_fails(&url_to(&user, &missing)).await;
    assert!(
        said.contains(&format!("the database \"{missing}\" does not exist")),
        "{said}"
    );
    assert!(said.contains("CREATE DATABASE"), "{said}");
    once(&said, "does not exist");
}

#[tokio::test]
async fn an_unknown_role_is_named_with_what_to_do() {
    let nobody = format!("idem_nobody_{}", uuid::Uuid::new_v4().simple());
    let said = migrate_fails(&url_to(&nobody, "postgres")).await;
    assert!(
        said.contains(&format!("the role \"{nobody}\" does not exist")),
        "{said}"
    );
    assert!(said.contains("CREATE ROLE"), "{said}");
    once(&said, "does not exist");
}

/// A role created for one test and dropped when the test ends.
struct TestRole(String);

impl Drop for TestRole {
    fn drop(&mut self) {
        cleanup(format!("DROP ROLE IF EXISTS {}", self.0));
    }
}

#[tokio::test]
async fn no_connection_slot_left_says_which_limit_to_raise() {
    // A role allowed no connection at all: PostgreSQL answers 53300, as it
    // does when max_connections is reached.
    let role = TestRole(format!("idem_limited_{}", uuid::Uuid::new_v4().simple()));
    let (admin, connection) = tokio_postgres::connect(&database_url(), tokio_postgres::NoTls)
        .await
        .expect("connect to PostgreSQL");
    tokio::spawn(connection);
    admin
        .batch_execute(&format!("CREATE ROLE {} LOGIN CONNECTION LIMIT 0", role.0))
        .await
        .expect("create the role");
    let said = migrate_fails(&url_to(&role.0, "postgres")).await;
    assert!(said.contains("no connection slot left"), "{said}");
    assert!(said.contains("too many connections for role"), "{said}");
    assert!(said.contains("max_connections"), "{said}");
}

#[tokio::test]
async fn a_malformed_url_exits_at_once_saying_which_part_without_binding() {
    let started = std::time::Instant::now();
    let out = run_binary(
        &[
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--database-url",
            &format!("postgres://postgres:{PASSWORD}@127.0.0.1:54x2/orders"),
        ],
        Duration::from_secs(10),
    )
    .await;
    let said = exit_error(&out);
    assert!(
        said.starts_with("the database URL is malformed: the port is not a number"),
        "{said}"
    );
    assert!(
        said.contains("postgres://USER:PASSWORD@HOST:PORT/DATABASE"),
        "{said}"
    );
    let logs = String::from_utf8_lossy(&out.stderr);
    assert!(!logs.contains("\"listening\""), "bound anyway: {logs}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "took {:?}",
        started.elapsed()
    );

    // An @ of the password left unencoded ends up in the host: said, and
    // the part of the password after it is not repeated.
    let said = exit_error(
        &run_binary(
            &[
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--database-url",
                "postgres://postgres:pa@ss-word@127.0.0.1/orders",
            ],
            Duration::from_secs(10),
        )
        .await,
    );
    assert!(said.contains("write an @ in the password as %40"), "{said}");
    assert!(!said.contains("ss-word"), "{said}");
}

#[tokio::test]
async fn serve_gives_up_after_database_wait_and_says_what_it_last_saw() {
    let reserved = ReservedPort::new();
    let port = reserved.port();
    let out = run_binary(
        &[
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--database-wait",
            "1s",
            "--database-url",
            &format!("postgres://postgres:{PASSWORD}@127.0.0.1:{port}/orders"),
        ],
        Duration::from_secs(20),
    )
    .await;
    let said = exit_error(&out);
    assert!(said.starts_with("gave up on the database after"), "{said}");
    assert!(said.contains("(--database-wait)"), "{said}");
    assert!(
        said.contains(&format!("127.0.0.1:{port}")) && said.contains("refused"),
        "{said}"
    );
    let logs = String::from_utf8_lossy(&out.stderr);
    assert!(
        logs.contains("\"listening\""),
        "served while waiting: {logs}"
    );
}

/// `service`'s health on the server at `addr`.
async fn health_at(addr: SocketAddr, service: &str) -> ServingStatus {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .expect("connect to the health service");
    let mut client = HealthClient::new(channel);
    let status = client
        .check(HealthCheckRequest {
            service: service.into(),
        })
        .await
        .expect("health check")
        .into_inner()
        .status;
    ServingStatus::try_from(status).unwrap()
}

/// The server's logged lines whose message is `message`.
fn logged(server: &ServerProcess, message: &str) -> Vec<serde_json::Value> {
    server
        .logs()
        .iter()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|entry| entry["fields"]["message"] == message)
        .collect()
}

/// Forwards every connection to 127.0.0.1:`port` to `target`: the database
/// "arriving" on the port the server was told.
fn forward(port: ReservedPort, target: (String, u16)) -> tokio::task::JoinHandle<()> {
    let listener = port.0.listen(16).expect("listen on the reserved port");
    tokio::spawn(async move {
        while let Ok((mut inbound, _)) = listener.accept().await {
            let target = target.clone();
            tokio::spawn(async move {
                if let Ok(mut outbound) = tokio::net::TcpStream::connect(target).await {
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                }
            });
        }
    })
}

#[tokio::test]
async fn serve_is_live_and_not_ready_while_the_database_is_away_and_ready_once_it_comes() {
    let db = TestDatabase::create().await;
    let reserved = ReservedPort::new();
    let port = reserved.port();
    let (_, _, user) = postgres();
    let url = format!("postgres://{user}:{PASSWORD}@127.0.0.1:{port}/{}", db.name);
    let server = ServerProcess::launch(
        &url,
        &[],
        Launch {
            before_database: true,
            ..Launch::default()
        },
    )
    .await;

    assert_eq!(health_at(server.addr, "").await, ServingStatus::Serving);
    assert_eq!(
        health_at(server.addr, READINESS).await,
        ServingStatus::NotServing
    );
    let mut client = server.client().await;
    let refused = client.acquire(acquire("s", "k")).await.unwrap_err();
    assert_eq!(refused.code(), Code::Unavailable, "{refused:?}");
    assert_eq!(reason(&refused), "DATABASE_UNAVAILABLE");
    assert!(refused.get_error_details().retry_info().is_some());
    assert!(!refused.message().contains("127.0.0.1"), "{refused:?}");

    // Each attempt says where it tried: host and port, database, user.
    let attempt = eventually("a logged attempt", Duration::from_secs(10), || async {
        logged(&server, "waiting for the database").pop()
    })
    .await;
    let fields = &attempt["fields"];
    assert_eq!(fields["host"], format!("127.0.0.1:{port}"));
    assert_eq!(fields["database"], db.name.as_str());
    assert_eq!(fields["user"], user.as_str());
    let error = fields["error"].as_str().unwrap();
    assert!(error.contains("the connection was refused"), "{error}");

    let (host, pg_port, _) = postgres();
    let forwarding = forward(reserved, (host, pg_port));
    eventually("readiness SERVING", Duration::from_secs(30), || async {
        (health_at(server.addr, READINESS).await == ServingStatus::Serving).then_some(())
    })
    .await;
    let answer = client
        .acquire(acquire("s", "k"))
        .await
        .expect("Acquire once ready")
        .into_inner();
    assert_eq!(
        decision(&answer),
        idempotency_coordinator::proto::Decision::Proceed
    );
    assert_eq!(logged(&server, "database ready").len(), 1);
    assert!(
        server.logs().iter().all(|l| !l.contains(PASSWORD)),
        "the password was logged"
    );
    assert!(server.terminate().await.success());
    forwarding.abort();
}

#[tokio::test]
async fn serve_keeps_waiting_through_an_unknown_database_until_it_is_created() {
    // A database being provisioned: named in the URL before it exists.
    let name = format!("idem_test_{}", uuid::Uuid::new_v4().simple());
    let (_, _, user) = postgres();
    let server = ServerProcess::launch(
        &url_to(&user, &name),
        &[],
        Launch {
            before_database: true,
            ..Launch::default()
        },
    )
    .await;
    let attempt = eventually("a logged attempt", Duration::from_secs(10), || async {
        logged(&server, "waiting for the database").pop()
    })
    .await;
    let error = attempt["fields"]["error"].as_str().unwrap().to_owned();
    assert!(
        error.contains(&format!("the database \"{name}\" does not exist")),
        "{error}"
    );
    assert_eq!(
        health_at(server.addr, READINESS).await,
        ServingStatus::NotServing
    );

    let (admin, connection) = tokio_postgres::connect(&database_url(), tokio_postgres::NoTls)
        .await
        .expect("connect to PostgreSQL");
    tokio::spawn(connection);
    admin
        .batch_execute(&format!("CREATE DATABASE {name}"))
        .await
        .expect("create the database");
    // Dropped (with its connections) when the test ends.
    let _db = TestDatabase {
        url: String::new(),
        name,
    };
    eventually("readiness SERVING", Duration::from_secs(30), || async {
        (health_at(server.addr, READINESS).await == ServingStatus::Serving).then_some(())
    })
    .await;
    let mut client = server.client().await;
    client
        .acquire(acquire("s", "k"))
        .await
        .expect("Acquire once ready");
    assert!(server.terminate().await.success());
}

#[tokio::test]
async fn a_database_lost_after_start_is_logged_in_the_same_sentences() {
    let db = TestDatabase::create().await;
    let (host, pg_port, _) = postgres();
    let target = tokio::net::lookup_host((host.as_str(), pg_port))
        .await
        .expect("resolve the test PostgreSQL")
        .next()
        .unwrap();
    let proxy = DatabaseProxy::start(target).await;
    let url = proxy.url_for(&db);
    let debug = [("RUST_LOG", "info,idempotency_coordinator=debug")];
    let launch = || Launch {
        env: &debug,
        ..Launch::default()
    };
    // Calls on the shared connections, and on pooled ones.
    let shared = ServerProcess::launch(&url, &[], launch()).await;
    let pooled = ServerProcess::launch(&url, &["--shared-connections", "0"], launch()).await;
    for (key, server) in [("shared", &shared), ("pooled", &pooled)] {
        proceed(&mut server.client().await, acquire("s", key)).await;
    }

    proxy.cut();
    // (A batched call's failure says first that its batch failed.)
    let expected = format!(
        "cannot connect to PostgreSQL at 127.0.0.1:{} (database \"{}\", user \"postgres\"): ",
        proxy.port, db.name
    );
    for server in [&shared, &pooled] {
        let client = server.client().await;
        let said = eventually(
            "a call's connection failure logged",
            Duration::from_secs(10),
            || {
                let mut client = client.clone();
                let expected = expected.clone();
                async move {
                    let refused = client.acquire(acquire("s", "during")).await.unwrap_err();
                    assert_eq!(refused.code(), Code::Unavailable, "{refused:?}");
                    logged(server, "database unavailable")
                        .iter()
                        .filter_map(|entry| entry["fields"]["error"].as_str().map(str::to_owned))
                        .find(|error| error.contains(&expected))
                }
            },
        )
        .await;
        once(&said, "cannot connect");
        assert!(!said.contains("creating a new object"), "{said}");
        let listener = eventually(
            "the listener's failure logged",
            Duration::from_secs(10),
            || {
                let expected = expected.clone();
                async move {
                    logged(server, "database listener still down")
                        .iter()
                        .filter_map(|entry| entry["fields"]["reason"].as_str().map(str::to_owned))
                        .find(|reason| reason.starts_with(&expected))
                }
            },
        )
        .await;
        once(&listener, "cannot connect");
    }
}

/// A restart on a migrated database logs no PostgreSQL NOTICE (the
/// migrations table "already exists, skipping").
#[tokio::test]
async fn a_restart_logs_no_notice_of_the_migrations_table() {
    let db = TestDatabase::create().await;
    let first = ServerProcess::start(&db.url).await;
    assert!(first.terminate().await.success());
    let again = ServerProcess::start(&db.url).await;
    let logs = again.logs();
    assert!(
        !logs.iter().any(|l| l.contains("already exists")),
        "{logs:#?}"
    );
    assert!(again.terminate().await.success());
}

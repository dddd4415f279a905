//! The server on a PostgreSQL that takes TLS connections alone (`ssl = on`,
//! and `hostssl` the only lines of its pg_hba.conf), started here in a
//! temp dir with a certificate for `localhost` made here, by the programs
//! and as the user the private database runs as (`embedded::program`).

use std::path::{Path, PathBuf};
use std::time::Duration;

use idempotency_coordinator::embedded;
use idempotency_coordinator::store::Postgres;

use crate::helpers::*;
use crate::metrics::{metrics_addr, until_ready};

/// A PostgreSQL of the test's own that refuses connections without TLS.
struct TlsPostgres {
    dir: PathBuf,
    port: u16,
    /// The CA that signed the server's certificate (for `localhost`).
    ca: PathBuf,
    /// A CA that signed nothing the server has.
    other_ca: PathBuf,
    postmaster: tokio::process::Child,
}

impl TlsPostgres {
    async fn start() -> Self {
        let dir = std::env::temp_dir().join(format!("idem-pgtls-{}", uuid::Uuid::new_v4()));
        let pgdata = dir.join("pgdata");
        std::fs::create_dir_all(&pgdata).unwrap();
        let (mut initdb, owner) = embedded::program("initdb").await.unwrap();
        let own = |path: &Path, mode: u32| {
            use std::os::unix::fs::PermissionsExt;
            if let Some((uid, gid)) = owner {
                std::os::unix::fs::chown(path, Some(uid), Some(gid)).unwrap();
            }
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
        };
        own(&dir, 0o700);
        own(&pgdata, 0o700);
        let status = initdb
            .arg("--pgdata")
            .arg(&pgdata)
            .args([
                "--username=postgres",
                "--auth=trust",
                "--locale=C",
                "--no-sync",
            ])
            .stdout(std::process::Stdio::null())
            .status()
            .await
            .unwrap();
        assert!(status.success(), "initdb: {status}");
        let server = pki(&["localhost"]);
        let write = |name: &str, text: &str| {
            let path = dir.join(name);
            std::fs::write(&path, text).unwrap();
            own(&path, 0o600);
            path
        };
        let cert = write("server.crt", &server.cert);
        let key = write("server.key", &server.key);
        let ca = write("ca.crt", &server.ca);
        let other_ca = write("other-ca.crt", &pki(&["localhost"]).ca);
        // Only TLS connections, from this machine: no `host` line, and no
        // `local` one (the socket is not used).
        let hba = write(
            "pg_hba.conf",
            "hostssl all all 127.0.0.1/32 trust\nhostssl all all ::1/128 trust\n",
        );
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let (mut postgres, _) = embedded::program("postgres").await.unwrap();
        let setting = |name: &str, value: &dyn std::fmt::Display| format!("{name}={value}");
        postgres.arg("-D").arg(&pgdata).kill_on_drop(true);
        for option in [
            setting("listen_addresses", &"127.0.0.1"),
            setting("port", &port),
            setting("unix_socket_directories", &dir.display()),
            setting("ssl", &"on"),
            setting("ssl_cert_file", &cert.display()),
            setting("ssl_key_file", &key.display()),
            setting("hba_file", &hba.display()),
            setting("fsync", &"off"),
        ] {
            postgres.arg("-c").arg(option);
        }
        let postmaster = postgres
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let db = TlsPostgres {
            dir,
            port,
            ca,
            other_ca,
            postmaster,
        };
        let url = db.url("localhost", "verify-full", &db.ca);
        eventually(
            "the TLS-only PostgreSQL to accept",
            Duration::from_secs(30),
            || {
                let url = url.clone();
                async move {
                    let (client, connection) = Postgres::new(&url).unwrap().connect().await.ok()?;
                    tokio::spawn(connection);
                    Some(client)
                }
            },
        )
        .await;
        db
    }

    /// Its `postgres` database at `host`, with `sslmode` and `rootcert`.
    fn url(&self, host: &str, sslmode: &str, rootcert: &Path) -> String {
        format!(
            "postgres://postgres@{host}:{}/postgres?sslmode={sslmode}&sslrootcert={}",
            self.port,
            rootcert.display()
        )
    }

    /// The sessions of the coordinator, each with whether it uses TLS.
    async fn coordinator_sessions(&self) -> Vec<bool> {
        let url = self.url("localhost", "verify-full", &self.ca);
        let (client, connection) = Postgres::new(&url).unwrap().connect().await.unwrap();
        tokio::spawn(connection);
        client
            .query(
                "SELECT s.ssl FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) \
                 WHERE a.application_name = 'idempotency-coordinator'",
                &[],
            )
            .await
            .unwrap()
            .iter()
            .map(|row| row.get(0))
            .collect()
    }
}

impl Drop for TlsPostgres {
    fn drop(&mut self) {
        if let Some(pid) = self.postmaster.id().and_then(|p| i32::try_from(p).ok()) {
            // SAFETY: kill has no memory effects. SIGQUIT: immediate
            // shutdown, which ends its sessions too.
            unsafe {
                libc::kill(pid, libc::SIGQUIT);
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A key through Acquire, Complete and Get.
async fn round_trip(server: &ServerProcess, key: &str) {
    let mut client = server.client().await;
    let lease = proceed(&mut client, acquire("tls", key)).await;
    complete_ok(
        &mut client,
        complete("tls", key, &token(&lease), success(b"paid")),
    )
    .await;
    let record = get_record(&mut client, get_req("tls", key)).await;
    assert_eq!(
        status_of(&record),
        idempotency_coordinator::proto::Status::Succeeded
    );
}

/// With `sslmode=verify-full` and the CA's file, the server migrates, gets
/// ready (its listener connected, its shared connections answering) and
/// serves; with `verify-ca` at an address the certificate does not name,
/// and calls on pooled connections, too. Every session it holds is TLS.
#[tokio::test]
async fn serves_on_a_postgres_that_takes_only_tls() {
    let db = TlsPostgres::start().await;
    let full = db.url("localhost", "verify-full", &db.ca);
    let server = ServerProcess::start_with(&full, &["--metrics-listen", "127.0.0.1:0"]).await;
    until_ready(metrics_addr(&server)).await;
    round_trip(&server, "shared").await;
    let sessions = db.coordinator_sessions().await;
    assert!(sessions.len() >= 2, "{sessions:?}");
    assert!(sessions.iter().all(|tls| *tls), "{sessions:?}");
    server.terminate().await;

    let by_address = db.url("127.0.0.1", "verify-ca", &db.ca);
    let server = ServerProcess::start_with(&by_address, &["--shared-connections", "0"]).await;
    round_trip(&server, "pooled").await;
    let sessions = db.coordinator_sessions().await;
    assert!(
        !sessions.is_empty() && sessions.iter().all(|tls| *tls),
        "{sessions:?}"
    );
    server.terminate().await;
}

/// What the server logs when its one attempt to reach the database on
/// `url` fails.
async fn refusal(url: &str) -> String {
    let launch = Launch {
        before_database: true,
        ..Launch::default()
    };
    let server = ServerProcess::launch(url, &["--database-wait", "1ms"], launch).await;
    let said = eventually(
        "the server to say why it cannot connect",
        Duration::from_secs(30),
        || {
            let logs = server.logs().join("\n");
            async move { logs.contains("cannot connect to").then_some(logs) }
        },
    )
    .await;
    server.kill().await;
    said
}

/// A server certificate from another CA, one that does not name the host
/// with `verify-full`, and a connection without TLS are each refused, and
/// the message says what to check.
#[tokio::test]
async fn a_wrong_ca_a_wrong_name_and_no_tls_are_refused_saying_why() {
    let db = TlsPostgres::start().await;
    let wrong_ca = refusal(&db.url("localhost", "verify-full", &db.other_ca)).await;
    assert!(wrong_ca.contains("the TLS handshake failed"), "{wrong_ca}");
    assert!(wrong_ca.contains("invalid peer certificate"), "{wrong_ca}");
    assert!(wrong_ca.contains("sslrootcert names the CA"), "{wrong_ca}");

    let wrong_name = refusal(&db.url("127.0.0.1", "verify-full", &db.ca)).await;
    assert!(
        wrong_name.contains("the TLS handshake failed"),
        "{wrong_name}"
    );
    assert!(wrong_name.contains("not valid for name"), "{wrong_name}");

    let clear = refusal(&db.url("localhost", "disable", &db.ca)).await;
    assert!(clear.contains("refuses this client without TLS"), "{clear}");
}

//! Databases: a fresh one per test, a proxy that can cut it, and what its table holds.

use std::net::{SocketAddr, ToSocketAddrs as _};

mod postgres;

pub use postgres::database_url;

/// The TCP address of the tests' PostgreSQL, for a proxy in front of it.
pub fn database_addr() -> SocketAddr {
    let config: tokio_postgres::Config = database_url().parse().expect("the database URL parses");
    let host = match config.get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(host)) => host.clone(),
        other => panic!("these tests need a database URL over TCP, not {other:?}"),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    (host.as_str(), port)
        .to_socket_addrs()
        .ok()
        .and_then(|mut addrs| addrs.next())
        .expect("the database host resolves")
}

/// `url` pointing at database `name` instead (URL or key=value form).
fn with_database(url: &str, name: &str) -> String {
    if let Some(rest) = url
        .strip_prefix("postgres://")
        .or_else(|| url.strip_prefix("postgresql://"))
    {
        let (authority_and_path, query) = rest.split_once('?').unwrap_or((rest, ""));
        let authority = authority_and_path.split('/').next().unwrap_or_default();
        let query = if query.is_empty() {
            String::new()
        } else {
            format!("?{query}")
        };
        format!("postgres://{authority}/{name}{query}")
    } else {
        format!("{url} dbname={name}")
    }
}

async fn admin_connect(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap_or_else(|e| panic!("cannot connect to PostgreSQL at {url}: {e}. Is it running?"));
    tokio::spawn(connection);
    client
}

/// A database created for one test and dropped when the test ends.
pub struct TestDatabase {
    pub name: String,
    pub url: String,
}

impl TestDatabase {
    pub async fn create() -> Self {
        let admin_url = database_url();
        let name = format!("idem_test_{}", uuid::Uuid::new_v4().simple());
        let admin = admin_connect(&admin_url).await;
        admin
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .await
            .expect("create test database");
        TestDatabase {
            url: with_database(&admin_url, &name),
            name,
        }
    }

    pub async fn connect(&self) -> tokio_postgres::Client {
        admin_connect(&self.url).await
    }

    pub async fn count_records(&self) -> i64 {
        self.connect()
            .await
            .query_one("SELECT count(*) FROM idempotency_keys", &[])
            .await
            .expect("count records")
            .get(0)
    }
}

impl Drop for TestDatabase {
    fn drop(&mut self) {
        cleanup(format!(
            "DROP DATABASE IF EXISTS {} WITH (FORCE)",
            self.name
        ));
    }
}

/// Runs `sql` on the admin database, for cleaning up in `Drop`: Drop runs
/// outside any async context we could borrow, so on a thread with a runtime
/// of its own; failures are ignored.
pub fn cleanup(sql: String) {
    let _ = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("cleanup runtime");
        rt.block_on(async move {
            if let Ok((client, connection)) =
                tokio_postgres::connect(&database_url(), tokio_postgres::NoTls).await
            {
                tokio::spawn(connection);
                let _ = client.batch_execute(&sql).await;
            }
        });
    })
    .join();
}

/// A TCP proxy in front of PostgreSQL that a test can cut and restore, to
/// play a database that goes away and comes back.
pub struct DatabaseProxy {
    pub port: u16,
    open: tokio::sync::watch::Sender<bool>,
}

impl DatabaseProxy {
    pub async fn start(target: SocketAddr) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (open, watch) = tokio::sync::watch::channel(true);
        tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                if !*watch.borrow() {
                    continue; // dropped: the connection is refused
                }
                let mut closed = watch.clone();
                tokio::spawn(async move {
                    let Ok(mut outbound) = tokio::net::TcpStream::connect(target).await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                        _ = closed.wait_for(|open| !*open) => {}
                    }
                });
            }
        });
        DatabaseProxy { port, open }
    }

    /// Drops every proxied connection and refuses new ones.
    pub fn cut(&self) {
        self.open.send_replace(false);
    }

    pub fn restore(&self) {
        self.open.send_replace(true);
    }

    /// `url` (a test database URL) rewritten to go through this proxy.
    pub fn url_for(&self, db: &TestDatabase) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{}", self.port, db.name)
    }
}

/// Records in the database right now, by status.
pub async fn statuses(db: &TestDatabase) -> Vec<(String, String)> {
    db.connect()
        .await
        .query(
            "SELECT idempotency_key, status FROM idempotency_keys ORDER BY idempotency_key",
            &[],
        )
        .await
        .expect("read statuses")
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
}

/// Index entries of `idempotency_keys` read so far, across its indexes, as
/// PostgreSQL counts them (this session's statistics flushed first): the
/// difference of two readings is what the statements between them read.
pub async fn index_entries_read(db: &tokio_postgres::Client) -> i64 {
    db.execute("SELECT pg_stat_force_next_flush()", &[])
        .await
        .unwrap();
    db.execute("SELECT pg_stat_clear_snapshot()", &[])
        .await
        .unwrap();
    db.query_one(
        "SELECT sum(idx_tup_read)::bigint FROM pg_stat_user_indexes
          WHERE relname = 'idempotency_keys'",
        &[],
    )
    .await
    .unwrap()
    .get(0)
}

/// A database of its own, migrated, with `statements` run in it (records
/// written straight into the table); keep the database while the client
/// is used.
pub async fn migrated_with(statements: &[&str]) -> (TestDatabase, tokio_postgres::Client) {
    let db = TestDatabase::create().await;
    let mut client = db.connect().await;
    idempotency_coordinator::store::migrate::migrate(&mut client)
        .await
        .expect("migrate");
    client.batch_execute(&statements.join("; ")).await.unwrap();
    (db, client)
}

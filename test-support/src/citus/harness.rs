//! A Citus cluster for the tests: a coordinator and two workers, each a
//! PostgreSQL 15 of its own in a temporary directory, on free local ports,
//! started once per test process and stopped (its directories removed)
//! when the process exits. Each test gets a fresh database on every node,
//! with the `citus` extension and the workers added.
//!
//! A test that stops nodes or adds one starts a cluster of its own
//! ([`private_cluster`]), stopped when the last handle to it is dropped,
//! so that the other tests' shared cluster never sees its faults.
//!
//! Every node loads `pg_stat_statements`, tracking the statements inside
//! functions and their planning, so that a test can tell from a worker's
//! own statistics how its statements were planned (`plan_cache`).
//!
//! Citus must be installed into the machine's PostgreSQL 15 (`bash
//! .ci/citus`). Without it the tests are skipped with a message, or fail
//! when `CI` is set. PostgreSQL refuses to run as root: then the nodes run
//! as `nobody`, as the embedded PostgreSQL does (`src/embedded.rs`).

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex, OnceLock};

const BIN: &str = "/usr/lib/postgresql/15/bin";
const CITUS_SO: &str = "/usr/lib/postgresql/15/lib/citus.so";

/// The running cluster's nodes: the coordinator first, then the workers.
pub struct Cluster {
    root: PathBuf,
    pub ports: [u16; 3],
    /// Nodes started later ([`Cluster::start_extra_node`]).
    extra: Mutex<Vec<u16>>,
    /// Whether dropping the last handle stops it (a private cluster).
    private: bool,
}

static CLUSTER: OnceLock<Option<Arc<Cluster>>> = OnceLock::new();

/// Whether Citus is installed; without it, and without `CI`, says that the
/// test is skipped.
fn installed() -> bool {
    if Path::new(CITUS_SO).exists() {
        return true;
    }
    crate::helpers::skip_without(
        &format!("Citus ({CITUS_SO})"),
        "the Citus tests",
        "bash .ci/citus",
    );
    false
}

/// The shared cluster, started on first use; `None` when Citus is not
/// installed and `CI` is not set (the caller skips its test).
pub fn cluster() -> Option<Arc<Cluster>> {
    CLUSTER
        .get_or_init(|| {
            if !installed() {
                return None;
            }
            let cluster = Cluster::start(false);
            // SAFETY: registers a plain function without arguments.
            unsafe { libc::atexit(stop_at_exit) };
            Some(Arc::new(cluster))
        })
        .clone()
}

/// A cluster of the caller's own (its nodes may be stopped, or nodes
/// added), stopped when its last handle is dropped; `None` as [`cluster`].
pub fn private_cluster() -> Option<Arc<Cluster>> {
    installed().then(|| Arc::new(Cluster::start(true)))
}

extern "C" fn stop_at_exit() {
    if let Some(Some(cluster)) = CLUSTER.get() {
        cluster.stop();
    }
}

/// The user the nodes run as: `nobody` when this process is root.
fn owner() -> Option<(u32, u32)> {
    // SAFETY: geteuid cannot fail; getpwnam reads a static name and its
    // record is read at once.
    unsafe {
        if libc::geteuid() != 0 {
            return None;
        }
        let entry = libc::getpwnam(c"nobody".as_ptr());
        assert!(!entry.is_null(), "running as root needs the user `nobody`");
        Some(((*entry).pw_uid, (*entry).pw_gid))
    }
}

fn run(name: &str, args: &[&str], dir: &Path) {
    let mut command = Command::new(Path::new(BIN).join(name));
    command
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null());
    if let Some((uid, gid)) = owner() {
        command.uid(uid).gid(gid).env("HOME", "/");
    }
    let output = command.output().unwrap_or_else(|e| panic!("{name}: {e}"));
    assert!(
        output.status.success(),
        "{name} {args:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// A port nothing listens on now.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

impl Cluster {
    fn start(private: bool) -> Cluster {
        let root = std::env::temp_dir().join(format!("idem-citus-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&root).expect("cluster dir");
        if let Some((uid, gid)) = owner() {
            std::os::unix::fs::chown(&root, Some(uid), Some(gid)).expect("chown cluster dir");
        }
        let ports = [free_port(), free_port(), free_port()];
        let cluster = Cluster {
            root,
            ports,
            extra: Mutex::new(Vec::new()),
            private,
        };
        for port in ports {
            cluster.init_node(port);
            cluster.start_node(port);
        }
        cluster
    }

    /// Starts one more node (not yet part of any database's cluster: see
    /// [`CitusDatabase::add_worker`]); returns its port.
    pub fn start_extra_node(&self) -> u16 {
        let port = free_port();
        self.extra.lock().unwrap().push(port);
        self.init_node(port);
        self.start_node(port);
        port
    }

    /// Every node's port, the extra ones included.
    pub fn all_ports(&self) -> Vec<u16> {
        let mut ports = self.ports.to_vec();
        ports.extend(self.extra.lock().unwrap().iter());
        ports
    }

    /// Stops the node on `port` (fast shutdown: its sessions are ended).
    pub fn stop_node(&self, port: u16) {
        let data = self.data_dir(port);
        let data_arg = data.to_str().expect("utf-8 path");
        run(
            "pg_ctl",
            &["--pgdata", data_arg, "--mode=fast", "--wait", "stop"],
            &self.root,
        );
    }

    fn data_dir(&self, port: u16) -> PathBuf {
        self.root.join(format!("node-{port}"))
    }

    /// The unix socket of the node on `port`: a way in that does not go
    /// through the address the cluster knows it by (a proxy's target).
    pub fn socket(&self, port: u16) -> PathBuf {
        self.data_dir(port).join(format!(".s.PGSQL.{port}"))
    }

    fn init_node(&self, port: u16) {
        let data = self.data_dir(port);
        let data_arg = data.to_str().expect("utf-8 path");
        run(
            "initdb",
            &[
                "--pgdata",
                data_arg,
                "--username=postgres",
                "--auth=trust",
                "--encoding=UTF8",
                "--locale=C",
                "--no-sync",
            ],
            &self.root,
        );
        let settings = format!(
            "\nport = {port}\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '{}'\n\
             shared_preload_libraries = 'citus,pg_stat_statements'\n\
             pg_stat_statements.track = all\npg_stat_statements.track_planning = on\n\
             max_prepared_transactions = 100\n\
             max_connections = 200\nfsync = off\nsynchronous_commit = off\n\
             full_page_writes = off\nshared_buffers = 32MB\n\
             citus.node_conninfo = 'sslmode=disable'\n",
            data_arg
        );
        let conf = data.join("postgresql.conf");
        let mut text = std::fs::read_to_string(&conf).expect("read postgresql.conf");
        text.push_str(&settings);
        std::fs::write(&conf, text).expect("write postgresql.conf");
    }

    /// Starts the node on `port` (again, after [`Cluster::stop_node`]).
    pub fn start_node(&self, port: u16) {
        let data = self.data_dir(port);
        let data_arg = data.to_str().expect("utf-8 path");
        let log = data.join("postgres.log");
        run(
            "pg_ctl",
            &[
                "--pgdata",
                data_arg,
                "--log",
                log.to_str().expect("utf-8 path"),
                "--wait",
                "--timeout=120",
                "start",
            ],
            &self.root,
        );
    }

    fn stop(&self) {
        for port in self.all_ports() {
            let data = self.data_dir(port);
            let mut command = Command::new(Path::new(BIN).join("pg_ctl"));
            command
                .arg("--pgdata")
                .arg(&data)
                .args(["--mode=immediate", "--wait", "stop"])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null());
            if let Some((uid, gid)) = owner() {
                command.uid(uid).gid(gid).env("HOME", "/");
            }
            let _ = command.status();
        }
        let _ = std::fs::remove_dir_all(&self.root);
    }

    pub fn url(&self, port: u16, database: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{port}/{database}")
    }

    pub fn coordinator(&self) -> u16 {
        self.ports[0]
    }

    pub fn workers(&self) -> [u16; 2] {
        [self.ports[1], self.ports[2]]
    }
}

pub async fn connect(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap_or_else(|e| panic!("cannot connect to {url}: {e}"));
    tokio::spawn(connection);
    client
}

/// The database `name` on the node on `port`, with the `citus` extension.
async fn create_on_node(cluster: &Cluster, port: u16, name: &str) {
    connect(&cluster.url(port, "postgres"))
        .await
        .batch_execute(&format!("CREATE DATABASE {name}"))
        .await
        .expect("create database");
    connect(&cluster.url(port, name))
        .await
        .batch_execute("SET client_min_messages = warning; CREATE EXTENSION citus")
        .await
        .expect("create extension citus");
}

/// A database of one test on every node of the cluster, Citus set up in
/// it; dropped on every node when the test ends.
pub struct CitusDatabase {
    pub cluster: Arc<Cluster>,
    pub name: String,
    /// The coordinator's database: what the server is given.
    pub url: String,
}

impl CitusDatabase {
    /// `None` when the cluster is skipped (see [`cluster`]).
    pub async fn create() -> Option<CitusDatabase> {
        Some(CitusDatabase::create_on(cluster()?).await)
    }

    /// A fresh database on `cluster` (the shared one, or a private one).
    pub async fn create_on(cluster: Arc<Cluster>) -> CitusDatabase {
        let workers = cluster.workers();
        CitusDatabase::create_through(cluster, workers).await
    }

    /// [`CitusDatabase::create_on`], each worker known to the cluster (and
    /// to the server, which reads the addresses from the metadata) by the
    /// port in `addresses` instead of its own: a proxy's, whose network a
    /// test can break.
    pub async fn create_through(cluster: Arc<Cluster>, addresses: [u16; 2]) -> CitusDatabase {
        let name = format!("idem_citus_{}", uuid::Uuid::new_v4().simple());
        for port in cluster.ports {
            create_on_node(&cluster, port, &name).await;
        }
        let db = CitusDatabase {
            url: cluster.url(cluster.coordinator(), &name),
            cluster,
            name,
        };
        let cluster = &db.cluster;
        let coordinator = db.connect().await;
        coordinator
            .execute(
                "SELECT citus_set_coordinator_host('127.0.0.1', $1)",
                &[&i32::from(cluster.coordinator())],
            )
            .await
            .expect("citus_set_coordinator_host");
        for port in addresses {
            add_node(&coordinator, port).await;
        }
        db
    }

    /// Adds the node on `port` (from [`Cluster::start_extra_node`]) to this
    /// database's cluster as a worker: the database and the extension on
    /// it, then `citus_add_node` (which copies the metadata and our objects
    /// there). It holds no shards until they are moved to it.
    pub async fn add_worker(&self, port: u16) {
        create_on_node(&self.cluster, port, &self.name).await;
        add_node(&self.connect().await, port).await;
    }

    /// A connection to the coordinator's database.
    pub async fn connect(&self) -> tokio_postgres::Client {
        connect(&self.url).await
    }

    /// A connection to a worker's database.
    pub async fn connect_worker(&self, port: u16) -> tokio_postgres::Client {
        connect(&self.cluster.url(port, &self.name)).await
    }
}

/// Adds the worker on `port` to the coordinator's metadata. Set-up, not
/// what a test holds: on a loaded machine the metadata sync to the new
/// node can fail to connect or lock in time, so it is tried a few times,
/// each failure said.
async fn add_node(coordinator: &tokio_postgres::Client, port: u16) {
    const ATTEMPTS: u32 = 5;
    for attempt in 1..=ATTEMPTS {
        match coordinator
            .execute(
                "SELECT citus_add_node('127.0.0.1', $1)",
                &[&i32::from(port)],
            )
            .await
        {
            Ok(_) => return,
            Err(e) if attempt < ATTEMPTS => {
                eprintln!("citus_add_node 127.0.0.1:{port} failed (attempt {attempt}): {e:?}");
                tokio::time::sleep(std::time::Duration::from_millis(500 * u64::from(attempt)))
                    .await;
            }
            Err(e) => panic!("citus_add_node 127.0.0.1:{port}: {e:?}"),
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if self.private {
            self.stop();
        }
    }
}

impl Drop for CitusDatabase {
    fn drop(&mut self) {
        let urls: Vec<String> = self
            .cluster
            .all_ports()
            .iter()
            .map(|port| self.cluster.url(*port, "postgres"))
            .collect();
        let sql = format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name);
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("cleanup runtime");
            rt.block_on(async move {
                for url in urls {
                    if let Ok((client, connection)) =
                        tokio_postgres::connect(&url, tokio_postgres::NoTls).await
                    {
                        tokio::spawn(connection);
                        let _ = client.batch_execute(&sql).await;
                    }
                }
            });
        })
        .join();
    }
}

//! A PostgreSQL cluster the test owns: its own data directory and unix
//! socket under a temp directory, so stopping or killing it harms nobody
//! else. Killed (with every process it started) when dropped.

use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The user PostgreSQL runs as when the tests run as root (it refuses root).
fn owner() -> Option<(u32, u32)> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return None;
    }
    // SAFETY: getpwnam reads a static name; the record is read at once.
    unsafe {
        let entry = libc::getpwnam(c"nobody".as_ptr());
        assert!(!entry.is_null(), "no user nobody to run PostgreSQL as");
        Some(((*entry).pw_uid, (*entry).pw_gid))
    }
}

/// The PostgreSQL server binaries, found as the server's private database
/// finds them (`embedded::binaries`: the machine's, else PostgreSQL 17
/// downloaded once), so that a machine with Rust alone runs these tests.
fn bin_dir() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        // A runtime of its own: the caller may be on a test's runtime.
        std::thread::spawn(|| {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime")
                .block_on(idempotency_coordinator::embedded::binaries())
        })
        .join()
        .expect("the thread ran")
        .unwrap_or_else(|e| panic!("no PostgreSQL server binaries: {e}"))
    })
    .clone()
}

fn chown_tree(path: &Path, owner: Option<(u32, u32)>) {
    if let Some((uid, gid)) = owner {
        let ok = Command::new("chown")
            .arg("-R")
            .arg(format!("{uid}:{gid}"))
            .arg(path)
            .status()
            .expect("run chown")
            .success();
        assert!(ok, "chown {}", path.display());
    }
}

fn private_dir(path: &Path, owner: Option<(u32, u32)>) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(path).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o700)).unwrap();
    chown_tree(path, owner);
}

/// A data directory made by initdb, which each cluster starts from a copy
/// of. Made once per machine and PostgreSQL version: built under a name of
/// its own, then renamed into place (a run that loses the race to another
/// uses the winner's).
fn template() -> &'static Path {
    static TEMPLATE: OnceLock<PathBuf> = OnceLock::new();
    TEMPLATE.get_or_init(|| {
        let bin = bin_dir();
        let version = bin
            .parent()
            .and_then(|v| v.file_name())
            .map(|v| v.to_string_lossy().into_owned())
            .unwrap_or_default();
        let ready = std::env::temp_dir().join(format!("idem-faults-template-pg{version}"));
        let data = ready.join("data");
        if data.join("PG_VERSION").is_file() {
            return data;
        }
        let owner = owner();
        let building = std::env::temp_dir().join(format!(
            "idem-faults-template-{}",
            uuid::Uuid::new_v4().simple()
        ));
        private_dir(&building, owner);
        let mut initdb = Command::new(bin.join("initdb"));
        initdb
            .arg("--pgdata")
            .arg(building.join("data"))
            .args([
                "--username=postgres",
                "--auth=trust",
                "--encoding=UTF8",
                "--locale=C",
                "--no-sync",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        if let Some((uid, gid)) = owner {
            initdb.uid(uid).gid(gid).env("HOME", "/");
        }
        let out = initdb.output().expect("run initdb");
        assert!(
            out.status.success(),
            "initdb: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        if std::fs::rename(&building, &ready).is_err() {
            // Another run put its template in place first.
            let _ = std::fs::remove_dir_all(&building);
        }
        assert!(
            data.join("PG_VERSION").is_file(),
            "no template at {}",
            data.display()
        );
        data
    })
}

/// A running (or stopped) PostgreSQL of one test.
pub struct Cluster {
    root: PathBuf,
    bin: PathBuf,
    owner: Option<(u32, u32)>,
    postmaster: Option<Child>,
}

impl Cluster {
    /// A fresh cluster, started.
    pub async fn start() -> Cluster {
        let owner = owner();
        let root =
            std::env::temp_dir().join(format!("idem-faults-{}", uuid::Uuid::new_v4().simple()));
        private_dir(&root, owner);
        let copied = Command::new("cp")
            .arg("-a")
            .arg(template())
            .arg(root.join("data"))
            .status()
            .expect("run cp")
            .success();
        assert!(copied, "copy the template data directory");
        private_dir(&root.join("socket"), owner);
        let mut cluster = Cluster {
            root,
            bin: bin_dir(),
            owner,
            postmaster: None,
        };
        cluster.restart().await;
        cluster
    }

    /// The directory of its unix socket.
    pub fn socket_dir(&self) -> PathBuf {
        self.root.join("socket")
    }

    /// The socket file PostgreSQL listens on.
    pub fn socket(&self) -> PathBuf {
        self.socket_dir().join(".s.PGSQL.5432")
    }

    /// A connection string for the test's own reads, over the socket.
    pub fn url(&self) -> String {
        format!(
            "host={} user=postgres dbname=postgres",
            self.socket_dir().display()
        )
    }

    /// Starts the postmaster (after a crash: with crash recovery) and
    /// returns once it accepts connections.
    pub async fn restart(&mut self) {
        assert!(self.postmaster.is_none(), "already running");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.root.join("postgres.log"))
            .unwrap();
        let mut postgres = Command::new(self.bin.join("postgres"));
        postgres
            .arg("-D")
            .arg(self.root.join("data"))
            .arg("-k")
            .arg(self.socket_dir())
            .args([
                "-c",
                "listen_addresses=",
                // Only the process is killed here, never the machine: the
                // kernel keeps what was written, so fsync buys nothing.
                "-c",
                "fsync=off",
                "-c",
                "max_connections=60",
                "-c",
                "shared_buffers=16MB",
            ])
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            // Its own process group, so a crash can take every backend.
            .process_group(0);
        if let Some((uid, gid)) = self.owner {
            postgres.uid(uid).gid(gid).env("HOME", "/");
        }
        self.postmaster = Some(postgres.spawn().expect("start postgres"));
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = self
                .postmaster
                .as_mut()
                .and_then(|p| p.try_wait().ok().flatten())
            {
                panic!("postgres exited: {status}; see {}", self.log_tail());
            }
            if let Ok((client, connection)) =
                tokio_postgres::connect(&self.url(), tokio_postgres::NoTls).await
            {
                tokio::spawn(connection);
                if client.simple_query("SELECT 1").await.is_ok() {
                    return;
                }
            }
            assert!(
                Instant::now() < deadline,
                "postgres did not accept connections within 30 s: {}",
                self.log_tail()
            );
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    fn pid(&self) -> libc::pid_t {
        self.postmaster.as_ref().expect("running").id() as libc::pid_t
    }

    /// Fast shutdown (sessions end, data is flushed), waiting until it
    /// has exited.
    pub async fn stop_fast(&mut self) {
        // SAFETY: kill has no memory effects.
        unsafe { libc::kill(self.pid(), libc::SIGINT) };
        self.reap().await;
    }

    /// SIGKILL to the postmaster and every backend at once (a crash), then
    /// waits until they are gone.
    pub async fn crash(&mut self) {
        // SAFETY: as above; the negative pid names its process group.
        unsafe { libc::kill(-self.pid(), libc::SIGKILL) };
        self.reap().await;
    }

    async fn reap(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let p = self.postmaster.as_mut().expect("running");
            if p.try_wait().expect("wait for postgres").is_some() {
                break;
            }
            assert!(Instant::now() < deadline, "postgres did not exit");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let group = self.postmaster.as_ref().map(|p| p.id() as libc::pid_t);
        let deadline = Instant::now() + Duration::from_secs(30);
        // Orphaned backends of the group may still be exiting.
        while group.is_some_and(group_alive) {
            assert!(Instant::now() < deadline, "postgres processes did not exit");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        self.postmaster = None;
    }

    fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.root.join("postgres.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    /// A connection over the socket.
    pub async fn connect(&self) -> tokio_postgres::Client {
        let (client, connection) = tokio_postgres::connect(&self.url(), tokio_postgres::NoTls)
            .await
            .expect("connect to the test's PostgreSQL");
        tokio::spawn(connection);
        client
    }
}

/// Whether a process of group `group` still runs (zombies, which nobody
/// may reap here, hold nothing and do not count).
fn group_alive(group: libc::pid_t) -> bool {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| std::fs::read_to_string(e.path().join("stat")).ok())
        .any(|stat| {
            // pid (comm) state ppid pgrp …: comm may hold spaces, so read
            // after its closing parenthesis.
            let Some((_, rest)) = stat.rsplit_once(") ") else {
                return false;
            };
            let mut fields = rest.split_whitespace();
            let state = fields.next();
            let pgrp = fields.nth(1).and_then(|p| p.parse::<libc::pid_t>().ok());
            pgrp == Some(group) && state != Some("Z") && state != Some("X")
        })
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if let Some(mut p) = self.postmaster.take() {
            // SAFETY: as above.
            unsafe { libc::kill(-(p.id() as libc::pid_t), libc::SIGKILL) };
            let _ = p.wait();
        }
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

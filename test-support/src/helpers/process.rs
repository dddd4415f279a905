//! The server binary in a process of its own: started, signalled, its logs and memory read.

use std::net::SocketAddr;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use idempotency_coordinator::proto::coordinator_client::CoordinatorClient;
use tokio::io::{AsyncBufReadExt, BufReader};
use tonic::transport::Channel;

/// The server binary in a process of its own.
pub struct ServerProcess {
    pub addr: SocketAddr,
    child: tokio::process::Child,
    /// Every line the server has logged so far.
    logs: Arc<std::sync::Mutex<Vec<String>>>,
}

/// How a server process is started, beyond its flags.
#[derive(Default)]
pub struct Launch<'a> {
    /// Environment variables set for the server (`RUST_LOG` is otherwise
    /// removed).
    pub env: &'a [(&'a str, &'a str)],
    /// The server's open file limit (soft and hard), when set.
    pub open_files: Option<u64>,
    /// Run on the private PostgreSQL in this data dir, with no database URL
    /// (the `database_url` argument is then ignored).
    pub data_dir: Option<&'a std::path::Path>,
    /// Return once the port is served, without waiting for the server to
    /// reach (and migrate) its database.
    pub before_database: bool,
    /// Start the server as the leader of a process group of its own (as a
    /// shell does with a foreground job), so that the group can be
    /// signalled as a terminal signals it.
    pub process_group: bool,
    /// The server binary to run [default: the one cargo built for the
    /// server package's own tests]. Cargo builds no binaries of another
    /// package, so a suite of another workspace member names one.
    pub binary: Option<&'a std::path::Path>,
}

impl ServerProcess {
    pub async fn start(database_url: &str) -> Self {
        Self::start_with(database_url, &[]).await
    }

    pub async fn start_with(database_url: &str, extra: &[&str]) -> Self {
        Self::launch(database_url, extra, Launch::default()).await
    }

    pub async fn launch(database_url: &str, extra: &[&str], launch: Launch<'_>) -> Self {
        let binary = match launch.binary {
            Some(binary) => binary,
            None => built_for_these_tests(),
        };
        let mut command = tokio::process::Command::new(binary);
        command
            .args(["--log-format", "json", "serve", "--listen", "127.0.0.1:0"])
            .args(extra)
            .env_remove("RUST_LOG")
            .envs(launch.env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        match launch.data_dir {
            Some(dir) => {
                command
                    .arg("--data-dir")
                    .arg(dir)
                    .env_remove("DATABASE_URL");
            }
            None => {
                command.args(["--database-url", database_url]);
            }
        }
        if launch.process_group {
            command.process_group(0);
        }
        if let Some(files) = launch.open_files {
            // SAFETY: setrlimit is async-signal-safe and touches no memory
            // of the parent.
            unsafe {
                command.pre_exec(move || {
                    rlimit::Resource::NOFILE.set(files, files)?;
                    Ok(())
                });
            }
        }
        let mut child = command.spawn().expect("start the server binary");
        let logs = Arc::new(std::sync::Mutex::new(Vec::new()));
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let addr = tokio::time::timeout(Duration::from_secs(30), async {
            let mut addr = None;
            while let Some(line) = lines.next_line().await.expect("server log") {
                logs.lock().unwrap().push(line.clone());
                let Ok(entry) = serde_json::from_str::<serde_json::Value>(&line) else {
                    continue;
                };
                if entry["fields"]["message"] == "listening" {
                    let bound = entry["fields"]["addr"].as_str().expect("addr field");
                    addr = Some(bound.parse::<SocketAddr>().expect("socket address"));
                }
                // The port is served at once; calls are answered once the
                // database is ready.
                if let Some(addr) = addr
                    && (launch.before_database || entry["fields"]["message"] == "database ready")
                {
                    return addr;
                }
            }
            panic!(
                "the server exited before it was ready: {:#?}",
                logs.lock().unwrap()
            );
        })
        .await
        .expect("the server was not ready within 30 s");
        // Keep reading so the server never blocks on a full pipe.
        let kept = Arc::clone(&logs);
        tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_line().await {
                kept.lock().unwrap().push(line);
            }
        });
        ServerProcess { addr, child, logs }
    }

    /// The `addr` field of the first line logged with `message` (where
    /// the server serves HTTP/JSON or metrics, say).
    pub fn logged_addr(&self, message: &str) -> SocketAddr {
        self.logs()
            .iter()
            .find_map(|line| {
                let entry: serde_json::Value = serde_json::from_str(line).ok()?;
                if entry["fields"]["message"] != message {
                    return None;
                }
                entry["fields"]["addr"].as_str()?.parse().ok()
            })
            .unwrap_or_else(|| panic!("the server logged no {message:?} line"))
    }

    /// The lines logged so far.
    pub fn logs(&self) -> Vec<String> {
        self.logs.lock().unwrap().clone()
    }

    pub async fn client(&self) -> CoordinatorClient<Channel> {
        CoordinatorClient::connect(format!("http://{}", self.addr))
            .await
            .expect("connect to the server process")
    }

    pub fn pid(&self) -> u32 {
        self.child.id().expect("running")
    }

    /// Sends `signal` (a name kill(1) knows, like HUP) to the process.
    pub fn signal(&self, signal: &str) {
        let pid = self.child.id().expect("running");
        let sent = std::process::Command::new("kill")
            .args([format!("-{signal}"), pid.to_string()])
            .status()
            .expect("run kill");
        assert!(sent.success(), "kill -{signal} {pid}");
    }

    /// Sends `signal` to the process's group, as a terminal sends Ctrl-C to
    /// its foreground job (the process must lead a group of its own:
    /// [`Launch::process_group`]).
    pub fn signal_group(&self, signal: &str) {
        let pid = self.child.id().expect("running");
        let sent = std::process::Command::new("kill")
            .args([format!("-{signal}"), "--".into(), format!("-{pid}")])
            .status()
            .expect("run kill");
        assert!(sent.success(), "kill -{signal} -- -{pid}");
    }

    /// Waits for the process to exit by itself; returns its status.
    pub async fn exited(mut self) -> std::process::ExitStatus {
        tokio::time::timeout(Duration::from_secs(30), self.child.wait())
            .await
            .expect("the server did not exit within 30 s")
            .expect("wait for the server")
    }

    /// Kills the process with SIGKILL (no chance to clean up) and waits
    /// for it to be gone.
    pub async fn kill(mut self) {
        self.signal("KILL");
        let _ = tokio::time::timeout(Duration::from_secs(30), self.child.wait()).await;
    }

    /// Sends SIGTERM (as Kubernetes does) and waits for the process to
    /// exit; returns its status.
    pub async fn terminate(mut self) -> std::process::ExitStatus {
        self.signal("TERM");
        tokio::time::timeout(Duration::from_secs(30), self.child.wait())
            .await
            .expect("the server did not exit within 30 s of SIGTERM")
            .expect("wait for the server")
    }
}

/// The server binary: the one cargo built for the server package's own
/// tests when it says so, else the target directory's (built if missing or
/// older than its sources: [`crate::faults::binary`]).
fn built_for_these_tests() -> &'static std::path::Path {
    static BUILT: std::sync::OnceLock<Option<std::path::PathBuf>> = std::sync::OnceLock::new();
    BUILT
        .get_or_init(|| std::env::var_os("CARGO_BIN_EXE_idempotency-coordinator").map(Into::into))
        .as_deref()
        .unwrap_or_else(crate::faults::binary::path)
}

/// Resident memory of process `pid`, in KiB (Linux).
pub fn resident_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS")
}

//! Which PostgreSQL a test binary runs on, decided once, on first use:
//!
//! - `DATABASE_URL` when set. When it cannot be reached, the binary says so
//!   once, with why, and exits at once: one message, not one failure per
//!   test with the cause buried in each.
//! - Else the PostgreSQL at [`DEFAULT_DATABASE_URL`] when it answers.
//! - Else a private PostgreSQL of the binary's own, started by the code
//!   `serve` starts its own with (`idempotency_coordinator::embedded`: the
//!   machine's programs, else PostgreSQL 17 downloaded once), on a free port
//!   of 127.0.0.1, in a data dir under the temp dir that later runs with the
//!   same programs reuse (one made by another PostgreSQL would not start).
//!
//! The private one is started from a thread that lives as long as the
//! test binary, and `embedded` ties the postmaster to the thread that
//! started it (the kernel sends it SIGINT, a fast shutdown, when that
//! thread ends): it stops when the test binary exits, however it exits
//! (passing, failing, panicking, killed), with no "after all" hook, which
//! libtest lacks. The next test binary of a `cargo test` run starts its own
//! on the same data dir, waiting for the previous one to finish stopping.

use std::hash::{DefaultHasher, Hash as _, Hasher as _};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use idempotency_coordinator::embedded::{Embedded, EmbeddedError, binaries};
use idempotency_coordinator::store::connect_error::{check_url, probe};

const DEFAULT_DATABASE_URL: &str = "postgres://postgres@127.0.0.1:5432/postgres";

/// How long the probe of `DATABASE_URL`, or of the default address, waits.
const PROBE_LIMIT: Duration = Duration::from_secs(5);
/// How many data dirs of concurrent test binaries (other checkouts, other
/// users' runs) the temp dir may hold.
const DATA_DIRS: usize = 16;

/// The URL of the PostgreSQL the tests create their databases on.
pub fn database_url() -> String {
    static URL: OnceLock<String> = OnceLock::new();
    URL.get_or_init(choose).clone()
}

fn choose() -> String {
    match std::env::var("DATABASE_URL") {
        Ok(url) if !url.is_empty() => {
            if let Err(why) = reachable(&url) {
                stop_the_run(&format!(
                    "DATABASE_URL is set, and the tests cannot use it: {why}\n\
                     Start that PostgreSQL, correct DATABASE_URL, or unset it: the tests then \
                     use the PostgreSQL at {DEFAULT_DATABASE_URL}, or start a private one \
                     when nothing answers there."
                ));
            }
            url
        }
        _ => match reachable(DEFAULT_DATABASE_URL) {
            Ok(()) => DEFAULT_DATABASE_URL.to_owned(),
            Err(why) => start_private(&why),
        },
    }
}

/// Whether PostgreSQL at `url` lets this user in, within [`PROBE_LIMIT`];
/// else the sentence saying why not.
fn reachable(url: &str) -> Result<(), String> {
    let config = check_url(url).map_err(|e| e.to_string())?;
    on_a_thread_of_its_own(
        async move { probe(&config, PROBE_LIMIT).await.map_err(|e| e.to_string()) },
    )
}

/// Runs `work` to its end on a runtime of its own: the caller may be on a
/// test's runtime, which must not be blocked from within.
fn on_a_thread_of_its_own<T: Send + 'static>(work: impl Future<Output = T> + Send + 'static) -> T {
    std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime")
            .block_on(work)
    })
    .join()
    .expect("the thread ran")
}

/// Starts the private PostgreSQL and returns its URL; stops the run when
/// it cannot start.
fn start_private(why_not_default: &str) -> String {
    say(&format!(
        "note: {why_not_default}\n\
         DATABASE_URL is unset: starting a private PostgreSQL for these tests (on a machine \
         without PostgreSQL, the first start downloads PostgreSQL 17 once)."
    ));
    let started = Instant::now();
    let (sender, receiver) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("private-postgres".into())
        .spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime");
            runtime.block_on(async move {
                let started = start_in_a_free_data_dir().await;
                let running = started
                    .as_ref()
                    .map(|db| (db.database_url(), db.binaries().to_owned()));
                let _ = sender.send(running.map_err(|e| error_chain(&e)));
                // Held, with this thread, until the test binary exits.
                let _database = started;
                std::future::pending::<()>().await;
            });
        })
        .expect("start the private PostgreSQL's thread");
    match receiver.recv() {
        Ok(Ok((url, bin))) => {
            say(&format!(
                "note: the private PostgreSQL ({bin}) is ready at {url} after {:.1?}; \
                 it stops when these tests end.",
                started.elapsed(),
                bin = bin.display(),
            ));
            url
        }
        Ok(Err(why)) => stop_the_run(&format!(
            "no PostgreSQL for the tests: DATABASE_URL is unset, nothing usable answers at \
             {DEFAULT_DATABASE_URL}, and a private PostgreSQL did not start: {why}"
        )),
        Err(_) => stop_the_run("the private PostgreSQL's thread ended before it said how it went"),
    }
}

/// The private database, in the first of [`DATA_DIRS`] data dirs under
/// the temp dir that no other test binary holds.
async fn start_in_a_free_data_dir() -> Result<Embedded, EmbeddedError> {
    let bin = binaries().await?;
    let mut last = None;
    for n in 0..DATA_DIRS {
        let dir = data_dir(&bin, n);
        match Embedded::start_on_port(&dir, free_port()).await {
            Err(EmbeddedError::InUse(dir)) => last = Some(EmbeddedError::InUse(dir)),
            other => return other,
        }
    }
    Err(last.expect("at least one data dir was tried"))
}

/// The `n`th data dir of the PostgreSQL programs in `bin`.
fn data_dir(bin: &Path, n: usize) -> PathBuf {
    let mut programs = DefaultHasher::new();
    bin.hash(&mut programs);
    std::env::temp_dir().join(format!(
        "idempotency-tests-postgres-{:08x}-{n}",
        programs.finish() as u32
    ))
}

/// A port of 127.0.0.1 nothing listens on right now.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map(|addr| addr.port())
        .expect("a free port on 127.0.0.1")
}

/// `error` and its sources, `: `-separated.
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    text
}

/// Writes `message` to the test binary's stderr, past libtest's capture
/// of test output (which `eprintln!` in a passing test goes to).
fn say(message: &str) {
    let _ = writeln!(std::io::stderr().lock(), "\n{message}\n");
}

/// Says `message` and ends the test binary, failed.
fn stop_the_run(message: &str) -> ! {
    say(&format!("error: {message}"));
    std::process::exit(1)
}

//! The server binary the fault tests run. Cargo builds the binaries of the
//! package under test only, and these tests belong to the bench crate, not
//! to the server's package: they run `IDEMPOTENCY_COORDINATOR_BIN` when it
//! is set (as the Python and TypeScript clients' suites do), else the server
//! binary of their own target directory and profile. `cargo test` at the
//! workspace root builds that one (the server's own suites need it); when it
//! is missing, or a source it was built from has changed since, the tests
//! build it first, so that they never hold an older server to its promises
//! than the one checked out.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The server binary to run.
pub fn path() -> &'static Path {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        if let Some(named) = std::env::var_os("IDEMPOTENCY_COORDINATOR_BIN") {
            return named.into();
        }
        // This test binary is <target>/<profile>/deps/<suite>-<hash>.
        let exe = std::env::current_exe().expect("the test binary's path");
        let profile_dir = exe
            .parent()
            .and_then(Path::parent)
            .expect("the test binary in <target>/<profile>/deps");
        let path = profile_dir.join("idempotency-coordinator");
        if !path.is_file() || changed_since_built(&path).is_some() {
            build(profile_dir);
        }
        assert!(
            path.is_file(),
            "no server binary at {} after building it: name one in IDEMPOTENCY_COORDINATOR_BIN",
            path.display()
        );
        path
    })
}

/// Builds the server binary into `profile_dir` (`<target>/debug` is cargo's
/// `dev` profile; other profiles are named after their directory).
fn build(profile_dir: &Path) {
    let profile = match profile_dir.file_name().and_then(|name| name.to_str()) {
        Some("debug") | None => "dev",
        Some(name) => name,
    };
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the bench crate in the workspace root");
    let built = Command::new(env!("CARGO"))
        .arg("build")
        .arg("--manifest-path")
        .arg(workspace.join("Cargo.toml"))
        .args(["--package", "idempotency-coordinator"])
        .args(["--bin", "idempotency-coordinator"])
        .args(["--profile", profile])
        .status()
        .expect("run cargo build");
    assert!(built.success(), "cargo build of the server binary failed");
}

/// A source of the binary at `path` (as cargo's dep-info beside it,
/// `<path>.d`, lists them) changed after the binary was built, if any.
fn changed_since_built(path: &Path) -> Option<PathBuf> {
    let built = std::fs::metadata(path).and_then(|m| m.modified()).ok()?;
    let dep_info = std::fs::read_to_string(path.with_extension("d")).ok()?;
    // One rule, `<binary>: <source> <source> …`, spaces in paths escaped.
    let (_, sources) = dep_info.split_once(": ")?;
    sources
        .replace("\\ ", "\0")
        .split_whitespace()
        .map(|source| PathBuf::from(source.replace('\0', " ")))
        .find(|source| {
            std::fs::metadata(source)
                .and_then(|m| m.modified())
                .is_ok_and(|changed| changed > built)
        })
}

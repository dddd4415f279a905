//! Suites that need a tool a fresh machine lacks (Citus, Chromium,
//! Prometheus) skip their tests without it, and say so once, at the top of
//! the binary's output, with the one command that installs it; under `CI`
//! they fail instead.

use std::io::Write as _;
use std::sync::Once;

/// Called when `tool` is missing: under `CI` fails the test, naming the
/// command that installs it; otherwise says once per test binary that
/// `skipped` are skipped and how to run them, and returns (the caller
/// skips its test).
pub fn skip_without(tool: &str, skipped: &str, install: &str) {
    if std::env::var_os("CI").is_some() {
        panic!("{tool} is missing: run `{install}`");
    }
    static SAID: Once = Once::new();
    SAID.call_once(|| {
        // Past libtest's capture, which would keep `eprintln!` of a
        // passing test to itself.
        let _ = writeln!(
            std::io::stderr().lock(),
            "\nSKIPPED: {skipped}, because {tool} is missing. `{install}` installs it.\n"
        );
    });
}

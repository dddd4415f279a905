//! Logging: `RUST_LOG` filters (default `info`), text or JSON lines on
//! standard error; colours only when standard error is a terminal.
//!
//! The database driver logs every statement's parameters (lease tokens,
//! results, error texts) at debug level, so it stays at `info` unless
//! `RUST_LOG` names it (`tokio_postgres=debug`): a general `debug` never
//! puts a secret in the log.

use std::io::IsTerminal as _;

use tracing_subscriber::EnvFilter;

use crate::config::LogFormat;

/// Targets that log call data at debug level: kept at `info` unless named.
const QUIET_TARGETS: &[&str] = &["tokio_postgres"];

/// The filter for `RUST_LOG`'s value (`None`: unset).
fn filter(rust_log: Option<&str>) -> EnvFilter {
    let spec = rust_log.filter(|s| !s.trim().is_empty()).unwrap_or("info");
    let mut filter = EnvFilter::try_new(spec).unwrap_or_else(|e| {
        eprintln!("RUST_LOG={spec:?} is not a valid filter ({e}); logging at info");
        EnvFilter::new("info")
    });
    for target in QUIET_TARGETS {
        if !spec.contains(target) {
            filter =
                filter.add_directive(format!("{target}=info").parse().expect("a valid directive"));
        }
    }
    filter
}

pub fn init(format: LogFormat) {
    let rust_log = std::env::var("RUST_LOG").ok();
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter(rust_log.as_deref()))
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_driver_stays_at_info_unless_named() {
        assert!(
            filter(Some("debug"))
                .to_string()
                .contains("tokio_postgres=info")
        );
        assert!(filter(None).to_string().contains("tokio_postgres=info"));
        let named = filter(Some("info,tokio_postgres=debug")).to_string();
        assert!(named.contains("tokio_postgres=debug"));
        assert!(!named.contains("tokio_postgres=info"));
    }
}

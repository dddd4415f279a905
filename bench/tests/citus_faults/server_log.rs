//! What the in-process server logged at ERROR, kept so that a test that
//! fails on a call's answer can say why: an INTERNAL answer names no
//! cause, the server's log line carries its cause chain.

use std::io;
use std::sync::{Mutex, Once};

/// The latest lines: enough for a fault's burst, not a whole run.
const KEPT: usize = 40;

static LINES: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// Each event is formatted whole and written in one call: one line.
struct Sink;

impl io::Write for Sink {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let line = String::from_utf8_lossy(buf).trim_end().to_string();
        let mut lines = LINES.lock().unwrap_or_else(|e| e.into_inner());
        if lines.len() == KEPT {
            lines.remove(0);
        }
        lines.push(line);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Starts keeping the server's ERROR lines (once per process) and forgets
/// those of earlier tests.
pub fn keep() {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        let _ = tracing_subscriber::fmt()
            .with_writer(|| Sink)
            .with_max_level(tracing_subscriber::filter::LevelFilter::ERROR)
            .with_ansi(false)
            .try_init();
    });
    LINES.lock().unwrap_or_else(|e| e.into_inner()).clear();
}

/// The lines kept since [`keep`], oldest first.
pub fn errors() -> Vec<String> {
    LINES.lock().unwrap_or_else(|e| e.into_inner()).clone()
}

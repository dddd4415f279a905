//! `--record-history FILE`: every call of the `cycle` and `contend`
//! scenarios written as a history (JSON lines, the format of
//! [`idempotency_bench::history`]); and `check-history FILE`: the
//! final read of every key it names, from the database, and the checker's
//! verdict.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write as _;
use std::path::Path;
use std::sync::Mutex;

use idempotency_bench::history::{self, Call, Entry};
use idempotency_bench::recorder;

/// The tenant of every call when the server runs without credentials.
const TENANT: &str = "default";

/// A history being written, shared by the clients.
pub(crate) struct HistoryFile(Mutex<std::io::BufWriter<std::fs::File>>);

impl HistoryFile {
    pub(crate) fn create(path: &Path) -> HistoryFile {
        let file = std::fs::File::create(path)
            .unwrap_or_else(|e| panic!("cannot create {}: {e}", path.display()));
        HistoryFile(Mutex::new(std::io::BufWriter::new(file)))
    }

    pub(crate) fn write(&self, call: Call) {
        let line = history::to_line(&Entry::Call(call));
        let mut file = self.0.lock().expect("history file");
        writeln!(file, "{line}").expect("write the history");
    }

    pub(crate) fn flush(&self) {
        self.0
            .lock()
            .expect("history file")
            .flush()
            .expect("write the history");
    }
}

/// Reads the history in `path`, adds the final read of each key from the
/// database at `database_url` (unless the file has final reads already),
/// checks it and prints the verdict; returns whether it is clean.
pub(crate) async fn check_history(path: &Path, database_url: &str) -> bool {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    let mut entries = history::parse(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut codes: BTreeMap<&str, usize> = BTreeMap::new();
    let mut keys = BTreeSet::new();
    let mut finals = 0;
    for entry in &entries {
        match entry {
            Entry::Call(c) => {
                *codes.entry(c.code.as_str()).or_default() += 1;
                keys.insert((c.scope.clone(), c.key.clone()));
            }
            Entry::Final(_) => finals += 1,
        }
    }
    let calls: usize = codes.values().sum();
    let codes = format!("{codes:?}");
    if finals == 0 {
        let (db, connection) = tokio_postgres::connect(database_url, tokio_postgres::NoTls)
            .await
            .unwrap_or_else(|e| panic!("cannot connect to the database: {e}"));
        tokio::spawn(connection);
        for (scope, key) in &keys {
            let read = recorder::final_read(&db, TENANT, scope, key)
                .await
                .unwrap_or_else(|e| panic!("final read of {scope}/{key}: {e}"));
            entries.push(read);
        }
    }
    let violations = history::check(&entries);
    println!(
        "history {}: {calls} calls {codes} on {} keys; {} violations",
        path.display(),
        keys.len(),
        violations.len()
    );
    for v in &violations {
        println!("  {v}");
    }
    println!(
        "RESULT check=history calls={calls} keys={} violations={}",
        keys.len(),
        violations.len()
    );
    violations.is_empty()
}

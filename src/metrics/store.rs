//! The store: calls that failed on the database, the batch workers'
//! statements and queue, and the replay cache.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};

use super::snapshot::{Snapshot, count};
use super::{HistogramFamily, Metrics, series};

/// Calls per batch statement: 1 up to the largest `--batch-size` (1000).
const BATCH_BUCKETS: [f64; 11] = [
    1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1000.0,
];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    result: &'static str,
}

/// The `replay_cache_lookups` results: a miss, a hit.
const REPLAY_RESULTS: [&str; 2] = ["miss", "hit"];

fn batch_histogram() -> Histogram {
    Histogram::new(BATCH_BUCKETS)
}

/// The store's metrics.
pub(super) struct Store {
    database_errors: Family<KindLabels, Counter>,
    batch_size: HistogramFamily<KindLabels>,
    group_commits: Family<KindLabels, Counter>,
    batch_queued: Gauge,
    /// Whether two batches go pipelined on one connection, as the count of
    /// replicas sharing the database decides (`--batch-workers auto`): an
    /// operator sees the switch the server logs.
    pipelined: Gauge,
    replay_lookups: Family<ResultLabels, Counter>,
    replay_bytes: Gauge,
    /// The series every batch or Acquire counts in, taken from their
    /// families once (see `calls::MethodSeries`): per [`BatchKind`], its
    /// `batch_size` and `group_commits`; `replay_lookups` for a miss and a
    /// hit.
    batch_series: [(Histogram, Counter); BatchKind::ALL.len()],
    replay_series: [Counter; REPLAY_RESULTS.len()],
}

impl Store {
    /// The store's metrics, registered in `r`, their bounded series at zero.
    pub(super) fn new(r: &mut Registry) -> Self {
        let batch_size: HistogramFamily<KindLabels> = Family::new_with_constructor(batch_histogram);
        let group_commits: Family<KindLabels, Counter> = Family::default();
        let replay_lookups: Family<ResultLabels, Counter> = Family::default();
        let m = Store {
            database_errors: Family::default(),
            batch_series: BatchKind::ALL.map(|kind| {
                let labels = KindLabels { kind: kind.label() };
                (
                    series(&batch_size, &labels),
                    series(&group_commits, &labels),
                )
            }),
            replay_series: REPLAY_RESULTS
                .map(|result| series(&replay_lookups, &ResultLabels { result })),
            batch_size,
            group_commits,
            batch_queued: Gauge::default(),
            pipelined: Gauge::default(),
            replay_lookups,
            replay_bytes: Gauge::default(),
        };
        r.register(
            "database_errors",
            "Calls that failed on the database, by kind (unavailable, timeout, pool_timeout, query, corrupt, config)",
            m.database_errors.clone(),
        );
        r.register(
            "batch_size",
            "Calls carried by one statement of the batch workers, by kind (acquire, complete)",
            m.batch_size.clone(),
        );
        r.register(
            "group_commits",
            "Batch statements that carried two or more calls in one commit, by kind",
            m.group_commits.clone(),
        );
        r.register(
            "batch_queued_calls",
            "Acquires and Completes waiting for a batch worker",
            m.batch_queued.clone(),
        );
        r.register(
            "batches_pipelined",
            "1 while two batches go pipelined on one connection because no other replica shares the database (--batch-workers auto); 0 while one goes at a time",
            m.pipelined.clone(),
        );
        r.register(
            "replay_cache_lookups",
            "Acquires looked up in the replay cache, by result (hit: answered from memory)",
            m.replay_lookups.clone(),
        );
        r.register_with_unit(
            "replay_cache",
            "Memory the replay cache holds",
            Unit::Bytes,
            m.replay_bytes.clone(),
        );
        m.zero();
        m
    }

    fn zero(&self) {
        for kind in DatabaseError::ALL {
            let _ = self
                .database_errors
                .get_or_create(&KindLabels { kind: kind.label() });
        }
    }

    /// The batch queue and the replay cache as `snapshot` has them.
    pub(super) fn apply(&self, snapshot: &Snapshot) {
        self.batch_queued.set(count(snapshot.queued_calls));
        self.replay_bytes
            .set(i64::try_from(snapshot.replay_cache_bytes).unwrap_or(i64::MAX));
    }
}

/// Why a call failed on the database.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DatabaseError {
    /// Connections refused or lost, the server shutting down or out of
    /// resources, a deadlock.
    Unavailable,
    /// A statement that did not answer within `--query-timeout`.
    Timeout,
    /// No pooled connection (or batch worker) was free within the wait.
    PoolTimeout,
    /// An error retrying will not fix (a bug or a broken schema).
    Query,
    /// A row that does not match what the SQL functions promise.
    Corrupt,
    /// The database URL or pool settings cannot be used.
    Config,
}

impl DatabaseError {
    const ALL: [DatabaseError; 6] = [
        DatabaseError::Unavailable,
        DatabaseError::Timeout,
        DatabaseError::PoolTimeout,
        DatabaseError::Query,
        DatabaseError::Corrupt,
        DatabaseError::Config,
    ];

    fn label(self) -> &'static str {
        match self {
            DatabaseError::Unavailable => "unavailable",
            DatabaseError::Timeout => "timeout",
            DatabaseError::PoolTimeout => "pool_timeout",
            DatabaseError::Query => "query",
            DatabaseError::Corrupt => "corrupt",
            DatabaseError::Config => "config",
        }
    }
}

impl Metrics {
    /// A call failed on the database.
    pub fn database_error(&self, kind: DatabaseError) {
        self.0
            .store
            .database_errors
            .get_or_create(&KindLabels { kind: kind.label() })
            .inc();
    }
}

/// Which hot call a batch carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BatchKind {
    Acquire,
    Complete,
}

impl BatchKind {
    pub const ALL: [BatchKind; 2] = [BatchKind::Acquire, BatchKind::Complete];

    fn label(self) -> &'static str {
        match self {
            BatchKind::Acquire => "acquire",
            BatchKind::Complete => "complete",
        }
    }
}

impl Metrics {
    /// A batch worker sends one statement carrying `calls` calls of `kind` (0:
    /// none of that kind, and nothing is counted for it). One statement may
    /// carry both kinds; each is counted as its own batch.
    pub fn batch_ran(&self, kind: BatchKind, calls: usize) {
        if calls == 0 {
            return;
        }
        let (batch_size, group_commits) = &self.0.store.batch_series[kind as usize];
        batch_size.observe(calls as f64);
        if calls > 1 {
            group_commits.inc();
        }
    }
}

impl Metrics {
    /// Batches switched to going two at a time, pipelined on one connection
    /// (`on`), or one at a time.
    pub fn batches_pipelined(&self, on: bool) {
        self.0.store.pipelined.set(i64::from(on));
    }
}

impl Metrics {
    /// An Acquire was looked up in the replay cache.
    pub fn replay_lookup(&self, hit: bool) {
        self.0.store.replay_series[usize::from(hit)].inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kind_and_result_counts_in_its_own_series() {
        let metrics = Metrics::new();
        let m = &metrics.0.store;
        for (at, kind) in BatchKind::ALL.into_iter().enumerate() {
            assert_eq!(kind as usize, at, "{kind:?}");
            let labels = KindLabels { kind: kind.label() };
            let commits = || m.group_commits.get_or_create(&labels).get();
            let before = commits();
            metrics.batch_ran(kind, 2);
            assert!(commits() > before, "{kind:?}");
        }
        for hit in [false, true] {
            let result = REPLAY_RESULTS[usize::from(hit)];
            assert_eq!(result, if hit { "hit" } else { "miss" });
            let lookups = || {
                m.replay_lookups
                    .get_or_create(&ResultLabels { result })
                    .get()
            };
            let before = lookups();
            metrics.replay_lookup(hit);
            assert!(lookups() > before, "{result}");
        }
    }
}

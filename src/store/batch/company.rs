//! Whether this replica has its database to itself, and so whether its
//! batches are pipelined (`--batch-workers auto`, the default).
//!
//! Two batches pipelined on one connection keep the database busy during
//! this server's turnaround between batches: more cycles a second where
//! the database would otherwise sit idle, but smaller batches and more
//! commits per call. Where other replicas share the database, it is busy
//! with their statements anyway, and the smaller batches only cost it
//! more (docs/performance.md, "Two batches, one connection"). So a replica
//! pipelines while no other replica shares its database, and sends one
//! batch at a time otherwise.
//!
//! **How replicas are counted.** Each replica holds a shared advisory
//! lock on one fixed key in the session its batches run on (the first
//! shared connection), taken at every health probe if that session does
//! not hold it yet; the replicas sharing the database are the sessions
//! holding that lock in `pg_locks`. `pg_locks` shows every session's locks
//! to any role (unlike `pg_stat_activity`, which hides most columns of
//! other roles' sessions without `pg_read_all_stats`); a lock is released
//! by the database the moment its session ends, so a replica that stops,
//! crashes or loses its connection leaves the count at once, without a
//! clock or a timeout; and no table is written, so counting adds no WAL.
//! Replicas on other databases of the same server are not counted.
//!
//! **Conservative both ways.** A replica starts with one batch at a time,
//! and pipelines only after [`ALONE_PROBES`] probes in a row counted it
//! alone; it stops at once when a probe counts another replica, or when
//! counting fails (the cheaper setting for a database it cannot see).

use std::sync::Mutex as Plain;
use std::sync::atomic::{AtomicBool, Ordering};

use super::super::StoreError;
use super::super::mux::Shared;
use crate::metrics::Metrics;

/// The advisory lock every replica holds while it serves: the two `int4`
/// keys of `pg_try_advisory_lock_shared(int4, int4)` (in `pg_locks`,
/// `classid`, `objid`, and `objsubid` 2). The first spells "IDEM".
const LOCK: (i32, i32) = (0x4944_454D, 1);

/// Probes in a row that must count this replica alone before it pipelines.
pub(in crate::store) const ALONE_PROBES: u32 = 2;

/// Sessions holding the lock on this database, and whether this session is
/// one of them.
const COUNT: &str = "select count(*) filter (where pid = pg_backend_pid()) > 0 as mine, \
     count(*) as holders \
     from pg_locks \
     where locktype = 'advisory' and granted and objsubid = 2 \
       and classid = $1::int4::oid and objid = $2::int4::oid \
       and database = (select oid from pg_database where datname = current_database())";

/// Takes the lock in this session (shared: every replica holds it).
const TAKE: &str = "select pg_try_advisory_lock_shared($1::int4, $2::int4) as taken";

/// The replicas on `shared`'s database that hold the lock, this one
/// included once it holds it (taking it first if this session does not).
pub(in crate::store) async fn replicas(shared: &Shared) -> Result<u64, StoreError> {
    let params: [&(dyn tokio_postgres::types::ToSql + Sync); 2] = [&LOCK.0, &LOCK.1];
    let row = shared
        .query_opt(COUNT, &params)
        .await?
        .ok_or_else(|| StoreError::Corrupt("no row counting the replicas".into()))?;
    let mine: bool = row.try_get("mine")?;
    let holders: i64 = row.try_get("holders")?;
    let mut holders = u64::try_from(holders).unwrap_or(0);
    if !mine {
        let taken = shared.query_opt(TAKE, &params).await?;
        let taken = match taken {
            Some(row) => row.try_get::<_, bool>("taken")?,
            None => false,
        };
        holders += u64::from(taken);
    }
    Ok(holders)
}

/// What the probes have counted so far, and the switch they set.
pub(super) struct Company {
    /// `true` while batches are pipelined: read by `take` at every batch.
    pipelining: AtomicBool,
    /// The probes' record, written by the probe alone.
    seen: Plain<Seen>,
    /// Where each switch is exported.
    metrics: Metrics,
}

#[derive(Default)]
struct Seen {
    /// Probes in a row that counted this replica alone.
    alone: u32,
    /// Whether the last count failed, so that a failure is logged once.
    failed: bool,
}

impl Company {
    /// One batch at a time until the probes count this replica alone.
    pub(super) fn new(metrics: Metrics) -> Self {
        metrics.batches_pipelined(false);
        Company {
            pipelining: AtomicBool::new(false),
            seen: Plain::new(Seen::default()),
            metrics,
        }
    }

    /// Whether batches are pipelined now.
    pub(super) fn pipelining(&self) -> bool {
        self.pipelining.load(Ordering::Relaxed)
    }

    /// Learns a probe's count (or why there is none) and switches, logging
    /// and exporting each switch.
    pub(super) fn counted(&self, replicas: Result<u64, StoreError>) {
        let mut seen = self
            .seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let was = self.pipelining();
        let now = match &replicas {
            Ok(n) if *n <= 1 => {
                seen.alone = seen.alone.saturating_add(1);
                seen.alone >= ALONE_PROBES
            }
            _ => {
                seen.alone = 0;
                false
            }
        };
        let failed = replicas.is_err();
        if let Err(e) = &replicas
            && !seen.failed
        {
            tracing::warn!(
                error = %crate::telemetry::cause_chain(e),
                "could not count the replicas sharing the database: one batch at a time"
            );
        }
        seen.failed = failed;
        if now == was {
            return;
        }
        self.pipelining.store(now, Ordering::Relaxed);
        self.metrics.batches_pipelined(now);
        match replicas {
            Ok(replicas) if now => tracing::info!(
                replicas,
                "no other replica shares the database: two batches pipelined on one connection"
            ),
            Ok(replicas) => tracing::info!(
                replicas,
                "other replicas share the database: one batch at a time"
            ),
            Err(_) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unknown() -> Result<u64, StoreError> {
        Err(StoreError::Unavailable("probe failed".into()))
    }

    #[test]
    fn it_pipelines_only_after_probes_in_a_row_count_it_alone() {
        let company = Company::new(Metrics::new());
        assert!(!company.pipelining(), "one batch at a time at start");
        company.counted(Ok(1));
        assert!(!company.pipelining(), "one probe alone is not enough");
        company.counted(Ok(2));
        company.counted(Ok(1));
        assert!(!company.pipelining(), "the probes alone were not in a row");
        company.counted(Ok(1));
        assert!(company.pipelining());
    }

    #[test]
    fn another_replica_or_a_failed_count_stops_pipelining_at_once() {
        let company = Company::new(Metrics::new());
        for _ in 0..ALONE_PROBES {
            company.counted(Ok(1));
        }
        assert!(company.pipelining());
        company.counted(Ok(2));
        assert!(!company.pipelining());
        for _ in 0..ALONE_PROBES {
            company.counted(Ok(1));
        }
        assert!(company.pipelining());
        company.counted(unknown());
        assert!(!company.pipelining());
    }
}

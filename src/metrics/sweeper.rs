//! The background sweeper: its rounds, how long they take, the records
//! swept, and the retries it found due.

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};

use super::Metrics;

/// How long a sweeping round takes, in seconds.
const SWEEP_BUCKETS: [f64; 10] = [0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0];

/// What a sweeping transaction does to records, created at zero.
const ACTIONS: [&str; 2] = ["expired_deleted", "leases_reclaimed"];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ActionLabels {
    action: &'static str,
}

/// The sweeper's metrics.
pub(super) struct Sweeper {
    sweeps: Family<OutcomeLabels, Counter>,
    sweep_duration: Histogram,
    swept: Family<ActionLabels, Counter>,
    retries_due: Gauge,
}

impl Sweeper {
    /// The sweeper's metrics, registered in `r`, their bounded series at
    /// zero.
    pub(super) fn new(r: &mut Registry) -> Self {
        let m = Sweeper {
            sweeps: Family::default(),
            sweep_duration: Histogram::new(SWEEP_BUCKETS),
            swept: Family::default(),
            retries_due: Gauge::default(),
        };
        r.register(
            "sweeps",
            "Background sweeping rounds, by outcome (swept, skipped: another replica sweeps, failed)",
            m.sweeps.clone(),
        );
        r.register_with_unit(
            "sweep_duration",
            "How long a background sweeping round took",
            Unit::Seconds,
            m.sweep_duration.clone(),
        );
        r.register(
            "swept_records",
            "Records swept (background and Sweep calls), by action (expired_deleted, leases_reclaimed)",
            m.swept.clone(),
        );
        r.register(
            "retries_due",
            "FAILED records whose retry is due, as of the last background sweep",
            m.retries_due.clone(),
        );
        for outcome in [
            SweepOutcome::Swept,
            SweepOutcome::Skipped,
            SweepOutcome::Failed,
        ] {
            let _ = m.sweeps.get_or_create(&OutcomeLabels {
                outcome: outcome.label(),
            });
        }
        for action in ACTIONS {
            let _ = m.swept.get_or_create(&ActionLabels { action });
        }
        m
    }
}

/// How a background sweeping round ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SweepOutcome {
    Swept,
    /// Another replica holds the sweeper's lock.
    Skipped,
    Failed,
}

impl SweepOutcome {
    fn label(self) -> &'static str {
        match self {
            SweepOutcome::Swept => "swept",
            SweepOutcome::Skipped => "skipped",
            SweepOutcome::Failed => "failed",
        }
    }
}

impl Metrics {
    /// A background sweeping round ended after `took`; `retries_due` when it
    /// swept and counted them.
    pub fn sweep_round(&self, outcome: SweepOutcome, took: Duration, retries_due: Option<u64>) {
        let m = &self.0.sweeper;
        m.sweeps
            .get_or_create(&OutcomeLabels {
                outcome: outcome.label(),
            })
            .inc();
        m.sweep_duration.observe(took.as_secs_f64());
        if let Some(due) = retries_due {
            m.retries_due.set(i64::try_from(due).unwrap_or(i64::MAX));
        }
    }
}

impl Metrics {
    /// One sweeping transaction deleted and reclaimed this many records.
    pub fn swept(&self, expired_deleted: u64, leases_reclaimed: u64) {
        let m = &self.0.sweeper;
        m.swept
            .get_or_create(&ActionLabels {
                action: "expired_deleted",
            })
            .inc_by(expired_deleted);
        m.swept
            .get_or_create(&ActionLabels {
                action: "leases_reclaimed",
            })
            .inc_by(leases_reclaimed);
    }
}

//! Maintenance: deleting expired records and reclaiming dead leases, in
//! small batches of short transactions (`idempotency_sweep_batch`), so that
//! sweeping a million records never blocks Acquire for long nor builds one
//! huge transaction. The same code serves the `Sweep` RPC and the background
//! sweeper; the background one runs on one replica at a time (it skips a
//! round when another replica holds the sweeper's lock). On a Citus
//! coordinator the same sweep runs shard by shard (`shards`): each shard on
//! its node, one sweeper at a time per shard.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::MissedTickBehavior;
use tokio_util::sync::CancellationToken;

use crate::domain::{SweepCounts, Tenant};
use crate::metrics::SweepOutcome;
use crate::recovery::Webhook;
use crate::store::{Store, StoreError};
use crate::telemetry::cause_chain;

mod shards;

/// Sweeps in batches through one store.
#[derive(Clone)]
pub struct Sweeper {
    /// Where the sweeping happens.
    store: Store,
    /// Rows of each kind per transaction: small enough that a batch holds
    /// its row locks for milliseconds.
    batch: u32,
}

/// What one sweep covers.
#[derive(Debug, Clone, Copy, Default)]
pub struct Sweep<'a> {
    /// One tenant's records, or (`None`) every tenant's.
    pub tenant: Option<&'a Tenant>,
    /// Up to this many records of each kind; `None`: until none is left.
    pub limit: Option<u64>,
    /// Only count what would be swept.
    pub dry_run: bool,
    /// Give up when another replica is sweeping (the background sweeper:
    /// one replica at a time).
    pub exclusive: bool,
}

impl Sweeper {
    pub fn new(store: Store, batch: u32) -> Self {
        Sweeper {
            store,
            batch: batch.max(1),
        }
    }

    /// Sweeps as `sweep` says, batch by batch; `None` when it gave up to
    /// another replica that is sweeping.
    pub async fn sweep(&self, sweep: Sweep<'_>) -> Result<Option<SweepCounts>, StoreError> {
        let swept = if self.store.distributed() {
            shards::sweep(&self.store, self.batch, sweep).await?
        } else {
            self.sweep_batches(sweep).await?
        };
        let Some(mut total) = swept else {
            return Ok(None);
        };
        total.retries_due = self.store.count_due(sweep.tenant).await?;
        Ok(Some(total))
    }

    /// The sweep on one PostgreSQL: batch after batch of
    /// `idempotency_sweep_batch`.
    async fn sweep_batches(&self, sweep: Sweep<'_>) -> Result<Option<SweepCounts>, StoreError> {
        let Sweep {
            tenant,
            limit,
            dry_run,
            exclusive,
        } = sweep;
        let limit = limit.unwrap_or(u64::MAX);
        let mut total = SweepCounts::default();
        if dry_run {
            let n = u32::try_from(limit).unwrap_or(u32::MAX);
            let Some(counts) = self.store.sweep_batch(tenant, n, true, exclusive).await? else {
                return Ok(None);
            };
            total += counts;
        } else {
            loop {
                let done = total.expired_deleted.max(total.leases_reclaimed);
                let n = u32::try_from(limit.saturating_sub(done))
                    .unwrap_or(u32::MAX)
                    .min(self.batch);
                if n == 0 {
                    break;
                }
                let Some(counts) = self.store.sweep_batch(tenant, n, false, exclusive).await?
                else {
                    if done == 0 {
                        return Ok(None);
                    }
                    break; // another replica took over between batches
                };
                total += counts;
                self.store
                    .metrics()
                    .swept(counts.expired_deleted, counts.leases_reclaimed);
                let n = u64::from(n);
                if counts.expired_deleted < n && counts.leases_reclaimed < n {
                    break; // nothing more of either kind
                }
            }
        }
        Ok(Some(total))
    }
}

/// What the background sweeper has done since the process started.
#[derive(Debug, Default)]
pub struct SweepTotals {
    /// Rounds in which this replica swept (not skipped).
    pub rounds: AtomicU64,
    /// Records past their expiry that this replica's sweeps deleted.
    pub expired_deleted: AtomicU64,
    /// PROCESSING records whose lease ran out, turned FAILED or
    /// FAILED_PERMANENT by this replica's sweeps.
    pub leases_reclaimed: AtomicU64,
}

impl SweepTotals {
    fn add(&self, counts: &SweepCounts) {
        self.rounds.fetch_add(1, Ordering::Relaxed);
        self.expired_deleted
            .fetch_add(counts.expired_deleted, Ordering::Relaxed);
        self.leases_reclaimed
            .fetch_add(counts.leases_reclaimed, Ordering::Relaxed);
    }
}

/// Sweeps every `interval` until `stop` is cancelled, then offers due
/// records to the recovery webhook if there is one. Cancelling `stop` also
/// ends a round in progress, at its next await; what it left undone is the
/// next round's, of whichever replica sweeps next.
pub async fn run(
    sweeper: Sweeper,
    interval: Duration,
    totals: Arc<SweepTotals>,
    webhook: Option<Webhook>,
    stop: CancellationToken,
) {
    let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
    ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            () = async {
                ticks.tick().await;
                round(&sweeper, &totals, webhook.as_ref()).await;
            } => {}
        }
    }
}

/// One round of the background sweeper: a sweep, counted and logged, then
/// the due records offered to `webhook`.
async fn round(sweeper: &Sweeper, totals: &SweepTotals, webhook: Option<&Webhook>) {
    let started = tokio::time::Instant::now();
    let swept = sweeper
        .sweep(Sweep {
            exclusive: true,
            ..Sweep::default()
        })
        .await;
    let outcome = match &swept {
        Ok(Some(_)) => SweepOutcome::Swept,
        Ok(None) => SweepOutcome::Skipped,
        Err(_) => SweepOutcome::Failed,
    };
    let due = swept.as_ref().ok().and_then(|c| c.map(|c| c.retries_due));
    sweeper
        .store
        .metrics()
        .sweep_round(outcome, started.elapsed(), due);
    match swept {
        Ok(Some(counts)) => {
            totals.add(&counts);
            if counts.expired_deleted + counts.leases_reclaimed > 0 {
                tracing::info!(
                    expired_deleted = counts.expired_deleted,
                    leases_reclaimed = counts.leases_reclaimed,
                    retries_due = counts.retries_due,
                    took = ?started.elapsed(),
                    "swept"
                );
            } else {
                tracing::debug!(retries_due = counts.retries_due, "swept: nothing to do");
            }
        }
        Ok(None) => tracing::debug!("another replica is sweeping"),
        Err(e) => {
            tracing::warn!(error = %cause_chain(&e), "sweep failed; trying again next round")
        }
    }
    if let Some(webhook) = webhook {
        webhook.offer_due(&sweeper.store).await;
    }
}

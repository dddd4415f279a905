//! Sweeping on a Citus coordinator, shard by shard. Citus refuses the
//! single-node sweep batch (`FOR UPDATE SKIP LOCKED` over several shards),
//! so each round runs the batch on every shard at once, each on its node in
//! its own transaction under its own sweeper lock
//! (`idempotency_sweep_shards`, through `run_command_on_shards`: one
//! statement to the coordinator, which knows where each shard is, even
//! while shards move). Rounds go on until every shard has nothing left or
//! the sweep's limit is reached.
//!
//! The limit keeps its meaning (at most that many records of each kind in
//! all): each round shares what is left of it out among the shards that may
//! still have some, at most a batch each, and a shard that did less than
//! its share of a kind has none of that kind left. The answer is the sum
//! over shards, the same counts one PostgreSQL gives.

use crate::domain::SweepCounts;
use crate::store::{ShardLimits, Store, StoreError};

use super::Sweep;

/// A shard that may still have records to sweep, of one kind or both.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Open {
    shard: String,
    expired: bool,
    leases: bool,
}

/// The sweep as [`super::Sweeper::sweep`] describes it, on every shard;
/// `None` when another sweeper held every shard's lock.
pub(super) async fn sweep(
    store: &Store,
    batch: u32,
    sweep: Sweep<'_>,
) -> Result<Option<SweepCounts>, StoreError> {
    let limit = sweep.limit.unwrap_or(u64::MAX);
    let shards = store.shards().await?;
    if sweep.dry_run {
        let n = u32::try_from(limit).unwrap_or(u32::MAX);
        let limits: Vec<ShardLimits> = shards
            .into_iter()
            .map(|shard| ShardLimits {
                shard,
                expired: n,
                leases: n,
            })
            .collect();
        let swept = store
            .sweep_shards(sweep.tenant, &limits, true, sweep.exclusive)
            .await?;
        let mut total: Option<SweepCounts> = None;
        for counts in swept.into_iter().filter_map(|s| s.counts) {
            *total.get_or_insert_with(SweepCounts::default) += counts;
        }
        return Ok(total.map(|t| SweepCounts {
            expired_deleted: t.expired_deleted.min(limit),
            leases_reclaimed: t.leases_reclaimed.min(limit),
            retries_due: 0,
        }));
    }
    let mut open: Vec<Open> = shards
        .into_iter()
        .map(|shard| Open {
            shard,
            expired: true,
            leases: true,
        })
        .collect();
    let mut total: Option<SweepCounts> = None;
    loop {
        let done = total.unwrap_or_default();
        let limits = shares(
            &open,
            batch,
            limit.saturating_sub(done.expired_deleted),
            limit.saturating_sub(done.leases_reclaimed),
        );
        if limits.is_empty() {
            break;
        }
        let swept = store
            .sweep_shards(sweep.tenant, &limits, false, sweep.exclusive)
            .await?;
        let mut round = SweepCounts::default();
        for result in swept {
            let Some(asked) = limits.iter().find(|l| l.shard == result.shard) else {
                continue; // a shard created since the list was read: next sweep's
            };
            let Some(state) = open.iter_mut().find(|o| o.shard == result.shard) else {
                continue;
            };
            let Some(counts) = result.counts else {
                // Another sweeper holds this shard: it is that one's.
                state.expired = false;
                state.leases = false;
                continue;
            };
            state.expired &= counts.expired_deleted >= u64::from(asked.expired);
            state.leases &= counts.leases_reclaimed >= u64::from(asked.leases);
            round += counts;
            *total.get_or_insert_with(SweepCounts::default) += counts;
        }
        store
            .metrics()
            .swept(round.expired_deleted, round.leases_reclaimed);
        open.retain(|o| o.expired || o.leases);
    }
    Ok(total)
}

/// One round's limits: what is left of the sweep's limit of each kind,
/// handed out in shard order to the shards that may still have records of
/// that kind, at most `batch` each. Shards with nothing to do are left out.
fn shares(open: &[Open], batch: u32, expired: u64, leases: u64) -> Vec<ShardLimits> {
    let (mut expired, mut leases) = (expired, leases);
    open.iter()
        .map(|o| ShardLimits {
            shard: o.shard.clone(),
            expired: take(o.expired, &mut expired, batch),
            leases: take(o.leases, &mut leases, batch),
        })
        .filter(|l| l.expired > 0 || l.leases > 0)
        .collect()
}

/// Up to `batch` of what is `left`, if the shard is `wanted` for it.
fn take(wanted: bool, left: &mut u64, batch: u32) -> u32 {
    if !wanted {
        return 0;
    }
    let n = u32::try_from((*left).min(u64::from(batch))).unwrap_or(batch);
    *left -= u64::from(n);
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open(shard: &str, expired: bool, leases: bool) -> Open {
        Open {
            shard: shard.into(),
            expired,
            leases,
        }
    }

    fn limits(shard: &str, expired: u32, leases: u32) -> ShardLimits {
        ShardLimits {
            shard: shard.into(),
            expired,
            leases,
        }
    }

    #[test]
    fn without_a_limit_every_open_shard_gets_a_batch_of_each_open_kind() {
        let shards = [open("a", true, true), open("b", false, true)];
        assert_eq!(
            shares(&shards, 100, u64::MAX, u64::MAX),
            vec![limits("a", 100, 100), limits("b", 0, 100)]
        );
    }

    #[test]
    fn what_is_left_of_a_limit_is_handed_out_in_shard_order() {
        let shards = [
            open("a", true, true),
            open("b", true, true),
            open("c", true, true),
        ];
        assert_eq!(
            shares(&shards, 100, 150, 30),
            vec![limits("a", 100, 30), limits("b", 50, 0)]
        );
        assert!(shares(&shards, 100, 0, 0).is_empty());
    }
}

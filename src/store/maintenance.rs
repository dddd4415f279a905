//! The maintenance calls: sweeping, and the recovery feed's due records.
//! Each runs on a pooled connection of its own, so its longer statements
//! never hold up the calls pipelined on the shared connections.
//!
//! On a Citus coordinator they call the forms of `sql/citus/maintenance.sql`
//! instead: sweeping shard by shard (`idempotency_sweep_shards`, each
//! shard on its node, see [`crate::sweeper`]), and the recovery feed read
//! without locks over shards, then claimed and released one key at a time
//! (`idempotency_claim_due_by_key`, `idempotency_release_offers_by_key`).
//! The due count (`idempotency_count_due_at`) is the same on both.

use std::time::Duration;

use super::run::millis;
use super::{CallTime, Store, StoreError, row};
use crate::domain::{DueRecord, Scope, SweepCounts, Tenant};

const SWEEP_BATCH: &str = "SELECT * FROM idempotency_sweep_batch($1, $2, $3, $4, $5)";
// The moment is read once, where the statement starts, and passed in.
const COUNT_DUE: &str = "SELECT idempotency_count_due_at($1, \
     clock_timestamp() + $2::bigint * interval '1 millisecond')";
const CLAIM_DUE: &str = "SELECT * FROM idempotency_claim_due($1, $2, $3, $4, $5, $6)";
const RELEASE_OFFERS: &str = "SELECT idempotency_release_offers($1)";
const SHARDS: &str = "SELECT shard_name('idempotency_keys'::regclass, shardid) \
     FROM pg_dist_shard WHERE logicalrelid = 'idempotency_keys'::regclass ORDER BY shardid";
const SWEEP_SHARDS: &str = "SELECT shard, swept, expired_deleted, leases_reclaimed \
     FROM idempotency_sweep_shards($1, $2, $3, $4, $5, $6, $7)";
const CLAIM_DUE_BY_KEY: &str = "SELECT * FROM idempotency_claim_due_by_key($1, $2, $3, $4, $5, $6)";
const RELEASE_OFFERS_BY_KEY: &str = "SELECT idempotency_release_offers_by_key($1)";

/// One shard's part of a round of sweeping on Citus: its name and how many
/// records of each kind it may change (or, dry, count).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardLimits {
    pub shard: String,
    pub expired: u32,
    pub leases: u32,
}

/// What a round did on one shard; `counts` is `None` when another sweeper
/// held the shard's lock (the round skipped it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardSwept {
    pub shard: String,
    pub counts: Option<SweepCounts>,
}

impl Store {
    /// One short transaction of sweeping (`idempotency_sweep_batch`), at most
    /// `limit` rows of each kind, of one tenant or (`None`) all; `None` when
    /// `exclusive` and another replica holds the sweeper's lock.
    pub async fn sweep_batch(
        &self,
        tenant: Option<&Tenant>,
        limit: u32,
        dry_run: bool,
        exclusive: bool,
    ) -> Result<Option<SweepCounts>, StoreError> {
        let limit = i32::try_from(limit).unwrap_or(i32::MAX);
        let row = self
            .query_one_pooled(
                SWEEP_BATCH,
                &[
                    &tenant.map(Tenant::as_str),
                    &limit,
                    &dry_run,
                    &exclusive,
                    &self.clock.offset_ms(),
                ],
                CallTime::default(),
            )
            .await?
            .ok_or_else(|| StoreError::Corrupt("idempotency_sweep_batch returned no row".into()))?;
        if !row.try_get::<_, bool>("swept")? {
            return Ok(None);
        }
        let count = |column| {
            row.try_get::<_, i64>(column)
                .map(|n| n.max(0).unsigned_abs())
        };
        Ok(Some(SweepCounts {
            expired_deleted: count("expired_deleted")?,
            leases_reclaimed: count("leases_reclaimed")?,
            retries_due: 0,
        }))
    }

    /// The shards of `idempotency_keys` on a Citus coordinator, by name.
    pub async fn shards(&self) -> Result<Vec<String>, StoreError> {
        let rows = self.query(SHARDS, &[], CallTime::default()).await?;
        rows.iter()
            .map(|row| row.try_get(0).map_err(StoreError::from))
            .collect()
    }

    /// One round of sweeping on a Citus coordinator
    /// (`idempotency_sweep_shards`): every shard in `limits` swept on its
    /// node in its own transaction, in parallel, as one sweep batch with
    /// its limits; with `exclusive`, only the shards whose sweeper lock it
    /// gets.
    pub async fn sweep_shards(
        &self,
        tenant: Option<&Tenant>,
        limits: &[ShardLimits],
        dry_run: bool,
        exclusive: bool,
    ) -> Result<Vec<ShardSwept>, StoreError> {
        let int = |n: u32| i32::try_from(n).unwrap_or(i32::MAX);
        let shards: Vec<&str> = limits.iter().map(|l| l.shard.as_str()).collect();
        let expired: Vec<i32> = limits.iter().map(|l| int(l.expired)).collect();
        let leases: Vec<i32> = limits.iter().map(|l| int(l.leases)).collect();
        let rows = self
            .query(
                SWEEP_SHARDS,
                &[
                    &tenant.map(Tenant::as_str),
                    &shards,
                    &expired,
                    &leases,
                    &dry_run,
                    &exclusive,
                    &self.clock.offset_ms(),
                ],
                CallTime::default(),
            )
            .await?;
        let count = |row: &tokio_postgres::Row, column| {
            row.try_get::<_, i64>(column)
                .map(|n| n.max(0).unsigned_abs())
        };
        rows.iter()
            .map(|row| {
                let counts = if row.try_get::<_, bool>("swept")? {
                    Some(SweepCounts {
                        expired_deleted: count(row, "expired_deleted")?,
                        leases_reclaimed: count(row, "leases_reclaimed")?,
                        retries_due: 0,
                    })
                } else {
                    None
                };
                Ok(ShardSwept {
                    shard: row.try_get("shard")?,
                    counts,
                })
            })
            .collect()
    }

    /// FAILED records whose retry is due, of one tenant or (`None`) all.
    pub async fn count_due(&self, tenant: Option<&Tenant>) -> Result<u64, StoreError> {
        let row = self
            .query_one_pooled(
                COUNT_DUE,
                &[&tenant.map(Tenant::as_str), &self.clock.offset_ms()],
                CallTime::default(),
            )
            .await?
            .ok_or_else(|| {
                StoreError::Corrupt("idempotency_count_due_at returned no row".into())
            })?;
        Ok(row.try_get::<_, i64>(0)?.max(0).unsigned_abs())
    }

    /// Offers up to `limit` due records to `subscriber` for `offer`
    /// (`idempotency_claim_due`): those of one tenant's scope, or with
    /// `None` those of every tenant.
    pub async fn claim_due(
        &self,
        scope: Option<(&Tenant, &Scope)>,
        subscriber: uuid::Uuid,
        offer: Duration,
        limit: u32,
    ) -> Result<Vec<DueRecord>, StoreError> {
        let (tenant, scope) =
            scope.map_or((None, None), |(t, s)| (Some(t.as_str()), Some(s.as_str())));
        let limit = i32::try_from(limit).unwrap_or(i32::MAX);
        let rows = self
            .query(
                if self.distributed() {
                    CLAIM_DUE_BY_KEY
                } else {
                    CLAIM_DUE
                },
                &[
                    &tenant,
                    &scope,
                    &subscriber,
                    &millis(offer),
                    &limit,
                    &self.clock.offset_ms(),
                ],
                CallTime::default(),
            )
            .await?;
        rows.iter().map(row::due_record).collect()
    }

    /// Makes what `subscriber` was offered and did not act on available to
    /// others at once; returns how many records that was.
    pub async fn release_offers(&self, subscriber: uuid::Uuid) -> Result<u64, StoreError> {
        let row = self
            .query_one_pooled(
                if self.distributed() {
                    RELEASE_OFFERS_BY_KEY
                } else {
                    RELEASE_OFFERS
                },
                &[&subscriber],
                CallTime::default(),
            )
            .await?
            .ok_or_else(|| {
                StoreError::Corrupt("idempotency_release_offers returned no row".into())
            })?;
        Ok(row.try_get::<_, i64>(0)?.max(0).unsigned_abs())
    }
}

//! The maintenance calls: sweeping, and the recovery feed's due records.
//! Each runs on a pooled connection of its own, so its longer statements
//! never hold up the calls pipelined on the shared connections.

use std::time::Duration;

use super::run::millis;
use super::{CallTime, Store, StoreError, row};
use crate::domain::{DueRecord, Scope, SweepCounts, Tenant};

const SWEEP_BATCH: &str = "SELECT * FROM idempotency_sweep_batch($1, $2, $3, $4, $5)";
const COUNT_DUE: &str = "SELECT idempotency_count_due($1, $2)";
const CLAIM_DUE: &str = "SELECT * FROM idempotency_claim_due($1, $2, $3, $4, $5, $6)";
const RELEASE_OFFERS: &str = "SELECT idempotency_release_offers($1)";

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

    /// FAILED records whose retry is due, of one tenant or (`None`) all.
    pub async fn count_due(&self, tenant: Option<&Tenant>) -> Result<u64, StoreError> {
        let row = self
            .query_one_pooled(
                COUNT_DUE,
                &[&tenant.map(Tenant::as_str), &self.clock.offset_ms()],
                CallTime::default(),
            )
            .await?
            .ok_or_else(|| StoreError::Corrupt("idempotency_count_due returned no row".into()))?;
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
                CLAIM_DUE,
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
            .query_one_pooled(RELEASE_OFFERS, &[&subscriber], CallTime::default())
            .await?
            .ok_or_else(|| {
                StoreError::Corrupt("idempotency_release_offers returned no row".into())
            })?;
        Ok(row.try_get::<_, i64>(0)?.max(0).unsigned_abs())
    }
}

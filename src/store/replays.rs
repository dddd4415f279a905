//! Replays answered without the database: the SUCCEEDED records this process
//! has read, kept until shortly before they expire.
//!
//! A SUCCEEDED record is final. Nothing changes it until `expires_at`, and
//! after that only a new Acquire or the sweeper touches it. So while the record
//! lives, `idempotency_acquire` can only answer ALREADY_DONE (same fingerprint)
//! or CONFLICT (another fingerprint), with the record as it is. That is
//! `replay`'s answer too, on any replica, without a round trip.
//!
//! Expiry is judged against the database's clock, estimated as this process's
//! wall clock plus the store's offset. An entry stops answering `CLOCK_MARGIN`
//! before `expires_at`, so a replica whose clock is behind the database's by
//! less than that never answers for an expired record. Entries are weighed by
//! their size, and the least useful go first once the cache is full.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use quick_cache::Weighter;
use quick_cache::sync::Cache;

use crate::domain::{AcquireCommand, Acquired, Decision, Record, RecordId, Status};

/// How long before `expires_at` an entry stops answering: more than the
/// clock difference between a replica and the database is ever expected to be.
pub const CLOCK_MARGIN: Duration = Duration::from_secs(5);

/// Records kept, by the caller's tenant, scope and key.
pub struct Replays {
    records: Cache<RecordId, Arc<Record>, BySize>,
}

impl Replays {
    /// A cache of at most `bytes` (as `BySize` counts them); `None` for 0.
    pub fn new(bytes: u64) -> Option<Self> {
        (bytes > 0).then(|| Replays {
            // The item estimate only sizes the table up front.
            records: Cache::with_weighter((bytes / 1024).max(16) as usize, bytes, BySize),
        })
    }

    /// The answer `idempotency_acquire` would give `cmd` at `now` (database
    /// time), if this process holds the record and it is live.
    pub fn answer(&self, cmd: &AcquireCommand, now: DateTime<Utc>) -> Option<Acquired> {
        let record = self.records.get(&cmd.id)?;
        if !answers_until(&record, now) {
            self.records.remove(&cmd.id);
            return None;
        }
        let decision = if record.fingerprint == cmd.fingerprint {
            Decision::AlreadyDone
        } else {
            Decision::Conflict
        };
        Some(Acquired {
            decision,
            record: Record::clone(&record),
            retry_after: None,
        })
    }

    /// Keeps `record`, read for `id` at `now` (database time), if it is
    /// SUCCEEDED and not about to expire.
    pub fn remember(&self, id: &RecordId, record: &Record, now: DateTime<Utc>) {
        if record.status == Status::Succeeded && answers_until(record, now) {
            self.records.insert(id.clone(), Arc::new(record.clone()));
        }
    }
}

/// Whether a kept record may still answer at `now`.
fn answers_until(record: &Record, now: DateTime<Utc>) -> bool {
    match chrono::Duration::from_std(CLOCK_MARGIN) {
        Ok(margin) => record.expires_at - margin > now,
        Err(_) => false,
    }
}

/// Weighs an entry by the bytes it holds: the record, its id and its payloads.
#[derive(Clone)]
struct BySize;

impl Weighter<RecordId, Arc<Record>> for BySize {
    fn weight(&self, id: &RecordId, record: &Arc<Record>) -> u64 {
        let id_bytes = id.tenant.as_str().len() + id.scope.as_str().len() + id.key.as_str().len();
        let result_bytes = record.result.as_ref().map_or(0, |r| {
            r.result.len() + r.content_type.len() + r.result_ref.len()
        });
        let bytes = std::mem::size_of::<Record>()
            + std::mem::size_of::<RecordId>()
            + id_bytes
            + record.scope.len()
            + record.key.len()
            + record.last_error.len()
            + record.checkpoint.len()
            + result_bytes;
        bytes as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{Fingerprint, Key, Lease, LeaseToken, Scope, StoredResult, Tenant};

    fn id(tenant: &str) -> RecordId {
        RecordId {
            tenant: Tenant::new(tenant),
            scope: Scope::try_from("s".to_owned()).unwrap(),
            key: Key::try_from("k".to_owned()).unwrap(),
        }
    }

    fn record(status: Status, expires_at: DateTime<Utc>, result: &[u8]) -> Record {
        let now = Utc::now();
        Record {
            scope: "s".into(),
            key: "k".into(),
            status,
            fingerprint: Fingerprint::of_payload(b"request"),
            attempt_count: 1,
            max_attempts: 10,
            lease_expires_at: None,
            next_retry_at: None,
            last_error: String::new(),
            last_error_at: None,
            result: Some(StoredResult {
                result: result.to_vec(),
                content_type: String::new(),
                status_code: 0,
                result_ref: String::new(),
            }),
            checkpoint: Vec::new(),
            fencing_token: 1,
            created_at: now,
            updated_at: now,
            completed_at: Some(now),
            expires_at,
            lease: Lease {
                token: LeaseToken::from_uuid(uuid::Uuid::new_v4()),
                attempt: 1,
                expires_at: None,
                fencing_token: 1,
            },
        }
    }

    fn command(tenant: &str, request: &[u8]) -> AcquireCommand {
        AcquireCommand {
            id: id(tenant),
            fingerprint: Fingerprint::of_payload(request),
            request_id: Default::default(),
            lease_ttl: Duration::from_secs(60),
            max_attempts: 10,
            retention: Duration::from_secs(3600),
            wait: Duration::ZERO,
        }
    }

    #[test]
    fn a_succeeded_record_answers_its_fingerprint_and_conflicts_with_others() {
        let replays = Replays::new(1 << 20).unwrap();
        let now = Utc::now();
        let kept = record(Status::Succeeded, now + chrono::Duration::hours(1), b"r");
        replays.remember(&id("t"), &kept, now);

        let same = replays.answer(&command("t", b"request"), now).unwrap();
        assert_eq!(same.decision, Decision::AlreadyDone);
        assert_eq!(same.record, kept);
        let other = replays.answer(&command("t", b"another"), now).unwrap();
        assert_eq!(other.decision, Decision::Conflict);
        assert!(
            replays.answer(&command("u", b"request"), now).is_none(),
            "another tenant's key is another record"
        );
    }

    #[test]
    fn only_succeeded_records_are_kept_and_only_until_the_margin_before_expiry() {
        let replays = Replays::new(1 << 20).unwrap();
        let now = Utc::now();
        let processing = record(Status::Processing, now + chrono::Duration::hours(1), b"");
        replays.remember(&id("t"), &processing, now);
        assert!(replays.answer(&command("t", b"request"), now).is_none());

        let expires_at = now + chrono::Duration::seconds(60);
        replays.remember(&id("t"), &record(Status::Succeeded, expires_at, b"r"), now);
        let margin = chrono::Duration::from_std(CLOCK_MARGIN).unwrap();
        let just_before = expires_at - margin - chrono::Duration::milliseconds(1);
        assert!(
            replays
                .answer(&command("t", b"request"), just_before)
                .is_some()
        );
        assert!(
            replays
                .answer(&command("t", b"request"), expires_at - margin)
                .is_none()
        );
        assert!(
            replays
                .answer(&command("t", b"request"), just_before)
                .is_none(),
            "an entry past its time is dropped"
        );

        let soon = now + margin;
        replays.remember(&id("t"), &record(Status::Succeeded, soon, b"r"), now);
        assert!(replays.answer(&command("t", b"request"), now).is_none());
    }

    #[test]
    fn the_cache_holds_no_more_than_its_bytes() {
        let replays = Replays::new(64 * 1024).unwrap();
        let now = Utc::now();
        let later = now + chrono::Duration::hours(1);
        for i in 0..100 {
            let mut id = id("t");
            id.key = Key::try_from(format!("k{i}")).unwrap();
            replays.remember(&id, &record(Status::Succeeded, later, &[0; 4096]), now);
        }
        assert!(replays.records.weight() <= 64 * 1024);
        assert!(replays.records.len() < 100);
        assert!(!replays.records.is_empty());
    }

    #[test]
    fn zero_bytes_is_no_cache() {
        assert!(Replays::new(0).is_none());
    }
}

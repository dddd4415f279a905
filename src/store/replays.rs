//! Replays answered without the database: the SUCCEEDED records this process
//! has read, kept until shortly before they expire.
//!
//! A SUCCEEDED record is final. Nothing changes it until `expires_at`, and
//! after that only a new Acquire or the sweeper touches it. So while the record
//! lives, `idempotency_acquire` can only answer ALREADY_DONE (same fingerprint)
//! or CONFLICT (another fingerprint), with the record as it is. That is
//! `replay`'s answer too, on any replica, without a round trip.
//!
//! Expiry is judged against the database's clock: this process's wall clock
//! moved by the skew the listener measures (nothing is kept or answered until
//! it has). An entry stops answering `CLOCK_MARGIN` before `expires_at`, which
//! covers the measurement's error and the clock's drift between two checks.
//! It is also read again from the database at least every `MAX_AGE`, so a
//! record changed behind the service's back (deleted by hand, restored from a
//! backup) is not answered from memory for longer than that. Entries are
//! weighed by their size, and the least useful go first once the cache is
//! full; a record weighing more than a few percent of the cache is not kept.

use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use quick_cache::Weighter;
use quick_cache::sync::Cache;

use crate::domain::{AcquireCommand, Acquired, Record, RecordId, Status};

/// How long before `expires_at` an entry stops answering: more than the
/// clock difference between a replica and the database is ever expected to be.
pub const CLOCK_MARGIN: Duration = Duration::from_secs(5);

/// How long an entry answers before the record is read again.
pub const MAX_AGE: Duration = Duration::from_secs(60);

/// A record as read, and when.
struct Kept {
    record: Record,
    at: Instant,
}

/// Records kept, by the caller's tenant, scope and key.
pub struct Replays {
    records: Cache<RecordId, Arc<Kept>, BySize>,
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
        self.lookup(cmd, now)
    }

    /// Bytes held, as `BySize` weighs them.
    pub fn weight(&self) -> u64 {
        self.records.weight()
    }

    fn lookup(&self, cmd: &AcquireCommand, now: DateTime<Utc>) -> Option<Acquired> {
        let kept = self.records.get(&cmd.id)?;
        if kept.at.elapsed() >= MAX_AGE || !answers_until(&kept.record, now) {
            // Left in place: a fresher read replaces it, or eviction does.
            return None;
        }
        let record = &kept.record;
        Some(Acquired {
            decision: record.final_decision(&cmd.fingerprint)?,
            record: record.clone(),
            retry_after: None,
        })
    }

    /// Forgets what was kept for `id` (an administrator deleted it).
    pub fn forget(&self, id: &RecordId) {
        self.records.remove(id);
    }

    /// Keeps `record`, read for `id` at `now` (database time), if it is
    /// SUCCEEDED and not about to expire; otherwise forgets what was kept
    /// for `id`, since the database's answer is newer.
    pub fn remember(&self, id: &RecordId, record: &Record, now: DateTime<Utc>) {
        if record.status != Status::Succeeded || !answers_until(record, now) {
            self.records.remove(id);
        } else {
            let kept = Kept {
                record: record.clone(),
                at: Instant::now(),
            };
            self.records.insert(id.clone(), Arc::new(kept));
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

impl Weighter<RecordId, Arc<Kept>> for BySize {
    fn weight(&self, id: &RecordId, kept: &Arc<Kept>) -> u64 {
        let record = &kept.record;
        let id_bytes = id.tenant.as_str().len() + id.scope.as_str().len() + id.key.as_str().len();
        let result_bytes = record.result.as_ref().map_or(0, |r| {
            r.result.len() + r.content_type.len() + r.result_ref.len()
        });
        let bytes = std::mem::size_of::<Kept>()
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
    use crate::domain::{
        Decision, Fingerprint, Key, Lease, LeaseToken, Scope, StoredResult, Tenant,
    };

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
            lease_request_id: String::new(),
            admin: None,
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
            answer_by: None,
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

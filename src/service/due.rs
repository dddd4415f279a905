//! WatchDue, the recovery feed: due records of one tenant's scope, each
//! offered to one subscriber at a time across all replicas (the offer is
//! claimed in the database), offered again when the offer runs out without a
//! new lease. When a subscriber goes away, whatever it was offered and did
//! not act on is released for others at once. A feed ends, UNAUTHENTICATED,
//! when a reload of the credentials revokes the credential it was opened
//! with.

use std::time::Duration;

use tokio::sync::mpsc;
use tonic::Status;

use crate::auth::Revocation;
use crate::domain::{DueReason, DueRecord, Scope, Tenant};
use crate::error::Error;
use crate::metrics;
use crate::notify::DueSubscription;
use crate::proto;
use crate::store::{Store, StoreError};
use crate::telemetry::cause_chain;

use super::encode;

/// Records claimed at most at once; claims never run ahead of what the
/// subscriber has taken, beyond its stream's small buffer.
const MAX_CLAIM: usize = 16;

/// How the feed runs, from configuration.
#[derive(Debug, Clone, Copy)]
pub struct FeedConfig {
    /// How long an offered record is not offered to anyone else.
    pub offer: Duration,
    /// How often an idle feed looks for newly due records (retries come due
    /// with the passing of time, which no notification announces).
    pub poll: Duration,
}

fn due_record(due: DueRecord) -> proto::DueRecord {
    proto::DueRecord {
        record: Some(encode::record(due.record)),
        reason: match due.reason {
            DueReason::RetryDue => proto::DueReason::RetryDue,
            DueReason::LeaseExpired => proto::DueReason::LeaseExpired,
        }
        .into(),
    }
}

/// How long a feed whose credential was revoked waits for room to say so.
const REVOKED_SAY_TIMEOUT: Duration = Duration::from_secs(5);

/// Ends a feed whose credential was revoked: UNAUTHENTICATED after what the
/// stream's buffer already holds (or, when the subscriber takes nothing
/// for [`REVOKED_SAY_TIMEOUT`], by the stream's end).
async fn end_revoked(records: &mpsc::Sender<Result<proto::DueRecord, Status>>) {
    tracing::info!("due feed ended: its credential was revoked");
    let refusal = Status::unauthenticated("the credential was revoked");
    let _ = tokio::time::timeout(REVOKED_SAY_TIMEOUT, records.send(Err(refusal))).await;
}

/// Feeds one subscriber until it goes away or its credential is revoked.
pub async fn feed(
    store: Store,
    mut announcements: DueSubscription,
    (tenant, mut revocation): (Tenant, Revocation),
    scope: Scope,
    config: FeedConfig,
    records: mpsc::Sender<Result<proto::DueRecord, Status>>,
) {
    let _open = store.metrics().stream_opened(metrics::Stream::WatchDue);
    let subscriber = uuid::Uuid::new_v4();
    loop {
        if records.capacity() == 0 {
            // The subscriber is behind: claim nothing until it takes a record.
            tokio::select! {
                _ = records.closed() => break,
                () = revocation.revoked() => {
                    end_revoked(&records).await;
                    break;
                }
                permit = records.reserve() => drop(permit),
            }
        }
        if !revocation.stands() {
            end_revoked(&records).await;
            break;
        }
        let room = records.capacity().clamp(1, MAX_CLAIM);
        let claimed = store
            .claim_due(
                Some((&tenant, &scope)),
                subscriber,
                config.offer,
                u32::try_from(room).unwrap_or(1),
            )
            .await;
        let got = match claimed {
            Ok(claimed) => {
                let got = claimed.len();
                for due in claimed {
                    if records.send(Ok(due_record(due))).await.is_err() {
                        break;
                    }
                }
                got
            }
            Err(StoreError::Unavailable(e)) => {
                tracing::debug!(error = %cause_chain(e.as_ref()), "due feed: database unavailable; asking again");
                0
            }
            Err(e) => {
                let _ = records
                    .send(Err(Error::from_store(e, store.metrics()).into()))
                    .await;
                break;
            }
        };
        if records.is_closed() {
            break;
        }
        if got < room {
            // Nothing more due now: wait for the sweeper's announcement or
            // for time to bring retries due.
            tokio::select! {
                _ = records.closed() => break,
                () = revocation.revoked() => {
                    end_revoked(&records).await;
                    break;
                }
                _ = announcements.announced() => {}
                _ = tokio::time::sleep(config.poll) => {}
            }
        }
    }
    match store.release_offers(subscriber).await {
        Ok(0) => {}
        Ok(n) => tracing::debug!(released = n, "due feed closed; offers released"),
        Err(e) => {
            tracing::warn!(error = %cause_chain(&e), "due feed closed; offers expire on their own")
        }
    }
}

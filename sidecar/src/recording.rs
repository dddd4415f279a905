//! An answer the upstream gave but the coordinator did not store (its
//! database paused, say, past the client library's retries) is held, and
//! its Complete sent again with the same lease token, with backoff, until
//! it is stored, another holder has provably taken the key over (the
//! coordinator answers LEASE_LOST), or `--store-patience` runs out. The
//! coordinator accepts a Complete after the lease ran out as long as nobody
//! took over, so an outage that outlasts the lease does not make the key's
//! next request run the upstream again. What the waiting client gets in
//! each case is decided in [`crate::coordinate`].

use std::time::{Duration, Instant};

use idempotency_client::proto::{CompleteRequest, Record, Success, complete_request::Outcome};
use idempotency_client::{Backoff, CallError, Client, Code, Codec as _, Done, RunOnceError};

use crate::attempt::{Decided, Slot};
use crate::proxy::Proxy;
use crate::stored::{ResponseCodec, StoredResponse};

/// How the held answer ended.
#[derive(Debug)]
pub enum Held {
    /// Stored: the record as it stands.
    Stored(Box<Record>),
    /// Another holder took the key over: its run is the one stored.
    TakenOver(CallError),
    /// Not stored within the patience, or refused for good.
    GaveUp(CallError),
}

/// The delays between Completes: short, so that the first moment the
/// database answers again is not missed by much.
const BACKOFF: Backoff = Backoff {
    initial: Duration::from_millis(100),
    max: Duration::from_secs(1),
};

/// Sends the Complete that stores `value` under the lease `token` until it
/// is stored, taken over, or `patience` has passed; `first` is why the
/// client library's own Complete failed.
pub async fn until_stored(
    client: &Client,
    (scope, key, token): (&str, &str, &str),
    value: &StoredResponse,
    first: CallError,
    patience: Duration,
) -> Held {
    let result = match ResponseCodec.encode(value) {
        Ok(result) => result,
        Err(error) => {
            return Held::GaveUp(CallError {
                code: Code::Internal,
                message: format!("the answer cannot be encoded: {error}"),
                reason: None,
                field_violations: Vec::new(),
                retry_after: None,
            });
        }
    };
    let request = CompleteRequest {
        scope: scope.to_owned(),
        key: key.to_owned(),
        lease_token: token.to_owned(),
        outcome: Some(Outcome::Success(Success {
            result,
            content_type: ResponseCodec.content_type().to_owned(),
            ..Success::default()
        })),
    };
    let deadline = Instant::now() + patience;
    let mut error = first;
    let mut retry = 0;
    loop {
        if error.is_lease_lost() {
            return Held::TakenOver(error);
        }
        if !error.is_retryable() || Instant::now() >= deadline {
            return Held::GaveUp(error);
        }
        let delay = BACKOFF.delay(retry, error.retry_after);
        tokio::time::sleep(delay.min(deadline.saturating_duration_since(Instant::now()))).await;
        retry = retry.saturating_add(1);
        tracing::info!(%error, retry, "storing an answer again");
        match client.complete(request.clone()).await {
            Ok(response) => return Held::Stored(Box::new(response.record.unwrap_or_default())),
            Err(next) => error = next,
        }
    }
}

/// What `run_once` decided, once an answer it could not store has been
/// held: stored, taken over (the answer is dropped from `slot`, so that the
/// client does not get a 2xx the key will never replay), or given up.
pub async fn settle(
    proxy: &Proxy,
    (scope, key): (&str, &str),
    token: Option<String>,
    slot: &Slot,
    decided: Decided,
) -> Decided {
    let (value, error, token) = match (decided, token) {
        (Err(RunOnceError::NotRecorded { value, error }), Some(token))
            if !error.is_lease_lost() =>
        {
            (value, error, token)
        }
        (decided, _) => return decided,
    };
    tracing::warn!(%error, "an answer was not stored; holding it and storing it again");
    let patience = proxy.settings.store_patience;
    let ids = (scope, key, token.as_str());
    match until_stored(&proxy.coordinator, ids, &value, error, patience).await {
        Held::Stored(record) => Ok(Done {
            value,
            replayed: false,
            record: *record,
        }),
        Held::TakenOver(error) => {
            if let Ok(mut kept) = slot.lock() {
                kept.take();
            }
            Err(RunOnceError::NotRecorded { value, error })
        }
        Held::GaveUp(error) => Err(RunOnceError::NotRecorded { value, error }),
    }
}

//! Whether the connections calls use answer. Every half interval each
//! shared connection (or a pooled one, when calls take pooled connections)
//! is sent an empty query; one that does not answer within the interval is
//! retired (the next call or probe connects anew) and the database reported
//! as not answering until a probe of every connection is answered again, so
//! a silently dead connection costs readiness about half an interval when
//! new connections work, and keeps it NOT_SERVING while they do not.
//! `startup` maps this,
//! with the listener's state, onto readiness: a database the listener still
//! reaches is not ready while the calls' own connections fail.
//!
//! With `--batch-workers auto`, each probe answered also counts the
//! replicas sharing the database, on the connection the batches use: the
//! batches are pipelined only while this replica is alone
//! (`batch::company`).

use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::{CallTime, Store, StoreError};

/// The probe, ready to run: [`Probe::run`] probes until its stop token is
/// cancelled.
pub struct Probe {
    store: Store,
    interval: Duration,
    /// `true` while the last probe was answered in time.
    state: watch::Sender<bool>,
}

impl Probe {
    /// A probe of `store` every half `interval`, each probe answered within
    /// `interval` or failed.
    pub fn new(store: Store, interval: Duration) -> Probe {
        Probe {
            store,
            interval,
            state: watch::Sender::new(false),
        }
    }

    /// Whether the connections calls use answer: `true` while the last
    /// probe was answered in time. Closes when the probe stops.
    pub fn answering(&self) -> watch::Receiver<bool> {
        self.state.subscribe()
    }

    /// Probes until `stop` is cancelled, which also ends a probe in
    /// progress.
    pub async fn run(self, stop: CancellationToken) {
        let Probe {
            store,
            interval,
            state,
        } = self;
        let mut ticks = tokio::time::interval(interval / 2);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let answered = tokio::select! {
                () = stop.cancelled() => return,
                answered = async {
                    ticks.tick().await;
                    let answered = store.probe(interval).await;
                    if answered.is_ok() {
                        store.count_replicas(interval).await;
                    }
                    answered
                } => answered,
            };
            let up = answered.is_ok();
            let changed = state.send_if_modified(|was| std::mem::replace(was, up) != up);
            match answered {
                Err(e) if changed => tracing::warn!(
                    error = %chain(&e),
                    "the database connections calls use do not answer: not ready"
                ),
                Ok(()) if changed => tracing::info!("the database connections calls use answer"),
                _ => {}
            }
        }
    }
}

impl Store {
    /// Whether a call's statement would get an answer within `limit` now:
    /// every shared connection answers (one that does not is replaced), or,
    /// without shared connections, a pooled one does.
    pub async fn probe(&self, limit: Duration) -> Result<(), StoreError> {
        if let Some(mux) = &self.mux {
            return mux.probe(limit).await;
        }
        let client = self.connection(CallTime::default().waiting(limit)).await?;
        let answer =
            tokio::time::timeout(limit, async { Ok(client.batch_execute("").await?) }).await;
        self.answered_in_time(client, answer)
    }
}

impl Store {
    /// With `--batch-workers auto`, counts the replicas sharing the
    /// database (holding this one's place in the count first), within
    /// `limit`, and tells the batches.
    async fn count_replicas(&self, limit: Duration) {
        let (Some(mux), Some(batches)) = (&self.mux, &self.batches) else {
            return;
        };
        if !batches.auto() {
            return;
        }
        let counted = async {
            let shared = mux.slot_within(0, limit).await?;
            mux.in_time(&shared, limit, super::batch::replicas(&shared))
                .await
        };
        batches.counted(counted.await);
    }
}

/// `error` and its sources, joined.
fn chain(error: &StoreError) -> String {
    let mut text = error.to_string();
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

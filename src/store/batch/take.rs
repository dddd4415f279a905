//! When the next batch goes out, and with which calls (`take`): at once
//! while no batch is out; behind one that is, once it carries as many
//! calls, as long as the one ahead has been out only briefly and batches
//! are pipelined (always with a fixed `--batch-workers`; with `auto`, while
//! no other replica shares the database: `company`); otherwise when the
//! one ahead is answered. `Flight` keeps the batches out.

use std::sync::Mutex as Plain;
use std::time::Duration;

use tokio::sync::{Mutex, Notify, mpsc};
use tokio::time::Instant;

use super::Pending;
use super::company::Company;

/// How long a batch may have been out for the next to be sent behind it.
/// Sending early saves the database the server's turnaround between two
/// statements, a fraction of a millisecond; behind a statement out longer
/// than this (one waiting on row locks, or on a connection that stopped
/// answering) that saving is nothing, and the calls sent there would wait
/// for it, up to `--query-timeout`, instead of hearing UNAVAILABLE after
/// their connect wait as calls still queued do.
pub(super) const PIPELINE_WINDOW: Duration = Duration::from_millis(20);

/// The batches that have gone out and not yet landed (been answered, or
/// left to a connection that stopped answering), and a signal each time
/// one lands: what a worker that would send another batch behind them
/// waits on (`take`).
#[derive(Default)]
pub(super) struct Flight {
    out: Plain<Out>,
    landed: Notify,
    /// With `--batch-workers auto`, whether other replicas share the
    /// database, and so whether a batch may go behind one out; `None`:
    /// always (a fixed number of workers).
    company: Option<Company>,
}

#[derive(Default)]
struct Out {
    /// The calls they carry.
    calls: usize,
    /// When each went out.
    since: Vec<Instant>,
}

impl Flight {
    /// No batch out; batches pipelined as `company` says (`None`: always).
    pub(super) fn new(company: Option<Company>) -> Self {
        Flight {
            company,
            ..Flight::default()
        }
    }

    /// Whether another replica shares the database, as the probes count
    /// it; `None` with a fixed number of workers.
    pub(super) fn company(&self) -> Option<&Company> {
        self.company.as_ref()
    }

    /// Whether a batch may go behind one out, before it lands.
    fn pipelining(&self) -> bool {
        self.company.as_ref().is_none_or(Company::pipelining)
    }

    /// Counts a batch of `calls` out until the returned guard is dropped.
    pub(super) fn board(&self, calls: usize) -> Boarded<'_> {
        let since = Instant::now();
        let mut out = self.out();
        out.calls += calls;
        out.since.push(since);
        Boarded {
            flight: self,
            calls,
            since,
        }
    }

    /// The calls out, and when the first of their batches went out; `None`
    /// with no batch out (every batch boarded carries a call).
    fn state(&self) -> Option<(usize, Instant)> {
        let out = self.out();
        Some((out.calls, out.since.iter().min().copied()?))
    }

    fn out(&self) -> std::sync::MutexGuard<'_, Out> {
        // Every critical section is plain arithmetic; a poisoned lock still
        // holds consistent counts.
        self.out
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// A batch counted out; dropping it lands it.
pub(super) struct Boarded<'a> {
    flight: &'a Flight,
    calls: usize,
    since: Instant,
}

impl Drop for Boarded<'_> {
    fn drop(&mut self) {
        {
            let mut out = self.flight.out();
            out.calls -= self.calls;
            if let Some(at) = out.since.iter().position(|s| *s == self.since) {
                out.since.swap_remove(at);
            }
        }
        self.flight.landed.notify_waiters();
    }
}

/// Takes the next batch's calls into `batch`; `false` once the queue has
/// closed (calls already taken then go at once). One worker at a time
/// takes: all that are queued (up to `max`).
///
/// - With no batch out, at once: an idle database gets each call the
///   moment it arrives.
/// - Behind batches out, once as many calls are queued as they carry
///   (or `max`), while the first of them has been out less than [`PIPELINE_WINDOW`]
///   and batches are pipelined (`Flight::new`):
///   the batch then goes before the one ahead has landed (on one shared
///   connection it is pipelined behind it, and the database starts it
///   the moment the other commits, without waiting for this server's
///   turnaround), yet going early does not split the calls into ever
///   smaller batches, each with a commit of its own.
/// - Otherwise when one of the batches out lands, with every call queued
///   by then: no later than a single worker would have sent them, and a
///   call that waits longer than its connect wait meanwhile hears
///   UNAVAILABLE, never having run.
pub(super) async fn take<C>(
    receiver: &Mutex<mpsc::UnboundedReceiver<Pending<C>>>,
    batch: &mut Vec<Pending<C>>,
    max: usize,
    flight: &Flight,
) -> bool {
    let mut receiver = receiver.lock().await;
    if receiver.recv_many(batch, max).await == 0 {
        return false;
    }
    loop {
        // Listening before reading the state, so that a batch landing in
        // between is not missed.
        let landed = flight.landed.notified();
        tokio::pin!(landed);
        landed.as_mut().enable();
        let Some((out, first_since)) = flight.state() else {
            return true;
        };
        if flight.pipelining()
            && batch.len() >= out.min(max)
            && first_since.elapsed() < PIPELINE_WINDOW
        {
            return true;
        }
        let room = max - batch.len();
        if room == 0 {
            landed.await;
            return true;
        }
        tokio::select! {
            taken = receiver.recv_many(batch, room) => if taken == 0 { return true },
            () = &mut landed => {
                while batch.len() < max {
                    match receiver.try_recv() {
                        Ok(pending) => batch.push(pending),
                        Err(_) => break,
                    }
                }
                return true;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::pin::pin;
    use std::sync::Arc;
    use std::sync::atomic::AtomicBool;
    use std::task::Poll;

    use futures::poll;
    use tokio::sync::oneshot;

    use super::*;

    type Queue = Mutex<mpsc::UnboundedReceiver<Pending<()>>>;

    fn queue() -> (mpsc::UnboundedSender<Pending<()>>, Queue) {
        let (sender, receiver) = mpsc::unbounded_channel();
        (sender, Mutex::new(receiver))
    }

    fn call() -> Pending<()> {
        Pending {
            call: (),
            take_by: Instant::now() + Duration::from_secs(60),
            answer_by: None,
            claimed: Arc::new(AtomicBool::new(false)),
            reply: oneshot::channel().0,
            span: tracing::Span::none(),
        }
    }

    fn send(sender: &mpsc::UnboundedSender<Pending<()>>, calls: usize) {
        for _ in 0..calls {
            assert!(sender.send(call()).is_ok());
        }
    }

    #[tokio::test(start_paused = true)]
    async fn with_no_batch_out_a_call_goes_at_once() {
        let (sender, receiver) = queue();
        let flight = Flight::default();
        let mut batch = Vec::new();
        send(&sender, 1);
        assert!(take(&receiver, &mut batch, 64, &flight).await);
        assert_eq!(batch.len(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn behind_a_batch_out_the_next_waits_until_it_carries_as_many_calls() {
        let (sender, receiver) = queue();
        let flight = Flight::default();
        let _out = flight.board(4);
        let mut batch = Vec::new();
        send(&sender, 1);
        let taken = {
            let mut next = pin!(take(&receiver, &mut batch, 64, &flight));
            assert!(poll!(next.as_mut()).is_pending(), "one call behind four");
            send(&sender, 2);
            assert!(poll!(next.as_mut()).is_pending(), "three calls behind four");
            send(&sender, 2);
            poll!(next.as_mut())
        };
        assert_eq!(taken, Poll::Ready(true));
        assert_eq!(batch.len(), 5, "it takes every call queued by then");
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_batch_goes_however_many_are_out_while_the_first_is_recent() {
        let (sender, receiver) = queue();
        let flight = Flight::default();
        let _out = flight.board(100);
        let mut batch = Vec::new();
        send(&sender, 8);
        assert!(take(&receiver, &mut batch, 8, &flight).await);
        assert_eq!(batch.len(), 8);
    }

    #[tokio::test(start_paused = true)]
    async fn a_closed_queue_ends_the_worker_and_a_waiting_batch_still_goes() {
        let (sender, receiver) = queue();
        let flight = Flight::default();
        let _out = flight.board(4);
        let mut batch = Vec::new();
        send(&sender, 1);
        drop(sender);
        assert!(take(&receiver, &mut batch, 64, &flight).await);
        assert_eq!(batch.len(), 1, "the call taken before the close runs");
        batch.clear();
        assert!(!take(&receiver, &mut batch, 64, &flight).await);
    }

    #[tokio::test(start_paused = true)]
    async fn when_the_one_ahead_lands_the_next_goes_however_small_with_every_call_queued() {
        let (sender, receiver) = queue();
        let flight = Flight::default();
        let out = flight.board(4);
        let mut batch = Vec::new();
        send(&sender, 1);
        let taken = {
            let mut next = pin!(take(&receiver, &mut batch, 64, &flight));
            assert!(poll!(next.as_mut()).is_pending());
            drop(out);
            send(&sender, 2);
            poll!(next.as_mut())
        };
        assert_eq!(taken, Poll::Ready(true));
        assert_eq!(
            batch.len(),
            3,
            "fewer than were out, and all that were queued"
        );
    }

    /// With `--batch-workers auto` and another replica on the database,
    /// batches go one at a time, as a single worker sends them.
    #[tokio::test(start_paused = true)]
    async fn while_not_pipelining_a_full_batch_waits_for_the_one_ahead_to_land() {
        let (sender, receiver) = queue();
        let flight = Flight::new(Some(Company::new(crate::metrics::Metrics::new())));
        let out = flight.board(2);
        let mut batch = Vec::new();
        send(&sender, 5);
        let taken = {
            let mut next = pin!(take(&receiver, &mut batch, 4, &flight));
            assert!(poll!(next.as_mut()).is_pending(), "a full batch waits");
            drop(out);
            poll!(next.as_mut())
        };
        assert_eq!(taken, Poll::Ready(true));
        assert_eq!(batch.len(), 4);
    }

    #[tokio::test(start_paused = true)]
    async fn once_counted_alone_a_full_batch_goes_behind_the_one_out() {
        let (sender, receiver) = queue();
        let flight = Flight::new(Some(Company::new(crate::metrics::Metrics::new())));
        let company = flight.company().expect("auto");
        for _ in 0..super::super::company::ALONE_PROBES {
            company.counted(Ok(1));
        }
        let _out = flight.board(2);
        let mut batch = Vec::new();
        send(&sender, 5);
        assert!(take(&receiver, &mut batch, 4, &flight).await);
        assert_eq!(batch.len(), 4);
    }

    /// A statement out that long may be on a connection that stopped
    /// answering: calls are not sent after it.
    #[tokio::test(start_paused = true)]
    async fn behind_a_batch_out_longer_than_the_window_the_next_waits_for_it_to_land() {
        let (sender, receiver) = queue();
        let flight = Flight::default();
        let out = flight.board(2);
        tokio::time::advance(PIPELINE_WINDOW + Duration::from_millis(1)).await;
        let mut batch = Vec::new();
        send(&sender, 5);
        let taken = {
            let mut next = pin!(take(&receiver, &mut batch, 4, &flight));
            assert!(poll!(next.as_mut()).is_pending(), "a full batch waits too");
            drop(out);
            poll!(next.as_mut())
        };
        assert_eq!(taken, Poll::Ready(true));
        assert_eq!(batch.len(), 4, "no more than the batch size");
    }
}

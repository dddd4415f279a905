//! When the next batch goes out, and with which calls: at once while no
//! batch is out; behind one that is, once it carries as many calls, or
//! when the one ahead is answered (`take`). `Flight` counts the calls of
//! the batches out.

use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::{Mutex, mpsc};

use super::Pending;

/// The calls of the batches that have gone out and not yet landed (been
/// answered, or left to a connection that stopped answering), and a signal
/// each time one lands: what a worker that would send another batch
/// behind them waits on (`take`).
#[derive(Default)]
pub(super) struct Flight {
    calls: AtomicUsize,
    landed: tokio::sync::Notify,
}

impl Flight {
    /// Counts `calls` in flight until the returned guard is dropped.
    pub(super) fn board(&self, calls: usize) -> Boarded<'_> {
        self.calls.fetch_add(calls, Ordering::AcqRel);
        Boarded {
            flight: self,
            calls,
        }
    }
}

/// A batch's calls counted in flight; dropping it lands them.
pub(super) struct Boarded<'a> {
    flight: &'a Flight,
    calls: usize,
}

impl Drop for Boarded<'_> {
    fn drop(&mut self) {
        self.flight.calls.fetch_sub(self.calls, Ordering::AcqRel);
        self.flight.landed.notify_waiters();
    }
}

/// Takes the next batch's calls into `batch`; `false` once the queue has
/// closed. One worker at a time takes: all that are queued (up to `max`),
/// at once when no batch is in flight, so that an idle database gets each
/// call the moment it arrives. Behind a batch in flight, it waits until
/// as many calls are queued as the batches in flight carry, or until one
/// of them lands, whichever is first: the batch then goes out before the
/// one ahead has landed (on one shared connection, it is pipelined behind
/// it, and the database starts it the moment the other commits, without
/// waiting for this server's turnaround), yet going out early does not
/// split the calls into ever smaller batches, each with a commit of its
/// own. A call waits no longer than it would with a single worker, which
/// sends nothing before its batch lands.
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
        // Listening before reading the count, so that a batch landing in
        // between is not missed.
        let landed = flight.landed.notified();
        tokio::pin!(landed);
        landed.as_mut().enable();
        let flying = flight.calls.load(Ordering::Acquire);
        if flying == 0 || batch.len() >= flying.min(max) {
            return true;
        }
        let room = max - batch.len();
        tokio::select! {
            taken = receiver.recv_many(batch, room) => if taken == 0 { return true },
            () = &mut landed => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use std::pin::pin;
    use std::task::Poll;

    use futures::poll;

    use std::sync::Arc;
    use std::sync::atomic::AtomicBool;
    use std::time::Duration;

    use tokio::sync::oneshot;
    use tokio::time::Instant;

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

    #[tokio::test]
    async fn with_no_batch_out_a_call_goes_at_once() {
        let (sender, receiver) = queue();
        let flight = Flight::default();
        let mut batch = Vec::new();
        send(&sender, 1);
        assert!(take(&receiver, &mut batch, 64, &flight).await);
        assert_eq!(batch.len(), 1);
    }

    #[tokio::test]
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

    #[tokio::test]
    async fn the_next_batch_goes_when_the_one_ahead_lands_however_small() {
        let (sender, receiver) = queue();
        let flight = Flight::default();
        let out = flight.board(4);
        let mut batch = Vec::new();
        send(&sender, 1);
        let taken = {
            let mut next = pin!(take(&receiver, &mut batch, 64, &flight));
            assert!(poll!(next.as_mut()).is_pending());
            drop(out);
            poll!(next.as_mut())
        };
        assert_eq!(taken, Poll::Ready(true));
        assert_eq!(batch.len(), 1);
    }

    #[tokio::test]
    async fn a_full_batch_goes_whatever_is_out() {
        let (sender, receiver) = queue();
        let flight = Flight::default();
        let _out = flight.board(100);
        let mut batch = Vec::new();
        send(&sender, 8);
        assert!(take(&receiver, &mut batch, 8, &flight).await);
        assert_eq!(batch.len(), 8);
    }

    #[tokio::test]
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
}

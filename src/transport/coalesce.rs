//! A gRPC connection's answers written together. When a batch of calls is
//! answered, each call's stream hands its response to the connection and
//! wakes the connection's task. Tokio runs a task woken that way next, on
//! the same thread (its "LIFO slot"), so the connection would write each
//! response as soon as it is handed over: one `writev`, one TCP segment and
//! one wake-up of the client per call. [`Coalesced`] makes the connection,
//! once woken, wait until its thread has run the tasks already queued (the
//! rest of the answered calls) before it polls the connection again, which
//! then writes all the responses it holds at once (0.43 writes per call
//! instead of 0.95 in docs/performance.md, "A batch's answers in one
//! write").
//!
//! The wait is tokio's `yield_now`: the runtime polls the connection again
//! once its thread has no task of its own left to run (having tried to
//! steal some), or at the latest at its next I/O check, every 61 tasks, so
//! a connection is never starved. Every wake waits so, a socket's as well
//! as a stream's: on an idle thread that costs one poll and one
//! `epoll_wait` that returns at once. The HTTP port's connections are not
//! wrapped: over HTTP/1.1 a connection carries one request at a time, and
//! that port's HTTP/2 callers are few.

use std::future::Future;
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, Wake, Waker};

/// Runs `inner`, polling it only once the tasks queued on the thread when it
/// was woken have run (module documentation).
pub struct Coalesced<F> {
    inner: Pin<Box<F>>,
    /// The turn this future waits for, once woken; `None` while the inner
    /// future waits for its own events.
    turn: Option<Arc<Turn>>,
}

impl<F: Future> Coalesced<F> {
    pub fn new(inner: F) -> Self {
        Coalesced {
            inner: Box::pin(inner),
            turn: None,
        }
    }
}

/// The waker handed to the runtime's deferred queue: it marks the turn as
/// come, then wakes the task.
struct Turn {
    come: AtomicBool,
    task: Waker,
}

impl Wake for Turn {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.come.store(true, Ordering::Release);
        self.task.wake_by_ref();
    }
}

impl<F: Future> Future for Coalesced<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        match &self.turn {
            // Woken again (another response handed over) before its turn:
            // the turn's wake is still to come, to the same task.
            Some(turn) if !turn.come.load(Ordering::Acquire) && turn.task.will_wake(cx.waker()) => {
                return Poll::Pending;
            }
            Some(_) => self.turn = None,
            None => {
                let turn = Arc::new(Turn {
                    come: AtomicBool::new(false),
                    task: cx.waker().clone(),
                });
                let waker = Waker::from(Arc::clone(&turn));
                let yielded = pin!(tokio::task::yield_now())
                    .poll(&mut Context::from_waker(&waker))
                    .is_ready();
                // `yield_now` is never ready on its first poll; should it be,
                // there is nothing to wait for.
                if !yielded {
                    self.turn = Some(turn);
                    return Poll::Pending;
                }
            }
        }
        self.inner.as_mut().poll(cx)
    }
}

#[cfg(test)]
mod tests {
    use std::future::poll_fn;

    use tokio::sync::{mpsc, oneshot};

    use super::*;

    /// The answers to three calls, handed to one connection the way a
    /// batch's replies reach it: the batch wakes each call's task, and each
    /// hands its response to the connection and wakes it. The connection,
    /// like HTTP/2's, writes whatever it has been handed each time it is
    /// polled; returns its writes.
    async fn writes_of_one_batch(coalesced: bool) -> Vec<Vec<usize>> {
        let (hand, mut handed) = mpsc::unbounded_channel::<usize>();
        let (listening, listens) = oneshot::channel();
        let connection = async move {
            let mut writes = Vec::new();
            let mut listening = Some(listening);
            poll_fn(|cx| {
                let mut write = Vec::new();
                let ended = loop {
                    match handed.poll_recv(cx) {
                        Poll::Ready(Some(response)) => write.push(response),
                        Poll::Ready(None) => break true,
                        Poll::Pending => break false,
                    }
                };
                if !write.is_empty() {
                    writes.push(write);
                }
                if let Some(listening) = listening.take() {
                    let _ = listening.send(());
                }
                if ended {
                    Poll::Ready(())
                } else {
                    Poll::Pending
                }
            })
            .await;
            writes
        };
        let connection = if coalesced {
            tokio::spawn(Coalesced::new(connection))
        } else {
            tokio::spawn(connection)
        };
        listens.await.expect("the connection listens");
        let mut answers = Vec::new();
        for call in 0..3 {
            let (answer, answered) = oneshot::channel::<usize>();
            let (waiting, waits) = oneshot::channel();
            let hand = hand.clone();
            tokio::spawn(async move {
                let _ = waiting.send(());
                let response = answered.await.expect("the batch answers");
                hand.send(response).expect("the connection is open");
            });
            waits.await.expect("the call waits");
            answers.push((call, answer));
        }
        drop(hand);
        // The batch, a task on the runtime's thread like the server's.
        tokio::spawn(async move {
            for (call, answer) in answers {
                answer.send(call).expect("the call waits");
            }
        });
        connection.await.expect("the connection ends")
    }

    /// One runtime thread, so that every task runs where tokio's LIFO slot
    /// applies: unwrapped, the connection writes each answer alone; wrapped,
    /// the batch's three answers leave in one write. The thread's periodic
    /// I/O check, which also runs deferred tasks, is put off for good (the
    /// test has no I/O): one falling between two answers would let the
    /// connection write early, which in the server splits a write in two
    /// and in this test would fail it.
    #[test]
    fn a_batchs_answers_leave_in_one_write() {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .event_interval(u32::MAX)
            .build()
            .expect("a runtime");
        runtime.block_on(async {
            assert_eq!(writes_of_one_batch(false).await.len(), 3);
            let writes = writes_of_one_batch(true).await;
            assert_eq!(writes.len(), 1, "{writes:?}");
            let mut written = writes[0].clone();
            written.sort_unstable();
            assert_eq!(written, [0, 1, 2]);
        });
    }

    /// Outside a runtime, the turn comes at once: the inner future is
    /// polled on the next poll at the latest.
    #[test]
    fn outside_a_runtime_the_inner_future_is_still_polled() {
        let mut future = pin!(Coalesced::new(async { 7 }));
        let mut cx = Context::from_waker(Waker::noop());
        let answer = match future.as_mut().poll(&mut cx) {
            Poll::Pending => future.as_mut().poll(&mut cx),
            ready => ready,
        };
        assert_eq!(answer, Poll::Ready(7));
    }
}

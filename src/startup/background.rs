//! The server's background tasks under one supervisor: the credentials'
//! reload, the hub's polling, the metrics port and, once the database is
//! ready, the listener, the probe, readiness and the sweeper.
//!
//! One cancellation token stops them all. Every task is handed it, or a
//! child of it, and ends on it cooperatively: its loop selects on
//! `cancelled()`. The tasks that must not outlive readiness get the child,
//! which the drain cancels first ([`Supervisor::drain`]), so that nothing
//! turns readiness back to SERVING once it has turned NOT_SERVING; the
//! others, which calls in flight still need while they finish, end once the
//! ports have closed ([`Supervisor::close`]). Each time the supervisor
//! awaits the tasks it stopped for at most [`STOP_BOUND`]; one still running
//! then is logged by name and aborted.
//!
//! A task that panics, or returns before it is asked to, is logged at once
//! with its name. Nothing restarts it: the server runs on without it. The
//! supervisor leaves readiness alone: readiness is the readiness task's,
//! which ends when the listener or the probe it follows ends, leaving
//! readiness as it last set it.

use std::any::Any;
use std::collections::HashMap;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::time::Duration;

use futures_util::FutureExt as _;
use tokio::task::{Id, JoinSet};
use tokio_util::sync::CancellationToken;

/// How long tasks asked to stop may take to end.
const STOP_BOUND: Duration = Duration::from_secs(5);

/// When a task is asked to end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Until {
    /// When the drain begins: what must not outlive readiness (the
    /// listener, the probe, readiness itself, the sweeper) and the
    /// credentials' reload.
    Drain,
    /// When the ports have closed: what calls in flight need until they
    /// finish (the hub's polling), and the metrics port.
    Closed,
}

/// The background tasks of a running server.
pub(super) struct Supervisor {
    /// Those that end when the drain begins; their token is a child of
    /// `closed`'s.
    drain: Tasks,
    /// Those that end once the ports have closed; their token is the one
    /// that stops every task.
    closed: Tasks,
}

/// Tasks that share a stop token.
struct Tasks {
    stop: CancellationToken,
    running: JoinSet<()>,
    /// The name of each task still in `running`.
    names: HashMap<Id, &'static str>,
}

impl Supervisor {
    pub(super) fn new() -> Supervisor {
        let closed = Tasks::new(CancellationToken::new());
        let drain = Tasks::new(closed.stop.child_token());
        Supervisor { drain, closed }
    }

    /// Spawns the task `task` makes of the stop token it is handed; it
    /// should end soon after that token is cancelled, which happens at
    /// `until`. `name` is how the logs call it.
    pub(super) fn spawn<F>(
        &mut self,
        name: &'static str,
        until: Until,
        task: impl FnOnce(CancellationToken) -> F,
    ) where
        F: Future<Output = ()> + Send + 'static,
    {
        match until {
            Until::Drain => self.drain.spawn(name, task),
            Until::Closed => self.closed.spawn(name, task),
        }
    }

    /// Stops the tasks that must not outlive readiness, and waits for them
    /// (within [`STOP_BOUND`]).
    pub(super) async fn drain(&mut self) {
        self.drain.stop().await;
    }

    /// Stops every task left, and waits for them (within [`STOP_BOUND`]).
    pub(super) async fn close(mut self) {
        self.drain.stop().await;
        self.closed.stop().await;
    }
}

impl Tasks {
    fn new(stop: CancellationToken) -> Tasks {
        Tasks {
            stop,
            running: JoinSet::new(),
            names: HashMap::new(),
        }
    }

    fn spawn<F>(&mut self, name: &'static str, task: impl FnOnce(CancellationToken) -> F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let stop = self.stop.clone();
        let task = AssertUnwindSafe(task(stop.clone())).catch_unwind();
        let handle = self.running.spawn(async move {
            match task.await {
                Ok(()) if stop.is_cancelled() => {
                    tracing::debug!(task = name, "background task stopped");
                }
                Ok(()) => tracing::error!(
                    task = name,
                    "background task ended before it was asked to; the server runs on without it"
                ),
                Err(panic) => tracing::error!(
                    task = name,
                    panic = panic_message(panic.as_ref()),
                    "background task panicked; the server runs on without it"
                ),
            }
        });
        self.names.insert(handle.id(), name);
    }

    /// Cancels the token and waits for the tasks to end, for at most
    /// [`STOP_BOUND`]; those still running then are logged and aborted.
    async fn stop(&mut self) {
        self.stop.cancel();
        let deadline = tokio::time::Instant::now() + STOP_BOUND;
        loop {
            match tokio::time::timeout_at(deadline, self.running.join_next_with_id()).await {
                Ok(Some(ended)) => {
                    let id = match ended {
                        Ok((id, ())) => id,
                        Err(e) => e.id(),
                    };
                    self.names.remove(&id);
                }
                Ok(None) => return,
                Err(_) => break,
            }
        }
        for name in self.names.values() {
            tracing::warn!(
                task = name,
                bound = ?STOP_BOUND,
                "background task did not stop in time; aborting it"
            );
        }
        self.running.abort_all();
        self.names.clear();
    }
}

/// What a panic said, when it said it in words.
fn panic_message(panic: &(dyn Any + Send)) -> &str {
    panic
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("(no message)")
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    /// A task that counts itself out in `ended` once its token is
    /// cancelled.
    fn counted(ended: &Arc<AtomicUsize>) -> impl FnOnce(CancellationToken) -> BoxedTask {
        let ended = Arc::clone(ended);
        move |stop| {
            Box::pin(async move {
                stop.cancelled().await;
                ended.fetch_add(1, Ordering::SeqCst);
            })
        }
    }

    type BoxedTask = std::pin::Pin<Box<dyn Future<Output = ()> + Send>>;

    #[tokio::test]
    async fn the_drain_stops_its_tasks_and_close_the_rest() {
        let (drained, closed) = (Arc::default(), Arc::default());
        let mut supervisor = Supervisor::new();
        supervisor.spawn("a", Until::Drain, counted(&drained));
        supervisor.spawn("b", Until::Drain, counted(&drained));
        supervisor.spawn("c", Until::Closed, counted(&closed));
        supervisor.drain().await;
        assert_eq!(drained.load(Ordering::SeqCst), 2);
        assert_eq!(closed.load(Ordering::SeqCst), 0);
        supervisor.close().await;
        assert_eq!(closed.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_task_that_panics_or_ends_early_leaves_the_others_running() {
        let closed = Arc::default();
        let mut supervisor = Supervisor::new();
        supervisor.spawn("panics", Until::Drain, |_| async { panic!("boom") });
        supervisor.spawn("returns", Until::Closed, |_| async {});
        supervisor.spawn("stays", Until::Closed, counted(&closed));
        tokio::task::yield_now().await;
        supervisor.close().await;
        assert_eq!(closed.load(Ordering::SeqCst), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_task_that_ignores_its_token_is_aborted_after_the_bound() {
        let mut supervisor = Supervisor::new();
        let dropped = Arc::new(AtomicUsize::new(0));
        let guard = Counted(Arc::clone(&dropped));
        supervisor.spawn("deaf", Until::Closed, move |_| async move {
            let _guard = guard;
            std::future::pending::<()>().await;
        });
        let started = tokio::time::Instant::now();
        supervisor.close().await;
        assert_eq!(started.elapsed(), STOP_BOUND);
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert_eq!(dropped.load(Ordering::SeqCst), 1, "aborted");
    }

    /// Counts its drop.
    struct Counted(Arc<AtomicUsize>);

    impl Drop for Counted {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
}

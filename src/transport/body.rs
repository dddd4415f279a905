//! What a request may make the server hold: its bytes count against one
//! budget for the whole server as they arrive and for as long as its call
//! holds them ([`Held`]: decoded, waiting for the database, then as its
//! answer), its gRPC messages against a size limit read from their 5-byte
//! prefix (before the message itself arrives), and its body against a time
//! limit.

use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::{Buf, Bytes};
use http_body::{Body, Frame, SizeHint};
use tokio::time::{Instant, Sleep};

use crate::error::Error;
use crate::metrics;

/// Request bytes held while requests arrive, at most: the whole server's
/// (one pool), or one tenant's or one connection's share of it.
pub struct ByteBudget {
    used: AtomicUsize,
    limit: usize,
    /// What a refusal for want of room in this budget is counted as (the
    /// `reason` label of the refusal metric).
    full: Full,
}

/// Which budget had no room for a request's bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Full {
    /// The server's pool (`--max-inflight-request-mib`, or the health and
    /// reflection budget).
    Server,
    /// The caller's tenant's share of the pool.
    Tenant,
    /// The connection's share (HTTP/JSON bodies).
    Connection,
}

impl Full {
    /// The refusal metric's reason.
    pub fn reason(self) -> &'static str {
        match self {
            Full::Server => "overloaded",
            Full::Tenant => "tenant_share",
            Full::Connection => "connection_share",
        }
    }
}

impl ByteBudget {
    /// The server's pool of `limit` bytes.
    pub fn new(limit: usize) -> Arc<Self> {
        Self::share(limit, Full::Server)
    }

    /// A share of `limit` bytes that also bounds what one party holds of a
    /// pool; refusals for want of room in it are counted as `full`.
    pub fn share(limit: usize, full: Full) -> Arc<Self> {
        Arc::new(ByteBudget {
            used: AtomicUsize::new(0),
            limit,
            full,
        })
    }

    /// Bytes held now.
    #[cfg(test)]
    fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    fn take(&self, bytes: usize) -> bool {
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(bytes).filter(|total| *total <= self.limit)
            })
            .is_ok()
    }

    fn give_back(&self, bytes: usize) {
        self.used.fetch_sub(bytes, Ordering::AcqRel);
    }

    /// `bytes` of the budget, if they are free; given back when dropped.
    pub fn reserve(self: &Arc<Self>, bytes: usize) -> Option<Reservation> {
        let mut reservation = self.reserve_empty(Vec::new());
        reservation.grow(bytes).ok().map(|()| reservation)
    }

    /// No bytes yet of this budget and of each of `shares`, which bound the
    /// same bytes again (a tenant's, a connection's); [`Reservation::grow`]
    /// takes from all of them as bytes arrive.
    pub fn reserve_empty(self: &Arc<Self>, shares: Vec<Arc<ByteBudget>>) -> Reservation {
        Reservation {
            budget: Arc::clone(self),
            shares,
            bytes: 0,
        }
    }
}

/// Bytes of a [`ByteBudget`] (and of the shares that bound them), given
/// back when dropped.
pub struct Reservation {
    budget: Arc<ByteBudget>,
    /// Shares counted with the budget, in the order they are tried.
    shares: Vec<Arc<ByteBudget>>,
    bytes: usize,
}

impl Reservation {
    /// Takes `bytes` more of the budget and of every share, if they are
    /// free in all; otherwise takes nothing and says which was full.
    pub fn grow(&mut self, bytes: usize) -> Result<(), Full> {
        for (n, share) in self.shares.iter().enumerate() {
            if !share.take(bytes) {
                self.shares[..n].iter().for_each(|s| s.give_back(bytes));
                return Err(share.full);
            }
        }
        if !self.budget.take(bytes) {
            self.shares.iter().for_each(|s| s.give_back(bytes));
            return Err(self.budget.full);
        }
        self.bytes += bytes;
        Ok(())
    }

    /// Takes `bytes` more of the budget and of every share whether or not
    /// they are free: for bytes the server holds already (an answer built),
    /// which then keep later requests out until they are given back.
    fn add(&mut self, bytes: usize) {
        self.budget.used.fetch_add(bytes, Ordering::AcqRel);
        for share in &self.shares {
            share.used.fetch_add(bytes, Ordering::AcqRel);
        }
        self.bytes += bytes;
    }

    /// Holds `bytes` from now on: gives back what is over, takes what is
    /// missing (whether or not it is free, as [`Reservation::add`]).
    fn resize_to(&mut self, bytes: usize) {
        match bytes.checked_sub(self.bytes) {
            Some(more) => self.add(more),
            None => self.shrink_to(bytes),
        }
    }

    /// Gives back all but `keep` bytes.
    fn shrink_to(&mut self, keep: usize) {
        if self.bytes > keep {
            let returned = self.bytes - keep;
            self.budget.give_back(returned);
            self.shares.iter().for_each(|s| s.give_back(returned));
            self.bytes = keep;
        }
    }

    /// An empty share of the same budget and shares.
    pub fn empty(&self) -> Reservation {
        Reservation {
            budget: Arc::clone(&self.budget),
            shares: self.shares.clone(),
            bytes: 0,
        }
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.shrink_to(0);
    }
}

/// A call's [`Reservation`], held by its request body while it arrives and
/// by its answer until that has been sent, whichever lets go last: what a
/// call holds after its body is in (the decoded request, a result waiting
/// for the database, the answer waiting for the client) stays counted.
#[derive(Clone)]
pub struct Held(Arc<Mutex<Reservation>>);

impl Held {
    pub fn new(reservation: Reservation) -> Self {
        Held(Arc::new(Mutex::new(reservation)))
    }

    fn lock(&self) -> MutexGuard<'_, Reservation> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Bytes held now.
    pub fn bytes(&self) -> usize {
        self.lock().bytes
    }

    /// The answer has begun: `request` bytes (the headers' charge and the
    /// request's messages, which are gone once the service answered) are
    /// held from now on as `kept` for the headers plus `answer` bytes, the
    /// answer's so far; what that is over the budget is counted anyway,
    /// since the answer exists already, and keeps later calls out.
    pub fn answering(&self, kept: usize, answer: usize) {
        self.lock().resize_to(kept + answer);
    }
}

/// How a request body's time limit runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pace {
    /// The whole body (one message, then its end) arrives within the limit
    /// of the request's arrival, and holds its bytes until it is dropped.
    Whole,
    /// Each message arrives within the limit of its first byte, and gives
    /// its bytes back once complete: a stream that sends a message now and
    /// then (reflection) may stay open between them.
    EachMessage,
}

/// The limits one request body is held to.
#[derive(Debug, Clone)]
pub struct BodyLimits {
    /// The largest gRPC message, in bytes.
    pub max_message: usize,
    /// The longest a body (or a message, by [`Pace`]) may take to arrive.
    pub timeout: Duration,
    /// Whether `timeout` covers the whole body or runs afresh for each
    /// message.
    pub pace: Pace,
    /// Names the flag that sets `max_message`, for the caller's error.
    pub max_message_flag: &'static str,
    /// The port the request came in on, for the refusal metric.
    pub port: metrics::Port,
    /// Where a refusal is counted.
    pub metrics: metrics::Metrics,
}

/// Follows the gRPC framing (1 flag byte, 4 length bytes, the message) of
/// a body's bytes.
#[derive(Debug, Default)]
struct Framing {
    prefix: [u8; 5],
    prefix_len: usize,
    /// Bytes of the current message still to come, once its prefix is read.
    remaining: usize,
}

impl Framing {
    /// Reads `data`; returns how many messages it completed, or the declared
    /// length of a message over `max`.
    fn feed(&mut self, mut data: &[u8], max: usize) -> Result<usize, usize> {
        let mut completed = 0;
        while !data.is_empty() {
            if self.prefix_len < 5 {
                let n = (5 - self.prefix_len).min(data.len());
                self.prefix[self.prefix_len..self.prefix_len + n].copy_from_slice(&data[..n]);
                self.prefix_len += n;
                data = &data[n..];
                if self.prefix_len < 5 {
                    break;
                }
                let len = u32::from_be_bytes([
                    self.prefix[1],
                    self.prefix[2],
                    self.prefix[3],
                    self.prefix[4],
                ]) as usize;
                if len > max {
                    return Err(len);
                }
                self.remaining = len;
            } else {
                let n = self.remaining.min(data.len());
                self.remaining -= n;
                data = &data[n..];
            }
            if self.prefix_len == 5 && self.remaining == 0 {
                completed += 1;
                self.prefix_len = 0;
            }
        }
        Ok(completed)
    }

    /// Whether part of a message has arrived and the rest has not.
    fn in_message(&self) -> bool {
        self.prefix_len > 0
    }
}

/// A request body held to [`BodyLimits`] and the server's [`ByteBudget`].
/// Its refusals are `tonic::Status` errors, which tonic answers the call with.
pub struct GuardedBody<B> {
    inner: B,
    /// The bytes held for this request: `kept` for its headers, the rest
    /// for its message bytes received so far.
    reservation: Held,
    kept: usize,
    framing: Framing,
    limits: BodyLimits,
    /// When the part now arriving must be complete; `None` while nothing is
    /// expected (between messages of an [`Pace::EachMessage`] stream, or
    /// after the end).
    deadline: Option<Instant>,
    timer: Option<Pin<Box<Sleep>>>,
    done: bool,
}

impl<B> GuardedBody<B> {
    pub fn new(inner: B, reservation: Held, limits: BodyLimits) -> Self {
        let deadline = match limits.pace {
            Pace::Whole => Some(Instant::now() + limits.timeout),
            Pace::EachMessage => None,
        };
        GuardedBody {
            inner,
            kept: reservation.bytes(),
            reservation,
            framing: Framing::default(),
            limits,
            deadline,
            timer: None,
            done: false,
        }
    }

    fn fail(
        &mut self,
        (error, reason): (Error, &'static str),
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        super::refused(&self.limits.metrics, self.limits.port, reason);
        self.done = true;
        self.deadline = None;
        self.timer = None;
        self.reservation.lock().shrink_to(0);
        Poll::Ready(Some(Err(Box::new(tonic::Status::from(error)))))
    }

    /// Counts a data frame's bytes; an error (and the refusal metric's
    /// reason) refuses the request.
    fn admit(&mut self, data: &Bytes) -> Result<(), (Error, &'static str)> {
        if self.deadline.is_none() && !data.is_empty() {
            self.deadline = Some(Instant::now() + self.limits.timeout);
        }
        if let Err(full) = self.reservation.lock().grow(data.len()) {
            return Err((Error::Overloaded, full.reason()));
        }
        let completed = self
            .framing
            .feed(data.chunk(), self.limits.max_message)
            .map_err(|declared| {
                let error = Error::RequestTooLarge {
                    declared,
                    limit: self.limits.max_message,
                    flag: self.limits.max_message_flag,
                };
                (error, "too_large")
            })?;
        if completed > 0 && self.limits.pace == Pace::EachMessage {
            // Whole messages go on to their decoder at once: their bytes are
            // no longer waiting on the network.
            // A message begun in the same frame has its own time limit.
            self.reservation.lock().shrink_to(self.kept);
            self.deadline = self
                .framing
                .in_message()
                .then(|| Instant::now() + self.limits.timeout);
        }
        Ok(())
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl<B> Body for GuardedBody<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        if this.done {
            return Poll::Ready(None);
        }
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref()
                    && let Err(e) = this.admit(data)
                {
                    return this.fail(e);
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e.into()))),
            Poll::Ready(None) => {
                this.done = true;
                this.deadline = None;
                this.timer = None;
                Poll::Ready(None)
            }
            Poll::Pending => {
                let Some(deadline) = this.deadline else {
                    return Poll::Pending;
                };
                let timer = this
                    .timer
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
                if timer.deadline() != deadline {
                    timer.as_mut().reset(deadline);
                }
                ready!(timer.as_mut().poll(cx));
                let timeout = this.limits.timeout;
                this.fail((Error::RequestTooSlow(timeout), "too_slow"))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(len: usize) -> Vec<u8> {
        let mut m = vec![0u8];
        m.extend_from_slice(&(len as u32).to_be_bytes());
        m.extend(std::iter::repeat_n(7u8, len));
        m
    }

    #[test]
    fn framing_counts_messages_across_any_split() {
        let mut bytes = message(3);
        bytes.extend(message(0));
        bytes.extend(message(10));
        for split in 0..bytes.len() {
            let mut f = Framing::default();
            let a = f.feed(&bytes[..split], 100).unwrap();
            let b = f.feed(&bytes[split..], 100).unwrap();
            assert_eq!(a + b, 3, "split at {split}");
            assert!(!f.in_message());
        }
    }

    #[test]
    fn framing_refuses_a_declared_length_over_the_limit_before_the_message() {
        let mut f = Framing::default();
        assert_eq!(f.feed(&message(101)[..5], 100), Err(101));
    }

    #[test]
    fn the_budget_refuses_past_its_limit_and_takes_back_what_is_dropped() {
        let budget = ByteBudget::new(100);
        let a = budget.reserve(60).unwrap();
        assert!(budget.reserve(41).is_none());
        let mut b = budget.reserve(40).unwrap();
        assert_eq!(b.grow(1), Err(Full::Server));
        drop(a);
        assert_eq!(b.grow(60), Ok(()));
        b.shrink_to(10);
        assert_eq!(budget.used(), 10);
        drop(b);
        assert_eq!(budget.used(), 0);
    }

    #[test]
    fn a_share_bounds_its_party_and_a_refusal_takes_nothing() {
        let pool = ByteBudget::new(100);
        let tenant = ByteBudget::share(50, Full::Tenant);
        let connection = ByteBudget::share(30, Full::Connection);
        let mut a = pool.reserve_empty(vec![Arc::clone(&tenant), Arc::clone(&connection)]);
        assert_eq!(a.grow(30), Ok(()));
        assert_eq!(a.grow(1), Err(Full::Connection));
        let mut b = pool.reserve_empty(vec![Arc::clone(&tenant)]);
        assert_eq!(b.grow(21), Err(Full::Tenant));
        assert_eq!(b.grow(20), Ok(()));
        let mut other = pool.reserve_empty(Vec::new());
        assert_eq!(other.grow(51), Err(Full::Server));
        assert_eq!(other.grow(50), Ok(()));
        assert_eq!(
            (pool.used(), tenant.used(), connection.used()),
            (100, 50, 30)
        );
        drop(a);
        assert_eq!((pool.used(), tenant.used(), connection.used()), (70, 20, 0));
        drop((b, other));
        assert_eq!(pool.used(), 0);
        assert_eq!(tenant.used(), 0);
    }
}

//! The body budget: the bytes of keyed request bodies held at once (they
//! are held whole, for the fingerprint, until the request is answered),
//! charged in KiB as they arrive, never by a declared length; and each
//! client's share of it, by its `--tenant-header` value when it sends one,
//! else by its address, so that one client's slow or large bodies cannot
//! take the others' room. A body must also keep arriving: a pause longer
//! than the body idle timeout between two of its chunks ends it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::HeaderName;
use http::request::Parts;
use hyper::body::Incoming;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::body::{self, Refused};
use crate::conn::OnConn;
use crate::problem::Problem;

/// The budget and its shares.
pub struct BodyBudget {
    /// The room left in all, in KiB.
    total: Arc<Semaphore>,
    /// The most one client's bodies hold at once, in KiB.
    share_kib: u32,
    /// What each client's bodies hold now, in KiB; an entry leaves at zero.
    clients: Mutex<HashMap<Vec<u8>, u32>>,
    /// The longest pause between two chunks of a body.
    pub idle_timeout: Duration,
}

/// What one body holds of the budget; given back when dropped.
pub struct Held {
    /// The budget it is held in.
    budget: Arc<BodyBudget>,
    /// Whose share it counts in.
    client: Vec<u8>,
    /// KiB held.
    kib: u32,
    /// The same KiB, in the budget's semaphore.
    permit: Option<OwnedSemaphorePermit>,
}

impl BodyBudget {
    /// A budget of `total_kib`, of which one client holds at most
    /// `share_kib`; bodies pause at most `idle_timeout` between chunks.
    pub fn new(total_kib: u32, share_kib: u32, idle_timeout: Duration) -> Arc<BodyBudget> {
        Arc::new(BodyBudget {
            total: Arc::new(Semaphore::new(total_kib as usize)),
            share_kib: share_kib.clamp(1, total_kib.max(1)),
            clients: Mutex::new(HashMap::new()),
            idle_timeout,
        })
    }

    /// One KiB for a body from `client` (its head's worth), or `None` when
    /// the budget or the client's share is full.
    pub fn hold(self: &Arc<Self>, client: Vec<u8>) -> Option<Held> {
        let mut held = Held {
            budget: Arc::clone(self),
            client,
            kib: 0,
            permit: None,
        };
        held.grow_to(1).then_some(held)
    }
}

impl Held {
    /// Holds room for `bytes` in all (more, never less); `false` when the
    /// budget or the client's share has no room for them.
    pub fn grow_to(&mut self, bytes: usize) -> bool {
        let want = u32::try_from(bytes.div_ceil(1024))
            .unwrap_or(u32::MAX)
            .max(1);
        if want <= self.kib {
            return true;
        }
        let more = want - self.kib;
        let budget = &self.budget;
        {
            let Ok(mut clients) = budget.clients.lock() else {
                return false;
            };
            let holds = clients.entry(self.client.clone()).or_default();
            if holds.saturating_add(more) > budget.share_kib {
                if *holds == 0 {
                    clients.remove(&self.client);
                }
                return false;
            }
            *holds += more;
        }
        match Arc::clone(&budget.total).try_acquire_many_owned(more) {
            Ok(permit) => {
                match &mut self.permit {
                    Some(held) => held.merge(permit),
                    None => self.permit = Some(permit),
                }
                self.kib = want;
                true
            }
            Err(_) => {
                self.give_back(more);
                false
            }
        }
    }

    /// Takes `kib` off the client's share.
    fn give_back(&self, kib: u32) {
        if let Ok(mut clients) = self.budget.clients.lock()
            && let Some(holds) = clients.get_mut(&self.client)
        {
            *holds = holds.saturating_sub(kib);
            if *holds == 0 {
                clients.remove(&self.client);
            }
        }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.give_back(self.kib);
    }
}

/// Whose share a request's body counts in: its `tenant_header`'s value
/// when the sidecar has one and the request sends it, else its address.
fn client_of(tenant_header: Option<&HeaderName>, head: &Parts) -> Vec<u8> {
    let tenant = tenant_header.and_then(|name| head.headers.get(name));
    match tenant {
        Some(value) => [b"t:".as_slice(), value.as_bytes()].concat(),
        None => {
            let ip = head.extensions.get::<OnConn>().map(|c| c.0.peer.ip());
            format!("a:{ip:?}").into_bytes()
        }
    }
}

/// Why a keyed request's body was not read: the problem, its detail, and
/// when to retry.
pub type NotRead = (Problem, String, Option<Duration>);

/// How a keyed request's body is read: whose share it counts in (the
/// `--tenant-header`), and how long it may take to arrive.
#[derive(Debug, Clone, Copy)]
pub struct ReadLimits<'a> {
    /// The client header whose value names the share.
    pub tenant_header: Option<&'a HeaderName>,
    /// The most the whole body may take.
    pub timeout: Duration,
    /// The most bytes it may have.
    pub limit: usize,
}

/// Reads a keyed request's body whole, charged to `budget` as it arrives,
/// within the `limits` and the idle timeout between chunks.
pub async fn read(
    budget: &Arc<BodyBudget>,
    head: &Parts,
    incoming: Incoming,
    limits: ReadLimits<'_>,
) -> Result<(Bytes, Held), NotRead> {
    let ReadLimits {
        tenant_header,
        timeout,
        limit,
    } = limits;
    let busy = || {
        let detail = "too many request bodies are held at once; retry";
        (
            Problem::Busy,
            detail.to_owned(),
            Some(Duration::from_secs(1)),
        )
    };
    let mut held = budget
        .hold(client_of(tenant_header, head))
        .ok_or_else(busy)?;
    let charge = |bytes| held.grow_to(bytes);
    let reading = body::read_charged(incoming, limit, charge, budget.idle_timeout);
    let read = tokio::time::timeout(timeout, reading).await;
    let refused = match read {
        Ok(Ok(bytes)) => return Ok((bytes, held)),
        Ok(Err(refused)) => refused,
        Err(_) => Refused::Late(timeout),
    };
    Err(match refused {
        Refused::Busy => busy(),
        Refused::TooLarge => (
            Problem::BodyTooLarge,
            format!("a request with an Idempotency-Key may have at most {limit} bytes of body"),
            None,
        ),
        Refused::Idle(idle) => (
            Problem::BodyTimeout,
            format!("the request body stopped arriving for {idle:?}"),
            None,
        ),
        Refused::Late(timeout) => (
            Problem::BodyTimeout,
            format!("the request body did not arrive within {timeout:?}"),
            None,
        ),
        Refused::Broke(error) => (
            Problem::BodyTimeout,
            format!("the request body broke off: {error}"),
            None,
        ),
    })
}

//! The answer budget: the upstream answers a coordinated request reads
//! whole (to store them), held from their first byte until the client that
//! caused them has been sent them. An answer reserves, before its first
//! byte is read, its length as the upstream declares it (else the largest
//! answer stored), counted [`COPIES`] times: the buffer it is read into,
//! its stored encoding and the Complete message that carries it to the
//! coordinator. An answer that finds no room waits for it (its upstream
//! waits too, within the upstream timeout), so however many large answers
//! come at once, the bytes they hold are bounded.

use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// How many times a byte of an answer is held at the most: read, encoded
/// to be stored, and in the Complete message.
pub const COPIES: usize = 3;

/// What one answer holds of the budget; given back when dropped (when the
/// answer has been sent to its client).
#[derive(Debug)]
pub struct Charge {
    /// The budget's room, in KiB.
    total: Arc<Semaphore>,
    /// The KiB held.
    kib: u32,
    /// The same KiB, in the semaphore.
    permit: Option<OwnedSemaphorePermit>,
    /// The most one answer holds (the whole budget): a larger one waits for
    /// no more than that.
    max_kib: u32,
}

/// The budget of answers held at once.
pub struct AnswerBudget {
    /// The room left, in KiB.
    total: Arc<Semaphore>,
    /// Its size, in KiB.
    kib: u32,
}

impl AnswerBudget {
    /// A budget of `kib` KiB.
    pub fn new(kib: u32) -> AnswerBudget {
        AnswerBudget {
            total: Arc::new(Semaphore::new(kib as usize)),
            kib,
        }
    }

    /// An empty charge, to grow as an answer arrives.
    pub fn charge(&self) -> Charge {
        Charge {
            total: Arc::clone(&self.total),
            kib: 0,
            permit: None,
            max_kib: self.kib,
        }
    }
}

impl Charge {
    /// Holds room for an answer of `bytes` (counted [`COPIES`] times, at
    /// most the whole budget) in one step, waiting for it when the budget
    /// is full: answers that each hold a part while waiting for the rest
    /// could wait for each other for ever.
    pub async fn reserve(&mut self, bytes: usize) {
        let want = u32::try_from(bytes.saturating_mul(COPIES).div_ceil(1024))
            .unwrap_or(u32::MAX)
            .clamp(1, self.max_kib);
        if want <= self.kib {
            return;
        }
        let more = want - self.kib;
        if let Ok(permit) = Arc::clone(&self.total).acquire_many_owned(more).await {
            match &mut self.permit {
                Some(held) => held.merge(permit),
                None => self.permit = Some(permit),
            }
            self.kib = want;
        }
    }
}

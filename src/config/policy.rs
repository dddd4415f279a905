//! The defaults and limits applied to every request (leases, attempts,
//! retention, backoff, results, waits), their defaults from
//! `Policy::default()`.

use clap::Args;

use super::hd;
use crate::domain::{Backoff, Policy};

/// The defaults and limits applied to every request.
#[derive(Debug, Clone, Args)]
pub struct PolicyArgs {
    /// Lease length for an Acquire that leaves lease_ttl unset.
    #[arg(long, env = "IDEMPOTENCY_DEFAULT_LEASE_TTL", default_value_t = hd(Policy::default().default_lease_ttl))]
    pub default_lease_ttl: humantime::Duration,

    /// The longest lease an Acquire may ask for, and how far ExtendLease may
    /// push a lease from now.
    #[arg(long, env = "IDEMPOTENCY_MAX_LEASE_TTL", default_value_t = hd(Policy::default().max_lease_ttl))]
    pub max_lease_ttl: humantime::Duration,

    /// Attempts allowed for a record whose Acquire leaves max_attempts at 0.
    #[arg(long, env = "IDEMPOTENCY_DEFAULT_MAX_ATTEMPTS", default_value_t = Policy::default().default_max_attempts)]
    pub default_max_attempts: u32,

    /// The most attempts an Acquire may ask for.
    #[arg(long, env = "IDEMPOTENCY_MAX_ATTEMPTS_LIMIT", default_value_t = Policy::default().max_max_attempts)]
    pub max_attempts_limit: u32,

    /// How long a record is kept after its last change when the Acquire that
    /// created it leaves retention unset.
    #[arg(long, env = "IDEMPOTENCY_DEFAULT_RETENTION", default_value_t = hd(Policy::default().default_retention))]
    pub default_retention: humantime::Duration,

    /// The longest retention an Acquire may ask for.
    #[arg(long, env = "IDEMPOTENCY_MAX_RETENTION", default_value_t = hd(Policy::default().max_retention))]
    pub max_retention: humantime::Duration,

    /// Retry delay after a first failed attempt; doubles with each attempt.
    #[arg(long, env = "IDEMPOTENCY_BACKOFF_BASE", default_value_t = hd(Policy::default().backoff.base))]
    pub backoff_base: humantime::Duration,

    /// The longest retry delay the backoff reaches.
    #[arg(long, env = "IDEMPOTENCY_BACKOFF_CAP", default_value_t = hd(Policy::default().backoff.cap))]
    pub backoff_cap: humantime::Duration,

    /// The largest result a Complete may store, in bytes.
    #[arg(long, env = "IDEMPOTENCY_MAX_RESULT_BYTES", default_value_t = Policy::default().max_result_bytes)]
    pub max_result_bytes: usize,

    /// The longest an Acquire may wait for a holder (longer waits are cut).
    #[arg(long, env = "IDEMPOTENCY_MAX_WAIT", default_value_t = hd(Policy::default().max_wait))]
    pub max_wait: humantime::Duration,

    /// The longest window of a Watch stream (longer requests are cut).
    #[arg(long, env = "IDEMPOTENCY_MAX_WATCH", default_value_t = hd(Policy::default().max_watch))]
    pub max_watch: humantime::Duration,
}

impl PolicyArgs {
    /// The policy these flags give.
    pub(super) fn policy(&self) -> Policy {
        Policy {
            default_lease_ttl: self.default_lease_ttl.into(),
            max_lease_ttl: self.max_lease_ttl.into(),
            default_max_attempts: self.default_max_attempts,
            max_max_attempts: self.max_attempts_limit,
            default_retention: self.default_retention.into(),
            max_retention: self.max_retention.into(),
            backoff: Backoff {
                base: self.backoff_base.into(),
                cap: self.backoff_cap.into(),
            },
            max_result_bytes: self.max_result_bytes,
            max_wait: self.max_wait.into(),
            max_watch: self.max_watch.into(),
            ..Policy::default()
        }
    }
}

//! The server's defaults and limits for what callers may ask, and how a
//! request's optional values resolve against them.

use std::time::Duration;

use super::InvalidInput;

/// Exponential backoff between failed attempts: `min(base * 2^(attempt-1), cap)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// The delay after the first failed attempt.
    pub base: Duration,
    /// No delay is longer than this.
    pub cap: Duration,
}

/// Defaults and limits, set once from configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    /// Lease length when a request leaves `lease_ttl` unset.
    pub default_lease_ttl: Duration,
    /// The shortest lease a request may ask for.
    pub min_lease_ttl: Duration,
    /// The longest lease a request may ask for, and how far ExtendLease may
    /// push a lease from now.
    pub max_lease_ttl: Duration,
    /// Attempts allowed when a request leaves `max_attempts` at zero.
    pub default_max_attempts: u32,
    /// The most attempts a request may ask for.
    pub max_max_attempts: u32,
    /// Retention when a request leaves `retention` unset.
    pub default_retention: Duration,
    /// The shortest retention a request may ask for.
    pub min_retention: Duration,
    /// The longest retention a request may ask for.
    pub max_retention: Duration,
    /// Delay between failed attempts.
    pub backoff: Backoff,
    /// The longest `retry_after` a Failure may set.
    pub max_retry_after: Duration,
    /// The largest result a Success may store, in bytes.
    pub max_result_bytes: usize,
    /// The largest checkpoint ExtendLease may store, in bytes.
    pub max_checkpoint_bytes: usize,
    /// The longest an Acquire may wait for a holder.
    pub max_wait: Duration,
    /// A Watch window when the request leaves `timeout` unset.
    pub default_watch: Duration,
    /// The longest Watch window.
    pub max_watch: Duration,
}

impl Default for Policy {
    /// The defaults of the API contract.
    fn default() -> Self {
        Policy {
            default_lease_ttl: Duration::from_secs(15 * 60),
            min_lease_ttl: Duration::from_secs(1),
            max_lease_ttl: Duration::from_secs(24 * 3600),
            default_max_attempts: 10,
            max_max_attempts: 1000,
            default_retention: Duration::from_secs(24 * 3600),
            min_retention: Duration::from_secs(60),
            max_retention: Duration::from_secs(30 * 24 * 3600),
            backoff: Backoff {
                base: Duration::from_secs(1),
                cap: Duration::from_secs(3600),
            },
            max_retry_after: Duration::from_secs(30 * 24 * 3600),
            max_result_bytes: 1024 * 1024,
            max_checkpoint_bytes: 64 * 1024,
            max_wait: Duration::from_secs(60),
            default_watch: Duration::from_secs(30),
            max_watch: Duration::from_secs(5 * 60),
        }
    }
}

fn within(
    requested: Duration,
    min: Duration,
    max: Duration,
    unit_hint: &str,
) -> Result<Duration, InvalidInput> {
    if requested < min || requested > max {
        return Err(InvalidInput(format!(
            "must be between {} and {}{unit_hint}, got {}",
            humantime::format_duration(min),
            humantime::format_duration(max),
            humantime::format_duration(requested),
        )));
    }
    Ok(requested)
}

impl Policy {
    /// Checks that the policy's own numbers make sense (defaults within
    /// limits), so a misconfigured server refuses to start instead of
    /// refusing every request.
    pub fn check(&self) -> Result<(), String> {
        let mut problems = Vec::new();
        if !(self.min_lease_ttl..=self.max_lease_ttl).contains(&self.default_lease_ttl) {
            problems.push("the default lease TTL is outside the lease limits");
        }
        if self.min_lease_ttl.is_zero() {
            problems.push("the minimum lease TTL must be more than zero");
        }
        if !(1..=self.max_max_attempts).contains(&self.default_max_attempts) {
            problems.push("the default max attempts is outside 1..=max");
        }
        if !(self.min_retention..=self.max_retention).contains(&self.default_retention) {
            problems.push("the default retention is outside the retention limits");
        }
        if self.backoff.base > self.backoff.cap {
            problems.push("the backoff base is longer than its cap");
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(problems.join("; "))
        }
    }

    /// `None` (unset or zero) takes the default.
    pub fn lease_ttl(&self, requested: Option<Duration>) -> Result<Duration, InvalidInput> {
        match requested {
            None => Ok(self.default_lease_ttl),
            Some(d) => within(d, self.min_lease_ttl, self.max_lease_ttl, ""),
        }
    }

    /// Zero takes the default.
    pub fn max_attempts(&self, requested: u32) -> Result<u32, InvalidInput> {
        match requested {
            0 => Ok(self.default_max_attempts),
            n if n <= self.max_max_attempts => Ok(n),
            n => Err(InvalidInput(format!(
                "must be between 1 and {}, got {n}",
                self.max_max_attempts
            ))),
        }
    }

    /// `None` (unset or zero) takes the default.
    pub fn retention(&self, requested: Option<Duration>) -> Result<Duration, InvalidInput> {
        match requested {
            None => Ok(self.default_retention),
            Some(d) => within(d, self.min_retention, self.max_retention, ""),
        }
    }

    /// A wait longer than the server allows is cut to the maximum: waiting
    /// less than asked never breaks the caller, who gets IN_PROGRESS at the
    /// end of the window either way.
    pub fn wait(&self, requested: Option<Duration>) -> Duration {
        requested.unwrap_or_default().min(self.max_wait)
    }

    /// A Watch window: unset takes the default, longer than the maximum is
    /// cut to it.
    pub fn watch_window(&self, requested: Option<Duration>) -> Duration {
        requested.unwrap_or(self.default_watch).min(self.max_watch)
    }

    /// How far ExtendLease pushes a lease; at least the minimum lease.
    pub fn extend_by(&self, requested: Option<Duration>) -> Result<Duration, InvalidInput> {
        match requested {
            None => Err(InvalidInput(
                "is required: how much longer the lease should last".to_owned(),
            )),
            Some(d) => within(
                d,
                self.min_lease_ttl,
                self.max_lease_ttl,
                " (a lease never reaches further than the maximum from now)",
            ),
        }
    }

    /// A failure's own retry delay; zero means due at once.
    pub fn retry_after(&self, requested: Duration) -> Result<Duration, InvalidInput> {
        within(requested, Duration::ZERO, self.max_retry_after, "")
    }

    pub fn result_size(&self, len: usize) -> Result<(), InvalidInput> {
        if len > self.max_result_bytes {
            return Err(InvalidInput(format!(
                "is {len} bytes, more than the limit of {} bytes; store it elsewhere and pass result_ref",
                self.max_result_bytes
            )));
        }
        Ok(())
    }

    pub fn checkpoint_size(&self, len: usize) -> Result<(), InvalidInput> {
        if len > self.max_checkpoint_bytes {
            return Err(InvalidInput(format!(
                "is {len} bytes, more than the limit of {} bytes",
                self.max_checkpoint_bytes
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_contract_defaults_are_consistent() {
        assert_eq!(Policy::default().check(), Ok(()));
    }

    #[test]
    fn unset_values_take_defaults_and_out_of_range_values_are_refused() {
        let p = Policy::default();
        assert_eq!(p.lease_ttl(None).unwrap(), Duration::from_secs(900));
        assert!(p.lease_ttl(Some(Duration::from_secs(25 * 3600))).is_err());
        assert!(p.lease_ttl(Some(Duration::from_millis(999))).is_err());
        assert_eq!(p.max_attempts(0).unwrap(), 10);
        assert!(p.max_attempts(1001).is_err());
        assert!(p.retention(Some(Duration::from_secs(59))).is_err());
        assert_eq!(
            p.wait(Some(Duration::from_secs(600))),
            Duration::from_secs(60)
        );
    }

    #[test]
    fn a_default_outside_its_limits_is_caught() {
        let p = Policy {
            default_lease_ttl: Duration::from_secs(48 * 3600),
            ..Policy::default()
        };
        assert!(p.check().is_err());
    }
}

/// How many calls may wait at once on one server process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WaiterLimits {
    /// All tenants together.
    pub total: usize,
    /// One tenant, so that one tenant cannot take every place.
    pub per_tenant: usize,
}

/// Why a call may not wait now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TooManyWaiters {
    #[error("too many calls wait on this server; try again shortly")]
    Server,
    #[error("too many calls of this tenant wait on this server; try again shortly")]
    Tenant,
}

//! Failed console logins, counted per client address (an IPv6 address by
//! its /64, which one machine commonly holds whole): after
//! [`MAX_FAILURES`] in a [`WINDOW`], the address's logins are refused
//! (429, without looking at the token) until the window ends. Each failure
//! and refusal is counted in `idempotency_requests_refused_total` and
//! logged, at most one line a second (the others counted in it). Behind a
//! proxy every client has the proxy's address, and they share its count.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Failed logins an address may make in a window.
pub(super) const MAX_FAILURES: u32 = 10;
/// The window failures are counted in.
pub(super) const WINDOW: Duration = Duration::from_secs(60);
/// Addresses counted at most; past it (after the ended windows are
/// dropped), new addresses share one count.
const MAX_ADDRESSES: usize = 10_000;
/// The shared count's key.
const OVERFLOW: IpAddr = IpAddr::V6(Ipv6Addr::UNSPECIFIED);
/// A log line about failed logins at most this often.
const LOG_INTERVAL: Duration = Duration::from_secs(1);

/// One address's failures in its current window.
struct Window {
    /// When the window began: at the first failure after the last one ended.
    start: Instant,
    /// Failures since.
    failures: u32,
}

/// The failed logins of every address.
#[derive(Default)]
pub(super) struct FailedLogins {
    /// The windows, by address.
    windows: Mutex<HashMap<IpAddr, Window>>,
    /// The log lines not written since the last one.
    unlogged: AtomicU64,
    /// When the next log line may be written, in ms since `epoch`.
    next_log_ms: AtomicU64,
    /// When the counting began.
    epoch: OnceInstant,
}

/// An [`Instant`] taken when first asked.
#[derive(Default)]
struct OnceInstant(std::sync::OnceLock<Instant>);

impl OnceInstant {
    fn elapsed_ms(&self) -> u64 {
        let start = self.0.get_or_init(Instant::now);
        u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX)
    }
}

/// The address counted for `ip`.
fn client(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let mut octets = v6.octets();
                octets[8..].fill(0);
                IpAddr::V6(Ipv6Addr::from(octets))
            }
        },
    }
}

impl FailedLogins {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<IpAddr, Window>> {
        self.windows.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// How long `ip`'s logins are still refused; `None`: it may try.
    pub(super) fn refused(&self, ip: IpAddr) -> Option<Duration> {
        let now = Instant::now();
        let windows = self.lock();
        let window = windows
            .get(&client(ip))
            .or_else(|| windows.get(&OVERFLOW))?;
        let left = WINDOW.checked_sub(now.duration_since(window.start))?;
        (window.failures >= MAX_FAILURES && !left.is_zero()).then_some(left)
    }

    /// Counts a failed login from `ip`; the failures in its window.
    pub(super) fn failed(&self, ip: IpAddr) -> u32 {
        let now = Instant::now();
        let mut windows = self.lock();
        let mut address = client(ip);
        if !windows.contains_key(&address) && windows.len() >= MAX_ADDRESSES {
            windows.retain(|_, w| now.duration_since(w.start) < WINDOW);
            if windows.len() >= MAX_ADDRESSES {
                address = OVERFLOW;
            }
        }
        let window = windows.entry(address).or_insert(Window {
            start: now,
            failures: 0,
        });
        if now.duration_since(window.start) >= WINDOW {
            *window = Window {
                start: now,
                failures: 0,
            };
        }
        window.failures += 1;
        window.failures
    }

    /// Logs a failed or refused login from `peer`, unless a line was
    /// written less than [`LOG_INTERVAL`] ago (then it is counted in the
    /// next one).
    pub(super) fn log(&self, peer: Option<IpAddr>, failures: u32, refused: bool) {
        let now = self.epoch.elapsed_ms();
        let next = self.next_log_ms.load(Ordering::Relaxed);
        let interval = u64::try_from(LOG_INTERVAL.as_millis()).unwrap_or(1000);
        if now < next
            || self
                .next_log_ms
                .compare_exchange(next, now + interval, Ordering::AcqRel, Ordering::Relaxed)
                .is_err()
        {
            self.unlogged.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let unlogged = self.unlogged.swap(0, Ordering::Relaxed);
        let peer = peer.map(|ip| ip.to_string()).unwrap_or_default();
        if refused {
            tracing::warn!(
                peer,
                unlogged,
                "console login refused: too many failed logins from this address"
            );
        } else {
            tracing::warn!(peer, failures, unlogged, "console login failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_is_refused_after_max_failures_and_others_are_not() {
        let logins = FailedLogins::default();
        let a: IpAddr = "192.0.2.1".parse().unwrap();
        let b: IpAddr = "192.0.2.2".parse().unwrap();
        for n in 1..=MAX_FAILURES {
            assert!(logins.refused(a).is_none());
            assert_eq!(logins.failed(a), n);
        }
        let left = logins.refused(a).expect("refused");
        assert!(left <= WINDOW && left > WINDOW / 2, "{left:?}");
        assert!(logins.refused(b).is_none());
    }

    #[test]
    fn an_ipv6_address_counts_by_its_64() {
        let logins = FailedLogins::default();
        for i in 0..MAX_FAILURES {
            logins.failed(format!("2001:db8::{i:x}").parse().unwrap());
        }
        assert!(logins.refused("2001:db8::ffff".parse().unwrap()).is_some());
        assert!(logins.refused("2001:db8:0:1::1".parse().unwrap()).is_none());
    }
}

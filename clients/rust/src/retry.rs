//! Backoff between retries of a call, and the retry loop itself.

use std::future::Future;
use std::hash::{BuildHasher as _, Hasher as _};
use std::time::Duration;

use crate::error::CallError;

/// Delays between retries: `initial`, doubling up to `max`, each one
/// jittered to between half and all of its nominal value, and never shorter
/// than the delay the server asked for (RetryInfo).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// The first retry's nominal delay (100 ms).
    pub initial: Duration,
    /// The longest nominal delay (2 s).
    pub max: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            initial: Duration::from_millis(100),
            max: Duration::from_secs(2),
        }
    }
}

impl Backoff {
    /// The nominal delay before retry number `retry` (0 for the first).
    pub fn nominal(&self, retry: u32) -> Duration {
        let factor = 1u32.checked_shl(retry.min(31)).unwrap_or(u32::MAX);
        self.initial.saturating_mul(factor).min(self.max)
    }

    /// The delay to sleep before retry number `retry`: the nominal one with
    /// jitter, at least `server` when the server asked for a delay.
    pub fn delay(&self, retry: u32, server: Option<Duration>) -> Duration {
        let nominal = self.nominal(retry);
        let half = nominal / 2;
        let jittered = half + half.mul_f64(random_fraction());
        jittered.max(server.unwrap_or_default())
    }
}

/// A number in [0, 1), random enough for jitter, without a dependency.
fn random_fraction() -> f64 {
    let bits = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    (bits >> 11) as f64 / (1u64 << 53) as f64
}

/// Runs `call` until it succeeds, fails with an error that is not
/// retryable, or has been retried `max_retries` times.
pub(crate) async fn with_retries<T, F, Fut>(
    backoff: Backoff,
    max_retries: u32,
    mut call: F,
) -> Result<T, CallError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, CallError>>,
{
    let mut retry = 0;
    loop {
        match call().await {
            Err(error) if error.is_retryable() && retry < max_retries => {
                tokio::time::sleep(backoff.delay(retry, error.retry_after)).await;
                retry += 1;
            }
            outcome => return outcome,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    #[test]
    fn nominal_delays_double_up_to_the_cap() {
        let backoff = Backoff::default();
        let ms: Vec<u128> = (0..8).map(|n| backoff.nominal(n).as_millis()).collect();
        assert_eq!(ms, [100, 200, 400, 800, 1600, 2000, 2000, 2000]);
        assert_eq!(backoff.nominal(200), Duration::from_secs(2));
    }

    #[test]
    fn jitter_stays_between_half_and_all_of_the_nominal_delay() {
        let backoff = Backoff::default();
        let mut seen = std::collections::HashSet::new();
        for retry in 0..6 {
            for _ in 0..200 {
                let delay = backoff.delay(retry, None);
                let nominal = backoff.nominal(retry);
                assert!(
                    delay >= nominal / 2 && delay <= nominal,
                    "{delay:?} for {nominal:?}"
                );
                seen.insert(delay);
            }
        }
        assert!(seen.len() > 100, "the delays are jittered");
    }

    #[test]
    fn never_shorter_than_the_server_asks() {
        let backoff = Backoff::default();
        let asked = Duration::from_secs(3);
        assert_eq!(backoff.delay(0, Some(asked)), asked);
        assert!(backoff.delay(0, Some(Duration::from_millis(1))) >= Duration::from_millis(50));
    }

    #[tokio::test]
    async fn retries_only_what_is_retryable_and_only_so_often() {
        let fast = Backoff {
            initial: Duration::from_millis(1),
            max: Duration::from_millis(2),
        };
        let calls = AtomicU32::new(0);
        let outcome: Result<(), CallError> = with_retries(fast, 3, || {
            calls.fetch_add(1, Ordering::SeqCst);
            async { Err(tonic::Status::unavailable("down").into()) }
        })
        .await;
        assert_eq!(outcome.unwrap_err().code, tonic::Code::Unavailable);
        assert_eq!(
            calls.load(Ordering::SeqCst),
            4,
            "the first call and 3 retries"
        );

        calls.store(0, Ordering::SeqCst);
        let outcome: Result<(), CallError> = with_retries(fast, 3, || {
            calls.fetch_add(1, Ordering::SeqCst);
            async { Err(tonic::Status::invalid_argument("bad").into()) }
        })
        .await;
        assert!(outcome.is_err());
        assert_eq!(calls.load(Ordering::SeqCst), 1, "not retried");

        calls.store(0, Ordering::SeqCst);
        let outcome = with_retries(fast, 3, || {
            let n = calls.fetch_add(1, Ordering::SeqCst);
            async move {
                if n < 2 {
                    Err(tonic::Status::unavailable("down").into())
                } else {
                    Ok(n)
                }
            }
        })
        .await;
        assert_eq!(outcome.unwrap(), 2);
    }
}

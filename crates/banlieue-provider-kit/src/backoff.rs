//! The delays of one thing retried after failures (a backend's change feed, a start-up read):
//! unlike [`crate::ErrorBackoff`], which keeps one count per reconciled object, a [`Backoff`]
//! belongs to the one loop that retries.

use std::time::Duration;

/// Delays that double from `min` after each failure, up to `max`, and start over at `min`
/// after a success.
#[derive(Clone, Debug)]
pub struct Backoff {
    min: Duration,
    max: Duration,
    failures: u32,
}

impl Backoff {
    /// Delays from `min` to `max` (`max` is raised to `min` when smaller).
    pub fn new(min: Duration, max: Duration) -> Backoff {
        Backoff {
            min,
            max: max.max(min),
            failures: 0,
        }
    }

    /// The delays of every provider reconciler's errors, from [`crate::MIN_ERROR_BACKOFF`] to
    /// [`crate::MAX_ERROR_BACKOFF`].
    pub fn for_errors() -> Backoff {
        Backoff::new(crate::MIN_ERROR_BACKOFF, crate::MAX_ERROR_BACKOFF)
    }

    /// Records a failure and returns how long to wait before the next attempt.
    pub fn failed(&mut self) -> Duration {
        let delay = self
            .min
            .saturating_mul(1u32 << self.failures.min(16))
            .min(self.max);
        self.failures = self.failures.saturating_add(1);
        delay
    }

    /// Forgets the failures: the next one waits `min` again.
    pub fn succeeded(&mut self) {
        self.failures = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_double_to_the_maximum_and_a_success_starts_over() {
        let mut backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(5));
        let delays: Vec<_> = (0..5).map(|_| backoff.failed()).collect();
        assert_eq!(delays, [1, 2, 4, 5, 5].map(Duration::from_secs));
        backoff.succeeded();
        assert_eq!(backoff.failed(), Duration::from_secs(1));
    }

    #[test]
    fn many_failures_stay_at_the_maximum() {
        let mut backoff = Backoff::for_errors();
        for _ in 0..100 {
            backoff.failed();
        }
        assert_eq!(backoff.failed(), crate::MAX_ERROR_BACKOFF);
    }
}

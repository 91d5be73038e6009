//! A pool's streak of members that did not start in time, and the create backoff it earns.
//! `pool::decide` reads a streak (the Degraded condition, the backoff's length) and the
//! context keeps one per pool; neither needs the other.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use k8s_openapi::jiff::{SignedDuration, Timestamp};

/// The wait before the next create after `failures` consecutive startup failures: 10 s,
/// doubling, at most 5 minutes.
pub fn startup_backoff(failures: u32) -> Duration {
    if failures == 0 {
        return Duration::ZERO;
    }
    Duration::from_secs(10)
        .saturating_mul(1u32 << (failures - 1).min(5))
        .min(Duration::from_secs(300))
}

/// A pool's current streak of members that did not start in time.
#[derive(Clone, Debug)]
pub(crate) struct StartupStreak {
    pub failures: u32,
    pub last_at: Timestamp,
    pub last_members: Vec<String>,
}

impl StartupStreak {
    /// The end of the create backoff this streak earns: [`startup_backoff`] after its last
    /// failure.
    pub fn creates_not_before(&self) -> Option<Timestamp> {
        let wait = startup_backoff(self.failures);
        self.last_at
            .checked_add(SignedDuration::try_from(wait).ok()?)
            .ok()
    }
}

/// Startup-failure streaks by pool. Kept in memory: a restarted controller starts without a
/// backoff, and the next failure starts a new streak.
#[derive(Debug, Default)]
pub(crate) struct StartupFailures {
    by_pool: Mutex<HashMap<String, StartupStreak>>,
}

impl StartupFailures {
    pub fn failed(&self, pool: &str, members: &[String], at: Timestamp) {
        let mut by_pool = self.by_pool.lock().unwrap_or_else(PoisonError::into_inner);
        let streak = by_pool.entry(pool.to_owned()).or_insert(StartupStreak {
            failures: 0,
            last_at: at,
            last_members: Vec::new(),
        });
        streak.failures = streak
            .failures
            .saturating_add(u32::try_from(members.len()).unwrap_or(u32::MAX));
        streak.last_at = at;
        streak.last_members = members.to_vec();
    }

    pub fn recovered(&self, pool: &str) {
        self.by_pool
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(pool);
    }

    pub fn streak(&self, pool: &str) -> Option<StartupStreak> {
        self.by_pool
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(pool)
            .cloned()
    }

    /// The end of the pool's create backoff, if it is in one.
    pub fn creates_not_before(&self, pool: &str) -> Option<Timestamp> {
        self.streak(pool)?.creates_not_before()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(secs: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + secs).expect("valid time")
    }

    fn names(members: &[&str]) -> Vec<String> {
        members.iter().map(|m| (*m).to_owned()).collect()
    }

    #[test]
    fn the_startup_backoff_doubles_to_five_minutes() {
        let waits: Vec<u64> = (0..8).map(|n| startup_backoff(n).as_secs()).collect();
        assert_eq!(waits, vec![0, 10, 20, 40, 80, 160, 300, 300]);
    }

    #[test]
    fn a_streak_counts_every_failed_member_and_remembers_the_last_round() {
        let failures = StartupFailures::default();
        assert!(failures.streak("ns/web").is_none());
        assert_eq!(failures.creates_not_before("ns/web"), None);

        failures.failed("ns/web", &names(&["web-a"]), t(0));
        failures.failed("ns/web", &names(&["web-b", "web-c"]), t(50));
        let streak = failures.streak("ns/web").expect("a streak");
        assert_eq!(streak.failures, 3);
        assert_eq!(streak.last_at, t(50));
        assert_eq!(streak.last_members, names(&["web-b", "web-c"]));
        // Three failures in a row: 40 s after the last one.
        assert_eq!(failures.creates_not_before("ns/web"), Some(t(90)));
        // Another pool's streak is its own.
        assert!(failures.streak("ns/db").is_none());
    }

    #[test]
    fn recovering_ends_the_streak_and_its_backoff() {
        let failures = StartupFailures::default();
        failures.failed("ns/web", &names(&["web-a", "web-b"]), t(0));
        assert_eq!(failures.creates_not_before("ns/web"), Some(t(20)));
        failures.recovered("ns/web");
        assert!(failures.streak("ns/web").is_none());
        assert_eq!(failures.creates_not_before("ns/web"), None);
        // The next failure starts a new streak: the backoff is back at its first step.
        failures.failed("ns/web", &names(&["web-c"]), t(100));
        assert_eq!(failures.creates_not_before("ns/web"), Some(t(110)));
    }
}

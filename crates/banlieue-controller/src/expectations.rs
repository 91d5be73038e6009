//! Creates a pool issued that its cache has not shown yet. Counting them as members is what
//! keeps a pool from overshooting while the watch catches up, even when members never become
//! Ready (the ReplicaSet controller's expectations, by name).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// A create the cache never shows (the member was deleted before the watch saw it) stops
/// counting after this long.
const EXPECTATION_TIMEOUT: Duration = Duration::from_secs(120);

/// Pending creates per `namespace/pool`, by member name. Cloning shares them.
#[derive(Clone, Debug, Default)]
pub struct Expectations {
    pending: Arc<Mutex<HashMap<String, HashMap<String, Instant>>>>,
}

impl Expectations {
    /// Records a member created for `pool`.
    pub fn created(&self, pool: &str, member: &str) {
        let mut pending = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
        pending
            .entry(pool.to_owned())
            .or_default()
            .insert(member.to_owned(), Instant::now());
    }

    /// Forgets the creates `seen` in the cache (or timed out) and counts the rest.
    pub fn pending(&self, pool: &str, seen: impl Fn(&str) -> bool) -> usize {
        let mut pending = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(members) = pending.get_mut(pool) else {
            return 0;
        };
        members.retain(|name, at| !seen(name) && at.elapsed() < EXPECTATION_TIMEOUT);
        let count = members.len();
        if count == 0 {
            pending.remove(pool);
        }
        count
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pending_creates_count_until_seen() {
        let e = Expectations::default();
        e.created("ns/p", "p-a");
        e.created("ns/p", "p-b");
        assert_eq!(e.pending("ns/p", |_| false), 2);
        assert_eq!(e.pending("ns/p", |n| n == "p-a"), 1);
        // Once seen, a member stays forgotten even if the cache later drops it.
        assert_eq!(e.pending("ns/p", |_| false), 1);
        assert_eq!(e.pending("ns/p", |_| true), 0);
        assert_eq!(e.pending("ns/other", |_| false), 0);
    }
}

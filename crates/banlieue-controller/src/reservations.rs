//! Members this process is binding or reaping right now, and members it bound recently.
//!
//! The API server's resourceVersion check is what makes a bind safe; this is what makes it
//! cheap. Concurrent claim reconciles in one process skip each other's candidates instead of
//! colliding on the same member, the pool never reaps a member a claim is binding, and a member
//! just bound is not picked again from a cache that has not seen the bind yet.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// How long a bound member stays skipped, covering the watch delay of the cache.
const BOUND_MEMORY: Duration = Duration::from_secs(120);

#[derive(Clone, Copy, Debug)]
enum Hold {
    Binding,
    Reaping,
    Bound(Instant),
}

/// Reservations keyed by `namespace/member`. Cloning shares them.
#[derive(Clone, Debug, Default)]
pub struct Reservations {
    held: Arc<Mutex<HashMap<String, Hold>>>,
}

fn key(namespace: &str, member: &str) -> String {
    format!("{namespace}/{member}")
}

impl Reservations {
    fn with<T>(&self, f: impl FnOnce(&mut HashMap<String, Hold>) -> T) -> T {
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        held.retain(|_, hold| !matches!(hold, Hold::Bound(at) if at.elapsed() > BOUND_MEMORY));
        f(&mut held)
    }

    /// Whether the member is held for any reason.
    pub fn is_held(&self, namespace: &str, member: &str) -> bool {
        self.with(|held| held.contains_key(&key(namespace, member)))
    }

    /// Holds `member` for a bind, unless something already holds it. The hold is released when
    /// the returned guard is dropped (a lost race, an error, or a reconcile cancelled at its
    /// deadline) unless [`Held::bound`] records the bind.
    pub fn try_bind(&self, namespace: &str, member: &str) -> Option<Held> {
        self.try_hold(namespace, member, Hold::Binding)
    }

    /// Holds `member` for a delete, unless a claim is binding it; released when dropped.
    pub fn try_reap(&self, namespace: &str, member: &str) -> Option<Held> {
        self.try_hold(namespace, member, Hold::Reaping)
    }

    fn try_hold(&self, namespace: &str, member: &str, hold: Hold) -> Option<Held> {
        let k = key(namespace, member);
        let taken = self.with(|held| {
            if held.contains_key(&k) {
                return false;
            }
            held.insert(k.clone(), hold);
            true
        });
        taken.then(|| Held {
            reservations: self.clone(),
            key: k,
        })
    }

    /// The members of `namespace` held for any reason.
    pub fn held_in(&self, namespace: &str) -> Vec<String> {
        let prefix = format!("{namespace}/");
        self.with(|held| {
            held.keys()
                .filter_map(|k| k.strip_prefix(&prefix).map(str::to_owned))
                .collect()
        })
    }
}

/// A member held for a bind or a delete; dropping it releases the hold.
#[derive(Debug)]
pub struct Held {
    reservations: Reservations,
    key: String,
}

impl Held {
    /// Records that the bind was committed: the member stays skipped for a while, so a cache
    /// that has not seen the bind yet cannot offer it again.
    pub fn bound(self) {
        let key = self.key.clone();
        self.reservations.with(|held| {
            held.insert(key, Hold::Bound(Instant::now()));
        });
        // Dropping `self` now leaves the Bound hold in place.
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.reservations.with(|held| {
            if matches!(held.get(&self.key), Some(Hold::Binding | Hold::Reaping)) {
                held.remove(&self.key);
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dropped_hold_is_released() {
        let r = Reservations::default();
        let held = r.try_bind("ns", "m").expect("free");
        assert!(r.try_bind("ns", "m").is_none());
        assert!(
            r.try_reap("ns", "m").is_none(),
            "a member being bound is never reaped"
        );
        drop(held);
        assert!(!r.is_held("ns", "m"));
        assert!(r.try_reap("ns", "m").is_some());
    }

    #[test]
    fn a_bound_member_stays_held_after_its_guard_is_gone() {
        let r = Reservations::default();
        r.try_bind("ns", "m").expect("free").bound();
        assert!(r.is_held("ns", "m"));
        assert!(r.try_bind("ns", "m").is_none());
        assert_eq!(r.held_in("ns"), vec!["m".to_owned()]);
        assert!(r.held_in("other").is_empty());
    }

    #[test]
    fn a_cancelled_bind_releases_its_member() {
        let r = Reservations::default();
        let mut bind = Box::pin(async {
            let _held = r.try_bind("ns", "m").expect("free");
            std::future::pending::<()>().await;
        });
        // Polled once, then dropped: what a reconcile deadline does to a stuck bind.
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        assert!(bind.as_mut().poll(&mut cx).is_pending());
        assert!(r.is_held("ns", "m"));
        drop(bind);
        assert!(!r.is_held("ns", "m"));
    }
}

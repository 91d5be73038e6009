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

    /// Holds the member for a bind; false when something else holds it.
    pub fn try_bind(&self, namespace: &str, member: &str) -> bool {
        self.try_hold(namespace, member, Hold::Binding)
    }

    /// Holds the member for deletion by its pool; false when something else holds it.
    pub fn try_reap(&self, namespace: &str, member: &str) -> bool {
        self.try_hold(namespace, member, Hold::Reaping)
    }

    fn try_hold(&self, namespace: &str, member: &str, hold: Hold) -> bool {
        self.with(|held| {
            let k = key(namespace, member);
            if held.contains_key(&k) {
                return false;
            }
            held.insert(k, hold);
            true
        })
    }

    /// The bind succeeded: keep skipping the member until the cache has surely caught up.
    pub fn bound(&self, namespace: &str, member: &str) {
        self.with(|held| held.insert(key(namespace, member), Hold::Bound(Instant::now())));
    }

    /// Releases a bind or reap hold that did not complete.
    pub fn release(&self, namespace: &str, member: &str) {
        self.with(|held| {
            let k = key(namespace, member);
            if matches!(held.get(&k), Some(Hold::Binding | Hold::Reaping)) {
                held.remove(&k);
            }
        });
    }

    /// Names of held members in `namespace`.
    pub fn held_in(&self, namespace: &str) -> Vec<String> {
        let prefix = format!("{namespace}/");
        self.with(|held| {
            held.keys()
                .filter_map(|k| k.strip_prefix(&prefix).map(str::to_owned))
                .collect()
        })
    }
}

//! The copies of machines this workload has just written over.
//!
//! Every write of the machine reconcile (a finalizer added or removed, a record, a status) is
//! made against the copy the reconcile read. Until the watch delivers the write, the cache
//! still holds that copy, and a reconcile woken meanwhile (a domain event of the machine's own
//! start arrives before its status write is seen) would call the backend for nothing and then
//! write against it: a 409 on a status guarded by its resourceVersion, a 404 on a finalizer
//! whose removal let the object go. Such a reconcile waits instead: the write's own watch
//! event reconciles the machine again, from the copy that holds it.
//!
//! The copy is known by its resourceVersion, compared for equality only (the API server's
//! versions are opaque): a copy at the version a write was made against is older than that
//! write.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use kube::Resource;

/// How long a write is remembered: longer than a cache lags behind its API server, short
/// enough that a machine deleted meanwhile is forgotten soon, and that a write the API server
/// found changed nothing (no new version, no watch event) holds a reconcile back no longer.
pub const KEEP: Duration = Duration::from_secs(30);

/// Per machine uid, the resourceVersion of the copy the last write was made against.
#[derive(Debug, Default)]
pub struct OwnWrites {
    by_uid: HashMap<String, (String, Instant)>,
}

impl OwnWrites {
    /// Records a write this workload made against `copy`, at `now`.
    pub fn wrote<K: Resource>(&mut self, copy: &K, now: Instant) {
        self.by_uid
            .retain(|_, (_, at)| now.saturating_duration_since(*at) < KEEP);
        if let (Some(uid), Some(version)) = (&copy.meta().uid, &copy.meta().resource_version) {
            self.by_uid.insert(uid.clone(), (version.clone(), now));
        }
    }

    /// Whether `copy` is one a write of this workload has replaced within [`KEEP`] of `now`.
    /// A newer copy forgets the write: the cache has caught up.
    pub fn superseded<K: Resource>(&mut self, copy: &K, now: Instant) -> bool {
        let (Some(uid), Some(version)) = (&copy.meta().uid, &copy.meta().resource_version) else {
            return false;
        };
        match self.by_uid.get(uid) {
            Some((written_over, at))
                if written_over == version && now.saturating_duration_since(*at) < KEEP =>
            {
                true
            }
            Some(_) => {
                self.by_uid.remove(uid);
                false
            }
            None => false,
        }
    }

    /// How many writes are remembered.
    pub fn len(&self) -> usize {
        self.by_uid.len()
    }

    /// Whether no write is remembered.
    pub fn is_empty(&self) -> bool {
        self.by_uid.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::ObjectMeta;

    fn copy(uid: &str, version: &str) -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta {
                name: Some(format!("m-{uid}")),
                uid: Some(uid.into()),
                resource_version: Some(version.into()),
                ..ObjectMeta::default()
            },
            ..ConfigMap::default()
        }
    }

    #[test]
    fn the_copy_a_write_was_made_against_is_superseded_until_a_newer_one_is_seen() {
        let mut writes = OwnWrites::default();
        let now = Instant::now();
        assert!(
            !writes.superseded(&copy("a", "10"), now),
            "nothing written yet"
        );
        writes.wrote(&copy("a", "10"), now);
        assert!(writes.superseded(&copy("a", "10"), now), "the cache lags");
        let later = now + KEEP / 2;
        assert!(
            writes.superseded(&copy("a", "10"), later),
            "until it catches up"
        );
        assert!(
            !writes.superseded(&copy("b", "10"), later),
            "another machine"
        );
        assert!(
            !writes.superseded(&copy("a", "11"), later),
            "the write seen"
        );
        assert!(writes.is_empty(), "and forgotten");
        assert!(!writes.superseded(&copy("a", "10"), later));
    }

    #[test]
    fn writes_are_forgotten_after_a_while_and_copies_without_identity_are_never_skipped() {
        let mut writes = OwnWrites::default();
        let start = Instant::now();
        writes.wrote(&copy("gone", "5"), start);
        writes.wrote(&copy("kept", "7"), start + KEEP / 2);
        writes.wrote(&copy("new", "9"), start + KEEP);
        assert_eq!(writes.len(), 2, "the deleted machine's write expired");
        assert!(!writes.superseded(&copy("gone", "5"), start + KEEP));
        assert!(writes.superseded(&copy("kept", "7"), start + KEEP));
        // A write that changed nothing brings no newer copy: it holds back no longer than KEEP.
        assert!(!writes.superseded(&copy("kept", "7"), start + KEEP / 2 + KEEP));

        let mut anonymous = copy("x", "1");
        anonymous.metadata.uid = None;
        writes.wrote(&anonymous, start + KEEP);
        assert!(!writes.superseded(&anonymous, start + KEEP));
        assert_eq!(writes.len(), 1);
    }
}

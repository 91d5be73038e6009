//! Read-your-own-writes over a cache: after this process writes an object, a reconcile that
//! runs before the watch delivers the write sees the written object, not the cached one it
//! replaced. Without it a VirtualMachine whose machine's watch event beat its own status to
//! the cache looked unscheduled-with-a-machine and had its status written a second time.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use kube::Resource;

/// Per uid: the resourceVersion this process replaced, and what replaced it.
type Written<K> = HashMap<String, (Option<String>, Arc<K>)>;

/// The last object this process wrote, per uid, with the resourceVersion it replaced.
#[derive(Debug)]
pub(crate) struct OwnWrites<K> {
    by_uid: Mutex<Written<K>>,
}

impl<K> Default for OwnWrites<K> {
    fn default() -> Self {
        Self {
            by_uid: Mutex::default(),
        }
    }
}

impl<K: Resource> OwnWrites<K> {
    /// Records that `before` was replaced by `after` (what the API server returned).
    pub fn wrote(&self, before: &K, after: K) {
        let Some(uid) = before.meta().uid.clone() else {
            return;
        };
        let replaced = before.meta().resource_version.clone();
        self.lock().insert(uid, (replaced, Arc::new(after)));
    }

    /// `cached`, unless it is exactly the version this process replaced: then what replaced
    /// it. Once the cache shows anything else, the record is dropped.
    pub fn freshest(&self, cached: Arc<K>) -> Arc<K> {
        let Some(uid) = cached.meta().uid.as_deref() else {
            return cached;
        };
        let mut by_uid = self.lock();
        match by_uid.get(uid) {
            Some((replaced, written)) if *replaced == cached.meta().resource_version => {
                written.clone()
            }
            Some(_) => {
                by_uid.remove(uid);
                cached
            }
            None => cached,
        }
    }

    /// Drops the record of `uid` (the object is going away).
    pub fn forget(&self, uid: &str) {
        self.lock().remove(uid);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Written<K>> {
        self.by_uid.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn object(rv: &str, data: &str) -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta {
                uid: Some("u".into()),
                resource_version: Some(rv.into()),
                ..Default::default()
            },
            data: Some([("v".to_owned(), data.to_owned())].into()),
            ..Default::default()
        }
    }

    #[test]
    fn a_stale_cache_entry_is_replaced_by_the_write_until_the_cache_moves_on() {
        let writes = OwnWrites::default();
        let before = object("1", "old");
        writes.wrote(&before, object("2", "new"));
        // The cache still holds version 1: the write is the truth.
        assert_eq!(
            writes
                .freshest(Arc::new(before.clone()))
                .metadata
                .resource_version
                .as_deref(),
            Some("2")
        );
        // The cache caught up (or someone else wrote): the cache is the truth again, and stays.
        let later = object("3", "other");
        assert_eq!(
            writes
                .freshest(Arc::new(later))
                .metadata
                .resource_version
                .as_deref(),
            Some("3")
        );
        assert_eq!(
            writes
                .freshest(Arc::new(before))
                .metadata
                .resource_version
                .as_deref(),
            Some("1")
        );
    }
}

//! The plumbing every banlieue reconciler shares, so the controller and each provider follow
//! one protocol rather than drifting apart:
//!
//! - [`add_finalizer`] / [`remove_finalizer`]: JSON patches whose `test` op proves the list is
//!   still what the caller saw, so two writers never clobber each other's finalizers;
//! - [`patch_status`]: a merge patch of the status subresource, guarded by a resourceVersion
//!   when the caller read the object from a cache that can lag behind its own last write;
//! - [`ErrorBackoff`]: per-object retry delays after failed reconciles;
//! - [`event`] / [`publish`]: Events whose note is bounded to what the API server accepts,
//!   published best-effort.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use banlieue_api::conditions;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::{Event, EventType, Recorder};
use kube::{Resource, ResourceExt};
use serde::de::DeserializeOwned;
use serde_json::json;

/// Why a patch of the shared protocol failed.
#[derive(Debug, thiserror::Error)]
pub enum PatchError {
    /// The API server refused or could not be reached. A failed `test` op (the object changed
    /// since it was read) is a 422; a stale resourceVersion is a 409.
    #[error("call the API server")]
    Kube(#[from] kube::Error),
    /// The patch could not be encoded.
    #[error("encode a patch")]
    Encode(#[from] serde_json::Error),
}

impl PatchError {
    /// Whether the object changed since the caller read it (409 Conflict for a resourceVersion
    /// guard, 422 Invalid for a failed JSON-patch `test`): read it again and decide again.
    pub fn is_stale(&self) -> bool {
        matches!(self, PatchError::Kube(kube::Error::Api(s)) if s.code == 409 || s.code == 422)
    }
}

/// Adds `finalizer` to `object` unless it already holds it. The JSON patch first tests the
/// list `object` carries (or its absence), so a finalizer another writer added or removed
/// since the read fails the patch instead of being overwritten. Returns the object as the API
/// server now stores it (`object` itself when nothing was written).
pub async fn add_finalizer<K>(api: &Api<K>, object: &K, finalizer: &str) -> Result<K, PatchError>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    if object.finalizers().iter().any(|f| f == finalizer) {
        return Ok(object.clone());
    }
    let ops = if object.finalizers().is_empty() {
        json!([
            {"op": "test", "path": "/metadata/finalizers", "value": null},
            {"op": "add", "path": "/metadata/finalizers", "value": [finalizer]},
        ])
    } else {
        json!([
            {"op": "test", "path": "/metadata/finalizers", "value": object.finalizers()},
            {"op": "add", "path": "/metadata/finalizers/-", "value": finalizer},
        ])
    };
    Ok(api
        .patch(
            &object.name_any(),
            &PatchParams::default(),
            &Patch::<()>::Json(serde_json::from_value(ops)?),
        )
        .await?)
}

/// Removes `finalizer` from `object` when it holds it. The JSON patch tests that the entry at
/// the index `object` shows it at is still `finalizer`: removing by index is then exactly this
/// finalizer whatever else changed, and a concurrent edit that moved it fails the patch rather
/// than removing someone else's. (Testing the whole list would be as safe and fail more often:
/// a finalizer another writer appended meanwhile is no reason to retry.) An object already
/// gone is not an error.
pub async fn remove_finalizer<K>(
    api: &Api<K>,
    object: &K,
    finalizer: &str,
) -> Result<(), PatchError>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    let Some(index) = object.finalizers().iter().position(|f| f == finalizer) else {
        return Ok(());
    };
    let path = format!("/metadata/finalizers/{index}");
    let ops = json!([
        {"op": "test", "path": path, "value": finalizer},
        {"op": "remove", "path": path},
    ]);
    match api
        .patch(
            &object.name_any(),
            &PatchParams::default(),
            &Patch::<()>::Json(serde_json::from_value(ops)?),
        )
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(error) => Err(error.into()),
    }
}

/// Writes `status` on `name`'s status subresource with a JSON merge patch. With
/// `resource_version`, the patch carries it and the API server refuses it with 409 when the
/// object changed since ([`PatchError::is_stale`]): what a writer whose view may lag (a cache,
/// a slow reconcile) passes so that it never overwrites a newer status with an older one.
pub async fn patch_status<K, S>(
    api: &Api<K>,
    name: &str,
    status: &S,
    resource_version: Option<&str>,
) -> Result<K, PatchError>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
    S: serde::Serialize,
{
    let patch = match resource_version {
        Some(version) => json!({ "metadata": { "resourceVersion": version }, "status": status }),
        None => json!({ "status": status }),
    };
    Ok(api
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?)
}

/// Per-object retry delays after failed reconciles: doubling from `min` on each consecutive
/// failure up to `max`, forgotten on the next success. Keys are the caller's (for example
/// `controller/namespace/name`).
#[derive(Debug)]
pub struct ErrorBackoff {
    min: Duration,
    max: Duration,
    failures: Mutex<HashMap<String, u32>>,
}

impl ErrorBackoff {
    /// Delays from `min` to `max` (`max` is raised to `min` when smaller).
    pub fn new(min: Duration, max: Duration) -> Self {
        Self {
            min,
            max: max.max(min),
            failures: Mutex::default(),
        }
    }

    /// Records a failure of `key` and returns how long to wait before retrying it.
    pub fn failed(&self, key: &str) -> Duration {
        let mut failures = self.failures.lock().unwrap_or_else(PoisonError::into_inner);
        let count = failures.entry(key.to_owned()).or_insert(0);
        let delay = self
            .min
            .saturating_mul(1u32 << (*count).min(16))
            .min(self.max);
        *count = count.saturating_add(1);
        delay
    }

    /// Forgets `key`'s failures: its next failure waits `min` again.
    pub fn succeeded(&self, key: &str) {
        let mut failures = self.failures.lock().unwrap_or_else(PoisonError::into_inner);
        failures.remove(key);
    }

    /// Passes on the `outcome` of reconciling `key`, forgetting the key's failures when it is a
    /// success. Failures are recorded by the error policy, through [`ErrorBackoff::failed`].
    pub fn track<T, E>(&self, key: &str, outcome: Result<T, E>) -> Result<T, E> {
        if outcome.is_ok() {
            self.succeeded(key);
        }
        outcome
    }

    /// The key of `object` under `controller`: `controller/namespace/name`.
    pub fn key_of<K: Resource>(controller: &str, object: &K) -> String {
        format!(
            "{controller}/{}/{}",
            object.meta().namespace.as_deref().unwrap_or_default(),
            object.meta().name.as_deref().unwrap_or_default()
        )
    }
}

/// An Event whose note is bounded to [`conditions::MAX_EVENT_NOTE_BYTES`], so the API server
/// accepts it whatever it quotes (an error chain can hold a whole response body).
pub fn event(type_: EventType, reason: &str, action: &str, note: String) -> Event {
    Event {
        type_,
        reason: reason.to_owned(),
        note: Some(conditions::bounded_message(
            note,
            conditions::MAX_EVENT_NOTE_BYTES,
        )),
        action: action.to_owned(),
        secondary: None,
    }
}

/// Publishes `event` on `reference`. Events are diagnostics: a failure is logged and never
/// fails the caller.
pub async fn publish(recorder: &Recorder, reference: &ObjectReference, event: &Event) {
    if let Err(error) = recorder.publish(event, reference).await {
        tracing::debug!(%error, reason = %event.reason, "could not publish an event");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_the_maximum_and_success_forgets_it() {
        let backoff = ErrorBackoff::new(Duration::from_secs(1), Duration::from_secs(5));
        let delays: Vec<_> = (0..5).map(|_| backoff.failed("a")).collect();
        assert_eq!(
            delays,
            [1, 2, 4, 5, 5].map(Duration::from_secs),
            "doubling, capped"
        );
        assert_eq!(backoff.failed("b"), Duration::from_secs(1), "per object");
        backoff.succeeded("a");
        assert_eq!(backoff.failed("a"), Duration::from_secs(1));
        // A tracked failure is left to the error policy; a tracked success forgets.
        assert!(backoff.track("a", Err::<(), _>("refused")).is_err());
        assert_eq!(backoff.failed("a"), Duration::from_secs(2));
        assert_eq!(backoff.track("a", Ok::<_, ()>(7)), Ok(7));
        assert_eq!(backoff.failed("a"), Duration::from_secs(1));
        // Many failures neither overflow nor exceed the maximum.
        let long = ErrorBackoff::new(Duration::from_secs(1), Duration::from_secs(3600));
        let last = (0..100).map(|_| long.failed("x")).last();
        assert_eq!(last, Some(Duration::from_secs(3600)));
    }

    #[test]
    fn an_event_quoting_a_four_mebibyte_error_fits_the_api_servers_limit() {
        let note = format!("delete member: {}", "ü".repeat(2 << 20));
        let event = event(EventType::Warning, "Releasing", "Releasing", note);
        let note = event.note.expect("note");
        assert!(
            note.len() <= conditions::MAX_EVENT_NOTE_BYTES,
            "{}",
            note.len()
        );
        assert!(note.starts_with("delete member: ü"));
        assert!(note.ends_with(conditions::TRUNCATION_MARKER));
    }
}

//! What every reconciler shares: the client, the caches, in-process bookkeeping, metrics and
//! the thin helpers for the writes the controller makes.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use banlieue_api::conditions;
use banlieue_api::{
    LibvirtMachine, Provider, ProviderClass, VMClass, VMImage, VirtualMachine, VirtualMachineClaim,
    VirtualMachinePool,
};
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use serde_json::json;

use crate::config::ControllerConfig;
use crate::error::{Error, Result};
use crate::event_window::{EventWindows, Offer};
use crate::expectations::Expectations;
use crate::hosts::HostStates;
use crate::metrics::Metrics;
use crate::own_writes::OwnWrites;
use crate::reservations::Reservations;
use crate::spread::RecentPlacements;

/// Read-only caches, filled by reflectors.
#[derive(Clone)]
pub(crate) struct Stores {
    pub vms: Store<VirtualMachine>,
    pub machines: Store<LibvirtMachine>,
    pub pools: Store<VirtualMachinePool>,
    pub claims: Store<VirtualMachineClaim>,
    pub providers: Store<Provider>,
    pub provider_classes: Store<ProviderClass>,
    pub images: Store<VMImage>,
    pub classes: Store<VMClass>,
}

/// Which caches hold their initial list, one bit each. Tracked from the watch streams rather
/// than with `Store::wait_until_ready`, whose one-shot channel wakes only the last of several
/// concurrent waiters.
#[derive(Clone, Debug)]
pub(crate) struct Readiness {
    filled: tokio::sync::watch::Sender<u32>,
    all: u32,
}

impl Readiness {
    pub fn new(caches: u32) -> Self {
        Self {
            filled: tokio::sync::watch::Sender::new(0),
            all: (1u32 << caches) - 1,
        }
    }

    /// Marks cache number `index` as filled.
    pub fn filled(&self, index: u32) {
        self.filled.send_modify(|mask| *mask |= 1 << index);
    }

    /// Waits until every cache holds its initial list: a decision over a half-filled cache
    /// could bind a second member to a claim whose first one is simply not listed yet.
    pub async fn wait(&self) -> Result<()> {
        let all = self.all;
        let mut receiver = self.filled.subscribe();
        receiver
            .wait_for(|mask| *mask & all == all)
            .await
            .map(|_| ())
            .map_err(|_| Error::CachesNotReady)
    }
}

/// Shared by the three reconcilers.
pub(crate) struct Context {
    pub client: Client,
    pub config: ControllerConfig,
    pub metrics: Metrics,
    pub recorder: Recorder,
    pub stores: Stores,
    pub readiness: Readiness,
    pub reservations: Reservations,
    pub expectations: Expectations,
    pub backoff: ErrorBackoff,
    /// Placements of pool members this process made that the cache may not show yet.
    pub placements: RecentPlacements,
    /// Claim uid → member name for binds this process committed, so a claim whose status write
    /// failed is completed with its member even before the cache shows the bind.
    assignments: Mutex<HashMap<String, String>>,
    /// Routine Events held back and counted ([`Context::routine_event`]).
    event_windows: Arc<Mutex<EventWindows>>,
    /// When each pool's status was last written by this process.
    pub status_writes: LastWrites,
    /// VirtualMachines whose status this process wrote, until the cache shows the write.
    pub vm_writes: OwnWrites<VirtualMachine>,
    /// Claims whose status this process wrote, until the cache shows the write.
    pub claim_writes: OwnWrites<VirtualMachineClaim>,
    /// Consecutive startup failures per pool, for the create backoff and `Degraded`.
    pub startup_failures: StartupFailures,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl Context {
    pub fn new(
        client: Client,
        config: ControllerConfig,
        metrics: Metrics,
        stores: Stores,
        readiness: Readiness,
    ) -> Self {
        let reporter = Reporter {
            controller: config.manager_name.clone(),
            instance: std::env::var("POD_NAME").ok(),
        };
        Self {
            recorder: Recorder::new(client.clone(), reporter),
            client,
            config,
            metrics,
            stores,
            readiness,
            reservations: Reservations::default(),
            expectations: Expectations::default(),
            backoff: ErrorBackoff::default(),
            placements: RecentPlacements::default(),
            assignments: Mutex::default(),
            event_windows: Arc::default(),
            status_writes: LastWrites::default(),
            vm_writes: OwnWrites::default(),
            claim_writes: OwnWrites::default(),
            startup_failures: StartupFailures::default(),
        }
    }

    pub fn api<K>(&self, namespace: &str) -> Api<K>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
    {
        Api::namespaced(self.client.clone(), namespace)
    }

    /// The hosts of `namespace`'s Providers as of now ([`crate::hosts`]).
    pub fn host_states(&self, namespace: &str) -> HostStates {
        let providers = self.stores.providers.state();
        HostStates::judge(
            providers
                .iter()
                .filter(|p| p.metadata.namespace.as_deref() == Some(namespace))
                .map(Arc::as_ref),
            k8s_openapi::jiff::Timestamp::now(),
            self.config.provider_lost_after,
        )
    }

    pub fn assignment(&self, claim_uid: &str) -> Option<String> {
        self.assignments
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(claim_uid)
            .cloned()
    }

    pub fn assign(&self, claim_uid: &str, member: &str) {
        self.assignments
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(claim_uid.to_owned(), member.to_owned());
    }

    pub fn forget_assignment(&self, claim_uid: &str) {
        self.assignments
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(claim_uid);
    }

    /// Publishes an Event on `object`. Events are diagnostics: failing to write one never fails
    /// a reconcile. The note is bounded so that the API server accepts it whatever it quotes.
    pub async fn event<K>(&self, object: &K, type_: EventType, reason: &str, note: String)
    where
        K: Resource<DynamicType = ()>,
    {
        let event = event_of(type_, reason, note);
        if let Err(error) = self.recorder.publish(&event, &object.object_ref(&())).await {
            tracing::debug!(%error, reason, "could not publish an event");
        }
    }

    /// Publishes a routine Event on `object` through a window per object and reason: the
    /// first at once, the repeats within [`crate::event_window::EVENT_WINDOW`] as one summary when it closes.
    pub async fn routine_event<K>(&self, object: &K, reason: &str, note: String)
    where
        K: Resource<DynamicType = ()>,
    {
        let reference = object.object_ref(&());
        let key = format!(
            "{}/{}/{}/{reason}",
            reference.kind.as_deref().unwrap_or_default(),
            reference.namespace.as_deref().unwrap_or_default(),
            reference.name.as_deref().unwrap_or_default(),
        );
        let offer = self
            .event_windows
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .offer(&key, &note, Instant::now());
        match offer {
            Offer::Publish => self.event(object, EventType::Normal, reason, note).await,
            Offer::Held { flush_at: None } => {}
            Offer::Held { flush_at: Some(at) } => {
                let windows = self.event_windows.clone();
                let recorder = self.recorder.clone();
                let reason = reason.to_owned();
                tokio::spawn(async move {
                    tokio::time::sleep_until(at.into()).await;
                    let summary = windows
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .close(&key);
                    if let Some(summary) = summary {
                        let event = event_of(EventType::Normal, &reason, summary.note());
                        if let Err(error) = recorder.publish(&event, &reference).await {
                            tracing::debug!(%error, reason, "could not publish an event");
                        }
                    }
                });
            }
        }
    }

    /// Writes `status` with a JSON merge patch on the status subresource.
    pub async fn patch_status<K, S>(&self, api: &Api<K>, name: &str, status: &S) -> Result<K>
    where
        K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
        S: serde::Serialize,
    {
        let patch = json!({ "status": status });
        Ok(api
            .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await?)
    }

    /// Adds `finalizer` with a JSON patch that first tests the current list, so two writers
    /// cannot clobber each other's finalizers.
    pub async fn add_finalizer<K>(&self, api: &Api<K>, object: &K, finalizer: &str) -> Result<K>
    where
        K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
    {
        let name = object.name_any();
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
                &name,
                &PatchParams::default(),
                &Patch::<()>::Json(serde_json::from_value(ops)?),
            )
            .await?)
    }

    /// Removes `finalizer` with a JSON patch that tests it is still at the index it was seen at.
    pub async fn remove_finalizer<K>(&self, api: &Api<K>, object: &K, finalizer: &str) -> Result<()>
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
            Err(error) if crate::error::is_not_found(&error) => Ok(()),
            Err(error) => Err(error.into()),
        }
    }
}

/// The namespace of a namespaced object, as an error when missing.
pub(crate) fn namespace_of<K: Resource>(object: &K, kind: &'static str) -> Result<String> {
    object
        .meta()
        .namespace
        .clone()
        .ok_or_else(|| Error::NoNamespace {
            kind,
            name: object.meta().name.clone().unwrap_or_default(),
        })
}

/// The uid of an object, as an error when missing.
pub(crate) fn uid_of<K: Resource>(object: &K, kind: &'static str) -> Result<String> {
    object.meta().uid.clone().ok_or_else(|| Error::NoUid {
        kind,
        name: object.meta().name.clone().unwrap_or_default(),
    })
}

/// A cache lookup by namespace and name.
pub(crate) fn cached<K>(store: &Store<K>, namespace: &str, name: &str) -> Option<Arc<K>>
where
    K: Resource<DynamicType = ()> + Clone,
{
    store.get(&ObjectRef::new(name).within(namespace))
}

/// When this process last wrote each object's status, kept for
/// [`crate::pool_decide::STATUS_COUNTS_INTERVAL`] only: older writes no longer delay a new one.
#[derive(Debug, Default)]
pub(crate) struct LastWrites {
    at: Mutex<HashMap<String, Instant>>,
}

impl LastWrites {
    /// How long ago `key` was last written, if recently enough to matter.
    pub fn since_last(&self, key: &str, now: Instant) -> Option<std::time::Duration> {
        let at = self.at.lock().unwrap_or_else(PoisonError::into_inner);
        at.get(key).map(|t| now.saturating_duration_since(*t))
    }

    pub fn wrote(&self, key: &str, now: Instant) {
        let mut at = self.at.lock().unwrap_or_else(PoisonError::into_inner);
        at.retain(|_, t| {
            now.saturating_duration_since(*t) < crate::pool_decide::STATUS_COUNTS_INTERVAL
        });
        at.insert(key.to_owned(), now);
    }
}

/// A pool's current streak of members that did not start in time.
#[derive(Clone, Debug)]
pub(crate) struct StartupStreak {
    pub failures: u32,
    pub last_at: k8s_openapi::jiff::Timestamp,
    pub last_members: Vec<String>,
}

/// Startup-failure streaks by pool. Kept in memory: a restarted controller starts without a
/// backoff, and the next failure starts a new streak.
#[derive(Debug, Default)]
pub(crate) struct StartupFailures {
    by_pool: Mutex<HashMap<String, StartupStreak>>,
}

impl StartupFailures {
    pub fn failed(&self, pool: &str, members: &[String], at: k8s_openapi::jiff::Timestamp) {
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
    pub fn creates_not_before(&self, pool: &str) -> Option<k8s_openapi::jiff::Timestamp> {
        let streak = self.streak(pool)?;
        let wait = crate::pool_decide::startup_backoff(streak.failures);
        streak
            .last_at
            .checked_add(k8s_openapi::jiff::SignedDuration::try_from(wait).ok()?)
            .ok()
    }
}

/// Per-object retry delays after failed reconciles: doubling from the minimum to the maximum,
/// forgotten on the next success.
#[derive(Debug, Default)]
pub(crate) struct ErrorBackoff {
    failures: Mutex<HashMap<String, u32>>,
}

impl ErrorBackoff {
    pub fn failed(
        &self,
        key: &str,
        min: std::time::Duration,
        max: std::time::Duration,
    ) -> std::time::Duration {
        let mut failures = self.failures.lock().unwrap_or_else(PoisonError::into_inner);
        let count = failures.entry(key.to_owned()).or_insert(0);
        let delay = min.saturating_mul(1u32 << (*count).min(16)).min(max);
        *count = count.saturating_add(1);
        delay
    }

    pub fn succeeded(&self, key: &str) {
        let mut failures = self.failures.lock().unwrap_or_else(PoisonError::into_inner);
        failures.remove(key);
    }
}

/// The Event [`Context::event`] publishes: its note bounded to what the API server accepts.
fn event_of(type_: EventType, reason: &str, note: String) -> Event {
    Event {
        type_,
        reason: reason.to_owned(),
        note: Some(conditions::bounded_message(
            note,
            conditions::MAX_EVENT_NOTE_BYTES,
        )),
        action: reason.to_owned(),
        secondary: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_event_quoting_a_four_mebibyte_error_fits_the_api_servers_limit() {
        let note = format!("delete member: {}", "ü".repeat(2 << 20));
        let event = event_of(EventType::Warning, "Releasing", note);
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

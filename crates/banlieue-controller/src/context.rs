//! What every reconciler shares: the client, the caches, in-process bookkeeping, metrics and
//! the thin helpers for the writes the controller makes.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use banlieue_api::{
    Provider, ProviderClass, VMClass, VMImage, VirtualMachine, VirtualMachineClaim,
    VirtualMachinePool,
};
use banlieue_runtime::reconcile::{self, ErrorBackoff};
use kube::api::{Api, DynamicObject};
use kube::runtime::events::{EventType, Recorder, Reporter};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Client, Resource};
use serde::de::DeserializeOwned;

use crate::config::ControllerConfig;
use crate::error::{Error, Result};
use crate::event_window::{EventWindows, Offer};
use crate::expectations::Expectations;
use crate::hosts::HostStates;
use crate::machine_builder::{Machine, MachineBackend};
use crate::metrics::Metrics;
use crate::own_writes::OwnWrites;
use crate::pool::startup::StartupFailures;
use crate::reservations::Reservations;
use crate::spread::RecentPlacements;

/// Read-only caches, filled by reflectors.
#[derive(Clone)]
pub(crate) struct Stores {
    pub vms: Store<VirtualMachine>,
    pub machines: MachineStores,
    pub pools: Store<VirtualMachinePool>,
    pub claims: Store<VirtualMachineClaim>,
    pub providers: Store<Provider>,
    pub provider_classes: Store<ProviderClass>,
    pub images: Store<VMImage>,
    pub classes: Store<VMClass>,
}

/// One cache per machine kind, of `DynamicObject`s read through the machine contract.
#[derive(Clone, Default)]
pub(crate) struct MachineStores {
    stores: Vec<(MachineBackend, Store<DynamicObject>)>,
}

impl MachineStores {
    /// Adds the cache of `backend`'s machines.
    pub fn insert(&mut self, backend: MachineBackend, store: Store<DynamicObject>) {
        self.stores.push((backend, store));
    }

    /// The machine `name` of `namespace` controlled by `owner_uid`: of `kind` when given, else
    /// of any kind.
    pub fn find_owned(
        &self,
        kind: Option<&str>,
        namespace: &str,
        name: &str,
        owner_uid: &str,
    ) -> Result<Option<Machine>> {
        for (candidate, store) in &self.stores {
            if kind.is_some_and(|wanted| wanted != candidate.kind_name) {
                continue;
            }
            let reference = ObjectRef::new_with(name, candidate.resource.clone()).within(namespace);
            let Some(object) = store.get(&reference) else {
                continue;
            };
            let machine = Machine::read(candidate, object.as_ref().clone())?;
            if machine.owned_by(owner_uid) {
                return Ok(Some(machine));
            }
        }
        Ok(None)
    }
}

/// Which caches hold their initial list, by name. Each cache registers its name when it is
/// made (before any reconciler runs), so a cache added later is waited for without anyone
/// counting caches. Tracked from the watch streams rather than with
/// `Store::wait_until_ready`, whose one-shot channel wakes only the last of several concurrent
/// waiters.
#[derive(Clone, Debug, Default)]
pub(crate) struct Readiness {
    state: Arc<tokio::sync::watch::Sender<CacheFill>>,
}

#[derive(Debug, Default)]
struct CacheFill {
    registered: BTreeSet<&'static str>,
    filled: BTreeSet<&'static str>,
}

impl Readiness {
    /// Registers the cache `name`: [`Readiness::wait`] waits for it from now on.
    pub fn register(&self, name: &'static str) {
        self.state.send_modify(|fill| {
            fill.registered.insert(name);
        });
    }

    /// Marks the cache `name` as filled.
    pub fn filled(&self, name: &'static str) {
        self.state.send_modify(|fill| {
            fill.filled.insert(name);
        });
    }

    /// Waits until every registered cache holds its initial list: a decision over a
    /// half-filled cache could bind a second member to a claim whose first one is simply not
    /// listed yet.
    pub async fn wait(&self) -> Result<()> {
        let mut receiver = self.state.subscribe();
        receiver
            .wait_for(|fill| fill.registered.is_subset(&fill.filled))
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
    /// When each waiting claim's status was last written by this process, by uid.
    pub waiting_writes: LastWrites,
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
        let backoff = ErrorBackoff::new(config.min_error_backoff, config.max_error_backoff);
        Self {
            recorder: Recorder::new(client.clone(), reporter),
            client,
            config,
            metrics,
            stores,
            readiness,
            reservations: Reservations::default(),
            expectations: Expectations::default(),
            backoff,
            placements: RecentPlacements::default(),
            assignments: Mutex::default(),
            event_windows: Arc::default(),
            status_writes: LastWrites::keeping(crate::pool::decide::STATUS_COUNTS_INTERVAL),
            waiting_writes: LastWrites::keeping(crate::claim::decide::WAITING_COUNTS_INTERVAL),
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
        let event = reconcile::event(type_, reason, reason, note);
        reconcile::publish(&self.recorder, &object.object_ref(&()), &event).await;
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
                        let event =
                            reconcile::event(EventType::Normal, &reason, &reason, summary.note());
                        reconcile::publish(&recorder, &reference, &event).await;
                    }
                });
            }
        }
    }

    /// Writes `status` with a JSON merge patch on the status subresource (unguarded: the
    /// controller's statuses are its own, computed from the object it just read).
    pub async fn patch_status<K, S>(&self, api: &Api<K>, name: &str, status: &S) -> Result<K>
    where
        K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
        S: serde::Serialize,
    {
        Ok(reconcile::patch_status(api, name, status, None).await?)
    }

    /// Adds `finalizer` with the shared protocol ([`reconcile::add_finalizer`]): a JSON patch
    /// that first tests the current list, so two writers cannot clobber each other's.
    pub async fn add_finalizer<K>(&self, api: &Api<K>, object: &K, finalizer: &str) -> Result<K>
    where
        K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
    {
        Ok(reconcile::add_finalizer(api, object, finalizer).await?)
    }

    /// Removes `finalizer` with the shared protocol ([`reconcile::remove_finalizer`]); an
    /// object already gone is not an error.
    pub async fn remove_finalizer<K>(&self, api: &Api<K>, object: &K, finalizer: &str) -> Result<()>
    where
        K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
    {
        Ok(reconcile::remove_finalizer(api, object, finalizer).await?)
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

/// When this process last wrote each object's status, kept only as long as a write that old
/// can still delay a new one.
#[derive(Debug)]
pub(crate) struct LastWrites {
    keep: std::time::Duration,
    at: Mutex<HashMap<String, Instant>>,
}

impl LastWrites {
    pub fn keeping(keep: std::time::Duration) -> Self {
        Self {
            keep,
            at: Mutex::default(),
        }
    }

    /// How long ago `key` was last written, if recently enough to matter.
    pub fn since_last(&self, key: &str, now: Instant) -> Option<std::time::Duration> {
        let at = self.at.lock().unwrap_or_else(PoisonError::into_inner);
        at.get(key)
            .map(|t| now.saturating_duration_since(*t))
            .filter(|since| *since < self.keep)
    }

    pub fn wrote(&self, key: &str, now: Instant) {
        let mut at = self.at.lock().unwrap_or_else(PoisonError::into_inner);
        at.retain(|_, t| now.saturating_duration_since(*t) < self.keep);
        at.insert(key.to_owned(), now);
    }
}

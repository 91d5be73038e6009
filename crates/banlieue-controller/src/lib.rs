//! banlieue's controller: schedules VirtualMachines onto Provider failure domains (creating the
//! machine, for example a LibvirtMachine, that the Provider's backend realises), keeps
//! VirtualMachinePools warm, and hands a pool member to exactly one VirtualMachineClaim, once.
//! It never talks to a backend, and knows machine kinds only in [`machine_builder`].
//!
//! Each reconciler observes snapshots from reflector caches, decides with a pure function
//! (`scheduling`, `vm::decide`, `pool::decide`, `claim::decide`, `machine_status`) and acts with
//! a thin layer of patches. Entry point: [`run`].

// A product function stays under clippy.toml's line limit (tests may be longer).
#![cfg_attr(not(test), deny(clippy::too_many_lines))]

mod caches;
pub mod claim;
pub mod config;
mod context;
pub mod crash;
pub mod error;
mod event_window;
mod expectations;
pub mod hosts;
pub mod machine_builder;
pub mod machine_status;
pub mod member;
pub mod metrics;
mod own_writes;
pub mod pool;
mod reservations;
pub mod revision;
pub mod scheduling;
mod spread;
pub mod standby;
mod vm;

use std::future::Future;
use std::hash::Hash;
use std::sync::Arc;

use banlieue_api::{
    Provider, ProviderClass, VMClass, VMImage, VirtualMachine, VirtualMachineClaim,
    VirtualMachinePool,
};
use banlieue_api::{conditions, names};
use futures::{FutureExt, StreamExt};
use kube::api::{Api, ApiResource, DynamicObject};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Client, Resource, ResourceExt};

pub use claim::reconcile::bind_member;
pub use config::ControllerConfig;
pub use crash::{CRASH_AT_ENV, CrashPoint};
pub use error::{Error, Result};
pub use metrics::Metrics;

use caches::{Triggers, cache, dynamic_cache};
use context::{Context, MachineStores, Readiness, Stores};

/// The field manager of server-side applies and the reporting controller of Events.
pub const FIELD_MANAGER: &str = "banlieue-controller";

/// The `coordination.k8s.io` Lease whose holder is the one controller replica that acts
/// (ADR-0067); it lives in the controller's own namespace.
pub const LEASE_NAME: &str = "banlieue-controller";

/// Runs the VirtualMachine, VirtualMachinePool and VirtualMachineClaim reconcilers until
/// `shutdown` completes, then lets reconciles in flight finish.
pub async fn run(
    client: Client,
    config: ControllerConfig,
    metrics: Metrics,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<()> {
    let shutdown = shutdown.boxed().shared();
    let namespace = config.namespace.clone();

    let readiness = Readiness::default();
    // Every trigger comes from the shared caches, sent after the cache holds the change that
    // caused it: a reconcile then never reads a cache older than its trigger. (With a watch of
    // its own per controller, a member's update could wake the pool before the cache the pool
    // decides from had it, and the pool, seeing nothing new, would wait for its next resync.)
    // Each cache registers its name with `readiness` as it is made.
    let (vms, [vm_triggers, vms_for_pools, vms_for_claims], vm_reflector) =
        cache::<VirtualMachine, 3>(scoped(&client, &namespace), &readiness, "VirtualMachine");
    let (pools, [pool_triggers, pools_for_claims], pool_reflector) = cache::<VirtualMachinePool, 2>(
        scoped(&client, &namespace),
        &readiness,
        "VirtualMachinePool",
    );
    let (claims, [claim_triggers, claims_for_pools], claim_reflector) =
        cache::<VirtualMachineClaim, 2>(
            scoped(&client, &namespace),
            &readiness,
            "VirtualMachineClaim",
        );
    let (providers, [providers_for_vms, providers_for_pools], provider_reflector) =
        cache::<Provider, 2>(scoped(&client, &namespace), &readiness, "Provider");
    let (images, [images_for_vms, images_for_pools], image_reflector) =
        cache::<VMImage, 2>(scoped(&client, &namespace), &readiness, "VMImage");
    let (classes, [], class_reflector) =
        cache::<VMClass, 0>(scoped(&client, &namespace), &readiness, "VMClass");
    let (provider_classes, [], provider_class_reflector) =
        cache::<ProviderClass, 0>(Api::all(client.clone()), &readiness, "ProviderClass");
    let mut reflectors = vec![
        ("VirtualMachine", tokio::spawn(vm_reflector)),
        ("VirtualMachinePool", tokio::spawn(pool_reflector)),
        ("VirtualMachineClaim", tokio::spawn(claim_reflector)),
        ("Provider", tokio::spawn(provider_reflector)),
        ("VMImage", tokio::spawn(image_reflector)),
        ("VMClass", tokio::spawn(class_reflector)),
        ("ProviderClass", tokio::spawn(provider_class_reflector)),
    ];
    // One cache per machine kind; each wakes the VirtualMachine that controls a machine.
    let mut machines = MachineStores::default();
    let mut machine_triggers = Vec::new();
    for backend in config.machine_backends.iter() {
        let api = match &namespace {
            Some(ns) => Api::namespaced_with(client.clone(), ns, &backend.resource),
            None => Api::all_with(client.clone(), &backend.resource),
        };
        let (store, [triggers], reflector) =
            dynamic_cache::<1>(api, backend.resource.clone(), &readiness, backend.kind_name);
        reflectors.push((backend.kind_name, tokio::spawn(reflector)));
        machines.insert(backend.clone(), store);
        machine_triggers.push((triggers, backend.resource.clone()));
    }
    let stores = Stores {
        vms,
        machines,
        pools,
        claims,
        providers,
        provider_classes,
        images,
        classes,
    };
    let ctx = Arc::new(Context::new(
        client.clone(),
        config,
        metrics,
        stores,
        readiness,
    ));

    let vm_run = run_vms(
        ctx.clone(),
        VmTriggers {
            own: vm_triggers,
            machines: machine_triggers,
            providers: providers_for_vms,
            images: images_for_vms,
        },
        shutdown.clone(),
    );
    let pool_run = run_pools(
        ctx.clone(),
        PoolTriggers {
            own: pool_triggers,
            members: vms_for_pools,
            providers: providers_for_pools,
            claims: claims_for_pools,
            images: images_for_pools,
        },
        shutdown.clone(),
    );
    let claim_run = run_claims(
        ctx,
        ClaimTriggers {
            own: claim_triggers,
            members: vms_for_claims,
            pools: pools_for_claims,
        },
        shutdown.clone(),
    );

    let runs = async {
        futures::join!(vm_run, pool_run, claim_run);
    };
    supervise(runs, reflectors, shutdown, SHUTDOWN_GRACE).await
}

/// The shutdown signal every reconciler shares.
type Shutdown = futures::future::Shared<futures::future::BoxFuture<'static, ()>>;

/// What wakes the VirtualMachine reconciler.
struct VmTriggers {
    own: Triggers<VirtualMachine>,
    /// One stream per machine kind, with the kind's resource.
    machines: Vec<(Triggers<DynamicObject>, ApiResource)>,
    providers: Triggers<Provider>,
    images: Triggers<VMImage>,
}

/// The settings every reconciler runs with.
fn reconciler_config(ctx: &Context) -> kube::runtime::controller::Config {
    kube::runtime::controller::Config::default().concurrency(ctx.config.concurrent_reconciles)
}

/// The VirtualMachine reconciler: woken by its VirtualMachines, their machines, and for the
/// unscheduled ones by Providers and by their VMImage.
fn run_vms(
    ctx: Arc<Context>,
    triggers: VmTriggers,
    shutdown: Shutdown,
) -> impl Future<Output = ()> {
    let vms_for_providers = ctx.stores.vms.clone();
    let vms_for_images = ctx.stores.vms.clone();
    let controller = triggers.machines.into_iter().fold(
        Controller::for_stream(triggers.own, ctx.stores.vms.clone()),
        |controller, (machines, resource)| controller.owns_stream_with(machines, resource),
    );
    controller
        .watches_stream(triggers.providers, move |provider| {
            unscheduled_vms(&vms_for_providers, provider.namespace().as_deref(), |_| {
                true
            })
        })
        .watches_stream(triggers.images, move |image| {
            let image_name = image.name_any();
            unscheduled_vms(&vms_for_images, image.namespace().as_deref(), |vm| {
                vm.spec.image_ref.name == image_name
            })
        })
        .with_config(reconciler_config(&ctx))
        .graceful_shutdown_on(shutdown)
        .run(
            |vm, ctx| guarded("virtualmachine", vm, ctx, vm::reconcile::reconcile),
            |vm, error, ctx| error_policy("virtualmachine", vm, error, ctx),
            ctx,
        )
        .for_each(|_| futures::future::ready(()))
}

/// What wakes the VirtualMachinePool reconciler.
struct PoolTriggers {
    own: Triggers<VirtualMachinePool>,
    members: Triggers<VirtualMachine>,
    providers: Triggers<Provider>,
    claims: Triggers<VirtualMachineClaim>,
    images: Triggers<VMImage>,
}

/// The VirtualMachinePool reconciler: woken by its pools, their members, their claims, their
/// image, and every Provider of their namespace.
fn run_pools(
    ctx: Arc<Context>,
    triggers: PoolTriggers,
    shutdown: Shutdown,
) -> impl Future<Output = ()> {
    let pools_for_images = ctx.stores.pools.clone();
    let pools_for_providers = ctx.stores.pools.clone();
    Controller::for_stream(triggers.own, ctx.stores.pools.clone())
        .owns_stream(triggers.members)
        // A Provider turning not Ready starts its members' lost-host grace (ADR-0068): the
        // pool looks again then, and again when the grace ends, whether or not a member
        // changes meanwhile.
        .watches_stream(triggers.providers, move |provider| {
            let namespace = provider.namespace();
            pools_for_providers
                .state()
                .iter()
                .filter(|p| p.namespace() == namespace)
                .map(|p| ObjectRef::from_obj(p.as_ref()))
                .collect::<Vec<_>>()
        })
        .watches_stream(triggers.claims, |claim| {
            claim
                .namespace()
                .map(|ns| ObjectRef::new(&claim.spec.pool_ref.name).within(&ns))
        })
        .watches_stream(triggers.images, move |image| {
            let image_name = image.name_any();
            let image_namespace = image.namespace();
            pools_for_images
                .state()
                .iter()
                .filter(|p| {
                    p.namespace() == image_namespace
                        && p.spec.template.spec.image_ref.name == image_name
                })
                .map(|p| ObjectRef::from_obj(p.as_ref()))
                .collect::<Vec<_>>()
        })
        .with_config(reconciler_config(&ctx))
        .graceful_shutdown_on(shutdown)
        .run(
            |pool, ctx| guarded("virtualmachinepool", pool, ctx, pool::reconcile::reconcile),
            |pool, error, ctx| error_policy("virtualmachinepool", pool, error, ctx),
            ctx,
        )
        .for_each(|_| futures::future::ready(()))
}

/// What wakes the VirtualMachineClaim reconciler.
struct ClaimTriggers {
    own: Triggers<VirtualMachineClaim>,
    members: Triggers<VirtualMachine>,
    pools: Triggers<VirtualMachinePool>,
}

/// The VirtualMachineClaim reconciler: woken by its claims, their members, and for pending
/// claims by a member their pool could hand out and by the pool itself.
fn run_claims(
    ctx: Arc<Context>,
    triggers: ClaimTriggers,
    shutdown: Shutdown,
) -> impl Future<Output = ()> {
    let claims_for_members = ctx.stores.claims.clone();
    let claims_of_pools = ctx.stores.claims.clone();
    Controller::for_stream(triggers.own, ctx.stores.claims.clone())
        .watches_stream(triggers.members, move |vm| {
            let Some(ns) = vm.namespace() else {
                return Vec::new();
            };
            if let Some(claim) = vm.labels().get(names::LABEL_CLAIM) {
                return vec![ObjectRef::new(claim).within(&ns)];
            }
            // Only a member a claim could take wakes the pool's pending claims; the many
            // updates of a member on its way up would otherwise wake them all each time.
            let usable = vm.metadata.deletion_timestamp.is_none()
                && vm.status.as_ref().is_some_and(|s| {
                    conditions::is_true(&s.conditions, conditions::types::INFRASTRUCTURE_READY)
                });
            match vm.labels().get(names::LABEL_POOL) {
                Some(pool) if usable => {
                    claim::reconcile::claims_of_pool(&claims_for_members, &ns, pool, true)
                }
                _ => Vec::new(),
            }
        })
        .watches_stream(triggers.pools, move |pool| match pool.namespace() {
            Some(ns) => {
                claim::reconcile::claims_of_pool(&claims_of_pools, &ns, &pool.name_any(), false)
            }
            None => Vec::new(),
        })
        .with_config(reconciler_config(&ctx))
        .graceful_shutdown_on(shutdown)
        .run(
            |claim, ctx| {
                guarded(
                    "virtualmachineclaim",
                    claim,
                    ctx,
                    claim::reconcile::reconcile,
                )
            },
            |claim, error, ctx| error_policy("virtualmachineclaim", claim, error, ctx),
            ctx,
        )
        .for_each(|_| futures::future::ready(()))
}

/// Runs the reconcilers until they stop after `shutdown`, and fails if a cache stops first:
/// every trigger and every decision comes from the caches, so reconcilers without one would
/// run on, deaf, instead of letting the process be restarted. A controller whose store never
/// became ready holds its runner even after shutdown (kube-runtime waits for the store first),
/// so shutdown gets a bounded `grace`. The caches stop last.
async fn supervise(
    runs: impl Future<Output = ()>,
    caches: Vec<(&'static str, tokio::task::JoinHandle<()>)>,
    shutdown: impl Future<Output = ()>,
    grace: std::time::Duration,
) -> Result<()> {
    let abort: Vec<_> = caches.iter().map(|(_, c)| c.abort_handle()).collect();
    let mut ended: futures::stream::FuturesUnordered<_> = caches
        .into_iter()
        .map(|(kind, cache)| cache.map(move |_| kind))
        .collect();
    let stopping = async {
        shutdown.await;
        tokio::time::sleep(grace).await;
    };
    let outcome = tokio::select! {
        _ = runs => Ok(()),
        _ = stopping => {
            tracing::warn!(?grace, "reconcilers did not stop within the shutdown grace; stopping anyway");
            Ok(())
        }
        Some(kind) = ended.next() => Err(Error::CacheStopped { kind }),
    };
    abort.iter().for_each(tokio::task::AbortHandle::abort);
    outcome
}

/// How long reconciles in flight may take to finish once shutdown is requested.
const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(10);

/// An API for `K` in the served namespace, or in all namespaces.
fn scoped<K>(client: &Client, namespace: &Option<String>) -> Api<K>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
{
    match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

fn unscheduled_vms(
    vms: &Store<VirtualMachine>,
    namespace: Option<&str>,
    matches: impl Fn(&VirtualMachine) -> bool,
) -> Vec<ObjectRef<VirtualMachine>> {
    vms.state()
        .iter()
        .filter(|vm| {
            vm.metadata.namespace.as_deref() == namespace
                && vm.status.as_ref().is_none_or(|s| s.machine_ref.is_none())
                && matches(vm)
        })
        .map(|vm| ObjectRef::from_obj(vm.as_ref()))
        .collect()
}

fn object_key<K: Resource>(object: &K) -> String {
    format!(
        "{}/{}",
        object.meta().namespace.as_deref().unwrap_or_default(),
        object.meta().name.as_deref().unwrap_or_default()
    )
}

/// Runs a reconcile within the configured deadline and forgets the object's error backoff
/// when it succeeds.
async fn guarded<K, F, Fut>(
    controller: &'static str,
    object: Arc<K>,
    ctx: Arc<Context>,
    reconcile: F,
) -> Result<Action>
where
    K: Resource,
    F: FnOnce(Arc<K>, Arc<Context>) -> Fut,
    Fut: Future<Output = Result<Action>>,
{
    let key = format!("{controller}/{}", object_key(object.as_ref()));
    tracing::debug!(controller, object = %key, "reconcile");
    let deadline = ctx.config.reconcile_timeout;
    let result = tokio::time::timeout(deadline, reconcile(object, ctx.clone()))
        .await
        .unwrap_or(Err(Error::TimedOut { after: deadline }));
    tracing::debug!(controller, object = %key, ok = result.is_ok(), "reconciled");
    if result.is_ok() {
        ctx.backoff.succeeded(&key);
    }
    result
}

/// Records the error and retries the object after its own, growing delay.
fn error_policy<K: Resource>(
    controller: &'static str,
    object: Arc<K>,
    error: &Error,
    ctx: Arc<Context>,
) -> Action
where
    K::DynamicType: Eq + Hash,
{
    ctx.metrics
        .reconcile_error(controller, error.metric_reason());
    let key = format!("{controller}/{}", object_key(object.as_ref()));
    let delay = ctx.backoff.failed(&key);
    tracing::warn!(controller, object = %key, error = %conditions::error_message(error), ?delay, "reconcile failed");
    Action::requeue(delay)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::ObjectMeta;
    use kube::runtime::reflector;

    use super::*;

    /// A context whose client points at a port nothing listens on: these tests never reach it.
    fn offline_context(reconcile_timeout: Duration) -> Arc<Context> {
        let config = kube::Config::new("http://127.0.0.1:9".parse().unwrap());
        let client = Client::try_from(config).unwrap();
        let (vms, _) = reflector::store();
        let machines = MachineStores::default();
        let (pools, _) = reflector::store();
        let (claims, _) = reflector::store();
        let (providers, _) = reflector::store();
        let (provider_classes, _) = reflector::store();
        let (images, _) = reflector::store();
        let (classes, _) = reflector::store();
        let stores = Stores {
            vms,
            machines,
            pools,
            claims,
            providers,
            provider_classes,
            images,
            classes,
        };
        let config = ControllerConfig {
            reconcile_timeout,
            ..ControllerConfig::default()
        };
        let metrics = Metrics::register(&mut prometheus_client::registry::Registry::default());
        Arc::new(Context::new(
            client,
            config,
            metrics,
            stores,
            Readiness::default(),
        ))
    }

    fn object() -> Arc<ConfigMap> {
        Arc::new(ConfigMap {
            metadata: ObjectMeta {
                name: Some("stuck".into()),
                namespace: Some("ns".into()),
                ..ObjectMeta::default()
            },
            ..ConfigMap::default()
        })
    }

    #[tokio::test(start_paused = true)]
    async fn a_reconcile_that_never_finishes_is_cancelled_at_its_deadline() {
        let ctx = offline_context(Duration::from_secs(30));
        let started = tokio::time::Instant::now();
        let result = guarded("test", object(), ctx, |_, _| {
            std::future::pending::<Result<Action>>()
        })
        .await;
        assert!(
            matches!(result, Err(Error::TimedOut { after }) if after == Duration::from_secs(30)),
            "{result:?}"
        );
        assert_eq!(started.elapsed(), Duration::from_secs(30));
        assert_eq!(
            Error::TimedOut {
                after: Duration::ZERO
            }
            .metric_reason(),
            "Timeout"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_timed_out_reconcile_is_retried_with_backoff_and_success_forgets_it() {
        let ctx = offline_context(Duration::from_secs(1));
        let error = Error::TimedOut {
            after: Duration::from_secs(1),
        };
        let first = error_policy("test", object(), &error, ctx.clone());
        let second = error_policy("test", object(), &error, ctx.clone());
        assert_eq!(first, Action::requeue(ctx.config.min_error_backoff));
        assert_eq!(second, Action::requeue(ctx.config.min_error_backoff * 2));
        let done = guarded("test", object(), ctx.clone(), |_, _| async {
            Ok(Action::await_change())
        })
        .await;
        assert!(done.is_ok());
        let after_success = error_policy("test", object(), &error, ctx.clone());
        assert_eq!(after_success, Action::requeue(ctx.config.min_error_backoff));
    }

    #[tokio::test]
    async fn a_cache_that_stops_fails_the_run_and_the_other_caches_stop() {
        let stopped = tokio::spawn(async {});
        let other = tokio::spawn(std::future::pending::<()>());
        let other_abort = other.abort_handle();
        let result = supervise(
            std::future::pending::<()>(),
            vec![("VMImage", stopped), ("VirtualMachine", other)],
            std::future::pending::<()>(),
            Duration::from_secs(10),
        )
        .await;
        assert!(
            matches!(result, Err(Error::CacheStopped { kind: "VMImage" })),
            "{result:?}"
        );
        tokio::task::yield_now().await;
        assert!(other_abort.is_finished(), "the other caches are stopped");
    }

    #[tokio::test(start_paused = true)]
    async fn reconcilers_that_outlive_the_shutdown_grace_are_left() {
        let started = tokio::time::Instant::now();
        let cache = tokio::spawn(std::future::pending::<()>());
        let result = supervise(
            std::future::pending::<()>(),
            vec![("VirtualMachine", cache)],
            std::future::ready(()),
            Duration::from_secs(10),
        )
        .await;
        assert!(result.is_ok(), "{result:?}");
        assert_eq!(started.elapsed(), Duration::from_secs(10));
    }

    #[tokio::test]
    async fn reconcilers_that_stop_end_the_run() {
        let cache = tokio::spawn(std::future::pending::<()>());
        let cache_abort = cache.abort_handle();
        let result = supervise(
            std::future::ready(()),
            vec![("VirtualMachine", cache)],
            std::future::pending::<()>(),
            Duration::from_secs(10),
        )
        .await;
        assert!(result.is_ok(), "{result:?}");
        tokio::task::yield_now().await;
        assert!(cache_abort.is_finished());
    }
}

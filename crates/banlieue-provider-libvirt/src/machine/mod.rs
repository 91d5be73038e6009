//! LibvirtMachine realisation for one Provider, run by `banlieue provider libvirt run`: each
//! LibvirtMachine whose `spec.providerRef` names this Provider becomes a libvirt domain, and
//! is torn down under the `banlieue.io/domain-protection` finalizer.

mod agent;
pub mod guest;
pub mod host;
pub mod plan;
mod realise;
pub use realise::CRASH_AFTER_DOMAIN_DEFINE;
mod teardown;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use banlieue_api::LibvirtMachine;
use banlieue_api::names::FINALIZER_DOMAIN_PROTECTION;
use banlieue_runtime::reconcile::{self, ErrorBackoff};
use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::watcher;
use serde_json::json;
use tokio::sync::mpsc;

use crate::domain_xml::DomainType;
use crate::error::{Error, Result};
use crate::metrics::Metrics;
use banlieue_api::conditions::{self, error_message};
use host::Host;

/// Settings of one provider workload.
#[derive(Clone, Debug)]
pub struct ProviderConfig {
    /// The Provider this workload serves.
    pub provider: String,
    /// Its namespace, which is also where its LibvirtMachines live.
    pub namespace: String,
    /// How often every machine is looked at again, as a backstop to domain events.
    pub resync: Duration,
    /// Deadline of each libvirt call.
    pub call_timeout: Duration,
    /// Forces the domain type instead of deriving it from the host's capabilities
    /// (see [`crate::host::DOMAIN_TYPE_ENV`]).
    pub domain_type: Option<DomainType>,
}

impl ProviderConfig {
    /// Defaults, with the domain type taken from `BANLIEUE_LIBVIRT_DOMAIN_TYPE` when set.
    pub fn new(provider: impl Into<String>, namespace: impl Into<String>) -> ProviderConfig {
        ProviderConfig {
            provider: provider.into(),
            namespace: namespace.into(),
            resync: Duration::from_secs(60),
            call_timeout: Duration::from_secs(60),
            domain_type: std::env::var(crate::host::DOMAIN_TYPE_ENV)
                .ok()
                .and_then(|v| DomainType::parse(&v)),
        }
    }
}

struct Context {
    kube: kube::Client,
    cfg: ProviderConfig,
    host: Arc<Host>,
    metrics: Metrics,
    backoff: ErrorBackoff,
}

/// Reconciles this Provider's LibvirtMachines until `shutdown` completes, recording into
/// `metrics`.
pub async fn run_provider(
    client: kube::Client,
    cfg: ProviderConfig,
    metrics: Metrics,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) -> Result<()> {
    let host = Arc::new(Host::new(
        client.clone(),
        &cfg.namespace,
        &cfg.provider,
        cfg.domain_type,
        cfg.call_timeout,
        metrics.host_connected.clone(),
    ));
    let (ticks, tick_rx) = mpsc::channel(1);
    let events = tokio::spawn(host::forward_events(host.clone(), ticks));
    let machines: Api<LibvirtMachine> = Api::namespaced(client.clone(), &cfg.namespace);
    let ctx = Arc::new(Context {
        kube: client,
        cfg,
        host,
        metrics,
        backoff: crate::error::error_backoff(),
    });
    Controller::new(machines, watcher::Config::default())
        .reconcile_all_on(futures::stream::unfold(tick_rx, |mut rx| async move {
            rx.recv().await.map(|tick| (tick, rx))
        }))
        .graceful_shutdown_on(shutdown)
        .run(
            |machine, ctx| async move {
                let key = ErrorBackoff::key_of("machine", machine.as_ref());
                let outcome = reconcile(machine, ctx.clone()).await;
                if outcome.is_ok() {
                    ctx.backoff.succeeded(&key);
                }
                outcome
            },
            error_policy,
            ctx,
        )
        .for_each(|result| async move {
            if let Err(e) = result {
                tracing::debug!(error = %error_message(&e), "machine reconcile");
            }
        })
        .await;
    events.abort();
    Ok(())
}

fn error_policy(machine: Arc<LibvirtMachine>, error: &Error, ctx: Arc<Context>) -> Action {
    ctx.metrics.reconcile_error(error.reason());
    let delay = ctx
        .backoff
        .failed(&ErrorBackoff::key_of("machine", machine.as_ref()));
    tracing::warn!(error = %error_message(error), ?delay, "machine reconcile failed");
    Action::requeue(delay)
}

#[tracing::instrument(skip_all, fields(machine = %machine.name_any()))]
async fn reconcile(machine: Arc<LibvirtMachine>, ctx: Arc<Context>) -> Result<Action> {
    if machine.spec.provider_ref.name != ctx.cfg.provider {
        return Ok(Action::await_change());
    }
    let api: Api<LibvirtMachine> = Api::namespaced(ctx.kube.clone(), &ctx.cfg.namespace);
    if machine.metadata.deletion_timestamp.is_some() {
        return teardown::run(&machine, &api, &ctx).await;
    }
    if !machine
        .finalizers()
        .iter()
        .any(|f| f == FINALIZER_DOMAIN_PROTECTION)
    {
        crate::finalizers::add(&api, &*machine, FINALIZER_DOMAIN_PROTECTION).await?;
        // The patch wakes the controller again with the new object.
        return Ok(Action::await_change());
    }
    // The UUID is chosen and recorded before anything exists on the host: it is the seed's
    // instance-id and the upsert guard's proof of ownership, so it must survive a crash
    // between building the seed and defining the domain.
    let Some(uuid) = machine.status.as_ref().and_then(|s| s.domain_uuid.clone()) else {
        let uuid = uuid::Uuid::new_v4().to_string();
        let names = plan::MachineNames::of(&machine);
        let recorded = patch_status(
            &api,
            &machine,
            json!({ "domainUuid": uuid, "domainName": names.domain }),
        )
        .await?;
        return Ok(if recorded {
            Action::await_change()
        } else {
            Action::requeue(AFTER_CONFLICT)
        });
    };

    let outcome = realise::run(&machine, &uuid, &ctx).await;
    if let Err(e) = &outcome {
        ctx.metrics.reconcile_error(e.reason());
        if e.is_connection_lost() {
            ctx.host.forget().await;
        }
    }
    let status = plan::status_after(
        &machine,
        &ctx.cfg.namespace,
        &ctx.cfg.provider,
        &outcome,
        now(),
    );
    if Some(&status) != machine.status.as_ref()
        && !patch_status(
            &api,
            &machine,
            serde_json::to_value(&status).unwrap_or_default(),
        )
        .await?
    {
        return Ok(Action::requeue(AFTER_CONFLICT));
    }
    let guest_ready = |s: &banlieue_api::LibvirtMachineStatus| {
        conditions::is_true(&s.contract.conditions, conditions::types::GUEST_READY)
    };
    if guest_ready(&status)
        && !machine.status.as_ref().is_some_and(guest_ready)
        && let Some(created) = &machine.metadata.creation_timestamp
    {
        let waited = now().0.duration_since(created.0);
        ctx.metrics
            .guest_ready_latency
            .observe(waited.as_secs_f64().max(0.0));
    }
    let was_ready = machine.status.as_ref().is_some_and(|s| s.contract.ready);
    if status.contract.ready
        && !was_ready
        && let Some(created) = &machine.metadata.creation_timestamp
    {
        let waited = now().0.duration_since(created.0);
        ctx.metrics
            .machine_ready_latency
            .observe(waited.as_secs_f64().max(0.0));
    }
    Ok(match &outcome {
        Ok(o) if o.running && guest_settling(&status) => {
            Action::requeue(guest_poll_interval(&status, ctx.cfg.resync))
        }
        Ok(o) if o.running => Action::requeue(ctx.cfg.resync),
        // A domain starting, or an error: look again soon.
        _ => Action::requeue(Duration::from_secs(5).min(ctx.cfg.resync)),
    })
}

/// The guest has not said its final word for this boot: look again before the resync.
fn guest_settling(status: &banlieue_api::LibvirtMachineStatus) -> bool {
    conditions::find(
        &status.contract.conditions,
        banlieue_api::conditions::types::GUEST_READY,
    )
    .is_some_and(guest::still_settling)
}

/// How soon a settling guest is read again: a quarter of the time its GuestReady has been
/// unchanged, between 2 s and the resync. A booting guest is asked often; a guest without the
/// layer (or without an agent) soon only at the resync.
fn guest_poll_interval(status: &banlieue_api::LibvirtMachineStatus, resync: Duration) -> Duration {
    let since = conditions::find(
        &status.contract.conditions,
        banlieue_api::conditions::types::GUEST_READY,
    )
    .map(|c| now().0.duration_since(c.last_transition_time.0))
    .and_then(|d| Duration::try_from(d).ok())
    .unwrap_or_default();
    (since / 4).clamp(Duration::from_secs(2), resync.max(Duration::from_secs(2)))
}

/// Patches the status, guarded by the resourceVersion the reconcile read. The reconcile sees
/// the controller's cache, which can lag behind its own last write; an unguarded write from a
/// stale copy would, for example, replace a recorded domain UUID with a new one after the
/// domain was defined with the first. Returns false when the object changed meanwhile (409):
/// the caller looks again at the fresh object.
async fn patch_status(
    api: &Api<LibvirtMachine>,
    machine: &LibvirtMachine,
    status: serde_json::Value,
) -> Result<bool> {
    let name = machine.name_any();
    let version = machine.resource_version();
    match reconcile::patch_status(api, &name, &status, version.as_deref()).await {
        Ok(_) => Ok(true),
        Err(e) if e.is_stale() => Ok(false),
        Err(reconcile::PatchError::Kube(source)) => Err(Error::Kube {
            what: format!("patch LibvirtMachine {name} status"),
            source,
        }),
        Err(reconcile::PatchError::Encode(source)) => Err(Error::Encode {
            what: format!("patch LibvirtMachine {name} status"),
            source,
        }),
    }
}

/// Retry soon after a write lost to a concurrent change.
const AFTER_CONFLICT: Duration = Duration::from_millis(500);

fn now() -> Time {
    Time(k8s_openapi::jiff::Timestamp::now())
}

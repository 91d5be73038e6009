//! VSphereMachine realisation for one Provider, run by `banlieue provider vsphere run`: each
//! VSphereMachine whose `spec.providerRef` names this Provider becomes a VM cloned from its
//! template, and is destroyed under the `banlieue.io/vm-protection` finalizer.

pub mod plan;
mod realise;
mod teardown;
pub mod watch;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use banlieue_api::VSphereMachine;
use banlieue_api::conditions::error_message;
use banlieue_api::vsphere::FINALIZER_VM_PROTECTION;
use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::watcher;
use serde_json::json;
use tokio::sync::mpsc;

use crate::error::{Error, Result};
use crate::session::Session;

/// Settings of one provider workload.
#[derive(Clone, Debug)]
pub struct ProviderConfig {
    /// The Provider this workload serves.
    pub provider: String,
    /// Its namespace, which is also where its VSphereMachines live.
    pub namespace: String,
    /// How often every machine is looked at again, as a backstop to the property waits.
    pub resync: Duration,
    /// Deadline of each vSphere task (clone, reconfigure, power, destroy).
    pub task_timeout: Duration,
}

impl ProviderConfig {
    /// Defaults: a resync every 60 s, 10 minutes per task (a full clone on slow storage).
    pub fn new(provider: impl Into<String>, namespace: impl Into<String>) -> ProviderConfig {
        ProviderConfig {
            provider: provider.into(),
            namespace: namespace.into(),
            resync: Duration::from_secs(60),
            task_timeout: Duration::from_secs(600),
        }
    }
}

struct Context {
    kube: kube::Client,
    cfg: ProviderConfig,
    session: Arc<Session>,
}

/// Reconciles this Provider's VSphereMachines until `shutdown` completes. A property wait on
/// the VMs (their power state, guest NICs and guest phase) wakes the machines when one of
/// theirs changed.
pub async fn run_provider(
    client: kube::Client,
    cfg: ProviderConfig,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) -> Result<()> {
    let session = Arc::new(Session::new(client.clone(), &cfg.namespace, &cfg.provider));
    // One pending wake-up is enough: it reconciles every machine, so a burst of VM changes
    // collapses into one pass.
    let (wake, woken) = mpsc::channel(1);
    let pump = tokio::spawn(watch::run(session.clone(), cfg.namespace.clone(), wake));
    let machines: Api<VSphereMachine> = Api::namespaced(client.clone(), &cfg.namespace);
    let ctx = Arc::new(Context {
        kube: client,
        cfg,
        session,
    });
    Controller::new(machines, watcher::Config::default())
        .reconcile_all_on(futures::stream::unfold(woken, |mut rx| async move {
            rx.recv().await.map(|tick| (tick, rx))
        }))
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, ctx)
        .for_each(|result| async move {
            if let Err(e) = result {
                tracing::debug!(error = %error_message(&e), "machine reconcile");
            }
        })
        .await;
    pump.abort();
    Ok(())
}

fn error_policy(_machine: Arc<VSphereMachine>, error: &Error, _ctx: Arc<Context>) -> Action {
    tracing::warn!(error = %error_message(error), "machine reconcile failed");
    Action::requeue(Duration::from_secs(5))
}

#[tracing::instrument(skip_all, fields(machine = %machine.name_any()))]
async fn reconcile(machine: Arc<VSphereMachine>, ctx: Arc<Context>) -> Result<Action> {
    if machine.spec.provider_ref.name != ctx.cfg.provider {
        return Ok(Action::await_change());
    }
    let api: Api<VSphereMachine> = Api::namespaced(ctx.kube.clone(), &ctx.cfg.namespace);
    if machine.metadata.deletion_timestamp.is_some() {
        return teardown::run(&machine, &api, &ctx).await;
    }
    if !machine
        .finalizers()
        .iter()
        .any(|f| f == FINALIZER_VM_PROTECTION)
    {
        let mut finalizers = machine.finalizers().to_vec();
        finalizers.push(FINALIZER_VM_PROTECTION.to_owned());
        patch_finalizers(&api, &machine, finalizers).await?;
        return Ok(Action::await_change());
    }
    let outcome = realise::run(&machine, &ctx).await;
    if let Err(e) = &outcome
        && e.is_session_lost()
    {
        ctx.session.forget().await;
    }
    let status = plan::status_after(&machine, &outcome, now());
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
    Ok(match &outcome {
        // The property wait wakes the machine on every change; this is the backstop.
        Ok(o) if o.powered_on && plan::guest_settling(&status) => {
            Action::requeue(Duration::from_secs(10).min(ctx.cfg.resync))
        }
        Ok(o) if o.powered_on => Action::requeue(ctx.cfg.resync),
        _ => Action::requeue(Duration::from_secs(5).min(ctx.cfg.resync)),
    })
}

/// Sets the finalizer list, guarded by the resourceVersion so a concurrent writer's finalizer
/// is never dropped.
async fn patch_finalizers(
    api: &Api<VSphereMachine>,
    machine: &VSphereMachine,
    finalizers: Vec<String>,
) -> Result<()> {
    let name = machine.name_any();
    api.patch(
        &name,
        &PatchParams::default(),
        &Patch::Merge(json!({
            "metadata": {
                "resourceVersion": machine.resource_version(),
                "finalizers": finalizers,
            }
        })),
    )
    .await
    .map_err(Error::kube(format!(
        "update the finalizers of VSphereMachine {name}"
    )))?;
    Ok(())
}

/// Patches the status, guarded by the resourceVersion the reconcile read, so a stale cache
/// never overwrites a newer status. False when the object changed meanwhile (409).
async fn patch_status(
    api: &Api<VSphereMachine>,
    machine: &VSphereMachine,
    status: serde_json::Value,
) -> Result<bool> {
    let name = machine.name_any();
    match api
        .patch_status(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({
                "metadata": { "resourceVersion": machine.resource_version() },
                "status": status,
            })),
        )
        .await
    {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
        Err(e) => Err(Error::kube(format!("patch VSphereMachine {name} status"))(
            e,
        )),
    }
}

/// Retry soon after a write lost to a concurrent change.
const AFTER_CONFLICT: Duration = Duration::from_millis(500);

fn now() -> Time {
    Time(k8s_openapi::jiff::Timestamp::now())
}

//! The Provider reconcile, run inside `banlieue controller`: connect to the host, narrow the
//! declared capabilities, publish one failure domain, and keep the Provider's workload
//! (ADR-0012) applied.

pub mod probe;
pub mod workloads;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use banlieue_api::conditions::{self, Condition, reasons, status, types};
use banlieue_api::{Provider, ProviderClass, ProviderStatus};
use banlieue_libvirt::{Client, Network, StoragePool};
use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Resource, ResourceExt};
use serde::Serialize;
use serde_json::json;

use crate::connection;
use crate::error::{Error, Result};
use banlieue_api::conditions::error_message;
use probe::HostInventory;
use workloads::{FIELD_MANAGER, LABEL_PROVIDER_NAMESPACE, MANAGED_BY, Workloads};

/// Finalizer through which the operator removes a Provider's cluster-scoped objects, which
/// the garbage collector cannot tie to a namespaced owner.
pub const FINALIZER_PROVIDER_WORKLOADS: &str = "banlieue.io/provider-workloads";

/// Settings of the operator.
#[derive(Clone, Debug)]
pub struct OperatorConfig {
    /// How often a Provider's host is probed again when nothing changed.
    pub probe_interval: Duration,
    /// Deadline of each libvirt call of a probe.
    pub call_timeout: Duration,
    /// Watch only this namespace; `None` for every namespace.
    pub namespace: Option<String>,
}

impl Default for OperatorConfig {
    fn default() -> Self {
        OperatorConfig {
            probe_interval: Duration::from_secs(60),
            call_timeout: Duration::from_secs(30),
            namespace: None,
        }
    }
}

struct Context {
    kube: kube::Client,
    cfg: OperatorConfig,
    recorder: Recorder,
}

/// Runs the Provider reconcile until `shutdown` completes.
pub async fn run_operator(
    client: kube::Client,
    cfg: OperatorConfig,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) -> Result<()> {
    let providers: Api<Provider> = match &cfg.namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    let owned = |c: &kube::Client| -> (
        Api<Deployment>,
        Api<ServiceAccount>,
        Api<Role>,
        Api<RoleBinding>,
    ) {
        match &cfg.namespace {
            Some(ns) => (
                Api::namespaced(c.clone(), ns),
                Api::namespaced(c.clone(), ns),
                Api::namespaced(c.clone(), ns),
                Api::namespaced(c.clone(), ns),
            ),
            None => (
                Api::all(c.clone()),
                Api::all(c.clone()),
                Api::all(c.clone()),
                Api::all(c.clone()),
            ),
        }
    };
    let (deployments, accounts, roles, bindings) = owned(&client);
    let managed = watcher::Config::default().labels(&format!(
        "{}={MANAGED_BY}",
        banlieue_api::names::LABEL_MANAGED_BY
    ));
    let ctx = Arc::new(Context {
        recorder: Recorder::new(
            client.clone(),
            Reporter {
                controller: FIELD_MANAGER.into(),
                instance: None,
            },
        ),
        kube: client.clone(),
        cfg,
    });
    let classes: Api<ProviderClass> = Api::all(client.clone());
    let provider_store_holder = Controller::new(providers, watcher::Config::default());
    let store = provider_store_holder.store();
    provider_store_holder
        .owns(deployments, managed.clone())
        .owns(accounts, managed.clone())
        .owns(roles, managed.clone())
        .owns(bindings, managed.clone())
        .watches(
            Api::<ClusterRoleBinding>::all(client.clone()),
            managed,
            |crb| {
                let labels = crb.labels();
                let name = labels.get(banlieue_api::names::LABEL_PROVIDER)?;
                let ns = labels.get(LABEL_PROVIDER_NAMESPACE)?;
                Some(ObjectRef::<Provider>::new(name).within(ns))
            },
        )
        .watches(classes, watcher::Config::default(), move |class| {
            // A changed class changes every one of its Providers' workloads.
            let name = class.name_any();
            store
                .state()
                .into_iter()
                .filter(|p| p.spec.provider_class_ref.name == name)
                .map(|p| ObjectRef::from_obj(&*p))
                .collect::<Vec<_>>()
        })
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, ctx)
        .for_each(|result| async move {
            if let Err(e) = result {
                tracing::debug!(error = %error_message(&e), "provider reconcile");
            }
        })
        .await;
    Ok(())
}

fn error_policy(_provider: Arc<Provider>, error: &Error, _ctx: Arc<Context>) -> Action {
    tracing::warn!(error = %error_message(error), "provider reconcile failed");
    Action::requeue(Duration::from_secs(5))
}

#[tracing::instrument(skip_all, fields(provider = %provider.name_any()))]
async fn reconcile(provider: Arc<Provider>, ctx: Arc<Context>) -> Result<Action> {
    let ns = provider.namespace().unwrap_or_default();
    let name = provider.name_any();
    let api: Api<Provider> = Api::namespaced(ctx.kube.clone(), &ns);

    if provider.metadata.deletion_timestamp.is_some() {
        return cleanup(&provider, &api, &ctx).await;
    }
    ensure_finalizer(&provider, &api).await?;

    let class_name = &provider.spec.provider_class_ref.name;
    let classes: Api<ProviderClass> = Api::all(ctx.kube.clone());
    let class = classes
        .get_opt(class_name)
        .await
        .map_err(Error::kube(format!("read ProviderClass {class_name}")))?;
    let outcome = match &class {
        Some(class) => {
            if let Some(w) = workloads::build(&provider, class) {
                apply_workloads(&ctx.kube, &ns, &w).await?;
            }
            probe(&provider, &ctx).await
        }
        None => Err(Error::Invalid {
            reason: reasons::PROVIDER_CLASS_NOT_FOUND,
            message: format!("ProviderClass {class_name:?} does not exist"),
        }),
    };

    let generation = provider.metadata.generation;
    let (ready, failure_domains) = match &outcome {
        Ok(narrowed) => (
            probe::ready_condition(narrowed, generation),
            vec![narrowed.failure_domain.clone()],
        ),
        // Not reached: publish nothing, a Provider never advertises a host it cannot reach.
        Err(e) => (
            conditions::new(
                types::READY,
                status::FALSE,
                e.reason(),
                error_message(e),
                generation,
            ),
            Vec::new(),
        ),
    };
    publish_status(&provider, &api, &ctx, ready, failure_domains).await?;
    tracing::debug!(%name, "provider reconciled");

    Ok(match outcome {
        // A scheme error is the spec's fault: nothing changes until the spec does.
        Err(Error::UnsupportedScheme(_)) => Action::await_change(),
        _ => Action::requeue(ctx.cfg.probe_interval),
    })
}

/// Connects with the Provider's credentials and narrows its declaration.
async fn probe(provider: &Provider, ctx: &Context) -> Result<probe::Narrowed> {
    let endpoint = &provider.spec.connection.endpoint;
    connection::check_endpoint(endpoint)?;
    let creds = connection::load(&ctx.kube, provider).await?;
    let client = connection::connect(
        endpoint,
        &creds,
        connection::client_options(ctx.cfg.call_timeout),
    )
    .await?;
    let inventory = inventory(&client).await;
    let _ = client.close().await;
    Ok(probe::narrow(&provider.spec.capabilities, &inventory?))
}

async fn inventory(client: &Client) -> Result<HostInventory> {
    let hostname = client
        .hostname()
        .await
        .map_err(Error::libvirt("read the host name"))?;
    let pools = StoragePool::list_all(client, 0)
        .await
        .map_err(Error::libvirt("list storage pools"))?
        .iter()
        .map(|p| p.name().to_owned())
        .collect();
    let networks = Network::list_all(client, 0)
        .await
        .map_err(Error::libvirt("list networks"))?
        .iter()
        .map(|n| n.name().to_owned())
        .collect();
    Ok(HostInventory {
        hostname,
        pools,
        networks,
    })
}

async fn publish_status(
    provider: &Provider,
    api: &Api<Provider>,
    ctx: &Context,
    ready: Condition,
    failure_domains: Vec<banlieue_api::FailureDomain>,
) -> Result<()> {
    let old = provider.status.clone().unwrap_or_default();
    let previous = conditions::find(&old.conditions, types::READY).cloned();
    let mut new = ProviderStatus {
        conditions: old.conditions.clone(),
        failure_domains,
        observed_generation: provider.metadata.generation,
    };
    conditions::set(&mut new.conditions, ready.clone(), now());
    if new == old {
        return Ok(());
    }
    api.patch_status(
        &provider.name_any(),
        &PatchParams::default(),
        &Patch::Merge(json!({ "status": new })),
    )
    .await
    .map_err(Error::kube("patch Provider status"))?;

    let transitioned = previous
        .as_ref()
        .is_none_or(|p| p.status != ready.status || p.reason != ready.reason);
    if transitioned {
        let event = Event {
            type_: if ready.status == status::TRUE {
                EventType::Normal
            } else {
                EventType::Warning
            },
            reason: ready.reason.clone(),
            note: Some(truncate(&ready.message, 1000)),
            action: "Probe".into(),
            secondary: None,
        };
        // An event is a courtesy to the reader; failing to record one changes nothing.
        if let Err(e) = ctx
            .recorder
            .publish(&event, &provider.object_ref(&()))
            .await
        {
            tracing::debug!(error = %error_message(&e), "record provider event");
        }
    }
    Ok(())
}

async fn apply_workloads(kube: &kube::Client, ns: &str, w: &Workloads) -> Result<()> {
    apply(
        Api::<ServiceAccount>::namespaced(kube.clone(), ns),
        &w.service_account,
    )
    .await?;
    apply(Api::<Role>::namespaced(kube.clone(), ns), &w.role).await?;
    apply(
        Api::<RoleBinding>::namespaced(kube.clone(), ns),
        &w.role_binding,
    )
    .await?;
    apply(Api::<ClusterRole>::all(kube.clone()), &w.cluster_role).await?;
    apply(
        Api::<ClusterRoleBinding>::all(kube.clone()),
        &w.cluster_role_binding,
    )
    .await?;
    apply(
        Api::<Deployment>::namespaced(kube.clone(), ns),
        &w.deployment,
    )
    .await?;
    Ok(())
}

async fn apply<K>(api: Api<K>, object: &K) -> Result<()>
where
    K: Resource<DynamicType = ()>
        + Clone
        + Serialize
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let name = object.meta().name.clone().unwrap_or_default();
    let mut value = serde_json::to_value(object).map_err(|e| Error::Invalid {
        reason: reasons::PROVIDER_NOT_READY,
        message: format!("serialize {} {name}: {e}", K::kind(&())),
    })?;
    value["apiVersion"] = K::api_version(&()).into();
    value["kind"] = K::kind(&()).into();
    api.patch(
        &name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(value),
    )
    .await
    .map_err(Error::kube(format!("apply {} {name}", K::kind(&()))))?;
    Ok(())
}

async fn ensure_finalizer(provider: &Provider, api: &Api<Provider>) -> Result<()> {
    if provider
        .finalizers()
        .iter()
        .any(|f| f == FINALIZER_PROVIDER_WORKLOADS)
    {
        return Ok(());
    }
    let mut finalizers = provider.finalizers().to_vec();
    finalizers.push(FINALIZER_PROVIDER_WORKLOADS.to_owned());
    crate::finalizers::patch(api, provider, finalizers).await
}

async fn cleanup(provider: &Provider, api: &Api<Provider>, ctx: &Context) -> Result<Action> {
    if !provider
        .finalizers()
        .iter()
        .any(|f| f == FINALIZER_PROVIDER_WORKLOADS)
    {
        return Ok(Action::await_change());
    }
    let ns = provider.namespace().unwrap_or_default();
    let crb = workloads::cluster_role_binding_name(&ns, &provider.name_any());
    match Api::<ClusterRoleBinding>::all(ctx.kube.clone())
        .delete(&crb, &DeleteParams::default())
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 404 => {}
        Err(e) => return Err(Error::kube(format!("delete ClusterRoleBinding {crb}"))(e)),
    }
    let finalizers = provider
        .finalizers()
        .iter()
        .filter(|f| *f != FINALIZER_PROVIDER_WORKLOADS)
        .cloned()
        .collect();
    crate::finalizers::patch(api, provider, finalizers).await?;
    Ok(Action::await_change())
}

fn now() -> Time {
    Time(k8s_openapi::jiff::Timestamp::now())
}

fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_owned();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_owned()
}

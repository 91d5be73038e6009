//! The Provider operator, run inside `banlieue controller`: it creates and repairs each
//! Provider's workload (ADR-0012) and nothing else. It never reads a Secret and never talks to
//! a backend; the workload probes its host and publishes the Provider's readiness through
//! [`provider_status`] (ADR-0063). It serves every backend it is given: a class's machine kind
//! picks the [`BackendWorkload`] of [`OperatorConfig::backends`] (the binary's list of backend
//! descriptors), which says which `provider <backend> run` its workload is. Nothing here names
//! a backend.
//!
//! The operator writes the Provider's Ready condition only while the workload cannot:
//! the class is missing (`ProviderClassNotFound`), the administrator's class role is missing
//! (`ProviderClassRoleMissing`), the workload has not reported yet (`WorkloadStarting`), or the
//! Provider is being deleted while machines remain (`MachinesRemain`).

// A product function stays under clippy.toml's line limit (tests may be longer).
#![cfg_attr(not(test), deny(clippy::too_many_lines))]

mod error;
pub mod workloads;

pub use error::{Error, Result};

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use banlieue_api::conditions::{self, Condition, error_message, reasons, status, types};
use banlieue_api::{MachineSpecContract, Provider, ProviderClass};
use banlieue_runtime::reconcile::ErrorBackoff;
use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding, Subject};
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Resource, ResourceExt};
use serde::{Deserialize as _, Serialize};

use banlieue_api::backend::BackendWorkload;
use banlieue_provider_kit::import_settings::ImportSettings;
use banlieue_provider_kit::provider_status;
use workloads::{FIELD_MANAGER, LABEL_PROVIDER_NAMESPACE, MANAGED_BY, Workloads};

/// Finalizer through which the operator keeps a Provider until its machines are gone and then
/// removes the Provider's objects outside its namespace, which the garbage collector cannot tie
/// to a namespaced owner.
pub const FINALIZER_PROVIDER_WORKLOADS: &str = "banlieue.io/provider-workloads";

/// Reasons of the Ready condition the operator owns; any other reason is the workload's.
const OPERATOR_REASONS: [&str; 4] = [
    reasons::PROVIDER_CLASS_NOT_FOUND,
    reasons::PROVIDER_CLASS_ROLE_MISSING,
    reasons::WORKLOAD_STARTING,
    reasons::MACHINES_REMAIN,
];

/// Settings of the operator.
#[derive(Clone, Debug)]
pub struct OperatorConfig {
    /// How often a Provider's workload is looked at again when nothing changed.
    pub resync: Duration,
    /// How often a Provider being deleted is looked at while machines remain.
    pub deletion_poll: Duration,
    /// Watch only this namespace; `None` for every namespace.
    pub namespace: Option<String>,
    /// The workloads of the machine kinds this build runs providers for, from the binary's
    /// list of backend descriptors. A class of another kind is `UnsupportedMachineKind`.
    pub backends: Vec<BackendWorkload>,
}

impl OperatorConfig {
    /// The workload of the providers of `kind`, when this build has one.
    pub fn backend(&self, kind: &banlieue_api::MachineKind) -> Option<&BackendWorkload> {
        self.backends.iter().find(|backend| backend.kind == *kind)
    }
}

impl Default for OperatorConfig {
    fn default() -> Self {
        OperatorConfig {
            resync: Duration::from_secs(300),
            deletion_poll: Duration::from_secs(5),
            namespace: None,
            backends: Vec::new(),
        }
    }
}

struct Context {
    kube: kube::Client,
    cfg: OperatorConfig,
    recorder: Recorder,
    backoff: ErrorBackoff,
}

/// Runs the Provider operator until `shutdown` completes.
pub async fn run_operator(
    client: kube::Client,
    cfg: OperatorConfig,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) -> Result<()> {
    fn scoped<K>(c: &kube::Client, ns: &Option<String>) -> Api<K>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
    {
        match ns {
            Some(ns) => Api::namespaced(c.clone(), ns),
            None => Api::all(c.clone()),
        }
    }
    let ns = cfg.namespace.clone();
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
        backoff: banlieue_provider_kit::error_backoff(),
    });
    let classes: Api<ProviderClass> = Api::all(client.clone());
    let controller = Controller::new(scoped::<Provider>(&client, &ns), watcher::Config::default());
    let store = controller.store();
    let missing_store = store.clone();
    // A machine naming a new user-data Secret changes its Provider's Role.
    let controller = ctx
        .cfg
        .backends
        .iter()
        .fold(controller, |controller, backend| {
            let api = match &ns {
                Some(ns) => {
                    Api::<DynamicObject>::namespaced_with(client.clone(), ns, &backend.machines)
                }
                None => Api::<DynamicObject>::all_with(client.clone(), &backend.machines),
            };
            let machines = watcher::watcher(api, watcher::Config::default())
                .default_backoff()
                .applied_objects()
                .predicate_filter(grant_relevant, Default::default());
            controller.watches_stream_with(
                machines,
                |machine| provider_of_machine(&machine),
                backend.machines.clone(),
            )
        });
    controller
        .owns(scoped::<Deployment>(&client, &ns), managed.clone())
        .owns(scoped::<ServiceAccount>(&client, &ns), managed.clone())
        .owns(scoped::<Role>(&client, &ns), managed.clone())
        .owns(scoped::<RoleBinding>(&client, &ns), managed)
        // The shared binding, by name (the only one the operator may read): a Provider whose
        // account an edit removed joins again.
        .watches(
            Api::<ClusterRoleBinding>::all(client.clone()),
            watcher::Config::default().fields(&format!(
                "metadata.name={}",
                workloads::PROVIDERS_CLUSTER_BINDING
            )),
            move |binding| {
                let subjects = binding.subjects.unwrap_or_default();
                missing_store
                    .state()
                    .into_iter()
                    .filter(|p| p.metadata.deletion_timestamp.is_none())
                    .filter(|p| {
                        let subject = workloads::provider_subject(p);
                        workloads::cluster_subjects(&subjects, &subject, true).is_some()
                    })
                    .map(|p| ObjectRef::from_obj(&*p))
                    .collect::<Vec<_>>()
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
        .run(
            |provider, ctx| async move {
                let key = ErrorBackoff::key_of("provider", provider.as_ref());
                ctx.backoff
                    .track(&key, reconcile(provider, ctx.clone()).await)
            },
            error_policy,
            ctx,
        )
        .for_each(|result| async move {
            if let Err(e) = result {
                tracing::debug!(error = %error_message(&e), "provider reconcile");
            }
        })
        .await;
    Ok(())
}

fn error_policy(provider: Arc<Provider>, error: &Error, ctx: Arc<Context>) -> Action {
    let delay = ctx
        .backoff
        .failed(&ErrorBackoff::key_of("provider", provider.as_ref()));
    tracing::warn!(error = %error_message(error), ?delay, "provider reconcile failed");
    Action::requeue(delay)
}

#[tracing::instrument(skip_all, fields(provider = %provider.name_any()))]
async fn reconcile(provider: Arc<Provider>, ctx: Arc<Context>) -> Result<Action> {
    let ns = provider.namespace().unwrap_or_default();
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
        None => Err(Error::Invalid {
            reason: reasons::PROVIDER_CLASS_NOT_FOUND,
            message: format!("ProviderClass {class_name:?} does not exist"),
        }),
        Some(class) => match ctx.cfg.backend(&class.spec.machine_kind) {
            None => Err(Error::Invalid {
                reason: banlieue_provider_kit::reasons::UNSUPPORTED_MACHINE_KIND,
                message: format!(
                    "ProviderClass {class_name:?} realises {} machines, which this operator \
                     runs no provider for",
                    class.spec.machine_kind
                ),
            }),
            Some(backend) => reconcile_workloads(&ctx.kube, &provider, class, backend).await,
        },
    };
    // The API server failing is transient: retry with backoff, publish nothing.
    if matches!(outcome, Err(Error::Kube { .. })) {
        return outcome.map(|()| Action::await_change());
    }
    let generation = provider.metadata.generation;
    let ready = match &outcome {
        Ok(()) => conditions::new(
            types::READY,
            status::FALSE,
            reasons::WORKLOAD_STARTING,
            format!(
                "waiting for the provider workload {} to probe the host",
                workloads::workload_name(&provider.name_any())
            ),
            generation,
        ),
        Err(e) => conditions::new(
            types::READY,
            status::FALSE,
            e.reason(),
            error_message(e),
            generation,
        ),
    };
    // Once the workload has reported, Ready is the workload's until the operator has something
    // to say that the workload cannot.
    let workload_reported =
        current_ready(&provider).is_some_and(|c| !OPERATOR_REASONS.contains(&c.reason.as_str()));
    if outcome.is_err() || !workload_reported {
        publish(&provider, &api, &ctx, ready).await?;
    }
    Ok(Action::requeue(ctx.cfg.resync))
}

fn current_ready(provider: &Provider) -> Option<&Condition> {
    provider
        .status
        .as_ref()
        .and_then(|s| conditions::find(&s.conditions, types::READY))
}

async fn publish(
    provider: &Provider,
    api: &Api<Provider>,
    ctx: &Context,
    ready: Condition,
) -> Result<()> {
    // Failure domains are only ever published by a probe that reached the host.
    let domains = if ready.reason == reasons::WORKLOAD_STARTING {
        provider
            .status
            .as_ref()
            .map(|s| s.failure_domains.clone())
            .unwrap_or_default()
    } else {
        Vec::new()
    };
    provider_status::publish(api, &ctx.recorder, provider, ready, domains)
        .await
        .map_err(Error::kube("patch Provider status"))
}

/// Builds `provider`'s workloads, granting the user-data Secrets its machines name, and
/// applies them.
async fn reconcile_workloads(
    kube: &kube::Client,
    provider: &Provider,
    class: &ProviderClass,
    backend: &BackendWorkload,
) -> Result<()> {
    let ns = provider.namespace().unwrap_or_default();
    let machines = Api::<DynamicObject>::namespaced_with(kube.clone(), &ns, &backend.machines)
        .list(&ListParams::default())
        .await
        .map_err(Error::kube(format!("list {}s", backend.machines.kind)))?;
    let providers = Api::<Provider>::namespaced(kube.clone(), &ns)
        .list(&ListParams::default())
        .await
        .map_err(Error::kube("list Providers".to_owned()))?;
    let user_data = grantable_user_data(
        user_data_secrets(&machines.items, &provider.name_any()),
        provider,
        &providers.items,
    );
    match workloads::build(provider, class, backend, &user_data) {
        Some(w) => apply_workloads(kube, provider, class, backend, &w).await,
        None => Ok(()),
    }
}

/// Applies the workload in dependency order: accounts and grants before the Deployment that
/// runs with them. A class role the administrator has not created (or not allowed the operator
/// to bind) stops here with `ProviderClassRoleMissing`, before anything runs.
async fn apply_workloads(
    kube: &kube::Client,
    provider: &Provider,
    class: &ProviderClass,
    backend: &BackendWorkload,
    w: &Workloads,
) -> Result<()> {
    if w.binds_class_role {
        check_class_role(kube, class, backend, &w.class_binding.role_ref.name).await?;
    }
    let in_ns = |meta: &kube::api::ObjectMeta| meta.namespace.clone().unwrap_or_default();
    apply(
        FIELD_MANAGER,
        Api::<ServiceAccount>::namespaced(kube.clone(), &in_ns(&w.service_account.metadata)),
        &w.service_account,
    )
    .await?;
    for role in [&w.own_provider_role, &w.import_role] {
        apply(
            FIELD_MANAGER,
            Api::<Role>::namespaced(kube.clone(), &in_ns(&role.metadata)),
            role,
        )
        .await?;
    }
    for binding in [
        &w.own_provider_binding,
        &w.base_binding,
        &w.import_binding,
        &w.import_role_binding,
    ] {
        apply(
            FIELD_MANAGER,
            Api::<RoleBinding>::namespaced(kube.clone(), &in_ns(&binding.metadata)),
            binding,
        )
        .await?;
    }
    // Applied under a field manager per class, so each class keeps its own owner reference.
    apply(
        &format!("{FIELD_MANAGER}/{}", class.name_any()),
        Api::<ServiceAccount>::namespaced(kube.clone(), &in_ns(&w.import_service_account.metadata)),
        &w.import_service_account,
    )
    .await?;
    set_cluster_subject(kube, &w.cluster_subject, true).await?;
    if w.binds_class_role {
        apply(
            FIELD_MANAGER,
            Api::<RoleBinding>::namespaced(kube.clone(), &in_ns(&w.class_binding.metadata)),
            &w.class_binding,
        )
        .await
        .map_err(|e| match e {
            Error::Kube { .. } if is_forbidden(&e) => Error::Invalid {
                reason: reasons::PROVIDER_CLASS_ROLE_MISSING,
                message: format!(
                    "the operator may not bind ClusterRole {} in namespace {}: grant it `bind` on that role there (docs/security.md)",
                    w.class_binding.role_ref.name,
                    in_ns(&w.class_binding.metadata)
                ),
            },
            e => e,
        })?;
    }
    apply(
        FIELD_MANAGER,
        Api::<Deployment>::namespaced(kube.clone(), &in_ns(&w.deployment.metadata)),
        &w.deployment,
    )
    .await?;
    // This Provider's objects under another name: bindings an earlier release made (whose
    // names could collide across namespaces), or its own import account once its class names
    // a shared one.
    let keep = [
        w.class_binding.metadata.name.as_deref(),
        w.import_service_account.metadata.name.as_deref(),
    ];
    let import = ImportSettings::of(class).namespace;
    let namespace = provider.namespace().unwrap_or_default();
    delete_outside(
        kube,
        &namespace,
        &provider.name_any(),
        &import,
        &keep.into_iter().flatten().collect::<Vec<_>>(),
    )
    .await
}

/// Deletes this Provider's RoleBindings and ServiceAccounts in the class's import namespace
/// (found by their labels, not their names) except those named in `keep`.
async fn delete_outside(
    kube: &kube::Client,
    namespace: &str,
    provider: &str,
    import_namespace: &str,
    keep: &[&str],
) -> Result<()> {
    let selector = ListParams::default().labels(&format!(
        "{}={provider},{LABEL_PROVIDER_NAMESPACE}={namespace}",
        banlieue_api::names::LABEL_PROVIDER
    ));
    let stale = |meta: &kube::api::ObjectMeta| {
        meta.name
            .as_deref()
            .is_some_and(|name| !keep.contains(&name))
    };
    let bindings = Api::<RoleBinding>::namespaced(kube.clone(), import_namespace);
    for binding in bindings
        .list(&selector)
        .await
        .map_err(Error::kube(format!(
            "list RoleBindings in {import_namespace}"
        )))?
        .items
        .into_iter()
        .filter(|b| stale(&b.metadata))
    {
        delete_if_present(bindings.clone(), &binding.name_any(), "RoleBinding").await?;
    }
    let accounts = Api::<ServiceAccount>::namespaced(kube.clone(), import_namespace);
    for account in accounts
        .list(&selector)
        .await
        .map_err(Error::kube(format!(
            "list ServiceAccounts in {import_namespace}"
        )))?
        .items
        .into_iter()
        .filter(|a| stale(&a.metadata))
    {
        delete_if_present(accounts.clone(), &account.name_any(), "ServiceAccount").await?;
    }
    Ok(())
}

/// Adds `subject` to the shared [`workloads::PROVIDERS_CLUSTER_BINDING`] (`member`) or removes
/// it. The binding is `bootstrap`'s: the operator may read and replace it by name and nothing
/// else, so a binding that is missing is an installation to repair, not one to create. The
/// replace carries the resourceVersion read: two Providers changing it at once conflict, and
/// the loser retries with backoff.
async fn set_cluster_subject(kube: &kube::Client, subject: &Subject, member: bool) -> Result<()> {
    let name = workloads::PROVIDERS_CLUSTER_BINDING;
    let api = Api::<ClusterRoleBinding>::all(kube.clone());
    let Some(mut binding) = api
        .get_opt(name)
        .await
        .map_err(Error::kube(format!("read ClusterRoleBinding {name}")))?
    else {
        return Err(Error::Invalid {
            reason: reasons::PROVIDER_NOT_READY,
            message: format!(
                "ClusterRoleBinding {name} does not exist: `banlieue bootstrap` creates it (deploy/rbac/)"
            ),
        });
    };
    let current = binding.subjects.clone().unwrap_or_default();
    let Some(subjects) = workloads::cluster_subjects(&current, subject, member) else {
        return Ok(());
    };
    binding.subjects = Some(subjects);
    api.replace(name, &PostParams::default(), &binding)
        .await
        .map_err(Error::kube(format!("update ClusterRoleBinding {name}")))?;
    Ok(())
}

fn is_forbidden(e: &Error) -> bool {
    matches!(e, Error::Kube { source: kube::Error::Api(s), .. } if s.code == 403)
}

/// Fails with `ProviderClassRoleMissing` unless the ClusterRole the administrator grants the
/// class holds every rule of its `additionalRules`, and the rights on its machines when the
/// class's kind keeps them in that role ([`BackendWorkload::class_role_rules`]).
async fn check_class_role(
    kube: &kube::Client,
    class: &ProviderClass,
    backend: &BackendWorkload,
    role: &str,
) -> Result<()> {
    let held = Api::<ClusterRole>::all(kube.clone())
        .get_opt(role)
        .await
        .map_err(Error::kube(format!("read ClusterRole {role}")))?;
    let missing = |message: String| Error::Invalid {
        reason: reasons::PROVIDER_CLASS_ROLE_MISSING,
        message,
    };
    let what = if backend.class_role_rules.is_empty() {
        "the additionalRules".to_owned()
    } else {
        format!(
            "the {} rights and the additionalRules",
            backend.machines.kind
        )
    };
    let Some(held) = held else {
        return Err(missing(format!(
            "ClusterRole {role} does not exist: create it with {what} of ProviderClass {:?} (docs/security.md)",
            class.name_any()
        )));
    };
    let wanted: Vec<_> = backend
        .class_role_rules
        .iter()
        .chain(&class.spec.additional_rules)
        .cloned()
        .collect();
    let uncovered = workloads::uncovered(&wanted, held.rules.as_deref().unwrap_or_default());
    if uncovered.is_empty() {
        Ok(())
    } else {
        Err(missing(format!(
            "ClusterRole {role} does not grant {what} of ProviderClass {:?}: {}",
            class.name_any(),
            uncovered.join(", ")
        )))
    }
}

/// Server-side applies `object` under the field manager `manager`, taking over any field
/// another manager set.
async fn apply<K>(manager: &str, api: Api<K>, object: &K) -> Result<()>
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
        &PatchParams::apply(manager).force(),
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
    banlieue_runtime::reconcile::add_finalizer(api, provider, FINALIZER_PROVIDER_WORKLOADS)
        .await
        .map(|_| ())
        .map_err(finalizer_error(provider))
}

/// The contract half of a machine's spec, `None` for a machine whose spec does not carry it.
fn machine_contract(machine: &DynamicObject) -> Option<MachineSpecContract> {
    machine
        .data
        .get("spec")
        .and_then(|spec| MachineSpecContract::deserialize(spec).ok())
}

/// The names of the machines (of any kind) that still name `provider`, sorted. A machine
/// whose spec does not carry the contract names no Provider.
pub fn remaining_machines(machines: &[DynamicObject], provider: &str) -> Vec<String> {
    let mut names: Vec<String> = machines
        .iter()
        .filter(|m| machine_contract(m).is_some_and(|spec| spec.provider_ref.name == provider))
        .map(|m| m.name_any())
        .collect();
    names.sort();
    names
}

/// The user-data Secrets that `provider`'s machines name, sorted, each once: the only Secrets
/// its workload may read besides its connection's.
pub fn user_data_secrets(machines: &[DynamicObject], provider: &str) -> Vec<String> {
    let mut names: Vec<String> = machines
        .iter()
        .filter_map(machine_contract)
        .filter(|spec| spec.provider_ref.name == provider)
        .filter_map(|spec| spec.user_data_secret_ref.map(|s| s.name))
        .filter(|name| !name.is_empty())
        .collect();
    names.sort();
    names.dedup();
    names
}

/// `user_data` without the Secrets another Provider of the namespace connects with: a machine
/// may name one (its writer could read it), but its provider refuses it as user-data anyway,
/// and granting it would hand one provider another's credentials.
pub fn grantable_user_data(
    mut user_data: Vec<String>,
    provider: &Provider,
    providers: &[Provider],
) -> Vec<String> {
    let others: std::collections::BTreeSet<String> = providers
        .iter()
        .filter(|p| p.name_any() != provider.name_any())
        .flat_map(|p| workloads::connection_objects(p).0)
        .collect();
    user_data.retain(|name| !others.contains(name));
    user_data
}

/// What of a machine decides its Provider's Role: the Provider it names and its user-data
/// Secret. A machine's other changes (its status, above all) trigger no Provider reconcile.
fn grant_relevant(machine: &DynamicObject) -> Option<u64> {
    use std::hash::{Hash, Hasher};
    let spec = machine_contract(machine)?;
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    spec.provider_ref.name.hash(&mut hasher);
    spec.user_data_secret_ref.map(|s| s.name).hash(&mut hasher);
    Some(hasher.finish())
}

/// The Provider a machine names, as the operator's reconcile key.
fn provider_of_machine(machine: &DynamicObject) -> Option<ObjectRef<Provider>> {
    let spec = machine_contract(machine)?;
    let ns = machine.namespace()?;
    Some(ObjectRef::new(&spec.provider_ref.name).within(&ns))
}

/// The MachinesRemain message: how many machines of `kind`, and the first few by name.
pub fn machines_remain_message(kind: &str, names: &[String]) -> String {
    const SHOWN: usize = 5;
    let mut shown = names
        .iter()
        .take(SHOWN)
        .cloned()
        .collect::<Vec<_>>()
        .join(", ");
    if names.len() > SHOWN {
        shown.push_str(&format!(", and {} more", names.len() - SHOWN));
    }
    format!(
        "deletion waits for {} {kind}(s) to be torn down: {shown}",
        names.len()
    )
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
    let name = provider.name_any();
    let class = Api::<ProviderClass>::all(ctx.kube.clone())
        .get_opt(&provider.spec.provider_class_ref.name)
        .await
        .map_err(Error::kube("read ProviderClass"))?;
    // The workload must outlive its machines: it is the only thing that can destroy their
    // domains or VMs, and a machine whose finalizer nobody removes blocks its owners forever.
    // Without its class, or of a kind no provider runs, the kind is unknown: the machines of
    // every kind this build runs are waited for.
    let kinds: Vec<&BackendWorkload> = match class
        .as_ref()
        .and_then(|c| ctx.cfg.backend(&c.spec.machine_kind))
    {
        Some(backend) => vec![backend],
        None => ctx.cfg.backends.iter().collect(),
    };
    for backend in kinds {
        let machines = &backend.machines;
        let listed = Api::<DynamicObject>::namespaced_with(ctx.kube.clone(), &ns, machines)
            .list(&Default::default())
            .await
            .map_err(Error::kube(format!("list {}s", machines.kind)))?;
        let remaining = remaining_machines(&listed.items, &name);
        if !remaining.is_empty() {
            let ready = conditions::new(
                types::READY,
                status::FALSE,
                reasons::MACHINES_REMAIN,
                machines_remain_message(&machines.kind, &remaining),
                provider.metadata.generation,
            );
            publish(provider, api, ctx, ready).await?;
            return Ok(Action::requeue(ctx.cfg.deletion_poll));
        }
    }
    let build = class.as_ref().map_or_else(
        || banlieue_api::names::DEFAULT_BUILD_NAMESPACE.to_owned(),
        |class| ImportSettings::of(class).namespace,
    );
    delete_outside(&ctx.kube, &ns, &name, &build, &[]).await?;
    set_cluster_subject(&ctx.kube, &workloads::provider_subject(provider), false).await?;
    banlieue_runtime::reconcile::remove_finalizer(api, provider, FINALIZER_PROVIDER_WORKLOADS)
        .await
        .map_err(finalizer_error(provider))?;
    Ok(Action::await_change())
}

async fn delete_if_present<K>(api: Api<K>, name: &str, kind: &str) -> Result<()>
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match api.delete(name, &DeleteParams::default()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(Error::kube(format!("delete {kind} {name}"))(e)),
    }
}

fn finalizer_error(
    provider: &Provider,
) -> impl FnOnce(banlieue_runtime::reconcile::PatchError) -> Error {
    let what = format!("update the finalizers of Provider {}", provider.name_any());
    move |error| match error {
        banlieue_runtime::reconcile::PatchError::Kube(source) => Error::Kube { what, source },
        banlieue_runtime::reconcile::PatchError::Encode(source) => Error::Invalid {
            reason: reasons::PROVIDER_NOT_READY,
            message: format!("{what}: {source}"),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_message_counts_and_names_a_few() {
        let names: Vec<String> = (1..=7).map(|i| format!("m{i}")).collect();
        assert_eq!(
            machines_remain_message("LibvirtMachine", &names),
            "deletion waits for 7 LibvirtMachine(s) to be torn down: m1, m2, m3, m4, m5, and 2 more"
        );
        assert_eq!(
            machines_remain_message("VSphereMachine", &names[..1]),
            "deletion waits for 1 VSphereMachine(s) to be torn down: m1"
        );
    }

    #[test]
    fn remaining_machines_are_those_naming_the_provider_of_any_kind() {
        let machine = |kind: banlieue_api::MachineKind, name: &str, spec: serde_json::Value| {
            let backend = [
                banlieue_api::machine::libvirt_workload(),
                banlieue_api::vsphere::workload(),
            ]
            .into_iter()
            .find(|backend| backend.kind == kind)
            .expect("an in-tree kind");
            let mut m = DynamicObject::new(name, &backend.machines);
            m.data = serde_json::json!({ "spec": spec });
            m
        };
        let machines = [
            machine(
                banlieue_api::MachineKind::VSPHERE_MACHINE,
                "b",
                serde_json::json!({"providerRef": {"name": "vc"}}),
            ),
            machine(
                banlieue_api::MachineKind::VSPHERE_MACHINE,
                "a",
                serde_json::json!({"providerRef": {"name": "vc"}}),
            ),
            machine(
                banlieue_api::MachineKind::LIBVIRT_MACHINE,
                "c",
                serde_json::json!({"providerRef": {"name": "other"}}),
            ),
            // No contract: names no Provider.
            machine(
                banlieue_api::MachineKind::LIBVIRT_MACHINE,
                "d",
                serde_json::json!({"pool": "p"}),
            ),
        ];
        assert_eq!(remaining_machines(&machines, "vc"), ["a", "b"]);
        assert!(remaining_machines(&machines, "gone").is_empty());
    }

    #[test]
    fn a_provider_is_granted_its_machines_user_data_never_another_providers_credentials() {
        let ar = banlieue_api::machine::libvirt_workload().machines;
        let machine = |name: &str, spec: serde_json::Value| {
            let mut m = DynamicObject::new(name, &ar);
            m.data = serde_json::json!({ "spec": spec });
            m
        };
        let machines = [
            machine(
                "a",
                serde_json::json!({"providerRef": {"name": "edge"},
                    "userDataSecretRef": {"name": "web", "key": "user-data"}}),
            ),
            machine(
                "b",
                serde_json::json!({"providerRef": {"name": "edge"},
                    "userDataSecretRef": {"name": "web", "key": "other"}}),
            ),
            machine(
                "c",
                serde_json::json!({"providerRef": {"name": "edge"},
                    "userDataSecretRef": {"name": "core-creds", "key": "tls.key"}}),
            ),
            machine("d", serde_json::json!({"providerRef": {"name": "edge"}})),
            machine(
                "e",
                serde_json::json!({"providerRef": {"name": "core"},
                    "userDataSecretRef": {"name": "db", "key": "user-data"}}),
            ),
        ];
        assert_eq!(user_data_secrets(&machines, "edge"), ["core-creds", "web"]);
        let provider = |name: &str, creds: &str| {
            let mut p: Provider = serde_json::from_value(serde_json::json!({
                "apiVersion": "banlieue.io/v1alpha1", "kind": "Provider",
                "metadata": {"name": name, "namespace": "team"},
                "spec": {"providerClassRef": {"name": "libvirt"},
                         "connection": {"endpoint": "qemu+tls://h/system",
                                        "credentialsRef": {"name": creds},
                                        "caBundle": {"inline": "pem"}}}
            }))
            .expect("a Provider");
            p.metadata.uid = Some(format!("uid-{name}"));
            p
        };
        let edge = provider("edge", "edge-creds");
        let providers = [edge.clone(), provider("core", "core-creds")];
        assert_eq!(
            grantable_user_data(user_data_secrets(&machines, "edge"), &edge, &providers),
            ["web"]
        );
        // Its own credentials as user-data are its to refuse; RBAC grants them anyway.
        assert_eq!(
            grantable_user_data(vec!["edge-creds".into()], &edge, &providers),
            ["edge-creds"]
        );
        // Only a change of what the Role grants triggers its Provider.
        let mut status_only = machines[0].clone();
        status_only.data["status"] = serde_json::json!({"ready": true});
        assert_eq!(grant_relevant(&machines[0]), grant_relevant(&status_only));
        // Another key of the same Secret is the same grant.
        assert_eq!(grant_relevant(&machines[0]), grant_relevant(&machines[1]));
        assert_ne!(grant_relevant(&machines[0]), grant_relevant(&machines[2]));
        assert_eq!(
            provider_of_machine(&{
                let mut m = machines[4].clone();
                m.metadata.namespace = Some("team".into());
                m
            }),
            Some(ObjectRef::new("core").within("team"))
        );
    }
}

//! The VirtualMachine reconciler: schedules a VirtualMachine onto a failure domain, creates its
//! machine (of the kind its Provider's class realises, through [`crate::machine_builder`]),
//! mirrors the machine's status back, and holds the VirtualMachine until its machine is gone.
//! Nothing here names a machine kind.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use banlieue_api::names;
use banlieue_api::{MachineKind, Provider, VirtualMachine, VirtualMachineStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;

use super::decide::{self, MachineTeardown, StandbyStep, StatusSource};
use crate::context::{Context, cached, namespace_of, uid_of};
use crate::error::{Error, Result, is_not_found};
use crate::machine_builder::{Machine, MachineBackend};
use crate::machine_status::{self, Scheduled};
use crate::scheduling::{self, ScheduleInput};

/// How often a VirtualMachine waiting for its machine to go is looked at, in case the delete
/// event is missed.
const TEARDOWN_POLL: Duration = Duration::from_secs(2);

pub(crate) async fn reconcile(vm: Arc<VirtualMachine>, ctx: Arc<Context>) -> Result<Action> {
    ctx.readiness.wait().await?;
    let vm = ctx.vm_writes.freshest(vm);
    let namespace = namespace_of(vm.as_ref(), "VirtualMachine")?;
    let name = vm.name_any();
    let vms = ctx.api::<VirtualMachine>(&namespace);

    if vm.metadata.deletion_timestamp.is_some() {
        ctx.vm_writes.forget(&vm.uid().unwrap_or_default());
        return teardown(&vm, &ctx, &namespace).await;
    }
    let vm = if vm
        .finalizers()
        .iter()
        .any(|f| f == names::FINALIZER_MACHINE_PROTECTION)
    {
        vm
    } else {
        // Go on with the object the patch returned rather than wait for the watch to bring
        // it back: a pool fills one round trip sooner.
        Arc::new(
            ctx.add_finalizer(&vms, vm.as_ref(), names::FINALIZER_MACHINE_PROTECTION)
                .await?,
        )
    };

    let uid = uid_of(vm.as_ref(), "VirtualMachine")?;
    let current = vm.status.clone().unwrap_or_default();
    let generation = vm.metadata.generation;
    let now = Time(Timestamp::now());
    let known_backend =
        decide::referenced_backend(&ctx.config.machine_backends, current.machine_ref.as_ref())?;
    let machine = ctx.stores.machines.find_owned(
        known_backend.map(|backend| backend.kind_name),
        &namespace,
        &name,
        &uid,
    )?;

    // The status, and the machine it mirrors when there is one.
    let mirror = |machine: Machine| {
        let next = machine_status::mirror_machine(
            &current,
            &machine.status,
            machine.spec.tpm_enabled,
            generation,
            now.clone(),
        );
        (next, Some(machine))
    };
    let source = decide::status_source(current.machine_ref.as_ref(), known_backend, machine);
    let (mut next, mirrored) = match source {
        StatusSource::Mirror(machine) => mirror(machine),
        StatusSource::AskApiServer { backend, name } => {
            let api = backend.api(&ctx.client, &namespace);
            match api.get_opt(&name).await? {
                Some(object) => mirror(Machine::read(backend, object)?),
                None => (
                    machine_status::machine_deleted(&current, &name, generation, now),
                    None,
                ),
            }
        }
        StatusSource::MachineDeleted { name } => (
            machine_status::machine_deleted(&current, &name, generation, now),
            None,
        ),
        StatusSource::Adopt(machine) => {
            let site = adopted_site(&ctx, &namespace, &vm, &machine);
            (
                machine_status::scheduled(&current, &site, generation, now),
                None,
            )
        }
        StatusSource::Schedule => (place(&vm, &ctx, &namespace, &current, now).await?, None),
    };
    if let Some(machine) = &mirrored {
        next.standby = ask_for_standby(&vm, &next, machine, &ctx, &namespace).await?;
        hand_claims_requests(&vm, machine, &ctx, &namespace).await?;
    }
    if next != current {
        let written = ctx.patch_status(&vms, &name, &next).await?;
        ctx.vm_writes.wrote(vm.as_ref(), written);
    }
    Ok(Action::requeue(decide::look_again_after(
        &next,
        ctx.config.resync,
    )))
}

/// Gives the machine what the claim brought for its guest: the keys of the bind
/// ([`decide::access_to_hand`]) and the subject's latest challenge to its TPM
/// ([`decide::handover_to_hand`]), in one write, for its provider to relay.
async fn hand_claims_requests(
    vm: &VirtualMachine,
    machine: &Machine,
    ctx: &Context,
    namespace: &str,
) -> Result<()> {
    let Some(backend) = ctx.config.machine_backends.get(&machine.kind) else {
        return Ok(());
    };
    let mut spec = serde_json::Map::new();
    if let Some(access) = decide::access_to_hand(vm, machine) {
        spec.insert("access".into(), serde_json::json!(access));
    }
    if let Some(challenge) = decide::handover_to_hand(vm, machine) {
        spec.insert("handover".into(), challenge.merge_patch_value());
    }
    if spec.is_empty() {
        return Ok(());
    }
    write_machine_spec(backend, machine, ctx, namespace, spec.into()).await
}

/// Merges `spec` into the machine's spec: the fields the controller asks of a machine after
/// building it (its standby, a bound member's keys).
async fn write_machine_spec(
    backend: &MachineBackend,
    machine: &Machine,
    ctx: &Context,
    namespace: &str,
    spec: serde_json::Value,
) -> Result<()> {
    let patch = serde_json::json!({ "spec": spec });
    backend
        .api(&ctx.client, namespace)
        .patch(
            &machine.object.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await?;
    Ok(())
}

/// Saved warm members (ADR-0073): carries out [`decide::standby_step`] (`next` is the
/// status about to be written) and returns the standby the VirtualMachine reports.
async fn ask_for_standby(
    vm: &VirtualMachine,
    next: &VirtualMachineStatus,
    machine: &Machine,
    ctx: &Context,
    namespace: &str,
) -> Result<Option<banlieue_api::Standby>> {
    let pool = vm
        .labels()
        .get(names::LABEL_POOL)
        .and_then(|pool| cached(&ctx.stores.pools, namespace, pool));
    let backend = ctx.config.machine_backends.get(&machine.kind);
    match decide::standby_step(vm, next, machine, pool.as_deref(), backend) {
        StandbyStep::NotAsked => Ok(None),
        StandbyStep::RestoreFailed { reason, message } => {
            ctx.event(vm, EventType::Warning, &reason, message).await;
            match ctx
                .api::<VirtualMachine>(namespace)
                .delete(&vm.name_any(), &DeleteParams::default())
                .await
            {
                Ok(_) => {}
                Err(error) if is_not_found(&error) => {}
                Err(error) => return Err(error.into()),
            }
            Ok(None)
        }
        StandbyStep::Ask { backend, standby } => {
            let spec = serde_json::json!({ "standby": standby });
            write_machine_spec(backend, machine, ctx, namespace, spec).await?;
            Ok(None)
        }
        StandbyStep::Report(standby) => Ok(standby),
    }
}

/// The status of a VirtualMachine without a machine: scheduled, its machine created (by
/// server-side apply), or unschedulable with the guides' reason (and an Event when the reason
/// is new).
async fn place(
    vm: &VirtualMachine,
    ctx: &Context,
    namespace: &str,
    current: &VirtualMachineStatus,
    now: Time,
) -> Result<VirtualMachineStatus> {
    let name = vm.name_any();
    let generation = vm.metadata.generation;
    match schedule(vm, ctx, namespace) {
        Err(failure) => {
            if decide::announces_unschedulable(current, &failure) {
                ctx.event(
                    vm,
                    EventType::Warning,
                    failure.reason,
                    failure.message.clone(),
                )
                .await;
            }
            Ok(machine_status::unschedulable(
                current, &failure, generation, now,
            ))
        }
        Ok((placement, machine)) => {
            // Server-side apply: idempotent, so a status write lost after this point only
            // repeats an identical apply.
            let params = PatchParams::apply(&ctx.config.manager_name).force();
            let backend = placed_backend(ctx, &placement.machine_kind)?;
            backend
                .api(&ctx.client, namespace)
                .patch(&name, &params, &Patch::Apply(&machine))
                .await?;
            // No Event: the Scheduled condition says the same, and a pool refilled behind
            // every claim would pay one more write per member for it.
            Ok(machine_status::scheduled(
                current,
                &Scheduled::of(backend, &placement, &name),
                generation,
                now,
            ))
        }
    }
}

/// Deletes the machine and waits for it to be gone from the API server before letting the
/// VirtualMachine go: the machine's own finalizer holds until the provider has torn it down.
/// The machine is looked for under the kind the status names, or under every kind when the
/// status names none (a machine created just before a lost status write).
async fn teardown(vm: &VirtualMachine, ctx: &Context, namespace: &str) -> Result<Action> {
    let vms = ctx.api::<VirtualMachine>(namespace);
    let name = vm.name_any();
    let uid = vm.uid().unwrap_or_default();
    for backend in decide::teardown_kinds(&ctx.config.machine_backends, vm.status.as_ref()) {
        let machines = backend.api(&ctx.client, namespace);
        let Some(machine) = machines.get_opt(&name).await? else {
            continue;
        };
        match decide::machine_teardown(&machine, &uid) {
            MachineTeardown::NotOwned => continue,
            MachineTeardown::Delete => {
                match machines.delete(&name, &DeleteParams::default()).await {
                    Ok(_) => {}
                    Err(error) if is_not_found(&error) => {}
                    Err(error) => return Err(error.into()),
                }
            }
            MachineTeardown::AwaitGone => {}
        }
        return Ok(Action::requeue(TEARDOWN_POLL));
    }
    ctx.remove_finalizer(&vms, vm, names::FINALIZER_MACHINE_PROTECTION)
        .await?;
    Ok(Action::await_change())
}

fn schedule(
    vm: &VirtualMachine,
    ctx: &Context,
    namespace: &str,
) -> Result<(banlieue_api::backend::Placement, kube::api::DynamicObject), scheduling::Unschedulable>
{
    let class = cached(&ctx.stores.classes, namespace, &vm.spec.class_ref.name);
    let image = cached(&ctx.stores.images, namespace, &vm.spec.image_ref.name);
    let providers: Vec<Arc<Provider>> = ctx
        .stores
        .providers
        .state()
        .into_iter()
        .filter(|p| p.metadata.namespace.as_deref() == Some(namespace))
        .collect();
    let provider_refs: Vec<&Provider> = providers.iter().map(Arc::as_ref).collect();
    let provider_classes_owned = ctx.stores.provider_classes.state();
    let provider_classes: BTreeMap<String, &banlieue_api::ProviderClass> = provider_classes_owned
        .iter()
        .map(|c| (c.name_any(), c.as_ref()))
        .collect();
    let vms = ctx.stores.vms.state();
    let pool = vm
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(banlieue_api::names::LABEL_POOL));
    // What a placed VirtualMachine holds: its class's memory (a class since deleted holds
    // nothing this scheduler can name).
    let memory_of = |other: &VirtualMachine| {
        cached(&ctx.stores.classes, namespace, &other.spec.class_ref.name)
            .and_then(|c| banlieue_api::quantity::to_bytes(&c.spec.memory.0))
            .unwrap_or(0)
    };
    let placement = ctx.placements.place(
        namespace,
        &vm.name_any(),
        pool.map(String::as_str),
        &vms,
        memory_of,
        std::time::Instant::now(),
        |occupancy| {
            let placement = scheduling::schedule(ScheduleInput {
                machine_backends: &ctx.config.machine_backends,
                vm,
                class: class.as_deref(),
                image: image.as_deref(),
                providers: &provider_refs,
                provider_classes: &provider_classes,
                occupancy,
            })?;
            let domain = (placement.provider.clone(), placement.failure_domain.clone());
            Ok((placement, domain))
        },
    )?;
    let machine = decide::machine_for(
        vm,
        class.as_deref(),
        &ctx.config.machine_backends,
        &placement,
    )?;
    Ok((placement, machine))
}

/// [`decide::adopted_site`] of `machine`, with its Provider and the VirtualMachine's image
/// from the caches.
fn adopted_site(
    ctx: &Context,
    namespace: &str,
    vm: &VirtualMachine,
    machine: &Machine,
) -> Scheduled {
    let provider = cached(
        &ctx.stores.providers,
        namespace,
        &machine.spec.provider_ref.name,
    );
    let image = cached(&ctx.stores.images, namespace, &vm.spec.image_ref.name);
    decide::adopted_site(machine, provider.as_deref(), image.as_deref())
}

/// The builder of `kind`: scheduling placed the VirtualMachine only on a kind this
/// controller builds.
fn placed_backend<'a>(ctx: &'a Context, kind: &MachineKind) -> Result<&'a MachineBackend> {
    ctx.config
        .machine_backends
        .get(kind)
        .ok_or_else(|| Error::UnknownMachineKind {
            kind: kind.to_string(),
            name: String::new(),
        })
}

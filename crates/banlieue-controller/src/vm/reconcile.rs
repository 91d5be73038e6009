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

use crate::context::{Context, cached, namespace_of, uid_of};
use crate::error::{Error, Result, is_not_found};
use crate::machine_builder::{self, Machine, MachineBackend, MachineInput};
use crate::machine_status::{self, Scheduled};
use crate::scheduling::{self, ScheduleInput};
use crate::standby;

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
    let backends = &ctx.config.machine_backends;
    let known_backend = match &current.machine_ref {
        Some(reference) => {
            Some(
                backends
                    .of_reference(reference)
                    .ok_or_else(|| Error::UnknownMachineKind {
                        kind: reference.kind.clone(),
                        name: reference.name.clone(),
                    })?,
            )
        }
        None => None,
    };
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
    let (mut next, mirrored) = match (&current.machine_ref, known_backend, machine) {
        (Some(_), _, Some(machine)) => mirror(machine),
        (Some(reference), Some(backend), None) => {
            // The cache may lag behind a machine created a moment ago; only the API server can
            // say it is gone.
            let api = backend.api(&ctx.client, &namespace);
            match api.get_opt(&reference.name).await? {
                Some(object) => mirror(Machine::read(backend, object)?),
                None => (
                    machine_status::machine_deleted(&current, &reference.name, generation, now),
                    None,
                ),
            }
        }
        // A reference always has a kind (an unknown one returned above).
        (Some(reference), None, None) => (
            machine_status::machine_deleted(&current, &reference.name, generation, now),
            None,
        ),
        // The machine was created but the status saying so was lost (a crash between the
        // two writes): adopt it as it is rather than scheduling again, which could choose
        // another provider and rewrite a machine that is already being realised.
        (None, _, Some(machine)) => {
            let site = adopted_site(&ctx, &namespace, &vm, &machine);
            (
                machine_status::scheduled(&current, &site, generation, now),
                None,
            )
        }
        (None, _, None) => (place(&vm, &ctx, &namespace, &current, now).await?, None),
    };
    if let Some(machine) = &mirrored {
        next.standby = ask_for_standby(&vm, &next, machine, &ctx, &namespace).await?;
    }
    if next != current {
        let written = ctx.patch_status(&vms, &name, &next).await?;
        ctx.vm_writes.wrote(vm.as_ref(), written);
    }
    Ok(if next.machine_ref.is_some() {
        Action::requeue(ctx.config.resync)
    } else {
        // Unschedulable: Provider and VMImage changes wake it (each trigger follows its cache
        // update, so whichever of the VM and the image arrives second sees the other). The
        // recheck is a backstop that reads caches only, so it is cheap.
        Action::requeue(ctx.config.resync.min(UNSCHEDULABLE_RECHECK))
    })
}

/// Saved warm members (ADR-0073): writes the machine's `spec.standby` when the member's
/// state asks for another (saved once it reached its pool's readiness unclaimed, running once
/// claimed), and returns the standby the VirtualMachine reports (`next` is its status about
/// to be written; the provider's report counts only once it has seen the latest spec). A
/// VirtualMachine that does not ask for saved standby reports none, and costs nothing here.
async fn ask_for_standby(
    vm: &VirtualMachine,
    next: &VirtualMachineStatus,
    machine: &Machine,
    ctx: &Context,
    namespace: &str,
) -> Result<Option<banlieue_api::Standby>> {
    if vm.spec.standby != Some(banlieue_api::Standby::Saved) {
        return Ok(None);
    }
    if let Some(failed) = banlieue_api::conditions::find(
        &machine.status.conditions,
        banlieue_api::conditions::types::READY,
    )
    .filter(|c| c.reason == banlieue_api::conditions::reasons::RESTORE_FAILED)
    {
        // The member cannot run again (its provider keeps it down rather than boot it afresh
        // under the same spec): a claimed one is a vanished member, which the claim's rule
        // for one handles (the guides'), and an unclaimed one is replaced by its pool.
        ctx.event(
            vm,
            EventType::Warning,
            failed.reason.as_str(),
            failed.message.clone(),
        )
        .await;
        match ctx
            .api::<VirtualMachine>(namespace)
            .delete(&vm.name_any(), &DeleteParams::default())
            .await
        {
            Ok(_) => {}
            Err(error) if is_not_found(&error) => {}
            Err(error) => return Err(error.into()),
        }
        return Ok(None);
    }
    let backend = ctx.config.machine_backends.get(&machine.kind);
    let saves = backend.is_some_and(|b| b.saves);
    let generation = machine.object.metadata.generation;
    let readiness = vm
        .labels()
        .get(names::LABEL_POOL)
        .and_then(|pool| cached(&ctx.stores.pools, namespace, pool))
        .filter(|pool| pool.uid().as_deref() == crate::member::controller_uid(vm))
        .map(|pool| pool.spec.readiness);
    // Judged on the status about to be written: the mirror of what the machine says now.
    let mut judged = vm.clone();
    judged.status = Some(next.clone());
    let desired = standby::desired(&judged, readiness, saves);
    if let (Some(backend), true) = (backend, standby::needs_write(machine.spec.standby, desired)) {
        let patch = serde_json::json!({ "spec": { "standby": desired } });
        backend
            .api(&ctx.client, namespace)
            .patch(
                &machine.object.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await?;
        // The provider has not seen this spec yet.
        return Ok(None);
    }
    Ok(standby::reported(
        &machine.spec,
        &machine.status,
        generation,
        saves,
    ))
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
            if !current
                .conditions
                .iter()
                .any(|c| c.reason == failure.reason)
            {
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

/// How soon an unschedulable VirtualMachine looks at its caches again without an event.
const UNSCHEDULABLE_RECHECK: Duration = Duration::from_secs(5);

/// Deletes the machine and waits for it to be gone from the API server before letting the
/// VirtualMachine go: the machine's own finalizer holds until the provider has torn it down.
/// The machine is looked for under the kind the status names, or under every kind when the
/// status names none (a machine created just before a lost status write).
async fn teardown(vm: &VirtualMachine, ctx: &Context, namespace: &str) -> Result<Action> {
    let vms = ctx.api::<VirtualMachine>(namespace);
    let name = vm.name_any();
    let uid = vm.uid().unwrap_or_default();
    let backends = &ctx.config.machine_backends;
    let candidates: Vec<&MachineBackend> =
        match vm.status.as_ref().and_then(|s| s.machine_ref.as_ref()) {
            Some(reference) => backends.of_reference(reference).into_iter().collect(),
            None => backends.iter().collect(),
        };
    for backend in candidates {
        let machines = backend.api(&ctx.client, namespace);
        let Some(machine) = machines.get_opt(&name).await? else {
            continue;
        };
        if !machine.owner_references().iter().any(|o| o.uid == uid) {
            continue;
        }
        if machine.metadata.deletion_timestamp.is_none() {
            match machines.delete(&name, &DeleteParams::default()).await {
                Ok(_) => {}
                Err(error) if is_not_found(&error) => {}
                Err(error) => return Err(error.into()),
            }
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
    let class = class.ok_or_else(|| scheduling::Unschedulable {
        reason: banlieue_api::conditions::reasons::CLASS_NOT_FOUND,
        message: format!("vmclass {} does not exist", vm.spec.class_ref.name),
    })?;
    let backend = ctx
        .config
        .machine_backends
        .get(&placement.machine_kind)
        .ok_or_else(|| scheduling::Unschedulable {
            reason: banlieue_api::conditions::reasons::NO_BUILDER_FOR_CLASS,
            message: format!("no machine builder for {}", placement.machine_kind),
        })?;
    let machine = machine_builder::build(
        backend,
        &MachineInput {
            vm,
            class: &class,
            placement: &placement,
        },
    )
    .map_err(|error| scheduling::Unschedulable {
        reason: banlieue_api::conditions::reasons::NO_BUILDER_FOR_CLASS,
        message: format!(
            "cannot build a machine for provider class {:?}: {}",
            placement.provider_class,
            banlieue_api::conditions::error_message(&error)
        ),
    })?;
    Ok((placement, machine))
}

/// Where an existing machine is, for a VirtualMachine whose status lost it: the failure domain
/// the machine's annotation records; for a machine older than the annotation, its Provider's
/// only failure domain, else the Provider's name.
fn adopted_site(
    ctx: &Context,
    namespace: &str,
    vm: &VirtualMachine,
    machine: &Machine,
) -> Scheduled {
    let provider_name = &machine.spec.provider_ref.name;
    let provider = cached(&ctx.stores.providers, namespace, provider_name);
    let failure_domain = machine
        .failure_domain()
        .map(str::to_owned)
        .or_else(|| {
            let domains = &provider.as_ref()?.status.as_ref()?.failure_domains;
            match domains.as_slice() {
                [only] => Some(only.name.clone()),
                _ => None,
            }
        })
        .unwrap_or_else(|| provider_name.clone());
    let image = cached(&ctx.stores.images, namespace, &vm.spec.image_ref.name);
    Scheduled {
        machine: machine.reference(),
        provider: provider_name.clone(),
        failure_domain,
        image_revision: image.as_deref().and_then(scheduling::image_revision),
    }
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

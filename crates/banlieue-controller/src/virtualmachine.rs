//! The VirtualMachine reconciler: schedules a VirtualMachine onto a failure domain, creates its
//! LibvirtMachine, mirrors the machine's status back, and holds the VirtualMachine until its
//! machine is gone.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use banlieue_api::names;
use banlieue_api::{LibvirtMachine, Provider, VirtualMachine};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;

use crate::context::{Context, cached, namespace_of, uid_of};
use crate::error::{Result, is_not_found};
use crate::machine_status;
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
    let machines = ctx.api::<LibvirtMachine>(&namespace);

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
    let machine = cached(&ctx.stores.machines, &namespace, &name)
        .filter(|m| m.owner_references().iter().any(|o| o.uid == uid));

    let next = match (&current.machine_ref, machine) {
        (Some(_), Some(machine)) => {
            machine_status::mirror_machine(&current, &machine, generation, now)
        }
        (Some(reference), None) => {
            // The cache may lag behind a machine created a moment ago; only the API server can
            // say it is gone.
            match machines.get_opt(&reference.name).await? {
                Some(machine) => {
                    machine_status::mirror_machine(&current, &machine, generation, now)
                }
                None => machine_status::machine_deleted(&current, &reference.name, generation, now),
            }
        }
        // The machine was created but the status saying so was lost (a crash between the
        // two writes): adopt it as it is rather than scheduling again, which could choose
        // another provider and rewrite a machine that is already being realised.
        (None, Some(machine)) => {
            let placement = adopted_placement(&ctx, &namespace, &vm, &machine);
            machine_status::scheduled(&current, &name, &placement, generation, now)
        }
        (None, None) => match schedule(&vm, &ctx, &namespace) {
            Err(failure) => {
                if !current
                    .conditions
                    .iter()
                    .any(|c| c.reason == failure.reason)
                {
                    ctx.event(
                        vm.as_ref(),
                        EventType::Warning,
                        failure.reason,
                        failure.message.clone(),
                    )
                    .await;
                }
                machine_status::unschedulable(&current, &failure, generation, now)
            }
            Ok((placement, machine)) => {
                // Server-side apply: idempotent, so a status write lost after this point only
                // repeats an identical apply.
                let params = PatchParams::apply(&ctx.config.manager_name).force();
                machines
                    .patch(&name, &params, &Patch::Apply(&machine))
                    .await?;
                // No Event: the Scheduled condition says the same, and a pool refilled behind
                // every claim would pay one more write per member for it.
                machine_status::scheduled(&current, &name, &placement, generation, now)
            }
        },
    };
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

/// How soon an unschedulable VirtualMachine looks at its caches again without an event.
const UNSCHEDULABLE_RECHECK: Duration = Duration::from_secs(5);

/// Deletes the machine and waits for it to be gone from the API server before letting the
/// VirtualMachine go: the machine's own finalizer holds until the domain is destroyed.
async fn teardown(vm: &VirtualMachine, ctx: &Context, namespace: &str) -> Result<Action> {
    let vms = ctx.api::<VirtualMachine>(namespace);
    let machines = ctx.api::<LibvirtMachine>(namespace);
    let name = vm.name_any();
    let uid = vm.uid().unwrap_or_default();
    match machines.get_opt(&name).await? {
        Some(machine) if machine.owner_references().iter().any(|o| o.uid == uid) => {
            if machine.metadata.deletion_timestamp.is_none() {
                match machines.delete(&name, &DeleteParams::default()).await {
                    Ok(_) => {}
                    Err(error) if is_not_found(&error) => {}
                    Err(error) => return Err(error.into()),
                }
            }
            Ok(Action::requeue(TEARDOWN_POLL))
        }
        _ => {
            ctx.remove_finalizer(&vms, vm, names::FINALIZER_MACHINE_PROTECTION)
                .await?;
            Ok(Action::await_change())
        }
    }
}

fn schedule(
    vm: &VirtualMachine,
    ctx: &Context,
    namespace: &str,
) -> Result<(scheduling::Placement, LibvirtMachine), scheduling::Unschedulable> {
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
    let machine = scheduling::libvirt_machine(vm, &class, &placement).ok_or_else(|| {
        scheduling::Unschedulable {
            reason: banlieue_api::conditions::reasons::NO_BUILDER_FOR_CLASS,
            message: format!(
                "cannot build a machine for provider class {:?}",
                placement.provider_class
            ),
        }
    })?;
    Ok((placement, machine))
}

/// The placement an existing machine records, for a VirtualMachine whose status lost it.
fn adopted_placement(
    ctx: &Context,
    namespace: &str,
    vm: &VirtualMachine,
    machine: &LibvirtMachine,
) -> scheduling::Placement {
    let provider = cached(
        &ctx.stores.providers,
        namespace,
        &machine.spec.provider_ref.name,
    );
    let failure_domain = provider
        .as_ref()
        .and_then(|p| p.status.as_ref())
        .and_then(|s| {
            s.failure_domains.iter().find(|d| {
                d.storage_classes
                    .iter()
                    .any(|c| c.target.pool == machine.spec.pool)
            })
        })
        .map(|d| d.name.clone())
        .unwrap_or_else(|| machine.spec.provider_ref.name.clone());
    let image = cached(&ctx.stores.images, namespace, &vm.spec.image_ref.name);
    scheduling::Placement {
        provider: machine.spec.provider_ref.name.clone(),
        provider_class: provider
            .as_ref()
            .map(|p| p.spec.provider_class_ref.name.clone())
            .unwrap_or_default(),
        machine_kind: banlieue_api::MachineKind::LibvirtMachine,
        failure_domain,
        pool: machine.spec.pool.clone(),
        network: machine.spec.network.clone(),
        disk: machine.spec.disk.clone(),
        image_revision: image.as_deref().and_then(scheduling::image_revision),
    }
}

//! The acting half of a VSphereMachine reconcile: find or clone its VM, size it, power it on
//! (or suspend it, or resume it, as its standby asks), and read what it is now.

use std::time::Duration;

use banlieue_api::conditions::reasons;
use banlieue_api::vsphere::{
    self, GUESTINFO_ACCESS, GUESTINFO_ACCESS_STATE, GUESTINFO_PHASE, GUESTINFO_SSH_HOST_KEYS,
};
use banlieue_api::{Provider, VSphereMachine};
use banlieue_provider_kit::error::Core;
use banlieue_vsphere::{
    Client, CloneSpec, ManagedObjectRef, PowerState, PropertyValue, ReconfigSpec, VmInfo,
};
use kube::{Api, ResourceExt};

use super::Context;
use super::access;
use super::power::{self, PowerAct, StandbySight};
use super::status::Observed;
use super::vm::{self, Ownership};
use crate::error::{Error, Result};
use crate::template::{self, TemplateSight};

pub(super) async fn run(machine: &VSphereMachine, ctx: &Context) -> Result<Observed> {
    let uid = machine.uid().ok_or_else(|| {
        Error::Core(Core::Invalid {
            reason: reasons::PROVISIONING,
            message: "the VSphereMachine has no uid yet".into(),
        })
    })?;
    let vm_name = vm::vm_name(machine)?;
    let path = vm::vm_path(machine, &vm_name);
    let client = ctx.session.client().await?;
    let vm = match find_vm(&client, &path).await? {
        Some(info) => match vm::ownership(&info.extra_config, &uid) {
            // Cloned for this machine by an earlier reconcile whose status write was lost.
            Ownership::Ours => info.moref,
            Ownership::Foreign => return Err(vm::vm_name_taken(&path)),
        },
        None => clone(machine, ctx, &client, &uid, &vm_name, &path).await?,
    };
    let info = vm_info(&client, &vm).await?;
    let hardware = client
        .retrieve_one(
            &vm,
            &[
                "config.hardware.numCPU",
                "config.hardware.memoryMB",
                "config.instanceUuid",
                "config.firmware",
                "config.bootOptions",
            ],
        )
        .await
        .map_err(Error::vsphere(format!("read the hardware of VM {path}")))?;
    let int = |p: &str| match hardware.get(p) {
        Some(PropertyValue::Int(v)) => Some(*v),
        _ => None,
    };
    let cpus = i64::from(machine.spec.cpu);
    let memory = vm::memory_mib(machine)?;
    let resize = int("config.hardware.numCPU") != Some(cpus)
        || int("config.hardware.memoryMB") != Some(memory);
    let secure_boot = vm::needs_secure_boot(
        machine,
        hardware
            .get("config.firmware")
            .and_then(PropertyValue::text),
        efi_secure_boot(hardware.get("config.bootOptions")),
    );
    // Only a powered-off VM is changed: vSphere changes no hardware of a suspended one, and
    // boot options matter only before the (first) power-on.
    if info.power_state == PowerState::PoweredOff && (resize || secure_boot) {
        let spec = ReconfigSpec {
            num_cpus: i32::try_from(cpus).ok(),
            memory_mb: Some(memory),
            extra_config: Vec::new(),
            efi_secure_boot: secure_boot.then_some(true),
            firmware: secure_boot.then(|| "efi".to_owned()),
        };
        let task = client
            .reconfigure_vm(&vm, &spec)
            .await
            .map_err(Error::vsphere(format!("reconfigure VM {path}")))?;
        wait_task(
            &client,
            &task,
            &format!("reconfigure VM {path}"),
            ctx.cfg.task_timeout,
        )
        .await?;
    }
    let standby = match power::power_act(machine, &info.power_state, &path) {
        PowerAct::Observe => StandbySight::Running,
        PowerAct::PowerOn => {
            power(&client, ctx, &vm, Power::On, &path).await?;
            StandbySight::Running
        }
        PowerAct::Resume => {
            power(&client, ctx, &vm, Power::On, &path)
                .await
                .map_err(|e| power::resume_failed(&path, e))?;
            StandbySight::Resumed
        }
        PowerAct::Suspend => match power(&client, ctx, &vm, Power::Suspend, &path).await {
            Ok(()) => StandbySight::Running,
            Err(e) => StandbySight::SuspendRefused(power::suspend_failed(&path, e)?),
        },
        PowerAct::SuspendLost { message } => {
            return Err(Error::Core(Core::Invalid {
                reason: reasons::RESTORE_FAILED,
                message,
            }));
        }
    };
    // Read afresh: a resumed guest's addresses are what VMware Tools reports now.
    let mut info = vm_info(&client, &vm).await?;
    let instance_uuid = hardware
        .get("config.instanceUuid")
        .and_then(PropertyValue::text)
        .filter(|u| !u.is_empty() && u.len() <= 64)
        .map(str::to_owned);
    let mut seen = observed(machine, vm_name, &info, instance_uuid, standby.clone());
    // The claim's keys, once the guest is ready for them (a saved member's after its resume):
    // guestinfo changes on a running VM too. The answer comes through the property wait.
    if let Some(value) = access::to_write(machine.spec.access.as_ref(), &seen) {
        let spec = ReconfigSpec {
            extra_config: vec![(GUESTINFO_ACCESS.to_owned(), value)],
            ..ReconfigSpec::default()
        };
        let what = format!("write {GUESTINFO_ACCESS} of VM {path}");
        let task = client
            .reconfigure_vm(&vm, &spec)
            .await
            .map_err(Error::vsphere(what.clone()))?;
        wait_task(&client, &task, &what, ctx.cfg.task_timeout).await?;
        info = vm_info(&client, &vm).await?;
        seen = observed(machine, seen.vm_name, &info, seen.instance_uuid, standby);
    }
    Ok(seen)
}

/// `efiSecureBootEnabled` of a `config.bootOptions` value; `None` when unset.
fn efi_secure_boot(boot_options: Option<&PropertyValue>) -> Option<bool> {
    match boot_options? {
        PropertyValue::Other(options) => match options.child_text("efiSecureBootEnabled")? {
            "true" | "1" => Some(true),
            "false" | "0" => Some(false),
            _ => None,
        },
        _ => None,
    }
}

/// A power task.
#[derive(Clone, Copy)]
enum Power {
    On,
    Suspend,
}

/// Runs a power task on `vm` to its end, within the task deadline.
async fn power(
    client: &Client,
    ctx: &Context,
    vm: &ManagedObjectRef,
    power: Power,
    path: &str,
) -> Result<()> {
    let what = match power {
        Power::On => format!("power on VM {path}"),
        Power::Suspend => format!("suspend VM {path}"),
    };
    let task = match power {
        Power::On => client.power_on_vm(vm).await,
        Power::Suspend => client.suspend_vm(vm).await,
    }
    .map_err(Error::vsphere(what.clone()))?;
    wait_task(client, &task, &what, ctx.cfg.task_timeout).await?;
    Ok(())
}

/// What the status is made from.
fn observed(
    machine: &VSphereMachine,
    vm_name: String,
    info: &VmInfo,
    instance_uuid: Option<String>,
    standby: StandbySight,
) -> Observed {
    let standby = power::standby_sight(machine, &info.power_state, standby);
    Observed {
        vm_name,
        moref: info.moref.value.clone(),
        instance_uuid,
        powered_on: info.power_state == PowerState::PoweredOn,
        power_state: match &info.power_state {
            PowerState::PoweredOn => "poweredOn".to_owned(),
            PowerState::PoweredOff => "poweredOff".to_owned(),
            PowerState::Suspended => "suspended".to_owned(),
            other => format!("{other:?}").chars().take(64).collect(),
        },
        nics: info.guest_nics.clone(),
        phase: info.extra_config.get(GUESTINFO_PHASE).cloned(),
        access_written: info.extra_config.get(GUESTINFO_ACCESS).cloned(),
        access_state: info.extra_config.get(GUESTINFO_ACCESS_STATE).cloned(),
        host_keys: info.extra_config.get(GUESTINFO_SSH_HOST_KEYS).cloned(),
        ek_certificates: info.tpm_endorsement_certificates.clone(),
        standby,
    }
}

/// The VM at `path`, if any.
pub(super) async fn find_vm(client: &Client, path: &str) -> Result<Option<VmInfo>> {
    let Some(found) = client
        .find_by_inventory_path(path)
        .await
        .map_err(Error::vsphere(format!("look up VM {path}")))?
    else {
        return Ok(None);
    };
    if found.kind != "VirtualMachine" {
        return Err(vm::vm_name_taken(path));
    }
    match client.vm_info(&found).await {
        Ok(info) => Ok(Some(info)),
        // Destroyed between the two calls.
        Err(e) if is_not_found(&e) => Ok(None),
        Err(e) => Err(Error::vsphere(format!("read VM {path}"))(e)),
    }
}

async fn vm_info(client: &Client, vm: &ManagedObjectRef) -> Result<VmInfo> {
    client
        .vm_info(vm)
        .await
        .map_err(Error::vsphere(format!("read VM {}", vm.value)))
}

pub(super) fn is_not_found(e: &banlieue_vsphere::Error) -> bool {
    e.fault().is_some_and(|f| f.kind == "ManagedObjectNotFound")
}

/// The template a VSphereMachine names, if this Provider may clone it: whoever writes the
/// machine names the path, so it is held to the same rule as a VMImage's Template source
/// ([`crate::template`]).
async fn cloneable_template(
    client: &Client,
    ctx: &Context,
    template: &str,
) -> Result<ManagedObjectRef> {
    let providers: Api<Provider> = Api::namespaced(ctx.kube.clone(), &ctx.cfg.namespace);
    let provider = providers
        .get(&ctx.cfg.provider)
        .await
        .map_err(Error::kube(format!("read Provider {}", ctx.cfg.provider)))?;
    let sight = template::look(client, &provider, template)
        .await
        .map_err(Error::vsphere(format!("look up {template}")))?;
    match sight {
        TemplateSight::Template(found) => Ok(found),
        TemplateSight::Missing => Err(Error::Core(Core::Invalid {
            reason: vsphere::reasons::INVENTORY_NOT_FOUND,
            message: format!("VirtualMachine {template:?} does not exist in vCenter"),
        })),
        TemplateSight::Refused(why) => Err(Error::Core(Core::Invalid {
            reason: vsphere::reasons::TEMPLATE_REFUSED,
            message: why,
        })),
    }
}

/// Clones the template into the cluster's root resource pool, powered off, carrying its
/// guestinfo and owner.
async fn clone(
    machine: &VSphereMachine,
    ctx: &Context,
    client: &Client,
    uid: &str,
    vm_name: &str,
    path: &str,
) -> Result<ManagedObjectRef> {
    let spec = &machine.spec;
    let not_found = |what: String| {
        Error::Core(Core::Invalid {
            reason: vsphere::reasons::INVENTORY_NOT_FOUND,
            message: format!("{what} does not exist in vCenter"),
        })
    };
    // Whoever writes the machine names its cluster, datastore and folder: each must be one
    // the Provider declared, before vCenter is asked anything about them.
    let providers: Api<Provider> = Api::namespaced(ctx.kube.clone(), &ctx.cfg.namespace);
    let provider = providers
        .get(&ctx.cfg.provider)
        .await
        .map_err(Error::kube(format!("read Provider {}", ctx.cfg.provider)))?;
    if let Some(why) = vsphere::placement_refusal(spec, &provider.spec.capabilities) {
        return Err(Error::Core(Core::Invalid {
            reason: vsphere::reasons::PLACEMENT_NOT_DECLARED,
            message: why,
        }));
    }
    let dc = client
        .datacenters()
        .await
        .map_err(Error::vsphere("list the datacenters"))?
        .into_iter()
        .find(|d| d.name == spec.datacenter)
        .ok_or_else(|| not_found(format!("datacenter {:?}", spec.datacenter)))?;
    let cluster = client
        .clusters(&dc.moref)
        .await
        .map_err(Error::vsphere(format!("list the clusters of {}", dc.name)))?
        .into_iter()
        .find(|c| c.name == spec.cluster)
        .ok_or_else(|| {
            not_found(format!(
                "cluster {:?} in datacenter {:?}",
                spec.cluster, spec.datacenter
            ))
        })?;
    let lookup = |path: String, kind: &'static str| async move {
        match client.find_by_inventory_path(&path).await {
            Ok(Some(r)) if r.kind == kind => Ok(r),
            Ok(_) => Err(not_found(format!("{kind} {path:?}"))),
            Err(e) => Err(Error::vsphere(format!("look up {path}"))(e)),
        }
    };
    let template = cloneable_template(client, ctx, &spec.template).await?;
    let folder = match spec
        .folder
        .as_deref()
        .filter(|f| !f.trim_matches('/').is_empty())
    {
        Some(_) => lookup(vm::folder_path(machine), "Folder").await?,
        None => dc.vm_folder.clone(),
    };
    let datastore = match &spec.datastore {
        Some(ds) => Some(lookup(format!("{}/datastore/{ds}", dc.name), "Datastore").await?),
        None => None,
    };
    let user_data = user_data(machine, ctx).await?;
    let clone = CloneSpec {
        name: vm_name.to_owned(),
        folder,
        pool: cluster.resource_pool,
        host: None,
        datastore,
        power_on: false,
        extra_config: vm::clone_extra_config(uid, vm_name, user_data.as_deref()),
    };
    let task = client
        .clone_vm(&template, &clone)
        .await
        .map_err(Error::vsphere(format!("clone {} as {path}", spec.template)))?;
    match wait_task(
        client,
        &task,
        &format!("clone {} as {path}", spec.template),
        ctx.cfg.task_timeout,
    )
    .await
    {
        Ok(Some(vm)) => Ok(vm),
        Ok(None) => Err(Error::Core(Core::Invalid {
            reason: vsphere::reasons::VSPHERE_ERROR,
            message: format!("the clone of {path} succeeded without naming its VM"),
        })),
        // A clone this machine started earlier finished meanwhile: adopt it next time round.
        Err(e) if e.fault().is_some_and(|f| f.kind == "DuplicateName") => {
            match find_vm(client, path).await? {
                Some(info) if vm::ownership(&info.extra_config, uid) == Ownership::Ours => {
                    Ok(info.moref)
                }
                _ => Err(e),
            }
        }
        Err(e) => Err(e),
    }
}

/// Waits for `task` to end, within `deadline`.
pub(super) async fn wait_task(
    client: &Client,
    task: &ManagedObjectRef,
    what: &str,
    deadline: Duration,
) -> Result<Option<ManagedObjectRef>> {
    match tokio::time::timeout(deadline, client.wait_task(task)).await {
        Ok(result) => result.map_err(Error::vsphere(what.to_owned())),
        Err(_) => Err(Error::TaskTimeout {
            what: what.to_owned(),
            after: deadline,
        }),
    }
}

/// Inline user-data, or the bytes of the Secret key it names, under the kit's policy
/// (`banlieue_provider_kit::user_data`), the same as on every backend.
async fn user_data(machine: &VSphereMachine, ctx: &Context) -> Result<Option<Vec<u8>>> {
    Ok(banlieue_provider_kit::user_data::read(
        &ctx.kube,
        &ctx.cfg.namespace,
        &ctx.cfg.provider,
        machine.spec.user_data.as_deref(),
        machine.spec.user_data_secret_ref.as_ref(),
    )
    .await?)
}

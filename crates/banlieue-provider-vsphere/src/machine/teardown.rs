//! Deleting a VSphereMachine: power its VM off, destroy it, look it up again, and only then let
//! the machine go (ADR-0026). A VM of the machine's name that is not its own is left alone.

use banlieue_api::conditions::{self, reasons, status, types};
use banlieue_api::{VSphereMachine, VSphereMachineStatus};
use banlieue_provider_kit::error::Core;
use banlieue_vsphere::{ManagedObjectRef, PowerState};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::{Resource, ResourceExt};

use super::Context;
use super::realise::{find_vm, is_not_found, wait_task};
use super::vm::{self, Ownership};
use crate::error::{Error, Result};

/// The status of a machine whose teardown failed: Ready=False, TeardownFailed, the error's
/// chain as its message.
pub(super) fn failed_status(
    machine: &VSphereMachine,
    error: &Error,
    now: Time,
) -> VSphereMachineStatus {
    let mut status = machine.status.clone().unwrap_or_default();
    conditions::set(
        &mut status.contract.conditions,
        conditions::new(
            types::READY,
            status::FALSE,
            reasons::TEARDOWN_FAILED,
            conditions::error_message(error),
            machine.meta().generation,
        ),
        now,
    );
    status.contract.ready = false;
    status
}

/// Destroys the machine's own VM. True once no VM of the machine is found any more.
pub(super) async fn destroy(machine: &VSphereMachine, ctx: &Context) -> Result<bool> {
    let uid = machine.uid().unwrap_or_default();
    let vm_name = vm::vm_name(machine)?;
    let path = vm::vm_path(machine, &vm_name);
    let client = ctx.session.client().await?;
    // The recorded reference finds the VM even if someone moved it to another folder.
    let recorded = machine
        .status
        .as_ref()
        .and_then(|s| s.vm_mo_ref.clone())
        .map(|v| ManagedObjectRef::new("VirtualMachine", v));
    let mut found = None;
    if let Some(vm) = &recorded {
        match client.vm_info(vm).await {
            Ok(info) => found = Some(info),
            Err(e) if is_not_found(&e) => {}
            Err(e) => return Err(Error::vsphere(format!("read VM {}", vm.value))(e)),
        }
    }
    if found.is_none() {
        found = find_vm(&client, &path).await.or_else(|e| match e {
            // A foreign object at the path is not ours to remove.
            Error::Core(Core::Invalid { .. }) => Ok(None),
            e => Err(e),
        })?;
    }
    let Some(info) = found else {
        return Ok(true);
    };
    if vm::ownership(&info.extra_config, &uid) == Ownership::Foreign {
        tracing::info!(vm = %path, "a VM of the machine's name is not its own; left alone");
        return Ok(true);
    }
    let vm = info.moref;
    let deadline = ctx.cfg.task_timeout;
    if info.power_state != PowerState::PoweredOff {
        let what = format!("power off VM {path}");
        match client.power_off_vm(&vm).await {
            Ok(task) => match wait_task(&client, &task, &what, deadline).await {
                Ok(_) => {}
                // Already off (or suspended and then off): what was wanted.
                Err(e) if e.fault().is_some_and(|f| f.kind == "InvalidPowerState") => {}
                Err(e) => return Err(e),
            },
            Err(e) if is_not_found(&e) => return Ok(true),
            Err(e) => return Err(Error::vsphere(what)(e)),
        }
    }
    let what = format!("destroy VM {path}");
    match client.destroy(&vm).await {
        Ok(task) => {
            wait_task(&client, &task, &what, deadline).await?;
        }
        Err(e) if is_not_found(&e) => {}
        Err(e) => return Err(Error::vsphere(what)(e)),
    }
    // A destroy that reported success is checked, never trusted: the next machine of this
    // name must not inherit a VM left behind.
    let still_there = match client.vm_info(&vm).await {
        Ok(_) => true,
        Err(e) if is_not_found(&e) => false,
        Err(e) => return Err(Error::vsphere(format!("read VM {path}"))(e)),
    };
    let ours_by_name = find_vm(&client, &path)
        .await?
        .is_some_and(|i| vm::ownership(&i.extra_config, &uid) == Ownership::Ours);
    Ok(!still_there && !ours_by_name)
}

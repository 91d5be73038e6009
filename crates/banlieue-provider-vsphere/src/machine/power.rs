//! What a VSphereMachine's standby asks of its VM's power (ADR-0073), and what became of it.
//! No I/O here.

use banlieue_api::conditions::{self, reasons};
use banlieue_api::{Standby, VSphereMachine};
use banlieue_provider_kit::error::Core;
use banlieue_vsphere::PowerState;

use crate::error::{Error, Result};

/// What `spec.standby` asks of the VM; unset is `Running`.
pub fn wanted(machine: &VSphereMachine) -> Standby {
    machine.spec.standby.unwrap_or_default()
}

/// Whether the status reports standby at all: only for a machine whose spec asks for one, or
/// whose status already says it. A machine of a pool that never uses standby sees no status
/// change (one more write per machine would cost every pool).
pub(super) fn reports_standby(machine: &VSphereMachine) -> bool {
    banlieue_provider_kit::standby::reports_standby(
        machine.spec.standby,
        machine.status.as_ref().map(|s| &s.contract),
    )
}

/// Whether the machine's status last reported it suspended.
fn was_suspended(machine: &VSphereMachine) -> bool {
    machine
        .status
        .as_ref()
        .is_some_and(|s| s.contract.standby == Some(Standby::Saved))
}

/// What one reconcile does with the VM's power, given `spec.standby` (ADR-0073).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PowerAct {
    /// Nothing: the VM is as asked (powered on and `Running`, suspended and `Saved`), or in a
    /// state this provider does not act on.
    Observe,
    /// Powered off (a fresh clone, or a VM someone powered off): power it on, which boots it.
    /// Also a suspended VM of a machine that never used standby (someone suspended it).
    PowerOn,
    /// Powered on, and the spec says `Saved`: suspend it (`SuspendVM_Task`).
    Suspend,
    /// Suspended, and the spec says `Running`: powering it on resumes it. A failure is
    /// `RestoreFailed` ([`resume_failed`]).
    Resume,
    /// Last reported suspended, asked to run, and found powered off: its suspended state is
    /// gone (someone powered it off), so the guest cannot resume where it was. It is not
    /// booted afresh under the same spec (a claim would get another guest): `RestoreFailed`,
    /// and the controller replaces the machine.
    SuspendLost { message: String },
}

/// What to do with the VM, given the machine (its spec and what its status last said) and the
/// VM's power state. `vm` names the VM in the message.
pub fn power_act(machine: &VSphereMachine, power: &PowerState, vm: &str) -> PowerAct {
    match (wanted(machine), power) {
        (Standby::Saved, PowerState::PoweredOn) => PowerAct::Suspend,
        (Standby::Saved, PowerState::Suspended) => PowerAct::Observe,
        (Standby::Running, PowerState::Suspended) if reports_standby(machine) => PowerAct::Resume,
        (Standby::Running, PowerState::PoweredOff) if was_suspended(machine) => {
            PowerAct::SuspendLost {
                message: format!(
                    "VM {vm} was suspended, but is now powered off: its suspended state is                      gone, so it cannot resume; it is not started afresh (it is replaced)"
                ),
            }
        }
        // A saved machine whose VM was powered off (its suspended state discarded) is
        // unclaimed: it boots afresh and is suspended again.
        (_, PowerState::PoweredOff | PowerState::Suspended) => PowerAct::PowerOn,
        _ => PowerAct::Observe,
    }
}

/// The VM's refusal of a power task (the task ran and vSphere said no), as opposed to a lost
/// session or a task that did not end in time, which are tried again. A VM already in the
/// state asked for (`InvalidPowerState`) is not refused either: the next look sees it so.
fn refused(error: &Error) -> bool {
    matches!(
        error,
        Error::VSphere {
            source: banlieue_vsphere::Error::Task { fault, .. },
            ..
        } if fault.kind != "InvalidPowerState"
    )
}

/// The error of a resume (power-on of a suspended VM) that failed: `RestoreFailed` when vSphere
/// refused it, which makes the controller replace the machine (its VM is destroyed with it);
/// any other error as it is, to be tried again.
pub fn resume_failed(vm: &str, error: Error) -> Error {
    if !refused(&error) {
        return error;
    }
    Error::Core(Core::Invalid {
        reason: reasons::RESTORE_FAILED,
        message: format!(
            "powering on suspended VM {vm} failed, so it cannot resume: {}; it is not started \
             afresh (it is replaced)",
            conditions::error_message(&error)
        ),
    })
}

/// What a suspend that failed leaves: when vSphere refused it, the VM keeps running and
/// available (`Ok` with why, reported as `Saved=False`; the suspend is tried again at the next
/// look); any other error fails the reconcile as it is.
pub fn suspend_failed(vm: &str, error: Error) -> Result<String> {
    if !refused(&error) {
        return Err(error);
    }
    Ok(format!(
        "suspending VM {vm} failed, so it keeps running: {}",
        conditions::error_message(&error)
    ))
}

/// What became of the VM's standby in one reconcile (ADR-0073).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StandbySight {
    /// The VM runs (or is on its way), as it always has.
    Running,
    /// Suspended, as its spec asks (just now, or found so). The guest is not asked anything.
    Suspended,
    /// Powered on from suspended by this reconcile: the guest resumed where it was.
    Resumed,
    /// Asked to be saved, but vSphere refused to suspend it: it keeps running (why).
    SuspendRefused(String),
}

/// What became of the standby, given what this reconcile did (`acted`) and the VM's power
/// state read afterwards: a VM suspended as its spec asks is [`StandbySight::Suspended`],
/// whether just now or found so; otherwise what the reconcile did.
pub fn standby_sight(
    machine: &VSphereMachine,
    power: &PowerState,
    acted: StandbySight,
) -> StandbySight {
    if *power == PowerState::Suspended && wanted(machine) == Standby::Saved {
        StandbySight::Suspended
    } else {
        acted
    }
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::{refusal, with_standby};
    use super::*;
    use banlieue_api::vsphere;

    #[test]
    fn the_power_act_follows_the_standby_asked_for() {
        use PowerState::{PoweredOff, PoweredOn, Suspended};
        let (saved, running) = (Some(Standby::Saved), Some(Standby::Running));
        let act = |m: &VSphereMachine, p: PowerState| power_act(m, &p, "vm");
        // Never asked: a powered-off or suspended VM is powered on, as always.
        let plain = with_standby(None, None);
        assert_eq!(act(&plain, PoweredOn), PowerAct::Observe);
        assert_eq!(act(&plain, PoweredOff), PowerAct::PowerOn);
        assert_eq!(act(&plain, Suspended), PowerAct::PowerOn);
        assert_eq!(
            act(&plain, PowerState::Other("unknown".into())),
            PowerAct::Observe
        );
        // Saved: a running VM is suspended, a suspended one stays so; one powered off (its
        // suspended state discarded) is unclaimed, and boots afresh.
        let to_save = with_standby(saved, running);
        assert_eq!(act(&to_save, PoweredOn), PowerAct::Suspend);
        assert_eq!(act(&to_save, Suspended), PowerAct::Observe);
        assert_eq!(
            act(&with_standby(saved, saved), PoweredOff),
            PowerAct::PowerOn
        );
        // Running again: a suspended VM is resumed, a running one observed.
        let to_run = with_standby(running, saved);
        assert_eq!(act(&to_run, Suspended), PowerAct::Resume);
        assert_eq!(act(&to_run, PoweredOn), PowerAct::Observe);
        // Last reported suspended, found powered off: not booted afresh.
        let PowerAct::SuspendLost { message } = act(&to_run, PoweredOff) else {
            panic!("a lost suspend");
        };
        assert!(message.contains("not started afresh"), "{message}");
        // Resumed and reported running since: powered off is powered on, as always.
        assert_eq!(
            act(&with_standby(running, running), PoweredOff),
            PowerAct::PowerOn
        );
        // A status that says standby (or Saved) makes an unset spec resume too.
        assert_eq!(act(&with_standby(None, saved), Suspended), PowerAct::Resume);
    }

    #[test]
    fn a_vm_suspended_as_asked_is_seen_suspended() {
        let saved = with_standby(Some(Standby::Saved), None);
        let running = with_standby(Some(Standby::Running), Some(Standby::Saved));
        let sight = |m: &VSphereMachine, p: PowerState, acted| standby_sight(m, &p, acted);
        assert_eq!(
            sight(&saved, PowerState::Suspended, StandbySight::Running),
            StandbySight::Suspended
        );
        assert_eq!(
            sight(&saved, PowerState::PoweredOn, StandbySight::Running),
            StandbySight::Running
        );
        // Suspended but asked to run (a resume that left it so): not kept, not ready.
        assert_eq!(
            sight(&running, PowerState::Suspended, StandbySight::Running),
            StandbySight::Running
        );
        assert_eq!(
            sight(&running, PowerState::PoweredOn, StandbySight::Resumed),
            StandbySight::Resumed
        );
    }

    #[test]
    fn only_a_refused_resume_is_restore_failed() {
        let e = resume_failed("DC0/vm/x", refusal("GenericVmConfigFault"));
        assert_eq!(e.reason(), reasons::RESTORE_FAILED);
        assert!(
            e.to_string().contains("GenericVmConfigFault") && e.to_string().contains("DC0/vm/x"),
            "{e}"
        );
        // Already powered on: no failure to replace the machine for.
        let e = resume_failed("DC0/vm/x", refusal("InvalidPowerState"));
        assert_eq!(e.reason(), vsphere::reasons::VSPHERE_ERROR);
        let timeout = Error::TaskTimeout {
            what: "power on VM DC0/vm/x".into(),
            after: std::time::Duration::from_secs(1),
        };
        assert_eq!(
            resume_failed("DC0/vm/x", timeout).reason(),
            vsphere::reasons::VSPHERE_ERROR
        );
        // A refused suspend keeps the VM running; any other error fails the reconcile.
        let why = suspend_failed("DC0/vm/x", refusal("NotSupported")).unwrap();
        assert!(
            why.contains("keeps running") && why.contains("NotSupported"),
            "{why}"
        );
        assert!(
            suspend_failed(
                "DC0/vm/x",
                Error::Core(Core::Invalid {
                    reason: "X",
                    message: "y".into()
                })
            )
            .is_err()
        );
    }
}

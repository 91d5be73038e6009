//! What a LibvirtMachine's `spec.standby` asks of its domain (ADR-0073): keep it running, save
//! it, restore it or start it afresh, and what became of it. No I/O here.

use banlieue_api::conditions::{self, reasons, status, types};
use banlieue_api::{LibvirtMachine, LibvirtMachineStatus, Standby};
use banlieue_provider_kit::error::Core;

use super::domain::MachineNames;
use crate::error::{Error, Result};

/// What `spec.standby` asks of the domain; unset is `Running`.
pub fn wanted(machine: &LibvirtMachine) -> Standby {
    machine.spec.standby.unwrap_or_default()
}

/// What one reconcile does about the domain's standby (ADR-0073).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StandbyAct {
    /// Nothing beyond what every reconcile does: the domain is observed as it is.
    Observe,
    /// A shut-off domain without a save image: start it, as any stopped domain.
    Start,
    /// A running domain asked to be saved: managed save.
    Save,
    /// A shut-off domain with its save image, asked to be saved: it is.
    KeepSaved,
    /// A shut-off domain with its save image, asked to run: starting it restores it.
    Restore,
    /// Its restore already failed and its image was removed (or the image of a machine last
    /// reported saved is gone): it is not booted afresh behind the controller's back, which
    /// replaces the machine. The error is reported again as it was (`message`). Only a spec
    /// that says `Saved` again starts it.
    StillFailed { message: String },
}

/// What to do with the domain, given `spec.standby` and what the host shows: whether the
/// domain runs, whether it is shut off (or crashed), and whether it has a managed save image.
pub fn standby_act(
    machine: &LibvirtMachine,
    running: bool,
    shut_off: bool,
    save_image: bool,
) -> StandbyAct {
    match (wanted(machine), running, shut_off, save_image) {
        (Standby::Saved, true, _, _) => StandbyAct::Save,
        (Standby::Saved, _, true, true) => StandbyAct::KeepSaved,
        (Standby::Running, _, true, true) => StandbyAct::Restore,
        (Standby::Running, _, true, false) => match restore_failed_before(machine) {
            Some(message) => StandbyAct::StillFailed { message },
            // Last reported saved, and its image is gone: a restore that failed (a reconcile
            // on a cache that has not seen the report yet) or an image removed behind the
            // provider's back. Either way the guest cannot resume where it was saved.
            None if was_saved(machine) => StandbyAct::StillFailed {
                message: format!(
                    "domain {} was saved, but its managed save image is gone; it is not \
                     started afresh (it is replaced)",
                    MachineNames::of(machine).domain
                ),
            },
            None => StandbyAct::Start,
        },
        (Standby::Saved, _, true, false) => StandbyAct::Start,
        _ => StandbyAct::Observe,
    }
}

/// The message of a `Ready=False RestoreFailed` reported for the machine's current generation.
fn restore_failed_before(machine: &LibvirtMachine) -> Option<String> {
    let status = machine.status.as_ref()?;
    conditions::find(&status.contract.conditions, types::READY)
        .filter(|c| c.reason == reasons::RESTORE_FAILED && c.status == status::FALSE)
        .filter(|c| c.observed_generation == machine.metadata.generation)
        .map(|c| c.message.clone())
}

/// What became of the domain's standby in one reconcile.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StandbySight {
    /// The domain runs, or is started, as it always has.
    Running,
    /// Saved (just now, or found so): shut off with its managed save image. The guest is not
    /// asked anything.
    Saved,
    /// Restored from its managed save image by this reconcile, and whether the guest's clock
    /// was then set to the host's time (`Err` says why not).
    Restored { clock: Result<(), String> },
    /// Asked to be saved but found shut off without an image (the host restarted, or the
    /// domain was stopped): started afresh.
    StartedAfresh,
}

/// Whether the machine's status last reported it saved.
fn was_saved(machine: &LibvirtMachine) -> bool {
    machine
        .status
        .as_ref()
        .is_some_and(|s| s.contract.standby == Some(Standby::Saved))
}

/// What starting a stopped domain without a save image is: a fresh start of a saved machine
/// whose image is gone, or the start of any other.
pub fn started(machine: &LibvirtMachine) -> StandbySight {
    if wanted(machine) == Standby::Saved && was_saved(machine) {
        StandbySight::StartedAfresh
    } else {
        StandbySight::Running
    }
}

/// Whether the agent is worth waiting for to set the clock after a restore: it answered
/// before the save (AgentConnected as recorded). A guest that never had one is asked once.
pub fn agent_expected(machine: &LibvirtMachine) -> bool {
    machine
        .status
        .as_ref()
        .is_some_and(|s| conditions::is_true(&s.contract.conditions, types::AGENT_CONNECTED))
}

/// The error of a restore that failed: what libvirt said, and that the image is gone (or why
/// it could not be removed).
pub fn restore_failed(domain: &str, libvirt_said: &str, removed: Result<(), String>) -> Error {
    let image = match removed {
        Ok(()) => "its save image was removed".to_owned(),
        Err(why) => format!("removing its save image failed too: {why}"),
    };
    Error::Core(Core::Invalid {
        reason: reasons::RESTORE_FAILED,
        message: format!(
            "restoring domain {domain} from its managed save image failed: {libvirt_said}; \
             {image}, and the machine is not started afresh (it is replaced)"
        ),
    })
}

/// Whether the status reports standby at all: only for a machine whose spec asks for one, or
/// whose status already says it. A machine of a pool that never uses standby sees no status
/// change (one more write per machine would cost every pool).
pub(super) fn reports_standby(machine: &LibvirtMachine, old: &LibvirtMachineStatus) -> bool {
    banlieue_provider_kit::standby::reports_standby(machine.spec.standby, Some(&old.contract))
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::{
        at, condition, immediate, machine, ready_machine, saved_domain, saved_then_asked_to_run,
    };
    use super::super::status::status_after;
    use super::*;

    #[test]
    fn a_restore_that_failed_is_reported_once_and_not_booted_afresh_for_the_same_spec() {
        let m = saved_then_asked_to_run();
        // A shut-off domain with its image, asked to run: restored.
        assert_eq!(standby_act(&m, false, true, true), StandbyAct::Restore);
        let failed = restore_failed(
            "banlieue-system-web-01",
            "internal error: cannot load the save image",
            Ok(()),
        );
        let s = status_after(&m, "banlieue-system", "edge-7", &Err(failed), at(40));
        assert!(!s.contract.ready);
        let ready = condition(&s, types::READY);
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            (status::FALSE, reasons::RESTORE_FAILED)
        );
        assert_eq!(
            ready.message,
            "restoring domain banlieue-system-web-01 from its managed save image failed: \
             internal error: cannot load the save image; its save image was removed, and the \
             machine is not started afresh (it is replaced)"
        );
        assert_eq!(
            s.contract.standby,
            Some(Standby::Saved),
            "never Running, which would read as resumed"
        );
        let saved = condition(&s, types::SAVED);
        assert_eq!(
            (saved.status.as_str(), saved.reason.as_str()),
            (status::FALSE, reasons::DOMAIN_NOT_SAVED)
        );

        // The retry finds the domain stopped without an image: the same error, no write.
        let mut retried = m.clone();
        retried.status = Some(s.clone());
        let StandbyAct::StillFailed { message } = standby_act(&retried, false, true, false) else {
            panic!("a failed restore is not booted afresh for the same spec");
        };
        let again = Error::Core(Core::Invalid {
            reason: reasons::RESTORE_FAILED,
            message,
        });
        assert_eq!(
            status_after(&retried, "banlieue-system", "edge-7", &Err(again), at(50)),
            s
        );
        // A reconcile that has not seen the report yet (the cache lags) finds the image gone
        // from a machine last reported saved: not booted afresh either.
        let StandbyAct::StillFailed { message } = standby_act(&m, false, true, false) else {
            panic!("a saved machine without its image is not booted afresh");
        };
        assert!(
            message.contains("was saved, but its managed save image is gone"),
            "{message}"
        );
        // Only a spec that says Saved again starts it.
        retried.metadata.generation = Some(4);
        assert!(matches!(
            standby_act(&retried, false, true, false),
            StandbyAct::StillFailed { .. }
        ));
        retried.spec.standby = Some(Standby::Saved);
        assert_eq!(standby_act(&retried, false, true, false), StandbyAct::Start);

        let kept = restore_failed("d", "boom", Err("permission denied".into()));
        assert!(
            kept.to_string()
                .contains("removing its save image failed too: permission denied"),
            "{kept}"
        );
    }

    #[test]
    fn what_a_reconcile_does_follows_spec_standby_and_the_host() {
        let saved_spec = ready_machine(Some(Standby::Saved));
        let running_spec = ready_machine(Some(Standby::Running));
        let unset = ready_machine(None);
        // (running, shut off, save image)
        assert_eq!(
            standby_act(&saved_spec, true, false, false),
            StandbyAct::Save
        );
        assert_eq!(
            standby_act(&saved_spec, false, true, true),
            StandbyAct::KeepSaved
        );
        // Host rebooted or crashed: started as today, saved again once ready.
        assert_eq!(
            standby_act(&saved_spec, false, true, false),
            StandbyAct::Start
        );
        // Paused, or any other state: observed as it is.
        assert_eq!(
            standby_act(&saved_spec, false, false, false),
            StandbyAct::Observe
        );
        for m in [&running_spec, &unset] {
            assert_eq!(standby_act(m, false, true, true), StandbyAct::Restore);
            assert_eq!(standby_act(m, false, true, false), StandbyAct::Start);
            assert_eq!(standby_act(m, true, false, false), StandbyAct::Observe);
        }
        // A fresh start of a machine that was saved says so; of one never saved, it does not.
        assert_eq!(started(&saved_spec), StandbySight::Running);
        let mut was_saved = saved_spec.clone();
        was_saved.status = Some(status_after(
            &saved_spec,
            "banlieue-system",
            "edge-7",
            &Ok(saved_domain()),
            at(20),
        ));
        assert_eq!(started(&was_saved), StandbySight::StartedAfresh);
        assert!(
            agent_expected(&saved_spec),
            "its agent answered before the save"
        );
        assert!(!agent_expected(&machine(immediate(), None)));
    }
}

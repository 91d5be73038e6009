//! What a machine's status says of its standby (ADR-0073), the same for every backend that can
//! save machines: whether the status speaks of standby at all, and how a saved machine and a
//! running one show in `status.standby` and the `Saved` condition. The words (reasons and
//! messages) are the backend's: a managed save image is not a suspended VM.

use banlieue_api::conditions::{self, status, types};
use banlieue_api::{MachineStatusContract, Standby};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

/// Whether the status reports standby: only for a machine whose spec asks for one (`spec`), or
/// whose status (`old`) already says it. A machine of a pool that never uses standby sees no
/// change (one more status field per machine would be one more write for every pool).
pub fn reports_standby(spec: Option<Standby>, old: Option<&MachineStatusContract>) -> bool {
    spec.is_some()
        || old.is_some_and(|old| {
            old.standby.is_some() || conditions::find(&old.conditions, types::SAVED).is_some()
        })
}

/// A saved machine: ready (a claim resumes it, nothing provisions it); where the status
/// `reports` standby, `status.standby: Saved` and `Saved=True` with `reason` and `message`.
pub fn mark_saved(
    contract: &mut MachineStatusContract,
    reports: bool,
    reason: &str,
    message: String,
    generation: Option<i64>,
    now: &Time,
) {
    contract.ready = true;
    if reports {
        contract.standby = Some(Standby::Saved);
        conditions::set(
            &mut contract.conditions,
            conditions::new(types::SAVED, status::TRUE, reason, message, generation),
            now.clone(),
        );
    }
}

/// A machine that runs, of one whose status reports standby: `status.standby: Running` and
/// `Saved=False` with `reason` and `message`.
pub fn mark_running(
    contract: &mut MachineStatusContract,
    reason: &str,
    message: String,
    generation: Option<i64>,
    now: &Time,
) {
    contract.standby = Some(Standby::Running);
    conditions::set(
        &mut contract.conditions,
        conditions::new(types::SAVED, status::FALSE, reason, message, generation),
        now.clone(),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn now() -> Time {
        Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH)
    }

    #[test]
    fn only_a_machine_that_asked_or_reported_speaks_of_standby() {
        let mut old = MachineStatusContract::default();
        assert!(!reports_standby(None, None));
        assert!(!reports_standby(None, Some(&old)));
        assert!(reports_standby(Some(Standby::Running), None));
        // The spec lost its field (a pool edited back): the status goes on saying it.
        mark_running(&mut old, "R", "runs".into(), Some(1), &now());
        assert!(reports_standby(None, Some(&old)));
        old.standby = None;
        assert!(
            reports_standby(None, Some(&old)),
            "the Saved condition alone"
        );
    }

    #[test]
    fn saved_then_running_flips_the_field_and_the_condition_keeps_its_history() {
        let mut contract = MachineStatusContract::default();
        mark_saved(&mut contract, false, "S", "saved".into(), Some(1), &now());
        assert!(contract.ready);
        assert_eq!(contract.standby, None, "not reported: nothing said");
        assert!(conditions::find(&contract.conditions, types::SAVED).is_none());
        mark_saved(&mut contract, true, "S", "saved".into(), Some(2), &now());
        assert_eq!(contract.standby, Some(Standby::Saved));
        let saved = conditions::find(&contract.conditions, types::SAVED).expect("Saved");
        assert_eq!(
            (
                saved.status.as_str(),
                saved.reason.as_str(),
                saved.message.as_str()
            ),
            (status::TRUE, "S", "saved")
        );
        mark_running(&mut contract, "N", "runs".into(), Some(3), &now());
        assert_eq!(contract.standby, Some(Standby::Running));
        let saved = conditions::find(&contract.conditions, types::SAVED).expect("Saved");
        assert_eq!(
            (saved.status.as_str(), saved.observed_generation),
            (status::FALSE, Some(3))
        );
    }
}

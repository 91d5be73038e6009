//! Saved warm members (ADR-0073), the controller's half (pure): which standby a member's
//! machine is asked for, and whether the machine's provider has done what it was asked.
//!
//! A member of a `standby: Saved` pool is born running. Once it has reached its pool's
//! readiness and while nobody has claimed it, its machine is asked to be `Saved`; the bind
//! (one write on the VirtualMachine, unchanged) makes it `Running` again, and the claim
//! reports `Resumed` once the provider says the machine runs for that spec.

use banlieue_api::names;
use banlieue_api::{
    MachineSpecContract, MachineStatusContract, PoolReadiness, Standby, VirtualMachine,
};
use kube::ResourceExt;

use crate::member::MemberView;

/// The `spec.standby` the member's machine should have, or `None` when the VirtualMachine
/// does not ask for saved standby (its machine's spec is never written for it). `readiness`
/// is its pool's, `None` when it has no pool (then it runs). `saves`: the machine's kind
/// can be saved at all.
pub fn desired(
    vm: &VirtualMachine,
    readiness: Option<PoolReadiness>,
    saves: bool,
) -> Option<Standby> {
    if vm.spec.standby != Some(Standby::Saved) || !saves {
        return None;
    }
    let claimed = vm.labels().contains_key(names::LABEL_CLAIM);
    let deleting = vm.metadata.deletion_timestamp.is_some();
    let ready = readiness.is_some_and(|readiness| MemberView::of(vm, readiness).available);
    Some(if ready && !claimed && !deleting {
        Standby::Saved
    } else {
        Standby::Running
    })
}

/// Whether the machine's `spec.standby` must be written to become `desired`. An unset
/// standby is `Running`: a member claimed before it was ever saved costs no write.
pub fn needs_write(current: Option<Standby>, desired: Option<Standby>) -> bool {
    desired.is_some_and(|desired| current.unwrap_or_default() != desired)
}

/// The standby the machine is in, as its provider reported it for the machine's current
/// spec (`generation` is the machine's `metadata.generation`); `None` while the provider has
/// not acted on the latest spec. A machine never asked to save, or of a kind that cannot be
/// saved, runs.
pub fn reported(
    spec: &MachineSpecContract,
    status: &MachineStatusContract,
    generation: Option<i64>,
    saves: bool,
) -> Option<Standby> {
    if !saves || (spec.standby.is_none() && status.standby.is_none()) {
        return Some(Standby::Running);
    }
    let behind = match (status.observed_generation, generation) {
        (Some(observed), Some(generation)) => observed < generation,
        (None, Some(_)) => true,
        _ => false,
    };
    if behind { None } else { status.standby }
}

#[cfg(test)]
mod tests {
    use super::*;
    use banlieue_api::conditions::{self, status, types};
    use banlieue_api::{LocalObjectReference, VirtualMachineSpec, VirtualMachineStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use k8s_openapi::jiff::Timestamp;

    fn member(standby: Option<Standby>, guest_ready: bool, claimed: bool) -> VirtualMachine {
        let mut vm = VirtualMachine::new(
            "web-abc",
            VirtualMachineSpec {
                class_ref: LocalObjectReference::new("small"),
                image_ref: LocalObjectReference::new("img"),
                storage_class_name: "fast".into(),
                network_class_name: "prod".into(),
                user_data: None,
                user_data_secret_ref: None,
                standby,
                access: None,
                handover: None,
            },
        );
        let mut labels =
            std::collections::BTreeMap::from([(names::LABEL_POOL.to_owned(), "web".to_owned())]);
        if claimed {
            labels.insert(names::LABEL_CLAIM.to_owned(), "alice".to_owned());
        }
        vm.metadata.labels = Some(labels);
        let now = Time(Timestamp::now());
        let mut status = VirtualMachineStatus {
            ready_since: Some(now.clone()),
            ..Default::default()
        };
        let condition = |type_, ok: bool| {
            conditions::new(
                type_,
                if ok { status::TRUE } else { status::FALSE },
                "Test",
                String::new(),
                None,
            )
        };
        conditions::set(
            &mut status.conditions,
            condition(types::INFRASTRUCTURE_READY, true),
            now.clone(),
        );
        conditions::set(
            &mut status.conditions,
            condition(types::GUEST_READY, guest_ready),
            now,
        );
        vm.status = Some(status);
        vm
    }

    #[test]
    fn only_an_unclaimed_member_at_its_pools_readiness_is_saved() {
        let guest = Some(PoolReadiness::GuestReady);
        let saved = Some(Standby::Saved);
        let running = Some(Standby::Running);
        assert_eq!(desired(&member(saved, true, false), guest, true), saved);
        // Not at readiness yet: the guest has not said ready.
        assert_eq!(desired(&member(saved, false, false), guest, true), running);
        // An InfrastructureReady pool saves once the machine runs.
        let infra = Some(PoolReadiness::InfrastructureReady);
        assert_eq!(desired(&member(saved, false, false), infra, true), saved);
        // Claimed: resumed.
        assert_eq!(desired(&member(saved, true, true), guest, true), running);
        // No pool: runs.
        assert_eq!(desired(&member(saved, true, false), None, true), running);
        // Not asked for, or a kind that cannot be saved: never written.
        assert_eq!(desired(&member(None, true, false), guest, true), None);
        assert_eq!(desired(&member(running, true, false), guest, true), None);
        assert_eq!(desired(&member(saved, true, false), guest, false), None);
        let mut deleting = member(saved, true, false);
        deleting.metadata.deletion_timestamp = Some(Time(Timestamp::now()));
        assert_eq!(desired(&deleting, guest, true), running);
    }

    #[test]
    fn unset_is_running_so_a_never_saved_member_costs_no_write() {
        let (saved, running) = (Some(Standby::Saved), Some(Standby::Running));
        assert!(!needs_write(None, running));
        assert!(!needs_write(None, None));
        assert!(!needs_write(saved, None));
        assert!(needs_write(None, saved));
        assert!(needs_write(saved, running));
        assert!(!needs_write(saved, saved));
    }

    #[test]
    fn a_report_counts_only_for_the_current_spec() {
        let spec = |standby| MachineSpecContract {
            standby,
            ..Default::default()
        };
        let status = |standby, observed| MachineStatusContract {
            standby,
            observed_generation: observed,
            ..Default::default()
        };
        let (saved, running) = (Some(Standby::Saved), Some(Standby::Running));
        // Never asked to save: running, whatever the generations.
        assert_eq!(
            reported(&spec(None), &status(None, Some(1)), Some(1), true),
            running
        );
        // Asked to run again at generation 3; the provider's word is of generation 2.
        assert_eq!(
            reported(&spec(running), &status(saved, Some(2)), Some(3), true),
            None
        );
        assert_eq!(
            reported(&spec(running), &status(running, Some(2)), Some(3), true),
            None
        );
        assert_eq!(
            reported(&spec(running), &status(running, Some(3)), Some(3), true),
            running
        );
        assert_eq!(
            reported(&spec(saved), &status(saved, Some(2)), Some(2), true),
            saved
        );
        // No status yet.
        assert_eq!(
            reported(&spec(saved), &status(None, None), Some(1), true),
            None
        );
        // A kind that cannot be saved runs.
        assert_eq!(
            reported(&spec(saved), &status(None, None), Some(1), false),
            running
        );
    }
}

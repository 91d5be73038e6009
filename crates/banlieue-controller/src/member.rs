//! How the controller reads a VirtualMachine as a pool member (pure).

use banlieue_api::conditions::{self, types};
use banlieue_api::names;
use banlieue_api::{PoolReadiness, VirtualMachine};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

use crate::hosts::HostState;
use crate::machine_status::MACHINE_DELETED;

/// A snapshot of one member, with only what pool and claim decisions read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemberView {
    pub name: String,
    pub revision: Option<String>,
    pub created: Option<Timestamp>,
    /// A claim may take it now.
    pub available: bool,
    /// Since when it has been available (readySince, or GuestReady's transition time).
    pub available_since: Option<Timestamp>,
    /// Its machine is ready.
    pub infrastructure_ready: bool,
    /// Since when its machine has been ready.
    pub infrastructure_ready_since: Option<Timestamp>,
    /// Since when its machine has been running, ready or only waiting for its EK
    /// certificates (ADR-0045): how long a silent guest has had to speak.
    pub running_since: Option<Timestamp>,
    /// The guest spoke: its `GuestReady` is True or False. Unknown (no agent, no phase file)
    /// or no condition at all is silence, which `ReadinessSignalAbsent` is about.
    pub published_guest_ready: bool,
    /// Its deletion was requested.
    pub deleting: bool,
    /// It can never become available (its machine was deleted).
    pub failed: bool,
    /// What its Provider says about its host ([`MemberView::on_host`]).
    pub host: HostState,
    pub resource_version: Option<String>,
}

impl MemberView {
    /// Reads `vm` under the pool's readiness rule.
    pub fn of(vm: &VirtualMachine, readiness: PoolReadiness) -> Self {
        let status = vm.status.clone().unwrap_or_default();
        let infra = conditions::is_true(&status.conditions, types::INFRASTRUCTURE_READY);
        let infra_since = infra
            .then(|| status.ready_since.as_ref().map(|t| t.0))
            .flatten();
        let running_since = infra_since.or_else(|| {
            conditions::find(&status.conditions, types::INFRASTRUCTURE_READY)
                .filter(|c| c.reason == conditions::reasons::ENDORSEMENT_CERTIFICATES_PENDING)
                .map(|c| c.last_transition_time.0)
        });
        let guest = conditions::find(&status.conditions, types::GUEST_READY);
        let deleting = vm.metadata.deletion_timestamp.is_some();
        let (available, available_since) = match readiness {
            PoolReadiness::InfrastructureReady => (infra, infra_since),
            PoolReadiness::GuestReady => {
                let guest_ready = guest.is_some_and(|c| c.status == conditions::status::TRUE);
                (
                    infra && guest_ready,
                    guest
                        .filter(|_| infra && guest_ready)
                        .map(|c| c.last_transition_time.0),
                )
            }
        };
        let failed = conditions::find(&status.conditions, types::INFRASTRUCTURE_READY)
            .is_some_and(|c| c.reason == MACHINE_DELETED);
        Self {
            name: vm.name_any(),
            revision: vm.labels().get(names::LABEL_POOL_REVISION).cloned(),
            created: vm.metadata.creation_timestamp.as_ref().map(|t| t.0),
            available: available && !deleting && !failed,
            available_since,
            infrastructure_ready: infra,
            infrastructure_ready_since: infra_since,
            running_since,
            published_guest_ready: guest.is_some_and(|c| c.status != conditions::status::UNKNOWN),
            deleting,
            failed,
            host: HostState::Ready,
            resource_version: vm.metadata.resource_version.clone(),
        }
    }

    /// The view with its host's state: a member on a host that is not Ready is not available,
    /// whatever its last mirrored status says (nobody can update that status meanwhile).
    pub fn on_host(mut self, host: HostState) -> Self {
        self.host = host;
        if host != HostState::Ready {
            self.available = false;
        }
        self
    }

    /// Its host has been unready past the grace: the pool replaces it.
    pub fn host_lost(&self) -> bool {
        self.host == HostState::Lost
    }

    /// The member's phase, as the `pool_members` metric counts it.
    pub fn phase(&self) -> &'static str {
        if self.deleting {
            PHASE_DELETING
        } else if self.failed {
            PHASE_FAILED
        } else if self.host != HostState::Ready {
            PHASE_HOST_NOT_READY
        } else if self.available {
            PHASE_AVAILABLE
        } else if self.infrastructure_ready {
            PHASE_WAITING_FOR_GUEST
        } else {
            PHASE_PROVISIONING
        }
    }
}

/// An unclaimed member being built: scheduled, or its machine not ready yet.
pub const PHASE_PROVISIONING: &str = "Provisioning";
/// Its machine is ready; the guest has not said it is (GuestReady pools).
pub const PHASE_WAITING_FOR_GUEST: &str = "WaitingForGuest";
/// A claim may take it now.
pub const PHASE_AVAILABLE: &str = "Available";
/// It can never become available; the pool replaces it.
pub const PHASE_FAILED: &str = "Failed";
/// Its Provider is not Ready: not handed out; replaced once the host is lost.
pub const PHASE_HOST_NOT_READY: &str = "HostNotReady";
/// Its deletion was requested.
pub const PHASE_DELETING: &str = "Deleting";
/// Bound to a claim (counted from the pool's Bound claims).
pub const PHASE_CLAIMED: &str = "Claimed";
/// Every phase, so a phase no member is in is reported as zero rather than left stale.
pub const PHASES: [&str; 7] = [
    PHASE_PROVISIONING,
    PHASE_WAITING_FOR_GUEST,
    PHASE_AVAILABLE,
    PHASE_FAILED,
    PHASE_HOST_NOT_READY,
    PHASE_DELETING,
    PHASE_CLAIMED,
];

/// Whether `vm` is an unclaimed member of the pool with uid `pool_uid`: labelled with the pool,
/// controlled by it, and carrying no claim.
pub fn is_unclaimed_member(vm: &VirtualMachine, pool_name: &str, pool_uid: &str) -> bool {
    vm.labels().get(names::LABEL_POOL).map(String::as_str) == Some(pool_name)
        && !vm.labels().contains_key(names::LABEL_CLAIM)
        && controller_uid(vm) == Some(pool_uid)
}

/// Whether `vm` is bound to the claim with uid `claim_uid`.
pub fn is_bound_to(vm: &VirtualMachine, claim_name: &str, claim_uid: &str) -> bool {
    vm.labels().get(names::LABEL_CLAIM).map(String::as_str) == Some(claim_name)
        && controller_uid(vm) == Some(claim_uid)
}

/// The uid of the object's controller owner.
pub fn controller_uid(vm: &VirtualMachine) -> Option<&str> {
    vm.owner_references()
        .iter()
        .find(|o| o.controller == Some(true))
        .map(|o| o.uid.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;
    use banlieue_api::{LocalObjectReference, VirtualMachineSpec, VirtualMachineStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn vm_with(guest_ready: Option<&str>) -> VirtualMachine {
        let mut vm = VirtualMachine::new(
            "m",
            VirtualMachineSpec {
                class_ref: LocalObjectReference::new("small"),
                image_ref: LocalObjectReference::new("img"),
                storage_class_name: "standard".into(),
                network_class_name: "isolated".into(),
                user_data: None,
                user_data_secret_ref: None,
                standby: None,
                access: None,
                handover: None,
            },
        );
        let mut status = VirtualMachineStatus::default();
        let at = Time(Timestamp::from_second(1_000).unwrap());
        for (type_, value) in [
            (types::INFRASTRUCTURE_READY, Some("True")),
            (types::GUEST_READY, guest_ready),
        ] {
            if let Some(value) = value {
                conditions::set(
                    &mut status.conditions,
                    conditions::new(type_, value, "R", "", None),
                    at.clone(),
                );
            }
        }
        vm.status = Some(status);
        vm
    }

    #[test]
    fn an_unknown_guest_ready_is_silence_not_a_signal() {
        let read = |g| MemberView::of(&vm_with(g), PoolReadiness::GuestReady);
        assert!(!read(None).published_guest_ready);
        assert!(!read(Some("Unknown")).published_guest_ready);
        assert!(!read(Some("Unknown")).available);
        assert!(read(Some("False")).published_guest_ready);
        assert!(!read(Some("False")).available);
        let ready = read(Some("True"));
        assert!(ready.published_guest_ready && ready.available);
    }

    #[test]
    fn a_member_waiting_for_its_ek_certificates_is_running_but_not_ready() {
        let mut vm = vm_with(None);
        let status = vm.status.as_mut().unwrap();
        status.conditions.clear();
        conditions::set(
            &mut status.conditions,
            conditions::new(
                types::INFRASTRUCTURE_READY,
                "False",
                conditions::reasons::ENDORSEMENT_CERTIFICATES_PENDING,
                "",
                None,
            ),
            Time(Timestamp::from_second(2_000).unwrap()),
        );
        let view = MemberView::of(&vm, PoolReadiness::InfrastructureReady);
        assert!(!view.available && !view.infrastructure_ready);
        assert_eq!(
            view.running_since,
            Some(Timestamp::from_second(2_000).unwrap())
        );
    }
}

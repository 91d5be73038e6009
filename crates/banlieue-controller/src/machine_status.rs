//! What a VirtualMachine's status says about its machine (pure): scheduling results and the
//! mirror of the machine's status, read through the contract every machine kind carries.

use banlieue_api::conditions::{self, reasons, status, types};
use banlieue_api::{
    LocalObjectReference, MachineReference, MachineStatusContract, VirtualMachineStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::machine_builder::MachineBackend;
use banlieue_api::backend::Placement;

use crate::scheduling::Unschedulable;

/// Reason of InfrastructureReady=False (and Ready=False) on a VirtualMachine whose machine was
/// deleted out from under it. It is never recreated: a pool member or a bound VM silently
/// replaced by a fresh one would break "bound at most once". A pool replaces such a member.
pub const MACHINE_DELETED: &str = "MachineDeleted";

/// The status after a failed scheduling attempt.
pub fn unschedulable(
    current: &VirtualMachineStatus,
    failure: &Unschedulable,
    generation: Option<i64>,
    now: Time,
) -> VirtualMachineStatus {
    let mut next = current.clone();
    conditions::set(
        &mut next.conditions,
        conditions::new(
            types::SCHEDULED,
            status::FALSE,
            failure.reason,
            failure.message.clone(),
            generation,
        ),
        now.clone(),
    );
    set_ready(
        &mut next,
        false,
        failure.reason,
        &failure.message,
        generation,
        now,
    );
    next
}

/// Where a VirtualMachine's machine is, as its status records it once scheduled.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Scheduled {
    pub machine: MachineReference,
    pub provider: String,
    pub failure_domain: String,
    pub image_revision: Option<String>,
}

impl Scheduled {
    /// The machine `machine_name`, of `backend`'s kind, created for `placement`.
    pub fn of(backend: &MachineBackend, placement: &Placement, machine_name: &str) -> Scheduled {
        Scheduled {
            machine: backend.reference(machine_name),
            provider: placement.provider.clone(),
            failure_domain: placement.failure_domain.clone(),
            image_revision: placement.image_revision.clone(),
        }
    }
}

/// The status once the machine was created where `site` says.
pub fn scheduled(
    current: &VirtualMachineStatus,
    site: &Scheduled,
    generation: Option<i64>,
    now: Time,
) -> VirtualMachineStatus {
    let mut next = current.clone();
    next.machine_ref = Some(site.machine.clone());
    next.provider_ref = Some(LocalObjectReference::new(&site.provider));
    next.failure_domain = Some(site.failure_domain.clone());
    next.image_revision = site.image_revision.clone();
    conditions::set(
        &mut next.conditions,
        conditions::new(
            types::SCHEDULED,
            status::TRUE,
            reasons::SCHEDULED,
            format!(
                "provider {} failure domain {}",
                site.provider, site.failure_domain
            ),
            generation,
        ),
        now.clone(),
    );
    // What the first mirror of a machine the provider has not reported on would write, written
    // now: that mirror is then no change and costs no write.
    if conditions::find(&next.conditions, types::INFRASTRUCTURE_READY).is_none() {
        set_not_reported(&mut next, generation, now);
    }
    next
}

fn set_not_reported(next: &mut VirtualMachineStatus, generation: Option<i64>, now: Time) {
    conditions::set(
        &mut next.conditions,
        conditions::new(
            types::INFRASTRUCTURE_READY,
            status::FALSE,
            reasons::MACHINE_NOT_READY,
            NOT_REPORTED,
            generation,
        ),
        now.clone(),
    );
    set_ready(
        next,
        false,
        reasons::MACHINE_NOT_READY,
        NOT_REPORTED,
        generation,
        now,
    );
}

/// The message of InfrastructureReady=False before the provider has said anything.
const NOT_REPORTED: &str = "the provider has not reported yet";

/// The status with the machine's state mirrored: addresses, certificates, guest phase, SSH
/// host keys and login, InfrastructureReady (= the machine is ready), GuestReady and
/// AccessReady (copied when the provider publishes them), Ready, and readySince (kept while Ready stays true). It reads only what
/// every machine kind carries ([`MachineStatusContract`], and `tpmEnabled` from the spec
/// contract), so it is the same for every backend.
pub fn mirror_machine(
    current: &VirtualMachineStatus,
    machine_status: &MachineStatusContract,
    tpm_enabled: bool,
    generation: Option<i64>,
    now: Time,
) -> VirtualMachineStatus {
    let mut next = current.clone();
    next.addresses = machine_status.addresses.clone();
    next.tpm_endorsement_certificates = machine_status.tpm_endorsement_certificates.clone();
    next.tpm_endorsement_key_digests = machine_status.tpm_endorsement_key_digests.clone();
    next.guest_phase = machine_status.guest_phase.clone();
    let machine_ready = conditions::find(&machine_status.conditions, types::READY);
    // ADR-0045: a tpmEnabled member is not handed out before its EK certificates are recorded,
    // whichever readiness its pool waits on.
    let ek_pending = tpm_enabled && machine_status.tpm_endorsement_certificates.is_empty();
    let infrastructure_ready = machine_status.ready && !ek_pending;
    let (reason, message) = if infrastructure_ready {
        (reasons::MACHINE_READY, String::new())
    } else if machine_status.ready {
        (
            reasons::ENDORSEMENT_CERTIFICATES_PENDING,
            "the machine runs; its vTPM's endorsement-key certificates are not recorded yet"
                .to_owned(),
        )
    } else {
        (
            reasons::MACHINE_NOT_READY,
            machine_ready
                .map(|c| format!("{}: {}", c.reason, c.message))
                .unwrap_or_else(|| NOT_REPORTED.to_owned()),
        )
    };
    conditions::set(
        &mut next.conditions,
        conditions::new(
            types::INFRASTRUCTURE_READY,
            if infrastructure_ready {
                status::TRUE
            } else {
                status::FALSE
            },
            reason,
            message.clone(),
            generation,
        ),
        now.clone(),
    );
    next.ssh_host_keys = machine_status.ssh_host_keys.clone();
    next.login_user = machine_status.login_user.clone();
    next.attestation = machine_status.attestation.clone();
    for copied in [types::GUEST_READY, types::ACCESS_READY] {
        if let Some(condition) = conditions::find(&machine_status.conditions, copied) {
            let mut mirrored = condition.clone();
            mirrored.observed_generation = generation;
            // Copied from another writer's object: bound it like every message this writes.
            mirrored.message =
                conditions::bounded_message(mirrored.message, conditions::MAX_MESSAGE_BYTES);
            conditions::set(&mut next.conditions, mirrored, now.clone());
        }
    }
    set_ready(
        &mut next,
        infrastructure_ready,
        reason,
        &message,
        generation,
        now,
    );
    next
}

/// The status once the machine was found deleted.
pub fn machine_deleted(
    current: &VirtualMachineStatus,
    machine_name: &str,
    generation: Option<i64>,
    now: Time,
) -> VirtualMachineStatus {
    let mut next = current.clone();
    let message = format!("machine {machine_name} was deleted");
    conditions::set(
        &mut next.conditions,
        conditions::new(
            types::INFRASTRUCTURE_READY,
            status::FALSE,
            MACHINE_DELETED,
            message.clone(),
            generation,
        ),
        now.clone(),
    );
    next.addresses.clear();
    set_ready(&mut next, false, MACHINE_DELETED, &message, generation, now);
    next
}

fn set_ready(
    next: &mut VirtualMachineStatus,
    ready: bool,
    reason: &str,
    message: &str,
    generation: Option<i64>,
    now: Time,
) {
    conditions::set(
        &mut next.conditions,
        conditions::new(
            types::READY,
            if ready { status::TRUE } else { status::FALSE },
            reason,
            message,
            generation,
        ),
        now.clone(),
    );
    next.ready_since = match (ready, next.ready_since.take()) {
        (true, Some(since)) => Some(since),
        (true, None) => Some(now),
        (false, _) => None,
    };
}

#[cfg(test)]
mod tests {
    use super::*;
    use banlieue_api::MachineAddress;

    fn at(secs: i64) -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(secs).expect("valid time"))
    }

    /// What a machine of any kind reports, ready or not, with one address.
    fn machine(ready: bool) -> MachineStatusContract {
        MachineStatusContract {
            ready,
            addresses: vec![MachineAddress {
                type_: "InternalIP".into(),
                address: "192.0.2.1".into(),
            }],
            ..Default::default()
        }
    }

    #[test]
    fn the_first_mirror_after_scheduling_changes_nothing() {
        let site = Scheduled {
            machine: crate::machine_builder::in_tree_backends()
                .get(&banlieue_api::MachineKind::LIBVIRT_MACHINE)
                .expect("built in")
                .reference("m"),
            provider: "p".into(),
            failure_domain: "host-1".into(),
            image_revision: None,
        };
        let s = scheduled(&Default::default(), &site, Some(1), at(10));
        assert_eq!(
            s.machine_ref.as_ref().map(|r| r.kind.as_str()),
            Some("LibvirtMachine")
        );
        let unreported = MachineStatusContract::default();
        assert_eq!(mirror_machine(&s, &unreported, false, Some(1), at(20)), s);
        // Once the provider reports, the mirror does change it.
        assert_ne!(
            mirror_machine(&s, &machine(true), false, Some(1), at(20)),
            s
        );
    }

    #[test]
    fn ready_since_is_kept_while_ready_and_cleared_when_not() {
        let s = mirror_machine(&Default::default(), &machine(true), false, Some(1), at(10));
        assert_eq!(s.ready_since, Some(at(10)));
        assert!(conditions::is_true(
            &s.conditions,
            types::INFRASTRUCTURE_READY
        ));
        assert_eq!(s.addresses.len(), 1);
        let s = mirror_machine(&s, &machine(true), false, Some(1), at(20));
        assert_eq!(s.ready_since, Some(at(10)));
        let s = mirror_machine(&s, &machine(false), false, Some(1), at(30));
        assert_eq!(s.ready_since, None);
        assert!(!conditions::is_true(&s.conditions, types::READY));
    }

    #[test]
    fn a_tpm_machine_is_not_infrastructure_ready_before_its_certificates() {
        let mut m = machine(true);
        let s = mirror_machine(&Default::default(), &m, true, Some(1), at(10));
        let infra = conditions::find(&s.conditions, types::INFRASTRUCTURE_READY).unwrap();
        assert_eq!(
            (infra.status.as_str(), infra.reason.as_str()),
            (status::FALSE, reasons::ENDORSEMENT_CERTIFICATES_PENDING)
        );
        assert_eq!(s.ready_since, None);
        m.tpm_endorsement_certificates = vec!["PEM".into()];
        m.tpm_endorsement_key_digests = vec!["sha256:00".into()];
        let s = mirror_machine(&s, &m, true, Some(1), at(20));
        assert!(conditions::is_true(
            &s.conditions,
            types::INFRASTRUCTURE_READY
        ));
        assert_eq!(s.tpm_endorsement_certificates, vec!["PEM".to_owned()]);
        assert_eq!(s.tpm_endorsement_key_digests, vec!["sha256:00".to_owned()]);
        assert_eq!(s.ready_since, Some(at(20)));
    }

    #[test]
    fn host_keys_login_attestation_and_access_ready_are_mirrored_bounded() {
        let mut m = machine(true);
        m.ssh_host_keys = vec!["ssh-ed25519 AAAA".into()];
        m.login_user = Some("alice".into());
        m.attestation = Some(banlieue_api::handover::Attestation {
            attestation_key: Some("AAEC".into()),
            answer: None,
        });
        m.conditions.push(conditions::new(
            types::ACCESS_READY,
            status::FALSE,
            reasons::ACCESS_REFUSED,
            "x".repeat(conditions::MAX_MESSAGE_BYTES * 2),
            Some(7),
        ));
        let s = mirror_machine(&Default::default(), &m, false, Some(1), at(10));
        assert_eq!(s.ssh_host_keys, m.ssh_host_keys);
        assert_eq!(s.login_user.as_deref(), Some("alice"));
        assert_eq!(s.attestation, m.attestation);
        let access = conditions::find(&s.conditions, types::ACCESS_READY).unwrap();
        assert_eq!(access.reason, reasons::ACCESS_REFUSED);
        assert_eq!(access.observed_generation, Some(1));
        assert!(access.message.len() <= conditions::MAX_MESSAGE_BYTES);
        // A machine given no keys reports no AccessReady, and the VirtualMachine none.
        let s = mirror_machine(&Default::default(), &machine(true), false, Some(1), at(10));
        assert!(conditions::find(&s.conditions, types::ACCESS_READY).is_none());
    }
}

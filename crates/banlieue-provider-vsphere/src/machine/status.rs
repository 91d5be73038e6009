//! What a reconcile saw of a VSphereMachine's VM, its guest's addresses, EK certificates and
//! GuestReady, and the status that follows. No I/O here.

use std::net::IpAddr;

use banlieue_api::common::address_type;
use banlieue_api::conditions::{self, Condition, reasons};
use banlieue_api::vsphere::{self, GUESTINFO_PHASE};
use banlieue_api::{MachineAddress, VSphereMachine, VSphereMachineStatus};
use banlieue_provider_kit::guest::{self, EkCertificate, Phase};
use banlieue_provider_kit::machine_status::{self, Failure, Live, Observation, Sight};
use banlieue_vsphere::GuestNic;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::access;
use super::power::{StandbySight, reports_standby};
use crate::error::Result;
use banlieue_provider_kit::access::AccessSight;

/// The most addresses published: a guest reports what it likes.
pub const MAX_ADDRESSES: usize = 32;

/// What a reconcile saw of the machine's VM.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Observed {
    pub vm_name: String,
    pub moref: String,
    pub instance_uuid: Option<String>,
    pub powered_on: bool,
    pub power_state: String,
    pub nics: Vec<GuestNic>,
    /// `guestinfo.banlieue.phase`, when set.
    pub phase: Option<String>,
    /// `guestinfo.banlieue.access`: the access request the VM holds, base64.
    pub access_written: Option<String>,
    /// `guestinfo.banlieue.access.state`: the guest's layer's answer to it.
    pub access_state: Option<String>,
    /// `guestinfo.banlieue.ssh.hostKeys`: the guest's SSH host keys, base64.
    pub host_keys: Option<String>,
    /// DER endorsement key certificates of the VM's vTPM.
    pub ek_certificates: Vec<Vec<u8>>,
    /// What became of its standby.
    pub standby: StandbySight,
}

impl Observed {
    /// Whether the skeleton may look again only at the resync: a running VM, or a suspended
    /// one, which waits for its spec to change (a watch event) and is never resumed on a
    /// timer. Only a VM on its way to running is looked at sooner.
    pub fn settled(&self) -> bool {
        self.powered_on || self.standby == StandbySight::Suspended
    }
}

/// The addresses a guest reports, without loopback, link-local or unparsable ones, each once,
/// at most [`MAX_ADDRESSES`].
pub fn addresses(nics: &[GuestNic]) -> Vec<MachineAddress> {
    let mut out: Vec<MachineAddress> = Vec::new();
    for text in nics.iter().flat_map(|n| n.ip_addresses.iter()) {
        let Ok(ip) = text.parse::<IpAddr>() else {
            continue;
        };
        let link_local = match ip {
            IpAddr::V4(v4) => v4.is_link_local(),
            IpAddr::V6(v6) => v6.is_unicast_link_local(),
        };
        if ip.is_loopback() || ip.is_unspecified() || link_local {
            continue;
        }
        let address = ip.to_string();
        if out.iter().all(|a| a.address != address) && out.len() < MAX_ADDRESSES {
            out.push(MachineAddress {
                type_: address_type::INTERNAL_IP.to_owned(),
                address,
            });
        }
    }
    out
}

/// PEM and `sha256:<hex>` of the public key of each DER certificate that parses as X.509.
pub fn endorsement_certificates(ders: &[Vec<u8>]) -> (Vec<String>, Vec<String>) {
    ders.iter()
        .filter_map(|der| EkCertificate::from_der(der).ok())
        .map(|ek| (ek.pem, ek.key_digest))
        .unzip()
}

/// GuestReady from the VM's power state and phase, in the kit's words.
pub fn guest_ready(
    observed: &Observed,
    tpm_enabled: bool,
    certificates: usize,
    generation: Option<i64>,
) -> Condition {
    if !observed.powered_on {
        return guest::guest_not_connected(
            format!("the VM is {}, not powered on", observed.power_state),
            generation,
        );
    }
    let Some(phase) = observed.phase.as_deref() else {
        return guest::guest_phase_absent(
            format!(
                "the VM runs but {GUESTINFO_PHASE} is not set: the image carries no \
                 guest-phase layer (guest/README.md), or it has not run yet"
            ),
            generation,
        );
    };
    guest::guest_ready(
        &Phase::parse(phase.as_bytes()),
        tpm_enabled,
        certificates,
        || {
            "the guest reports ready, but the VM's vTPM has no endorsement key certificate \
             (does the template carry a vTPM?)"
                .to_owned()
        },
        generation,
    )
}

/// The status after a reconcile: what was observed, or the error as the Ready condition with
/// everything recorded before kept.
pub fn status_after(
    machine: &VSphereMachine,
    outcome: &Result<Observed>,
    now: Time,
) -> VSphereMachineStatus {
    let mut new = machine.status.clone().unwrap_or_default();
    let standby = reports_standby(machine);
    let outcome = match outcome {
        Ok(o) => {
            new.vm_name = Some(o.vm_name.clone());
            new.vm_mo_ref = Some(o.moref.clone());
            if let Some(uuid) = &o.instance_uuid {
                new.instance_uuid = Some(uuid.clone());
            }
            Ok(Observation {
                provider_id: o.instance_uuid.as_deref().map(vsphere::provider_id),
                sight: if o.standby == StandbySight::Suspended {
                    suspended(o)
                } else {
                    Sight::Live(Box::new(running(machine, &new, o, standby)))
                },
            })
        }
        // A resume that failed leaves `status.standby` and `Saved` as they were: the VM is
        // still suspended, and `Running` would read as resumed.
        Err(e) => Err(Failure {
            reason: e.reason(),
            message: conditions::error_message(e),
        }),
    };
    machine_status::fill(
        &mut new.contract,
        outcome,
        standby,
        machine.metadata.generation,
        now,
    );
    new
}

/// A suspended VM, in vSphere's words.
fn suspended(o: &Observed) -> Sight {
    Sight::Saved {
        reason: reasons::VM_SUSPENDED,
        saved_message: format!(
            "VM {} ({}) is suspended and holds no host memory",
            o.vm_name, o.moref
        ),
        ready_message: format!(
            "VM {} ({}) is suspended and holds no host memory; it is powered on (resumed) \
             when its spec says Running",
            o.vm_name, o.moref
        ),
    }
}

/// A VM that is not suspended (powered on, or on its way), read afresh, given the status
/// recorded so far (`recorded`).
fn running(
    machine: &VSphereMachine,
    recorded: &VSphereMachineStatus,
    o: &Observed,
    standby: bool,
) -> Live {
    // A vTPM keeps its EK for the VM's life: certificates once recorded stay.
    let endorsement = recorded
        .contract
        .tpm_endorsement_certificates
        .is_empty()
        .then(|| endorsement_certificates(&o.ek_certificates));
    let certificates = endorsement.as_ref().map_or(
        recorded.contract.tpm_endorsement_certificates.len(),
        |(pems, _)| pems.len(),
    );
    let guest = guest_ready(
        o,
        machine.spec.tpm_enabled,
        certificates,
        machine.metadata.generation,
    );
    let not_saved = (standby && o.powered_on).then(|| {
        let message = match &o.standby {
            StandbySight::SuspendRefused(why) => why.clone(),
            _ => format!("VM {} ({}) is powered on", o.vm_name, o.moref),
        };
        (reasons::VM_NOT_SUSPENDED, message)
    });
    let ready_message = if o.powered_on {
        let resumed = if o.standby == StandbySight::Resumed {
            "; it resumed from suspended"
        } else {
            ""
        };
        format!("VM {} ({}) is powered on{resumed}", o.vm_name, o.moref)
    } else {
        format!(
            "VM {} ({}) is {}, not powered on yet",
            o.vm_name, o.moref, o.power_state
        )
    };
    let mut guest_conditions = vec![guest];
    let mut login_user = None;
    if let Some(sight) = access::sight(machine.spec.access.as_ref(), o) {
        guest_conditions.push(banlieue_provider_kit::access::condition(
            &sight,
            machine.metadata.generation,
        ));
        if let AccessSight::Installed { user } = sight {
            login_user = Some(user);
        }
    }
    // A guest's bad host keys are not published; its GuestReady and access stand.
    let ssh_host_keys = access::host_keys(o).unwrap_or_else(|why| {
        tracing::warn!(vm = %o.vm_name, %why, "the guest's SSH host keys are not recorded");
        None
    });
    Live {
        running: o.powered_on,
        addresses: addresses(&o.nics),
        guest_phase: o
            .phase
            .as_deref()
            .filter(|_| o.powered_on)
            .map(|p| Phase::parse(p.as_bytes()).as_status()),
        endorsement,
        ssh_host_keys,
        login_user,
        // No handover on vSphere (ADR-0077): its machines publish no EK certificate.
        attestation_key: None,
        handover_answer: None,
        guest_conditions,
        not_saved,
        running_reason: vsphere::reasons::POWERED_ON,
        ready_message,
    }
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::{machine, observed, refusal, with_standby};
    use super::super::power::resume_failed;
    use super::super::vm::vm_name_taken;
    use super::*;
    use banlieue_api::Standby;
    use banlieue_api::conditions::types;

    #[test]
    fn status_follows_the_vm_and_the_guest() {
        let m = machine();
        let s = status_after(&m, &Ok(observed()), Time(Default::default()));
        assert!(s.contract.ready && s.contract.initialization.provisioned);
        assert_eq!(
            s.contract.provider_id.as_deref(),
            Some("vsphere://5003-abcd")
        );
        let addrs: Vec<_> = s
            .contract
            .addresses
            .iter()
            .map(|a| a.address.as_str())
            .collect();
        assert_eq!(addrs, ["192.0.2.10", "2001:db8::10"]);
        let guest = conditions::find(&s.contract.conditions, types::GUEST_READY).unwrap();
        assert_eq!(
            (guest.status.as_str(), guest.reason.as_str()),
            ("Unknown", "GuestPhaseAbsent")
        );
        assert!(banlieue_provider_kit::guest::still_settling(guest));

        let pending = Observed {
            phase: Some("configuring".into()),
            ..observed()
        };
        let s = status_after(&m, &Ok(pending), Time(Default::default()));
        let guest = conditions::find(&s.contract.conditions, types::GUEST_READY).unwrap();
        assert_eq!(
            (guest.status.as_str(), guest.reason.as_str()),
            ("False", "GuestPhasePending")
        );
        assert_eq!(s.contract.guest_phase.as_deref(), Some("configuring"));

        let ready = Observed {
            phase: Some("ready".into()),
            ..observed()
        };
        let s = status_after(&m, &Ok(ready.clone()), Time(Default::default()));
        let guest = conditions::find(&s.contract.conditions, types::GUEST_READY).unwrap();
        assert_eq!(guest.status, "True");
        assert!(!banlieue_provider_kit::guest::still_settling(guest));

        let mut tpm = machine();
        tpm.spec.tpm_enabled = true;
        let s = status_after(&tpm, &Ok(ready), Time(Default::default()));
        let guest = conditions::find(&s.contract.conditions, types::GUEST_READY).unwrap();
        assert_eq!(guest.reason, "EndorsementCertificatesMissing");

        let off = Observed {
            powered_on: false,
            power_state: "poweredOff".into(),
            ..observed()
        };
        let s = status_after(&m, &Ok(off), Time(Default::default()));
        assert!(!s.contract.ready);
        let ready = conditions::find(&s.contract.conditions, types::READY).unwrap();
        assert_eq!(ready.reason, "Provisioning");
    }

    #[test]
    fn an_error_keeps_what_was_recorded() {
        let mut m = machine();
        m.status = Some(status_after(&m, &Ok(observed()), Time(Default::default())));
        let e = vm_name_taken("DC0/vm/team-a-web-01");
        let s = status_after(&m, &Err(e), Time(Default::default()));
        assert!(!s.contract.ready);
        assert_eq!(s.vm_mo_ref.as_deref(), Some("vm-42"));
        let ready = conditions::find(&s.contract.conditions, types::READY).unwrap();
        assert_eq!(ready.reason, "VMNameTaken");
    }

    #[test]
    fn a_suspended_vm_is_ready_saved_and_keeps_its_guest_as_recorded() {
        let mut m = with_standby(Some(Standby::Saved), None);
        let ready = Observed {
            phase: Some("ready".into()),
            ..observed()
        };
        m.status = Some(status_after(&m, &Ok(ready), Time(Default::default())));
        let before = m.status.clone().unwrap();
        assert_eq!(before.contract.standby, Some(Standby::Running));
        let saved = conditions::find(&before.contract.conditions, types::SAVED).unwrap();
        assert_eq!(
            (saved.status.as_str(), saved.reason.as_str()),
            ("False", "VMNotSuspended")
        );

        // Suspended: vcsim (and vCenter) may report anything of the guest; nothing is read.
        let asleep = Observed {
            powered_on: false,
            power_state: "suspended".into(),
            nics: vec![],
            phase: None,
            standby: StandbySight::Suspended,
            ..observed()
        };
        let s = status_after(&m, &Ok(asleep.clone()), Time(Default::default()));
        assert!(s.contract.ready);
        assert_eq!(s.contract.standby, Some(Standby::Saved));
        assert_eq!(s.contract.observed_generation, Some(2));
        assert_eq!(s.contract.addresses, before.contract.addresses);
        assert_eq!(s.contract.guest_phase.as_deref(), Some("ready"));
        let guest = conditions::find(&s.contract.conditions, types::GUEST_READY).unwrap();
        assert_eq!(guest.status, "True");
        let saved = conditions::find(&s.contract.conditions, types::SAVED).unwrap();
        assert_eq!(
            (saved.status.as_str(), saved.reason.as_str()),
            ("True", "VMSuspended")
        );
        let ready = conditions::find(&s.contract.conditions, types::READY).unwrap();
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("True", "VMSuspended")
        );
        assert!(asleep.settled());

        // Resumed: running, read afresh.
        m.spec.standby = Some(Standby::Running);
        m.metadata.generation = Some(3);
        m.status = Some(s);
        let awake = Observed {
            nics: vec![GuestNic {
                mac_address: None,
                network: None,
                connected: true,
                ip_addresses: vec!["192.0.2.99".into()],
            }],
            phase: Some("ready".into()),
            standby: StandbySight::Resumed,
            ..observed()
        };
        let s = status_after(&m, &Ok(awake), Time(Default::default()));
        assert_eq!(s.contract.standby, Some(Standby::Running));
        assert_eq!(s.contract.observed_generation, Some(3));
        assert_eq!(s.contract.addresses[0].address, "192.0.2.99");
        let saved = conditions::find(&s.contract.conditions, types::SAVED).unwrap();
        assert_eq!(
            (saved.status.as_str(), saved.reason.as_str()),
            ("False", "VMNotSuspended")
        );
        let ready = conditions::find(&s.contract.conditions, types::READY).unwrap();
        assert!(ready.message.contains("resumed"), "{}", ready.message);

        // A refused resume leaves it reported saved: Running would read as resumed.
        m.status = Some(status_after(&m, &Ok(asleep), Time(Default::default())));
        let failed = resume_failed("DC0/vm/x", refusal("GenericVmConfigFault"));
        let s = status_after(&m, &Err(failed), Time(Default::default()));
        assert!(!s.contract.ready);
        assert_eq!(s.contract.standby, Some(Standby::Saved));
        let ready = conditions::find(&s.contract.conditions, types::READY).unwrap();
        assert_eq!(ready.reason, "RestoreFailed");
    }

    #[test]
    fn a_refused_suspend_keeps_the_vm_running_and_says_why() {
        let m = with_standby(Some(Standby::Saved), Some(Standby::Running));
        let refused = Observed {
            standby: StandbySight::SuspendRefused(
                "suspending VM x failed, so it keeps running".into(),
            ),
            ..observed()
        };
        let s = status_after(&m, &Ok(refused), Time(Default::default()));
        assert!(s.contract.ready);
        assert_eq!(s.contract.standby, Some(Standby::Running));
        let saved = conditions::find(&s.contract.conditions, types::SAVED).unwrap();
        assert!(saved.message.contains("keeps running"), "{}", saved.message);
    }

    #[test]
    fn a_machine_that_never_used_standby_reports_none() {
        let m = machine();
        let s = status_after(&m, &Ok(observed()), Time(Default::default()));
        assert_eq!(s.contract.standby, None);
        assert!(conditions::find(&s.contract.conditions, types::SAVED).is_none());
    }

    #[test]
    fn endorsement_certificates_that_do_not_parse_are_left_out() {
        let (pems, digests) = endorsement_certificates(&[b"not DER".to_vec()]);
        assert!(pems.is_empty() && digests.is_empty());
    }
}

//! The pure half of realising a VSphereMachine: its VM's name, the extraConfig its clone
//! carries, the ownership guard, the guest's phase and the status it reports. No I/O here.

use std::collections::BTreeMap;
use std::net::IpAddr;

use banlieue_api::common::address_type;
use banlieue_api::conditions::{self, Condition, reasons, status, types};
use banlieue_api::vsphere::{self, EXTRA_CONFIG_MACHINE_UID, GUESTINFO_PHASE};
use banlieue_api::{MachineAddress, VSphereMachine, VSphereMachineStatus, names, quantity};
use banlieue_provider_kit::guest::{self, EkCertificate, Phase};
use banlieue_vsphere::GuestNic;
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::error::{Error, Result};

/// vCenter's limit on a VM's name.
pub const MAX_VM_NAME_LEN: usize = 80;

/// The most addresses published: a guest reports what it likes.
pub const MAX_ADDRESSES: usize = 32;

/// The VM of a machine: `<namespace>-<name>`, like a libvirt domain, so two namespaces' machines
/// of one name never meet in one folder.
pub fn vm_name(machine: &VSphereMachine) -> Result<String> {
    let ns = machine.metadata.namespace.as_deref().unwrap_or("default");
    let name = machine.metadata.name.as_deref().unwrap_or_default();
    let vm = names::domain_name(ns, name);
    if vm.chars().count() > MAX_VM_NAME_LEN {
        return Err(Error::Invalid {
            reason: reasons::PROVISIONING,
            message: format!(
                "the VM name {vm} is longer than vCenter's {MAX_VM_NAME_LEN} characters: \
                 shorten the namespace or the machine's name"
            ),
        });
    }
    Ok(vm)
}

/// The inventory path of the machine's VM: `<datacenter>/vm[/<folder>]/<vm>`.
pub fn vm_path(machine: &VSphereMachine, vm: &str) -> String {
    format!("{}/{}", folder_path(machine), vm)
}

/// The inventory path of the machine's folder: the datacenter's VM folder, or `spec.folder`
/// under it.
pub fn folder_path(machine: &VSphereMachine) -> String {
    let dc = &machine.spec.datacenter;
    match machine
        .spec
        .folder
        .as_deref()
        .map(|f| f.trim_matches('/'))
        .filter(|f| !f.is_empty())
    {
        Some(folder) => format!("{dc}/vm/{folder}"),
        None => format!("{dc}/vm"),
    }
}

/// The extraConfig a clone carries: cloud-init's VMware datasource reads `guestinfo.metadata`
/// and `guestinfo.userdata` (base64, so any bytes survive), and `banlieue.machineUid`
/// records whose VM it is. There is never a CD-ROM: guestinfo is vSphere's hypervisor channel.
///
/// The instance-id is the machine's uid, so a VM cloned again for a new machine is a new
/// instance to cloud-init, never a reboot of an old one.
pub fn clone_extra_config(
    machine_uid: &str,
    vm: &str,
    user_data: Option<&[u8]>,
) -> Vec<(String, String)> {
    let metadata = format!("instance-id: {machine_uid}\nlocal-hostname: {vm}\n");
    let mut entries = vec![
        ("guestinfo.metadata".to_owned(), BASE64.encode(metadata)),
        (
            "guestinfo.metadata.encoding".to_owned(),
            "base64".to_owned(),
        ),
    ];
    if let Some(user_data) = user_data {
        entries.push(("guestinfo.userdata".to_owned(), BASE64.encode(user_data)));
        entries.push((
            "guestinfo.userdata.encoding".to_owned(),
            "base64".to_owned(),
        ));
    }
    entries.push((EXTRA_CONFIG_MACHINE_UID.to_owned(), machine_uid.to_owned()));
    entries
}

/// Memory in MiB as vSphere wants it: whole MiB, rounded up to a multiple of 4.
pub fn memory_mib(machine: &VSphereMachine) -> Result<i64> {
    let invalid = || Error::Invalid {
        reason: reasons::PROVISIONING,
        message: format!(
            "spec.memory {:?} is not a whole number of bytes of at least 4Mi",
            machine.spec.memory.0
        ),
    };
    let bytes = quantity::to_bytes(&machine.spec.memory.0).ok_or_else(invalid)?;
    let mib = bytes.div_ceil(1 << 20).next_multiple_of(4);
    if bytes < 4 << 20 {
        return Err(invalid());
    }
    i64::try_from(mib).map_err(|_| invalid())
}

/// What a VM of the machine's name is to the machine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ownership {
    /// Cloned for this machine (its `banlieue.machineUid` is the machine's uid).
    Ours,
    /// Someone else's: neither adopted nor destroyed.
    Foreign,
}

/// Classifies a VM by its extraConfig.
pub fn ownership(extra_config: &BTreeMap<String, String>, machine_uid: &str) -> Ownership {
    match extra_config.get(EXTRA_CONFIG_MACHINE_UID) {
        Some(uid) if uid == machine_uid => Ownership::Ours,
        _ => Ownership::Foreign,
    }
}

/// The error for a foreign VM under the machine's name.
pub fn vm_name_taken(path: &str) -> Error {
    Error::Invalid {
        reason: vsphere::reasons::VM_NAME_TAKEN,
        message: format!(
            "a VM {path} exists but was not cloned for this VSphereMachine (its \
             extraConfig {EXTRA_CONFIG_MACHINE_UID} differs); it is neither adopted nor \
             destroyed (rename or remove it)"
        ),
    }
}

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
    /// DER endorsement key certificates of the VM's vTPM.
    pub ek_certificates: Vec<Vec<u8>>,
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
    let old = machine.status.clone().unwrap_or_default();
    let generation = machine.metadata.generation;
    let mut new = old.clone();
    new.contract.observed_generation = generation;
    let ready = match outcome {
        Ok(o) => {
            new.vm_name = Some(o.vm_name.clone());
            new.vm_mo_ref = Some(o.moref.clone());
            if let Some(uuid) = &o.instance_uuid {
                new.instance_uuid = Some(uuid.clone());
                new.contract.provider_id = Some(vsphere::provider_id(uuid));
            }
            new.contract.initialization.provisioned = true;
            new.contract.ready = o.powered_on;
            new.contract.addresses = addresses(&o.nics);
            new.contract.guest_phase = o
                .phase
                .as_deref()
                .filter(|_| o.powered_on)
                .map(|p| Phase::parse(p.as_bytes()).as_status());
            // A vTPM keeps its EK for the VM's life: certificates once recorded stay.
            if new.contract.tpm_endorsement_certificates.is_empty() {
                let (pems, digests) = endorsement_certificates(&o.ek_certificates);
                new.contract.tpm_endorsement_certificates = pems;
                new.contract.tpm_endorsement_key_digests = digests;
            }
            let guest = guest_ready(
                o,
                machine.spec.tpm_enabled,
                new.contract.tpm_endorsement_certificates.len(),
                generation,
            );
            conditions::set(&mut new.contract.conditions, guest, now.clone());
            if o.powered_on {
                conditions::new(
                    types::READY,
                    status::TRUE,
                    vsphere::reasons::POWERED_ON,
                    format!("VM {} ({}) is powered on", o.vm_name, o.moref),
                    generation,
                )
            } else {
                conditions::new(
                    types::READY,
                    status::FALSE,
                    reasons::PROVISIONING,
                    format!(
                        "VM {} ({}) is {}, not powered on yet",
                        o.vm_name, o.moref, o.power_state
                    ),
                    generation,
                )
            }
        }
        Err(e) => {
            new.contract.ready = false;
            conditions::new(
                types::READY,
                status::FALSE,
                e.reason(),
                conditions::error_message(e),
                generation,
            )
        }
    };
    conditions::set(&mut new.contract.conditions, ready, now);
    new
}

#[cfg(test)]
mod tests {
    use super::*;
    use banlieue_api::{LocalObjectReference, VSphereMachineSpec};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    fn machine() -> VSphereMachine {
        let mut m = VSphereMachine::new(
            "web-01",
            VSphereMachineSpec {
                provider_ref: LocalObjectReference::new("vc"),
                datacenter: "DC0".into(),
                cluster: "DC0_C1".into(),
                template: "DC0/vm/DC0_C0_RP0_VM0".into(),
                folder: None,
                datastore: None,
                cpu: 2,
                memory: Quantity("1Gi".into()),
                user_data: None,
                user_data_secret_ref: None,
                tpm_enabled: false,
            },
        );
        m.metadata.namespace = Some("team-a".into());
        m.metadata.generation = Some(2);
        m
    }

    fn observed() -> Observed {
        Observed {
            vm_name: "team-a-web-01".into(),
            moref: "vm-42".into(),
            instance_uuid: Some("5003-abcd".into()),
            powered_on: true,
            power_state: "poweredOn".into(),
            nics: vec![GuestNic {
                mac_address: None,
                network: None,
                connected: true,
                ip_addresses: vec![
                    "192.0.2.10".into(),
                    "fe80::1".into(),
                    "127.0.0.1".into(),
                    "not an address".into(),
                    "2001:db8::10".into(),
                    "192.0.2.10".into(),
                ],
            }],
            phase: None,
            ek_certificates: vec![],
        }
    }

    #[test]
    fn names_and_paths() {
        let mut m = machine();
        assert_eq!(vm_name(&m).unwrap(), "team-a-web-01");
        assert_eq!(vm_path(&m, "team-a-web-01"), "DC0/vm/team-a-web-01");
        m.spec.folder = Some("/banlieue/sandboxes/".into());
        assert_eq!(folder_path(&m), "DC0/vm/banlieue/sandboxes");
        m.metadata.name = Some("x".repeat(90));
        assert!(vm_name(&m).unwrap_err().to_string().contains("80"));
    }

    #[test]
    fn the_clone_carries_metadata_user_data_and_its_owner() {
        let entries = clone_extra_config("uid-1", "team-a-web-01", Some(b"#cloud-config\n"));
        let map: BTreeMap<_, _> = entries.into_iter().collect();
        let meta = BASE64.decode(&map["guestinfo.metadata"]).unwrap();
        assert_eq!(
            String::from_utf8(meta).unwrap(),
            "instance-id: uid-1\nlocal-hostname: team-a-web-01\n"
        );
        assert_eq!(map["guestinfo.userdata"], BASE64.encode("#cloud-config\n"));
        assert_eq!(map["guestinfo.userdata.encoding"], "base64");
        assert_eq!(ownership(&map, "uid-1"), Ownership::Ours);
        assert_eq!(ownership(&map, "uid-2"), Ownership::Foreign);
        assert_eq!(ownership(&BTreeMap::new(), "uid-1"), Ownership::Foreign);
        let without = clone_extra_config("uid-1", "vm", None);
        assert!(
            without
                .iter()
                .all(|(k, _)| !k.starts_with("guestinfo.userdata"))
        );
    }

    #[test]
    fn memory_is_whole_mib_in_fours() {
        let mut m = machine();
        assert_eq!(memory_mib(&m).unwrap(), 1024);
        m.spec.memory = Quantity("1000Mi".into());
        assert_eq!(memory_mib(&m).unwrap(), 1000);
        m.spec.memory = Quantity("1001Mi".into());
        assert_eq!(memory_mib(&m).unwrap(), 1004);
        m.spec.memory = Quantity("1Ki".into());
        assert!(memory_mib(&m).is_err());
        m.spec.memory = Quantity("lots".into());
        assert!(memory_mib(&m).is_err());
    }

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
    fn endorsement_certificates_that_do_not_parse_are_left_out() {
        let (pems, digests) = endorsement_certificates(&[b"not DER".to_vec()]);
        assert!(pems.is_empty() && digests.is_empty());
    }
}

//! The pure half of realising a VSphereMachine: its VM's name, the extraConfig its clone
//! carries, the ownership guard, what its standby asks of the VM's power (ADR-0073), the
//! guest's phase and the status it reports. No I/O here.

use std::collections::BTreeMap;
use std::net::IpAddr;

use banlieue_api::common::address_type;
use banlieue_api::conditions::{self, Condition, reasons};
use banlieue_api::vsphere::{self, EXTRA_CONFIG_MACHINE_UID, GUESTINFO_PHASE};
use banlieue_api::{
    MachineAddress, Standby, VSphereMachine, VSphereMachineStatus, names, quantity,
};
use banlieue_provider_kit::error::Core;
use banlieue_provider_kit::guest::{self, EkCertificate, Phase};
use banlieue_provider_kit::machine_status::{self, Failure, Live, Observation, Sight};
use banlieue_vsphere::{GuestNic, PowerState};
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
        return Err(Error::Core(Core::Invalid {
            reason: reasons::PROVISIONING,
            message: format!(
                "the VM name {vm} is longer than vCenter's {MAX_VM_NAME_LEN} characters: \
                 shorten the namespace or the machine's name"
            ),
        }));
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
    let invalid = || {
        Error::Core(Core::Invalid {
            reason: reasons::PROVISIONING,
            message: format!(
                "spec.memory {:?} is not a whole number of bytes of at least 4Mi",
                machine.spec.memory.0
            ),
        })
    };
    let bytes = quantity::to_bytes(&machine.spec.memory.0).ok_or_else(invalid)?;
    let mib = bytes.div_ceil(1 << 20).next_multiple_of(4);
    if bytes < 4 << 20 {
        return Err(invalid());
    }
    i64::try_from(mib).map_err(|_| invalid())
}

/// Whether a powered-off VM must be set to EFI firmware with Secure Boot on: the machine asks
/// for Secure Boot and the VM lacks either. A clone keeps its template's firmware, so Secure
/// Boot brings EFI with it (the class asked for both); a machine that does not ask leaves the
/// template's settings alone.
pub fn needs_secure_boot(
    machine: &VSphereMachine,
    firmware: Option<&str>,
    efi_secure_boot: Option<bool>,
) -> bool {
    machine.spec.secure_boot && (firmware != Some("efi") || efi_secure_boot != Some(true))
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
    Error::Core(Core::Invalid {
        reason: vsphere::reasons::VM_NAME_TAKEN,
        message: format!(
            "a VM {path} exists but was not cloned for this VSphereMachine (its \
             extraConfig {EXTRA_CONFIG_MACHINE_UID} differs); it is neither adopted nor \
             destroyed (rename or remove it)"
        ),
    })
}

/// What `spec.standby` asks of the VM; unset is `Running`.
pub fn wanted(machine: &VSphereMachine) -> Standby {
    machine.spec.standby.unwrap_or_default()
}

/// Whether the status reports standby at all: only for a machine whose spec asks for one, or
/// whose status already says it. A machine of a pool that never uses standby sees no status
/// change (one more write per machine would cost every pool).
fn reports_standby(machine: &VSphereMachine) -> bool {
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
                    Sight::Live(running(machine, &new, o, standby))
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
    Live {
        running: o.powered_on,
        addresses: addresses(&o.nics),
        guest_phase: o
            .phase
            .as_deref()
            .filter(|_| o.powered_on)
            .map(|p| Phase::parse(p.as_bytes()).as_status()),
        endorsement,
        guest_conditions: vec![guest],
        not_saved,
        running_reason: vsphere::reasons::POWERED_ON,
        ready_message,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use banlieue_api::conditions::types;
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
                secure_boot: false,
                standby: None,
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
            standby: StandbySight::Running,
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

    /// A machine whose spec asks for `standby`, and whose status last reported `reported`.
    fn with_standby(standby: Option<Standby>, reported: Option<Standby>) -> VSphereMachine {
        let mut m = machine();
        m.spec.standby = standby;
        let mut status = status_after(&m, &Ok(observed()), Time(Default::default()));
        status.contract.standby = reported;
        m.status = Some(status);
        m
    }

    fn refusal(kind: &str) -> Error {
        Error::VSphere {
            what: "power on VM DC0/vm/team-a-web-01".into(),
            source: banlieue_vsphere::Error::Task {
                task: banlieue_vsphere::ManagedObjectRef::new("Task", "task-7"),
                fault: banlieue_vsphere::Fault {
                    kind: kind.into(),
                    message: "the host said no".into(),
                },
            },
        }
    }

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

    #[test]
    fn secure_boot_brings_efi_and_is_set_only_when_missing() {
        let plain = machine();
        assert!(!needs_secure_boot(&plain, Some("bios"), None));
        assert!(!needs_secure_boot(&plain, Some("efi"), Some(false)));
        let mut secure = machine();
        secure.spec.secure_boot = true;
        assert!(needs_secure_boot(&secure, Some("bios"), None));
        assert!(needs_secure_boot(&secure, Some("efi"), Some(false)));
        assert!(needs_secure_boot(&secure, None, Some(true)));
        assert!(!needs_secure_boot(&secure, Some("efi"), Some(true)));
    }
}

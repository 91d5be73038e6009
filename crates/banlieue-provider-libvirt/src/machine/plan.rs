//! The pure half of realising a LibvirtMachine: its names, its domain definition, its seed,
//! the upsert guard, and the status it reports. No I/O here; `realise` and `teardown` act.

use crate::names;
use banlieue_api::common::address_type;
use banlieue_api::conditions::{self, Condition, reasons, status, types};
use banlieue_api::{Firmware, LibvirtMachine, LibvirtMachineStatus, MachineAddress, Standby};
use banlieue_iso::NoCloudSeed;
use banlieue_libvirt::InterfaceAddresses;
use banlieue_provider_kit::error::Core;
use banlieue_provider_kit::machine_status::{self, Failure, Live, Observation, Sight};

use crate::domain_xml::{BootFirmware, DomainDefinition, DomainType, VolumeRef};
use crate::error::{Error, Result};
use crate::quantity;

/// The libvirt names of one machine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MachineNames {
    pub domain: String,
    pub os_volume: String,
    pub cidata_volume: String,
}

impl MachineNames {
    pub fn of(machine: &LibvirtMachine) -> MachineNames {
        let ns = machine.metadata.namespace.as_deref().unwrap_or("default");
        let name = machine.metadata.name.as_deref().unwrap_or_default();
        let domain = names::domain_name(ns, name);
        MachineNames {
            os_volume: names::os_volume_name(&domain),
            cidata_volume: names::cidata_volume_name(&domain),
            domain,
        }
    }
}

/// The guard in front of DOMAIN_DEFINE_XML, which is an upsert: what to do with the domain of
/// the machine's name found on the host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Existing {
    /// No domain of that name: provision it.
    Absent,
    /// The domain this machine defined (its UUID is the one recorded in status).
    Ours,
    /// Someone else's domain: never redefined, never deleted.
    Foreign { uuid: String },
}

/// Classifies the domain found under the machine's name against the UUID recorded in status.
pub fn classify(found_uuid: Option<&str>, recorded_uuid: Option<&str>) -> Existing {
    match (found_uuid, recorded_uuid) {
        (None, _) => Existing::Absent,
        (Some(found), Some(recorded)) if found.eq_ignore_ascii_case(recorded) => Existing::Ours,
        (Some(found), _) => Existing::Foreign {
            uuid: found.to_owned(),
        },
    }
}

/// The condition for a foreign domain holding the machine's name.
pub fn name_taken(domain: &str, uuid: &str) -> Error {
    Error::Core(Core::Invalid {
        reason: reasons::DOMAIN_NAME_TAKEN,
        message: format!(
            "domain {domain} already exists on the host with UUID {uuid}, which this \
             LibvirtMachine did not create; it is left untouched (rename or remove it)"
        ),
    })
}

/// The message of the guide's troubleshooting table for an absent pool.
pub fn pool_missing(pool: &str) -> Error {
    Error::Core(Core::Invalid {
        reason: reasons::STORAGE_POOL_NOT_FOUND,
        message: format!("storage pool {pool} does not exist"),
    })
}

/// The message of the guide's troubleshooting table for an absent image volume.
pub fn volume_missing(volume: &str, pool: &str) -> Error {
    Error::Core(Core::Invalid {
        reason: reasons::VOLUME_NOT_IN_POOL,
        message: format!("volume {volume} is not in pool {pool}"),
    })
}

/// A volume of the machine's name that this machine did not record as its own.
pub fn volume_not_owned(volume: &str, pool: &str) -> Error {
    Error::Core(Core::Invalid {
        reason: crate::error::provider_reasons::VOLUME_NOT_OWNED,
        message: format!(
            "volume {volume} already exists in pool {pool}, but this LibvirtMachine did not \
             create it (it is not in status.volumes); it is neither reused nor deleted \
             (rename or remove it)"
        ),
    })
}

/// The volumes teardown may delete: those recorded in status, and, when the domain found is
/// this machine's own, the volumes it was defined with (machines provisioned before volumes
/// were recorded).
pub fn owned_volumes(
    machine: &LibvirtMachine,
    names: &MachineNames,
    domain_is_ours: bool,
) -> Vec<String> {
    let mut owned: Vec<String> = machine
        .status
        .as_ref()
        .map(|s| s.volumes.clone())
        .unwrap_or_default()
        .into_iter()
        // Only names this machine could have made: status is the provider's to write, but
        // a deletion never reaches beyond the machine's own names.
        .filter(|v| *v == names.os_volume || *v == names.cidata_volume)
        .collect();
    if domain_is_ours {
        for v in [&names.os_volume, &names.cidata_volume] {
            if !owned.contains(v) {
                owned.push(v.clone());
            }
        }
    }
    owned
}

/// The message for an absent network.
pub fn network_missing(network: &str) -> Error {
    Error::Core(Core::Invalid {
        reason: reasons::NETWORK_NOT_FOUND,
        message: format!("network {network} does not exist"),
    })
}

/// Refuses a machine whose `spec.pool` or `spec.network` is not a target its Provider
/// declared. Whoever may write a machine names them, and the host has more than the Provider
/// offers (another tenant's isolated network, the host's NAT, a bridge onto the management
/// LAN; ADR-0039): existing on the host is not enough. The field is named in the message.
pub fn undeclared_target(
    spec: &banlieue_api::LibvirtMachineSpec,
    provider: &str,
    capabilities: &banlieue_api::ProviderCapabilities,
) -> Option<Error> {
    let refused = |field: &str, value: &str, what: &str, list: &str, declared: Vec<&str>| {
        Error::Core(Core::Invalid {
            reason: crate::error::provider_reasons::TARGET_NOT_DECLARED,
            message: format!(
                "{field} {value} is not a {what} Provider {provider} declared \
                 (spec.capabilities.{list}: {})",
                if declared.is_empty() {
                    "none".to_owned()
                } else {
                    declared.join(", ")
                }
            ),
        })
    };
    let pools: Vec<&str> = capabilities
        .storage_classes
        .iter()
        .map(|c| c.target.pool.as_str())
        .collect();
    if !pools.contains(&spec.pool.as_str()) {
        return Some(refused(
            "spec.pool",
            &spec.pool,
            "storage pool",
            "storageClasses",
            pools,
        ));
    }
    let networks: Vec<&str> = capabilities
        .network_classes
        .iter()
        .map(|c| c.target.network.as_str())
        .collect();
    if !networks.contains(&spec.network.as_str()) {
        return Some(refused(
            "spec.network",
            &spec.network,
            "network",
            "networkClasses",
            networks,
        ));
    }
    None
}

/// Size of the OS disk in bytes.
pub fn disk_bytes(machine: &LibvirtMachine) -> Result<u64> {
    let q = &machine.spec.disk.size.0;
    quantity::to_bytes(q).filter(|b| *b > 0).ok_or_else(|| {
        Error::Core(Core::Invalid {
            reason: reasons::PROVISIONING,
            message: format!("disk size {q:?} is not a whole number of bytes"),
        })
    })
}

/// The domain definition of `machine` with the UUID chosen for it.
pub fn definition(
    machine: &LibvirtMachine,
    uuid: &str,
    domain_type: DomainType,
) -> Result<DomainDefinition> {
    let names = MachineNames::of(machine);
    let spec = &machine.spec;
    let memory = quantity::to_bytes(&spec.memory.0)
        .filter(|b| *b >= 1 << 20)
        .ok_or_else(|| {
            Error::Core(Core::Invalid {
                reason: reasons::PROVISIONING,
                message: format!(
                    "memory {:?} is not a whole number of bytes of at least 1Mi",
                    spec.memory.0
                ),
            })
        })?;
    let volume = |v: &str| VolumeRef {
        pool: spec.pool.clone(),
        volume: v.to_owned(),
    };
    Ok(DomainDefinition {
        name: names.domain.clone(),
        uuid: uuid.to_owned(),
        domain_type,
        vcpu: spec.cpu,
        memory_kib: memory / 1024,
        firmware: boot_firmware(spec.firmware, spec.secure_boot)?,
        tpm: spec.tpm_enabled,
        os_disk: volume(&names.os_volume),
        install_media: spec.disk.install_media.as_deref().map(volume),
        cidata: volume(&names.cidata_volume),
        network: spec.network.clone(),
    })
}

/// The firmware to boot. Secure Boot without EFI is refused rather than dropped: the CRD
/// rejects it, so only a machine written around the schema gets here, and it must not boot
/// without the Secure Boot it asked for.
fn boot_firmware(firmware: Firmware, secure_boot: bool) -> Result<BootFirmware> {
    match (firmware, secure_boot) {
        (Firmware::Bios, false) => Ok(BootFirmware::Bios),
        (Firmware::Efi, false) => Ok(BootFirmware::Efi),
        (Firmware::Efi, true) => Ok(BootFirmware::EfiSecureBoot),
        (Firmware::Bios, true) => Err(Error::Core(Core::Invalid {
            reason: reasons::PROVISIONING,
            message: "secureBoot needs firmware: efi".into(),
        })),
    }
}

/// The NoCloud seed: instance-id is the domain's UUID, so a rebuilt VM is a new instance;
/// present even without user-data, since cloud-init ignores a seed without meta-data.
pub fn seed(domain: &str, uuid: &str, user_data: Option<&[u8]>) -> NoCloudSeed {
    let seed = NoCloudSeed::new(uuid, domain);
    match user_data {
        Some(data) => seed.with_user_data(data.to_vec()),
        None => seed,
    }
}

/// `libvirt://<provider namespace>/<provider>/<domain uuid>`.
pub fn provider_id(namespace: &str, provider: &str, uuid: &str) -> String {
    format!("libvirt://{namespace}/{provider}/{uuid}")
}

/// Addresses of the guest's interfaces, loopback and link-local left out.
pub fn addresses(interfaces: &[InterfaceAddresses]) -> Vec<MachineAddress> {
    let mut out: Vec<MachineAddress> = Vec::new();
    for iface in interfaces.iter().filter(|i| i.name != "lo") {
        for a in &iface.addrs {
            let ip: Option<std::net::IpAddr> = a.addr.parse().ok();
            let keep = match ip {
                Some(std::net::IpAddr::V4(v4)) => !v4.is_loopback() && !v4.is_link_local(),
                Some(std::net::IpAddr::V6(v6)) => {
                    !v6.is_loopback() && (v6.segments()[0] & 0xffc0) != 0xfe80
                }
                None => false,
            };
            let address = MachineAddress {
                type_: address_type::INTERNAL_IP.to_owned(),
                address: a.addr.clone(),
            };
            if keep && !out.contains(&address) {
                out.push(address);
            }
        }
    }
    out
}

/// What the host said about the machine's domain, as far as status is concerned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Observed {
    pub running: bool,
    pub addresses: Vec<MachineAddress>,
    /// The addresses are what the guest's agent reports, not the host's DHCP leases: the
    /// guest chose them, and the Ready message says so.
    pub addresses_from_guest: bool,
    /// What the guest says about itself through its agent.
    pub guest: super::guest::GuestSight,
    /// What became of the domain's standby (ADR-0073).
    pub standby: StandbySight,
}

impl Observed {
    /// Whether the skeleton may look again only at the resync: a running domain, or a saved
    /// one, which waits for its spec to change (a watch event) and is never started on a
    /// timer. Only a domain on its way to running is looked at sooner.
    pub fn settled(&self) -> bool {
        self.running || self.standby == StandbySight::Saved
    }
}

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
fn reports_standby(machine: &LibvirtMachine, old: &LibvirtMachineStatus) -> bool {
    banlieue_provider_kit::standby::reports_standby(machine.spec.standby, Some(&old.contract))
}

/// The status after a reconcile: `outcome` is what the host showed, or the error that stopped
/// the reconcile. Conditions keep their transition time unless their status changes.
pub fn status_after(
    machine: &LibvirtMachine,
    provider_namespace: &str,
    provider: &str,
    outcome: &Result<Observed>,
    now: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time,
) -> LibvirtMachineStatus {
    let old = machine.status.clone().unwrap_or_default();
    let names = MachineNames::of(machine);
    let generation = machine.metadata.generation;
    let mut new = LibvirtMachineStatus {
        domain_name: Some(names.domain.clone()),
        ..old.clone()
    };
    let standby = reports_standby(machine, &old);
    let outcome = match outcome {
        Ok(observed) => Ok(Observation {
            provider_id: old
                .domain_uuid
                .as_deref()
                .map(|uuid| provider_id(provider_namespace, provider, uuid)),
            sight: sight(machine, &old, &names.domain, observed, standby),
        }),
        Err(e) => {
            if standby && e.reason() == reasons::RESTORE_FAILED {
                // Neither saved (the image is gone) nor running. `status.standby` stays as it
                // was: `Running` would read as resumed, and a merge patch cannot unset it.
                conditions::set(
                    &mut new.contract.conditions,
                    conditions::new(
                        types::SAVED,
                        status::FALSE,
                        reasons::DOMAIN_NOT_SAVED,
                        format!(
                            "domain {} could not be restored and its save image was removed",
                            names.domain
                        ),
                        generation,
                    ),
                    now.clone(),
                );
            }
            Err(Failure {
                reason: e.reason(),
                message: conditions::error_message(e),
            })
        }
    };
    machine_status::fill(&mut new.contract, outcome, standby, generation, now);
    new
}

/// What the host showed of the domain, in the contract's terms and libvirt's words.
fn sight(
    machine: &LibvirtMachine,
    old: &LibvirtMachineStatus,
    domain: &str,
    observed: &Observed,
    standby: bool,
) -> Sight {
    let generation = machine.metadata.generation;
    if observed.standby == StandbySight::Saved {
        return Sight::Saved {
            reason: reasons::DOMAIN_SAVED,
            saved_message: format!(
                "domain {domain} is saved (managed save) and holds no host memory"
            ),
            ready_message: format!(
                "domain {domain} is saved (managed save) and holds no host memory; it is \
                 restored when its spec says Running"
            ),
        };
    }
    let guest =
        super::guest::guest_status(&observed.guest, machine.spec.tpm_enabled, old, generation);
    let not_saved = standby.then(|| {
        (
            reasons::DOMAIN_NOT_SAVED,
            not_saved(old, domain, &observed.standby),
        )
    });
    let ready_message = if observed.running {
        let mut message = if observed.addresses_from_guest {
            format!(
                "domain {domain} is running; its addresses are as its guest agent reports \
                 them (the host holds no DHCP lease for it)"
            )
        } else {
            format!("domain {domain} is running")
        };
        if let Some(restore) = restored(&observed.standby) {
            message.push_str("; ");
            message.push_str(&restore);
        }
        message
    } else {
        format!("domain {domain} is defined but not running yet")
    };
    Sight::Live(Live {
        running: observed.running,
        addresses: observed.addresses.clone(),
        guest_phase: guest.guest_phase,
        endorsement: Some((guest.certificates, guest.key_digests)),
        guest_conditions: vec![guest.guest_ready, guest.agent_connected],
        not_saved,
        running_reason: reasons::DOMAIN_RUNNING,
        ready_message,
    })
}

/// What a restore in this reconcile did, for the Ready message.
fn restored(sight: &StandbySight) -> Option<String> {
    match sight {
        StandbySight::Restored { clock: Ok(()) } => Some(
            "restored from its managed save image, its guest's clock set to the host's time"
                .to_owned(),
        ),
        StandbySight::Restored { clock: Err(why) } => Some(format!(
            "restored from its managed save image, but its guest's clock was not set ({why}): \
             it is behind by the time it was saved"
        )),
        _ => None,
    }
}

/// The message of `Saved=False` while the domain runs: a restore or a fresh start of a domain
/// asked to be saved says so, and the message stays until the next one (later reconciles of a
/// running domain keep it).
fn not_saved(old: &LibvirtMachineStatus, domain: &str, sight: &StandbySight) -> String {
    match sight {
        StandbySight::Restored { .. } => restored(sight)
            .map(|r| format!("domain {domain} runs: {r}"))
            .unwrap_or_default(),
        StandbySight::StartedAfresh => format!(
            "domain {domain} had no managed save image (its host restarted, or it was \
             stopped) and was started afresh; it is saved again once its guest is ready"
        ),
        StandbySight::Running | StandbySight::Saved => {
            match conditions::find(&old.contract.conditions, types::SAVED) {
                // What the last restore or fresh start said stays while the domain runs.
                Some(c) if c.status == status::FALSE && c.reason == reasons::DOMAIN_NOT_SAVED => {
                    c.message.clone()
                }
                _ => format!("domain {domain} runs"),
            }
        }
    }
}

/// The Ready=False condition for an error, with the whole error chain as its message.
pub fn condition_for(e: &Error, generation: Option<i64>) -> Condition {
    conditions::new(
        types::READY,
        status::FALSE,
        e.reason(),
        banlieue_api::conditions::error_message(e),
        generation,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_pools_and_networks_the_provider_declared_are_taken() {
        let capabilities: banlieue_api::ProviderCapabilities =
            serde_json::from_value(serde_json::json!({
                "storageClasses": [{"name": "standard", "target": {"pool": "vm-pool"}}],
                "networkClasses": [{"name": "prod", "target": {"network": "isolated"}}],
            }))
            .expect("capabilities");
        let spec = |pool: &str, network: &str| -> banlieue_api::LibvirtMachineSpec {
            serde_json::from_value(serde_json::json!({
                "providerRef": {"name": "edge"}, "pool": pool, "network": network,
                "disk": {"backingVolume": "base.raw", "size": "1Gi"},
                "cpu": 1, "memory": "256Mi",
            }))
            .expect("spec")
        };
        assert!(undeclared_target(&spec("vm-pool", "isolated"), "edge", &capabilities).is_none());
        let message = |e: Option<Error>| match e {
            Some(Error::Core(Core::Invalid { reason, message })) => {
                assert_eq!(reason, "TargetNotDeclared");
                message
            }
            other => panic!("{other:?}"),
        };
        assert_eq!(
            message(undeclared_target(
                &spec("vm-pool", "mgmt-lan"),
                "edge",
                &capabilities
            )),
            "spec.network mgmt-lan is not a network Provider edge declared \
             (spec.capabilities.networkClasses: isolated)"
        );
        assert_eq!(
            message(undeclared_target(
                &spec("other", "isolated"),
                "edge",
                &capabilities
            )),
            "spec.pool other is not a storage pool Provider edge declared \
             (spec.capabilities.storageClasses: vm-pool)"
        );
        let none = banlieue_api::ProviderCapabilities::default();
        assert!(
            message(undeclared_target(
                &spec("vm-pool", "isolated"),
                "edge",
                &none
            ))
            .ends_with("(spec.capabilities.storageClasses: none)")
        );
    }
    use banlieue_api::{LibvirtDisk, LibvirtMachineSpec, LocalObjectReference};
    use banlieue_libvirt::{IpAddress, IpAddressType};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    pub(crate) fn machine(disk: LibvirtDisk, user_data: Option<&str>) -> LibvirtMachine {
        let mut m = LibvirtMachine::new(
            "web-01",
            LibvirtMachineSpec {
                provider_ref: LocalObjectReference::new("edge-7"),
                pool: "default".into(),
                network: "br-prod".into(),
                disk,
                firmware: Firmware::Bios,
                tpm_enabled: false,
                secure_boot: false,
                cpu: 2,
                memory: Quantity("1Gi".into()),
                user_data: user_data.map(str::to_owned),
                user_data_secret_ref: None,
                standby: None,
            },
        );
        m.metadata.namespace = Some("banlieue-system".into());
        m
    }

    fn immediate() -> LibvirtDisk {
        LibvirtDisk {
            backing_volume: Some("ubuntu-2404.raw".into()),
            install_media: None,
            size: Quantity("10Gi".into()),
        }
    }

    fn deferred() -> LibvirtDisk {
        LibvirtDisk {
            backing_volume: None,
            install_media: Some("installer.iso".into()),
            size: Quantity("20Gi".into()),
        }
    }

    const UUID: &str = "6f1c3b0e-6a7e-4c5b-9f53-0d7b1e2a9c11";

    fn xml(m: &LibvirtMachine) -> String {
        crate::domain_xml::render(&definition(m, UUID, DomainType::Qemu).unwrap())
    }

    /// The seed's two documents, as the guest reads them.
    fn seed_documents(m: &LibvirtMachine) -> String {
        let names = MachineNames::of(m);
        let s = seed(
            &names.domain,
            UUID,
            m.spec.user_data.as_deref().map(str::as_bytes),
        );
        let image = s.to_bytes().unwrap();
        format!(
            "--- meta-data\n{}--- user-data\n{}\n--- image bytes: {}",
            s.meta_data().unwrap(),
            m.spec.user_data.as_deref().unwrap_or(""),
            image.len()
        )
    }

    #[test]
    fn immediate_machine_xml() {
        insta::assert_snapshot!(xml(&machine(immediate(), None)));
    }

    #[test]
    fn deferred_machine_xml() {
        insta::assert_snapshot!(xml(&machine(deferred(), None)));
    }

    #[test]
    fn efi_machine_xml() {
        let mut m = machine(immediate(), None);
        m.spec.firmware = Firmware::Efi;
        insta::assert_snapshot!(xml(&m));
    }

    #[test]
    fn efi_tpm_machine_xml() {
        let mut m = machine(deferred(), None);
        m.spec.firmware = Firmware::Efi;
        m.spec.tpm_enabled = true;
        insta::assert_snapshot!(xml(&m));
    }

    #[test]
    fn efi_secure_boot_machine_xml() {
        let mut m = machine(immediate(), None);
        m.spec.firmware = Firmware::Efi;
        m.spec.secure_boot = true;
        insta::assert_snapshot!(xml(&m));
    }

    #[test]
    fn secure_boot_without_efi_is_refused() {
        let mut m = machine(immediate(), None);
        m.spec.secure_boot = true;
        let error = definition(&m, UUID, DomainType::Qemu).expect_err("refused");
        assert!(error.to_string().contains("secureBoot"), "{error}");
    }

    #[test]
    fn seed_without_user_data() {
        let m = machine(immediate(), None);
        insta::assert_snapshot!(seed_documents(&m));
        // The XML does not depend on user-data: the seed carries it.
        assert_eq!(xml(&m), xml(&machine(immediate(), Some("#cloud-config\n"))));
    }

    #[test]
    fn seed_with_user_data() {
        let m = machine(
            immediate(),
            Some("#cloud-config\nruncmd:\n  - [touch, /run/banlieue]\n"),
        );
        insta::assert_snapshot!(seed_documents(&m));
    }

    #[test]
    fn guard_never_takes_a_foreign_domain() {
        assert_eq!(classify(None, None), Existing::Absent);
        assert_eq!(classify(None, Some(UUID)), Existing::Absent);
        assert_eq!(classify(Some(UUID), Some(UUID)), Existing::Ours);
        assert_eq!(
            classify(Some(&UUID.to_uppercase()), Some(UUID)),
            Existing::Ours
        );
        assert_eq!(
            classify(Some("00000000-0000-0000-0000-000000000001"), Some(UUID)),
            Existing::Foreign {
                uuid: "00000000-0000-0000-0000-000000000001".into()
            }
        );
        // Nothing recorded: whatever is there was not made by this machine.
        assert!(matches!(
            classify(Some(UUID), None),
            Existing::Foreign { .. }
        ));
        let e = name_taken("ns-web", "abc");
        assert_eq!(e.reason(), "DomainNameTaken");
    }

    #[test]
    fn owned_volumes_are_recorded_or_of_our_domain() {
        let mut m = machine(immediate(), None);
        let names = MachineNames::of(&m);
        assert!(owned_volumes(&m, &names, false).is_empty());
        assert_eq!(
            owned_volumes(&m, &names, true),
            [names.os_volume.clone(), names.cidata_volume.clone()]
        );
        m.status = Some(LibvirtMachineStatus {
            volumes: vec![names.os_volume.clone(), "base.raw".into()],
            ..Default::default()
        });
        // The image never: only the machine's own names.
        assert_eq!(
            owned_volumes(&m, &names, false),
            vec![names.os_volume.clone()]
        );
        assert_eq!(
            volume_not_owned("a-b-c-os.qcow2", "default").reason(),
            "VolumeNotOwned"
        );
    }

    #[test]
    fn troubleshooting_messages_match_the_guide() {
        assert_eq!(
            volume_missing("ubuntu.raw", "default").to_string(),
            "volume ubuntu.raw is not in pool default"
        );
        assert_eq!(
            pool_missing("nvme-pool").to_string(),
            "storage pool nvme-pool does not exist"
        );
    }

    #[test]
    fn status_reports_running_domain() {
        let mut m = machine(immediate(), None);
        m.status = Some(LibvirtMachineStatus {
            domain_uuid: Some(UUID.into()),
            ..Default::default()
        });
        let at = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::from_second(10).unwrap(),
        );
        let s = status_after(
            &m,
            "banlieue-system",
            "edge-7",
            &Ok(Observed {
                running: true,
                addresses: vec![],
                addresses_from_guest: false,
                guest: super::super::guest::GuestSight::NoPhaseFile,
                standby: StandbySight::Running,
            }),
            at.clone(),
        );
        assert!(s.contract.ready);
        let ready = conditions::find(&s.contract.conditions, "Ready").unwrap();
        assert_eq!(ready.message, "domain banlieue-system-web-01 is running");
        let from_guest = status_after(
            &m,
            "banlieue-system",
            "edge-7",
            &Ok(Observed {
                running: true,
                addresses: vec![],
                addresses_from_guest: true,
                guest: super::super::guest::GuestSight::NoPhaseFile,
                standby: StandbySight::Running,
            }),
            at.clone(),
        );
        let ready = conditions::find(&from_guest.contract.conditions, "Ready").unwrap();
        assert!(
            ready.message.ends_with("its addresses are as its guest agent reports them (the host holds no DHCP lease for it)"),
            "{}",
            ready.message
        );
        assert!(s.contract.initialization.provisioned);
        assert_eq!(
            s.contract.provider_id.as_deref(),
            Some(format!("libvirt://banlieue-system/edge-7/{UUID}").as_str())
        );
        assert_eq!(s.domain_name.as_deref(), Some("banlieue-system-web-01"));
        assert!(conditions::is_true(&s.contract.conditions, "Ready"));

        m.status = Some(s);
        let s = status_after(
            &m,
            "banlieue-system",
            "edge-7",
            &Err(volume_missing("a", "b")),
            at,
        );
        assert!(!s.contract.ready);
        let c = conditions::find(&s.contract.conditions, "Ready").unwrap();
        assert_eq!(c.reason, "VolumeNotInPool");
        assert_eq!(c.message, "volume a is not in pool b");
    }

    #[test]
    fn addresses_skip_loopback_and_link_local() {
        let ifaces = vec![
            InterfaceAddresses::new(
                "lo",
                None,
                vec![IpAddress::new(IpAddressType::Ipv4, "127.0.0.1", 8)],
            ),
            InterfaceAddresses::new(
                "eth0",
                Some("52:54:00:00:00:01".into()),
                vec![
                    IpAddress::new(IpAddressType::Ipv4, "10.0.0.5", 24),
                    IpAddress::new(IpAddressType::Ipv6, "fe80::1", 64),
                    IpAddress::new(IpAddressType::Ipv6, "fd00::5", 64),
                ],
            ),
        ];
        let a = addresses(&ifaces);
        let got: Vec<&str> = a.iter().map(|a| a.address.as_str()).collect();
        assert_eq!(got, ["10.0.0.5", "fd00::5"]);
    }

    fn at(second: i64) -> k8s_openapi::apimachinery::pkg::apis::meta::v1::Time {
        k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::from_second(second).unwrap(),
        )
    }

    fn running() -> Observed {
        Observed {
            running: true,
            addresses: vec![MachineAddress {
                type_: address_type::INTERNAL_IP.into(),
                address: "10.0.0.5".into(),
            }],
            addresses_from_guest: false,
            guest: super::super::guest::GuestSight::Phase {
                phase: super::super::guest::Phase::Ready,
                ek: super::super::guest::EkReading::NotRead,
            },
            standby: StandbySight::Running,
        }
    }

    /// A machine whose domain ran and whose guest said `ready`, with an EK certificate and
    /// an address recorded: what the controller asks to save. `standby` is its spec's.
    fn ready_machine(standby: Option<Standby>) -> LibvirtMachine {
        let mut m = machine(immediate(), None);
        m.metadata.generation = Some(1);
        m.status = Some(LibvirtMachineStatus {
            domain_uuid: Some(UUID.into()),
            contract: banlieue_api::MachineStatusContract {
                tpm_endorsement_certificates: vec!["PEM".into()],
                tpm_endorsement_key_digests: vec!["sha256:00".into()],
                ..Default::default()
            },
            ..Default::default()
        });
        let s = status_after(&m, "banlieue-system", "edge-7", &Ok(running()), at(10));
        m.status = Some(s);
        m.spec.standby = standby;
        m.metadata.generation = Some(2);
        m
    }

    fn condition(s: &LibvirtMachineStatus, type_: &str) -> Condition {
        conditions::find(&s.contract.conditions, type_)
            .cloned()
            .unwrap_or_else(|| panic!("no {type_} condition"))
    }

    fn saved_domain() -> Observed {
        Observed {
            running: false,
            addresses: vec![],
            addresses_from_guest: false,
            guest: super::super::guest::GuestSight::NotRunning,
            standby: StandbySight::Saved,
        }
    }

    #[test]
    fn a_saved_machine_is_ready_and_keeps_what_its_guest_said() {
        let m = ready_machine(Some(Standby::Saved));
        let before = m.status.clone().unwrap();
        let s = status_after(&m, "banlieue-system", "edge-7", &Ok(saved_domain()), at(20));
        assert_eq!(s.contract.standby, Some(Standby::Saved));
        assert!(
            s.contract.ready,
            "a saved machine is resumed, not provisioned"
        );
        assert_eq!(s.contract.observed_generation, Some(2));
        let ready = condition(&s, types::READY);
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            (status::TRUE, reasons::DOMAIN_SAVED)
        );
        assert!(
            ready.message.starts_with(
                "domain banlieue-system-web-01 is saved (managed save) and holds no host memory"
            ),
            "{}",
            ready.message
        );
        let saved = condition(&s, types::SAVED);
        assert_eq!(
            (saved.status.as_str(), saved.reason.as_str()),
            (status::TRUE, reasons::DOMAIN_SAVED)
        );
        assert_eq!(saved.observed_generation, Some(2));
        // The guest is not asked anything: what it said before the save stays.
        assert_eq!(s.contract.guest_phase.as_deref(), Some("ready"));
        assert_eq!(s.contract.addresses, before.contract.addresses);
        assert_eq!(
            s.contract.tpm_endorsement_certificates,
            before.contract.tpm_endorsement_certificates
        );
        for type_ in [types::GUEST_READY, types::AGENT_CONNECTED] {
            assert_eq!(condition(&s, type_), condition(&before, type_), "{type_}");
        }
        assert!(conditions::is_true(
            &s.contract.conditions,
            types::GUEST_READY
        ));
        // Found saved again on the next look: nothing to write.
        let mut again = m.clone();
        again.status = Some(s.clone());
        assert_eq!(
            status_after(
                &again,
                "banlieue-system",
                "edge-7",
                &Ok(saved_domain()),
                at(30)
            ),
            s
        );
    }

    #[test]
    fn a_restored_machine_runs_and_says_whether_its_clock_was_set() {
        let mut m = ready_machine(Some(Standby::Saved));
        m.status = Some(status_after(
            &m,
            "banlieue-system",
            "edge-7",
            &Ok(saved_domain()),
            at(20),
        ));
        m.spec.standby = Some(Standby::Running);
        m.metadata.generation = Some(3);
        let restored = |clock: std::result::Result<(), String>| Observed {
            standby: StandbySight::Restored { clock },
            ..running()
        };
        let s = status_after(
            &m,
            "banlieue-system",
            "edge-7",
            &Ok(restored(Err("QEMU guest agent is not connected".into()))),
            at(40),
        );
        assert_eq!(s.contract.standby, Some(Standby::Running));
        assert!(s.contract.ready);
        let saved = condition(&s, types::SAVED);
        assert_eq!(
            (saved.status.as_str(), saved.reason.as_str()),
            (status::FALSE, reasons::DOMAIN_NOT_SAVED)
        );
        assert_eq!(saved.last_transition_time, at(40));
        let ready = condition(&s, types::READY);
        assert_eq!(ready.reason, reasons::DOMAIN_RUNNING);
        assert!(
            ready.message.contains(
                "restored from its managed save image, but its guest's clock was not set \
                 (QEMU guest agent is not connected)"
            ),
            "{}",
            ready.message
        );
        assert!(
            saved.message.contains("clock was not set"),
            "{}",
            saved.message
        );
        // Read again, not the recorded ones.
        assert_eq!(s.contract.addresses, running().addresses);

        let s = status_after(
            &m,
            "banlieue-system",
            "edge-7",
            &Ok(restored(Ok(()))),
            at(40),
        );
        let ready = condition(&s, types::READY);
        assert!(
            ready.message.ends_with(
                "restored from its managed save image, its guest's clock set to the host's time"
            ),
            "{}",
            ready.message
        );
        // The next look at the running domain: Saved=False keeps what the restore said.
        let mut later = m.clone();
        later.status = Some(s.clone());
        let next = status_after(&later, "banlieue-system", "edge-7", &Ok(running()), at(50));
        assert_eq!(condition(&next, types::SAVED), condition(&s, types::SAVED));
        assert_eq!(
            condition(&next, types::READY).message,
            "domain banlieue-system-web-01 is running"
        );
    }

    #[test]
    fn a_restore_that_failed_is_reported_once_and_not_booted_afresh_for_the_same_spec() {
        let mut m = ready_machine(Some(Standby::Saved));
        m.status = Some(status_after(
            &m,
            "banlieue-system",
            "edge-7",
            &Ok(saved_domain()),
            at(20),
        ));
        m.spec.standby = Some(Standby::Running);
        m.metadata.generation = Some(3);
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
    fn a_machine_without_standby_sees_no_status_change() {
        let m = ready_machine(None);
        let before = m.status.clone().unwrap();
        let mut same_generation = m.clone();
        same_generation.metadata.generation = Some(1);
        let s = status_after(
            &same_generation,
            "banlieue-system",
            "edge-7",
            &Ok(running()),
            at(30),
        );
        assert_eq!(s, before, "nothing to write");
        assert_eq!(s.contract.standby, None);
        assert!(conditions::find(&s.contract.conditions, types::SAVED).is_none());
        let json = serde_json::to_value(&s).unwrap();
        assert!(json.get("standby").is_none(), "{json}");
        // Started after its host restarted: still nothing about standby.
        assert_eq!(standby_act(&m, false, true, false), StandbyAct::Start);
        assert_eq!(started(&m), StandbySight::Running);

        // Asked to run explicitly (a claimed member never saved): it says so.
        let mut asked = same_generation.clone();
        asked.spec.standby = Some(Standby::Running);
        let s = status_after(&asked, "banlieue-system", "edge-7", &Ok(running()), at(30));
        assert_eq!(s.contract.standby, Some(Standby::Running));
        assert_eq!(
            condition(&s, types::SAVED).message,
            "domain banlieue-system-web-01 runs"
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

//! The pure half of realising a LibvirtMachine: its names, its domain definition, its seed,
//! the upsert guard, and the status it reports. No I/O here; `realise` and `teardown` act.

use crate::names;
use banlieue_api::common::address_type;
use banlieue_api::conditions::{self, Condition, reasons, status, types};
use banlieue_api::{Firmware, LibvirtMachine, LibvirtMachineStatus, MachineAddress};
use banlieue_iso::NoCloudSeed;
use banlieue_libvirt::InterfaceAddresses;

use crate::domain_xml::{DomainDefinition, DomainType, VolumeRef};
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
    Error::Invalid {
        reason: reasons::DOMAIN_NAME_TAKEN,
        message: format!(
            "domain {domain} already exists on the host with UUID {uuid}, which this \
             LibvirtMachine did not create; it is left untouched (rename or remove it)"
        ),
    }
}

/// The message of the guide's troubleshooting table for an absent pool.
pub fn pool_missing(pool: &str) -> Error {
    Error::Invalid {
        reason: reasons::STORAGE_POOL_NOT_FOUND,
        message: format!("storage pool {pool} does not exist"),
    }
}

/// The message of the guide's troubleshooting table for an absent image volume.
pub fn volume_missing(volume: &str, pool: &str) -> Error {
    Error::Invalid {
        reason: reasons::VOLUME_NOT_IN_POOL,
        message: format!("volume {volume} is not in pool {pool}"),
    }
}

/// A volume of the machine's name that this machine did not record as its own.
pub fn volume_not_owned(volume: &str, pool: &str) -> Error {
    Error::Invalid {
        reason: crate::error::provider_reasons::VOLUME_NOT_OWNED,
        message: format!(
            "volume {volume} already exists in pool {pool}, but this LibvirtMachine did not \
             create it (it is not in status.volumes); it is neither reused nor deleted \
             (rename or remove it)"
        ),
    }
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
    Error::Invalid {
        reason: reasons::NETWORK_NOT_FOUND,
        message: format!("network {network} does not exist"),
    }
}

/// Size of the OS disk in bytes.
pub fn disk_bytes(machine: &LibvirtMachine) -> Result<u64> {
    let q = &machine.spec.disk.size.0;
    quantity::to_bytes(q)
        .filter(|b| *b > 0)
        .ok_or_else(|| Error::Invalid {
            reason: reasons::PROVISIONING,
            message: format!("disk size {q:?} is not a whole number of bytes"),
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
        .ok_or_else(|| Error::Invalid {
            reason: reasons::PROVISIONING,
            message: format!(
                "memory {:?} is not a whole number of bytes of at least 1Mi",
                spec.memory.0
            ),
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
        efi: spec.firmware == Firmware::Efi,
        tpm: spec.tpm_enabled,
        os_disk: volume(&names.os_volume),
        install_media: spec.disk.install_media.as_deref().map(volume),
        cidata: volume(&names.cidata_volume),
        network: spec.network.clone(),
    })
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
    new.contract.observed_generation = generation;
    let ready = match outcome {
        Ok(observed) => {
            if let Some(uuid) = &old.domain_uuid {
                new.contract.provider_id = Some(provider_id(provider_namespace, provider, uuid));
            }
            new.contract.initialization.provisioned = true;
            new.contract.ready = observed.running;
            new.contract.addresses = observed.addresses.clone();
            let guest = super::guest::guest_status(
                &observed.guest,
                machine.spec.tpm_enabled,
                &old,
                generation,
            );
            new.contract.guest_phase = guest.guest_phase;
            new.contract.tpm_endorsement_certificates = guest.certificates;
            new.contract.tpm_endorsement_key_digests = guest.key_digests;
            conditions::set(&mut new.contract.conditions, guest.guest_ready, now.clone());
            conditions::set(
                &mut new.contract.conditions,
                guest.agent_connected,
                now.clone(),
            );
            if observed.running {
                conditions::new(
                    types::READY,
                    status::TRUE,
                    reasons::DOMAIN_RUNNING,
                    if observed.addresses_from_guest {
                        format!(
                            "domain {} is running; its addresses are as its guest agent \
                             reports them (the host holds no DHCP lease for it)",
                            names.domain
                        )
                    } else {
                        format!("domain {} is running", names.domain)
                    },
                    generation,
                )
            } else {
                conditions::new(
                    types::READY,
                    status::FALSE,
                    reasons::PROVISIONING,
                    format!("domain {} is defined but not running yet", names.domain),
                    generation,
                )
            }
        }
        Err(e) => {
            new.contract.ready = false;
            condition_for(e, generation)
        }
    };
    conditions::set(&mut new.contract.conditions, ready, now);
    new
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
}

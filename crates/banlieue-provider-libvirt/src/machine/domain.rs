//! The domain a LibvirtMachine becomes: its libvirt names, its definition and disk size, its
//! NoCloud seed, and the upsert guard in front of DOMAIN_DEFINE_XML. No I/O here; `realise`
//! and `teardown` act.

use crate::names;
use banlieue_api::conditions::reasons;
use banlieue_api::{Firmware, LibvirtMachine};
use banlieue_iso::NoCloudSeed;
use banlieue_provider_kit::error::Core;

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
        // Set once the egress policy is enforced per machine.
        egress_filter: None,
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

#[cfg(test)]
mod tests {
    use super::super::fixtures::{UUID, deferred, immediate, machine};
    use super::*;

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
}

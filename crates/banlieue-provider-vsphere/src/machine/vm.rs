//! The VM a VSphereMachine becomes: its name and inventory paths, the extraConfig its clone
//! carries, its memory and firmware, and the ownership guard. No I/O here.

use std::collections::BTreeMap;

use banlieue_api::conditions::reasons;
use banlieue_api::vsphere::{self, EXTRA_CONFIG_MACHINE_UID};
use banlieue_api::{VSphereMachine, names, quantity};
use banlieue_provider_kit::error::Core;
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;

use crate::error::{Error, Result};

/// vCenter's limit on a VM's name.
pub const MAX_VM_NAME_LEN: usize = 80;

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

#[cfg(test)]
mod tests {
    use super::super::fixtures::machine;
    use super::*;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

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

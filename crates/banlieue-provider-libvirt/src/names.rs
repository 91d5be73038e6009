//! The names this provider gives libvirt objects. Only the provider needs its volumes' names:
//! the controller writes a LibvirtMachine and never names a volume (ADR-0070).

use banlieue_api::names::{MAX_MACHINE_NAME_LEN, MAX_NAME_LEN};

/// The libvirt domain of a machine, `<namespace>-<name>`: the name every backend gives a
/// machine's object, defined once in the API crate.
pub use banlieue_api::names::domain_name;

/// The machine's OS disk volume.
pub fn os_volume_name(domain: &str) -> String {
    format!("{domain}-os.qcow2")
}

/// The machine's cloud-init seed volume.
pub fn cidata_volume_name(domain: &str) -> String {
    format!("{domain}-cidata.iso")
}

/// Whether `volume` has the shape of a machine's own volume (its OS disk or its seed): never
/// an image, whoever names it and whatever the Provider declares.
pub fn is_machine_volume(volume: &str) -> bool {
    volume.ends_with("-os.qcow2") || volume.ends_with("-cidata.iso")
}

/// The longest volume name of the longest machine in the longest namespace: what
/// [`MAX_MACHINE_NAME_LEN`] is chosen for (a host's file system allows 255 bytes).
pub fn longest_volume_name() -> usize {
    let longest = domain_name(&"n".repeat(MAX_NAME_LEN), &"m".repeat(MAX_MACHINE_NAME_LEN));
    os_volume_name(&longest)
        .len()
        .max(cidata_volume_name(&longest).len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn libvirt_names_follow_the_domain() {
        let d = domain_name("banlieue-system", "web-01");
        assert_eq!(d, "banlieue-system-web-01");
        assert_eq!(os_volume_name(&d), "banlieue-system-web-01-os.qcow2");
        assert_eq!(cidata_volume_name(&d), "banlieue-system-web-01-cidata.iso");
        // The longest machine in the longest namespace still names files a host can create.
        assert_eq!(longest_volume_name(), 255);
    }
}

//! The libvirt domain XML of a LibvirtMachine: a pure function of the machine's resolved facts.
//!
//! Every value reaches the document through quick-xml's escaping writer, never by string
//! concatenation, because names and volume names come from API objects a user wrote.

use quick_xml::Writer;
use quick_xml::events::BytesText;

/// libvirt's `<domain type=…>`: `kvm` needs a usable `/dev/kvm`; `qemu` is TCG emulation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DomainType {
    Kvm,
    Qemu,
}

impl DomainType {
    pub fn as_str(self) -> &'static str {
        match self {
            DomainType::Kvm => "kvm",
            DomainType::Qemu => "qemu",
        }
    }

    /// `kvm` or `qemu`; anything else is `None`.
    pub fn parse(value: &str) -> Option<DomainType> {
        match value.trim() {
            "kvm" => Some(DomainType::Kvm),
            "qemu" => Some(DomainType::Qemu),
            _ => None,
        }
    }
}

/// The firmware a domain boots: libvirt picks the loader and variable store that match.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BootFirmware {
    /// SeaBIOS.
    Bios,
    /// OVMF without Secure Boot.
    Efi,
    /// OVMF with Secure Boot on and the distribution's default keys (Microsoft's) enrolled;
    /// such firmware needs SMM, so that the guest cannot write the key variables itself.
    EfiSecureBoot,
}

/// A volume of a storage pool, as a disk source (`<source pool=… volume=…/>`): libvirt resolves
/// the path, so the provider never handles host paths.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VolumeRef {
    pub pool: String,
    pub volume: String,
}

/// Everything the XML depends on, already resolved and validated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DomainDefinition {
    /// `<namespace>-<name>`.
    pub name: String,
    /// Chosen before the seed is built; also the seed's instance-id.
    pub uuid: String,
    pub domain_type: DomainType,
    pub vcpu: u32,
    pub memory_kib: u64,
    pub firmware: BootFirmware,
    pub tpm: bool,
    /// The machine's own qcow2 (an overlay, or an empty disk for Deferred/Manual).
    pub os_disk: VolumeRef,
    /// Deferred/Manual: the image, attached as the boot CD-ROM.
    pub install_media: Option<VolumeRef>,
    /// The NoCloud seed CD-ROM; always present.
    pub cidata: VolumeRef,
    /// The libvirt network the interface joins.
    pub network: String,
    /// The network filter the interface references (`<filterref filter=…/>`): the machine's
    /// egress policy, see [`crate::egress_filter`]. libvirt refuses to start the domain until a
    /// filter of that name is defined. `None` leaves the interface unfiltered.
    pub egress_filter: Option<String>,
}

/// Renders the domain XML. Devices come in a fixed order: OS disk, install media, seed,
/// interface, serial console, (TPM), and `<video><model type='none'/>` because libvirt has no
/// "no graphics" element and a headless sandbox needs no display.
pub fn render(def: &DomainDefinition) -> String {
    let mut w = Writer::new_with_indent(Vec::new(), b' ', 2);
    // Writing into a Vec cannot fail; the io::Result is an artefact of the generic writer.
    let written = write_domain(&mut w, def);
    debug_assert!(written.is_ok());
    String::from_utf8(w.into_inner()).unwrap_or_default()
}

fn write_domain(w: &mut Writer<Vec<u8>>, def: &DomainDefinition) -> std::io::Result<()> {
    w.create_element("domain")
        .with_attribute(("type", def.domain_type.as_str()))
        .write_inner_content(|w| {
            text(w, "name", &def.name)?;
            text(w, "uuid", &def.uuid)?;
            w.create_element("memory")
                .with_attribute(("unit", "KiB"))
                .write_text_content(BytesText::new(&def.memory_kib.to_string()))?;
            text(w, "vcpu", &def.vcpu.to_string())?;
            write_os(w, def)?;
            w.create_element("features").write_inner_content(|w| {
                w.create_element("acpi").write_empty()?;
                w.create_element("apic").write_empty()?;
                // Said, not left to libvirt: the secure firmware's descriptor requires SMM,
                // and a domain without it matches no firmware.
                if def.firmware == BootFirmware::EfiSecureBoot {
                    w.create_element("smm")
                        .with_attribute(("state", "on"))
                        .write_empty()?;
                }
                Ok(())
            })?;
            text(w, "on_poweroff", "destroy")?;
            text(w, "on_reboot", "restart")?;
            text(w, "on_crash", "destroy")?;
            w.create_element("devices")
                .write_inner_content(|w| write_devices(w, def))?;
            Ok(())
        })?;
    Ok(())
}

fn write_os(w: &mut Writer<Vec<u8>>, def: &DomainDefinition) -> std::io::Result<()> {
    let os = w.create_element("os");
    // No loader path: libvirt picks the loader and a per-domain varstore copy from its
    // firmware descriptors, which differ between distributions.
    // Both features are always said, on or off, so that libvirt's choice among the firmware
    // descriptors is the one asked for: plain OVMF, or the SMM-enabled build with a variable
    // store that has the default keys enrolled and Secure Boot on.
    let secure_boot = match def.firmware {
        BootFirmware::Bios => None,
        BootFirmware::Efi => Some("no"),
        BootFirmware::EfiSecureBoot => Some("yes"),
    };
    let os = if secure_boot.is_some() {
        os.with_attribute(("firmware", "efi"))
    } else {
        os
    };
    os.write_inner_content(|w| {
        w.create_element("type")
            .with_attribute(("arch", "x86_64"))
            .with_attribute(("machine", "q35"))
            .write_text_content(BytesText::new("hvm"))?;
        if let Some(enabled) = secure_boot {
            w.create_element("firmware").write_inner_content(|w| {
                for name in ["enrolled-keys", "secure-boot"] {
                    w.create_element("feature")
                        .with_attribute(("enabled", enabled))
                        .with_attribute(("name", name))
                        .write_empty()?;
                }
                Ok(())
            })?;
        }
        // Deferred/Manual boot the install media until the guest has installed itself.
        let order: &[&str] = if def.install_media.is_some() {
            &["hd", "cdrom"]
        } else {
            &["hd"]
        };
        for dev in order {
            w.create_element("boot")
                .with_attribute(("dev", *dev))
                .write_empty()?;
        }
        Ok(())
    })?;
    Ok(())
}

fn write_devices(w: &mut Writer<Vec<u8>>, def: &DomainDefinition) -> std::io::Result<()> {
    // CD-ROMs sit on SCSI behind virtio-scsi: q35's default CD-ROM bus is SATA, which cloud
    // kernels often lack, and then cloud-init silently ignores the seed.
    w.create_element("controller")
        .with_attribute(("type", "scsi"))
        .with_attribute(("index", "0"))
        .with_attribute(("model", "virtio-scsi"))
        .write_empty()?;
    w.create_element("disk")
        .with_attribute(("type", "volume"))
        .with_attribute(("device", "disk"))
        .write_inner_content(|w| {
            w.create_element("driver")
                .with_attribute(("name", "qemu"))
                .with_attribute(("type", "qcow2"))
                .write_empty()?;
            volume_source(w, &def.os_disk)?;
            target(w, "vda", "virtio")?;
            Ok(())
        })?;
    let mut cdroms = Vec::new();
    if let Some(media) = &def.install_media {
        cdroms.push((media, "sda"));
    }
    cdroms.push((&def.cidata, if cdroms.is_empty() { "sda" } else { "sdb" }));
    for (volume, dev) in cdroms {
        w.create_element("disk")
            .with_attribute(("type", "volume"))
            .with_attribute(("device", "cdrom"))
            .write_inner_content(|w| {
                w.create_element("driver")
                    .with_attribute(("name", "qemu"))
                    .with_attribute(("type", "raw"))
                    .write_empty()?;
                volume_source(w, volume)?;
                target(w, dev, "scsi")?;
                w.create_element("readonly").write_empty()?;
                Ok(())
            })?;
    }
    w.create_element("interface")
        .with_attribute(("type", "network"))
        .write_inner_content(|w| {
            w.create_element("source")
                .with_attribute(("network", def.network.as_str()))
                .write_empty()?;
            w.create_element("model")
                .with_attribute(("type", "virtio"))
                .write_empty()?;
            if let Some(filter) = &def.egress_filter {
                w.create_element("filterref")
                    .with_attribute(("filter", filter.as_str()))
                    .write_empty()?;
            }
            Ok(())
        })?;
    w.create_element("serial")
        .with_attribute(("type", "pty"))
        .write_inner_content(|w| {
            w.create_element("target")
                .with_attribute(("port", "0"))
                .write_empty()?;
            Ok(())
        })?;
    w.create_element("console")
        .with_attribute(("type", "pty"))
        .write_inner_content(|w| {
            w.create_element("target")
                .with_attribute(("type", "serial"))
                .with_attribute(("port", "0"))
                .write_empty()?;
            Ok(())
        })?;
    // The guest agent's channel: addresses from the agent source need it.
    w.create_element("channel")
        .with_attribute(("type", "unix"))
        .write_inner_content(|w| {
            w.create_element("target")
                .with_attribute(("type", "virtio"))
                .with_attribute(("name", "org.qemu.guest_agent.0"))
                .write_empty()?;
            Ok(())
        })?;
    if def.tpm {
        w.create_element("tpm")
            .with_attribute(("model", "tpm-crb"))
            .write_inner_content(|w| {
                w.create_element("backend")
                    .with_attribute(("type", "emulator"))
                    .with_attribute(("version", "2.0"))
                    .write_empty()?;
                Ok(())
            })?;
    }
    w.create_element("video").write_inner_content(|w| {
        w.create_element("model")
            .with_attribute(("type", "none"))
            .write_empty()?;
        Ok(())
    })?;
    Ok(())
}

fn text(w: &mut Writer<Vec<u8>>, name: &str, value: &str) -> std::io::Result<()> {
    w.create_element(name)
        .write_text_content(BytesText::new(value))?;
    Ok(())
}

fn volume_source(w: &mut Writer<Vec<u8>>, volume: &VolumeRef) -> std::io::Result<()> {
    w.create_element("source")
        .with_attribute(("pool", volume.pool.as_str()))
        .with_attribute(("volume", volume.volume.as_str()))
        .write_empty()?;
    Ok(())
}

fn target(w: &mut Writer<Vec<u8>>, dev: &str, bus: &str) -> std::io::Result<()> {
    w.create_element("target")
        .with_attribute(("dev", dev))
        .with_attribute(("bus", bus))
        .write_empty()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn immediate() -> DomainDefinition {
        DomainDefinition {
            name: "banlieue-system-web-01".into(),
            uuid: "6f1c3b0e-6a7e-4c5b-9f53-0d7b1e2a9c11".into(),
            domain_type: DomainType::Qemu,
            vcpu: 2,
            memory_kib: 1024 * 1024,
            firmware: BootFirmware::Bios,
            tpm: false,
            os_disk: VolumeRef {
                pool: "default".into(),
                volume: "banlieue-system-web-01-os.qcow2".into(),
            },
            install_media: None,
            cidata: VolumeRef {
                pool: "default".into(),
                volume: "banlieue-system-web-01-cidata.iso".into(),
            },
            network: "br-prod".into(),
            egress_filter: None,
        }
    }

    #[test]
    fn devices_follow_the_shape() {
        let xml = render(&DomainDefinition {
            firmware: BootFirmware::Efi,
            tpm: true,
            domain_type: DomainType::Kvm,
            install_media: Some(VolumeRef {
                pool: "default".into(),
                volume: "installer.iso".into(),
            }),
            ..immediate()
        });
        assert!(xml.starts_with(r#"<domain type="kvm">"#), "{xml}");
        let os = xml.find("-os.qcow2").unwrap();
        let media = xml.find("installer.iso").unwrap();
        let seed = xml.find("-cidata.iso").unwrap();
        assert!(os < media && media < seed, "disk order: {xml}");
        assert!(xml.contains(r#"<os firmware="efi">"#), "{xml}");
        assert!(!xml.contains("<loader"), "{xml}");
        assert!(
            xml.contains(r#"<backend type="emulator" version="2.0"/>"#),
            "{xml}"
        );
        assert!(!xml.contains("<graphics"), "{xml}");
    }

    #[test]
    fn only_secure_boot_enables_the_features_and_smm() {
        let features = |firmware| {
            let xml = render(&DomainDefinition {
                firmware,
                ..immediate()
            });
            (
                xml.matches(r#"enabled="yes""#).count(),
                xml.matches(r#"enabled="no""#).count(),
                xml.contains(r#"<smm state="on"/>"#),
            )
        };
        assert_eq!(features(BootFirmware::Bios), (0, 0, false));
        assert_eq!(features(BootFirmware::Efi), (0, 2, false));
        assert_eq!(features(BootFirmware::EfiSecureBoot), (2, 0, true));
    }

    #[test]
    fn interface_references_the_egress_filter() {
        let xml = render(&DomainDefinition {
            egress_filter: Some("banlieue-egress-banlieue-system-web-01".into()),
            ..immediate()
        });
        insta::assert_snapshot!(xml);
    }

    #[test]
    fn untrusted_names_are_escaped() {
        let def = DomainDefinition {
            network: "a'\"<net>&".into(),
            egress_filter: Some("f'\"/><filter>".into()),
            os_disk: VolumeRef {
                pool: "p<o>ol".into(),
                volume: "x\"/><evil/>".into(),
            },
            ..immediate()
        };
        let xml = render(&def);
        assert!(!xml.contains("<evil"), "{xml}");
        assert!(!xml.contains("<net>"), "{xml}");
        assert!(!xml.contains("<filter>"), "{xml}");
        assert!(xml.contains("p&lt;o&gt;ol"), "{xml}");
    }
}

//! Facts about the libvirt host that shape a domain: which domain type to ask for.

use quick_xml::Reader;
use quick_xml::events::Event;

use crate::domain_xml::DomainType;

/// Environment variable that forces the domain type (`qemu` or `kvm`). Capabilities say what
/// QEMU supports, not whether it works: a host can list `kvm` while its `/dev/kvm` cannot run
/// guests (nested setups, some CI machines), and only the operator knows that.
pub const DOMAIN_TYPE_ENV: &str = "BANLIEUE_LIBVIRT_DOMAIN_TYPE";

/// `kvm` when the capabilities offer it for an x86_64 hvm guest, otherwise `qemu` (TCG).
pub fn domain_type_from_capabilities(capabilities_xml: &str) -> DomainType {
    let mut reader = Reader::from_str(capabilities_xml);
    let mut in_x86_64_arch = false;
    loop {
        match reader.read_event() {
            Ok(Event::Start(e)) if e.name().as_ref() == b"arch" => {
                in_x86_64_arch = attribute(&e, b"name").as_deref() == Some("x86_64");
            }
            Ok(Event::End(e)) if e.name().as_ref() == b"arch" => in_x86_64_arch = false,
            Ok(Event::Empty(e) | Event::Start(e))
                if in_x86_64_arch && e.name().as_ref() == b"domain" =>
            {
                if attribute(&e, b"type").as_deref() == Some("kvm") {
                    return DomainType::Kvm;
                }
            }
            // A document that cannot be read offers nothing beyond emulation.
            Ok(Event::Eof) | Err(_) => return DomainType::Qemu,
            Ok(_) => {}
        }
    }
}

/// The domain type to use: the override when set, else what the capabilities offer.
pub fn choose_domain_type(capabilities_xml: &str, forced: Option<DomainType>) -> DomainType {
    forced.unwrap_or_else(|| domain_type_from_capabilities(capabilities_xml))
}

fn attribute(e: &quick_xml::events::BytesStart<'_>, name: &[u8]) -> Option<String> {
    e.attributes()
        .flatten()
        .find(|a| a.key.as_ref() == name)
        .and_then(|a| a.unescape_value().ok().map(|v| v.into_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const TCG_ONLY: &str = r#"<capabilities><host><uuid>x</uuid></host>
      <guest><os_type>hvm</os_type><arch name='x86_64'><wordsize>64</wordsize>
        <domain type='qemu'/></arch></guest>
      <guest><os_type>hvm</os_type><arch name='i686'><domain type='kvm'/></arch></guest>
    </capabilities>"#;

    const WITH_KVM: &str = r#"<capabilities><guest><os_type>hvm</os_type>
      <arch name='x86_64'><domain type='qemu'/><domain type='kvm'><emulator>/usr/bin/qemu-system-x86_64</emulator></domain></arch>
    </guest></capabilities>"#;

    #[test]
    fn kvm_only_when_offered_for_x86_64() {
        assert_eq!(domain_type_from_capabilities(TCG_ONLY), DomainType::Qemu);
        assert_eq!(domain_type_from_capabilities(WITH_KVM), DomainType::Kvm);
        assert_eq!(domain_type_from_capabilities("<broken"), DomainType::Qemu);
    }

    #[test]
    fn the_override_wins() {
        assert_eq!(
            choose_domain_type(WITH_KVM, Some(DomainType::Qemu)),
            DomainType::Qemu
        );
        assert_eq!(choose_domain_type(WITH_KVM, None), DomainType::Kvm);
    }
}

//! A machine's egress on its host: its `spec.egress` (its class's) made into the network
//! filter of its own ([`crate::egress_filter`]) that its domain's interface references, defined
//! before the domain is, so the guest never runs a moment without it; removed with the domain.
//!
//! What is always denied comes from the machine's network as libvirt describes it: the
//! network's own subnets (the other guests on it) and the host's addresses there (the
//! network's `<ip address>`), and link-local 169.254.0.0/16; a class opts out of each by name.

use std::net::Ipv4Addr;

use banlieue_api::LibvirtMachine;
use banlieue_api::conditions::reasons;
use banlieue_api::egress::{AlwaysDenied, ClassEgress, EgressProtocol, EgressRule};
use banlieue_libvirt::proto::remote::{self, procedures as rp};
use banlieue_libvirt::{Client, Network, NwFilter};
use banlieue_provider_kit::error::Core;
use quick_xml::Reader;
use quick_xml::events::Event;

use crate::egress_filter::{self, AllowRule, EgressPolicy, Ipv4Cidr, PortRange, Protocol};
use crate::error::{Error, Result};

/// The name of the filter of the domain `domain`.
pub fn filter_name(domain: &str) -> String {
    format!("banlieue-egress-{domain}")
}

/// What a libvirt network's definition says about its IPv4 addressing.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NetworkFacts {
    /// The host's addresses on the network (each `<ip address>`).
    pub host_addresses: Vec<Ipv4Addr>,
    /// The network's subnets, where its guests are.
    pub subnets: Vec<Ipv4Cidr>,
}

/// Reads the IPv4 `<ip>` elements of a network's XML (`address` with `prefix` or `netmask`);
/// IPv6 ones are skipped (the filter drops all IPv6).
pub fn network_facts(xml: &str) -> Result<NetworkFacts> {
    let invalid = |why: String| egress_invalid(format!("the network's definition: {why}"));
    let mut reader = Reader::from_str(xml);
    let mut facts = NetworkFacts::default();
    loop {
        let element = match reader.read_event() {
            Ok(Event::Start(e) | Event::Empty(e)) => e,
            Ok(Event::Eof) => break,
            Ok(_) => continue,
            Err(e) => return Err(invalid(e.to_string())),
        };
        if element.name().as_ref() != b"ip" {
            continue;
        }
        let mut address = None;
        let mut prefix = None;
        let mut ipv6 = false;
        for attribute in element.attributes() {
            let attribute = attribute.map_err(|e| invalid(e.to_string()))?;
            let value = String::from_utf8_lossy(&attribute.value).into_owned();
            match attribute.key.as_ref() {
                b"address" => address = Some(value),
                b"prefix" => prefix = value.parse::<u8>().ok(),
                b"netmask" => {
                    prefix = value
                        .parse::<Ipv4Addr>()
                        .ok()
                        .map(|m| u32::from(m).count_ones() as u8)
                }
                b"family" => ipv6 = value == "ipv6",
                _ => {}
            }
        }
        let Some(address) = address.filter(|_| !ipv6) else {
            continue;
        };
        let Ok(address) = address.parse::<Ipv4Addr>() else {
            continue;
        };
        // libvirt's default when neither is given is the address's class; every network
        // banlieue's guides define names one.
        let prefix = prefix.unwrap_or(24);
        let subnet = Ipv4Cidr::network_of(address, prefix)
            .ok_or_else(|| invalid(format!("prefix {prefix} of {address}")))?;
        facts.host_addresses.push(address);
        facts.subnets.push(subnet);
    }
    Ok(facts)
}

/// The filter's policy for `egress` on a network of `facts`.
pub fn policy(egress: &ClassEgress, facts: &NetworkFacts) -> Result<EgressPolicy> {
    let opted_out = |denied: AlwaysDenied| egress.allow_always_denied.contains(&denied);
    let mut denied = Vec::new();
    if !opted_out(AlwaysDenied::LinkLocal) {
        denied.push(Ipv4Cidr::LINK_LOCAL);
    }
    if !opted_out(AlwaysDenied::HostAddresses) {
        denied.extend(facts.host_addresses.iter().copied().map(Ipv4Cidr::host));
    }
    if !opted_out(AlwaysDenied::GuestToGuest) {
        denied.extend(facts.subnets.iter().copied());
    }
    let dns_resolver = egress
        .dns_resolver
        .as_deref()
        .map(|r| {
            r.parse::<Ipv4Addr>()
                .map_err(|_| egress_invalid(format!("dnsResolver {r:?} is not an IPv4 address")))
        })
        .transpose()?;
    let allow = egress
        .allow
        .iter()
        .map(allow_rule)
        .collect::<Result<Vec<_>>>()?;
    Ok(EgressPolicy {
        allow,
        dns_resolver,
        denied,
    })
}

fn allow_rule(rule: &EgressRule) -> Result<AllowRule> {
    let destination = Ipv4Cidr::parse(&rule.cidr).map_err(|e| egress_invalid(e.to_string()))?;
    let protocol = match rule.protocol {
        EgressProtocol::Tcp => Protocol::Tcp,
        EgressProtocol::Udp => Protocol::Udp,
        EgressProtocol::Icmp => Protocol::Icmp,
        EgressProtocol::Any => Protocol::Any,
    };
    let ports = rule.port.map(|first| PortRange {
        first,
        last: rule.end_port.unwrap_or(first),
    });
    Ok(AllowRule {
        destination,
        protocol,
        ports,
    })
}

/// Defines the filter of `machine`'s domain `domain` for its `spec.egress` on `network` and
/// returns its name; `None` when the machine declares no egress.
pub async fn apply(
    client: &Client,
    machine: &LibvirtMachine,
    domain: &str,
) -> Result<Option<String>> {
    let Some(egress) = &machine.spec.egress else {
        return Ok(None);
    };
    let network = &machine.spec.network;
    let net = Network::lookup_by_name(client, network)
        .await
        .map_err(Error::libvirt(format!("look up network {network}")))?
        .ok_or_else(|| super::targets::network_missing(network))?;
    let xml = client
        .call::<rp::NetworkGetXmlDesc>(&remote::RemoteNetworkGetXmlDescArgs {
            net: net.raw().clone(),
            flags: 0,
        })
        .await
        .map_err(Error::libvirt(format!("read network {network}")))?
        .xml;
    let policy = policy(egress, &network_facts(&xml)?)?;
    let name = filter_name(domain);
    let document =
        egress_filter::filter_xml(&name, &policy).map_err(|e| egress_invalid(e.to_string()))?;
    NwFilter::define_xml(client, &document).await.map_err(|e| {
        Error::Core(Core::Invalid {
            reason: reasons::EGRESS_FILTER_FAILED,
            message: format!("define network filter {name}: {e}"),
        })
    })?;
    Ok(Some(name))
}

/// Removes the filter of domain `domain`, once the domain that referenced it is gone; nothing
/// when there is none, or when the filter of that name is not one banlieue defined (its UUID
/// is not the one the name gives).
pub async fn remove(client: &Client, domain: &str) -> Result<()> {
    let name = filter_name(domain);
    let ours = *egress_filter::filter_uuid(&name).as_bytes();
    if let Some(filter) = NwFilter::lookup_by_name(client, &name)
        .await
        .map_err(Error::libvirt(format!("look up network filter {name}")))?
        .filter(|f| f.uuid() == ours)
    {
        filter
            .undefine()
            .await
            .map_err(Error::libvirt(format!("undefine network filter {name}")))?;
    }
    Ok(())
}

fn egress_invalid(message: String) -> Error {
    Error::Core(Core::Invalid {
        reason: reasons::EGRESS_FILTER_FAILED,
        message,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const NAT: &str = "<network><name>default</name><forward mode='nat'/>\
        <ip address='192.168.122.1' netmask='255.255.255.0'><dhcp/></ip>\
        <ip family='ipv6' address='fd00::1' prefix='64'/></network>";

    fn rule(cidr: &str, protocol: EgressProtocol, port: Option<u16>) -> EgressRule {
        EgressRule {
            cidr: cidr.into(),
            protocol,
            port,
            end_port: None,
        }
    }

    #[test]
    fn the_network_gives_the_hosts_address_and_the_guests_subnet() {
        let facts = network_facts(NAT).unwrap();
        assert_eq!(facts.host_addresses, [Ipv4Addr::new(192, 168, 122, 1)]);
        assert_eq!(
            facts.subnets,
            [Ipv4Cidr::parse("192.168.122.0/24").unwrap()]
        );
        let prefixed = network_facts("<network><ip address='10.9.0.1' prefix='16'/></network>");
        assert_eq!(
            prefixed.unwrap().subnets,
            [Ipv4Cidr::parse("10.9.0.0/16").unwrap()]
        );
        assert!(network_facts("<network><ip address=").is_err());
    }

    #[test]
    fn always_denied_unless_opted_out_by_name() {
        let facts = network_facts(NAT).unwrap();
        let egress = ClassEgress {
            allow: vec![rule("10.0.0.0/8", EgressProtocol::Tcp, Some(443))],
            dns_resolver: Some("192.168.122.1".into()),
            allow_always_denied: Vec::new(),
        };
        let all = policy(&egress, &facts).unwrap();
        assert_eq!(
            all.denied
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>(),
            ["169.254.0.0/16", "192.168.122.1/32", "192.168.122.0/24"]
        );
        assert_eq!(all.dns_resolver, Some(Ipv4Addr::new(192, 168, 122, 1)));
        assert_eq!(all.allow[0].ports, Some(PortRange::single(443)));
        for (opt_out, left) in [
            (AlwaysDenied::LinkLocal, 2),
            (AlwaysDenied::HostAddresses, 2),
            (AlwaysDenied::GuestToGuest, 2),
        ] {
            let opted = ClassEgress {
                allow_always_denied: vec![opt_out],
                ..egress.clone()
            };
            let policy = policy(&opted, &facts).unwrap();
            assert_eq!(policy.denied.len(), left, "{opt_out:?}");
        }
    }

    #[test]
    fn a_rule_the_crd_would_refuse_is_refused_here_too() {
        let facts = NetworkFacts::default();
        for bad in [
            ClassEgress {
                allow: vec![rule("10.0.0.1/8", EgressProtocol::Any, None)],
                ..ClassEgress::default()
            },
            ClassEgress {
                dns_resolver: Some("resolver.example".into()),
                ..ClassEgress::default()
            },
        ] {
            let Err(Error::Core(Core::Invalid { reason, .. })) = policy(&bad, &facts) else {
                panic!("{bad:?} accepted");
            };
            assert_eq!(reason, reasons::EGRESS_FILTER_FAILED);
        }
    }
}

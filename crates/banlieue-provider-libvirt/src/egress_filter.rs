//! A VM's egress policy as a libvirt network filter (nwfilter): a pure function of the policy.
//!
//! Each VM gets a filter of its own, referenced from its interface (`<filterref>`, see
//! [`crate::domain_xml`]). Redefining the filter under the same name makes libvirt instantiate
//! the new rules on the running VM, so narrowing a policy is one define. libvirt replaces a
//! filter only when the new definition carries the UUID it has (otherwise: "filter … already
//! exists with uuid …"), so the document always carries [`filter_uuid`], which the name
//! alone determines.
//!
//! The rules, lowest priority first (libvirt instantiates lower priorities first):
//!
//! | priority | action | what                                                                 |
//! |---------:|--------|----------------------------------------------------------------------|
//! |     -900 | accept | ARP, both directions                                                 |
//! |     -800 | accept | packets of established or related connections, both directions      |
//! |     -700 | accept | DHCP requests (UDP 68 → 67)                                          |
//! |     -600 | accept | DNS (UDP and TCP 53) to the resolver, when one is named              |
//! |     -500 | drop   | DNS (UDP and TCP 53) to anything else; all DNS when none is named    |
//! |     -400 | drop   | each denied destination                                              |
//! |        0 | accept | each allow rule                                                      |
//! |      900 | drop   | all other IPv4, and all IPv6                                         |
//!
//! How libvirt turns these into iptables rules (`nwfilter_ebiptables_driver.c`) shapes three
//! choices:
//! - A rule without a `state` attribute is instantiated on the VM's outgoing chain and, with
//!   source and destination swapped, on the chain of *bridged* traffic towards the VM: an
//!   accept there admits the replies (`ESTABLISHED`), a drop there refuses traffic from the
//!   denied addresses, and the final drop refuses every bridged packet towards the VM that
//!   nothing accepted. Routed traffic towards the VM (a NAT network) and traffic the host
//!   itself sends never pass that chain.
//! - A rule *with* a `state` attribute and `direction='out'` is instantiated on the outgoing
//!   chains only. The allow rules therefore carry no `state`, so that their replies come back
//!   on a bridged network too, and the established-connections rule is `inout`.
//! - Every iptables rule is instantiated on the chain of traffic from the VM to the host
//!   itself (INPUT) as well, which is where DHCP, DNS to a resolver on the host and the
//!   replies of SSH sessions from the host go.

use std::fmt;
use std::net::Ipv4Addr;

pub use banlieue_api::egress::{CidrError, Ipv4Cidr};

use quick_xml::Writer;
use quick_xml::events::BytesText;
use sha2::{Digest, Sha256};

/// The most allow rules a policy may have: each becomes three iptables rules per interface
/// (outgoing, towards the VM, towards the host), and a claim must not grow the host's
/// firewall without bound.
pub const MAX_ALLOW_RULES: usize = 64;
/// The most denied destinations a policy may have (see [`MAX_ALLOW_RULES`]).
pub const MAX_DENIED: usize = 16;
/// The longest filter name: libvirt keeps a filter as `<name>.xml` in its configuration
/// directory, and a file name has at most 255 bytes.
pub const MAX_FILTER_NAME_LEN: usize = 251;

// libvirt orders rules by priority, not by their place in the document, so each step of the
// table above has one of its own. Rules of one step share it: they have one action, so their
// order among themselves changes nothing.
const PRIORITY_ARP: i16 = -900;
const PRIORITY_ESTABLISHED: i16 = -800;
const PRIORITY_DHCP: i16 = -700;
const PRIORITY_RESOLVER: i16 = -600;
const PRIORITY_OTHER_DNS: i16 = -500;
const PRIORITY_DENIED: i16 = -400;
const PRIORITY_ALLOW: i16 = 0;
const PRIORITY_DEFAULT_DROP: i16 = 900;

/// What a VM may reach. Anything not allowed is dropped; a denied destination is dropped even
/// where an allow rule covers it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EgressPolicy {
    pub allow: Vec<AllowRule>,
    /// The one DNS server the VM may ask; `None`: no DNS at all, whatever the allow rules say.
    pub dns_resolver: Option<Ipv4Addr>,
    /// Destinations refused whatever the allow rules say: link-local, the host's addresses,
    /// the management network, the guest network itself. A resolver among them still
    /// answers DNS, and nothing else.
    pub denied: Vec<Ipv4Cidr>,
}

/// New connections the VM may open.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AllowRule {
    pub destination: Ipv4Cidr,
    pub protocol: Protocol,
    /// Destination ports; TCP and UDP only. `None` is every port.
    pub ports: Option<PortRange>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Protocol {
    Tcp,
    Udp,
    Icmp,
    /// Every IPv4 protocol.
    Any,
}

impl Protocol {
    fn carries_ports(self) -> bool {
        matches!(self, Protocol::Tcp | Protocol::Udp)
    }

    /// The nwfilter element that matches this protocol over IPv4.
    fn element(self) -> &'static str {
        match self {
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
            Protocol::Icmp => "icmp",
            Protocol::Any => "all",
        }
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
            Protocol::Icmp => "icmp",
            Protocol::Any => "any",
        })
    }
}

/// Ports `first` to `last`, both included.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PortRange {
    pub first: u16,
    pub last: u16,
}

impl PortRange {
    pub fn single(port: u16) -> PortRange {
        PortRange {
            first: port,
            last: port,
        }
    }
}

impl fmt::Display for PortRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.first == self.last {
            write!(f, "{}", self.first)
        } else {
            write!(f, "{}-{}", self.first, self.last)
        }
    }
}

/// A policy or name the filter is not written for.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EgressError {
    #[error(transparent)]
    Cidr(#[from] CidrError),
    #[error("allow {protocol} to {destination}: ports apply to tcp and udp only")]
    PortsWithoutTransport {
        protocol: Protocol,
        destination: Ipv4Cidr,
    },
    #[error("allow {protocol} to {destination}: port range {first}-{last} ends before it starts")]
    PortRangeReversed {
        protocol: Protocol,
        destination: Ipv4Cidr,
        first: u16,
        last: u16,
    },
    #[error("allow {protocol} to {destination}: port 0 is no destination port")]
    PortZero {
        protocol: Protocol,
        destination: Ipv4Cidr,
    },
    #[error("write {count} allow rules: at most {MAX_ALLOW_RULES} are allowed")]
    TooManyAllowRules { count: usize },
    #[error("write {count} denied destinations: at most {MAX_DENIED} are allowed")]
    TooManyDenied { count: usize },
    #[error(
        "name a filter {name:?}: expected 1 to {MAX_FILTER_NAME_LEN} of A-Z, a-z, 0-9, '-', \
         '_' and '.', starting with a letter, digit or '_'"
    )]
    FilterName { name: String },
}

/// The UUID of the filter `name`: the first 16 bytes of a SHA-256 of the name, as a version 8
/// (custom) UUID. Every definition of the filter carries it, so defining it again replaces it
/// in place with no lookup first; and a filter of the same name that something else defined
/// has another UUID, so libvirt refuses the definition rather than let it be overwritten.
pub fn filter_uuid(name: &str) -> uuid::Uuid {
    let digest = Sha256::new()
        .chain_update(b"banlieue egress filter\0")
        .chain_update(name.as_bytes())
        .finalize();
    let mut bytes = [0; 16];
    bytes.copy_from_slice(&digest[..16]);
    uuid::Builder::from_custom_bytes(bytes).into_uuid()
}

/// The filter `name` enforcing `policy` on the traffic a VM sends, for NWFILTER_DEFINE_XML.
/// Refuses a name libvirt could not keep as a file, more rules than [`MAX_ALLOW_RULES`] and
/// [`MAX_DENIED`], and ports on a rule that has none (ICMP, any) or that no packet can match
/// (port 0, a range that ends before it starts).
pub fn filter_xml(name: &str, policy: &EgressPolicy) -> Result<String, EgressError> {
    check_name(name)?;
    check_policy(policy)?;
    let mut w = Writer::new_with_indent(Vec::new(), b' ', 2);
    // Writing into a Vec cannot fail; the io::Result is an artefact of the generic writer.
    let written = write_filter(&mut w, name, policy);
    debug_assert!(written.is_ok());
    Ok(String::from_utf8(w.into_inner()).unwrap_or_default())
}

fn check_name(name: &str) -> Result<(), EgressError> {
    let allowed = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.');
    let fits = !name.is_empty()
        && name.len() <= MAX_FILTER_NAME_LEN
        && name.bytes().all(allowed)
        && !name.starts_with(['-', '.']);
    if fits {
        Ok(())
    } else {
        Err(EgressError::FilterName {
            name: name.to_owned(),
        })
    }
}

fn check_policy(policy: &EgressPolicy) -> Result<(), EgressError> {
    if policy.allow.len() > MAX_ALLOW_RULES {
        return Err(EgressError::TooManyAllowRules {
            count: policy.allow.len(),
        });
    }
    if policy.denied.len() > MAX_DENIED {
        return Err(EgressError::TooManyDenied {
            count: policy.denied.len(),
        });
    }
    for rule in &policy.allow {
        let Some(ports) = rule.ports else { continue };
        let (protocol, destination) = (rule.protocol, rule.destination);
        if !protocol.carries_ports() {
            return Err(EgressError::PortsWithoutTransport {
                protocol,
                destination,
            });
        }
        if ports.first == 0 {
            return Err(EgressError::PortZero {
                protocol,
                destination,
            });
        }
        if ports.first > ports.last {
            return Err(EgressError::PortRangeReversed {
                protocol,
                destination,
                first: ports.first,
                last: ports.last,
            });
        }
    }
    Ok(())
}

/// The attributes of a rule's match element, in the order they are written.
type Matches = Vec<(&'static str, String)>;

fn write_filter(w: &mut Writer<Vec<u8>>, name: &str, policy: &EgressPolicy) -> std::io::Result<()> {
    w.create_element("filter")
        .with_attribute(("name", name))
        .with_attribute(("chain", "root"))
        .write_inner_content(|w| {
            w.create_element("uuid")
                .write_text_content(BytesText::new(&filter_uuid(name).to_string()))?;
            // Without ARP the guest cannot find its gateway. No rule here drops it (ARP is
            // ebtables' to filter, the drops below are iptables'), but the filter says so
            // rather than rely on that.
            rule(w, "accept", "inout", PRIORITY_ARP, "arp", Vec::new())?;
            // Before every drop: replies to connections made to the guest (SSH from the host,
            // whose address is denied) leave it, and replies of allowed connections come back.
            let established = vec![("state", "ESTABLISHED,RELATED".to_owned())];
            rule(
                w,
                "accept",
                "inout",
                PRIORITY_ESTABLISHED,
                "all",
                established,
            )?;
            let dhcp = vec![
                ("srcportstart", "68".to_owned()),
                ("dstportstart", "67".to_owned()),
            ];
            rule(w, "accept", "out", PRIORITY_DHCP, "udp", dhcp)?;
            if let Some(resolver) = policy.dns_resolver {
                // Before the denied destinations: a resolver on the host's gateway address
                // answers DNS, and the host stays denied for everything else.
                for element in ["udp", "tcp"] {
                    let mut to_resolver = destination(&Ipv4Cidr::host(resolver));
                    to_resolver.push(("dstportstart", "53".to_owned()));
                    rule(w, "accept", "out", PRIORITY_RESOLVER, element, to_resolver)?;
                }
            }
            // DNS goes to the named resolver or nowhere, whatever the allow rules say: a
            // resolver is where names leak, and "no resolver" means no DNS.
            for element in ["udp", "tcp"] {
                let other_dns = vec![("dstportstart", "53".to_owned())];
                rule(w, "drop", "out", PRIORITY_OTHER_DNS, element, other_dns)?;
            }
            for denied in &policy.denied {
                rule(
                    w,
                    "drop",
                    "out",
                    PRIORITY_DENIED,
                    "all",
                    destination(denied),
                )?;
            }
            for allow in &policy.allow {
                let mut matches = destination(&allow.destination);
                if let Some(ports) = allow.ports {
                    matches.push(("dstportstart", ports.first.to_string()));
                    if ports.last != ports.first {
                        matches.push(("dstportend", ports.last.to_string()));
                    }
                }
                let element = allow.protocol.element();
                rule(w, "accept", "out", PRIORITY_ALLOW, element, matches)?;
            }
            rule(w, "drop", "out", PRIORITY_DEFAULT_DROP, "all", Vec::new())?;
            // No IPv6 is ever allowed: the policy speaks IPv4 only.
            rule(
                w,
                "drop",
                "out",
                PRIORITY_DEFAULT_DROP,
                "all-ipv6",
                Vec::new(),
            )?;
            Ok(())
        })?;
    Ok(())
}

/// `dstipaddr` and `dstipmask` (a prefix length, which libvirt takes as well as a dotted mask).
fn destination(cidr: &Ipv4Cidr) -> Matches {
    vec![
        ("dstipaddr", cidr.address().to_string()),
        ("dstipmask", cidr.prefix().to_string()),
    ]
}

fn rule(
    w: &mut Writer<Vec<u8>>,
    action: &str,
    direction: &str,
    priority: i16,
    element: &str,
    matches: Matches,
) -> std::io::Result<()> {
    w.create_element("rule")
        .with_attribute(("action", action))
        .with_attribute(("direction", direction))
        .with_attribute(("priority", priority.to_string().as_str()))
        .write_inner_content(|w| {
            w.create_element(element)
                .with_attributes(matches.iter().map(|(k, v)| (*k, v.as_str())))
                .write_empty()?;
            Ok(())
        })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cidr(s: &str) -> Ipv4Cidr {
        Ipv4Cidr::parse(s).unwrap()
    }

    fn allow(destination: &str, protocol: Protocol, ports: Option<(u16, u16)>) -> AllowRule {
        AllowRule {
            destination: cidr(destination),
            protocol,
            ports: ports.map(|(first, last)| PortRange { first, last }),
        }
    }

    /// The host's gateway address on the guest network, which is also the resolver.
    const GATEWAY: Ipv4Addr = Ipv4Addr::new(192, 168, 122, 1);

    /// A policy with every kind of rule: a TCP range, a single UDP port, ICMP, any protocol,
    /// a resolver on the host, and the four kinds of denied destination.
    fn mixed() -> EgressPolicy {
        EgressPolicy {
            allow: vec![
                allow("203.0.113.0/24", Protocol::Tcp, Some((8000, 8999))),
                allow("198.51.100.7/32", Protocol::Udp, Some((123, 123))),
                allow("0.0.0.0/0", Protocol::Icmp, None),
                allow("10.20.0.0/16", Protocol::Any, None),
            ],
            dns_resolver: Some(GATEWAY),
            denied: vec![
                // Link-local: the cloud metadata address among others.
                cidr("169.254.0.0/16"),
                // The host's own addresses.
                Ipv4Cidr::host(GATEWAY),
                cidr("10.0.0.5/32"),
                // The management network.
                cidr("10.10.0.0/16"),
                // The guest network: no guest-to-guest.
                cidr("192.168.122.0/24"),
            ],
        }
    }

    #[test]
    fn empty_policy_keeps_only_the_infrastructure() {
        let xml = filter_xml("banlieue-egress-ns-web", &EgressPolicy::default()).unwrap();
        insta::assert_snapshot!(xml);
    }

    #[test]
    fn mixed_policy() {
        let xml = filter_xml("banlieue-egress-ns-web", &mixed()).unwrap();
        insta::assert_snapshot!(xml);
    }

    #[test]
    fn without_a_resolver_no_dns_passes_even_where_a_rule_allows_it() {
        let policy = EgressPolicy {
            allow: vec![allow("0.0.0.0/0", Protocol::Udp, Some((53, 53)))],
            ..EgressPolicy::default()
        };
        let xml = filter_xml("f", &policy).unwrap();
        insta::assert_snapshot!(xml);
    }

    /// The order is the rules' priorities, not their place in the document: libvirt sorts by
    /// priority alone, so each step must have one of its own.
    #[test]
    fn priorities_follow_the_documented_order() {
        let xml = filter_xml("f", &mixed()).unwrap();
        let priorities: Vec<i16> = xml
            .split("priority=\"")
            .skip(1)
            .map(|rest| rest[..rest.find('"').unwrap()].parse().unwrap())
            .collect();
        assert!(priorities.is_sorted(), "{priorities:?}");
        assert!(priorities.iter().all(|p| (-1000..=1000).contains(p)));
        // 1 ARP + 1 established + 1 DHCP + 2 resolver + 2 other DNS + 5 denied + 4 allowed
        // + 2 final drops.
        assert_eq!(priorities.len(), 18);
    }

    #[test]
    fn bad_input_is_refused_with_a_message_naming_it() {
        let tcp_to = |ports| AllowRule {
            destination: cidr("10.0.0.0/8"),
            protocol: Protocol::Tcp,
            ports: Some(ports),
        };
        let cases: Vec<(Result<String, EgressError>, &str)> = vec![
            (
                policy_with(vec![AllowRule {
                    destination: cidr("10.0.0.0/8"),
                    protocol: Protocol::Icmp,
                    ports: Some(PortRange::single(80)),
                }]),
                "allow icmp to 10.0.0.0/8: ports apply to tcp and udp only",
            ),
            (
                policy_with(vec![AllowRule {
                    destination: cidr("0.0.0.0/0"),
                    protocol: Protocol::Any,
                    ports: Some(PortRange::single(80)),
                }]),
                "allow any to 0.0.0.0/0: ports apply to tcp and udp only",
            ),
            (
                policy_with(vec![tcp_to(PortRange {
                    first: 90,
                    last: 80,
                })]),
                "allow tcp to 10.0.0.0/8: port range 90-80 ends before it starts",
            ),
            (
                policy_with(vec![tcp_to(PortRange { first: 0, last: 80 })]),
                "allow tcp to 10.0.0.0/8: port 0 is no destination port",
            ),
            (
                policy_with(vec![tcp_to(PortRange::single(443)); MAX_ALLOW_RULES + 1]),
                "write 65 allow rules: at most 64 are allowed",
            ),
            (
                filter_xml(
                    "f",
                    &EgressPolicy {
                        denied: vec![cidr("10.0.0.0/8"); MAX_DENIED + 1],
                        ..EgressPolicy::default()
                    },
                ),
                "write 17 denied destinations: at most 16 are allowed",
            ),
            (
                filter_xml("../evil", &EgressPolicy::default()),
                "name a filter \"../evil\": expected 1 to 251 of A-Z, a-z, 0-9, '-', '_' and \
                 '.', starting with a letter, digit or '_'",
            ),
        ];
        for (result, expected) in cases {
            let error = result.expect_err(expected);
            assert_eq!(error.to_string(), expected);
        }
    }

    fn policy_with(allow: Vec<AllowRule>) -> Result<String, EgressError> {
        filter_xml(
            "f",
            &EgressPolicy {
                allow,
                ..EgressPolicy::default()
            },
        )
    }

    #[test]
    fn the_uuid_follows_the_name_alone() {
        let uuid = filter_uuid("banlieue-egress-ns-web");
        assert_eq!(uuid, filter_uuid("banlieue-egress-ns-web"));
        assert_ne!(uuid, filter_uuid("banlieue-egress-ns-web2"));
        assert_eq!(uuid.get_version(), Some(uuid::Version::Custom));
        let narrowed = EgressPolicy {
            allow: Vec::new(),
            ..mixed()
        };
        for policy in [mixed(), narrowed] {
            let xml = filter_xml("banlieue-egress-ns-web", &policy).unwrap();
            assert!(xml.contains(&format!("<uuid>{uuid}</uuid>")), "{xml}");
        }
    }

    #[test]
    fn only_names_libvirt_can_keep_are_written() {
        for good in ["a", "banlieue-egress-ns-web.01", "_x", "0ns-web"] {
            assert!(filter_xml(good, &EgressPolicy::default()).is_ok(), "{good}");
        }
        let longest = "n".repeat(MAX_FILTER_NAME_LEN);
        assert!(filter_xml(&longest, &EgressPolicy::default()).is_ok());
        for bad in [
            "",
            "-a",
            ".a",
            "a/b",
            "a b",
            "a'b",
            "a\"/><rule/>",
            "é",
            &"n".repeat(MAX_FILTER_NAME_LEN + 1),
        ] {
            assert_eq!(
                filter_xml(bad, &EgressPolicy::default()),
                Err(EgressError::FilterName { name: bad.into() }),
                "{bad:?}"
            );
        }
    }
}

//! What a member may reach over the network: its class's egress (`VMClass.spec.egress`, the
//! administrator's; ADR-0078). Default deny: a class with `egress` lets its members open
//! connections only to what its rules allow.
//!
//! The CRD refuses what one rule shows to be wrong (a CIDR that is not IPv4 or has host bits
//! set, ports without TCP or UDP, a range that ends before it starts), with CEL's IP and CIDR
//! libraries; [`Ipv4Cidr`] parses the same strictly for the provider.

use std::net::Ipv4Addr;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The most rules a class may allow.
pub const MAX_CLASS_RULES: usize = 64;

/// A class's egress baseline.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClassEgress {
    /// The destinations members may open connections to; everything else is dropped on the
    /// host. Empty: none (replies to connections made to the member still flow).
    #[serde(default)]
    #[schemars(length(max = MAX_CLASS_RULES))]
    pub allow: Vec<EgressRule>,
    /// The one DNS resolver members may query (UDP and TCP port 53), an IPv4 address; no DNS
    /// when absent. Queries to any other address are dropped, whatever `allow` says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 15), extend("x-kubernetes-validations" = [{
        "rule": "isIP(self) && ip(self).family() == 4",
        "message": "dnsResolver must be an IPv4 address"
    }]))]
    pub dns_resolver: Option<String>,
    /// Destinations denied to every member whatever `allow` says, which this class opts out
    /// of, by name: `LinkLocal` (169.254.0.0/16, the metadata address), `HostAddresses` (the
    /// host's own addresses on the member's network), `ManagementNetwork` (the Provider's
    /// management CIDRs), `GuestToGuest` (other members on the same network).
    #[serde(default)]
    #[schemars(length(max = 4))]
    pub allow_always_denied: Vec<AlwaysDenied>,
}

/// The destinations denied unless a class opts out of them by name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum AlwaysDenied {
    LinkLocal,
    HostAddresses,
    ManagementNetwork,
    GuestToGuest,
}

/// One allowed destination.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {
        "rule": "isCIDR(self.cidr) && cidr(self.cidr).ip().family() == 4 && cidr(self.cidr) == cidr(self.cidr).masked()",
        "messageExpression": "'cidr ' + self.cidr + ' is not an IPv4 CIDR with its host bits zero (for example 10.0.0.0/8)'"
    },
    {
        "rule": "!has(self.port) || (has(self.protocol) && (self.protocol == 'TCP' || self.protocol == 'UDP'))",
        "message": "port needs protocol TCP or UDP"
    },
    {
        "rule": "!has(self.endPort) || (has(self.port) && self.endPort >= self.port)",
        "message": "endPort needs port, and may not be below it"
    }
]))]
pub struct EgressRule {
    /// The destination, an IPv4 CIDR (`10.0.0.0/8`; `192.0.2.7/32` for one address).
    #[schemars(length(min = 9, max = 18))]
    pub cidr: String,
    /// `TCP`, `UDP`, `ICMP`, or `Any` (the default: every protocol).
    #[serde(default)]
    pub protocol: EgressProtocol,
    /// The destination port (TCP and UDP), or the first of a range ending at `endPort`; every
    /// port when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 65535))]
    pub port: Option<u16>,
    /// The last port of the range that starts at `port`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 65535))]
    pub end_port: Option<u16>,
}

/// The protocols a rule can name.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "UPPERCASE")]
pub enum EgressProtocol {
    Tcp,
    Udp,
    Icmp,
    #[default]
    #[serde(rename = "Any")]
    Any,
}

/// An IPv4 network: an address with no bits set past its prefix, and a prefix of at most 32.
/// Only [`Ipv4Cidr::new`] and [`Ipv4Cidr::parse`] make one, so every value holds both.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Ipv4Cidr {
    address: Ipv4Addr,
    prefix: u8,
}

impl Ipv4Cidr {
    /// Link-local addresses, the cloud metadata service's among them.
    pub const LINK_LOCAL: Ipv4Cidr = Ipv4Cidr {
        address: Ipv4Addr::new(169, 254, 0, 0),
        prefix: 16,
    };

    /// The network of `prefix` bits that `address` is in (`192.168.122.1`, 24 →
    /// `192.168.122.0/24`); `None` for a prefix over 32.
    pub fn network_of(address: Ipv4Addr, prefix: u8) -> Option<Ipv4Cidr> {
        (prefix <= 32).then(|| Ipv4Cidr {
            address: Ipv4Addr::from(u32::from(address) & mask(prefix)),
            prefix,
        })
    }

    /// `address/prefix`; refused when the prefix exceeds 32 or host bits are set, rather than
    /// masked: `10.0.0.1/8` is more likely a typo than a wish for all of `10.0.0.0/8`.
    pub fn new(address: Ipv4Addr, prefix: u8) -> Result<Ipv4Cidr, CidrError> {
        let input = || format!("{address}/{prefix}");
        if prefix > 32 {
            return Err(CidrError::Prefix { input: input() });
        }
        let network = Ipv4Addr::from(u32::from(address) & mask(prefix));
        if network != address {
            return Err(CidrError::HostBits {
                input: input(),
                network: Ipv4Cidr {
                    address: network,
                    prefix,
                },
            });
        }
        Ok(Ipv4Cidr { address, prefix })
    }

    /// The one address `address` (a `/32`).
    pub fn host(address: Ipv4Addr) -> Ipv4Cidr {
        Ipv4Cidr {
            address,
            prefix: 32,
        }
    }

    /// Exactly `a.b.c.d/n`: decimal octets without leading zeros, a prefix of 0 to 32 without
    /// sign or leading zeros, no spaces, and no host bits set.
    pub fn parse(input: &str) -> Result<Ipv4Cidr, CidrError> {
        let syntax = || CidrError::Syntax {
            input: input.to_owned(),
        };
        let (address, prefix) = input.split_once('/').ok_or_else(syntax)?;
        // Ipv4Addr's parser refuses leading zeros (octal in other parsers) and anything but
        // four decimal octets.
        let address: Ipv4Addr = address.parse().map_err(|_| syntax())?;
        // u8's parser takes a leading `+`; the prefix is digits only.
        if prefix.is_empty()
            || !prefix.bytes().all(|b| b.is_ascii_digit())
            || (prefix.len() > 1 && prefix.starts_with('0'))
        {
            return Err(syntax());
        }
        let prefix = prefix
            .parse::<u8>()
            .ok()
            .filter(|p| *p <= 32)
            .ok_or_else(|| CidrError::Prefix {
                input: input.to_owned(),
            })?;
        Ipv4Cidr::new(address, prefix).map_err(|e| match e {
            CidrError::HostBits { network, .. } => CidrError::HostBits {
                input: input.to_owned(),
                network,
            },
            other => other,
        })
    }

    pub fn address(&self) -> Ipv4Addr {
        self.address
    }

    pub fn prefix(&self) -> u8 {
        self.prefix
    }

    /// Whether every address of `other` is one of this network's.
    pub fn contains(&self, other: &Ipv4Cidr) -> bool {
        self.prefix <= other.prefix
            && u32::from(other.address) & mask(self.prefix) == u32::from(self.address)
    }
}

impl std::str::FromStr for Ipv4Cidr {
    type Err = CidrError;

    fn from_str(s: &str) -> Result<Ipv4Cidr, CidrError> {
        Ipv4Cidr::parse(s)
    }
}

impl std::fmt::Display for Ipv4Cidr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.address, self.prefix)
    }
}

fn mask(prefix: u8) -> u32 {
    // A shift by 32 overflows; a /0 masks nothing in.
    u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0)
}

/// Why a text is not an IPv4 CIDR.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CidrError {
    #[error("parse CIDR {input:?}: expected a.b.c.d/n")]
    Syntax { input: String },
    #[error("parse CIDR {input:?}: the prefix length is above 32")]
    Prefix { input: String },
    #[error("parse CIDR {input:?}: host bits are set (the network is {network})")]
    HostBits { input: String, network: Ipv4Cidr },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_strict_form_parses() {
        for input in [
            "",
            "garbage",
            "10.0.0.0",
            "10.0.0.0/",
            "/8",
            "10.0.0/8",
            "10.0.0.0.0/8",
            "256.0.0.0/8",
            "010.0.0.0/8",
            "10.0.0.0/+8",
            "10.0.0.0/08",
            "10.0.0.0/-1",
            " 10.0.0.0/8",
            "10.0.0.0/8 ",
            "10.0.0.0 /8",
            "10.0.0.0/8/8",
            "::1/128",
        ] {
            assert_eq!(
                Ipv4Cidr::parse(input),
                Err(CidrError::Syntax {
                    input: input.into()
                }),
                "{input:?}"
            );
        }
        assert_eq!(
            Ipv4Cidr::parse("garbage").unwrap_err().to_string(),
            "parse CIDR \"garbage\": expected a.b.c.d/n"
        );
        for (input, address, prefix) in [
            ("0.0.0.0/0", Ipv4Addr::UNSPECIFIED, 0),
            ("10.0.0.0/8", Ipv4Addr::new(10, 0, 0, 0), 8),
            ("192.168.122.1/32", Ipv4Addr::new(192, 168, 122, 1), 32),
        ] {
            let parsed: Ipv4Cidr = input.parse().unwrap();
            assert_eq!((parsed.address(), parsed.prefix()), (address, prefix));
            assert_eq!(parsed.to_string(), input);
        }
    }

    #[test]
    fn contains_is_network_inclusion() {
        let cases = [
            ("0.0.0.0/0", "0.0.0.0/0", true),
            ("0.0.0.0/0", "203.0.113.7/32", true),
            ("10.0.0.0/8", "10.20.0.0/16", true),
            ("10.0.0.0/8", "10.0.0.0/8", true),
            ("10.20.0.0/16", "10.0.0.0/8", false),
            ("10.0.0.0/8", "11.0.0.0/8", false),
            ("10.0.0.0/8", "0.0.0.0/0", false),
            ("192.168.122.1/32", "192.168.122.1/32", true),
            ("192.168.122.1/32", "192.168.122.2/32", false),
            ("192.168.122.0/24", "192.168.122.1/32", true),
            ("192.168.122.0/25", "192.168.122.128/32", false),
        ];
        for (outer, inner, expected) in cases {
            assert_eq!(
                cidr(outer).contains(&cidr(inner)),
                expected,
                "{outer} contains {inner}"
            );
        }
    }

    #[test]
    fn bad_cidrs_are_refused_naming_them() {
        let cases: Vec<(Result<String, CidrError>, &str)> = vec![
            (
                Ipv4Cidr::parse("10.0.0.1/8").map(|c| c.to_string()),
                "parse CIDR \"10.0.0.1/8\": host bits are set (the network is 10.0.0.0/8)",
            ),
            (
                Ipv4Cidr::parse("10.0.0.0/33").map(|c| c.to_string()),
                "parse CIDR \"10.0.0.0/33\": the prefix length is above 32",
            ),
            (
                Ipv4Cidr::parse("10.0.0.0/300").map(|c| c.to_string()),
                "parse CIDR \"10.0.0.0/300\": the prefix length is above 32",
            ),
            (
                Ipv4Cidr::new(Ipv4Addr::new(10, 0, 0, 0), 40).map(|c| c.to_string()),
                "parse CIDR \"10.0.0.0/40\": the prefix length is above 32",
            ),
            (
                Ipv4Cidr::new(Ipv4Addr::new(192, 168, 1, 1), 24).map(|c| c.to_string()),
                "parse CIDR \"192.168.1.1/24\": host bits are set (the network is 192.168.1.0/24)",
            ),
        ];
        for (result, expected) in cases {
            assert_eq!(result.expect_err(expected).to_string(), expected);
        }
    }

    fn cidr(s: &str) -> Ipv4Cidr {
        Ipv4Cidr::parse(s).unwrap()
    }

    #[test]
    fn the_protocols_serialise_as_the_guide_writes_them() {
        let json = serde_json::to_value([
            EgressProtocol::Tcp,
            EgressProtocol::Udp,
            EgressProtocol::Icmp,
            EgressProtocol::Any,
        ])
        .unwrap();
        assert_eq!(json, serde_json::json!(["TCP", "UDP", "ICMP", "Any"]));
    }
}

//! The egress filter against a real libvirtd: what `filter_xml` writes is a filter libvirt's
//! nwfilter driver defines, keeps rule for rule, redefines under the same name (how a
//! narrowed policy reaches a running VM) and undefines; a filter of the same name that
//! something else defined is refused, not overwritten.
//!
//! No domain references the filter, so nothing is instantiated and the host's firewall is
//! never touched: what the rules do to packets is not tested here.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use banlieue_libvirt::proto::remote::{self, procedures as rp};
use banlieue_libvirt::{CaBundle, Client, Identity};
use banlieue_provider_libvirt::egress_filter::{
    AllowRule, EgressPolicy, Ipv4Cidr, PortRange, Protocol, filter_uuid, filter_xml,
};
use banlieue_testenv::libvirtd::{Libvirtd, LibvirtdOptions};
use quick_xml::Reader;
use quick_xml::events::{BytesStart, Event};

const GATEWAY: Ipv4Addr = Ipv4Addr::new(192, 168, 122, 1);

fn cidr(s: &str) -> Ipv4Cidr {
    Ipv4Cidr::parse(s).expect("a CIDR")
}

fn allow(destination: &str, protocol: Protocol, ports: Option<PortRange>) -> AllowRule {
    AllowRule {
        destination: cidr(destination),
        protocol,
        ports,
    }
}

/// Every kind of rule: a TCP range, one UDP port, ICMP to anywhere (a /0), any protocol, a
/// resolver on the host's gateway address, and the four kinds of denied destination.
fn mixed() -> EgressPolicy {
    EgressPolicy {
        allow: vec![
            allow(
                "203.0.113.0/24",
                Protocol::Tcp,
                Some(PortRange {
                    first: 8000,
                    last: 8999,
                }),
            ),
            allow(
                "198.51.100.7/32",
                Protocol::Udp,
                Some(PortRange::single(123)),
            ),
            allow("0.0.0.0/0", Protocol::Icmp, None),
            allow("10.20.0.0/16", Protocol::Any, None),
        ],
        dns_resolver: Some(GATEWAY),
        denied: vec![
            cidr("169.254.0.0/16"),
            Ipv4Cidr::host(GATEWAY),
            cidr("10.10.0.0/16"),
            cidr("192.168.122.0/24"),
        ],
    }
}

/// A rule as both documents spell it, quoting and attribute order aside.
#[derive(Debug, PartialEq, Eq)]
struct Rule {
    attributes: BTreeMap<String, String>,
    /// The match element (`tcp`, `all`, `arp`, …) and its attributes.
    element: String,
    matches: BTreeMap<String, String>,
}

fn attributes(e: &BytesStart<'_>) -> BTreeMap<String, String> {
    e.attributes()
        .map(|a| {
            let a = a.expect("a well-formed attribute");
            (
                String::from_utf8(a.key.as_ref().to_vec()).expect("UTF-8"),
                a.unescape_value().expect("an escaped value").into_owned(),
            )
        })
        .collect()
}

/// The filter's own attributes and its rules, in document order.
fn parse(xml: &str) -> (BTreeMap<String, String>, Vec<Rule>) {
    let mut reader = Reader::from_str(xml);
    let mut filter = BTreeMap::new();
    let mut rules: Vec<Rule> = Vec::new();
    let mut in_rule = false;
    loop {
        match reader.read_event().expect("well-formed XML") {
            Event::Start(e) | Event::Empty(e) if e.name().as_ref() == b"filter" => {
                filter = attributes(&e);
            }
            Event::Start(e) if e.name().as_ref() == b"rule" => {
                in_rule = true;
                rules.push(Rule {
                    attributes: attributes(&e),
                    element: String::new(),
                    matches: BTreeMap::new(),
                });
            }
            Event::Empty(e) if in_rule => {
                let rule = rules.last_mut().expect("inside a rule");
                assert!(rule.element.is_empty(), "one match element per rule: {xml}");
                rule.element = String::from_utf8(e.name().as_ref().to_vec()).expect("UTF-8");
                rule.matches = attributes(&e);
            }
            Event::End(e) if e.name().as_ref() == b"rule" => in_rule = false,
            Event::Eof => break,
            _ => {}
        }
    }
    (filter, rules)
}

async fn connect(d: &Libvirtd) -> Client {
    let identity =
        Identity::from_files(&d.client_cert_path(), &d.client_key_path()).expect("client identity");
    let ca = CaBundle::from_file(&d.ca_cert_path()).expect("CA");
    Client::connect(&d.tls_uri(), &identity, &ca)
        .await
        .expect("connects")
}

async fn define(c: &Client, xml: String) -> remote::RemoteNonnullNwfilter {
    c.call::<rp::NwfilterDefineXml>(&remote::RemoteNwfilterDefineXmlArgs { xml })
        .await
        .expect("libvirt defines the filter")
        .nwfilter
}

async fn read_back(c: &Client, nwfilter: &remote::RemoteNonnullNwfilter) -> String {
    c.call::<rp::NwfilterGetXmlDesc>(&remote::RemoteNwfilterGetXmlDescArgs {
        nwfilter: nwfilter.clone(),
        flags: 0,
    })
    .await
    .expect("libvirt describes the filter")
    .xml
}

/// The test's libvirtd: no skip, a machine that runs these tests has libvirtd
/// (`scripts/setup`).
async fn daemon() -> Libvirtd {
    Libvirtd::start(LibvirtdOptions::default())
        .await
        .expect("libvirtd starts")
}

#[tokio::test]
async fn libvirt_keeps_every_rule_and_takes_a_narrowed_policy_in_place() {
    let d = daemon().await;
    let c = connect(&d).await;
    let name = "banlieue-egress-ns-web-01";

    let written = filter_xml(name, &mixed()).expect("the policy renders");
    let filter = define(&c, written.clone()).await;
    assert_eq!(filter.name, name);
    assert_eq!(&filter.uuid, filter_uuid(name).as_bytes());
    let kept = read_back(&c, &filter).await;
    let (attributes, rules) = parse(&kept);
    assert_eq!(attributes.get("name").map(String::as_str), Some(name));
    assert_eq!(
        attributes.get("chain").map(String::as_str),
        Some("root"),
        "{kept}"
    );
    // 1 ARP + 1 established + 1 DHCP + 2 to the resolver + 2 other DNS + 4 denied + 4 allowed
    // + 2 final drops.
    assert_eq!(kept.matches("<rule ").count(), 17, "{kept}");
    assert_eq!(rules, parse(&written).1, "libvirt kept:\n{kept}");
    let established = &rules[1];
    assert_eq!(established.attributes["direction"], "inout");
    assert_eq!(established.matches["state"], "ESTABLISHED,RELATED");
    let range = rules
        .iter()
        .find(|r| r.element == "tcp" && r.matches.contains_key("dstportend"))
        .expect("the TCP range");
    assert_eq!(
        (
            range.matches["dstipaddr"].as_str(),
            range.matches["dstipmask"].as_str(),
            range.matches["dstportstart"].as_str(),
            range.matches["dstportend"].as_str(),
            range.attributes["priority"].as_str(),
        ),
        ("203.0.113.0", "24", "8000", "8999", "0")
    );
    let last = rules.last().expect("rules");
    assert_eq!(
        (last.element.as_str(), last.attributes["action"].as_str()),
        ("all-ipv6", "drop")
    );

    // A claim narrows the policy: the same name, and so the same UUID, defined again. The
    // filter is replaced in place, as a running VM's would be.
    let narrowed = EgressPolicy {
        allow: vec![allow(
            "203.0.113.0/24",
            Protocol::Tcp,
            Some(PortRange::single(8443)),
        )],
        dns_resolver: None,
        ..mixed()
    };
    let again = define(
        &c,
        filter_xml(name, &narrowed).expect("the narrowed policy renders"),
    )
    .await;
    assert_eq!(again.uuid, filter.uuid, "the same filter");
    let kept = read_back(&c, &again).await;
    // 1 ARP + 1 established + 1 DHCP + 2 DNS drops (no resolver: no DNS) + 4 denied + 1
    // allowed + 2 final drops.
    assert_eq!(kept.matches("<rule ").count(), 12, "{kept}");
    assert_eq!(
        kept.matches("<udp dstportstart='53'/>").count(),
        1,
        "{kept}"
    );
    assert!(!kept.contains("dstipmask='32' dstportstart='53'"), "{kept}");
    assert!(kept.contains("dstportstart='8443'"), "{kept}");

    c.call::<rp::NwfilterUndefine>(&remote::RemoteNwfilterUndefineArgs { nwfilter: again })
        .await
        .expect("libvirt undefines the filter");
    let gone = c
        .call::<rp::NwfilterLookupByName>(&remote::RemoteNwfilterLookupByNameArgs {
            name: name.into(),
        })
        .await
        .expect_err("the filter is gone");
    assert!(gone.is_not_found(), "{gone}");
}

#[tokio::test]
async fn a_filter_of_the_name_defined_by_something_else_is_refused() {
    let d = daemon().await;
    let c = connect(&d).await;
    let name = "banlieue-egress-ns-taken";
    // No UUID: libvirt makes a random one.
    let foreign = define(&c, format!("<filter name='{name}' chain='root'/>")).await;
    let refused = c
        .call::<rp::NwfilterDefineXml>(&remote::RemoteNwfilterDefineXmlArgs {
            xml: filter_xml(name, &mixed()).expect("the policy renders"),
        })
        .await
        .expect_err("libvirt refuses to replace a filter under another UUID");
    assert!(
        refused.to_string().contains("already exists with uuid"),
        "{refused}"
    );
    let kept = read_back(&c, &foreign).await;
    assert!(
        !kept.contains("<rule"),
        "the foreign filter is untouched: {kept}"
    );
}

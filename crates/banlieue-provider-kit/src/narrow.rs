//! Narrowing a Provider's declaration to what its host (or vCenter) has, the part every
//! backend shares: a declared storage or network class stays in a failure domain only when its
//! target exists there, each one that does not is named, and the Ready condition says which.
//! Features are copied as declared, never discovered (ADR-0039).

use std::collections::BTreeSet;

use banlieue_api::conditions::{self, Condition, reasons, status, types};
use banlieue_api::{NetworkClassMapping, ProviderCapabilities, StorageClassMapping};

/// How a backend names the targets it looks for, in the lines naming what is absent.
#[derive(Clone, Copy, Debug)]
pub struct Words<'a> {
    /// What a storage class's `target.pool` is there: `storage pool`, `datastore`.
    pub storage: &'a str,
    /// Appended to each line: where the target was looked for (`in datacenter "dc"`), or
    /// nothing.
    pub place: Option<&'a str>,
}

/// The declared storage and network classes whose target is among `pools` and `networks`, in
/// declaration order; a line per absent one (`storage pool "x" (class "y")`) is added to
/// `missing`.
pub fn present_classes(
    declared: &ProviderCapabilities,
    pools: &BTreeSet<String>,
    networks: &BTreeSet<String>,
    words: Words<'_>,
    missing: &mut Vec<String>,
) -> (Vec<StorageClassMapping>, Vec<NetworkClassMapping>) {
    let place = words.place.map(|p| format!(" {p}")).unwrap_or_default();
    let storage = declared
        .storage_classes
        .iter()
        .filter(|c| {
            let present = pools.contains(&c.target.pool);
            if !present {
                missing.push(format!(
                    "{} {:?} (class {:?}){place}",
                    words.storage, c.target.pool, c.name
                ));
            }
            present
        })
        .cloned()
        .collect();
    let network = declared
        .network_classes
        .iter()
        .filter(|c| {
            let present = networks.contains(&c.target.network);
            if !present {
                missing.push(format!(
                    "network {:?} (class {:?}){place}",
                    c.target.network, c.name
                ));
            }
            present
        })
        .cloned()
        .collect();
    (storage, network)
}

/// Where a probe looked, for the Ready condition's message.
#[derive(Clone, Copy, Debug)]
pub struct Reach<'a> {
    /// What was connected to: the host's name, the vCenter's endpoint.
    pub connected_to: &'a str,
    /// `on <host>`, `in <endpoint>`: where the absent targets were looked for.
    pub absent: &'a str,
    /// What every declaration names there: `pool and network`.
    pub declared: &'a str,
}

/// The Ready condition after a probe that reached its host: Connected when nothing declared is
/// absent, else CapabilitiesIncomplete naming every absent target.
pub fn ready_condition(missing: &[String], reach: Reach<'_>, generation: Option<i64>) -> Condition {
    if missing.is_empty() {
        conditions::new(
            types::READY,
            status::TRUE,
            reasons::CONNECTED,
            format!(
                "connected to {}; every declared {} exists",
                reach.connected_to, reach.declared
            ),
            generation,
        )
    } else {
        conditions::new(
            types::READY,
            status::FALSE,
            reasons::CAPABILITIES_INCOMPLETE,
            format!(
                "declared but absent {}: {}",
                reach.absent,
                missing.join(", ")
            ),
            generation,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use banlieue_api::{NetworkTarget, StorageTarget};

    fn declared() -> ProviderCapabilities {
        ProviderCapabilities {
            storage_classes: vec![
                StorageClassMapping {
                    name: "gold".into(),
                    target: StorageTarget {
                        pool: "nvme".into(),
                    },
                },
                StorageClassMapping {
                    name: "standard".into(),
                    target: StorageTarget {
                        pool: "default".into(),
                    },
                },
            ],
            network_classes: vec![NetworkClassMapping {
                name: "prod".into(),
                target: NetworkTarget {
                    network: "br-prod".into(),
                },
            }],
            ..ProviderCapabilities::default()
        }
    }

    #[test]
    fn absent_targets_are_dropped_and_named_in_declaration_order() {
        let pools = BTreeSet::from(["default".to_owned()]);
        let mut missing = vec!["earlier".to_owned()];
        let words = Words {
            storage: "datastore",
            place: Some("in datacenter \"DC0\""),
        };
        let (storage, network) =
            present_classes(&declared(), &pools, &BTreeSet::new(), words, &mut missing);
        assert_eq!(
            storage.iter().map(|c| c.name.as_str()).collect::<Vec<_>>(),
            ["standard"]
        );
        assert!(network.is_empty());
        assert_eq!(
            missing,
            [
                "earlier",
                "datastore \"nvme\" (class \"gold\") in datacenter \"DC0\"",
                "network \"br-prod\" (class \"prod\") in datacenter \"DC0\"",
            ]
        );
    }

    #[test]
    fn ready_says_connected_or_what_is_absent() {
        let reach = Reach {
            connected_to: "edge-7",
            absent: "on edge-7",
            declared: "pool and network",
        };
        let ready = ready_condition(&[], reach, Some(3));
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("True", "Connected")
        );
        assert_eq!(
            ready.message,
            "connected to edge-7; every declared pool and network exists"
        );
        assert_eq!(ready.observed_generation, Some(3));
        let missing = [
            "storage pool \"x\" (class \"y\")".to_owned(),
            "network \"n\" (class \"m\")".to_owned(),
        ];
        let ready = ready_condition(&missing, reach, None);
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("False", "CapabilitiesIncomplete")
        );
        assert_eq!(
            ready.message,
            "declared but absent on edge-7: storage pool \"x\" (class \"y\"), network \"n\" (class \"m\")"
        );
    }
}

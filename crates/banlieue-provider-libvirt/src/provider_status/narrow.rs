//! Narrowing a Provider's declared capabilities to what its host has: a pure function over
//! what the probe saw, so the decision is tested without a host.

use std::collections::BTreeSet;

use banlieue_api::conditions::Condition;
use banlieue_api::{DomainCapacity, FailureDomain, ProviderCapabilities};
use banlieue_provider_kit::narrow::{Reach, Words, present_classes};

/// What the probe found on the host.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HostInventory {
    /// CONNECT_GET_HOSTNAME: the failure domain's name.
    pub hostname: String,
    pub pools: BTreeSet<String>,
    pub networks: BTreeSet<String>,
    /// NODE_GET_INFO: the host's memory and CPUs.
    pub capacity: Option<DomainCapacity>,
}

/// The single failure domain and what was declared but not found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Narrowed {
    pub failure_domain: FailureDomain,
    /// `storage pool "x"` / `network "y"`, in declaration order.
    pub missing: Vec<String>,
}

/// Keeps the declared classes whose pool or network exists; features are copied as declared,
/// never discovered (ADR-0039).
pub fn narrow(declared: &ProviderCapabilities, host: &HostInventory) -> Narrowed {
    let mut missing = Vec::new();
    let words = Words {
        storage: "storage pool",
        place: None,
    };
    let (storage_classes, network_classes) =
        present_classes(declared, &host.pools, &host.networks, words, &mut missing);
    Narrowed {
        failure_domain: FailureDomain {
            name: host.hostname.clone(),
            storage_classes,
            network_classes,
            features: declared.features.clone(),
            capacity: host.capacity.clone(),
        },
        missing,
    }
}

/// The Ready condition after a successful probe.
pub fn ready_condition(narrowed: &Narrowed, generation: Option<i64>) -> Condition {
    let host = &narrowed.failure_domain.name;
    let reach = Reach {
        connected_to: host,
        absent: &format!("on {host}"),
        declared: "pool and network",
    };
    banlieue_provider_kit::narrow::ready_condition(&narrowed.missing, reach, generation)
}

#[cfg(test)]
mod tests {
    use super::*;
    use banlieue_api::{NetworkClassMapping, NetworkTarget, StorageClassMapping, StorageTarget};

    fn declared() -> ProviderCapabilities {
        ProviderCapabilities {
            storage_classes: vec![
                StorageClassMapping {
                    name: "gold".into(),
                    target: StorageTarget {
                        pool: "nvme-pool".into(),
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
            features: vec!["vtpm".into()],
            backing_file_volumes: Vec::new(),
            memory_overcommit_percent: None,
            vsphere: None,
            resume_reserve: None,
            save_storage: None,
        }
    }

    #[test]
    fn absent_pools_are_dropped_and_named() {
        let host = HostInventory {
            hostname: "kvm-7".into(),
            pools: ["default".to_owned()].into(),
            networks: ["br-prod".to_owned(), "other".to_owned()].into(),
            capacity: Some(DomainCapacity {
                memory_bytes: 16 << 30,
                cpus: 8,
            }),
        };
        let n = narrow(&declared(), &host);
        assert_eq!(n.failure_domain.name, "kvm-7");
        assert_eq!(n.failure_domain.storage_classes.len(), 1);
        assert_eq!(n.failure_domain.storage_classes[0].name, "standard");
        assert_eq!(n.failure_domain.network_classes.len(), 1);
        assert_eq!(n.failure_domain.features, vec!["vtpm".to_owned()]);
        assert_eq!(
            n.failure_domain.capacity.as_ref().map(|c| c.memory_bytes),
            Some(16 << 30),
            "the measured capacity is published as measured"
        );
        let c = ready_condition(&n, Some(3));
        assert_eq!(c.status, "False");
        assert_eq!(c.reason, "CapabilitiesIncomplete");
        assert!(c.message.contains("\"nvme-pool\""), "{}", c.message);
        assert!(!c.message.contains("br-prod"), "{}", c.message);
    }

    #[test]
    fn everything_present_is_ready() {
        let host = HostInventory {
            hostname: "kvm-7".into(),
            pools: ["default".to_owned(), "nvme-pool".to_owned()].into(),
            networks: ["br-prod".to_owned()].into(),
            capacity: None,
        };
        let n = narrow(&declared(), &host);
        assert!(n.missing.is_empty());
        let c = ready_condition(&n, None);
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("True", "Connected")
        );
    }

    #[test]
    fn absent_networks_are_named_too() {
        let host = HostInventory {
            hostname: "h".into(),
            pools: ["default".to_owned(), "nvme-pool".to_owned()].into(),
            networks: BTreeSet::new(),
            capacity: None,
        };
        let n = narrow(&declared(), &host);
        assert_eq!(
            n.missing,
            vec!["network \"br-prod\" (class \"prod\")".to_owned()]
        );
        assert!(n.failure_domain.network_classes.is_empty());
    }
}

//! Narrowing a vSphere Provider's declaration to what vCenter has: a pure function over what
//! the probe saw, so the decision is tested without a vCenter.
//!
//! Each declared cluster that exists is one failure domain, `<datacenter>/<cluster>`. Storage
//! classes name a datastore (`target.pool`) and network classes a network
//! (`target.network`) of the datacenter; each failure domain keeps those its datacenter has.
//! Features are copied as declared (ADR-0039). A cluster's capacity is measured, not declared:
//! its hosts' memory and threads as vCenter sums them, which the scheduler limits the cluster
//! to as it limits a libvirt host.

use std::collections::{BTreeMap, BTreeSet};

use banlieue_api::conditions::Condition;
use banlieue_api::vsphere::failure_domain_name;
use banlieue_api::{DomainCapacity, FailureDomain, ProviderCapabilities};
use banlieue_provider_kit::narrow::{Reach, Words, present_classes};

/// What the probe found in one datacenter.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DatacenterInventory {
    pub clusters: BTreeSet<String>,
    /// What vCenter reports of each cluster's size, by cluster name (absent: not reported).
    pub capacities: BTreeMap<String, DomainCapacity>,
    pub datastores: BTreeSet<String>,
    pub networks: BTreeSet<String>,
}

/// What the probe found, by datacenter name.
pub type Inventory = BTreeMap<String, DatacenterInventory>;

/// The failure domains that exist and what was declared but not found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Narrowed {
    pub failure_domains: Vec<FailureDomain>,
    /// `cluster "x" in datacenter "y"`, …, in declaration order.
    pub missing: Vec<String>,
}

/// One failure domain per declared cluster that exists, in declaration order.
pub fn narrow(declared: &ProviderCapabilities, found: &Inventory) -> Narrowed {
    let mut missing = Vec::new();
    let mut failure_domains = Vec::new();
    let datacenters = declared
        .vsphere
        .as_ref()
        .map(|v| v.datacenters.as_slice())
        .unwrap_or_default();
    if datacenters.iter().all(|dc| dc.clusters.is_empty()) {
        missing.push("no datacenter and cluster is declared (spec.capabilities.vsphere)".into());
    }
    for dc in datacenters {
        let Some(inventory) = found.get(&dc.name) else {
            missing.push(format!("datacenter {:?}", dc.name));
            continue;
        };
        let place = format!("in datacenter {:?}", dc.name);
        let words = Words {
            storage: "datastore",
            place: Some(&place),
        };
        let (storage_classes, network_classes) = present_classes(
            declared,
            &inventory.datastores,
            &inventory.networks,
            words,
            &mut missing,
        );
        for cluster in &dc.clusters {
            if !inventory.clusters.contains(cluster) {
                missing.push(format!("cluster {cluster:?} in datacenter {:?}", dc.name));
                continue;
            }
            failure_domains.push(FailureDomain {
                name: failure_domain_name(&dc.name, cluster),
                storage_classes: storage_classes.clone(),
                network_classes: network_classes.clone(),
                features: declared.features.clone(),
                capacity: inventory.capacities.get(cluster).cloned(),
            });
        }
    }
    Narrowed {
        failure_domains,
        missing,
    }
}

/// The Ready condition after a successful probe of `endpoint`.
pub fn ready_condition(narrowed: &Narrowed, endpoint: &str, generation: Option<i64>) -> Condition {
    let reach = Reach {
        connected_to: endpoint,
        absent: &format!("in {endpoint}"),
        declared: "datacenter, cluster, datastore and network",
    };
    banlieue_provider_kit::narrow::ready_condition(&narrowed.missing, reach, generation)
}

#[cfg(test)]
mod tests {
    use super::*;
    use banlieue_api::{
        NetworkClassMapping, NetworkTarget, StorageClassMapping, StorageTarget,
        VSphereCapabilities, VSphereDatacenter,
    };

    fn declared() -> ProviderCapabilities {
        ProviderCapabilities {
            storage_classes: vec![StorageClassMapping {
                name: "standard".into(),
                target: StorageTarget {
                    pool: "LocalDS_0".into(),
                },
            }],
            network_classes: vec![NetworkClassMapping {
                name: "prod".into(),
                target: NetworkTarget {
                    network: "VM Network".into(),
                },
            }],
            features: vec!["vtpm".into()],
            backing_file_volumes: Vec::new(),
            memory_overcommit_percent: None,
            vsphere: Some(VSphereCapabilities {
                datacenters: vec![
                    VSphereDatacenter {
                        name: "DC0".into(),
                        clusters: vec!["DC0_C0".into(), "DC0_C9".into(), "DC0_C1".into()],
                    },
                    VSphereDatacenter {
                        name: "DC7".into(),
                        clusters: vec!["DC7_C0".into()],
                    },
                ],
                template_folders: Vec::new(),
                vm_folders: Vec::new(),
            }),
            resume_reserve: None,
            save_storage: None,
        }
    }

    fn found() -> Inventory {
        let set = |items: &[&str]| items.iter().map(|s| (*s).to_owned()).collect();
        [(
            "DC0".to_owned(),
            DatacenterInventory {
                clusters: set(&["DC0_C0", "DC0_C1"]),
                capacities: [(
                    "DC0_C1".to_owned(),
                    DomainCapacity {
                        memory_bytes: 4 << 30,
                        cpus: 2,
                    },
                )]
                .into(),
                datastores: set(&["LocalDS_0"]),
                networks: set(&["VM Network"]),
            },
        )]
        .into()
    }

    #[test]
    fn one_failure_domain_per_declared_cluster_that_exists() {
        let n = narrow(&declared(), &found());
        let names: Vec<_> = n.failure_domains.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(names, ["DC0/DC0_C0", "DC0/DC0_C1"]);
        assert_eq!(
            n.missing,
            [
                "cluster \"DC0_C9\" in datacenter \"DC0\"",
                "datacenter \"DC7\""
            ]
        );
        let d = &n.failure_domains[0];
        assert_eq!(
            d.capacity, None,
            "a cluster whose size vCenter does not report"
        );
        assert_eq!(
            n.failure_domains[1].capacity,
            Some(DomainCapacity {
                memory_bytes: 4 << 30,
                cpus: 2
            })
        );
        assert_eq!(d.storage_classes.len(), 1);
        assert_eq!(d.network_classes.len(), 1);
        assert_eq!(d.features, ["vtpm"]);
        let c = ready_condition(&n, "https://vc/sdk", Some(3));
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("False", "CapabilitiesIncomplete")
        );
        assert!(
            c.message.contains("DC0_C9") && c.message.contains("DC7"),
            "{}",
            c.message
        );
    }

    #[test]
    fn absent_datastores_and_networks_are_left_out_and_named() {
        let mut found = found();
        if let Some(dc) = found.get_mut("DC0") {
            dc.datastores.clear();
            dc.networks.clear();
        }
        let mut declared = declared();
        if let Some(v) = declared.vsphere.as_mut() {
            v.datacenters.truncate(1);
            v.datacenters[0].clusters = vec!["DC0_C0".into()];
        }
        let n = narrow(&declared, &found);
        assert_eq!(n.failure_domains.len(), 1);
        assert!(n.failure_domains[0].storage_classes.is_empty());
        assert!(n.failure_domains[0].network_classes.is_empty());
        assert_eq!(n.missing.len(), 2, "{:?}", n.missing);
        assert!(n.missing[0].starts_with("datastore \"LocalDS_0\""));
    }

    #[test]
    fn everything_present_is_connected() {
        let mut declared = declared();
        if let Some(v) = declared.vsphere.as_mut() {
            v.datacenters.truncate(1);
            v.datacenters[0].clusters.retain(|c| c != "DC0_C9");
        }
        let n = narrow(&declared, &found());
        assert!(n.missing.is_empty());
        let c = ready_condition(&n, "https://vc/sdk", None);
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("True", "Connected")
        );
    }

    #[test]
    fn nothing_declared_is_not_ready() {
        let n = narrow(&ProviderCapabilities::default(), &found());
        assert!(n.failure_domains.is_empty());
        assert_eq!(ready_condition(&n, "e", None).status, "False");
    }
}

//! The storage pool, network and volumes a LibvirtMachine uses on its host: only those its
//! Provider declared, the refusals when they are absent, and the volumes that are its own to
//! delete. No I/O here.

use banlieue_api::LibvirtMachine;
use banlieue_api::conditions::reasons;
use banlieue_provider_kit::error::Core;

use super::domain::MachineNames;
use crate::error::Error;

/// The message of the guide's troubleshooting table for an absent pool.
pub fn pool_missing(pool: &str) -> Error {
    Error::Core(Core::Invalid {
        reason: reasons::STORAGE_POOL_NOT_FOUND,
        message: format!("storage pool {pool} does not exist"),
    })
}

/// The message of the guide's troubleshooting table for an absent image volume.
pub fn volume_missing(volume: &str, pool: &str) -> Error {
    Error::Core(Core::Invalid {
        reason: reasons::VOLUME_NOT_IN_POOL,
        message: format!("volume {volume} is not in pool {pool}"),
    })
}

/// A volume of the machine's name that this machine did not record as its own.
pub fn volume_not_owned(volume: &str, pool: &str) -> Error {
    Error::Core(Core::Invalid {
        reason: crate::error::provider_reasons::VOLUME_NOT_OWNED,
        message: format!(
            "volume {volume} already exists in pool {pool}, but this LibvirtMachine did not \
             create it (it is not in status.volumes); it is neither reused nor deleted \
             (rename or remove it)"
        ),
    })
}

/// The volumes teardown may delete: those recorded in status, and, when the domain found is
/// this machine's own, the volumes it was defined with (machines provisioned before volumes
/// were recorded).
pub fn owned_volumes(
    machine: &LibvirtMachine,
    names: &MachineNames,
    domain_is_ours: bool,
) -> Vec<String> {
    let mut owned: Vec<String> = machine
        .status
        .as_ref()
        .map(|s| s.volumes.clone())
        .unwrap_or_default()
        .into_iter()
        // Only names this machine could have made: status is the provider's to write, but
        // a deletion never reaches beyond the machine's own names.
        .filter(|v| *v == names.os_volume || *v == names.cidata_volume)
        .collect();
    if domain_is_ours {
        for v in [&names.os_volume, &names.cidata_volume] {
            if !owned.contains(v) {
                owned.push(v.clone());
            }
        }
    }
    owned
}

/// The message for an absent network.
pub fn network_missing(network: &str) -> Error {
    Error::Core(Core::Invalid {
        reason: reasons::NETWORK_NOT_FOUND,
        message: format!("network {network} does not exist"),
    })
}

/// Refuses a machine whose `spec.pool` or `spec.network` is not a target its Provider
/// declared. Whoever may write a machine names them, and the host has more than the Provider
/// offers (another tenant's isolated network, the host's NAT, a bridge onto the management
/// LAN; ADR-0039): existing on the host is not enough. The field is named in the message.
pub fn undeclared_target(
    spec: &banlieue_api::LibvirtMachineSpec,
    provider: &str,
    capabilities: &banlieue_api::ProviderCapabilities,
) -> Option<Error> {
    let refused = |field: &str, value: &str, what: &str, list: &str, declared: Vec<&str>| {
        Error::Core(Core::Invalid {
            reason: crate::error::provider_reasons::TARGET_NOT_DECLARED,
            message: format!(
                "{field} {value} is not a {what} Provider {provider} declared \
                 (spec.capabilities.{list}: {})",
                if declared.is_empty() {
                    "none".to_owned()
                } else {
                    declared.join(", ")
                }
            ),
        })
    };
    let pools: Vec<&str> = capabilities
        .storage_classes
        .iter()
        .map(|c| c.target.pool.as_str())
        .collect();
    if !pools.contains(&spec.pool.as_str()) {
        return Some(refused(
            "spec.pool",
            &spec.pool,
            "storage pool",
            "storageClasses",
            pools,
        ));
    }
    let networks: Vec<&str> = capabilities
        .network_classes
        .iter()
        .map(|c| c.target.network.as_str())
        .collect();
    if !networks.contains(&spec.network.as_str()) {
        return Some(refused(
            "spec.network",
            &spec.network,
            "network",
            "networkClasses",
            networks,
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::{immediate, machine};
    use super::*;
    use banlieue_api::LibvirtMachineStatus;

    #[test]
    fn only_the_pools_and_networks_the_provider_declared_are_taken() {
        let capabilities: banlieue_api::ProviderCapabilities =
            serde_json::from_value(serde_json::json!({
                "storageClasses": [{"name": "standard", "target": {"pool": "vm-pool"}}],
                "networkClasses": [{"name": "prod", "target": {"network": "isolated"}}],
            }))
            .expect("capabilities");
        let spec = |pool: &str, network: &str| -> banlieue_api::LibvirtMachineSpec {
            serde_json::from_value(serde_json::json!({
                "providerRef": {"name": "edge"}, "pool": pool, "network": network,
                "disk": {"backingVolume": "base.raw", "size": "1Gi"},
                "cpu": 1, "memory": "256Mi",
            }))
            .expect("spec")
        };
        assert!(undeclared_target(&spec("vm-pool", "isolated"), "edge", &capabilities).is_none());
        let message = |e: Option<Error>| match e {
            Some(Error::Core(Core::Invalid { reason, message })) => {
                assert_eq!(reason, "TargetNotDeclared");
                message
            }
            other => panic!("{other:?}"),
        };
        assert_eq!(
            message(undeclared_target(
                &spec("vm-pool", "mgmt-lan"),
                "edge",
                &capabilities
            )),
            "spec.network mgmt-lan is not a network Provider edge declared \
             (spec.capabilities.networkClasses: isolated)"
        );
        assert_eq!(
            message(undeclared_target(
                &spec("other", "isolated"),
                "edge",
                &capabilities
            )),
            "spec.pool other is not a storage pool Provider edge declared \
             (spec.capabilities.storageClasses: vm-pool)"
        );
        let none = banlieue_api::ProviderCapabilities::default();
        assert!(
            message(undeclared_target(
                &spec("vm-pool", "isolated"),
                "edge",
                &none
            ))
            .ends_with("(spec.capabilities.storageClasses: none)")
        );
    }

    #[test]
    fn owned_volumes_are_recorded_or_of_our_domain() {
        let mut m = machine(immediate(), None);
        let names = MachineNames::of(&m);
        assert!(owned_volumes(&m, &names, false).is_empty());
        assert_eq!(
            owned_volumes(&m, &names, true),
            [names.os_volume.clone(), names.cidata_volume.clone()]
        );
        m.status = Some(LibvirtMachineStatus {
            volumes: vec![names.os_volume.clone(), "base.raw".into()],
            ..Default::default()
        });
        // The image never: only the machine's own names.
        assert_eq!(
            owned_volumes(&m, &names, false),
            vec![names.os_volume.clone()]
        );
        assert_eq!(
            volume_not_owned("a-b-c-os.qcow2", "default").reason(),
            "VolumeNotOwned"
        );
    }

    #[test]
    fn troubleshooting_messages_match_the_guide() {
        assert_eq!(
            volume_missing("ubuntu.raw", "default").to_string(),
            "volume ubuntu.raw is not in pool default"
        );
        assert_eq!(
            pool_missing("nvme-pool").to_string(),
            "storage pool nvme-pool does not exist"
        );
    }
}

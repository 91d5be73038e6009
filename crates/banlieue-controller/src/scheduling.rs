//! Where a VirtualMachine runs: the choice of Provider and failure domain (pure), and the
//! per-ProviderClass builder of the machine object the provider realises.

use std::collections::BTreeMap;

use banlieue_api::conditions::{self, reasons, types};
use banlieue_api::names;
use banlieue_api::{
    InstallMode, LibvirtDisk, LibvirtMachine, LibvirtMachineSpec, LocalObjectReference,
    MachineKind, Provider, ProviderClass, VMClass, VMImage, VirtualMachine, ZonePhase,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

/// Disk size when neither the class nor the image sets one.
pub const DEFAULT_DISK_SIZE: &str = "10Gi";
/// The failure-domain feature a tpmEnabled class needs. Declared by the administrator, never
/// discovered (ADR-0039).
pub const FEATURE_VTPM: &str = "vtpm";

/// A failure domain that satisfies the VirtualMachine, and what the machine is built from.
#[derive(Clone, Debug, PartialEq)]
pub struct Placement {
    pub provider: String,
    pub provider_class: String,
    pub machine_kind: MachineKind,
    pub failure_domain: String,
    pub pool: String,
    pub network: String,
    pub disk: LibvirtDisk,
    pub image_revision: Option<String>,
}

/// Why nothing fits: a condition reason from the guides and a message naming the culprit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unschedulable {
    pub reason: &'static str,
    pub message: String,
}

/// How far a candidate failure domain got through the checks. Later stages are more specific,
/// so the furthest failure is the one reported.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Stage {
    StorageOrNetwork,
    Feature,
    Builder,
    Image,
}

/// Everything scheduling reads, as snapshots.
#[derive(Clone, Copy, Debug)]
pub struct ScheduleInput<'a> {
    pub vm: &'a VirtualMachine,
    pub class: Option<&'a VMClass>,
    pub image: Option<&'a VMImage>,
    /// Providers of the VirtualMachine's namespace.
    pub providers: &'a [&'a Provider],
    /// ProviderClasses by name.
    pub provider_classes: &'a BTreeMap<String, &'a ProviderClass>,
}

/// Chooses the first failure domain, in Provider-name order, that satisfies the
/// VirtualMachine; when none does, says why in the words of the guides.
pub fn schedule(input: ScheduleInput<'_>) -> Result<Placement, Unschedulable> {
    let spec = &input.vm.spec;
    let Some(class) = input.class else {
        return Err(Unschedulable {
            reason: reasons::CLASS_NOT_FOUND,
            message: format!("vmclass {} does not exist", spec.class_ref.name),
        });
    };
    let Some(image) = input.image else {
        return Err(Unschedulable {
            reason: reasons::IMAGE_NOT_READY,
            message: format!("vmimage {} does not exist", spec.image_ref.name),
        });
    };
    let mut providers: Vec<&Provider> = input
        .providers
        .iter()
        .copied()
        .filter(|p| {
            p.status
                .as_ref()
                .is_some_and(|s| conditions::is_true(&s.conditions, types::READY))
        })
        .collect();
    providers.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    if providers.is_empty() {
        return Err(Unschedulable {
            reason: reasons::NO_MATCHING_FAILURE_DOMAIN,
            message: "no Ready provider".to_owned(),
        });
    }

    let mut furthest: Option<(Stage, Unschedulable)> = None;
    let mut note = |stage: Stage, failure: Unschedulable| {
        if furthest.as_ref().is_none_or(|(s, _)| stage > *s) {
            furthest = Some((stage, failure));
        }
    };
    for provider in providers {
        let provider_name = provider.metadata.name.clone().unwrap_or_default();
        let status = provider.status.as_ref();
        for domain in status.map(|s| s.failure_domains.as_slice()).unwrap_or(&[]) {
            let storage = domain
                .storage_classes
                .iter()
                .find(|c| c.name == spec.storage_class_name);
            let network = domain
                .network_classes
                .iter()
                .find(|c| c.name == spec.network_class_name);
            let (Some(storage), Some(network)) = (storage, network) else {
                note(
                    Stage::StorageOrNetwork,
                    Unschedulable {
                        reason: reasons::NO_MATCHING_FAILURE_DOMAIN,
                        message: format!(
                            "no failure domain offers storage class {} and network class {}",
                            spec.storage_class_name, spec.network_class_name
                        ),
                    },
                );
                continue;
            };
            if class.spec.tpm_enabled && !domain.features.iter().any(|f| f == FEATURE_VTPM) {
                note(
                    Stage::Feature,
                    Unschedulable {
                        reason: reasons::NO_PROVIDER_WITH_FEATURE,
                        message: format!(
                            "class {} is tpmEnabled and no provider advertises {FEATURE_VTPM:?} in capabilities.features",
                            spec.class_ref.name
                        ),
                    },
                );
                continue;
            }
            let class_name = &provider.spec.provider_class_ref.name;
            let Some(machine_kind) = builder_for(input.provider_classes.get(class_name).copied())
            else {
                note(
                    Stage::Builder,
                    Unschedulable {
                        reason: reasons::NO_BUILDER_FOR_CLASS,
                        message: format!(
                            "no machine builder for provider class {class_name:?} (provider {provider_name})"
                        ),
                    },
                );
                continue;
            };
            let pool = &storage.target.pool;
            let Some(volume) = ready_volume(image, &provider_name, pool) else {
                note(
                    Stage::Image,
                    Unschedulable {
                        reason: reasons::IMAGE_NOT_READY,
                        message: format!(
                            "vmimage {} is not Ready on provider {provider_name} pool {pool}",
                            spec.image_ref.name
                        ),
                    },
                );
                continue;
            };
            let size = class
                .spec
                .disk_size
                .clone()
                .or_else(|| image.spec.disk_size.clone())
                .unwrap_or_else(|| Quantity(DEFAULT_DISK_SIZE.to_owned()));
            let disk = match image.spec.install_mode {
                InstallMode::Immediate => LibvirtDisk {
                    backing_volume: Some(volume),
                    install_media: None,
                    size,
                },
                InstallMode::Deferred | InstallMode::Manual => LibvirtDisk {
                    backing_volume: None,
                    install_media: Some(volume),
                    size,
                },
            };
            return Ok(Placement {
                provider: provider_name,
                provider_class: class_name.clone(),
                machine_kind,
                failure_domain: domain.name.clone(),
                pool: pool.clone(),
                network: network.target.network.clone(),
                disk,
                image_revision: image_revision(image),
            });
        }
    }
    Err(furthest.map(|(_, f)| f).unwrap_or_else(|| Unschedulable {
        reason: reasons::NO_MATCHING_FAILURE_DOMAIN,
        message: "no Ready provider publishes a failure domain".to_owned(),
    }))
}

/// The machine kind a ProviderClass is built into, when banlieue has a builder for it. A
/// missing ProviderClass has none.
fn builder_for(class: Option<&ProviderClass>) -> Option<MachineKind> {
    match class?.spec.machine_kind {
        MachineKind::LibvirtMachine => Some(MachineKind::LibvirtMachine),
    }
}

/// The image's volume on one provider's pool, when the import there is Ready.
fn ready_volume(image: &VMImage, provider: &str, pool: &str) -> Option<String> {
    image
        .status
        .as_ref()?
        .per_provider
        .iter()
        .find(|p| p.provider == provider)?
        .zones
        .iter()
        .find(|z| z.pool == pool && z.phase == ZonePhase::Ready)?
        .volume
        .clone()
}

/// The image's effective revision: the published one, else the declared one.
pub fn image_revision(image: &VMImage) -> Option<String> {
    image
        .status
        .as_ref()
        .and_then(|s| s.revision.clone())
        .or_else(|| image.spec.revision.clone())
}

/// Builds the LibvirtMachine of a VirtualMachine: same name and namespace, owned by it (so the
/// garbage collector would also remove it), complete enough that the provider never reads the
/// VirtualMachine.
pub fn libvirt_machine(
    vm: &VirtualMachine,
    class: &VMClass,
    placement: &Placement,
) -> Option<LibvirtMachine> {
    let owner = controller_owner_reference(vm)?;
    let mut machine = LibvirtMachine::new(
        vm.metadata.name.as_deref()?,
        LibvirtMachineSpec {
            provider_ref: LocalObjectReference::new(&placement.provider),
            pool: placement.pool.clone(),
            network: placement.network.clone(),
            disk: placement.disk.clone(),
            firmware: class.spec.firmware,
            tpm_enabled: class.spec.tpm_enabled,
            cpu: class.spec.cpu,
            memory: class.spec.memory.clone(),
            user_data: vm.spec.user_data.clone(),
            user_data_secret_ref: vm.spec.user_data_secret_ref.clone(),
        },
    );
    machine.metadata.namespace = vm.metadata.namespace.clone();
    machine.metadata.owner_references = Some(vec![owner]);
    machine.metadata.labels = Some(
        [(
            names::LABEL_MANAGED_BY.to_owned(),
            crate::FIELD_MANAGER.to_owned(),
        )]
        .into(),
    );
    Some(machine)
}

/// A controller owner reference to `owner`, blocking its deletion until the dependent is gone.
pub fn controller_owner_reference<K>(
    owner: &K,
) -> Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference>
where
    K: kube::Resource<DynamicType = ()>,
{
    let mut reference = owner.controller_owner_ref(&())?;
    reference.block_owner_deletion = Some(true);
    Some(reference)
}

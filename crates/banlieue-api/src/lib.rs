//! banlieue's Kubernetes API, group `banlieue.io`, version `v1alpha1`.
//!
//! This crate holds the resource types and the names and reasons the guides fix; no client
//! logic and no controllers. The CRD manifests in `deploy/crds/` are generated from it by
//! `banlieue crds` and a test fails when they drift.

pub mod common;
pub mod conditions;
pub mod image;
pub mod machine;
pub mod names;
pub mod pool;
pub mod provider;
pub mod render;

pub use common::{
    Firmware, KeySelector, LocalObjectReference, MachineAddress, SecretKeySelector, Source,
    ValueOrSource,
};
pub use image::{
    ArtifactPhase, BuildArtifact, ImagePhase, ImageSource, ImageSourceKind, InstallMode,
    ProviderImageStatus, VMClass, VMClassSpec, VMImage, VMImageSpec, VMImageStatus,
    ZoneImageStatus, ZonePhase,
};
pub use machine::{
    LibvirtDisk, LibvirtMachine, LibvirtMachineSpec, LibvirtMachineStatus, MachineInitialization,
    MachineReference, VirtualMachine, VirtualMachineSpec, VirtualMachineStatus,
};
pub use pool::{
    ClaimPhase, ClaimSubject, PoolReadiness, PoolUpdateStrategy, PoolUpdateType, TemplateMetadata,
    VirtualMachineClaim, VirtualMachineClaimSpec, VirtualMachineClaimStatus, VirtualMachinePool,
    VirtualMachinePoolSpec, VirtualMachinePoolStatus, VirtualMachineTemplate,
};
pub use provider::{
    FailureDomain, ImportJobSettings, MachineKind, NetworkClassMapping, NetworkTarget, PodSettings,
    Provider, ProviderAttestation, ProviderCapabilities, ProviderClass, ProviderClassSpec,
    ProviderConnection, ProviderSpec, ProviderStatus, StorageClassMapping, StorageTarget,
};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, ValidationRule,
};
use kube::CustomResourceExt;

/// Every CRD of the API, in a stable order (the order `banlieue crds` prints them in).
pub fn crds() -> Vec<CustomResourceDefinition> {
    vec![
        ProviderClass::crd(),
        Provider::crd(),
        VMImage::crd(),
        VMClass::crd(),
        VirtualMachine::crd(),
        LibvirtMachine::crd(),
        name_fits_a_label(
            VirtualMachinePool::crd(),
            "a pool's name is at most 63 characters: it is the banlieue.io/pool label of every \
             member",
        ),
        name_fits_a_label(
            VirtualMachineClaim::crd(),
            "a claim's name is at most 63 characters: it is the banlieue.io/claim label of its \
             member",
        ),
    ]
}

/// `crd` refusing names longer than a label value ([`names::MAX_NAME_LEN`]): the name of a
/// pool or a claim becomes a label of other objects, so a longer one would be accepted and then
/// never get a member (a pool) or never bind (a claim).
fn name_fits_a_label(mut crd: CustomResourceDefinition, message: &str) -> CustomResourceDefinition {
    for version in &mut crd.spec.versions {
        if let Some(schema) = version
            .schema
            .as_mut()
            .and_then(|s| s.open_api_v3_schema.as_mut())
        {
            schema
                .x_kubernetes_validations
                .get_or_insert_with(Vec::new)
                .push(ValidationRule {
                    rule: format!("self.metadata.name.size() <= {}", names::MAX_NAME_LEN),
                    message: Some(message.to_owned()),
                    ..ValidationRule::default()
                });
        }
    }
    crd
}

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

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
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
        VirtualMachinePool::crd(),
        VirtualMachineClaim::crd(),
    ]
}

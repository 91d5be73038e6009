//! banlieue's Kubernetes API, group `banlieue.io`, version `v1alpha1`.
//!
//! This crate holds the resource types and the names and reasons the guides fix; no client
//! logic and no controllers. The CRD manifests in `deploy/crds/` are generated from it by
//! `banlieue crds` and a test fails when they drift.

// A product function stays under clippy.toml's line limit (tests may be longer).
#![cfg_attr(not(test), deny(clippy::too_many_lines))]

pub mod access;
pub mod artifacts;
pub mod backend;
pub mod common;
pub mod conditions;
pub mod egress;
pub mod handover;
pub mod image;
pub mod machine;
pub mod names;
pub mod pods;
pub mod pool;
pub mod provider;
pub mod quantity;
pub mod render;
pub mod vsphere;

pub use common::{
    Firmware, KeySelector, LocalObjectReference, MachineAddress, SecretKeySelector, Source,
    Standby, ValueOrSource,
};
pub use image::{
    ArtifactPhase, BuildArtifact, ImagePhase, ImageSource, ImageSourceKind, InstallMode,
    PcrReference, ProviderImageStatus, VMClass, VMClassSpec, VMImage, VMImageSpec, VMImageStatus,
    ZoneImageStatus, ZonePhase,
};
pub use machine::{
    LibvirtDisk, LibvirtMachine, LibvirtMachineSpec, LibvirtMachineStatus, MachineInitialization,
    MachineReference, MachineSpecContract, MachineStatusContract, VirtualMachine,
    VirtualMachineSpec, VirtualMachineStatus,
};
pub use pool::{
    ClaimPhase, ClaimSubject, PoolReadiness, PoolUpdateStrategy, PoolUpdateType, TemplateMetadata,
    VirtualMachineClaim, VirtualMachineClaimSpec, VirtualMachineClaimStatus, VirtualMachinePool,
    VirtualMachinePoolSpec, VirtualMachinePoolStatus, VirtualMachineTemplate,
};
pub use provider::{
    DomainCapacity, FailureDomain, ImportJobSettings, MachineKind, NetworkClassMapping,
    NetworkTarget, PodSettings, Provider, ProviderAttestation, ProviderCapabilities, ProviderClass,
    ProviderClassSpec, ProviderConnection, ProviderSpec, ProviderStatus, StorageClassMapping,
    StorageTarget,
};
pub use vsphere::{
    VSphereCapabilities, VSphereDatacenter, VSphereMachine, VSphereMachineSpec,
    VSphereMachineStatus,
};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, ValidationRule,
};
use kube::CustomResourceExt;

/// Every CRD this crate defines, the in-tree backends' machine kinds included, in a stable
/// order: what tests install. A binary serves [`neutral_crds`] and its backends' own (each
/// backend's descriptor names its CRDs).
pub fn crds() -> Vec<CustomResourceDefinition> {
    vec![
        ProviderClass::crd(),
        Provider::crd(),
        VMImage::crd(),
        VMClass::crd(),
        name_at_most(
            VirtualMachine::crd(),
            names::MAX_MACHINE_NAME_LEN,
            "a VirtualMachine's name is at most 180 characters: with its namespace it names the \
             domain's volumes, <namespace>-<name>-cidata.iso, which a host's file system limits \
             to 255 bytes",
        ),
        machine::libvirt_machine_crd(),
        vsphere::crd(),
        name_at_most(
            VirtualMachinePool::crd(),
            names::MAX_NAME_LEN,
            "a pool's name is at most 63 characters: it is the banlieue.io/pool label of every \
             member",
        ),
        name_at_most(
            VirtualMachineClaim::crd(),
            names::MAX_NAME_LEN,
            "a claim's name is at most 63 characters: it is the banlieue.io/claim label of its \
             member",
        ),
    ]
}

/// The CRDs every build serves, whatever its backends: [`crds`] without the machine kinds.
pub fn neutral_crds() -> Vec<CustomResourceDefinition> {
    let machine_kinds =
        [LibvirtMachine::crd(), VSphereMachine::crd()].map(|crd| crd.spec.names.kind);
    crds()
        .into_iter()
        .filter(|crd| !machine_kinds.contains(&crd.spec.names.kind))
        .collect()
}

/// `crd` refusing names longer than `max`: a name that is accepted must work. The name of a
/// pool or a claim becomes a label of other objects (63 characters at most), so a longer one
/// would never get a member (a pool) or never bind (a claim); a machine's name becomes file
/// names on the host ([`names::MAX_MACHINE_NAME_LEN`]).
pub fn name_at_most(
    mut crd: CustomResourceDefinition,
    max: usize,
    message: &str,
) -> CustomResourceDefinition {
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
                    rule: format!("self.metadata.name.size() <= {max}"),
                    message: Some(message.to_owned()),
                    ..ValidationRule::default()
                });
        }
    }
    crd
}

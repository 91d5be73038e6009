//! The neutral half of a backend (ADR-0071): what the controller and the Provider operator need
//! of one machine kind, and the input a kind's machine spec is built from. A backend crate
//! exports a descriptor holding a [`MachineBackend`] and a [`BackendWorkload`]; nothing neutral
//! names a backend, and the binary's list of descriptors is the one place they all meet.

use k8s_openapi::api::rbac::v1::PolicyRule;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::Client;
use kube::api::{Api, ApiResource, DynamicObject};
use serde_json::Value;

use crate::common::{Firmware, LocalObjectReference, SecretKeySelector};
use crate::image::InstallMode;
use crate::{MachineKind, MachineReference, VMClass, VirtualMachine, names};

/// A failure domain that satisfies the VirtualMachine, and what the machine is built from. It
/// names no backend: the targets are the failure domain's, passed through to the machine's
/// builder unread.
#[derive(Clone, Debug, PartialEq)]
pub struct Placement {
    pub provider: String,
    pub provider_class: String,
    pub machine_kind: MachineKind,
    pub failure_domain: String,
    /// The failure domain's target for the VirtualMachine's storage class (for libvirt, a
    /// storage pool).
    pub storage_target: String,
    /// The failure domain's target for its network class (for libvirt, a network).
    pub network_target: String,
    pub image: PlacedImage,
    pub image_revision: Option<String>,
}

/// The image as it is found in the chosen failure domain.
#[derive(Clone, Debug, PartialEq)]
pub struct PlacedImage {
    /// The image's volume in the storage target, where its import is Ready.
    pub volume: String,
    /// Whether the machine boots the volume (Immediate) or installs from it.
    pub install_mode: InstallMode,
    /// The OS disk's size: the class's, else the image's, else the controller's default.
    pub disk_size: Quantity,
}

/// What the controller needs of one machine kind: its half of a backend's descriptor.
#[derive(Clone, Debug)]
pub struct MachineBackend {
    /// The kind, as its CRD, the cache and its errors name it.
    pub kind_name: &'static str,
    /// Group, version, kind and plural of its objects.
    pub resource: ApiResource,
    /// The finalizer under which the kind's provider tears a machine down. The machine is
    /// created holding it, so the provider's first look finds nothing to add: one API write
    /// less per machine, and a machine deleted before its provider ever saw it still waits for
    /// the provider to confirm there is nothing to remove on the host.
    pub finalizer: &'static str,
    /// Writes the kind's `spec` for a placed VirtualMachine.
    pub spec: fn(&MachineInput<'_>) -> Result<Value, BuildError>,
    /// Its provider saves a machine whose `spec.standby` is `Saved` and restores it when
    /// `Running`, reporting `status.standby` (ADR-0073). False: members of a `standby: Saved`
    /// pool keep running, and the pool says `StandbyNotSupported`.
    pub saves: bool,
    /// Its provider enforces a machine's `spec.egress` on the host before the guest boots.
    /// False: a member of a class with `egress` is not built (`EgressNotEnforced`), so that no
    /// guest runs with more access than its class declares.
    pub enforces_egress: bool,
}

impl MachineBackend {
    /// A kind whose spec is its placement ([`placement_spec`]): `api_version` and `kind` of
    /// its CRD, the plural its objects are served at, and its provider's finalizer.
    pub fn of_placement(
        api_version: &str,
        kind: &'static str,
        plural: &str,
        finalizer: &'static str,
    ) -> MachineBackend {
        let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
        MachineBackend {
            kind_name: kind,
            resource: ApiResource {
                group: group.to_owned(),
                version: version.to_owned(),
                api_version: api_version.to_owned(),
                kind: kind.to_owned(),
                plural: plural.to_owned(),
            },
            finalizer,
            spec: placement_spec,
            saves: false,
            enforces_egress: false,
        }
    }

    /// The kind it builds, as a ProviderClass names it.
    pub fn kind(&self) -> MachineKind {
        MachineKind::from_static(self.kind_name)
    }

    /// The `machineRef` of its machine `name`.
    pub fn reference(&self, name: &str) -> MachineReference {
        MachineReference {
            api_version: self.resource.api_version.clone(),
            kind: self.resource.kind.clone(),
            name: name.to_owned(),
        }
    }

    /// The API of its machines in `namespace`.
    pub fn api(&self, client: &Client, namespace: &str) -> Api<DynamicObject> {
        Api::namespaced_with(client.clone(), namespace, &self.resource)
    }
}

/// What a provider's machine reconcile reads of a machine kind the same way for every kind:
/// who serves it, under which finalizer, and the status contract its status embeds. A kind's
/// CRD type implements it here, beside the type (the kit's `machine::Backend` requires it, and
/// only the crate of the type or of the trait may implement a trait for a type).
pub trait MachineObject {
    /// Its status, which embeds [`MachineStatusContract`](crate::MachineStatusContract).
    type Status;
    /// The finalizer under which its provider tears a machine down.
    const FINALIZER: &'static str;

    /// The Provider that realises the machine (`spec.providerRef.name`).
    fn provider_name(&self) -> &str;
    /// The status the machine carries, if any was written.
    fn status(&self) -> Option<&Self::Status>;
    /// The contract every machine status embeds.
    fn contract(status: &Self::Status) -> &crate::MachineStatusContract;
}

/// What a machine is built from: the VirtualMachine, its class and where it was placed.
#[derive(Clone, Copy, Debug)]
pub struct MachineInput<'a> {
    pub vm: &'a VirtualMachine,
    pub class: &'a VMClass,
    pub placement: &'a Placement,
}

/// Why a machine cannot be built.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error("the VirtualMachine has no name or uid")]
    Unnamed,
    #[error("encode the {kind} spec")]
    Spec {
        kind: &'static str,
        #[source]
        source: serde_json::Error,
    },
    /// The placement cannot be expressed as a machine of the kind.
    #[error("{kind}: {message}")]
    Unbuildable { kind: &'static str, message: String },
}

/// Encodes a machine spec of `kind`.
pub fn encode(kind: &'static str, spec: impl serde::Serialize) -> Result<Value, BuildError> {
    serde_json::to_value(spec).map_err(|source| BuildError::Spec { kind, source })
}

/// The spec of a machine of a kind that takes its placement as scheduled, unread: what
/// [`placement_spec`] writes. A backend whose CRD accepts this shape needs no builder of its
/// own ([`MachineBackend::of_placement`]); the built-in kinds keep their own shapes.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PlacementSpec {
    /// The Provider that realises the machine (the contract's).
    pub provider_ref: LocalObjectReference,
    /// Whether the machine has a vTPM (the contract's).
    #[serde(default)]
    pub tpm_enabled: bool,
    /// The failure domain it was placed in.
    pub failure_domain: String,
    /// The failure domain's target for the VirtualMachine's storage class.
    pub storage_target: String,
    /// The failure domain's target for its network class.
    pub network_target: String,
    /// The image's volume in that storage target.
    pub image_volume: String,
    pub install_mode: InstallMode,
    pub disk_size: Quantity,
    pub firmware: Firmware,
    /// UEFI Secure Boot with the default keys enrolled; written only when asked for, so a
    /// backend whose schema predates it sees the shape it always did.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub secure_boot: bool,
    pub cpu: u32,
    pub memory: Quantity,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_data: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_data_secret_ref: Option<SecretKeySelector>,
}

/// The builder of a kind whose spec is the placement itself ([`PlacementSpec`]).
pub fn placement_spec(input: &MachineInput<'_>) -> Result<Value, BuildError> {
    let placement = input.placement;
    encode(
        "placement",
        PlacementSpec {
            provider_ref: LocalObjectReference::new(&placement.provider),
            tpm_enabled: input.class.spec.tpm_enabled,
            failure_domain: placement.failure_domain.clone(),
            storage_target: placement.storage_target.clone(),
            network_target: placement.network_target.clone(),
            image_volume: placement.image.volume.clone(),
            install_mode: placement.image.install_mode,
            disk_size: placement.image.disk_size.clone(),
            firmware: input.class.spec.firmware,
            secure_boot: input.class.spec.secure_boot,
            cpu: input.class.spec.cpu,
            memory: input.class.spec.memory.clone(),
            user_data: input.vm.spec.user_data.clone(),
            user_data_secret_ref: input.vm.spec.user_data_secret_ref.clone(),
        },
    )
}

/// Where a class's ClusterRole `banlieue-provider-class-<class>` is bound for each Provider.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClassRoleScope {
    /// The class's build namespace, and only when the class declares `additionalRules`: the
    /// role holds what import Jobs need (libvirt).
    BuildNamespace,
    /// The Provider's own namespace, always: the role holds the rights on the class's
    /// machines, which `banlieue-provider-base` does not grant (vSphere).
    ProviderNamespace,
}

/// What the Provider operator does differently for the providers of one machine kind: its
/// half of a backend's descriptor.
#[derive(Clone, Debug)]
pub struct BackendWorkload {
    /// The machine kind whose ProviderClasses run this workload.
    pub kind: MachineKind,
    /// The backend's word in `banlieue provider <backend> run`.
    pub subcommand: &'static str,
    /// Where the class's ClusterRole is bound.
    pub class_role: ClassRoleScope,
    /// What the class's ClusterRole must grant whatever the class declares: the rights on
    /// the kind's machines when the base role does not hold them.
    pub class_role_rules: Vec<PolicyRule>,
    /// The kind's machines, which a Provider being deleted waits for.
    pub machines: ApiResource,
}

/// A provider's rights on its machines of resource `plural`: it reads them, adds and removes
/// its finalizer and reports in the status; it never creates or deletes one.
pub fn machine_rules(plural: &str) -> Vec<PolicyRule> {
    let rule = |resources: Vec<String>, verbs: &[&str]| PolicyRule {
        api_groups: Some(vec![names::GROUP.to_owned()]),
        resources: Some(resources),
        verbs: verbs.iter().map(|v| (*v).to_owned()).collect(),
        ..PolicyRule::default()
    };
    vec![
        rule(vec![plural.to_owned()], &["get", "list", "watch", "patch"]),
        rule(
            vec![format!("{plural}/status"), format!("{plural}/finalizers")],
            &["patch"],
        ),
    ]
}

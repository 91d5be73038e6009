//! Provider (a registered host) and ProviderClass (what runs a provider's workload).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{EnvVar, ResourceRequirements, Toleration};
use k8s_openapi::api::rbac::v1::PolicyRule;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::common::{LocalObjectReference, ValueOrSource};
use crate::conditions::Condition;

/// The desired state of a Provider.
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "banlieue.io",
    version = "v1alpha1",
    kind = "Provider",
    doc = "A hypervisor host (or vCenter) registered with banlieue. The operator connects to it, narrows the declared capabilities to what really exists and publishes the result as failure domains.",
    namespaced,
    status = "ProviderStatus",
    shortname = "vmprovider",
    category = "banlieue",
    printcolumn = r#"{"name":"Class","type":"string","jsonPath":".spec.providerClassRef.name"}"#,
    printcolumn = r#"{"name":"Endpoint","type":"string","jsonPath":".spec.connection.endpoint"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Reason","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].reason"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct ProviderSpec {
    /// The ProviderClass whose workload serves this Provider (for example `libvirt`).
    pub provider_class_ref: LocalObjectReference,
    /// How to reach the host.
    pub connection: ProviderConnection,
    /// What the administrator asserts the host offers. Declared, never discovered: the provider
    /// only narrows it to what exists (ADR-0039).
    #[serde(default)]
    pub capabilities: ProviderCapabilities,
    /// Trust anchors a verifier uses for guests' attestation. Published, never checked by
    /// banlieue (ADR-0049).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attestation: Option<ProviderAttestation>,
}

/// Endpoint and TLS material of a Provider. Mutual TLS is the only transport (ADR-0011).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProviderConnection {
    /// The host's URI, for libvirt `qemu+tls://host[:port]/system`. Other schemes are rejected
    /// at reconcile with `scheme "…" is not supported`.
    #[schemars(length(min = 1, max = 2048))]
    pub endpoint: String,
    /// A `kubernetes.io/tls`-shaped Secret with keys `tls.crt` and `tls.key`: the client
    /// certificate is the credential.
    pub credentials_ref: LocalObjectReference,
    /// The CA that signed the host's server certificate. Required: only this CA is trusted.
    pub ca_bundle: ValueOrSource,
}

/// Declared capabilities of a Provider.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProviderCapabilities {
    /// Storage classes this host offers, each mapped to a storage pool on the host.
    #[serde(default)]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub storage_classes: Vec<StorageClassMapping>,
    /// Network classes this host offers, each mapped to a network on the host.
    #[serde(default)]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub network_classes: Vec<NetworkClassMapping>,
    /// Features the administrator has confirmed on this host, for example `vtpm`. Never
    /// auto-discovered.
    #[serde(default)]
    #[schemars(extend("x-kubernetes-list-type" = "set"))]
    pub features: Vec<String>,
    /// libvirt Providers: the volumes of its pools that VMImages may name as a `BackingFile`
    /// source, each an exact name or a prefix ending in `*` (`golden-*`). A BackingFile naming
    /// any other volume is refused, as is a machine's own OS disk or seed whatever this says:
    /// otherwise whoever writes a VMImage could attach another guest's disk or user-data to a
    /// VM of its own. Empty (the default): no BackingFile source is accepted.
    #[serde(default)]
    #[schemars(
        extend("x-kubernetes-list-type" = "set"),
        length(max = 64),
        inner(length(min = 1, max = 255))
    )]
    pub backing_file_volumes: Vec<String>,
    /// How much memory the scheduler may promise on each failure domain, as a percentage of the
    /// memory the host reports (`status.failureDomains[].capacity`). 100 (the default): never
    /// more than the host has; above 100 overcommits. Unset capacity is not limited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1000))]
    pub memory_overcommit_percent: Option<u32>,
    /// Memory the scheduler keeps free on each failure domain for restoring saved members
    /// (`standby: Saved` pools, ADR-0073), whose memory is not counted while they are saved.
    /// Unset: the memory of the largest saved member there, so one resume always fits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resume_reserve: Option<Quantity>,
    /// Storage on each failure domain that saved members' state may use (libvirt: the host's
    /// managed-save directory, `/var/lib/libvirt/qemu/save`, whose free space libvirt does not
    /// report). Every unclaimed member of a `standby: Saved` pool counts its class's memory
    /// against it from the moment it is placed, since that is what its save will write; a
    /// member that would not fit is not placed (`InsufficientCapacity`, naming save storage).
    /// Unset: not limited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub save_storage: Option<Quantity>,
    /// vSphere Providers: the datacenters and clusters VMs may run in, one failure domain per
    /// cluster that exists (ADR-0069).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vsphere: Option<crate::vsphere::VSphereCapabilities>,
}

/// The default of `memoryOvercommitPercent`: no overcommit.
pub const DEFAULT_MEMORY_OVERCOMMIT_PERCENT: u32 = 100;

/// A storage class name and the host pool that realises it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct StorageClassMapping {
    /// The storage class name VirtualMachines ask for.
    #[schemars(length(min = 1, max = 63))]
    pub name: String,
    /// Where it lives on the host.
    pub target: StorageTarget,
}

/// A storage class's location on a libvirt host.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct StorageTarget {
    /// Name of the libvirt storage pool.
    #[schemars(length(min = 1, max = 253))]
    pub pool: String,
}

/// A network class name and the host network that realises it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct NetworkClassMapping {
    /// The network class name VirtualMachines ask for.
    #[schemars(length(min = 1, max = 63))]
    pub name: String,
    /// Where it lives on the host.
    pub target: NetworkTarget,
}

/// A network class's location on a libvirt host.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct NetworkTarget {
    /// Name of the libvirt network.
    #[schemars(length(min = 1, max = 253))]
    pub network: String,
}

/// Attestation trust configuration of a Provider.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProviderAttestation {
    /// Issuer certificates of this backend's vTPM endorsement keys (on libvirt, each host's
    /// swtpm_localca issuer). Removing an issuer is how its EK certificates are revoked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ek_trust_bundle: Option<ValueOrSource>,
}

/// Observed state of a Provider.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProviderStatus {
    /// `Ready` with reasons Connected, CredentialsUnavailable, UnsupportedScheme, ConnectFailed or
    /// CapabilitiesIncomplete.
    #[serde(default)]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    /// The declaration narrowed to what the host really has. A libvirt host is one failure
    /// boundary, so it publishes exactly one entry once it has been reached.
    #[serde(default)]
    pub failure_domains: Vec<FailureDomain>,
    /// The generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// One failure domain of a Provider: what is really available there.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FailureDomain {
    /// Name of the failure domain (for libvirt, the host's name).
    pub name: String,
    /// Declared storage classes whose pool exists.
    #[serde(default)]
    pub storage_classes: Vec<StorageClassMapping>,
    /// Declared network classes whose network exists.
    #[serde(default)]
    pub network_classes: Vec<NetworkClassMapping>,
    /// Declared features, copied as declared.
    #[serde(default)]
    pub features: Vec<String>,
    /// What the host reports it has (libvirt: NODE_GET_INFO), once the provider has read it.
    /// Measured, not declared: the scheduler never promises more memory than this times the
    /// Provider's `memoryOvercommitPercent`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity: Option<DomainCapacity>,
}

/// A failure domain's size.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DomainCapacity {
    /// Memory, in bytes.
    pub memory_bytes: u64,
    /// Logical CPUs.
    pub cpus: u32,
}

/// The kind of machine a ProviderClass realises: a kind of `banlieue.io/v1alpha1`, named as its
/// CRD names it. banlieue ships two, [`MachineKind::LIBVIRT_MACHINE`] and
/// [`MachineKind::VSPHERE_MACHINE`]; the name is open so that adding a backend is a CRD, a
/// builder in the controller and a provider (ADR-0071), with no change to this type. A class
/// naming a kind the controller has no builder for places nothing, and the operator runs no
/// workload for it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct MachineKind(std::borrow::Cow<'static, str>);

impl MachineKind {
    /// `banlieue.io/v1alpha1` LibvirtMachine.
    pub const LIBVIRT_MACHINE: MachineKind = MachineKind::from_static("LibvirtMachine");
    /// `banlieue.io/v1alpha1` VSphereMachine (ADR-0069).
    pub const VSPHERE_MACHINE: MachineKind = MachineKind::from_static("VSphereMachine");
    /// The longest kind name: a Kubernetes kind is a DNS label's length at most.
    pub const MAX_LEN: usize = 63;

    /// The kind named `name`: an upper-case ASCII letter, then letters and digits, at most
    /// [`Self::MAX_LEN`] in all (the CRD's pattern says the same).
    pub fn new(name: impl Into<String>) -> Result<MachineKind, InvalidMachineKind> {
        let name = name.into();
        if is_kind_name(name.as_bytes()) {
            Ok(MachineKind(std::borrow::Cow::Owned(name)))
        } else {
            Err(InvalidMachineKind { name })
        }
    }

    /// The kind a backend's code names: checked like [`Self::new`], and a compile error when
    /// evaluated in a `const`.
    pub const fn from_static(name: &'static str) -> MachineKind {
        assert!(is_kind_name(name.as_bytes()), "not a machine kind name");
        MachineKind(std::borrow::Cow::Borrowed(name))
    }

    /// The kind's name, as its CRD and a machine's `kind` say it.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// An upper-case ASCII letter, then ASCII letters and digits, at most [`MachineKind::MAX_LEN`].
const fn is_kind_name(name: &[u8]) -> bool {
    if name.is_empty() || name.len() > MachineKind::MAX_LEN || !name[0].is_ascii_uppercase() {
        return false;
    }
    let mut at = 1;
    while at < name.len() {
        if !name[at].is_ascii_alphanumeric() {
            return false;
        }
        at += 1;
    }
    true
}

impl Default for MachineKind {
    /// LibvirtMachine, the kind a class realises when it names none.
    fn default() -> MachineKind {
        MachineKind::LIBVIRT_MACHINE
    }
}

impl std::fmt::Display for MachineKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl TryFrom<String> for MachineKind {
    type Error = InvalidMachineKind;
    fn try_from(name: String) -> Result<MachineKind, InvalidMachineKind> {
        MachineKind::new(name)
    }
}

impl From<MachineKind> for String {
    fn from(kind: MachineKind) -> String {
        kind.0.into_owned()
    }
}

impl JsonSchema for MachineKind {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "MachineKind".into()
    }
    fn inline_schema() -> bool {
        true
    }
    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "type": "string",
            "pattern": "^[A-Z][A-Za-z0-9]*$",
            "maxLength": MachineKind::MAX_LEN,
        })
    }
}

/// A machine kind name that is not a Kubernetes kind.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "machine kind {name:?} is not a kind name (an upper-case letter, then letters and digits, \
     at most 63)"
)]
pub struct InvalidMachineKind {
    pub name: String,
}

/// The desired state of a ProviderClass.
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "banlieue.io",
    version = "v1alpha1",
    kind = "ProviderClass",
    doc = "What a family of providers needs to run: its workload image and command, the machine kind it realises, and extra RBAC for its Role.",
    shortname = "vmproviderclass",
    category = "banlieue",
    printcolumn = r#"{"name":"Machine","type":"string","jsonPath":".spec.machineKind"}"#,
    printcolumn = r#"{"name":"Image","type":"string","jsonPath":".spec.image"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct ProviderClassSpec {
    /// Container image of the provider workload (the banlieue binary).
    #[schemars(length(min = 1, max = 1024))]
    pub image: String,
    /// Entrypoint of the workload container. The operator appends the provider of the
    /// class's machine kind, `provider libvirt run --provider NAME --namespace NS` (or
    /// `provider vsphere run …` for VSphereMachine), to `args`.
    #[serde(default)]
    pub command: Vec<String>,
    /// Arguments placed before the provider's own.
    #[serde(default)]
    pub args: Vec<String>,
    /// The machine kind this class realises (`LibvirtMachine` or `VSphereMachine`): which
    /// machines the controller writes for its Providers, which provider the operator runs for
    /// them, and where it binds the class's ClusterRole. A kind this build of banlieue has no
    /// backend for places nothing and runs no workload.
    #[serde(default)]
    pub machine_kind: MachineKind,
    /// Rules the class's providers need on top of the base rules, for example `jobs` in
    /// `batch` so libvirt providers can run import Jobs. Declared here, granted by the
    /// administrator: the ClusterRole `banlieue-provider-class-<class>` must hold them. The
    /// operator binds it in the build namespace for LibvirtMachine classes (when they declare
    /// rules), and always in the Provider's namespace for VSphereMachine classes, whose role
    /// holds their machine rights (ADR-0063). A Provider whose class role is missing or does
    /// not cover these rules reports `ProviderClassRoleMissing`.
    #[serde(default)]
    pub additional_rules: Vec<PolicyRule>,
    /// How this class's import Jobs run.
    #[serde(default)]
    pub import: ImportJobSettings,
    /// Scheduling and resources of the provider workload's pods and its import Jobs' pods.
    #[serde(default, skip_serializing_if = "PodSettings::is_empty")]
    pub pod: PodSettings,
}

/// Pod settings an administrator sets once per ProviderClass: where the workload may run,
/// what it may use, and how its image is pulled.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PodSettings {
    /// Node labels the pods must match.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,
    /// Taints the pods tolerate.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tolerations: Vec<Toleration>,
    /// Requests and limits of the provider container; defaults are used when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
    /// Secrets holding credentials for the image's registry, in the pod's namespace.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub image_pull_secrets: Vec<k8s_openapi::api::core::v1::LocalObjectReference>,
    /// Environment of the provider container, e.g. `BANLIEUE_LIBVIRT_DOMAIN_TYPE=qemu` for
    /// hosts whose capabilities list `kvm` but cannot run it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<EnvVar>,
    /// Run in the node's network namespace, for hosts reached over a management network that
    /// only the node has.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub host_network: bool,
}

impl PodSettings {
    /// Whether nothing is set.
    pub fn is_empty(&self) -> bool {
        self == &PodSettings::default()
    }
}

/// Settings of the image-import Jobs a ProviderClass's providers create.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ImportJobSettings {
    /// Namespace the Jobs run in, where the artifacts PVC lives. Defaults to
    /// `banlieue-imagebuild` (ADR-0016).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// ServiceAccount of the Jobs, in that namespace. Defaults to `default`, which then needs
    /// the grant to read Providers and their Secrets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_account_name: Option<String>,
    /// The PersistentVolumeClaim holding build artifacts, mounted at `/artifacts`. Defaults to
    /// `banlieue-artifacts`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub artifacts_claim_name: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_machine_kind_is_a_kind_name() {
        for name in ["LibvirtMachine", "VSphereMachine", "M", "Machine2"] {
            assert_eq!(MachineKind::new(name).expect(name).as_str(), name);
        }
        let too_long = format!("M{}", "a".repeat(MachineKind::MAX_LEN));
        for name in [
            "",
            "libvirtMachine",
            "Libvirt-Machine",
            "Machine ",
            "Машина",
            &too_long,
        ] {
            assert_eq!(
                MachineKind::new(name),
                Err(InvalidMachineKind {
                    name: name.to_owned()
                }),
                "{name:?}"
            );
        }
    }

    #[test]
    fn a_class_reads_its_machine_kind_and_defaults_to_libvirt() {
        let spec = |json: serde_json::Value| serde_json::from_value::<ProviderClassSpec>(json);
        let named = spec(serde_json::json!({"image": "i", "machineKind": "VSphereMachine"}))
            .expect("a known kind");
        assert_eq!(named.machine_kind, MachineKind::VSPHERE_MACHINE);
        let other = spec(serde_json::json!({"image": "i", "machineKind": "MemoryMachine"}))
            .expect("a kind this build may not serve is still a kind");
        assert_eq!(other.machine_kind.as_str(), "MemoryMachine");
        assert_eq!(
            spec(serde_json::json!({"image": "i"}))
                .expect("no kind")
                .machine_kind,
            MachineKind::LIBVIRT_MACHINE
        );
        let error = spec(serde_json::json!({"image": "i", "machineKind": "not a kind"}))
            .expect_err("a malformed kind");
        assert!(error.to_string().contains("is not a kind name"), "{error}");
        assert_eq!(
            serde_json::to_value(&named).expect("encode")["machineKind"],
            "VSphereMachine"
        );
    }
}

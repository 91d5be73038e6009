//! VirtualMachine (what a user asks for) and LibvirtMachine (the provider-specific machine the
//! controller creates for it; the only thing the controller and the provider share, ADR-0050).

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use serde_json::Value;

use crate::backend::{
    self, BackendWorkload, BuildError, ClassRoleScope, MachineBackend, MachineInput, MachineObject,
};
use crate::common::{Firmware, LocalObjectReference, MachineAddress, SecretKeySelector, Standby};
use crate::conditions::Condition;
use crate::image::InstallMode;

/// Largest inline user-data accepted. A seed ISO holds more, but a claim-sized API object
/// should not; bigger payloads go through `userDataSecretRef`.
pub const MAX_INLINE_USER_DATA: usize = 65536;

/// The desired state of a VirtualMachine.
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "banlieue.io",
    version = "v1alpha1",
    kind = "VirtualMachine",
    doc = "A virtual machine: class, image, where it runs and what it is told at first boot.",
    namespaced,
    status = "VirtualMachineStatus",
    shortname = "bvm",
    category = "banlieue",
    printcolumn = r#"{"name":"Class","type":"string","jsonPath":".spec.classRef.name"}"#,
    printcolumn = r#"{"name":"Image","type":"string","jsonPath":".spec.imageRef.name"}"#,
    printcolumn = r#"{"name":"Provider","type":"string","jsonPath":".status.providerRef.name"}"#,
    printcolumn = r#"{"name":"Scheduled","type":"string","jsonPath":".status.conditions[?(@.type==\"Scheduled\")].status"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Address","type":"string","jsonPath":".status.addresses[0].address"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "!(has(self.userData) && has(self.userDataSecretRef))",
    "message": "set at most one of userData and userDataSecretRef"
}]))]
pub struct VirtualMachineSpec {
    /// The VMClass (same namespace).
    pub class_ref: LocalObjectReference,
    /// The VMImage (same namespace).
    pub image_ref: LocalObjectReference,
    /// Storage class; must be offered by the chosen Provider's failure domain.
    #[schemars(length(min = 1, max = 63))]
    pub storage_class_name: String,
    /// Network class; must be offered by the chosen Provider's failure domain.
    #[schemars(length(min = 1, max = 63))]
    pub network_class_name: String,
    /// cloud-init user-data, delivered as a NoCloud seed. For secrets use userDataSecretRef
    /// (ADR-0055).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 65536))]
    pub user_data: Option<String>,
    /// A Secret key holding cloud-init user-data.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_data_secret_ref: Option<SecretKeySelector>,
    /// How the machine waits while unclaimed (ADR-0073). A pool writes its own
    /// `spec.standby` here; `Saved` takes effect only for an unclaimed pool member that has
    /// reached its pool's readiness.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub standby: Option<Standby>,
    /// Keys to install in the guest once it is ready: a claim's `spec.access`, which the
    /// controller writes here when it binds the member (never on a pool's template: a member
    /// holds no consumer's key before its bind).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access: Option<crate::access::ClaimAccess>,
    /// The claim's challenge to the guest's TPM (ADR-0077), copied by the controller from
    /// the bound claim's `spec.handover` whenever the subject writes one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub handover: Option<crate::handover::HandoverChallenge>,
}

/// Observed state of a VirtualMachine.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachineStatus {
    /// Scheduled, InfrastructureReady, GuestReady and Ready.
    #[serde(default)]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    /// The provider-specific machine created for this VirtualMachine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub machine_ref: Option<MachineReference>,
    /// The Provider it was scheduled onto.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider_ref: Option<LocalObjectReference>,
    /// The failure domain it was scheduled into.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_domain: Option<String>,
    /// Addresses, mirrored from the machine.
    #[serde(default)]
    pub addresses: Vec<MachineAddress>,
    /// The image revision the machine was built from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_revision: Option<String>,
    /// The guest's own phase, when it publishes one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guest_phase: Option<String>,
    /// PEM certificates of the vTPM's endorsement keys (ADR-0045).
    #[serde(default)]
    pub tpm_endorsement_certificates: Vec<String>,
    /// `sha256:<hex>` of each certificate's public key (its DER SubjectPublicKeyInfo), in the
    /// order of `tpmEndorsementCertificates`: what SPIRE's TPM attestor keys an agent on.
    #[serde(default)]
    pub tpm_endorsement_key_digests: Vec<String>,
    /// When the VirtualMachine last became Ready; orders pool members by time Ready.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_since: Option<Time>,
    /// Whether the machine is running or saved, as its provider last reported for the
    /// machine's current spec; unset while the provider has not acted on a change of it
    /// (ADR-0073).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub standby: Option<Standby>,
    /// The guest's SSH host public keys (`TYPE BASE64`), mirrored from the machine.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ssh_host_keys: Vec<String>,
    /// The login the guest installed `spec.access` for, mirrored from the machine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub login_user: Option<String>,
    /// The guest's attestation key and its answer to `spec.handover`, mirrored from the
    /// machine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attestation: Option<crate::handover::Attestation>,
}

/// A reference to a provider-specific machine.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MachineReference {
    /// `banlieue.io/v1alpha1`.
    pub api_version: String,
    /// For example `LibvirtMachine`.
    pub kind: String,
    /// Name (same namespace).
    pub name: String,
}

/// The desired state of a LibvirtMachine.
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "banlieue.io",
    version = "v1alpha1",
    kind = "LibvirtMachine",
    doc = "A libvirt domain to realise. The controller writes the spec; the libvirt provider realises it and reports in the status. Complete enough that the provider never reads a VirtualMachine.",
    namespaced,
    status = "LibvirtMachineStatus",
    shortname = "lvmachine",
    category = "banlieue",
    printcolumn = r#"{"name":"Provider","type":"string","jsonPath":".spec.providerRef.name"}"#,
    printcolumn = r#"{"name":"Pool","type":"string","jsonPath":".spec.pool"}"#,
    printcolumn = r#"{"name":"Ready","type":"boolean","jsonPath":".status.ready"}"#,
    printcolumn = r#"{"name":"Reason","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].reason"}"#,
    printcolumn = r#"{"name":"Domain","type":"string","jsonPath":".status.domainName"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "!(has(self.userData) && has(self.userDataSecretRef))",
    "message": "set at most one of userData and userDataSecretRef"
}, {
    "rule": "!(has(self.secureBoot) && self.secureBoot) || (has(self.firmware) && self.firmware == 'efi')",
    "message": "secureBoot needs firmware: efi"
}]))]
pub struct LibvirtMachineSpec {
    /// The Provider (same namespace) whose host runs the domain.
    pub provider_ref: LocalObjectReference,
    /// Storage pool on the host for the machine's volumes.
    #[schemars(length(min = 1, max = 253))]
    pub pool: String,
    /// libvirt network the machine's interface joins.
    #[schemars(length(min = 1, max = 253))]
    pub network: String,
    /// The OS disk.
    pub disk: LibvirtDisk,
    /// Firmware.
    #[serde(default)]
    pub firmware: Firmware,
    /// Attach an emulated TPM 2.0 (tpm-crb, swtpm).
    #[serde(default)]
    pub tpm_enabled: bool,
    /// UEFI Secure Boot on, with the firmware's default keys enrolled (libvirt picks the
    /// SMM-enabled firmware and a variable store with Microsoft's keys). Needs `firmware: efi`.
    // Written only when asked for, so that a controller newer than the installed CRD
    // writes no field the API server would drop.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub secure_boot: bool,
    /// Virtual CPUs.
    #[schemars(range(min = 1, max = 512))]
    pub cpu: u32,
    /// Memory.
    pub memory: Quantity,
    /// cloud-init user-data.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 65536))]
    pub user_data: Option<String>,
    /// A Secret key holding cloud-init user-data.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_data_secret_ref: Option<SecretKeySelector>,
    /// `Saved`: save the running domain (libvirt managed save); `Running` or unset: run it,
    /// restoring a saved one (ADR-0073). The controller writes it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub standby: Option<Standby>,
    /// Keys the provider installs in the guest through its agent once the guest is ready
    /// (`AccessReady`). The controller writes it when the member is bound.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access: Option<crate::access::ClaimAccess>,
    /// A challenge the provider relays into the guest's TPM (ADR-0077). The controller
    /// writes it from the bound claim's `spec.handover`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub handover: Option<crate::handover::HandoverChallenge>,
    /// What the machine may reach over the network, enforced on the host by a network filter
    /// of its own from its first boot: its class's egress. The controller writes it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress: Option<crate::egress::ClassEgress>,
}

/// The OS disk of a LibvirtMachine: exactly one shape (ADR-0040).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "has(self.backingVolume) != has(self.installMedia)",
    "message": "exactly one of backingVolume or installMedia must be set"
}]))]
pub struct LibvirtDisk {
    /// Immediate images: a qcow2 overlay over this volume of the pool. Its backing format is
    /// taken from the name (.qcow2/.qcow → qcow2, otherwise raw), never probed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backing_volume: Option<String>,
    /// Deferred/Manual images: an empty disk, with this volume of the pool as boot CD-ROM.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub install_media: Option<String>,
    /// Size of the OS disk.
    pub size: Quantity,
}

/// Observed state of a LibvirtMachine, in Cluster API's shape.
// The contract every machine kind carries, flattened, and what only libvirt knows.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LibvirtMachineStatus {
    /// What every machine kind reports, under the same JSON names.
    #[serde(flatten)]
    pub contract: MachineStatusContract,
    /// The libvirt domain's name (`<namespace>-<name>`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub domain_name: Option<String>,
    /// The libvirt domain's UUID, chosen before the domain is first defined.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub domain_uuid: Option<String>,
    /// The volumes the provider created for this machine, each recorded right after it was
    /// made: the only volumes of the machine's name it reuses or deletes. Two machines can
    /// derive the same volume names (namespace `a-b` with `c`, namespace `a` with `b-c`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<String>,
}

/// The status every `*Machine` kind carries, in Cluster API's shape and under these JSON
/// names, beside whatever its backend adds (ADR-0070). A kind's status type embeds it with
/// `#[serde(flatten)]`, so the controller reads it from any kind's `status` without knowing
/// the kind, and the stored JSON is the same as if the fields were written out.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MachineStatusContract {
    /// The machine is created and running.
    #[serde(default)]
    pub ready: bool,
    /// Provisioning progress.
    #[serde(default)]
    pub initialization: MachineInitialization,
    /// The backend's id of the machine, for example
    /// `libvirt://<provider namespace>/<provider>/<domain uuid>`.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        rename = "providerID"
    )]
    pub provider_id: Option<String>,
    /// Addresses of the machine's interfaces.
    #[serde(default)]
    pub addresses: Vec<MachineAddress>,
    /// The guest's own phase, when it publishes one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guest_phase: Option<String>,
    /// Whether the machine is running or saved (ADR-0073); unset until the provider has
    /// looked. A saved machine stays `ready`: it is resumed, not provisioned, when claimed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub standby: Option<Standby>,
    /// PEM certificates of the vTPM's endorsement keys.
    #[serde(default)]
    pub tpm_endorsement_certificates: Vec<String>,
    /// `sha256:<hex>` of each certificate's public key (its DER SubjectPublicKeyInfo), in the
    /// order of `tpmEndorsementCertificates`: what SPIRE's TPM attestor keys an agent on.
    #[serde(default)]
    pub tpm_endorsement_key_digests: Vec<String>,
    /// The guest's SSH host public keys (`TYPE BASE64`, sorted), as its layer published them
    /// before `ready`: what a consumer pins.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ssh_host_keys: Vec<String>,
    /// The login the guest installed `spec.access` for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub login_user: Option<String>,
    /// The guest's attestation key, read when it is first seen ready, and its TPM's answer
    /// to `spec.handover`, relayed unchecked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attestation: Option<crate::handover::Attestation>,
    /// Ready (and GuestReady when the guest reports it), with messages from the guide's
    /// troubleshooting table.
    #[serde(default)]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    /// The generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// The fields every `*Machine` spec carries under these JSON names (ADR-0070): what the
/// controller reads from a machine of any kind. A view for reading only; each kind's spec
/// type declares the fields itself.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MachineSpecContract {
    /// The Provider (same namespace) that realises the machine.
    pub provider_ref: LocalObjectReference,
    /// Whether the machine has an emulated TPM, whose endorsement-key certificates the
    /// machine must report before it is handed out (ADR-0045).
    #[serde(default)]
    pub tpm_enabled: bool,
    /// What the controller asks of the machine while it waits (ADR-0073).
    #[serde(default)]
    pub standby: Option<Standby>,
    /// The Secret key holding its cloud-init user-data, for kinds that take it by reference:
    /// the Provider operator grants the machine's provider that Secret by name.
    #[serde(default)]
    pub user_data_secret_ref: Option<SecretKeySelector>,
    /// Keys to install in the guest (`AccessReady`).
    #[serde(default)]
    pub access: Option<crate::access::ClaimAccess>,
    /// A challenge to relay into the guest's TPM.
    #[serde(default)]
    pub handover: Option<crate::handover::HandoverChallenge>,
}

/// Cluster API's initialization block.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct MachineInitialization {
    /// The machine's infrastructure exists.
    #[serde(default)]
    pub provisioned: bool,
}

/// The LibvirtMachine CRD, its names bounded like a VirtualMachine's.
pub fn libvirt_machine_crd()
-> k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition {
    use kube::CustomResourceExt;
    crate::name_at_most(
        LibvirtMachine::crd(),
        crate::names::MAX_MACHINE_NAME_LEN,
        "a LibvirtMachine's name is at most 180 characters: with its namespace it names the \
         domain's volumes, <namespace>-<name>-cidata.iso, which a host's file system limits \
         to 255 bytes",
    )
}

/// The Provider operator's half of the libvirt backend: `banlieue provider libvirt run`, whose
/// LibvirtMachine rights `banlieue-provider-base` holds, and whose class role is bound in the
/// build namespace (what import Jobs need there), only when the class declares rules.
pub fn libvirt_workload() -> BackendWorkload {
    BackendWorkload {
        kind: crate::MachineKind::LIBVIRT_MACHINE,
        subcommand: "libvirt",
        class_role: ClassRoleScope::BuildNamespace,
        class_role_rules: Vec::new(),
        machines: kube::api::ApiResource::erase::<LibvirtMachine>(&()),
    }
}

impl MachineObject for LibvirtMachine {
    type Status = LibvirtMachineStatus;
    const FINALIZER: &'static str = crate::names::FINALIZER_DOMAIN_PROTECTION;

    fn provider_name(&self) -> &str {
        &self.spec.provider_ref.name
    }

    fn status(&self) -> Option<&LibvirtMachineStatus> {
        self.status.as_ref()
    }

    fn contract(status: &LibvirtMachineStatus) -> &MachineStatusContract {
        &status.contract
    }
}

/// The controller's half of the libvirt backend: LibvirtMachines, built by [`libvirt_spec`],
/// torn down under the domain-protection finalizer; the provider saves and restores them.
pub fn libvirt_machine_backend() -> MachineBackend {
    MachineBackend {
        kind_name: "LibvirtMachine",
        resource: kube::api::ApiResource::erase::<LibvirtMachine>(&()),
        finalizer: crate::names::FINALIZER_DOMAIN_PROTECTION,
        spec: libvirt_spec,
        saves: true,
        enforces_egress: true,
    }
}

/// The libvirt arm: the storage target is the pool, the network target the libvirt network,
/// and the image volume an overlay's backing volume (Immediate) or the install media
/// (Deferred, Manual) of an empty disk (ADR-0040).
pub fn libvirt_spec(input: &MachineInput<'_>) -> Result<Value, BuildError> {
    let placement = input.placement;
    let image = &placement.image;
    let disk = match image.install_mode {
        InstallMode::Immediate => LibvirtDisk {
            backing_volume: Some(image.volume.clone()),
            install_media: None,
            size: image.disk_size.clone(),
        },
        InstallMode::Deferred | InstallMode::Manual => LibvirtDisk {
            backing_volume: None,
            install_media: Some(image.volume.clone()),
            size: image.disk_size.clone(),
        },
    };
    backend::encode(
        "LibvirtMachine",
        LibvirtMachineSpec {
            provider_ref: LocalObjectReference::new(&placement.provider),
            pool: placement.storage_target.clone(),
            network: placement.network_target.clone(),
            disk,
            firmware: input.class.spec.firmware,
            tpm_enabled: input.class.spec.tpm_enabled,
            secure_boot: input.class.spec.secure_boot,
            cpu: input.class.spec.cpu,
            memory: input.class.spec.memory.clone(),
            user_data: input.vm.spec.user_data.clone(),
            user_data_secret_ref: input.vm.spec.user_data_secret_ref.clone(),
            // Born running: the VirtualMachine reconciler asks for `Saved` once the member
            // has reached its pool's readiness (ADR-0073).
            standby: None,
            // A member built after its bind (a claim waiting for a placement) carries its
            // claim's keys from the start; otherwise the bind writes them later.
            access: input.vm.spec.access.clone(),
            handover: input.vm.spec.handover.clone(),
            egress: input.class.spec.egress.clone(),
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A LibvirtMachine status as the provider has always stored it: every field at the top
    /// level of `status`.
    fn stored() -> serde_json::Value {
        json!({
            "ready": true,
            "initialization": {"provisioned": true},
            "providerID": "libvirt://ns/edge-7/0b0e",
            "domainName": "ns-web-01",
            "domainUuid": "0b0e",
            "volumes": ["ns-web-01-os.qcow2"],
            "addresses": [{"type": "InternalIP", "address": "192.0.2.1"}],
            "guestPhase": "ready",
            "tpmEndorsementCertificates": ["PEM"],
            "tpmEndorsementKeyDigests": ["sha256:00"],
            "conditions": [{"type": "Ready", "status": "True", "reason": "DomainRunning",
                            "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}],
            "observedGeneration": 3
        })
    }

    #[test]
    fn a_flattened_contract_stores_the_same_json() {
        let status: LibvirtMachineStatus = serde_json::from_value(stored()).expect("valid status");
        assert!(status.contract.ready);
        assert_eq!(status.contract.observed_generation, Some(3));
        assert_eq!(status.domain_uuid.as_deref(), Some("0b0e"));
        assert_eq!(
            serde_json::to_value(&status).expect("serializable"),
            stored()
        );
        // What an empty status writes is unchanged too.
        assert_eq!(
            serde_json::to_value(LibvirtMachineStatus::default()).expect("serializable"),
            json!({"ready": false, "initialization": {"provisioned": false}, "addresses": [],
                   "tpmEndorsementCertificates": [], "tpmEndorsementKeyDigests": [],
                   "conditions": []})
        );
    }

    #[test]
    fn the_contract_is_read_from_a_kinds_status_without_knowing_the_kind() {
        let contract: MachineStatusContract =
            serde_json::from_value(stored()).expect("backend fields are ignored");
        let status: LibvirtMachineStatus = serde_json::from_value(stored()).expect("valid");
        assert_eq!(contract, status.contract);
        let spec = json!({"providerRef": {"name": "edge-7"}, "pool": "p", "network": "n",
                          "disk": {"backingVolume": "v", "size": "1Gi"}, "tpmEnabled": true,
                          "cpu": 1, "memory": "1Gi"});
        let libvirt: LibvirtMachineSpec = serde_json::from_value(spec).expect("valid spec");
        let view: MachineSpecContract =
            serde_json::from_value(serde_json::to_value(&libvirt).expect("serializable"))
                .expect("every machine spec carries the spec contract");
        assert_eq!(view.provider_ref, libvirt.provider_ref);
        assert_eq!(view.tpm_enabled, libvirt.tpm_enabled);
    }

    /// Every `*Machine` CRD carries the contract: its spec has `providerRef` and `tpmEnabled`,
    /// and its status every field of [`MachineStatusContract`] with the same schema type, so
    /// the controller can read any of them without knowing the kind.
    #[test]
    fn every_machine_crd_carries_the_contract() {
        let contract = schemars::schema_for!(MachineStatusContract);
        let contract = serde_json::to_value(&contract).expect("serializable");
        let fields = contract["properties"]
            .as_object()
            .expect("the contract is an object");
        let machines: Vec<_> = crate::crds()
            .into_iter()
            .filter(|crd| {
                crd.spec.names.kind.ends_with("Machine") && crd.spec.names.kind != "VirtualMachine"
            })
            .collect();
        assert!(!machines.is_empty());
        for crd in machines {
            let kind = &crd.spec.names.kind;
            let schema = serde_json::to_value(
                crd.spec.versions[0]
                    .schema
                    .as_ref()
                    .and_then(|s| s.open_api_v3_schema.as_ref())
                    .expect("a schema"),
            )
            .expect("serializable");
            let spec = &schema["properties"]["spec"]["properties"];
            for field in ["providerRef", "tpmEnabled"] {
                assert!(spec.get(field).is_some(), "{kind}.spec lacks {field}");
            }
            let status = &schema["properties"]["status"]["properties"];
            for (field, contract_schema) in fields {
                let theirs = status
                    .get(field)
                    .unwrap_or_else(|| panic!("{kind}.status lacks {field}"));
                // The contract's own schema says `["string", "null"]` where the CRD's
                // structural one says `string` with `nullable`; a `$ref` has no type here.
                let ours = match contract_schema.get("type") {
                    Some(serde_json::Value::Array(types)) => {
                        types.iter().find(|t| *t != "null").cloned()
                    }
                    other => other.cloned(),
                };
                if let Some(ours) = ours {
                    assert_eq!(theirs.get("type"), Some(&ours), "{kind}.status.{field}");
                }
            }
        }
    }
}

//! VSphereMachine (a VM to clone from a template in vCenter, the vSphere provider's machine) and
//! the vSphere part of a Provider's declared capabilities (ADR-0069).
//!
//! The status carries the same contract fields, under the same JSON names, as
//! LibvirtMachineStatus (ADR-0050), so the controller reads either machine the same way.

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use serde_json::Value;

use crate::backend::{
    self, BackendWorkload, BuildError, ClassRoleScope, MachineBackend, MachineInput, MachineObject,
};
use crate::common::{LocalObjectReference, SecretKeySelector, Standby};
use crate::image::InstallMode;
use crate::machine::MachineStatusContract;
use crate::provider::{ProviderCapabilities, StorageClassMapping};

/// The finalizer a VSphereMachine holds until its VM is destroyed in vCenter (ADR-0026).
pub const FINALIZER_VM_PROTECTION: &str = "banlieue.io/vm-protection";

/// The extraConfig key recording which VSphereMachine (by uid) a VM was cloned for. Not a
/// `guestinfo.` key, so the guest cannot write it: it is the proof of ownership that lets a
/// VM of the machine's name be adopted or destroyed.
pub const EXTRA_CONFIG_MACHINE_UID: &str = "banlieue.machineUid";

/// The extraConfig key a guest-phase layer writes its phase to (ADR-0043).
pub const GUESTINFO_PHASE: &str = "guestinfo.banlieue.phase";

/// The extraConfig key the provider writes a claim's access request to, base64 (ADR-0076).
pub const GUESTINFO_ACCESS: &str = "guestinfo.banlieue.access";

/// The extraConfig key a guest-phase layer answers an access request in, one line as the
/// libvirt layer's `access/state` file holds.
pub const GUESTINFO_ACCESS_STATE: &str = "guestinfo.banlieue.access.state";

/// The extraConfig key a guest-phase layer publishes its SSH host keys in, base64 of the
/// libvirt layer's `ssh/host_keys` file.
pub const GUESTINFO_SSH_HOST_KEYS: &str = "guestinfo.banlieue.ssh.hostKeys";

/// Reasons only the vSphere provider reports.
pub mod reasons {
    /// The VM is powered on: the machine is Ready.
    pub const POWERED_ON: &str = "PoweredOn";
    /// A VM of the machine's name exists but was not cloned for this machine: it is neither
    /// adopted nor destroyed.
    pub const VM_NAME_TAKEN: &str = "VMNameTaken";
    /// `spec.datacenter`, `spec.cluster`, `spec.template`, `spec.folder` or `spec.datastore`
    /// names nothing in vCenter.
    pub const INVENTORY_NOT_FOUND: &str = "InventoryNotFound";
    /// A vSphere call or task failed.
    pub const VSPHERE_ERROR: &str = "VSphereError";
    /// `spec.template` is outside the Provider's declared template folders, or not a template.
    pub const TEMPLATE_REFUSED: &str = "TemplateRefused";
    /// `spec.datacenter` and `spec.cluster` are not a cluster the Provider declared
    /// (`spec.capabilities.vsphere.datacenters`), `spec.datastore` is no declared storage
    /// class's target, or `spec.folder` is not in a declared VM folder
    /// (`spec.capabilities.vsphere.vmFolders`).
    pub const PLACEMENT_NOT_DECLARED: &str = "PlacementNotDeclared";
}

/// The desired state of a VSphereMachine.
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "banlieue.io",
    version = "v1alpha1",
    kind = "VSphereMachine",
    doc = "A vSphere VM to clone from a template and run. The controller writes the spec; the vSphere provider realises it and reports in the status. Complete enough that the provider never reads a VirtualMachine.",
    namespaced,
    status = "VSphereMachineStatus",
    shortname = "vsmachine",
    category = "banlieue",
    printcolumn = r#"{"name":"Provider","type":"string","jsonPath":".spec.providerRef.name"}"#,
    printcolumn = r#"{"name":"Cluster","type":"string","jsonPath":".spec.cluster"}"#,
    printcolumn = r#"{"name":"Ready","type":"boolean","jsonPath":".status.ready"}"#,
    printcolumn = r#"{"name":"Reason","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].reason"}"#,
    printcolumn = r#"{"name":"VM","type":"string","jsonPath":".status.vmMoRef"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "!(has(self.userData) && has(self.userDataSecretRef))",
    "message": "set at most one of userData and userDataSecretRef"
}]))]
pub struct VSphereMachineSpec {
    /// The Provider (same namespace) whose vCenter runs the VM.
    pub provider_ref: LocalObjectReference,
    /// The datacenter, by name.
    #[schemars(length(min = 1, max = 80))]
    pub datacenter: String,
    /// The cluster in that datacenter (the failure domain); the VM goes into its root resource
    /// pool.
    #[schemars(length(min = 1, max = 80))]
    pub cluster: String,
    /// Inventory path of the VM or template to clone, e.g. `DC0/vm/templates/ubuntu-2404`.
    #[schemars(length(min = 1, max = 2048))]
    pub template: String,
    /// Folder for the VM, as a path under the datacenter's VM folder (`banlieue/sandboxes`).
    /// The VM folder itself when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 2048))]
    pub folder: Option<String>,
    /// Datastore for the VM's files, by name in the datacenter. The template's when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 80))]
    pub datastore: Option<String>,
    /// Virtual CPUs.
    #[schemars(range(min = 1, max = 512))]
    pub cpu: u32,
    /// Memory (whole MiB are used).
    pub memory: Quantity,
    /// cloud-init user-data, delivered as `guestinfo.userdata`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 65536))]
    pub user_data: Option<String>,
    /// A Secret key holding cloud-init user-data.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_data_secret_ref: Option<SecretKeySelector>,
    /// The VM has a virtual TPM (the template must carry one); its EK certificates are
    /// published and gate GuestReady (ADR-0045).
    #[serde(default)]
    pub tpm_enabled: bool,
    /// Boot with UEFI Secure Boot: before its first power-on the VM is set to EFI firmware with
    /// `bootOptions.efiSecureBootEnabled`, so the template must boot a signed chain under EFI.
    // Written only when asked for, so that a controller newer than the installed CRD
    // writes no field the API server would drop.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub secure_boot: bool,
    /// `Saved`: suspend the powered-on VM (`SuspendVM_Task`); `Running` or unset: run it,
    /// powering a suspended one on, which resumes it (ADR-0073). The controller writes it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub standby: Option<Standby>,
    /// Keys to install in the guest (`AccessReady`), written to `guestinfo.banlieue.access`
    /// once the guest says ready (ADR-0076). The controller writes it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access: Option<crate::access::ClaimAccess>,
    /// A claim's challenge to the guest's TPM (ADR-0077), as the controller copies it to
    /// every kind. Kept but not relayed: the vSphere provider publishes no EK certificate,
    /// so a claim on it has nothing to verify against (`banlieue claim verify` says so).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub handover: Option<crate::handover::HandoverChallenge>,
}

/// Observed state of a VSphereMachine: the contract every machine kind carries, flattened
/// (so its JSON names are LibvirtMachineStatus's), and what only vSphere knows.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VSphereMachineStatus {
    /// What every machine kind reports: `ready` is a powered-on VM, `providerID` is
    /// `vsphere://<instanceUuid>`, `addresses` are what VMware Tools reports in `guest.net`,
    /// `guestPhase` is `guestinfo.banlieue.phase`.
    #[serde(flatten)]
    pub contract: MachineStatusContract,
    /// The VM's name in vCenter (`<namespace>-<name>`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vm_name: Option<String>,
    /// The VM's managed object reference (`vm-42`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vm_mo_ref: Option<String>,
    /// The VM's vCenter instance UUID (`config.instanceUuid`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance_uuid: Option<String>,
}

/// The vSphere part of a Provider's declared capabilities: where its failure domains are.
/// Declared, never discovered (ADR-0039): the provider publishes one failure domain per
/// declared cluster that exists.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VSphereCapabilities {
    /// Datacenters and, in each, the clusters VMs may run in.
    #[serde(default)]
    #[schemars(
        extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]),
        length(max = 16)
    )]
    pub datacenters: Vec<VSphereDatacenter>,
    /// Inventory folders (`<datacenter>/vm/<folder>`) whose templates VMImages may name as a
    /// `Template` source, and VSphereMachines clone. A path outside every listed folder, or a VM
    /// that is not a template (`config.template`), is refused: otherwise whoever writes a
    /// VMImage could clone any VM the Provider's account sees, with its disks. Empty (the
    /// default): no Template source is accepted.
    #[serde(default)]
    #[schemars(
        extend("x-kubernetes-list-type" = "set"),
        length(max = 16),
        inner(length(min = 1, max = 255))
    )]
    pub template_folders: Vec<String>,
    /// Folders VSphereMachines may be placed in, each a path under the datacenter's VM folder
    /// like `spec.folder` (`banlieue/sandboxes`). A machine's folder must be one of them or lie
    /// under one, compared component by component (`banlieue/sandboxes-old` is not under
    /// `banlieue/sandboxes`, and no component may be `.` or `..`): otherwise whoever writes a
    /// VSphereMachine could put a VM among another tenant's, under its folder's permissions.
    /// Empty (the default): only machines without a folder (the VM folder itself) are placed.
    #[serde(default)]
    #[schemars(
        extend("x-kubernetes-list-type" = "set"),
        length(max = 16),
        inner(length(min = 1, max = 255))
    )]
    pub vm_folders: Vec<String>,
}

/// Why `template` (an inventory path) may not be cloned by this Provider's rules before vCenter
/// is asked, or `None`: it must lie under one of the declared `folders`.
pub fn template_folder_refusal(template: &str, folders: &[String]) -> Option<String> {
    let path = template.trim_matches('/');
    let inside = folders.iter().any(|folder| {
        let folder = folder.trim_matches('/');
        !folder.is_empty()
            && path
                .strip_prefix(folder)
                .is_some_and(|rest| rest.starts_with('/') && rest.len() > 1)
    });
    (!inside).then(|| {
        format!(
            "{template} is not in a template folder the Provider declares \
             (spec.capabilities.vsphere.templateFolders)"
        )
    })
}

/// Why a machine may not be placed as `spec` asks by a Provider declaring `capabilities`, or
/// `None`. Whoever writes the machine names its placement, so, whatever else the Provider's
/// account sees in vCenter (another tenant's cluster, datastore or folder), it must be:
/// a cluster the Provider declared (`vsphere.datacenters`); a datastore one of its storage
/// classes targets, or none (the template's); and a folder in or under one of its
/// `vsphere.vmFolders`, or none (the VM folder). The answer names the field.
pub fn placement_refusal(
    spec: &VSphereMachineSpec,
    capabilities: &ProviderCapabilities,
) -> Option<String> {
    cluster_refusal(
        &spec.datacenter,
        &spec.cluster,
        capabilities.vsphere.as_ref(),
    )
    .or_else(|| datastore_refusal(spec.datastore.as_deref(), &capabilities.storage_classes))
    .or_else(|| folder_refusal(spec.folder.as_deref(), capabilities.vsphere.as_ref()))
}

fn cluster_refusal(
    datacenter: &str,
    cluster: &str,
    capabilities: Option<&VSphereCapabilities>,
) -> Option<String> {
    let declared = capabilities
        .map(|c| c.datacenters.as_slice())
        .unwrap_or_default();
    let listed = declared
        .iter()
        .any(|d| d.name == datacenter && d.clusters.iter().any(|c| c == cluster));
    (!listed).then(|| {
        let names: Vec<String> = declared
            .iter()
            .flat_map(|d| d.clusters.iter().map(|c| failure_domain_name(&d.name, c)))
            .collect();
        format!(
            "spec.datacenter {datacenter} and spec.cluster {cluster} are not a cluster the \
             Provider declares (spec.capabilities.vsphere.datacenters: {})",
            listing(&names)
        )
    })
}

fn datastore_refusal(
    datastore: Option<&str>,
    storage_classes: &[StorageClassMapping],
) -> Option<String> {
    let datastore = datastore?;
    let mut declared: Vec<&str> = storage_classes
        .iter()
        .map(|c| c.target.pool.as_str())
        .collect();
    declared.sort_unstable();
    declared.dedup();
    (!declared.contains(&datastore)).then(|| {
        format!(
            "spec.datastore {datastore} is not a datastore the Provider declares \
             (spec.capabilities.storageClasses: {})",
            listing(&declared)
        )
    })
}

fn folder_refusal(
    folder: Option<&str>,
    capabilities: Option<&VSphereCapabilities>,
) -> Option<String> {
    let folder = folder?;
    let declared = capabilities
        .map(|c| c.vm_folders.as_slice())
        .unwrap_or_default();
    // An empty path is the VM folder itself, as when unset.
    let inside = match folder_components(folder) {
        Some(path) if path.is_empty() => true,
        Some(path) => declared
            .iter()
            .any(|d| folder_components(d).is_some_and(|d| !d.is_empty() && path.starts_with(&d))),
        None => false,
    };
    (!inside).then(|| {
        format!(
            "spec.folder {folder} is not a VM folder the Provider declares, nor under one \
             (spec.capabilities.vsphere.vmFolders: {})",
            listing(declared)
        )
    })
}

/// The components of a folder path under a VM folder, leading and trailing `/` aside; `None`
/// when one is empty, `.` or `..`, which name no folder of their own.
fn folder_components(path: &str) -> Option<Vec<&str>> {
    let path = path.trim_matches('/');
    if path.is_empty() {
        return Some(Vec::new());
    }
    let components: Vec<&str> = path.split('/').collect();
    components
        .iter()
        .all(|c| !c.is_empty() && *c != "." && *c != "..")
        .then_some(components)
}

/// Declared names for a refusal's message: comma-separated, `none` when there are none.
fn listing<S: std::borrow::Borrow<str>>(names: &[S]) -> String {
    if names.is_empty() {
        "none".to_owned()
    } else {
        names.join(", ")
    }
}

/// One declared datacenter.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VSphereDatacenter {
    /// The datacenter's name. No `/`: a failure domain is named `<datacenter>/<cluster>`.
    #[schemars(length(min = 1, max = 80), pattern(r"^[^/]+$"))]
    pub name: String,
    /// Clusters of that datacenter, by name (no `/`): each is one failure domain.
    #[serde(default)]
    #[schemars(
        extend("x-kubernetes-list-type" = "set"),
        length(max = 64),
        inner(length(min = 1, max = 80), pattern(r"^[^/]+$"))
    )]
    pub clusters: Vec<String>,
}

/// The failure domain of a cluster: `<datacenter>/<cluster>`.
pub fn failure_domain_name(datacenter: &str, cluster: &str) -> String {
    format!("{datacenter}/{cluster}")
}

/// The datacenter and cluster of a failure domain named by [`failure_domain_name`].
pub fn parse_failure_domain_name(name: &str) -> Option<(&str, &str)> {
    name.split_once('/')
        .filter(|(dc, cluster)| !dc.is_empty() && !cluster.is_empty() && !cluster.contains('/'))
}

/// The provider ID of a VM: `vsphere://<instanceUuid>`, as Cluster API's vSphere provider
/// writes it.
pub fn provider_id(instance_uuid: &str) -> String {
    format!("vsphere://{instance_uuid}")
}

/// The VSphereMachine CRD, its names bounded like a VirtualMachine's.
pub fn crd()
-> k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition {
    use kube::CustomResourceExt;
    crate::name_at_most(
        VSphereMachine::crd(),
        crate::names::MAX_MACHINE_NAME_LEN,
        "a VSphereMachine's name is at most 180 characters, like its VirtualMachine's",
    )
}

/// The Provider operator's half of the vSphere backend: `banlieue provider vsphere run`, whose
/// class role, bound in the Provider's namespace, holds its VSphereMachine rights.
pub fn workload() -> BackendWorkload {
    BackendWorkload {
        kind: crate::MachineKind::VSPHERE_MACHINE,
        subcommand: "vsphere",
        class_role: ClassRoleScope::ProviderNamespace,
        class_role_rules: backend::machine_rules("vspheremachines"),
        machines: kube::api::ApiResource::erase::<VSphereMachine>(&()),
    }
}

impl MachineObject for VSphereMachine {
    type Status = VSphereMachineStatus;
    const FINALIZER: &'static str = FINALIZER_VM_PROTECTION;

    fn provider_name(&self) -> &str {
        &self.spec.provider_ref.name
    }

    fn status(&self) -> Option<&VSphereMachineStatus> {
        self.status.as_ref()
    }

    fn contract(status: &VSphereMachineStatus) -> &MachineStatusContract {
        &status.contract
    }
}

/// The controller's half of the vSphere backend: VSphereMachines, built by
/// [`vsphere_spec`], torn down under the vm-protection finalizer; the provider suspends and
/// resumes them.
pub fn machine_backend() -> MachineBackend {
    MachineBackend {
        kind_name: "VSphereMachine",
        resource: kube::api::ApiResource::erase::<VSphereMachine>(&()),
        finalizer: FINALIZER_VM_PROTECTION,
        spec: vsphere_spec,
        saves: true,
        // vSphere's port groups have no per-VM filter banlieue drives (yet): a class with
        // egress is refused there rather than run unfiltered.
        enforces_egress: false,
    }
}

/// The vSphere arm (ADR-0069): the failure domain is `<datacenter>/<cluster>`, the storage
/// target a datastore, and the image volume the inventory path of the template the VM is
/// cloned from. A clone boots its template's disk, so only Immediate images can be placed; the
/// VM keeps the template's disk size, firmware and network adapters (the network target names
/// a network the failure domain offers, which the template's adapters are expected to use).
pub fn vsphere_spec(input: &MachineInput<'_>) -> Result<Value, BuildError> {
    const KIND: &str = "VSphereMachine";
    let placement = input.placement;
    let (datacenter, cluster) =
        parse_failure_domain_name(&placement.failure_domain).ok_or_else(|| {
            BuildError::Unbuildable {
                kind: KIND,
                message: format!(
                    "failure domain {:?} is not <datacenter>/<cluster>",
                    placement.failure_domain
                ),
            }
        })?;
    if placement.image.install_mode != InstallMode::Immediate {
        return Err(BuildError::Unbuildable {
            kind: KIND,
            message: format!(
                "a VM is cloned from its image's template: install mode {:?} cannot be realised",
                placement.image.install_mode
            ),
        });
    }
    backend::encode(
        KIND,
        VSphereMachineSpec {
            provider_ref: LocalObjectReference::new(&placement.provider),
            datacenter: datacenter.to_owned(),
            cluster: cluster.to_owned(),
            template: placement.image.volume.clone(),
            folder: None,
            datastore: Some(placement.storage_target.clone()),
            cpu: input.class.spec.cpu,
            memory: input.class.spec.memory.clone(),
            user_data: input.vm.spec.user_data.clone(),
            user_data_secret_ref: input.vm.spec.user_data_secret_ref.clone(),
            tpm_enabled: input.class.spec.tpm_enabled,
            secure_boot: input.class.spec.secure_boot,
            // Born running: the VirtualMachine reconciler asks for `Saved` (a suspended VM)
            // once the member has reached its pool's readiness (ADR-0073).
            standby: None,
            // A member built after its bind (a claim waiting for a placement) carries its
            // claim's keys from the start; otherwise the bind writes them later.
            access: input.vm.spec.access.clone(),
            handover: input.vm.spec.handover.clone(),
        },
    )
}

#[cfg(test)]
mod tests {

    #[test]
    fn a_template_must_lie_under_a_declared_folder() {
        let folders = vec!["DC0/vm/templates".to_owned(), "/DC1/vm/".to_owned()];
        assert_eq!(
            template_folder_refusal("DC0/vm/templates/ubuntu", &folders),
            None
        );
        assert_eq!(
            template_folder_refusal("DC0/vm/templates/a/b", &folders),
            None
        );
        assert_eq!(template_folder_refusal("DC1/vm/golden", &folders), None);
        for outside in [
            "DC0/vm/templates",
            "DC0/vm/templates-old/x",
            "DC0/vm/other",
            "DC2/vm/templates/x",
            "DC0/vm/templates/",
        ] {
            let why = template_folder_refusal(outside, &folders).expect(outside);
            assert!(why.contains("templateFolders"), "{why}");
        }
        assert!(template_folder_refusal("DC0/vm/templates/x", &[]).is_some());
        assert!(template_folder_refusal("DC0/vm/x", &["/".to_owned()]).is_some());
    }

    use super::*;

    /// A Provider declaring cluster DC0/C0, datastores LocalDS_0 and LocalDS_1 and the VM
    /// folder `banlieue/sandboxes`.
    fn declared() -> ProviderCapabilities {
        let class = |name: &str, pool: &str| StorageClassMapping {
            name: name.into(),
            target: crate::provider::StorageTarget { pool: pool.into() },
        };
        ProviderCapabilities {
            storage_classes: vec![
                class("fast", "LocalDS_1"),
                class("standard", "LocalDS_0"),
                class("cheap", "LocalDS_0"),
            ],
            vsphere: Some(VSphereCapabilities {
                datacenters: vec![VSphereDatacenter {
                    name: "DC0".into(),
                    clusters: vec!["C0".into()],
                }],
                template_folders: Vec::new(),
                vm_folders: vec!["banlieue/sandboxes".into()],
            }),
            ..ProviderCapabilities::default()
        }
    }

    /// A machine in DC0/C0 with neither datastore nor folder.
    fn machine() -> VSphereMachineSpec {
        VSphereMachineSpec {
            provider_ref: LocalObjectReference::new("vc"),
            datacenter: "DC0".into(),
            cluster: "C0".into(),
            template: "DC0/vm/templates/ubuntu".into(),
            folder: None,
            datastore: None,
            cpu: 1,
            memory: Quantity("1Gi".into()),
            user_data: None,
            user_data_secret_ref: None,
            tpm_enabled: false,
            secure_boot: false,
            standby: None,
            access: None,
            handover: None,
        }
    }

    #[test]
    fn only_declared_clusters_take_machines() {
        let caps = declared();
        assert_eq!(placement_refusal(&machine(), &caps), None);
        let mgmt = VSphereMachineSpec {
            cluster: "mgmt".into(),
            ..machine()
        };
        assert_eq!(
            placement_refusal(&mgmt, &caps).as_deref(),
            Some(
                "spec.datacenter DC0 and spec.cluster mgmt are not a cluster the Provider \
                 declares (spec.capabilities.vsphere.datacenters: DC0/C0)"
            )
        );
        let dc1 = VSphereMachineSpec {
            datacenter: "DC1".into(),
            ..machine()
        };
        assert!(placement_refusal(&dc1, &caps).is_some());
        let none = ProviderCapabilities {
            vsphere: None,
            ..declared()
        };
        assert!(
            placement_refusal(&machine(), &none).is_some_and(|m| m.ends_with("datacenters: none)"))
        );
    }

    #[test]
    fn only_declared_datastores_take_machines() {
        let caps = declared();
        let on = |ds: &str| VSphereMachineSpec {
            datastore: Some(ds.into()),
            ..machine()
        };
        assert_eq!(placement_refusal(&on("LocalDS_0"), &caps), None);
        assert_eq!(placement_refusal(&on("LocalDS_1"), &caps), None);
        assert_eq!(
            placement_refusal(&on("SharedDS"), &caps).as_deref(),
            Some(
                "spec.datastore SharedDS is not a datastore the Provider declares \
                 (spec.capabilities.storageClasses: LocalDS_0, LocalDS_1)"
            )
        );
        // A storage class's name is no datastore.
        assert!(placement_refusal(&on("standard"), &caps).is_some());
        let no_classes = ProviderCapabilities {
            storage_classes: Vec::new(),
            ..declared()
        };
        assert!(
            placement_refusal(&on("LocalDS_0"), &no_classes)
                .is_some_and(|m| m.ends_with("storageClasses: none)"))
        );
        // Unset: the template's datastore, whatever is declared.
        assert_eq!(placement_refusal(&machine(), &no_classes), None);
    }

    #[test]
    fn only_declared_folders_take_machines() {
        let caps = declared();
        let into = |folder: &str| VSphereMachineSpec {
            folder: Some(folder.into()),
            ..machine()
        };
        for inside in [
            "banlieue/sandboxes",
            "/banlieue/sandboxes/",
            "banlieue/sandboxes/alice",
            "banlieue/sandboxes/alice/web",
            // The VM folder itself, as when unset.
            "/",
        ] {
            assert_eq!(placement_refusal(&into(inside), &caps), None, "{inside}");
        }
        for outside in [
            "banlieue",
            "banlieue/sandboxes-evil",
            "banlieue/sandboxesx/a",
            "banlieue/sandboxes/../prod",
            "banlieue/sandboxes/./a",
            "banlieue//sandboxes",
            "banlieue/sandboxes//a",
            "Banlieue/sandboxes",
            "prod",
        ] {
            let why = placement_refusal(&into(outside), &caps).expect(outside);
            assert!(
                why.starts_with(&format!("spec.folder {outside} is not a VM folder"))
                    && why.ends_with("(spec.capabilities.vsphere.vmFolders: banlieue/sandboxes)"),
                "{why}"
            );
        }
        // With none declared, only the VM folder itself.
        let none = ProviderCapabilities {
            vsphere: Some(VSphereCapabilities {
                vm_folders: Vec::new(),
                ..declared().vsphere.expect("vsphere")
            }),
            ..declared()
        };
        assert_eq!(placement_refusal(&machine(), &none), None);
        assert_eq!(placement_refusal(&into("/"), &none), None);
        assert!(
            placement_refusal(&into("banlieue/sandboxes"), &none)
                .is_some_and(|m| m.ends_with("vmFolders: none)"))
        );
        // A declared folder that names no folder of its own declares nothing.
        for nothing in ["/", "a/../banlieue", "banlieue//sandboxes"] {
            let odd = ProviderCapabilities {
                vsphere: Some(VSphereCapabilities {
                    vm_folders: vec![nothing.into()],
                    ..declared().vsphere.expect("vsphere")
                }),
                ..declared()
            };
            for folder in ["banlieue/sandboxes", "a", "banlieue"] {
                assert!(
                    placement_refusal(&into(folder), &odd).is_some(),
                    "{nothing} declares {folder}"
                );
            }
        }
    }

    #[test]
    fn failure_domain_names_round_trip() {
        let name = failure_domain_name("DC0", "DC0_C1");
        assert_eq!(name, "DC0/DC0_C1");
        assert_eq!(parse_failure_domain_name(&name), Some(("DC0", "DC0_C1")));
        assert_eq!(parse_failure_domain_name("host-7"), None);
        assert_eq!(parse_failure_domain_name("a/b/c"), None);
        assert_eq!(parse_failure_domain_name("/b"), None);
    }

    #[test]
    fn the_status_uses_the_contract_names() {
        let status = VSphereMachineStatus {
            contract: MachineStatusContract {
                provider_id: Some(provider_id("5003")),
                ..Default::default()
            },
            vm_mo_ref: Some("vm-42".into()),
            ..Default::default()
        };
        let json = serde_json::to_value(&status).unwrap();
        assert_eq!(json["providerID"], "vsphere://5003");
        assert_eq!(json["vmMoRef"], "vm-42");
        for key in [
            "ready",
            "initialization",
            "addresses",
            "tpmEndorsementCertificates",
            "tpmEndorsementKeyDigests",
            "conditions",
        ] {
            assert!(json.get(key).is_some(), "{key}");
        }
    }
}

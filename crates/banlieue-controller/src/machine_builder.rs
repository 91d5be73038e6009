//! The one place the controller knows machine kinds (ADR-0070, ADR-0071). A [`MachineBackend`]
//! is a kind's builder: the API resource its machines are stored as, its provider's finalizer
//! and the function that writes a machine's `spec` from a [`Placement`]. The controller builds
//! the kinds its [`MachineBackends`] hold ([`MachineBackends::built_in`]: LibvirtMachine and
//! VSphereMachine, unless the embedding binary adds one); everything else (the common
//! metadata, applying, reading, caching, mirroring and deleting machines) goes through
//! `DynamicObject`s and the contract every kind carries ([`MachineSpecContract`],
//! [`MachineStatusContract`]), so a new kind needs its CRD, one builder and its provider.

use std::sync::Arc;

use banlieue_api::names;
use banlieue_api::{
    InstallMode, LibvirtDisk, LibvirtMachine, LibvirtMachineSpec, LocalObjectReference,
    MachineKind, MachineReference, MachineSpecContract, MachineStatusContract, VMClass,
    VSphereMachine, VSphereMachineSpec, VirtualMachine, vsphere,
};
use kube::api::{Api, ApiResource, DynamicObject};
use kube::{Client, Resource, ResourceExt};
use serde_json::Value;

use crate::scheduling::{Placement, controller_owner_reference};

/// What the controller needs of one machine kind.
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

/// The machine kinds a controller builds, in the order their caches are started.
#[derive(Clone, Debug)]
pub struct MachineBackends(Arc<[MachineBackend]>);

impl Default for MachineBackends {
    fn default() -> MachineBackends {
        MachineBackends::built_in()
    }
}

impl MachineBackends {
    /// The kinds banlieue ships: LibvirtMachine and VSphereMachine. The test
    /// `every_machine_crd_has_a_backend` fails until a kind with a CRD in `deploy/crds` is
    /// listed here.
    pub fn built_in() -> MachineBackends {
        MachineBackends(Arc::new([
            MachineBackend {
                kind_name: "LibvirtMachine",
                resource: ApiResource::erase::<LibvirtMachine>(&()),
                finalizer: names::FINALIZER_DOMAIN_PROTECTION,
                spec: libvirt_spec,
                saves: true,
            },
            MachineBackend {
                kind_name: "VSphereMachine",
                resource: ApiResource::erase::<VSphereMachine>(&()),
                finalizer: vsphere::FINALIZER_VM_PROTECTION,
                spec: vsphere_spec,
                saves: true,
            },
        ]))
    }

    /// These kinds and `backend`'s, which replaces a built-in of the same kind.
    pub fn with(self, backend: MachineBackend) -> MachineBackends {
        let mut backends: Vec<MachineBackend> = self
            .0
            .iter()
            .filter(|known| known.kind_name != backend.kind_name)
            .cloned()
            .collect();
        backends.push(backend);
        MachineBackends(backends.into())
    }

    /// Every kind, in order.
    pub fn iter(&self) -> impl Iterator<Item = &MachineBackend> {
        self.0.iter()
    }

    /// The builder of `kind`, when this controller has one.
    pub fn get(&self, kind: &MachineKind) -> Option<&MachineBackend> {
        self.0
            .iter()
            .find(|backend| backend.kind_name == kind.as_str())
    }

    /// The builder of the kind a VirtualMachine's `machineRef` names, when the controller
    /// has one.
    pub fn of_reference(&self, reference: &MachineReference) -> Option<&MachineBackend> {
        self.0.iter().find(|backend| {
            backend.resource.kind == reference.kind
                && backend.resource.api_version == reference.api_version
        })
    }
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
fn encode(kind: &'static str, spec: impl serde::Serialize) -> Result<Value, BuildError> {
    serde_json::to_value(spec).map_err(|source| BuildError::Spec { kind, source })
}

/// Builds the machine of a placed VirtualMachine, of the placement's kind: same name and
/// namespace, controlled by the VirtualMachine (so the garbage collector would also remove
/// it), holding its provider's finalizer, labelled as banlieue's, annotated with its failure
/// domain, and a spec complete enough that the provider never reads the VirtualMachine.
pub fn build(
    backend: &MachineBackend,
    input: &MachineInput<'_>,
) -> Result<DynamicObject, BuildError> {
    let owner = controller_owner_reference(input.vm).ok_or(BuildError::Unnamed)?;
    let name = input
        .vm
        .metadata
        .name
        .as_deref()
        .ok_or(BuildError::Unnamed)?;
    let spec = (backend.spec)(input)?;
    let mut machine = DynamicObject::new(name, &backend.resource);
    machine.metadata.namespace = input.vm.metadata.namespace.clone();
    machine.metadata.owner_references = Some(vec![owner]);
    machine.metadata.finalizers = Some(vec![backend.finalizer.to_owned()]);
    machine.metadata.labels = Some(
        [(
            names::LABEL_MANAGED_BY.to_owned(),
            crate::FIELD_MANAGER.to_owned(),
        )]
        .into(),
    );
    machine.metadata.annotations = Some(
        [(
            names::ANNOTATION_FAILURE_DOMAIN.to_owned(),
            input.placement.failure_domain.clone(),
        )]
        .into(),
    );
    machine.data = serde_json::json!({ "spec": spec });
    Ok(machine)
}

/// The libvirt arm: the storage target is the pool, the network target the libvirt network,
/// and the image volume an overlay's backing volume (Immediate) or the install media
/// (Deferred, Manual) of an empty disk (ADR-0040).
fn libvirt_spec(input: &MachineInput<'_>) -> Result<Value, BuildError> {
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
    encode(
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
        },
    )
}

/// The vSphere arm (ADR-0069): the failure domain is `<datacenter>/<cluster>`, the storage
/// target a datastore, and the image volume the inventory path of the template the VM is
/// cloned from. A clone boots its template's disk, so only Immediate images can be placed; the
/// VM keeps the template's disk size, firmware and network adapters (the network target names
/// a network the failure domain offers, which the template's adapters are expected to use).
fn vsphere_spec(input: &MachineInput<'_>) -> Result<Value, BuildError> {
    const KIND: &str = "VSphereMachine";
    let placement = input.placement;
    let (datacenter, cluster) = vsphere::parse_failure_domain_name(&placement.failure_domain)
        .ok_or_else(|| BuildError::Unbuildable {
            kind: KIND,
            message: format!(
                "failure domain {:?} is not <datacenter>/<cluster>",
                placement.failure_domain
            ),
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
    encode(
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
        },
    )
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
    pub disk_size: k8s_openapi::apimachinery::pkg::api::resource::Quantity,
    pub firmware: banlieue_api::Firmware,
    /// UEFI Secure Boot with the default keys enrolled; written only when asked for, so a
    /// backend whose schema predates it sees the shape it always did.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub secure_boot: bool,
    pub cpu: u32,
    pub memory: k8s_openapi::apimachinery::pkg::api::resource::Quantity,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_data: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_data_secret_ref: Option<banlieue_api::SecretKeySelector>,
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

/// A machine of any kind as the controller sees it: its object and the contract it carries.
#[derive(Clone, Debug)]
pub struct Machine {
    pub kind: MachineKind,
    /// The group and version its kind is served at.
    pub api_version: String,
    pub object: DynamicObject,
    pub spec: MachineSpecContract,
    /// The default (nothing reported) until the provider writes a status.
    pub status: MachineStatusContract,
}

/// A machine object whose spec or status does not carry the contract.
#[derive(Debug, thiserror::Error)]
#[error("{kind} {name} does not carry the machine contract")]
pub struct ContractError {
    pub kind: &'static str,
    pub name: String,
    #[source]
    pub source: serde_json::Error,
}

impl Machine {
    /// Reads the contract out of `object`, a machine of `backend`'s kind.
    pub fn read(backend: &MachineBackend, object: DynamicObject) -> Result<Machine, ContractError> {
        let error = |source| ContractError {
            kind: backend.kind_name,
            name: object.name_any(),
            source,
        };
        let spec = serde_json::from_value(object.data.get("spec").cloned().unwrap_or_default())
            .map_err(error)?;
        let status = match object.data.get("status") {
            None | Some(Value::Null) => MachineStatusContract::default(),
            Some(status) => serde_json::from_value(status.clone()).map_err(error)?,
        };
        Ok(Machine {
            kind: backend.kind(),
            api_version: backend.resource.api_version.clone(),
            object,
            spec,
            status,
        })
    }

    /// Its `machineRef`.
    pub fn reference(&self) -> MachineReference {
        MachineReference {
            api_version: self.api_version.clone(),
            kind: self.kind.to_string(),
            name: self.object.name_any(),
        }
    }

    /// Whether the machine is controlled by the object with `uid`.
    pub fn owned_by(&self, uid: &str) -> bool {
        self.object.owner_references().iter().any(|o| o.uid == uid)
    }

    /// The failure domain the machine records it was scheduled into.
    pub fn failure_domain(&self) -> Option<&str> {
        self.object
            .meta()
            .annotations
            .as_ref()?
            .get(names::ANNOTATION_FAILURE_DOMAIN)
            .map(String::as_str)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduling::PlacedImage;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use kube::CustomResourceExt;
    use serde_json::json;

    /// The built-in builder of `kind`.
    fn backend(kind: MachineKind) -> MachineBackend {
        MachineBackends::built_in()
            .get(&kind)
            .expect("a built-in kind")
            .clone()
    }

    fn vm() -> VirtualMachine {
        serde_json::from_value(json!({
            "apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachine",
            "metadata": {"name": "web-01", "namespace": "ns", "uid": "vm-uid"},
            "spec": {"classRef": {"name": "small"}, "imageRef": {"name": "img"},
                     "storageClassName": "gold", "networkClassName": "prod",
                     "userData": "#cloud-config\n"}
        }))
        .expect("valid VirtualMachine")
    }

    fn class() -> VMClass {
        serde_json::from_value(json!({
            "apiVersion": "banlieue.io/v1alpha1", "kind": "VMClass",
            "metadata": {"name": "small"},
            "spec": {"cpu": 2, "memory": "2Gi", "tpmEnabled": true, "firmware": "efi",
                     "secureBoot": true}
        }))
        .expect("valid VMClass")
    }

    fn placement(mode: InstallMode) -> Placement {
        Placement {
            provider: "host-1".into(),
            provider_class: "libvirt".into(),
            machine_kind: MachineKind::LIBVIRT_MACHINE,
            failure_domain: "rack-a".into(),
            storage_target: "nvme".into(),
            network_target: "br-prod".into(),
            image: PlacedImage {
                volume: "img.qcow2".into(),
                install_mode: mode,
                disk_size: Quantity("20Gi".into()),
            },
            image_revision: Some("r7".into()),
        }
    }

    /// A tokio test only because a client needs a runtime; it never reaches a server.
    #[tokio::test]
    async fn a_libvirt_placement_builds_a_libvirt_machine_applied_through_its_api() {
        let (vm, class) = (vm(), class());
        let placement = placement(InstallMode::Immediate);
        let object = build(
            &backend(placement.machine_kind.clone()),
            &MachineInput {
                vm: &vm,
                class: &class,
                placement: &placement,
            },
        )
        .expect("buildable");
        let types = object.types.clone().expect("typed");
        assert_eq!(
            (types.api_version.as_str(), types.kind.as_str()),
            ("banlieue.io/v1alpha1", "LibvirtMachine")
        );
        let resource = backend(MachineKind::LIBVIRT_MACHINE).resource;
        assert_eq!(resource.plural, "libvirtmachines");
        let url = backend(MachineKind::LIBVIRT_MACHINE)
            .api(
                &Client::try_from(kube::Config::new(
                    "http://127.0.0.1:9".parse().expect("valid url"),
                ))
                .expect("client"),
                "ns",
            )
            .resource_url()
            .to_owned();
        assert_eq!(
            url,
            "/apis/banlieue.io/v1alpha1/namespaces/ns/libvirtmachines"
        );

        // The object is a LibvirtMachine the provider can read, complete without the VM.
        let machine: LibvirtMachine =
            serde_json::from_value(serde_json::to_value(&object).expect("serializable"))
                .expect("a valid LibvirtMachine");
        assert_eq!(machine.metadata.namespace.as_deref(), Some("ns"));
        let owner = &machine.metadata.owner_references.as_ref().expect("owned")[0];
        assert_eq!(
            (owner.kind.as_str(), owner.uid.as_str()),
            ("VirtualMachine", "vm-uid")
        );
        assert_eq!(
            (owner.controller, owner.block_owner_deletion),
            (Some(true), Some(true))
        );
        // Created holding the provider's finalizer, so the provider never writes it.
        assert_eq!(
            machine.metadata.finalizers,
            Some(vec![names::FINALIZER_DOMAIN_PROTECTION.to_owned()])
        );
        let spec = &machine.spec;
        assert_eq!(spec.provider_ref.name, "host-1");
        assert_eq!(
            (spec.pool.as_str(), spec.network.as_str()),
            ("nvme", "br-prod")
        );
        assert_eq!(spec.disk.backing_volume.as_deref(), Some("img.qcow2"));
        assert_eq!(spec.disk.install_media, None);
        assert_eq!(spec.disk.size.0, "20Gi");
        assert!(spec.tpm_enabled);
        assert_eq!(spec.firmware, banlieue_api::Firmware::Efi);
        assert!(spec.secure_boot);
        assert_eq!((spec.cpu, spec.memory.0.as_str()), (2, "2Gi"));
        assert_eq!(spec.user_data.as_deref(), Some("#cloud-config\n"));

        // Read back as any machine: the contract and the failure domain.
        let read = Machine::read(&backend(MachineKind::LIBVIRT_MACHINE), object).expect("contract");
        assert_eq!(read.spec.provider_ref.name, "host-1");
        assert!(read.spec.tpm_enabled);
        assert_eq!(read.failure_domain(), Some("rack-a"));
        assert!(read.owned_by("vm-uid"));
        assert_eq!(read.status, MachineStatusContract::default());
    }

    #[test]
    fn deferred_and_manual_images_are_install_media_of_an_empty_disk() {
        let (vm, class) = (vm(), class());
        for mode in [InstallMode::Deferred, InstallMode::Manual] {
            let placement = placement(mode);
            let object = build(
                &backend(placement.machine_kind.clone()),
                &MachineInput {
                    vm: &vm,
                    class: &class,
                    placement: &placement,
                },
            )
            .expect("buildable");
            let disk = &object.data["spec"]["disk"];
            assert_eq!(disk["installMedia"], "img.qcow2", "{mode:?}");
            assert!(disk.get("backingVolume").is_none(), "{mode:?}");
        }
    }

    #[test]
    fn a_machine_reference_names_its_kind() {
        let backends = MachineBackends::built_in();
        let reference = backend(MachineKind::LIBVIRT_MACHINE).reference("web-01");
        assert_eq!(
            (reference.api_version.as_str(), reference.kind.as_str()),
            ("banlieue.io/v1alpha1", "LibvirtMachine")
        );
        let found = |reference: &MachineReference| {
            backends.of_reference(reference).map(MachineBackend::kind)
        };
        assert_eq!(found(&reference), Some(MachineKind::LIBVIRT_MACHINE));
        let unknown = MachineReference {
            kind: "OtherMachine".into(),
            ..reference.clone()
        };
        assert_eq!(found(&unknown), None);
        let other_version = MachineReference {
            api_version: "banlieue.io/v1beta1".into(),
            ..reference
        };
        assert_eq!(found(&other_version), None);
    }

    /// A builder the embedding binary adds is found by its kind and its references, builds
    /// the placement as its spec, and replaces a built-in of the same kind.
    #[test]
    fn an_added_backend_is_built_beside_the_built_in_ones() {
        let added = MachineBackend::of_placement(
            "test.banlieue.io/v1alpha1",
            "MemoryMachine",
            "memorymachines",
            "test.banlieue.io/memory-protection",
        );
        assert_eq!(added.resource.group, "test.banlieue.io");
        assert_eq!(added.resource.version, "v1alpha1");
        let backends = MachineBackends::built_in().with(added.clone());
        let kinds: Vec<&str> = backends.iter().map(|b| b.kind_name).collect();
        assert_eq!(kinds, ["LibvirtMachine", "VSphereMachine", "MemoryMachine"]);
        let memory = MachineKind::new("MemoryMachine").expect("a kind");
        let found = backends.get(&memory).expect("added");
        assert_eq!(found.finalizer, "test.banlieue.io/memory-protection");
        assert_eq!(
            backends
                .of_reference(&added.reference("m"))
                .map(|b| b.kind_name),
            Some("MemoryMachine")
        );
        assert!(MachineBackends::built_in().get(&memory).is_none());

        let (vm, class) = (vm(), class());
        let placement = Placement {
            machine_kind: memory,
            ..placement(InstallMode::Deferred)
        };
        let object = build(
            found,
            &MachineInput {
                vm: &vm,
                class: &class,
                placement: &placement,
            },
        )
        .expect("buildable");
        assert_eq!(
            object.types.as_ref().expect("typed").api_version,
            "test.banlieue.io/v1alpha1"
        );
        assert_eq!(
            object.metadata.finalizers,
            Some(vec!["test.banlieue.io/memory-protection".to_owned()])
        );
        let spec: PlacementSpec =
            serde_json::from_value(object.data["spec"].clone()).expect("a placement spec");
        assert_eq!(spec.provider_ref.name, "host-1");
        assert_eq!(
            (spec.failure_domain.as_str(), spec.storage_target.as_str()),
            ("rack-a", "nvme")
        );
        assert_eq!(
            (spec.image_volume.as_str(), spec.install_mode),
            ("img.qcow2", InstallMode::Deferred)
        );
        assert_eq!((spec.cpu, spec.memory.0.as_str()), (2, "2Gi"));
        assert!(spec.tpm_enabled);
        assert!(spec.secure_boot);
        assert_eq!(spec.user_data.as_deref(), Some("#cloud-config\n"));
        // Without Secure Boot the shape is the one it was before the field existed.
        let mut plain = class.clone();
        plain.spec.secure_boot = false;
        let without = build(
            found,
            &MachineInput {
                vm: &vm,
                class: &plain,
                placement: &placement,
            },
        )
        .expect("buildable");
        assert_eq!(without.data["spec"].get("secureBoot"), None);
        assert_eq!(object.data["spec"]["secureBoot"], json!(true));
        let read = Machine::read(found, object).expect("the contract");
        assert_eq!(read.reference().api_version, "test.banlieue.io/v1alpha1");
        assert_eq!(read.reference().kind, "MemoryMachine");

        let replaced = MachineBackends::built_in().with(MachineBackend {
            finalizer: "other",
            ..backend(MachineKind::LIBVIRT_MACHINE)
        });
        let kinds: Vec<&str> = replaced.iter().map(|b| b.kind_name).collect();
        assert_eq!(kinds, ["VSphereMachine", "LibvirtMachine"]);
        assert_eq!(
            replaced
                .get(&MachineKind::LIBVIRT_MACHINE)
                .map(|b| b.finalizer),
            Some("other")
        );
    }

    /// Machine CRDs whose builder arm is still to be written. A new `*Machine` CRD fails
    /// `every_machine_crd_has_a_backend` until it has an arm or is listed here.
    const AWAITING_A_BUILDER: &[&str] = &[];

    #[test]
    fn every_machine_crd_has_a_backend() {
        let crds: Vec<String> = banlieue_api::crds()
            .into_iter()
            .map(|crd| crd.spec.names.kind)
            .filter(|kind| kind.ends_with("Machine") && kind != "VirtualMachine")
            .filter(|kind| !AWAITING_A_BUILDER.contains(&kind.as_str()))
            .collect();
        let backends: Vec<String> = MachineBackends::built_in()
            .iter()
            .map(|backend| backend.resource.kind.clone())
            .collect();
        assert_eq!(crds, backends);
        assert_eq!(
            backend(MachineKind::LIBVIRT_MACHINE).resource.kind,
            LibvirtMachine::crd().spec.names.kind
        );
        assert_eq!(
            backend(MachineKind::VSPHERE_MACHINE).resource.kind,
            VSphereMachine::crd().spec.names.kind
        );
        let built_in = MachineBackends::built_in();
        for backend in built_in.iter() {
            let found = built_in.of_reference(&backend.reference("m"));
            assert_eq!(found.map(MachineBackend::kind), Some(backend.kind()));
        }
    }

    fn vsphere_placement(mode: InstallMode) -> Placement {
        Placement {
            provider: "vcenter-lab".into(),
            provider_class: "vsphere".into(),
            machine_kind: MachineKind::VSPHERE_MACHINE,
            failure_domain: "DC0/DC0_C1".into(),
            storage_target: "LocalDS_0".into(),
            network_target: "VM Network".into(),
            image: PlacedImage {
                volume: "DC0/vm/templates/ubuntu-2404".into(),
                install_mode: mode,
                disk_size: Quantity("20Gi".into()),
            },
            image_revision: None,
        }
    }

    #[test]
    fn a_vsphere_placement_builds_a_vm_cloned_from_the_images_template() {
        let (vm, class) = (vm(), class());
        let placement = vsphere_placement(InstallMode::Immediate);
        let object = build(
            &backend(placement.machine_kind.clone()),
            &MachineInput {
                vm: &vm,
                class: &class,
                placement: &placement,
            },
        )
        .expect("buildable");
        let types = object.types.clone().expect("typed");
        assert_eq!(
            (types.api_version.as_str(), types.kind.as_str()),
            ("banlieue.io/v1alpha1", "VSphereMachine")
        );
        assert_eq!(
            backend(MachineKind::VSPHERE_MACHINE).resource.plural,
            "vspheremachines"
        );
        let machine: VSphereMachine =
            serde_json::from_value(serde_json::to_value(&object).expect("serializable"))
                .expect("a valid VSphereMachine");
        let owner = &machine.metadata.owner_references.as_ref().expect("owned")[0];
        assert_eq!(owner.uid, "vm-uid");
        // Created holding the vSphere provider's finalizer, which it removes once the VM is gone.
        assert_eq!(
            machine.metadata.finalizers,
            Some(vec!["banlieue.io/vm-protection".to_owned()])
        );
        let spec = &machine.spec;
        assert_eq!(spec.provider_ref.name, "vcenter-lab");
        assert_eq!(
            (spec.datacenter.as_str(), spec.cluster.as_str()),
            ("DC0", "DC0_C1")
        );
        assert_eq!(spec.template, "DC0/vm/templates/ubuntu-2404");
        assert_eq!(spec.datastore.as_deref(), Some("LocalDS_0"));
        assert_eq!(spec.folder, None);
        assert_eq!((spec.cpu, spec.memory.0.as_str()), (2, "2Gi"));
        assert!(spec.tpm_enabled);
        assert!(spec.secure_boot);
        assert_eq!(spec.user_data.as_deref(), Some("#cloud-config\n"));

        let read = Machine::read(&backend(MachineKind::VSPHERE_MACHINE), object).expect("contract");
        assert_eq!(read.spec.provider_ref.name, "vcenter-lab");
        assert_eq!(read.failure_domain(), Some("DC0/DC0_C1"));
    }

    #[test]
    fn a_vsphere_machine_needs_a_cluster_domain_and_a_clonable_image() {
        let (vm, class) = (vm(), class());
        let mut placement = vsphere_placement(InstallMode::Immediate);
        placement.failure_domain = "host-7".into();
        let error = build(
            &backend(placement.machine_kind.clone()),
            &MachineInput {
                vm: &vm,
                class: &class,
                placement: &placement,
            },
        )
        .expect_err("not a cluster");
        assert_eq!(
            error.to_string(),
            "VSphereMachine: failure domain \"host-7\" is not <datacenter>/<cluster>"
        );
        for mode in [InstallMode::Deferred, InstallMode::Manual] {
            let placement = vsphere_placement(mode);
            let error = build(
                &backend(placement.machine_kind.clone()),
                &MachineInput {
                    vm: &vm,
                    class: &class,
                    placement: &placement,
                },
            )
            .expect_err("an installer cannot be cloned");
            assert!(error.to_string().contains("cannot be realised"), "{error}");
        }
    }

    #[test]
    fn a_machine_without_the_contract_is_refused_by_name() {
        let mut object = DynamicObject::new("m", &backend(MachineKind::LIBVIRT_MACHINE).resource);
        object.data = json!({"spec": {"pool": "p"}});
        let error = Machine::read(&backend(MachineKind::LIBVIRT_MACHINE), object)
            .expect_err("no providerRef");
        assert_eq!(
            error.to_string(),
            "LibvirtMachine m does not carry the machine contract"
        );
        let mut object = DynamicObject::new("m", &backend(MachineKind::LIBVIRT_MACHINE).resource);
        object.data = json!({"spec": {"providerRef": {"name": "p"}}, "status": {"ready": "yes"}});
        assert!(Machine::read(&backend(MachineKind::LIBVIRT_MACHINE), object).is_err());
    }
}

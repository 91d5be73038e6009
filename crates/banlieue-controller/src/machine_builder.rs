//! The one place the controller knows machine kinds (ADR-0070). [`backend`] is its only
//! `match` on [`MachineKind`]: for each kind, the API resource its machines are stored as and
//! the function that writes a machine's `spec` from a [`Placement`]. Everything else (the
//! common metadata, applying, reading, caching, mirroring and deleting machines) goes through
//! `DynamicObject`s and the contract every kind carries ([`MachineSpecContract`],
//! [`MachineStatusContract`]), so a new kind needs its CRD, one arm here and its provider.

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

/// Every machine kind, in the order their caches are started. [`backend`]'s match makes a new
/// [`MachineKind`] variant fail to compile until it has an arm; the test
/// `every_machine_crd_has_a_backend` fails until the kind is listed here too.
pub const MACHINE_KINDS: [MachineKind; 2] =
    [MachineKind::LibvirtMachine, MachineKind::VSphereMachine];

/// What the controller needs of one machine kind.
#[derive(Clone, Debug)]
pub struct MachineBackend {
    /// The kind, as the cache and its errors name it.
    pub kind_name: &'static str,
    /// Group, version, kind and plural of its objects.
    pub resource: ApiResource,
    /// The finalizer under which the kind's provider tears a machine down. The machine is
    /// created holding it, so the provider's first look finds nothing to add: one API write
    /// less per machine, and a machine deleted before its provider ever saw it still waits for
    /// the provider to confirm there is nothing to remove on the host.
    pub finalizer: &'static str,
    /// Writes the kind's `spec` for a placed VirtualMachine.
    spec: fn(&MachineInput<'_>) -> Result<Value, BuildError>,
}

/// What a machine is built from: the VirtualMachine, its class and where it was placed.
#[derive(Clone, Copy, Debug)]
pub struct MachineInput<'a> {
    pub vm: &'a VirtualMachine,
    pub class: &'a VMClass,
    pub placement: &'a Placement,
}

/// The backend of `kind`.
pub fn backend(kind: MachineKind) -> MachineBackend {
    match kind {
        MachineKind::LibvirtMachine => MachineBackend {
            kind_name: "LibvirtMachine",
            resource: ApiResource::erase::<LibvirtMachine>(&()),
            finalizer: names::FINALIZER_DOMAIN_PROTECTION,
            spec: libvirt_spec,
        },
        MachineKind::VSphereMachine => MachineBackend {
            kind_name: "VSphereMachine",
            resource: ApiResource::erase::<VSphereMachine>(&()),
            finalizer: vsphere::FINALIZER_VM_PROTECTION,
            spec: vsphere_spec,
        },
        // A new kind goes here: its CRD type's resource and a function writing its spec from
        // the placement. Nothing else in the controller names a kind.
    }
}

/// The kind a VirtualMachine's `machineRef` names, when the controller knows it.
pub fn kind_of(reference: &MachineReference) -> Option<MachineKind> {
    MACHINE_KINDS.into_iter().find(|kind| {
        let resource = backend(*kind).resource;
        resource.kind == reference.kind && resource.api_version == reference.api_version
    })
}

/// The `machineRef` of the machine `name` of `kind`.
pub fn reference(kind: MachineKind, name: &str) -> MachineReference {
    let resource = backend(kind).resource;
    MachineReference {
        api_version: resource.api_version,
        kind: resource.kind,
        name: name.to_owned(),
    }
}

/// The API of `kind`'s machines in `namespace`.
pub fn api(client: &Client, namespace: &str, kind: MachineKind) -> Api<DynamicObject> {
    Api::namespaced_with(client.clone(), namespace, &backend(kind).resource)
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
pub fn build(input: &MachineInput<'_>) -> Result<DynamicObject, BuildError> {
    let backend = backend(input.placement.machine_kind);
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
            cpu: input.class.spec.cpu,
            memory: input.class.spec.memory.clone(),
            user_data: input.vm.spec.user_data.clone(),
            user_data_secret_ref: input.vm.spec.user_data_secret_ref.clone(),
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
        },
    )
}

/// A machine of any kind as the controller sees it: its object and the contract it carries.
#[derive(Clone, Debug)]
pub struct Machine {
    pub kind: MachineKind,
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
    /// Reads the contract out of `object`, a machine of `kind`.
    pub fn read(kind: MachineKind, object: DynamicObject) -> Result<Machine, ContractError> {
        let error = |source| ContractError {
            kind: backend(kind).kind_name,
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
            kind,
            object,
            spec,
            status,
        })
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
            "spec": {"cpu": 2, "memory": "2Gi", "tpmEnabled": true, "firmware": "efi"}
        }))
        .expect("valid VMClass")
    }

    fn placement(mode: InstallMode) -> Placement {
        Placement {
            provider: "host-1".into(),
            provider_class: "libvirt".into(),
            machine_kind: MachineKind::LibvirtMachine,
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
        let object = build(&MachineInput {
            vm: &vm,
            class: &class,
            placement: &placement,
        })
        .expect("buildable");
        let types = object.types.clone().expect("typed");
        assert_eq!(
            (types.api_version.as_str(), types.kind.as_str()),
            ("banlieue.io/v1alpha1", "LibvirtMachine")
        );
        let resource = backend(MachineKind::LibvirtMachine).resource;
        assert_eq!(resource.plural, "libvirtmachines");
        let url = api(
            &Client::try_from(kube::Config::new(
                "http://127.0.0.1:9".parse().expect("valid url"),
            ))
            .expect("client"),
            "ns",
            MachineKind::LibvirtMachine,
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
        assert_eq!((spec.cpu, spec.memory.0.as_str()), (2, "2Gi"));
        assert_eq!(spec.user_data.as_deref(), Some("#cloud-config\n"));

        // Read back as any machine: the contract and the failure domain.
        let read = Machine::read(MachineKind::LibvirtMachine, object).expect("contract");
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
            let object = build(&MachineInput {
                vm: &vm,
                class: &class,
                placement: &placement,
            })
            .expect("buildable");
            let disk = &object.data["spec"]["disk"];
            assert_eq!(disk["installMedia"], "img.qcow2", "{mode:?}");
            assert!(disk.get("backingVolume").is_none(), "{mode:?}");
        }
    }

    #[test]
    fn a_machine_reference_names_its_kind() {
        let reference = reference(MachineKind::LibvirtMachine, "web-01");
        assert_eq!(
            (reference.api_version.as_str(), reference.kind.as_str()),
            ("banlieue.io/v1alpha1", "LibvirtMachine")
        );
        assert_eq!(kind_of(&reference), Some(MachineKind::LibvirtMachine));
        let unknown = MachineReference {
            kind: "OtherMachine".into(),
            ..reference.clone()
        };
        assert_eq!(kind_of(&unknown), None);
        let other_version = MachineReference {
            api_version: "banlieue.io/v1beta1".into(),
            ..reference
        };
        assert_eq!(kind_of(&other_version), None);
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
        let backends: Vec<String> = MACHINE_KINDS
            .into_iter()
            .map(|kind| backend(kind).resource.kind)
            .collect();
        assert_eq!(crds, backends);
        assert_eq!(
            backend(MachineKind::LibvirtMachine).resource.kind,
            LibvirtMachine::crd().spec.names.kind
        );
        assert_eq!(
            backend(MachineKind::VSphereMachine).resource.kind,
            VSphereMachine::crd().spec.names.kind
        );
        for kind in MACHINE_KINDS {
            let reference = reference(kind, "m");
            assert_eq!(kind_of(&reference), Some(kind));
        }
    }

    fn vsphere_placement(mode: InstallMode) -> Placement {
        Placement {
            provider: "vcenter-lab".into(),
            provider_class: "vsphere".into(),
            machine_kind: MachineKind::VSphereMachine,
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
        let object = build(&MachineInput {
            vm: &vm,
            class: &class,
            placement: &placement,
        })
        .expect("buildable");
        let types = object.types.clone().expect("typed");
        assert_eq!(
            (types.api_version.as_str(), types.kind.as_str()),
            ("banlieue.io/v1alpha1", "VSphereMachine")
        );
        assert_eq!(
            backend(MachineKind::VSphereMachine).resource.plural,
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
        assert_eq!(spec.user_data.as_deref(), Some("#cloud-config\n"));

        let read = Machine::read(MachineKind::VSphereMachine, object).expect("contract");
        assert_eq!(read.spec.provider_ref.name, "vcenter-lab");
        assert_eq!(read.failure_domain(), Some("DC0/DC0_C1"));
    }

    #[test]
    fn a_vsphere_machine_needs_a_cluster_domain_and_a_clonable_image() {
        let (vm, class) = (vm(), class());
        let mut placement = vsphere_placement(InstallMode::Immediate);
        placement.failure_domain = "host-7".into();
        let error = build(&MachineInput {
            vm: &vm,
            class: &class,
            placement: &placement,
        })
        .expect_err("not a cluster");
        assert_eq!(
            error.to_string(),
            "VSphereMachine: failure domain \"host-7\" is not <datacenter>/<cluster>"
        );
        for mode in [InstallMode::Deferred, InstallMode::Manual] {
            let placement = vsphere_placement(mode);
            let error = build(&MachineInput {
                vm: &vm,
                class: &class,
                placement: &placement,
            })
            .expect_err("an installer cannot be cloned");
            assert!(error.to_string().contains("cannot be realised"), "{error}");
        }
    }

    #[test]
    fn a_machine_without_the_contract_is_refused_by_name() {
        let mut object = DynamicObject::new("m", &backend(MachineKind::LibvirtMachine).resource);
        object.data = json!({"spec": {"pool": "p"}});
        let error = Machine::read(MachineKind::LibvirtMachine, object).expect_err("no providerRef");
        assert_eq!(
            error.to_string(),
            "LibvirtMachine m does not carry the machine contract"
        );
        let mut object = DynamicObject::new("m", &backend(MachineKind::LibvirtMachine).resource);
        object.data = json!({"spec": {"providerRef": {"name": "p"}}, "status": {"ready": "yes"}});
        assert!(Machine::read(MachineKind::LibvirtMachine, object).is_err());
    }
}

//! Machines of any kind (ADR-0070, ADR-0071). A [`MachineBackend`] is a kind's builder: the API
//! resource its machines are stored as, its provider's finalizer and the function that writes a
//! machine's `spec` from a [`Placement`](banlieue_api::backend::Placement). The controller
//! builds the kinds its [`MachineBackends`] hold, which the binary fills from its list of
//! backend descriptors; everything else (the common metadata, applying, reading, caching,
//! mirroring and deleting machines) goes through `DynamicObject`s and the contract every kind
//! carries ([`MachineSpecContract`], [`MachineStatusContract`]), so the controller names no
//! backend.

use std::sync::Arc;

pub use banlieue_api::backend::{BuildError, MachineBackend, MachineInput};
use banlieue_api::names;
use banlieue_api::{MachineKind, MachineReference, MachineSpecContract, MachineStatusContract};
use kube::api::DynamicObject;
use kube::{Resource, ResourceExt};
use serde_json::Value;

use crate::scheduling::controller_owner_reference;

/// The machine kinds a controller builds, in the order their caches are started.
#[derive(Clone, Debug)]
pub struct MachineBackends(Arc<[MachineBackend]>);

impl MachineBackends {
    /// The kinds of `backends`, in order: the binary's list of backend descriptors (the
    /// controller itself knows none).
    pub fn new(backends: impl IntoIterator<Item = MachineBackend>) -> MachineBackends {
        MachineBackends(backends.into_iter().collect())
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

/// The kinds banlieue ships, as the binary's list of descriptors gives them, for the unit
/// tests of code that builds machines.
#[cfg(test)]
pub(crate) fn in_tree_backends() -> MachineBackends {
    MachineBackends::new([
        banlieue_api::machine::libvirt_machine_backend(),
        banlieue_api::vsphere::machine_backend(),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;
    use banlieue_api::backend::{PlacedImage, Placement, PlacementSpec};
    use banlieue_api::{InstallMode, LibvirtMachine, VMClass, VSphereMachine, VirtualMachine};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use kube::Client;
    use serde_json::json;

    use crate::machine_builder::in_tree_backends as built_in;

    /// The built-in builder of `kind`.
    fn backend(kind: MachineKind) -> MachineBackend {
        built_in().get(&kind).expect("a built-in kind").clone()
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
        let backends = built_in();
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
        let backends = built_in().with(added.clone());
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
        assert!(built_in().get(&memory).is_none());

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

        let replaced = built_in().with(MachineBackend {
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

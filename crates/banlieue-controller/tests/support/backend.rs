//! The backend the tests run against: the machine kind the fake provider plays and the shape of
//! the fixtures (ProviderClass, Provider capabilities and failure domains, VMImage source),
//! chosen once per test binary by `BANLIEUE_TEST_MACHINE_KIND`. The controller knows no backend
//! (ADR-0070), so its tests assert the same things on each; the few assertions on a kind's own
//! spec fields go through [`KindSpec`].

use std::sync::OnceLock;

use super::memory_backend;

use banlieue_api::backend::PlacementSpec;
use banlieue_api::{
    LibvirtMachine, LibvirtMachineSpec, MachineKind, MachineSpecContract, MachineStatusContract,
    VSphereMachine, VSphereMachineSpec, names, vsphere,
};
use banlieue_controller::machine_builder::MachineBackends;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::ResourceExt;
use kube::api::{ApiResource, DynamicObject};
use serde_json::{Value, json};

/// Names the machine kind under test: `LibvirtMachine` (the default), `VSphereMachine`, or
/// `MemoryMachine`, the test-only backend of [`super::memory_backend`].
pub const MACHINE_KIND_ENV: &str = "BANLIEUE_TEST_MACHINE_KIND";

/// What the tests need to know of one backend.
#[derive(Debug)]
pub struct Backend {
    pub kind: MachineKind,
    /// The ProviderClass registered for the kind, named as the examples name it.
    pub provider_class: &'static str,
    /// The finalizer the kind's real provider holds on its machines.
    pub finalizer: &'static str,
    /// Where a storage class lives: a libvirt storage pool, a vSphere datastore.
    pub storage_target: &'static str,
    /// Where a network class lives: a libvirt network, a vSphere network (port group).
    pub network_target: &'static str,
    /// The image's volume in each zone, which the machine is built from: the libvirt backing
    /// file, the vSphere template's inventory path.
    pub image_volume: &'static str,
    /// The Ready reason the kind's provider reports for a running machine.
    pub running_reason: &'static str,
    /// The GuestReady reason it reports once the guest says it is ready.
    pub guest_ready_reason: &'static str,
}

static LIBVIRT: Backend = Backend {
    kind: MachineKind::LIBVIRT_MACHINE,
    provider_class: "libvirt",
    finalizer: names::FINALIZER_DOMAIN_PROTECTION,
    storage_target: "default",
    network_target: "br-prod",
    image_volume: "img.qcow2",
    running_reason: banlieue_api::conditions::reasons::DOMAIN_RUNNING,
    guest_ready_reason: "GuestReady",
};

static VSPHERE: Backend = Backend {
    kind: MachineKind::VSPHERE_MACHINE,
    provider_class: "vsphere",
    finalizer: vsphere::FINALIZER_VM_PROTECTION,
    storage_target: "LocalDS_0",
    network_target: "VM Network",
    image_volume: "DC0/vm/templates/img",
    running_reason: vsphere::reasons::POWERED_ON,
    guest_ready_reason: banlieue_api::conditions::reasons::GUEST_PHASE_READY,
};

static MEMORY: Backend = Backend {
    kind: MachineKind::from_static(memory_backend::KIND),
    provider_class: "memory",
    finalizer: memory_backend::FINALIZER,
    storage_target: "ram",
    network_target: "loopback",
    image_volume: "img",
    running_reason: memory_backend::RUNNING,
    guest_ready_reason: banlieue_api::conditions::reasons::GUEST_PHASE_READY,
};

/// The vSphere datacenter and cluster every test vCenter declares, as vcsim names them. Each
/// Provider publishes the same failure domain name, as two vCenters may: the controller keys a
/// domain by Provider and name.
const VSPHERE_DATACENTER: &str = "DC0";
const VSPHERE_CLUSTER: &str = "DC0_C0";

/// The backend under test, read from [`MACHINE_KIND_ENV`] once.
pub fn backend() -> &'static Backend {
    static CHOSEN: OnceLock<&'static Backend> = OnceLock::new();
    CHOSEN.get_or_init(|| {
        let value = std::env::var(MACHINE_KIND_ENV).unwrap_or_default();
        match value.as_str() {
            "" | "LibvirtMachine" => &LIBVIRT,
            "VSphereMachine" => &VSPHERE,
            memory_backend::KIND => &MEMORY,
            other => panic!(
                "{MACHINE_KIND_ENV}={other:?} is not a machine kind the tests know: use \
                 LibvirtMachine (the default), VSphereMachine or MemoryMachine"
            ),
        }
    })
}

/// The backends the tests know, to match on.
enum Flavour {
    Libvirt,
    VSphere,
    Memory,
}

impl Backend {
    fn flavour(&self) -> Flavour {
        if self.kind == MachineKind::LIBVIRT_MACHINE {
            Flavour::Libvirt
        } else if self.kind == MachineKind::VSPHERE_MACHINE {
            Flavour::VSphere
        } else {
            Flavour::Memory
        }
    }

    pub fn is_vsphere(&self) -> bool {
        self.kind == MachineKind::VSPHERE_MACHINE
    }

    /// Whether the kind is the test-only one, whose builder the controller under test is
    /// given and whose CRD the tests install.
    pub fn is_memory(&self) -> bool {
        matches!(self.flavour(), Flavour::Memory)
    }

    /// Group, version, kind and plural of the kind's objects.
    pub fn resource(&self) -> ApiResource {
        match self.flavour() {
            Flavour::Libvirt => ApiResource::erase::<LibvirtMachine>(&()),
            Flavour::VSphere => ApiResource::erase::<VSphereMachine>(&()),
            Flavour::Memory => memory_backend::builder().resource,
        }
    }

    /// The machine kinds the controller under test builds: the built-in ones, and the
    /// test-only kind's builder when it is the one under test.
    pub fn machine_backends(&self) -> MachineBackends {
        match self.flavour() {
            Flavour::Memory => in_tree_backends().with(memory_backend::builder()),
            Flavour::Libvirt | Flavour::VSphere => in_tree_backends(),
        }
    }

    /// The failure domain `provider` publishes: a libvirt host (or a memory provider) is one,
    /// named after it; a vCenter publishes `<datacenter>/<cluster>` per declared cluster.
    pub fn failure_domain(&self, provider: &str) -> String {
        match self.flavour() {
            Flavour::Libvirt | Flavour::Memory => provider.to_owned(),
            Flavour::VSphere => vsphere::failure_domain_name(VSPHERE_DATACENTER, VSPHERE_CLUSTER),
        }
    }

    /// A Provider's `spec.connection` and the kind's part of `spec.capabilities`.
    pub fn provider_spec(&self, class: &str, capabilities: Value) -> Value {
        let mut capabilities = capabilities;
        let endpoint = match self.flavour() {
            Flavour::Libvirt => "qemu+tls://127.0.0.1/system",
            Flavour::VSphere => {
                capabilities["vsphere"] = json!({"datacenters": [
                    {"name": VSPHERE_DATACENTER, "clusters": [VSPHERE_CLUSTER]}
                ]});
                "https://127.0.0.1:8989/sdk"
            }
            Flavour::Memory => "memory://127.0.0.1",
        };
        json!({
            "providerClassRef": {"name": class},
            "connection": {"endpoint": endpoint,
                           "credentialsRef": {"name": "creds"},
                           "caBundle": {"configMapRef": {"name": "ca"}}},
            "capabilities": capabilities,
        })
    }

    /// The VMImage source for the kind's ProviderClass.
    pub fn image_source(&self) -> Value {
        match self.flavour() {
            Flavour::Libvirt | Flavour::Memory => json!(
                {"providerClass": self.provider_class, "kind": "BackingFile", "volume": self.image_volume}
            ),
            Flavour::VSphere => json!(
                {"providerClass": self.provider_class, "kind": "Template", "template": self.image_volume}
            ),
        }
    }

    /// A machine spec placed as the harness places machines (the storage and network targets,
    /// the image's volume, 2 GiB) on `provider`, with `cpu` CPUs.
    pub fn machine_spec(&self, provider: &str, cpu: u32) -> Value {
        match self.flavour() {
            Flavour::Libvirt => json!({
                "providerRef": {"name": provider}, "pool": self.storage_target,
                "network": self.network_target,
                "disk": {"backingVolume": self.image_volume, "size": "20Gi"},
                "cpu": cpu, "memory": "2Gi"
            }),
            Flavour::VSphere => json!({
                "providerRef": {"name": provider}, "datacenter": VSPHERE_DATACENTER,
                "cluster": VSPHERE_CLUSTER, "template": self.image_volume,
                "datastore": self.storage_target, "cpu": cpu, "memory": "2Gi"
            }),
            Flavour::Memory => json!({
                "providerRef": {"name": provider}, "failureDomain": provider,
                "storageTarget": self.storage_target, "networkTarget": self.network_target,
                "imageVolume": self.image_volume, "installMode": "Immediate",
                "diskSize": "20Gi", "firmware": "efi", "cpu": cpu, "memory": "2Gi"
            }),
        }
    }

    /// What a provider records of the machine's counterpart on its host once it exists: the
    /// libvirt domain's name, the vSphere VM's name and managed object reference, the memory
    /// hypervisor's serial number. `serial` tells machines apart.
    pub fn host_identity(&self, namespace: &str, name: &str, serial: u32) -> Value {
        match self.flavour() {
            Flavour::Libvirt => json!({"domainName": format!("{namespace}-{name}")}),
            Flavour::VSphere => json!({
                "vmName": format!("{namespace}-{name}"),
                "vmMoRef": format!("vm-{}", 1000 + serial),
            }),
            Flavour::Memory => json!({"memoryId": serial}),
        }
    }
}

/// A machine of the kind under test, as the tests look at it: its metadata, the spec fields
/// every kind has, the kind's own spec, and the status contract.
#[derive(Clone, Debug)]
pub struct MachineView {
    pub name: String,
    pub owner_references: Vec<OwnerReference>,
    pub finalizers: Vec<String>,
    pub deleting: bool,
    /// The Provider that realises it.
    pub provider: String,
    pub tpm_enabled: bool,
    pub cpu: u32,
    pub memory: Quantity,
    pub user_data: Option<String>,
    pub spec: KindSpec,
    pub status: MachineStatusContract,
}

/// The spec of a machine in its kind's own shape.
#[derive(Clone, Debug)]
pub enum KindSpec {
    Libvirt(LibvirtMachineSpec),
    VSphere(VSphereMachineSpec),
    /// A kind whose spec is its placement (the test-only MemoryMachine).
    Placement(PlacementSpec),
}

impl MachineView {
    /// Reads a machine of the kind under test.
    pub fn read(object: &DynamicObject) -> Result<Self, serde_json::Error> {
        let raw_spec = object.data.get("spec").cloned().unwrap_or_default();
        let contract: MachineSpecContract = serde_json::from_value(raw_spec.clone())?;
        let (spec, cpu, memory, user_data) = match backend().flavour() {
            Flavour::Libvirt => {
                let spec: LibvirtMachineSpec = serde_json::from_value(raw_spec)?;
                let (cpu, memory, user_data) =
                    (spec.cpu, spec.memory.clone(), spec.user_data.clone());
                (KindSpec::Libvirt(spec), cpu, memory, user_data)
            }
            Flavour::VSphere => {
                let spec: VSphereMachineSpec = serde_json::from_value(raw_spec)?;
                let (cpu, memory, user_data) =
                    (spec.cpu, spec.memory.clone(), spec.user_data.clone());
                (KindSpec::VSphere(spec), cpu, memory, user_data)
            }
            Flavour::Memory => {
                let spec: PlacementSpec = serde_json::from_value(raw_spec)?;
                let (cpu, memory, user_data) =
                    (spec.cpu, spec.memory.clone(), spec.user_data.clone());
                (KindSpec::Placement(spec), cpu, memory, user_data)
            }
        };
        let status = match object.data.get("status") {
            None | Some(Value::Null) => MachineStatusContract::default(),
            Some(status) => serde_json::from_value(status.clone())?,
        };
        Ok(Self {
            name: object.name_any(),
            owner_references: object.owner_references().to_vec(),
            finalizers: object.finalizers().to_vec(),
            deleting: object.metadata.deletion_timestamp.is_some(),
            provider: contract.provider_ref.name,
            tpm_enabled: contract.tpm_enabled,
            cpu,
            memory,
            user_data,
            spec,
            status,
        })
    }
}

/// The in-tree kinds, as the binary's list of backend descriptors gives them to the controller.
fn in_tree_backends() -> MachineBackends {
    MachineBackends::new([
        banlieue_api::machine::libvirt_machine_backend(),
        banlieue_api::vsphere::machine_backend(),
    ])
}

//! The typed vim25 data this client reads and writes, with their decoders.

use std::collections::BTreeMap;

use base64::Engine as _;

use crate::error::{Error, Fault, Result};
use crate::moref::ManagedObjectRef;
use crate::property::{ObjectContent, PropertyValue};
use crate::soap::localized_fault;
use crate::xml::Element;

/// The server's product description (`ServiceContent.about`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct About {
    /// E.g. `VMware vCenter Server`.
    pub name: String,
    /// Name, version and build in one line.
    pub full_name: String,
    /// The product version, e.g. `8.0.3`.
    pub version: String,
    /// The build number.
    pub build: String,
    /// `VirtualCenter` or `HostAgent`.
    pub api_type: String,
    /// E.g. `8.0.3.0`: the newest vim25 version the server speaks.
    pub api_version: String,
    /// The vCenter's identity; absent on a standalone ESXi.
    pub instance_uuid: Option<String>,
}

/// The service's entry points, from `RetrieveServiceContent`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceContent {
    /// The product.
    pub about: About,
    /// The top of the inventory (datacenters live under it).
    pub root_folder: ManagedObjectRef,
    /// The shared PropertyCollector.
    pub property_collector: ManagedObjectRef,
    /// Where container views are made.
    pub view_manager: ManagedObjectRef,
    /// Where sessions are made.
    pub session_manager: ManagedObjectRef,
    /// Where inventory paths are looked up.
    pub search_index: ManagedObjectRef,
}

impl ServiceContent {
    pub(crate) fn from_element(returnval: &Element) -> Result<ServiceContent> {
        let about = returnval
            .child("about")
            .ok_or_else(|| Error::malformed("ServiceContent", "no <about>"))?;
        let text = |name: &str| about.child_text(name).unwrap_or_default().to_owned();
        let api_version = text("apiVersion");
        if api_version.is_empty() {
            return Err(Error::malformed("ServiceContent", "no about.apiVersion"));
        }
        Ok(ServiceContent {
            about: About {
                name: text("name"),
                full_name: text("fullName"),
                version: text("version"),
                build: text("build"),
                api_type: text("apiType"),
                api_version,
                instance_uuid: about.child_text("instanceUuid").map(str::to_owned),
            },
            root_folder: ManagedObjectRef::child(returnval, "rootFolder")?,
            property_collector: ManagedObjectRef::child(returnval, "propertyCollector")?,
            view_manager: ManagedObjectRef::child(returnval, "viewManager")?,
            session_manager: ManagedObjectRef::child(returnval, "sessionManager")?,
            search_index: ManagedObjectRef::child(returnval, "searchIndex")?,
        })
    }
}

/// A logged-in session (`UserSession`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserSession {
    /// The session id (not the cookie).
    pub key: String,
    /// Who is logged in.
    pub user_name: String,
}

impl UserSession {
    pub(crate) fn from_element(element: &Element) -> Result<UserSession> {
        Ok(UserSession {
            key: element
                .child_text("key")
                .ok_or_else(|| Error::malformed("UserSession", "no <key>"))?
                .to_owned(),
            user_name: element
                .child_text("userName")
                .unwrap_or_default()
                .to_owned(),
        })
    }
}

/// A datacenter and the folders a clone needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Datacenter {
    /// The datacenter.
    pub moref: ManagedObjectRef,
    /// Its name, e.g. `DC0`.
    pub name: String,
    /// Where its VMs live: the default folder for clones.
    pub vm_folder: ManagedObjectRef,
    /// Where its clusters and hosts live.
    pub host_folder: ManagedObjectRef,
}

impl Datacenter {
    pub(crate) fn from_content(content: &ObjectContent) -> Result<Datacenter> {
        Ok(Datacenter {
            moref: content.obj.clone(),
            name: required_text(content, "name")?,
            vm_folder: required_moref(content, "vmFolder")?,
            host_folder: required_moref(content, "hostFolder")?,
        })
    }
}

/// A cluster (`ClusterComputeResource`) and its root resource pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cluster {
    /// The cluster.
    pub moref: ManagedObjectRef,
    /// Its name, e.g. `DC0_C0`.
    pub name: String,
    /// The root resource pool: where a clone placed "in the cluster" goes.
    pub resource_pool: ManagedObjectRef,
    /// The memory of its hosts (`summary.totalMemory`), in bytes; `None` when vCenter does not
    /// say (or says something negative).
    pub total_memory_bytes: Option<u64>,
    /// Its hosts' logical CPUs (`summary.numCpuThreads`), when vCenter says.
    pub cpu_threads: Option<u32>,
}

/// The properties [`Cluster::from_content`] reads.
pub(crate) const CLUSTER_PATHS: &[&str] = &[
    "name",
    "resourcePool",
    "summary.totalMemory",
    "summary.numCpuThreads",
];

impl Cluster {
    pub(crate) fn from_content(content: &ObjectContent) -> Result<Cluster> {
        let number = |path: &str| content.get(path).and_then(PropertyValue::as_int);
        Ok(Cluster {
            moref: content.obj.clone(),
            name: required_text(content, "name")?,
            resource_pool: required_moref(content, "resourcePool")?,
            total_memory_bytes: number("summary.totalMemory").and_then(|n| u64::try_from(n).ok()),
            cpu_threads: number("summary.numCpuThreads").and_then(|n| u32::try_from(n).ok()),
        })
    }
}

/// Where and how `clone_vm` creates a VM. The clone is never a template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CloneSpec {
    /// The new VM's name.
    pub name: String,
    /// The folder it goes in (usually the datacenter's `vm_folder`).
    pub folder: ManagedObjectRef,
    /// The resource pool it runs in (e.g. a cluster's root pool).
    pub pool: ManagedObjectRef,
    /// A specific host; `None` lets DRS (or the pool's only host) choose.
    pub host: Option<ManagedObjectRef>,
    /// A datastore for its files; `None` keeps the template's.
    pub datastore: Option<ManagedObjectRef>,
    /// Whether to power it on once cloned.
    pub power_on: bool,
    /// `extraConfig` entries to set, e.g. `guestinfo.userdata`.
    pub extra_config: Vec<(String, String)>,
}

/// What `reconfigure_vm` changes; `None` and empty fields are left as they are.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ReconfigSpec {
    /// Virtual CPUs.
    pub num_cpus: Option<i32>,
    /// Memory in MiB.
    pub memory_mb: Option<i64>,
    /// `extraConfig` entries to set; an empty value removes the key.
    pub extra_config: Vec<(String, String)>,
    /// `bootOptions.efiSecureBootEnabled`: UEFI Secure Boot on or off (needs EFI firmware).
    pub efi_secure_boot: Option<bool>,
    /// `firmware`: `bios` or `efi` (vim25's GuestOsDescriptorFirmwareType).
    pub firmware: Option<String>,
}

/// A task's state.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum TaskState {
    /// Waiting to run.
    Queued,
    /// Running.
    Running,
    /// Done; `result` holds the outcome.
    Success,
    /// Failed; `error` says why.
    Error,
    /// A value this client does not know, kept as sent.
    Other(String),
}

/// A task's progress and outcome (`Task.info`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskInfo {
    /// The task.
    pub task: ManagedObjectRef,
    /// Where it is.
    pub state: TaskState,
    /// The outcome of a successful task, e.g. the new VM of a clone.
    pub result: Option<PropertyValue>,
    /// Why it failed, once `state` is `Error`.
    pub error: Option<Fault>,
}

impl TaskInfo {
    pub(crate) fn from_element(info: &Element) -> Result<TaskInfo> {
        let state = match info.child_text("state") {
            Some("queued") => TaskState::Queued,
            Some("running") => TaskState::Running,
            Some("success") => TaskState::Success,
            Some("error") => TaskState::Error,
            Some(other) => TaskState::Other(other.to_owned()),
            None => return Err(Error::malformed("TaskInfo", "no <state>")),
        };
        Ok(TaskInfo {
            task: ManagedObjectRef::child(info, "task")?,
            state,
            result: info
                .child("result")
                .map(PropertyValue::from_element)
                .transpose()?,
            error: info.child("error").map(localized_fault),
        })
    }
}

/// A VM's power state.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum PowerState {
    /// Running.
    PoweredOn,
    /// Off.
    PoweredOff,
    /// Suspended to disk.
    Suspended,
    /// A value this client does not know, kept as sent.
    Other(String),
}

impl PowerState {
    fn from_wire(text: &str) -> PowerState {
        match text {
            "poweredOn" => PowerState::PoweredOn,
            "poweredOff" => PowerState::PoweredOff,
            "suspended" => PowerState::Suspended,
            other => PowerState::Other(other.to_owned()),
        }
    }
}

/// One guest NIC as VMware Tools reports it (`guest.net`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuestNic {
    /// The NIC's MAC address.
    pub mac_address: Option<String>,
    /// The network (port group) name it is on.
    pub network: Option<String>,
    /// Whether it is connected.
    pub connected: bool,
    /// Its addresses, IPv4 and IPv6, as the guest reports them.
    pub ip_addresses: Vec<String>,
}

/// What a provider reads of a VM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VmInfo {
    /// The VM.
    pub moref: ManagedObjectRef,
    /// Its name.
    pub name: String,
    /// Whether it runs.
    pub power_state: PowerState,
    /// Every `config.extraConfig` entry with a text value (`guestinfo.*` among them).
    pub extra_config: BTreeMap<String, String>,
    /// The guest's NICs, when VMware Tools reports them.
    pub guest_nics: Vec<GuestNic>,
    /// The DER endorsement key certificates of the VM's virtual TPM, if it has one.
    pub tpm_endorsement_certificates: Vec<Vec<u8>>,
}

/// The properties [`VmInfo::from_content`] reads.
pub(crate) const VM_INFO_PATHS: &[&str] = &[
    "name",
    "runtime.powerState",
    "config.extraConfig",
    "guest.net",
    "config.hardware.device",
];

impl VmInfo {
    pub(crate) fn from_content(content: &ObjectContent) -> Result<VmInfo> {
        let power_state = content
            .get("runtime.powerState")
            .and_then(PropertyValue::text)
            .map(PowerState::from_wire)
            .ok_or_else(|| Error::malformed("VirtualMachine", "no runtime.powerState"))?;
        Ok(VmInfo {
            moref: content.obj.clone(),
            name: required_text(content, "name")?,
            power_state,
            extra_config: content
                .get("config.extraConfig")
                .map(extra_config)
                .transpose()?
                .unwrap_or_default(),
            guest_nics: content
                .get("guest.net")
                .map(guest_nics)
                .transpose()?
                .unwrap_or_default(),
            tpm_endorsement_certificates: content
                .get("config.hardware.device")
                .map(tpm_endorsement_certificates)
                .transpose()?
                .unwrap_or_default(),
        })
    }
}

/// The text entries of an `ArrayOfOptionValue` (`config.extraConfig`).
pub fn extra_config(value: &PropertyValue) -> Result<BTreeMap<String, String>> {
    let mut entries = BTreeMap::new();
    let PropertyValue::Other(array) = value else {
        return Err(Error::malformed("extraConfig", "not an ArrayOfOptionValue"));
    };
    for option in array.children() {
        if let PropertyValue::OptionValue { key, value } = PropertyValue::from_element(option)?
            && let Some(text) = value.text()
        {
            entries.insert(key, text.to_owned());
        }
    }
    Ok(entries)
}

/// The NICs of an `ArrayOfGuestNicInfo` (`guest.net`).
pub fn guest_nics(value: &PropertyValue) -> Result<Vec<GuestNic>> {
    let PropertyValue::Other(array) = value else {
        return Err(Error::malformed("guest.net", "not an ArrayOfGuestNicInfo"));
    };
    Ok(array
        .children()
        .iter()
        .map(|nic| GuestNic {
            mac_address: nic.child_text("macAddress").map(str::to_owned),
            network: nic.child_text("network").map(str::to_owned),
            connected: nic.child_text("connected") == Some("true"),
            ip_addresses: nic
                .children_named("ipAddress")
                .map(|ip| ip.text().to_owned())
                .collect(),
        })
        .collect())
}

/// The endorsement key certificates (DER) of every `VirtualTPM` in an
/// `ArrayOfVirtualDevice` (`config.hardware.device`).
pub fn tpm_endorsement_certificates(value: &PropertyValue) -> Result<Vec<Vec<u8>>> {
    let PropertyValue::Other(array) = value else {
        return Err(Error::malformed(
            "config.hardware.device",
            "not an ArrayOfVirtualDevice",
        ));
    };
    let mut certificates = Vec::new();
    for device in array.children() {
        if device.xsi_type() != Some("VirtualTPM") {
            continue;
        }
        for certificate in device.children_named("endorsementKeyCertificate") {
            // xsd:base64Binary allows whitespace between the characters.
            let compact: String = certificate
                .text()
                .chars()
                .filter(|c| !c.is_ascii_whitespace())
                .collect();
            let der = base64::engine::general_purpose::STANDARD
                .decode(compact)
                .map_err(|e| {
                    Error::malformed("VirtualTPM endorsementKeyCertificate", e.to_string())
                })?;
            certificates.push(der);
        }
    }
    Ok(certificates)
}

fn required_text(content: &ObjectContent, path: &str) -> Result<String> {
    content
        .get(path)
        .and_then(PropertyValue::text)
        .map(str::to_owned)
        .ok_or_else(|| Error::malformed(content.obj.to_string(), format!("no text {path}")))
}

fn required_moref(content: &ObjectContent, path: &str) -> Result<ManagedObjectRef> {
    content
        .get(path)
        .and_then(PropertyValue::as_moref)
        .cloned()
        .ok_or_else(|| Error::malformed(content.obj.to_string(), format!("no reference {path}")))
}

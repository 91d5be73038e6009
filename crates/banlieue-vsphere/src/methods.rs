//! One pure function per vim25 method: the request it sends. Parameters are written in the
//! WSDL's order. The matching decoders live with the types they produce.

use crate::moref::ManagedObjectRef;
use crate::property::PropertyFilterSpec;
use crate::soap::{BodyWriter, Request};
use crate::types::{CloneSpec, ReconfigSpec};

/// The fixed reference every session starts from.
pub fn service_instance() -> ManagedObjectRef {
    ManagedObjectRef::new("ServiceInstance", "ServiceInstance")
}

/// `ServiceInstance.RetrieveServiceContent()`: needs no session.
pub fn retrieve_service_content() -> Request {
    BodyWriter::new("RetrieveServiceContent", &service_instance()).finish()
}

/// `ServiceInstance.CurrentTime()`.
pub fn current_time() -> Request {
    BodyWriter::new("CurrentTime", &service_instance()).finish()
}

/// `SessionManager.Login(userName, password)`.
pub fn login(session_manager: &ManagedObjectRef, user_name: &str, password: &str) -> Request {
    let mut w = BodyWriter::new("Login", session_manager);
    w.text("userName", user_name).text("password", password);
    w.finish()
}

/// `SessionManager.Logout()`.
pub fn logout(session_manager: &ManagedObjectRef) -> Request {
    BodyWriter::new("Logout", session_manager).finish()
}

/// `ViewManager.CreateContainerView(container, type[], recursive)`.
pub fn create_container_view(
    view_manager: &ManagedObjectRef,
    container: &ManagedObjectRef,
    kinds: &[&str],
    recursive: bool,
) -> Request {
    let mut w = BodyWriter::new("CreateContainerView", view_manager);
    w.moref("container", container);
    for kind in kinds {
        w.text("type", kind);
    }
    w.text("recursive", bool_text(recursive));
    w.finish()
}

/// `View.DestroyView()`.
pub fn destroy_view(view: &ManagedObjectRef) -> Request {
    BodyWriter::new("DestroyView", view).finish()
}

/// `PropertyCollector.RetrievePropertiesEx(specSet, options)`; `max_objects` bounds a page.
pub fn retrieve_properties_ex(
    collector: &ManagedObjectRef,
    spec: &PropertyFilterSpec,
    max_objects: Option<u32>,
) -> Request {
    let mut w = BodyWriter::new("RetrievePropertiesEx", collector);
    spec.write(&mut w, "specSet");
    w.open("options");
    if let Some(max) = max_objects {
        w.text("maxObjects", &max.to_string());
    }
    w.close("options");
    w.finish()
}

/// `PropertyCollector.ContinueRetrievePropertiesEx(token)`.
pub fn continue_retrieve_properties_ex(collector: &ManagedObjectRef, token: &str) -> Request {
    let mut w = BodyWriter::new("ContinueRetrievePropertiesEx", collector);
    w.text("token", token);
    w.finish()
}

/// `PropertyCollector.CreatePropertyCollector()`: a collector of this session's own, whose
/// filters and updates no other caller sees.
pub fn create_property_collector(collector: &ManagedObjectRef) -> Request {
    BodyWriter::new("CreatePropertyCollector", collector).finish()
}

/// `PropertyCollector.DestroyPropertyCollector()`.
pub fn destroy_property_collector(collector: &ManagedObjectRef) -> Request {
    BodyWriter::new("DestroyPropertyCollector", collector).finish()
}

/// `PropertyCollector.CreateFilter(spec, partialUpdates)`.
pub fn create_filter(
    collector: &ManagedObjectRef,
    spec: &PropertyFilterSpec,
    partial_updates: bool,
) -> Request {
    let mut w = BodyWriter::new("CreateFilter", collector);
    spec.write(&mut w, "spec");
    w.text("partialUpdates", bool_text(partial_updates));
    w.finish()
}

/// `PropertyFilter.DestroyPropertyFilter()`.
pub fn destroy_property_filter(filter: &ManagedObjectRef) -> Request {
    BodyWriter::new("DestroyPropertyFilter", filter).finish()
}

/// `PropertyCollector.WaitForUpdatesEx(version, options{maxWaitSeconds})`. No version: the
/// current state of every filter's objects. `max_wait_seconds = 0`: answer at once.
pub fn wait_for_updates_ex(
    collector: &ManagedObjectRef,
    version: Option<&str>,
    max_wait_seconds: u32,
) -> Request {
    let mut w = BodyWriter::new("WaitForUpdatesEx", collector);
    if let Some(version) = version {
        w.text("version", version);
    }
    w.open("options")
        .text("maxWaitSeconds", &max_wait_seconds.to_string())
        .close("options");
    w.finish()
}

/// `SearchIndex.FindByInventoryPath(inventoryPath)`, e.g. `DC0/vm/DC0_C0_RP0_VM0`.
pub fn find_by_inventory_path(search_index: &ManagedObjectRef, path: &str) -> Request {
    let mut w = BodyWriter::new("FindByInventoryPath", search_index);
    w.text("inventoryPath", path);
    w.finish()
}

/// `VirtualMachine.CloneVM_Task(folder, name, spec)`: a full clone of `vm`, not a template.
pub fn clone_vm_task(vm: &ManagedObjectRef, spec: &CloneSpec) -> Request {
    let mut w = BodyWriter::new("CloneVM_Task", vm);
    w.moref("folder", &spec.folder).text("name", &spec.name);
    w.open("spec");
    // VirtualMachineRelocateSpec: datastore, pool, host in this order.
    w.open("location");
    if let Some(datastore) = &spec.datastore {
        w.moref("datastore", datastore);
    }
    w.moref("pool", &spec.pool);
    if let Some(host) = &spec.host {
        w.moref("host", host);
    }
    w.close("location");
    w.text("template", "false");
    if !spec.extra_config.is_empty() {
        w.open("config");
        write_extra_config(&mut w, &spec.extra_config);
        w.close("config");
    }
    w.text("powerOn", bool_text(spec.power_on));
    w.close("spec");
    w.finish()
}

/// `VirtualMachine.ReconfigVM_Task(spec)`.
pub fn reconfig_vm_task(vm: &ManagedObjectRef, spec: &ReconfigSpec) -> Request {
    let mut w = BodyWriter::new("ReconfigVM_Task", vm);
    w.open("spec");
    // VirtualMachineConfigSpec: numCPUs, memoryMB, extraConfig, bootOptions, firmware in this
    // order (the schema's sequence; vCenter refuses elements out of it).
    if let Some(cpus) = spec.num_cpus {
        w.text("numCPUs", &cpus.to_string());
    }
    if let Some(memory) = spec.memory_mb {
        w.text("memoryMB", &memory.to_string());
    }
    write_extra_config(&mut w, &spec.extra_config);
    if let Some(secure_boot) = spec.efi_secure_boot {
        w.open("bootOptions")
            .text("efiSecureBootEnabled", bool_text(secure_boot))
            .close("bootOptions");
    }
    if let Some(firmware) = &spec.firmware {
        w.text("firmware", firmware);
    }
    w.close("spec");
    w.finish()
}

/// `VirtualMachine.PowerOnVM_Task()`.
pub fn power_on_vm_task(vm: &ManagedObjectRef) -> Request {
    BodyWriter::new("PowerOnVM_Task", vm).finish()
}

/// `VirtualMachine.PowerOffVM_Task()`: a hard power-off.
pub fn power_off_vm_task(vm: &ManagedObjectRef) -> Request {
    BodyWriter::new("PowerOffVM_Task", vm).finish()
}

/// `VirtualMachine.SuspendVM_Task()`: the VM's memory goes to its datastore and it stops
/// running; `PowerOnVM_Task` resumes it.
pub fn suspend_vm_task(vm: &ManagedObjectRef) -> Request {
    BodyWriter::new("SuspendVM_Task", vm).finish()
}

/// `VirtualMachine.MarkAsTemplate()`: the VM becomes a template (powered off, not a task).
pub fn mark_as_template(vm: &ManagedObjectRef) -> Request {
    BodyWriter::new("MarkAsTemplate", vm).finish()
}

/// `ManagedEntity.Destroy_Task()`: deletes a VM and its files (or any managed entity).
pub fn destroy_task(entity: &ManagedObjectRef) -> Request {
    BodyWriter::new("Destroy_Task", entity).finish()
}

fn write_extra_config(w: &mut BodyWriter, entries: &[(String, String)]) {
    for (key, value) in entries {
        // extraConfig is BaseOptionValue[] and value is xsd:anyType: both need their type.
        w.open_typed("extraConfig", "OptionValue")
            .text("key", key)
            .typed_text("value", "xsd:string", value)
            .close("extraConfig");
    }
}

fn bool_text(value: bool) -> &'static str {
    if value { "true" } else { "false" }
}

#[cfg(test)]
mod tests {
    //! Every request body, snapshotted, and parsed back to prove it is well-formed XML.

    use super::*;
    use crate::property::extra_config_path;

    fn moref(kind: &str, value: &str) -> ManagedObjectRef {
        ManagedObjectRef::new(kind, value)
    }

    fn check(request: &Request) -> String {
        crate::xml::parse(request.body.as_bytes()).expect("the request is well-formed XML");
        // One element per line reads better in a snapshot than the single line sent.
        request.body.replace("><", ">\n<")
    }

    #[test]
    fn a_login_request_never_prints_its_password() {
        let sm = moref("SessionManager", "SessionManager");
        let request = login(&sm, "administrator@vsphere.local", "hunter2-secret");
        assert!(request.body.contains("hunter2-secret"), "sent, of course");
        let shown = format!("{request:?} {request:#?}");
        assert!(!shown.contains("hunter2-secret"), "{shown}");
        assert!(shown.contains("Login"), "{shown}");
    }

    #[test]
    fn session_requests() {
        let sm = moref("SessionManager", "SessionManager");
        insta::assert_snapshot!(
            "retrieve_service_content",
            check(&retrieve_service_content())
        );
        insta::assert_snapshot!("current_time", check(&current_time()));
        insta::assert_snapshot!(
            "login",
            check(&login(&sm, "administrator@vsphere.local", "p<&>\"'"))
        );
        insta::assert_snapshot!("logout", check(&logout(&sm)));
    }

    #[test]
    fn property_collector_requests() {
        let pc = moref("PropertyCollector", "propertyCollector");
        let view = moref("ContainerView", "session[1]view-1");
        let vm = moref("VirtualMachine", "vm-42");
        insta::assert_snapshot!(
            "create_container_view",
            check(&create_container_view(
                &moref("ViewManager", "ViewManager"),
                &moref("Folder", "group-d1"),
                &["Datacenter", "ClusterComputeResource"],
                true
            ))
        );
        insta::assert_snapshot!("destroy_view", check(&destroy_view(&view)));
        insta::assert_snapshot!(
            "retrieve_properties_ex_view",
            check(&retrieve_properties_ex(
                &pc,
                &PropertyFilterSpec::container_view(&view, "Datacenter", &["name", "vmFolder"]),
                Some(100)
            ))
        );
        insta::assert_snapshot!(
            "retrieve_properties_ex_object",
            check(&retrieve_properties_ex(
                &pc,
                &PropertyFilterSpec::object(&vm, &["runtime.powerState", "config.extraConfig"]),
                None
            ))
        );
        insta::assert_snapshot!(
            "continue_retrieve_properties_ex",
            check(&continue_retrieve_properties_ex(&pc, "token-1"))
        );
        insta::assert_snapshot!(
            "create_property_collector",
            check(&create_property_collector(&pc))
        );
        insta::assert_snapshot!(
            "destroy_property_collector",
            check(&destroy_property_collector(&moref(
                "PropertyCollector",
                "session[1]pc"
            )))
        );
        let phase = extra_config_path("guestinfo.banlieue.phase");
        insta::assert_snapshot!(
            "create_filter",
            check(&create_filter(
                &pc,
                &PropertyFilterSpec::object(&vm, &[phase.as_str()]),
                true
            ))
        );
        insta::assert_snapshot!(
            "destroy_property_filter",
            check(&destroy_property_filter(&moref(
                "PropertyFilter",
                "session[1]f"
            )))
        );
        insta::assert_snapshot!(
            "wait_for_updates_ex_initial",
            check(&wait_for_updates_ex(&pc, None, 0))
        );
        insta::assert_snapshot!(
            "wait_for_updates_ex_version",
            check(&wait_for_updates_ex(&pc, Some("3"), 30))
        );
    }

    #[test]
    fn inventory_and_vm_requests() {
        let vm = moref("VirtualMachine", "vm-42");
        insta::assert_snapshot!(
            "find_by_inventory_path",
            check(&find_by_inventory_path(
                &moref("SearchIndex", "SearchIndex"),
                "DC0/vm/DC0_C0_RP0_VM0"
            ))
        );
        let clone = CloneSpec {
            name: "worker-1".into(),
            folder: moref("Folder", "group-v3"),
            pool: moref("ResourcePool", "resgroup-9"),
            host: Some(moref("HostSystem", "host-12")),
            datastore: Some(moref("Datastore", "datastore-14")),
            power_on: false,
            extra_config: vec![
                ("guestinfo.userdata".into(), "I2Nsb3VkLWNvbmZpZw==".into()),
                ("guestinfo.userdata.encoding".into(), "base64".into()),
            ],
        };
        insta::assert_snapshot!("clone_vm_task", check(&clone_vm_task(&vm, &clone)));
        let minimal = CloneSpec {
            host: None,
            datastore: None,
            extra_config: Vec::new(),
            power_on: true,
            ..clone
        };
        insta::assert_snapshot!(
            "clone_vm_task_minimal",
            check(&clone_vm_task(&vm, &minimal))
        );
        insta::assert_snapshot!(
            "reconfig_vm_task",
            check(&reconfig_vm_task(
                &vm,
                &ReconfigSpec {
                    num_cpus: Some(4),
                    memory_mb: Some(8192),
                    extra_config: vec![("guestinfo.banlieue.phase".into(), "ready".into())],
                    ..Default::default()
                }
            ))
        );
        insta::assert_snapshot!(
            "reconfig_vm_task_secure_boot",
            check(&reconfig_vm_task(
                &vm,
                &ReconfigSpec {
                    efi_secure_boot: Some(true),
                    firmware: Some("efi".into()),
                    ..Default::default()
                }
            ))
        );
        insta::assert_snapshot!("power_on_vm_task", check(&power_on_vm_task(&vm)));
        insta::assert_snapshot!("power_off_vm_task", check(&power_off_vm_task(&vm)));
        insta::assert_snapshot!("suspend_vm_task", check(&suspend_vm_task(&vm)));
        insta::assert_snapshot!("destroy_task", check(&destroy_task(&vm)));
        insta::assert_snapshot!("mark_as_template", check(&mark_as_template(&vm)));
    }
}

//! What a VirtualMachine's reconcile does next (pure): where its status comes from, which
//! machine is built for a placement, where an adopted machine is, what its machine's standby
//! should be, and what a teardown does with each machine it finds. Its inputs are what
//! `vm::reconcile` read from the caches and the API server; the reconcile carries out what
//! these functions return.

use std::time::Duration;

use banlieue_api::conditions::{self, reasons, types};
use banlieue_api::{
    MachineReference, PoolReadiness, Provider, Standby, VMClass, VMImage, VirtualMachine,
    VirtualMachinePool, VirtualMachineStatus,
};
use kube::ResourceExt;
use kube::api::DynamicObject;

use crate::error::{Error, Result};
use crate::machine_builder::{self, Machine, MachineBackend, MachineBackends, MachineInput};
use crate::machine_status::Scheduled;
use banlieue_api::backend::Placement;

use crate::scheduling::{self, Unschedulable};
use crate::standby;

/// How soon an unschedulable VirtualMachine looks at its caches again without an event.
const UNSCHEDULABLE_RECHECK: Duration = Duration::from_secs(5);

/// The builder of the kind the status's `machineRef` names; `None` without a reference. A
/// reference to a kind this controller does not build is an invalid object: the controller
/// can neither read that machine nor schedule the VirtualMachine again.
pub(crate) fn referenced_backend<'a>(
    backends: &'a MachineBackends,
    machine_ref: Option<&MachineReference>,
) -> Result<Option<&'a MachineBackend>> {
    let Some(reference) = machine_ref else {
        return Ok(None);
    };
    backends
        .of_reference(reference)
        .map(Some)
        .ok_or_else(|| Error::UnknownMachineKind {
            kind: reference.kind.clone(),
            name: reference.name.clone(),
        })
}

/// Where the VirtualMachine's next status comes from.
#[derive(Debug)]
pub(crate) enum StatusSource<'a> {
    /// The machine the status names, as the cache shows it: its status is mirrored.
    Mirror(Machine),
    /// The cache does not show the machine the status names: it may lag behind a machine
    /// created a moment ago, so only the API server can say whether it is gone.
    AskApiServer {
        backend: &'a MachineBackend,
        name: String,
    },
    /// The machine the status names is gone.
    MachineDeleted { name: String },
    /// A machine exists but the status does not name it (a crash between creating it and
    /// writing the status): it is adopted as it is rather than scheduled again, which could
    /// choose another provider and rewrite a machine that is already being realised.
    Adopt(Machine),
    /// No machine: the VirtualMachine is scheduled.
    Schedule,
}

/// Where the next status comes from, given the status's `machineRef`, the builder of its kind
/// ([`referenced_backend`]) and the machine the cache holds for the VirtualMachine.
pub(crate) fn status_source<'a>(
    machine_ref: Option<&MachineReference>,
    backend: Option<&'a MachineBackend>,
    cached: Option<Machine>,
) -> StatusSource<'a> {
    match (machine_ref, backend, cached) {
        (Some(_), _, Some(machine)) => StatusSource::Mirror(machine),
        (Some(reference), Some(backend), None) => StatusSource::AskApiServer {
            backend,
            name: reference.name.clone(),
        },
        // A reference always has a kind (an unknown one is refused by `referenced_backend`).
        (Some(reference), None, None) => StatusSource::MachineDeleted {
            name: reference.name.clone(),
        },
        (None, _, Some(machine)) => StatusSource::Adopt(machine),
        (None, _, None) => StatusSource::Schedule,
    }
}

/// Whether an unschedulable VirtualMachine's failure is news (its reason is on none of the
/// status's conditions): only then is it published as an Event, so a VirtualMachine waiting
/// for capacity does not repeat it on every look.
pub(crate) fn announces_unschedulable(
    current: &VirtualMachineStatus,
    failure: &Unschedulable,
) -> bool {
    !current
        .conditions
        .iter()
        .any(|c| c.reason == failure.reason)
}

/// The machine to create for `vm` where `placement` put it, or why none can be built.
pub(crate) fn machine_for(
    vm: &VirtualMachine,
    class: Option<&VMClass>,
    backends: &MachineBackends,
    placement: &Placement,
) -> Result<DynamicObject, Unschedulable> {
    let class = class.ok_or_else(|| Unschedulable {
        reason: reasons::CLASS_NOT_FOUND,
        message: format!("vmclass {} does not exist", vm.spec.class_ref.name),
    })?;
    let backend = backends
        .get(&placement.machine_kind)
        .ok_or_else(|| Unschedulable {
            reason: reasons::NO_BUILDER_FOR_CLASS,
            message: format!("no machine builder for {}", placement.machine_kind),
        })?;
    if class.spec.egress.is_some() && !backend.enforces_egress {
        return Err(Unschedulable {
            reason: reasons::EGRESS_NOT_ENFORCED,
            message: format!(
                "vmclass {} declares egress, which {}s' provider cannot enforce on the host: \
                 use a Provider whose backend does (libvirt)",
                vm.spec.class_ref.name, backend.kind_name
            ),
        });
    }
    machine_builder::build(
        backend,
        &MachineInput {
            vm,
            class,
            placement,
        },
    )
    .map_err(|error| Unschedulable {
        reason: reasons::NO_BUILDER_FOR_CLASS,
        message: format!(
            "cannot build a machine for provider class {:?}: {}",
            placement.provider_class,
            conditions::error_message(&error)
        ),
    })
}

/// Where an existing machine is, for a VirtualMachine whose status lost it: the failure domain
/// the machine's annotation records; for a machine older than the annotation, its Provider's
/// only failure domain, else the Provider's name. `provider` is the machine's Provider and
/// `image` the VirtualMachine's image, when they exist.
pub(crate) fn adopted_site(
    machine: &Machine,
    provider: Option<&Provider>,
    image: Option<&VMImage>,
) -> Scheduled {
    let provider_name = &machine.spec.provider_ref.name;
    let failure_domain = machine
        .failure_domain()
        .map(str::to_owned)
        .or_else(|| {
            let domains = &provider?.status.as_ref()?.failure_domains;
            match domains.as_slice() {
                [only] => Some(only.name.clone()),
                _ => None,
            }
        })
        .unwrap_or_else(|| provider_name.clone());
    Scheduled {
        machine: machine.reference(),
        provider: provider_name.clone(),
        failure_domain,
        image_revision: image.and_then(scheduling::image_revision),
    }
}

/// The keys `machine` must be given: the VirtualMachine's `spec.access` when the machine's
/// differs (the bind wrote them after the machine was built). Never taken away: a member is
/// single-use, so a guest that has the keys keeps them.
pub(crate) fn access_to_hand<'a>(
    vm: &'a VirtualMachine,
    machine: &Machine,
) -> Option<&'a banlieue_api::access::ClaimAccess> {
    let access = vm.spec.access.as_ref()?;
    (machine.spec.access.as_ref() != Some(access)).then_some(access)
}

/// The challenge `machine` must be given: the VirtualMachine's `spec.handover` when the
/// machine's differs (ADR-0077). Like keys, never taken away.
pub(crate) fn handover_to_hand<'a>(
    vm: &'a VirtualMachine,
    machine: &Machine,
) -> Option<&'a banlieue_api::handover::HandoverChallenge> {
    let challenge = vm.spec.handover.as_ref()?;
    (machine.spec.handover.as_ref() != Some(challenge)).then_some(challenge)
}

/// What a saved warm member's machine is asked for, and what the VirtualMachine reports
/// (ADR-0073).
#[derive(Debug)]
pub(crate) enum StandbyStep<'a> {
    /// The VirtualMachine does not ask for saved standby: it reports none, and its machine's
    /// spec is never written for it.
    NotAsked,
    /// The machine cannot run again (its provider keeps it down rather than boot it afresh
    /// under the same spec): the VirtualMachine is deleted, with a Warning saying why. A
    /// claimed one is a vanished member, which the claim's rule for one handles (the
    /// guides'), and an unclaimed one is replaced by its pool.
    RestoreFailed { reason: String, message: String },
    /// The machine's `spec.standby` is written through `backend`; the VirtualMachine reports
    /// none until the provider has seen that spec.
    Ask {
        backend: &'a MachineBackend,
        standby: Option<Standby>,
    },
    /// The machine has the standby it should: the VirtualMachine reports what its provider
    /// reported for the machine's current spec.
    Report(Option<Standby>),
}

/// The standby step of a VirtualMachine with a machine: saved once it reached its pool's
/// readiness unclaimed, running once claimed. `next` is its status about to be written (the
/// mirror of what the machine says now), on which the member is judged. `pool` is the pool
/// its label names, when the cache holds one; only the pool controlling it counts.
/// `backend` is the builder of the machine's kind.
pub(crate) fn standby_step<'a>(
    vm: &VirtualMachine,
    next: &VirtualMachineStatus,
    machine: &Machine,
    pool: Option<&VirtualMachinePool>,
    backend: Option<&'a MachineBackend>,
) -> StandbyStep<'a> {
    if vm.spec.standby != Some(Standby::Saved) {
        return StandbyStep::NotAsked;
    }
    if let Some(failed) = conditions::find(&machine.status.conditions, types::READY)
        .filter(|c| c.reason == reasons::RESTORE_FAILED)
    {
        return StandbyStep::RestoreFailed {
            reason: failed.reason.clone(),
            message: failed.message.clone(),
        };
    }
    let saves = backend.is_some_and(|b| b.saves);
    let readiness = controlling_pool_readiness(vm, pool);
    let mut judged = vm.clone();
    judged.status = Some(next.clone());
    let desired = standby::desired(&judged, readiness, saves);
    if let (Some(backend), true) = (backend, standby::needs_write(machine.spec.standby, desired)) {
        return StandbyStep::Ask {
            backend,
            standby: desired,
        };
    }
    StandbyStep::Report(standby::reported(
        &machine.spec,
        &machine.status,
        machine.object.metadata.generation,
        saves,
    ))
}

/// The readiness of `pool` when it controls `vm`: a pool of the same name that does not (a
/// pool deleted and created again) says nothing about this member.
fn controlling_pool_readiness(
    vm: &VirtualMachine,
    pool: Option<&VirtualMachinePool>,
) -> Option<PoolReadiness> {
    pool.filter(|pool| pool.uid().as_deref() == crate::member::controller_uid(vm))
        .map(|pool| pool.spec.readiness)
}

/// How long until a VirtualMachine with status `next` is looked at again: the resync once it
/// has a machine. Unschedulable, Provider and VMImage changes wake it (each trigger follows
/// its cache update, so whichever of the VM and the image arrives second sees the other); the
/// recheck is a backstop that reads caches only, so it is cheap.
pub(crate) fn look_again_after(next: &VirtualMachineStatus, resync: Duration) -> Duration {
    if next.machine_ref.is_some() {
        resync
    } else {
        resync.min(UNSCHEDULABLE_RECHECK)
    }
}

/// The kinds a deleted VirtualMachine's machine is looked for under: the kind its status
/// names, or every kind when it names none (a machine created just before a lost status
/// write).
pub(crate) fn teardown_kinds<'a>(
    backends: &'a MachineBackends,
    status: Option<&VirtualMachineStatus>,
) -> Vec<&'a MachineBackend> {
    match status.and_then(|s| s.machine_ref.as_ref()) {
        Some(reference) => backends.of_reference(reference).into_iter().collect(),
        None => backends.iter().collect(),
    }
}

/// What a teardown does with a machine of the deleted VirtualMachine's name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum MachineTeardown {
    /// Another object's machine of the same name: not this VirtualMachine's to delete.
    NotOwned,
    /// Delete it, then wait for it to be gone.
    Delete,
    /// Already being deleted: wait for its provider's finalizer to let it go.
    AwaitGone,
}

/// What a teardown does with `machine`, found under the deleted VirtualMachine's name.
pub(crate) fn machine_teardown(machine: &DynamicObject, vm_uid: &str) -> MachineTeardown {
    if !machine.owner_references().iter().any(|o| o.uid == vm_uid) {
        MachineTeardown::NotOwned
    } else if machine.metadata.deletion_timestamp.is_none() {
        MachineTeardown::Delete
    } else {
        MachineTeardown::AwaitGone
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use banlieue_api::conditions::status;
    use banlieue_api::{InstallMode, MachineKind, names};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};
    use k8s_openapi::jiff::Timestamp;
    use serde_json::json;

    use banlieue_api::backend::PlacedImage;

    fn backends() -> MachineBackends {
        crate::machine_builder::in_tree_backends()
    }

    fn libvirt() -> MachineBackend {
        backends()
            .get(&MachineKind::LIBVIRT_MACHINE)
            .expect("a built-in kind")
            .clone()
    }

    /// The `machineRef` of machine `name` of `kind`, a built-in kind's or any other's.
    fn reference(kind: &'static str, name: &str) -> MachineReference {
        let backends = backends();
        match backends.get(&MachineKind::from_static(kind)) {
            Some(backend) => backend.reference(name),
            None => MachineReference {
                api_version: "banlieue.io/v1alpha1".into(),
                kind: kind.into(),
                name: name.into(),
            },
        }
    }

    fn vm(standby: Option<&str>) -> VirtualMachine {
        serde_json::from_value(json!({
            "apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachine",
            "metadata": {"name": "web-01", "namespace": "ns", "uid": "vm-uid",
                         "labels": {(names::LABEL_POOL): "web"},
                         "ownerReferences": [{"apiVersion": "banlieue.io/v1alpha1",
                             "kind": "VirtualMachinePool", "name": "web", "uid": "pool-uid",
                             "controller": true}]},
            "spec": {"classRef": {"name": "small"}, "imageRef": {"name": "img"},
                     "storageClassName": "gold", "networkClassName": "prod",
                     "standby": standby}
        }))
        .expect("valid VirtualMachine")
    }

    fn class() -> VMClass {
        serde_json::from_value(json!({
            "apiVersion": "banlieue.io/v1alpha1", "kind": "VMClass",
            "metadata": {"name": "small"},
            "spec": {"cpu": 2, "memory": "2Gi"}
        }))
        .expect("valid VMClass")
    }

    fn placement(kind: MachineKind) -> Placement {
        Placement {
            provider: "host-1".into(),
            provider_class: "libvirt".into(),
            machine_kind: kind,
            failure_domain: "rack-a".into(),
            storage_target: "nvme".into(),
            network_target: "br-prod".into(),
            image: PlacedImage {
                volume: "img.qcow2".into(),
                install_mode: InstallMode::Immediate,
                disk_size: Quantity("20Gi".into()),
            },
            image_revision: Some("r7".into()),
        }
    }

    /// A LibvirtMachine of `web-01` owned by `owner_uid`, on Provider `host-1`, with the
    /// machine fields given in `data` (spec and status beside its providerRef).
    fn machine(owner_uid: &str, data: serde_json::Value) -> Machine {
        let backend = libvirt();
        let mut object = DynamicObject::new("web-01", &backend.resource).within("ns");
        object.metadata.owner_references = Some(vec![OwnerReference {
            api_version: "banlieue.io/v1alpha1".into(),
            kind: "VirtualMachine".into(),
            name: "web-01".into(),
            uid: owner_uid.into(),
            controller: Some(true),
            ..Default::default()
        }]);
        let mut spec = json!({"providerRef": {"name": "host-1"}});
        if let Some(extra) = data.get("spec").and_then(|s| s.as_object()) {
            spec.as_object_mut()
                .expect("an object")
                .extend(extra.clone());
        }
        object.data = json!({"spec": spec, "status": data.get("status").cloned()});
        Machine::read(&backend, object).expect("a machine with the contract")
    }

    fn pool(uid: &str, readiness: &str) -> VirtualMachinePool {
        let spec = json!({
            "replicas": 1,
            "template": {"spec": {
                "classRef": {"name": "small"}, "imageRef": {"name": "img"},
                "storageClassName": "gold", "networkClassName": "prod"
            }},
            "updateStrategy": {"type": "Replace", "maxSurge": 1},
            "readiness": readiness,
        });
        let mut pool = VirtualMachinePool::new("web", serde_json::from_value(spec).unwrap());
        pool.metadata.uid = Some(uid.into());
        pool
    }

    fn infrastructure_ready() -> VirtualMachineStatus {
        let now = Time(Timestamp::UNIX_EPOCH);
        let mut next = VirtualMachineStatus {
            ready_since: Some(now.clone()),
            ..Default::default()
        };
        conditions::set(
            &mut next.conditions,
            conditions::new(
                types::INFRASTRUCTURE_READY,
                status::TRUE,
                "Ready",
                String::new(),
                None,
            ),
            now,
        );
        next
    }

    #[test]
    fn the_referenced_kind_is_known_or_the_object_is_invalid() {
        let backends = backends();
        assert!(
            referenced_backend(&backends, None)
                .expect("no reference")
                .is_none()
        );
        let libvirt = reference("LibvirtMachine", "web-01");
        let found = referenced_backend(&backends, Some(&libvirt)).expect("a built-in kind");
        assert_eq!(found.map(|b| b.kind_name), Some("LibvirtMachine"));
        let unknown = reference("FirecrackerMachine", "web-01");
        match referenced_backend(&backends, Some(&unknown)) {
            Err(Error::UnknownMachineKind { kind, name }) => {
                assert_eq!(
                    (kind.as_str(), name.as_str()),
                    ("FirecrackerMachine", "web-01")
                );
            }
            other => panic!("expected UnknownMachineKind, got {other:?}"),
        }
    }

    #[test]
    fn the_status_mirrors_a_cached_machine_asks_for_a_missing_one_and_adopts_an_unnamed_one() {
        let backend = libvirt();
        let named = reference("LibvirtMachine", "web-01");
        let cached = || Some(machine("vm-uid", json!({})));

        let mirrored = status_source(Some(&named), Some(&backend), cached());
        assert!(matches!(mirrored, StatusSource::Mirror(m) if m.object.name_any() == "web-01"));

        match status_source(Some(&named), Some(&backend), None) {
            StatusSource::AskApiServer { backend, name } => {
                assert_eq!(
                    (backend.kind_name, name.as_str()),
                    ("LibvirtMachine", "web-01")
                );
            }
            other => panic!("expected AskApiServer, got {other:?}"),
        }
        assert!(matches!(
            status_source(Some(&named), None, None),
            StatusSource::MachineDeleted { name } if name == "web-01"
        ));
        assert!(matches!(
            status_source(None, None, cached()),
            StatusSource::Adopt(m) if m.object.name_any() == "web-01"
        ));
        assert!(matches!(
            status_source(None, None, None),
            StatusSource::Schedule
        ));
    }

    #[test]
    fn an_unschedulable_reason_is_announced_once() {
        let failure = Unschedulable {
            reason: reasons::CLASS_NOT_FOUND,
            message: "vmclass small does not exist".into(),
        };
        let fresh = VirtualMachineStatus::default();
        assert!(announces_unschedulable(&fresh, &failure));
        let mut told = fresh.clone();
        conditions::set(
            &mut told.conditions,
            conditions::new(
                types::SCHEDULED,
                status::FALSE,
                failure.reason,
                failure.message.clone(),
                None,
            ),
            Time(Timestamp::UNIX_EPOCH),
        );
        assert!(!announces_unschedulable(&told, &failure));
        let other = Unschedulable {
            reason: reasons::NO_BUILDER_FOR_CLASS,
            message: "no machine builder for FirecrackerMachine".into(),
        };
        assert!(announces_unschedulable(&told, &other));
    }

    #[test]
    fn a_placed_vm_gets_its_kinds_machine_or_says_why_none_can_be_built() {
        let (vm, class) = (vm(None), class());
        let backends = backends();
        let libvirt = placement(MachineKind::LIBVIRT_MACHINE);

        let built = machine_for(&vm, Some(&class), &backends, &libvirt).expect("a machine");
        assert_eq!(built.name_any(), "web-01");
        assert_eq!(
            built.types.map(|t| t.kind).as_deref(),
            Some("LibvirtMachine")
        );
        assert_eq!(
            built
                .metadata
                .annotations
                .and_then(|a| a.get(names::ANNOTATION_FAILURE_DOMAIN).cloned())
                .as_deref(),
            Some("rack-a")
        );

        let no_class = machine_for(&vm, None, &backends, &libvirt).expect_err("no class");
        assert_eq!(no_class.reason, reasons::CLASS_NOT_FOUND);
        assert_eq!(no_class.message, "vmclass small does not exist");

        let unknown = placement(MachineKind::from_static("FirecrackerMachine"));
        let no_builder =
            machine_for(&vm, Some(&class), &backends, &unknown).expect_err("no builder");
        assert_eq!(no_builder.reason, reasons::NO_BUILDER_FOR_CLASS);
        assert_eq!(
            no_builder.message,
            "no machine builder for FirecrackerMachine"
        );

        let mut unnamed = vm.clone();
        unnamed.metadata.uid = None;
        let unbuildable =
            machine_for(&unnamed, Some(&class), &backends, &libvirt).expect_err("no uid");
        assert_eq!(unbuildable.reason, reasons::NO_BUILDER_FOR_CLASS);
        assert_eq!(
            unbuildable.message,
            r#"cannot build a machine for provider class "libvirt": the VirtualMachine has no name or uid"#
        );
    }

    /// A class with egress is built only by a backend that enforces it: the libvirt machine
    /// carries the class's egress, a vSphere placement is refused naming the reason.
    #[test]
    fn a_class_with_egress_is_built_only_where_the_backend_enforces_it() {
        let vm = vm(None);
        let mut class = class();
        class.spec.egress = Some(
            serde_json::from_value(json!({
                "allow": [{"cidr": "10.0.0.0/8", "protocol": "TCP", "port": 443}],
                "dnsResolver": "10.0.0.53"
            }))
            .expect("valid egress"),
        );
        let backends = backends();
        let built = machine_for(
            &vm,
            Some(&class),
            &backends,
            &placement(MachineKind::LIBVIRT_MACHINE),
        )
        .expect("a libvirt machine");
        assert_eq!(
            built.data["spec"]["egress"],
            json!({"allow": [{"cidr": "10.0.0.0/8", "protocol": "TCP", "port": 443}],
                   "dnsResolver": "10.0.0.53", "allowAlwaysDenied": []})
        );
        let mut vsphere = placement(MachineKind::VSPHERE_MACHINE);
        vsphere.failure_domain = "dc/cluster".into();
        let refused =
            machine_for(&vm, Some(&class), &backends, &vsphere).expect_err("not enforced");
        assert_eq!(refused.reason, reasons::EGRESS_NOT_ENFORCED);
        assert!(
            refused.message.contains("vmclass small declares egress"),
            "{}",
            refused.message
        );
        class.spec.egress = None;
        machine_for(&vm, Some(&class), &backends, &vsphere).expect("no egress, a vSphere machine");
    }

    #[test]
    fn an_adopted_machine_is_where_its_annotation_else_its_providers_only_domain_says() {
        let provider = |domains: &[&str]| -> Provider {
            let domains: Vec<_> = domains.iter().map(|d| json!({"name": d})).collect();
            serde_json::from_value(json!({
                "apiVersion": "banlieue.io/v1alpha1", "kind": "Provider",
                "metadata": {"name": "host-1", "namespace": "ns"},
                "spec": {"providerClassRef": {"name": "libvirt"},
                         "connection": {"endpoint": "qemu+tls://h/system",
                                        "credentialsRef": {"name": "c"},
                                        "caBundle": {"inline": "x"}}},
                "status": {"failureDomains": domains}
            }))
            .expect("valid Provider")
        };
        let image: VMImage = serde_json::from_value(json!({
            "apiVersion": "banlieue.io/v1alpha1", "kind": "VMImage",
            "metadata": {"name": "img"},
            "spec": {"installMode": "Immediate",
                     "sources": [{"providerClass": "libvirt", "kind": "BackingFile", "volume": "v"}]},
            "status": {"revision": "r7"}
        }))
        .expect("valid VMImage");

        let mut annotated = machine("vm-uid", json!({}));
        annotated.object.metadata.annotations = Some(
            [(
                names::ANNOTATION_FAILURE_DOMAIN.to_owned(),
                "rack-b".to_owned(),
            )]
            .into(),
        );
        let site = adopted_site(&annotated, Some(&provider(&["rack-a"])), Some(&image));
        assert_eq!(site.machine, annotated.reference());
        assert_eq!(site.provider, "host-1");
        assert_eq!(site.failure_domain, "rack-b");
        assert_eq!(site.image_revision.as_deref(), Some("r7"));

        let older = machine("vm-uid", json!({}));
        let only = adopted_site(&older, Some(&provider(&["rack-a"])), None);
        assert_eq!(only.failure_domain, "rack-a");
        assert_eq!(only.image_revision, None);
        let ambiguous = adopted_site(&older, Some(&provider(&["rack-a", "rack-b"])), None);
        assert_eq!(ambiguous.failure_domain, "host-1");
        let gone = adopted_site(&older, None, None);
        assert_eq!(gone.failure_domain, "host-1");
    }

    #[test]
    fn a_vm_not_asking_for_saved_standby_reports_none() {
        let libvirt = libvirt();
        let running = machine("vm-uid", json!({}));
        let step = standby_step(
            &vm(None),
            &infrastructure_ready(),
            &running,
            Some(&pool("pool-uid", "InfrastructureReady")),
            Some(&libvirt),
        );
        assert!(matches!(step, StandbyStep::NotAsked), "{step:?}");
    }

    #[test]
    fn a_machine_that_failed_to_restore_deletes_its_vm_with_the_machines_words() {
        let libvirt = libvirt();
        let failed = machine(
            "vm-uid",
            json!({"status": {"conditions": [{
                "type": "Ready", "status": "False", "reason": reasons::RESTORE_FAILED,
                "message": "the saved state is gone", "lastTransitionTime": "2026-01-01T00:00:00Z"
            }]}}),
        );
        let step = standby_step(
            &vm(Some("Saved")),
            &infrastructure_ready(),
            &failed,
            Some(&pool("pool-uid", "InfrastructureReady")),
            Some(&libvirt),
        );
        match step {
            StandbyStep::RestoreFailed { reason, message } => {
                assert_eq!(
                    (reason.as_str(), message.as_str()),
                    (reasons::RESTORE_FAILED, "the saved state is gone")
                );
            }
            other => panic!("expected RestoreFailed, got {other:?}"),
        }
    }

    #[test]
    fn a_ready_unclaimed_member_of_its_pool_has_its_machine_asked_to_save() {
        let libvirt = libvirt();
        let member = vm(Some("Saved"));
        let running = machine("vm-uid", json!({}));
        let controlling = pool("pool-uid", "InfrastructureReady");
        // Judged on the status about to be written, not the one the VM holds.
        assert!(member.status.is_none());
        let step = standby_step(
            &member,
            &infrastructure_ready(),
            &running,
            Some(&controlling),
            Some(&libvirt),
        );
        match step {
            StandbyStep::Ask { backend, standby } => {
                assert_eq!(backend.kind_name, "LibvirtMachine");
                assert_eq!(standby, Some(Standby::Saved));
            }
            other => panic!("expected Ask, got {other:?}"),
        }

        // Not ready yet: it stays running, which an unset standby already is.
        let step = standby_step(
            &member,
            &VirtualMachineStatus::default(),
            &running,
            Some(&controlling),
            Some(&libvirt),
        );
        assert!(
            matches!(step, StandbyStep::Report(Some(Standby::Running))),
            "{step:?}"
        );

        // A pool of the same name that does not control it says nothing: it runs.
        let step = standby_step(
            &member,
            &infrastructure_ready(),
            &running,
            Some(&pool("another-uid", "InfrastructureReady")),
            Some(&libvirt),
        );
        assert!(
            matches!(step, StandbyStep::Report(Some(Standby::Running))),
            "{step:?}"
        );

        // A kind this controller has no builder for cannot be saved.
        let step = standby_step(
            &member,
            &infrastructure_ready(),
            &running,
            Some(&controlling),
            None,
        );
        assert!(
            matches!(step, StandbyStep::Report(Some(Standby::Running))),
            "{step:?}"
        );
    }

    #[test]
    fn a_saved_machine_reports_what_its_provider_did_for_the_latest_spec() {
        let libvirt = libvirt();
        let member = vm(Some("Saved"));
        let controlling = pool("pool-uid", "InfrastructureReady");
        let mut saved = machine(
            "vm-uid",
            json!({"spec": {"standby": "Saved"},
                   "status": {"standby": "Saved", "observedGeneration": 2}}),
        );
        saved.object.metadata.generation = Some(2);
        let step = standby_step(
            &member,
            &infrastructure_ready(),
            &saved,
            Some(&controlling),
            Some(&libvirt),
        );
        assert!(
            matches!(step, StandbyStep::Report(Some(Standby::Saved))),
            "{step:?}"
        );
        // The provider has not acted on the latest spec yet.
        saved.object.metadata.generation = Some(3);
        let step = standby_step(
            &member,
            &infrastructure_ready(),
            &saved,
            Some(&controlling),
            Some(&libvirt),
        );
        assert!(matches!(step, StandbyStep::Report(None)), "{step:?}");
    }

    #[test]
    fn an_unscheduled_vm_is_rechecked_sooner_than_the_resync() {
        let resync = Duration::from_secs(300);
        let scheduled = VirtualMachineStatus {
            machine_ref: Some(reference("LibvirtMachine", "web-01")),
            ..Default::default()
        };
        assert_eq!(look_again_after(&scheduled, resync), resync);
        let unscheduled = VirtualMachineStatus::default();
        assert_eq!(
            look_again_after(&unscheduled, resync),
            UNSCHEDULABLE_RECHECK
        );
        let short = Duration::from_secs(2);
        assert_eq!(look_again_after(&unscheduled, short), short);
    }

    #[test]
    fn a_teardown_looks_under_the_named_kind_else_every_kind() {
        let backends = backends();
        let kinds = |status: Option<&VirtualMachineStatus>| -> Vec<&str> {
            teardown_kinds(&backends, status)
                .into_iter()
                .map(|b| b.kind_name)
                .collect()
        };
        assert_eq!(kinds(None), vec!["LibvirtMachine", "VSphereMachine"]);
        let unnamed = VirtualMachineStatus::default();
        assert_eq!(
            kinds(Some(&unnamed)),
            vec!["LibvirtMachine", "VSphereMachine"]
        );
        let vsphere = VirtualMachineStatus {
            machine_ref: Some(reference("VSphereMachine", "web-01")),
            ..Default::default()
        };
        assert_eq!(kinds(Some(&vsphere)), vec!["VSphereMachine"]);
        let unknown = VirtualMachineStatus {
            machine_ref: Some(reference("FirecrackerMachine", "web-01")),
            ..Default::default()
        };
        assert!(kinds(Some(&unknown)).is_empty());
    }

    #[test]
    fn a_teardown_deletes_only_its_own_machine_and_once() {
        let mut own = machine("vm-uid", json!({})).object;
        assert_eq!(machine_teardown(&own, "vm-uid"), MachineTeardown::Delete);
        assert_eq!(
            machine_teardown(&own, "other-uid"),
            MachineTeardown::NotOwned
        );
        own.metadata.deletion_timestamp = Some(Time(Timestamp::UNIX_EPOCH));
        assert_eq!(machine_teardown(&own, "vm-uid"), MachineTeardown::AwaitGone);
    }

    #[test]
    fn a_bound_members_keys_are_handed_to_its_machine_once() {
        let keys = json!({"sshAuthorizedKeys": ["ssh-ed25519 AAAA"], "user": "alice"});
        let mut bound = vm(None);
        bound.spec.access = Some(serde_json::from_value(keys.clone()).unwrap());
        let bare = machine("vm-uid", json!({}));
        assert_eq!(access_to_hand(&bound, &bare), bound.spec.access.as_ref());
        let given = machine("vm-uid", json!({"spec": {"access": keys}}));
        assert_eq!(access_to_hand(&bound, &given), None);
        // A VirtualMachine without keys takes none from its machine.
        assert_eq!(access_to_hand(&vm(None), &given), None);
    }
}

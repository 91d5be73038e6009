//! The backends this build runs: the one list of them (ADR-0071). Each is a crate exporting a
//! [`Descriptor`]; the controller builds their machines, the Provider operator runs their
//! workloads, `banlieue provider <name> run` starts one and `banlieue crds` writes their CRDs,
//! all by iterating [`all`]. Adding a backend is its crate and one line here (and a cargo
//! feature, so an image for one backend links only that backend's client).

use banlieue_api::backend::BackendWorkload;
use banlieue_controller::machine_builder::MachineBackends;
use banlieue_provider_kit::descriptor::Descriptor;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;

/// Every backend of this build, in the order their caches are started.
pub fn all() -> Vec<Descriptor> {
    vec![
        #[cfg(feature = "libvirt")]
        banlieue_provider_libvirt::backend::descriptor(),
        #[cfg(feature = "vsphere")]
        banlieue_provider_vsphere::backend::descriptor(),
    ]
}

/// Their words in `banlieue provider <name> run`.
pub fn names() -> Vec<&'static str> {
    all().iter().map(Descriptor::name).collect()
}

/// The machine kinds the controller builds.
pub fn machine_backends() -> MachineBackends {
    MachineBackends::new(all().into_iter().map(|backend| backend.machine))
}

/// The workloads the Provider operator runs.
pub fn workloads() -> Vec<BackendWorkload> {
    all().into_iter().map(|backend| backend.workload).collect()
}

/// Every CRD this build serves: the neutral kinds, then each backend's.
pub fn crds() -> Vec<CustomResourceDefinition> {
    let mut crds = banlieue_api::neutral_crds();
    for backend in all() {
        crds.extend((backend.crds)());
    }
    crds
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::CustomResourceExt;

    /// With every backend on, the binary serves exactly the CRDs the API crate defines: a
    /// machine kind whose backend is missing from the list (or a list entry whose CRD is not in
    /// `deploy/crds`) fails here.
    #[cfg(all(feature = "libvirt", feature = "vsphere"))]
    #[test]
    fn every_machine_crd_has_a_backend() {
        let names = |crds: Vec<CustomResourceDefinition>| {
            let mut names: Vec<String> = crds.into_iter().filter_map(|c| c.metadata.name).collect();
            names.sort();
            names
        };
        assert_eq!(names(crds()), names(banlieue_api::crds()));
        let machine_kinds: Vec<String> = banlieue_api::crds()
            .into_iter()
            .map(|crd| crd.spec.names.kind)
            .filter(|kind| kind.ends_with("Machine") && kind != "VirtualMachine")
            .collect();
        let built: Vec<String> = machine_backends()
            .iter()
            .map(|backend| backend.resource.kind.clone())
            .collect();
        assert_eq!(machine_kinds, built);
        assert_eq!(
            built,
            [
                banlieue_api::LibvirtMachine::crd().spec.names.kind,
                banlieue_api::VSphereMachine::crd().spec.names.kind
            ]
        );
        let machine_backends = machine_backends();
        for backend in machine_backends.iter() {
            let found = machine_backends.of_reference(&backend.reference("m"));
            assert_eq!(found.map(|b| b.kind()), Some(backend.kind()));
        }
    }

    /// Each backend's halves agree on its kind, and names are unique (they pick the backend of
    /// `banlieue provider <name> run`).
    #[test]
    fn each_backend_is_one_kind_and_one_name() {
        let backends = all();
        for backend in &backends {
            assert_eq!(backend.machine.kind(), backend.workload.kind);
            assert_eq!(backend.machine.resource, backend.workload.machines);
            let crd_kinds: Vec<String> = (backend.crds)()
                .into_iter()
                .map(|crd| crd.spec.names.kind)
                .collect();
            assert!(crd_kinds.contains(&backend.machine.resource.kind));
        }
        let mut names = names();
        let count = names.len();
        // dedup removes only neighbours: sorted, any repeated name is one.
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), count);
    }
}

//! The libvirt backend as one value ([`descriptor`]): what the binary lists so that the
//! controller builds LibvirtMachines, the operator runs `banlieue provider libvirt run` for the
//! classes of that kind, `banlieue crds` writes its CRD, and a Provider's workload starts the
//! three reconcilers below.

use std::sync::Arc;

use banlieue_provider_kit::descriptor::{Descriptor, Task, Workload};

use crate::domain_xml::DomainType;
use crate::image::jobs::{ImageReconcilerConfig, run_image_reconciler};
use crate::machine::{ProviderConfig, run_provider};
use crate::metrics::Metrics;
use crate::provider_status::{StatusConfig, run_status};

/// The libvirt backend, each host's domain type derived from its capabilities.
pub fn descriptor() -> Descriptor {
    descriptor_forcing(None)
}

/// The libvirt backend, every domain of type `domain_type` when given (a host whose KVM cannot
/// run the guests, as in `dev up` on a machine without usable KVM).
pub fn descriptor_forcing(domain_type: Option<DomainType>) -> Descriptor {
    Descriptor {
        machine: banlieue_api::machine::libvirt_machine_backend(),
        workload: banlieue_api::machine::libvirt_workload(),
        crds: || vec![banlieue_api::machine::libvirt_machine_crd()],
        class_role_manifest: Some(include_str!("../class-clusterrole.yaml")),
        run: Arc::new(move |workload| tasks(workload, domain_type)),
    }
}

/// One Provider's workload: its LibvirtMachines, its readiness and its image imports.
fn tasks(workload: Workload<'_>, domain_type: Option<DomainType>) -> Vec<Task> {
    let Workload {
        client,
        provider,
        namespace,
        registry,
        shutdown,
    } = workload;
    let mut machines = ProviderConfig::new(provider.clone(), namespace.clone());
    if domain_type.is_some() {
        machines.domain_type = domain_type;
    }
    let metrics = Metrics::register(registry);
    let status = StatusConfig::new(provider.clone(), namespace.clone());
    let images = ImageReconcilerConfig::new(provider, namespace);
    vec![
        Task::until_cancelled("libvirt provider", &shutdown, |stop| {
            run_provider(client.clone(), machines, metrics, stop)
        }),
        Task::until_cancelled("libvirt provider status", &shutdown, |stop| {
            run_status(client.clone(), status, stop)
        }),
        Task::until_cancelled("libvirt image reconciler", &shutdown, |stop| {
            run_image_reconciler(client, images, stop)
        }),
    ]
}

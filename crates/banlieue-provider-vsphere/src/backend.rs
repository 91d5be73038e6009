//! The vSphere backend as one value ([`descriptor`]): what the binary lists so that the
//! controller builds VSphereMachines, the operator runs `banlieue provider vsphere run` for the
//! classes of that kind, `banlieue crds` writes its CRD, and a Provider's workload starts the
//! three reconcilers below.

use std::sync::Arc;

use banlieue_provider_kit::descriptor::{Descriptor, Task, Workload};

use crate::image_status::{ImageConfig, run_images};
use crate::machine::{ProviderConfig, run_provider};
use crate::provider_status::{StatusConfig, run_status};

/// The vSphere backend.
pub fn descriptor() -> Descriptor {
    Descriptor {
        machine: banlieue_api::vsphere::machine_backend(),
        workload: banlieue_api::vsphere::workload(),
        crds: || vec![banlieue_api::vsphere::crd()],
        class_role_manifest: Some(include_str!("../class-clusterrole.yaml")),
        run: Arc::new(tasks),
    }
}

/// One Provider's workload: its VSphereMachines, its images' templates and its readiness.
fn tasks(workload: Workload<'_>) -> Vec<Task> {
    let Workload {
        client,
        provider,
        namespace,
        shutdown,
        ..
    } = workload;
    let machines = ProviderConfig::new(provider.clone(), namespace.clone());
    let images = ImageConfig::new(provider.clone(), namespace.clone());
    let status = StatusConfig::new(provider, namespace);
    vec![
        Task::until_cancelled("vSphere provider", &shutdown, |stop| {
            run_provider(client.clone(), machines, stop)
        }),
        Task::until_cancelled("vSphere provider images", &shutdown, |stop| {
            run_images(client.clone(), images, stop)
        }),
        Task::until_cancelled("vSphere provider status", &shutdown, |stop| {
            run_status(client, status, stop)
        }),
    ]
}

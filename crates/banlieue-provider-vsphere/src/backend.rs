//! The vSphere backend as one value ([`descriptor`]): what the binary lists so that the
//! controller builds VSphereMachines, the operator runs `banlieue provider vsphere run` for the
//! classes of that kind, `banlieue crds` writes its CRD, and a Provider's workload starts the
//! three reconcilers below.

use std::sync::Arc;

use banlieue_provider_kit::descriptor::{BoxError, Descriptor, Task, Workload};

use crate::image_status::{ImageConfig, run_images};
use crate::machine::{ProviderConfig, run_provider};
use crate::provider_status::{StatusConfig, run_status};

/// The vSphere backend.
pub fn descriptor() -> Descriptor {
    Descriptor {
        machine: banlieue_api::vsphere::machine_backend(),
        workload: banlieue_api::vsphere::workload(),
        crds: || vec![banlieue_api::vsphere::crd()],
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
        Task::new("vSphere provider", {
            let (client, stop) = (client.clone(), shutdown.clone());
            async move {
                run_provider(client, machines, stop.cancelled_owned())
                    .await
                    .map_err(BoxError::from)
            }
        }),
        Task::new("vSphere provider images", {
            let (client, stop) = (client.clone(), shutdown.clone());
            async move {
                run_images(client, images, stop.cancelled_owned())
                    .await
                    .map_err(BoxError::from)
            }
        }),
        Task::new("vSphere provider status", async move {
            run_status(client, status, shutdown.cancelled_owned())
                .await
                .map_err(BoxError::from)
        }),
    ]
}

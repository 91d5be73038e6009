//! A backend as one value (ADR-0071): each backend crate exports a [`Descriptor`], and the
//! binary's list of them is the only place backends are named. The controller builds machines
//! with its [`MachineBackend`], the Provider operator shapes workloads with its
//! [`BackendWorkload`], `banlieue crds` writes its CRDs, and `banlieue provider <name> run`
//! starts its reconcilers through [`Descriptor::run`].

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use banlieue_api::backend::{BackendWorkload, MachineBackend};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use prometheus_client::registry::Registry;
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

/// An error a backend's task ended with.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// One long-running task of a backend's workload, named for the logs.
pub struct Task {
    /// What it does (`"libvirt provider status"`), as the process logs it stopping or failing.
    pub name: &'static str,
    pub future: Pin<Box<dyn Future<Output = Result<(), BoxError>> + Send>>,
}

impl fmt::Debug for Task {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Task")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl Task {
    /// A task named `name` running a reconciler until `shutdown` is cancelled: `reconciler` is
    /// given the future that completes then, and its error is boxed.
    pub fn until_cancelled<F, E>(
        name: &'static str,
        shutdown: &CancellationToken,
        reconciler: impl FnOnce(WaitForCancellationFutureOwned) -> F,
    ) -> Task
    where
        F: Future<Output = Result<(), E>> + Send + 'static,
        E: Into<BoxError>,
    {
        let run = reconciler(shutdown.clone().cancelled_owned());
        Task::new(name, async move { run.await.map_err(Into::into) })
    }

    /// A task named `name` running `future`.
    pub fn new(
        name: &'static str,
        future: impl Future<Output = Result<(), BoxError>> + Send + 'static,
    ) -> Task {
        Task {
            name,
            future: Box::pin(future),
        }
    }
}

/// What a backend's workload is started with: one Provider's.
pub struct Workload<'a> {
    /// The API client, as the Provider's workload account.
    pub client: kube::Client,
    /// The Provider's name and namespace.
    pub provider: String,
    pub namespace: String,
    /// Where the backend registers its metrics.
    pub registry: &'a mut Registry,
    /// Cancelled when the process stops; every task returns soon after.
    pub shutdown: CancellationToken,
}

impl fmt::Debug for Workload<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Workload")
            .field("provider", &self.provider)
            .field("namespace", &self.namespace)
            .finish_non_exhaustive()
    }
}

/// Starts a backend's tasks for one Provider.
pub type Run = Arc<dyn Fn(Workload<'_>) -> Vec<Task> + Send + Sync>;

/// Everything the rest of banlieue knows of one backend.
#[derive(Clone)]
pub struct Descriptor {
    /// The controller's half: the machine kind, its API resource and finalizer, and the
    /// builder of its spec.
    pub machine: MachineBackend,
    /// The Provider operator's half: the subcommand its workload runs and its grants.
    pub workload: BackendWorkload,
    /// The CRDs of its machine kind (and of anything else it serves).
    pub crds: fn() -> Vec<CustomResourceDefinition>,
    /// The ClusterRole the install ships for its ProviderClasses to bind, as YAML, if any:
    /// `banlieue manifests` copies it to `deploy/rbac/provider-class-<name>-clusterrole.yaml`,
    /// which every installer applies.
    pub class_role_manifest: Option<&'static str>,
    /// Starts its reconcilers for one Provider.
    pub run: Run,
}

impl Descriptor {
    /// Its word in `banlieue provider <name> run`.
    pub fn name(&self) -> &'static str {
        self.workload.subcommand
    }
}

impl fmt::Debug for Descriptor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Descriptor")
            .field("name", &self.name())
            .field("machine", &self.machine.kind_name)
            .finish_non_exhaustive()
    }
}

/// The descriptor of `name` among `backends`.
pub fn find<'a>(backends: &'a [Descriptor], name: &str) -> Option<&'a Descriptor> {
    backends.iter().find(|backend| backend.name() == name)
}

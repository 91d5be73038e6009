//! VSphereMachine realisation for one Provider, run by `banlieue provider vsphere run`: each
//! VSphereMachine whose `spec.providerRef` names this Provider becomes a VM cloned from its
//! template, and is destroyed under the `banlieue.io/vm-protection` finalizer.

pub mod access;
#[cfg(test)]
mod fixtures;
pub mod power;
mod realise;
pub mod status;
mod teardown;
pub mod vm;
pub mod watch;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use banlieue_api::{VSphereMachine, VSphereMachineStatus};
use banlieue_provider_kit::machine::{self as skeleton, Backend, Settings, Teardown};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::Api;
use tokio::sync::mpsc;

use crate::error::{Error, Result};
use crate::session::Session;

/// Settings of one provider workload.
#[derive(Clone, Debug)]
pub struct ProviderConfig {
    /// The Provider this workload serves.
    pub provider: String,
    /// Its namespace, which is also where its VSphereMachines live.
    pub namespace: String,
    /// How often every machine is looked at again, as a backstop to the property waits.
    pub resync: Duration,
    /// Deadline of each vSphere task (clone, reconfigure, power, destroy).
    pub task_timeout: Duration,
}

impl ProviderConfig {
    /// Defaults: a resync every 60 s, 10 minutes per task (a full clone on slow storage).
    pub fn new(provider: impl Into<String>, namespace: impl Into<String>) -> ProviderConfig {
        ProviderConfig {
            provider: provider.into(),
            namespace: namespace.into(),
            resync: Duration::from_secs(60),
            task_timeout: Duration::from_secs(600),
        }
    }
}

struct Context {
    kube: kube::Client,
    cfg: ProviderConfig,
    session: Arc<Session>,
}

/// Reconciles this Provider's VSphereMachines until `shutdown` completes. A property wait on
/// the VMs (their power state, guest NICs and guest phase) wakes the machines when one of
/// theirs changed.
pub async fn run_provider(
    client: kube::Client,
    cfg: ProviderConfig,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) -> Result<()> {
    let session = Arc::new(Session::new(client.clone(), &cfg.namespace, &cfg.provider));
    // One pending wake-up is enough: it reconciles every machine, so a burst of VM changes
    // collapses into one pass.
    let (wake, woken) = mpsc::channel(1);
    let pump = tokio::spawn(watch::run(session.clone(), cfg.namespace.clone(), wake));
    let machines: Api<VSphereMachine> = Api::namespaced(client.clone(), &cfg.namespace);
    // A reconcile holds at most a clone, a reconfigure and a power-on: three tasks' deadlines.
    let settings = Settings {
        deadline: cfg.task_timeout.saturating_mul(3),
        ..Settings::default()
    };
    let backend = Arc::new(Context {
        kube: client,
        cfg,
        session,
    });
    skeleton::run(backend, machines, settings, woken, shutdown).await;
    pump.abort();
    Ok(())
}

impl Backend for Context {
    type Machine = VSphereMachine;
    type Status = VSphereMachineStatus;
    type Observed = status::Observed;
    type Error = Error;

    fn provider(&self) -> &str {
        &self.cfg.provider
    }

    fn running(observed: &status::Observed) -> bool {
        observed.settled()
    }

    fn resync(&self) -> Duration {
        self.cfg.resync
    }

    async fn realise(&self, machine: &VSphereMachine) -> Result<status::Observed> {
        realise::run(machine, self).await
    }

    fn status_after(
        &self,
        machine: &VSphereMachine,
        outcome: &Result<status::Observed>,
        now: Time,
    ) -> VSphereMachineStatus {
        status::status_after(machine, outcome, now)
    }

    async fn teardown(&self, machine: &VSphereMachine) -> Result<Teardown> {
        Ok(if teardown::destroy(machine, self).await? {
            Teardown::Done
        } else {
            // Destroyed, but the lookup still finds it: look again shortly.
            Teardown::Again(Duration::from_secs(1))
        })
    }

    fn teardown_failed(
        &self,
        machine: &VSphereMachine,
        error: &Error,
        now: Time,
    ) -> VSphereMachineStatus {
        teardown::failed_status(machine, error, now)
    }

    async fn recover(&self, error: &Error) {
        if error.is_session_lost() {
            self.session.forget().await;
        }
    }
}

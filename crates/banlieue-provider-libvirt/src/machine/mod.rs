//! LibvirtMachine realisation for one Provider, run by `banlieue provider libvirt run`: each
//! LibvirtMachine whose `spec.providerRef` names this Provider becomes a libvirt domain, and
//! is torn down under the `banlieue.io/domain-protection` finalizer.

mod agent;
pub mod domain;
pub mod egress;
#[cfg(test)]
mod fixtures;
pub mod guest;
pub mod host;
mod realise;
pub use realise::{CRASH_AFTER_DOMAIN_DEFINE, CRASH_AFTER_VOLUME_CREATE};
pub mod standby;
pub mod status;
pub mod targets;
mod teardown;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use banlieue_api::LibvirtMachine;
use banlieue_api::LibvirtMachineStatus;
use banlieue_api::conditions;
use banlieue_provider_kit::error::Core;
use banlieue_provider_kit::machine::{self as skeleton, Backend, Settings, Teardown};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::Api;
use serde_json::json;
use tokio::sync::mpsc;

use crate::domain_xml::DomainType;
use crate::error::{Error, Result};
use crate::metrics::Metrics;
use host::{Host, HostConnector};

/// Settings of one provider workload.
#[derive(Clone, Debug)]
pub struct ProviderConfig {
    /// The Provider this workload serves.
    pub provider: String,
    /// Its namespace, which is also where its LibvirtMachines live.
    pub namespace: String,
    /// How often every machine is looked at again, as a backstop to domain events.
    pub resync: Duration,
    /// Deadline of each libvirt call.
    pub call_timeout: Duration,
    /// Forces the domain type instead of deriving it from the host's capabilities
    /// (see [`crate::domain_type::DOMAIN_TYPE_ENV`]).
    pub domain_type: Option<DomainType>,
}

impl ProviderConfig {
    /// Defaults, with the domain type taken from `BANLIEUE_LIBVIRT_DOMAIN_TYPE` when set.
    pub fn new(provider: impl Into<String>, namespace: impl Into<String>) -> ProviderConfig {
        ProviderConfig {
            provider: provider.into(),
            namespace: namespace.into(),
            resync: Duration::from_secs(60),
            call_timeout: Duration::from_secs(60),
            domain_type: std::env::var(crate::domain_type::DOMAIN_TYPE_ENV)
                .ok()
                .and_then(|v| DomainType::parse(&v)),
        }
    }
}

struct Context {
    kube: kube::Client,
    cfg: ProviderConfig,
    host: Arc<Host>,
    metrics: Metrics,
}

/// Reconciles this Provider's LibvirtMachines until `shutdown` completes, recording into
/// `metrics`. Domain lifecycle and agent events wake every machine, beside the watch.
pub async fn run_provider(
    client: kube::Client,
    cfg: ProviderConfig,
    metrics: Metrics,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) -> Result<()> {
    let host = Arc::new(Host::new(HostConnector::new(
        client.clone(),
        &cfg.namespace,
        &cfg.provider,
        cfg.domain_type,
        cfg.call_timeout,
        metrics.host_connected.clone(),
    )));
    let (ticks, tick_rx) = mpsc::channel(1);
    let events = tokio::spawn(host::forward_events(host.clone(), ticks));
    let machines: Api<LibvirtMachine> = Api::namespaced(client.clone(), &cfg.namespace);
    let backend = Arc::new(Context {
        kube: client,
        cfg,
        host,
        metrics,
    });
    skeleton::run(backend, machines, Settings::default(), tick_rx, shutdown).await;
    events.abort();
    Ok(())
}

impl Backend for Context {
    type Machine = LibvirtMachine;
    type Status = LibvirtMachineStatus;
    type Observed = status::Observed;
    type Error = Error;

    fn provider(&self) -> &str {
        &self.cfg.provider
    }

    /// A saved machine counts as settled, not as one about to run: it waits for its spec to
    /// change (a watch event), and is looked at again at the resync, not every 5 s.
    fn running(observed: &status::Observed) -> bool {
        observed.settled()
    }

    fn resync(&self) -> Duration {
        self.cfg.resync
    }

    /// The UUID is chosen and recorded before anything exists on the host: it is the seed's
    /// instance-id and the upsert guard's proof of ownership, so it must survive a crash
    /// between building the seed and defining the domain.
    fn before_realise(&self, machine: &LibvirtMachine) -> Option<serde_json::Value> {
        if recorded_uuid(machine).is_some() {
            return None;
        }
        let names = domain::MachineNames::of(machine);
        Some(json!({
            "domainUuid": uuid::Uuid::new_v4().to_string(),
            "domainName": names.domain,
        }))
    }

    async fn realise(&self, machine: &LibvirtMachine) -> Result<status::Observed> {
        let uuid = recorded_uuid(machine).ok_or_else(|| {
            Error::Core(Core::Invalid {
                reason: banlieue_api::conditions::reasons::PROVIDER_NOT_READY,
                message: "the domain UUID is not recorded yet".to_owned(),
            })
        })?;
        realise::run(machine, uuid, self).await
    }

    fn status_after(
        &self,
        machine: &LibvirtMachine,
        outcome: &Result<status::Observed>,
        now: Time,
    ) -> LibvirtMachineStatus {
        status::status_after(
            machine,
            &self.cfg.namespace,
            &self.cfg.provider,
            outcome,
            now,
        )
    }

    async fn teardown(&self, machine: &LibvirtMachine) -> Result<Teardown> {
        teardown::run(machine, self).await?;
        Ok(Teardown::Done)
    }

    fn teardown_failed(
        &self,
        machine: &LibvirtMachine,
        error: &Error,
        now: Time,
    ) -> LibvirtMachineStatus {
        teardown::failed_status(machine, error, now)
    }

    async fn recover(&self, error: &Error) {
        if error.is_connection_lost() {
            self.host.forget().await;
        }
    }

    fn record_error(&self, error: &Error) {
        self.metrics.reconcile_error(error.reason());
    }

    fn status_written(
        &self,
        machine: &LibvirtMachine,
        before: Option<&LibvirtMachineStatus>,
        after: &LibvirtMachineStatus,
    ) {
        let Some(created) = &machine.metadata.creation_timestamp else {
            return;
        };
        let waited = || {
            let waited = Time(k8s_openapi::jiff::Timestamp::now())
                .0
                .duration_since(created.0);
            waited.as_secs_f64().max(0.0)
        };
        let guest_ready = |s: &LibvirtMachineStatus| {
            conditions::is_true(&s.contract.conditions, conditions::types::GUEST_READY)
        };
        if guest_ready(after) && !before.is_some_and(guest_ready) {
            self.metrics.guest_ready_latency.observe(waited());
        }
        if after.contract.ready && !before.is_some_and(|s| s.contract.ready) {
            self.metrics.machine_ready_latency.observe(waited());
        }
    }
}

fn recorded_uuid(machine: &LibvirtMachine) -> Option<&str> {
    machine.status.as_ref()?.domain_uuid.as_deref()
}

/// Patches the status, guarded by the resourceVersion `machine` was read at. Returns false
/// when the object changed meanwhile (409): the caller reads it again.
async fn patch_status(
    api: &Api<LibvirtMachine>,
    machine: &LibvirtMachine,
    status: serde_json::Value,
) -> Result<bool> {
    use kube::ResourceExt;
    let name = machine.name_any();
    let version = machine.resource_version();
    match banlieue_runtime::reconcile::patch_status(api, &name, &status, version.as_deref()).await {
        Ok(_) => Ok(true),
        Err(e) if e.is_stale() => Ok(false),
        Err(e) => Err(<Context as Backend>::patch_failed(
            format!("patch LibvirtMachine {name} status"),
            e,
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::status::Observed;
    use super::*;
    use banlieue_api::Standby;
    use banlieue_api::conditions::{reasons, status, types};
    use banlieue_provider_kit::machine::look_again;
    use k8s_openapi::jiff::Timestamp;

    fn at(second: i64) -> Time {
        Time(Timestamp::from_second(1_800_000_000 + second).unwrap())
    }

    #[test]
    fn a_saved_machine_is_looked_at_again_at_the_resync_not_as_one_starting() {
        let resync = Duration::from_secs(60);
        let saved = Observed {
            running: false,
            addresses: vec![],
            addresses_from_guest: false,
            guest: guest::GuestSight::NotRunning,
            standby: standby::StandbySight::Saved,
            host_keys: None,
            attestation_key: None,
            access: None,
            handover: None,
        };
        // A GuestReady still settling when it was saved (a pool that does not wait for it).
        let mut status = LibvirtMachineStatus::default();
        conditions::set(
            &mut status.contract.conditions,
            conditions::new(
                types::GUEST_READY,
                status::UNKNOWN,
                reasons::AGENT_NOT_CONNECTED,
                "x",
                None,
            ),
            at(0),
        );
        let settling = look_again(
            <Context as Backend>::running(&saved),
            <Context as Backend>::conditions_of(&status),
            resync,
            at(4),
        );
        assert!(
            settling < resync,
            "the status is not saved yet: {settling:?}"
        );
        status.contract.standby = Some(Standby::Saved);
        assert_eq!(
            look_again(
                <Context as Backend>::running(&saved),
                <Context as Backend>::conditions_of(&status),
                resync,
                at(4),
            ),
            resync
        );
        // A domain on its way to running is still looked at soon.
        let starting = Observed {
            standby: standby::StandbySight::Running,
            ..saved
        };
        assert_eq!(
            look_again(<Context as Backend>::running(&starting), &[], resync, at(4),),
            Duration::from_secs(5)
        );
    }
}

//! The Provider's Ready condition and failure domains, written the same way by every backend's
//! workload (its probe) and by the operator (while the workload cannot): only when they
//! changed, with an Event when Ready's status or reason changed.

use banlieue_api::conditions::{self, Condition, status, types};
use banlieue_api::{FailureDomain, Provider, ProviderStatus};
use banlieue_runtime::reconcile;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::{EventType, Recorder};
use kube::{Resource, ResourceExt};
use serde_json::json;

/// Writes `ready` and `failure_domains` on the Provider's status when they differ from what it
/// holds, and records the transition as an Event when Ready's status or reason changed.
pub async fn publish(
    api: &Api<Provider>,
    recorder: &Recorder,
    provider: &Provider,
    ready: Condition,
    failure_domains: Vec<FailureDomain>,
) -> Result<(), kube::Error> {
    let old = provider.status.clone().unwrap_or_default();
    let previous = conditions::find(&old.conditions, types::READY).cloned();
    let mut new = ProviderStatus {
        conditions: old.conditions.clone(),
        failure_domains,
        observed_generation: provider.metadata.generation,
    };
    conditions::set(
        &mut new.conditions,
        ready.clone(),
        Time(k8s_openapi::jiff::Timestamp::now()),
    );
    if new == old {
        return Ok(());
    }
    api.patch_status(
        &provider.name_any(),
        &PatchParams::default(),
        &Patch::Merge(json!({ "status": new })),
    )
    .await?;
    let transitioned = previous
        .as_ref()
        .is_none_or(|p| p.status != ready.status || p.reason != ready.reason);
    if transitioned {
        record(recorder, provider, &ready).await;
    }
    Ok(())
}

/// Records a Ready transition as an Event on the Provider. An Event is a courtesy to the
/// reader; failing to record one changes nothing.
async fn record(recorder: &Recorder, provider: &Provider, ready: &Condition) {
    let type_ = if ready.status == status::TRUE {
        EventType::Normal
    } else {
        EventType::Warning
    };
    let event = reconcile::event(type_, &ready.reason, "Probe", ready.message.clone());
    reconcile::publish(recorder, &provider.object_ref(&()), &event).await;
}

/// What a backend's status loop does that is its own: reach the Provider's host (or vCenter)
/// with the Provider's credentials and narrow its declaration to what exists there
/// ([`crate::narrow`]). [`run`] does the rest the same way for every backend.
pub trait Probe: Send + Sync + 'static {
    /// The backend's error; [`Probe::reason`] says its condition reason.
    type Error: std::error::Error + Send + Sync + 'static;

    /// Probes the host of `provider`.
    fn probe(
        &self,
        kube: &kube::Client,
        provider: &Provider,
    ) -> impl std::future::Future<Output = Result<Reached, Self::Error>> + Send;
    /// The Ready reason of a failed probe.
    fn reason(error: &Self::Error) -> &'static str;
    /// Whether a failed probe is the spec's fault (an unsupported scheme): nothing changes until
    /// the spec does, so it is not probed again before.
    fn spec_error(error: &Self::Error) -> bool;
    /// The backend's error for a status write that failed.
    fn patch_failed(error: kube::Error) -> Self::Error;
}

/// What a probe that reached its host publishes.
#[derive(Clone, Debug, PartialEq)]
pub struct Reached {
    /// Ready: Connected, or CapabilitiesIncomplete naming what is absent.
    pub ready: Condition,
    /// The failure domains that exist, narrowed to the declared classes they have.
    pub failure_domains: Vec<FailureDomain>,
}

/// Settings of one Provider's status loop.
#[derive(Clone, Debug)]
pub struct LoopSettings {
    pub provider: String,
    pub namespace: String,
    /// How often the host is probed again when nothing changed.
    pub probe_interval: std::time::Duration,
    /// The Event reporter of the status writes.
    pub reporter: &'static str,
}

/// The Ready condition and failure domains a probe's outcome publishes. A host that was not
/// reached publishes no failure domain: a Provider never advertises a host it cannot reach.
pub fn decide<P: Probe>(
    outcome: &Result<Reached, P::Error>,
    generation: Option<i64>,
) -> (Condition, Vec<FailureDomain>) {
    match outcome {
        Ok(reached) => (reached.ready.clone(), reached.failure_domains.clone()),
        Err(e) => (
            conditions::new(
                types::READY,
                status::FALSE,
                P::reason(e),
                conditions::error_message(e),
                generation,
            ),
            Vec::new(),
        ),
    }
}

struct LoopContext<P> {
    probe: P,
    kube: kube::Client,
    api: Api<Provider>,
    settings: LoopSettings,
    recorder: Recorder,
    backoff: crate::ErrorBackoff,
}

/// This loop's name in its backoff keys.
const BACKOFF_KEY: &str = "status";

/// Probes the Provider's host and publishes its Ready condition and failure domains until
/// `shutdown` completes. It watches only its own Provider, by name, which is all a provider's
/// Role lets it read; a failing write is retried on the provider backoff.
pub async fn run<P: Probe>(
    probe: P,
    client: kube::Client,
    settings: LoopSettings,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    use futures::StreamExt;
    use kube::runtime::controller::Controller;
    use kube::runtime::events::Reporter;
    use kube::runtime::watcher;

    let api: Api<Provider> = Api::namespaced(client.clone(), &settings.namespace);
    let watch = watcher::Config::default().fields(&format!("metadata.name={}", settings.provider));
    let ctx = std::sync::Arc::new(LoopContext {
        probe,
        kube: client.clone(),
        api: api.clone(),
        recorder: Recorder::new(
            client,
            Reporter {
                controller: settings.reporter.into(),
                instance: None,
            },
        ),
        settings,
        backoff: crate::error_backoff(),
    });
    Controller::new(api, watch)
        .graceful_shutdown_on(shutdown)
        .run(
            |provider, ctx| async move {
                let key = crate::ErrorBackoff::key_of(BACKOFF_KEY, provider.as_ref());
                ctx.backoff.track(&key, probe_once(&provider, &ctx).await)
            },
            |provider, error: &P::Error, ctx| {
                let delay = ctx
                    .backoff
                    .failed(&crate::ErrorBackoff::key_of(BACKOFF_KEY, provider.as_ref()));
                tracing::warn!(
                    error = %conditions::error_message(error),
                    retry_in = ?delay,
                    "provider status failed"
                );
                kube::runtime::controller::Action::requeue(delay)
            },
            ctx,
        )
        .for_each(|result| async move {
            if let Err(e) = result {
                tracing::debug!(error = %conditions::error_message(&e), "provider status");
            }
        })
        .await;
}

#[tracing::instrument(skip_all, fields(provider = %provider.name_any()))]
async fn probe_once<P: Probe>(
    provider: &Provider,
    ctx: &LoopContext<P>,
) -> Result<kube::runtime::controller::Action, P::Error> {
    use kube::runtime::controller::Action;
    // A Provider being deleted is the operator's to report on (MachinesRemain); the machines
    // keep being torn down meanwhile.
    if provider.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let outcome = ctx.probe.probe(&ctx.kube, provider).await;
    let (ready, failure_domains) = decide::<P>(&outcome, provider.metadata.generation);
    publish(&ctx.api, &ctx.recorder, provider, ready, failure_domains)
        .await
        .map_err(P::patch_failed)?;
    Ok(match outcome {
        Err(e) if P::spec_error(&e) => Action::await_change(),
        _ => Action::requeue(ctx.settings.probe_interval),
    })
}

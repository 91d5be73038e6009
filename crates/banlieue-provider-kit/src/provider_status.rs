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

//! The VirtualMachinePool reconciler: observe the members in the cache, decide with
//! `pool::decide`, create and delete members, write the status.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use banlieue_api::conditions::{reasons, status};
use banlieue_api::names;
use banlieue_api::{
    ClaimPhase, VMImage, VirtualMachine, VirtualMachinePool, VirtualMachinePoolStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, PostParams, Preconditions};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;

use super::decide::{self, PoolPlan, PoolSnapshot};
use crate::context::{Context, cached, namespace_of, uid_of};
use crate::error::{Result, is_conflict, is_not_found};
use crate::member::{self, MemberView, is_unclaimed_member};
use crate::metrics::{PhaseLabels, PoolLabels};
use crate::revision::pool_revision;
use crate::scheduling::{controller_owner_reference, image_revision};

pub(crate) async fn reconcile(pool: Arc<VirtualMachinePool>, ctx: Arc<Context>) -> Result<Action> {
    ctx.readiness.wait().await?;
    let namespace = namespace_of(pool.as_ref(), "VirtualMachinePool")?;
    let name = pool.name_any();
    let labels = PoolLabels {
        namespace: namespace.clone(),
        pool: name.clone(),
    };
    if pool.metadata.deletion_timestamp.is_some() {
        // The garbage collector removes the members the pool still owns; bound members were
        // re-parented to their claims and stay.
        for family in [
            &ctx.metrics.pool_warm,
            &ctx.metrics.pool_claimed,
            &ctx.metrics.pool_filling,
        ] {
            family.remove(&labels);
        }
        return Ok(Action::await_change());
    }
    let pool_key = format!("{namespace}/{name}");
    let observed = observe(&pool, &ctx, &namespace, &pool_key).await?;
    let plan = decide::decide(&observed.snapshot);

    record_startup_failures(&ctx, &pool, &pool_key, &plan).await;
    let vms = ctx.api::<VirtualMachine>(&namespace);
    for _ in 0..plan.creates {
        let member = new_member(&pool, &observed.revision)?;
        let created = vms.create(&PostParams::default(), &member).await?;
        let member_name = created.name_any();
        ctx.expectations.created(&pool_key, &member_name);
        ctx.routine_event(
            pool.as_ref(),
            "MemberCreated",
            format!(
                "created member {member_name} (revision {})",
                observed.revision
            ),
        )
        .await;
    }
    for member_name in &plan.deletes {
        reap(&ctx, &pool, &namespace, &observed.members, member_name).await?;
    }

    let current = pool.status.clone().unwrap_or_default();
    let next = decide::next_status(
        &pool,
        &current,
        &plan,
        observed.snapshot.claimed,
        &observed.revision,
        ctx.startup_failures.streak(&pool_key).as_ref(),
        Time(Timestamp::now()),
    );
    let status_pending = write_status(&ctx, &pool, &pool_key, &current, &next, &plan).await?;
    record_metrics(&ctx, &labels, &plan, &observed.snapshot);

    let wait = plan
        .revisit_after
        .into_iter()
        .chain(status_pending)
        .chain(observed.hosts_change)
        .fold(ctx.config.resync, Duration::min);
    Ok(Action::requeue(wait))
}

/// The names of the VirtualMachines of `namespace` the cache holds, in any state. A create
/// counts as seen once its member is here at all: a member a waiting claim bound before the
/// pool's first look at it is no longer an unclaimed member, and counting only those kept it
/// pending until its expectation timed out, so a drained pool refilled that many fewer.
fn names_in_cache<'a>(cached: &'a [Arc<VirtualMachine>], namespace: &str) -> BTreeSet<&'a str> {
    cached
        .iter()
        .filter(|vm| vm.metadata.namespace.as_deref() == Some(namespace))
        .filter_map(|vm| vm.metadata.name.as_deref())
        .collect()
}

/// What the pool's decision is made from, read from the caches (and the image once from the
/// API server when the cache has not seen it yet).
struct Observed {
    snapshot: PoolSnapshot,
    /// The unclaimed members, for deletes guarded by their resourceVersion.
    members: Vec<Arc<VirtualMachine>>,
    /// The revision new members are made at.
    revision: String,
    /// When a Provider's host state next changes by itself (a lost host's grace ending).
    hosts_change: Option<Duration>,
}

async fn observe(
    pool: &VirtualMachinePool,
    ctx: &Context,
    namespace: &str,
    pool_key: &str,
) -> Result<Observed> {
    let name = pool.name_any();
    let uid = uid_of(pool, "VirtualMachinePool")?;
    let image = match cached(
        &ctx.stores.images,
        namespace,
        &pool.spec.template.spec.image_ref.name,
    ) {
        Some(image) => Some(image),
        // Not in the cache: created together with the pool and not seen yet, or absent. Read
        // once, so the first members are not made at a revision that changes when the cache
        // catches up (and then replaced).
        None => Api::<VMImage>::namespaced(ctx.client.clone(), namespace)
            .get_opt(&pool.spec.template.spec.image_ref.name)
            .await?
            .map(Arc::new),
    };
    let revision = pool_revision(pool, image.as_deref().and_then(image_revision).as_deref());

    let cached = ctx.stores.vms.state();
    let members: Vec<Arc<VirtualMachine>> = cached
        .iter()
        .filter(|vm| {
            vm.metadata.namespace.as_deref() == Some(namespace)
                && is_unclaimed_member(vm, &name, &uid)
        })
        .cloned()
        .collect();
    let hosts = ctx.host_states(namespace);
    let views: Vec<MemberView> = members
        .iter()
        .map(|vm| MemberView::of(vm, pool.spec.readiness).on_host(hosts.of(vm)))
        .collect();
    let seen = names_in_cache(&cached, namespace);
    let pending_creates = ctx
        .expectations
        .pending(pool_key, |member| seen.contains(member));
    let claimed = ctx
        .stores
        .claims
        .state()
        .iter()
        .filter(|c| {
            c.metadata.namespace.as_deref() == Some(namespace)
                && c.spec.pool_ref.name == name
                && c.status.as_ref().and_then(|s| s.phase) == Some(ClaimPhase::Bound)
        })
        .count() as i32;
    let snapshot = PoolSnapshot {
        replicas: pool.spec.replicas,
        max_surge: pool.spec.update_strategy.max_surge,
        update: pool.spec.update_strategy.type_,
        readiness: pool.spec.readiness,
        max_idle: pool
            .spec
            .max_idle_seconds
            .map(|s| Duration::from_secs(s.max(0) as u64)),
        current_revision: revision.clone(),
        members: views,
        pending_creates,
        reserved: ctx.reservations.held_in(namespace).into_iter().collect(),
        claimed,
        readiness_signal_grace: ctx.config.readiness_signal_grace,
        startup_deadline: pool
            .spec
            .startup_deadline_seconds
            .map(|s| Duration::from_secs(s.max(1) as u64)),
        max_provisioning: pool.spec.max_provisioning.map(|n| n.max(1) as usize),
        creates_not_before: ctx.startup_failures.creates_not_before(pool_key),
        standby_not_supported_by: standby_not_supported_by(pool, &members, ctx),
        now: Timestamp::now(),
    };
    Ok(Observed {
        snapshot,
        members,
        revision,
        hosts_change: hosts.next_change,
    })
}

/// Starts or extends the pool's streak of members that did not start in time (and says so),
/// or ends it once the pool is back at capacity.
async fn record_startup_failures(
    ctx: &Context,
    pool: &VirtualMachinePool,
    pool_key: &str,
    plan: &PoolPlan,
) {
    if !plan.startup_failures.is_empty() {
        ctx.startup_failures
            .failed(pool_key, &plan.startup_failures, Timestamp::now());
        ctx.event(
            pool,
            EventType::Warning,
            reasons::STARTUP_DEADLINE_EXCEEDED,
            format!(
                "not available within {} s, replacing: {}",
                pool.spec.startup_deadline_seconds.unwrap_or_default(),
                plan.startup_failures.join(", ")
            ),
        )
        .await;
    } else if plan.ready.status == status::TRUE {
        // Back at capacity: the streak of startup failures is over.
        ctx.startup_failures.recovered(pool_key);
    }
}

/// Writes `next` unless it equals `current` or a count-only change waits for its window
/// (returned: when to look again), with an Event when the Ready reason changed.
async fn write_status(
    ctx: &Context,
    pool: &VirtualMachinePool,
    pool_key: &str,
    current: &VirtualMachinePoolStatus,
    next: &VirtualMachinePoolStatus,
    plan: &PoolPlan,
) -> Result<Option<Duration>> {
    if next == current {
        return Ok(None);
    }
    let pending = decide::status_write_delay(
        current,
        next,
        ctx.status_writes.since_last(pool_key, Instant::now()),
    );
    if pending.is_some() {
        return Ok(pending);
    }
    let (before, after) = (decide::ready_of(current), decide::ready_of(next));
    let namespace = namespace_of(pool, "VirtualMachinePool")?;
    ctx.patch_status(
        &ctx.api::<VirtualMachinePool>(&namespace),
        &pool.name_any(),
        next,
    )
    .await?;
    ctx.status_writes.wrote(pool_key, Instant::now());
    let back_at_capacity = decide::is_refill(after.as_ref(), before.as_ref());
    if decide::is_refill(before.as_ref(), after.as_ref()) || back_at_capacity {
        // A refill behind a claim: routine, summarised once per window, never a Warning.
        ctx.routine_event(pool, plan.ready.reason, plan.ready.message.clone())
            .await;
    } else if before.map(|(_, reason)| reason).as_deref() != Some(plan.ready.reason) {
        let kind = if plan.ready.status != status::TRUE {
            EventType::Warning
        } else {
            EventType::Normal
        };
        ctx.event(pool, kind, plan.ready.reason, plan.ready.message.clone())
            .await;
    }
    Ok(None)
}

/// The pool's gauges: warm, claimed and filling members, and members by phase.
fn record_metrics(ctx: &Context, labels: &PoolLabels, plan: &PoolPlan, snapshot: &PoolSnapshot) {
    ctx.metrics
        .pool_warm
        .get_or_create(labels)
        .set(plan.available_replicas.into());
    ctx.metrics
        .pool_claimed
        .get_or_create(labels)
        .set(snapshot.claimed.into());
    ctx.metrics
        .pool_filling
        .get_or_create(labels)
        .set((plan.replicas - plan.available_replicas).max(0).into());
    let mut by_phase: BTreeMap<&'static str, i64> =
        member::PHASES.iter().map(|p| (*p, 0)).collect();
    for view in &snapshot.members {
        *by_phase.entry(view.phase()).or_default() += 1;
    }
    by_phase.insert(member::PHASE_CLAIMED, snapshot.claimed.into());
    for (phase, count) in by_phase {
        ctx.metrics
            .pool_members
            .get_or_create(&PhaseLabels {
                namespace: labels.namespace.clone(),
                pool: labels.pool.clone(),
                phase,
            })
            .set(count);
    }
}

/// Deletes an unclaimed member, unless a claim is binding it. The delete carries the member's
/// resourceVersion, so a bind that landed first makes it fail: the bind is the race winner.
async fn reap(
    ctx: &Context,
    pool: &VirtualMachinePool,
    namespace: &str,
    members: &[Arc<VirtualMachine>],
    member_name: &str,
) -> Result<()> {
    let Some(member) = members.iter().find(|m| m.name_any() == member_name) else {
        return Ok(());
    };
    let Some(held) = ctx.reservations.try_reap(namespace, member_name) else {
        return Ok(());
    };
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            resource_version: member.metadata.resource_version.clone(),
            uid: member.metadata.uid.clone(),
        }),
        ..DeleteParams::default()
    };
    let result = ctx
        .api::<VirtualMachine>(namespace)
        .delete(member_name, &params)
        .await;
    drop(held);
    match result {
        Ok(_) => {
            ctx.routine_event(
                pool,
                "MemberDeleted",
                format!("deleted unclaimed member {member_name}"),
            )
            .await;
            Ok(())
        }
        // Changed since the cache saw it (perhaps bound) or already gone: look again later.
        Err(error) if is_conflict(&error) || is_not_found(&error) => Ok(()),
        Err(error) => Err(error.into()),
    }
}

/// The kind of a member's machine that cannot be saved, when the pool asks for `standby:
/// Saved` (ADR-0073).
fn standby_not_supported_by(
    pool: &VirtualMachinePool,
    members: &[Arc<VirtualMachine>],
    ctx: &Context,
) -> Option<String> {
    if pool.spec.standby != Some(banlieue_api::Standby::Saved) {
        return None;
    }
    members
        .iter()
        .filter_map(|vm| vm.status.as_ref()?.machine_ref.as_ref())
        .find(|reference| {
            ctx.config
                .machine_backends
                .of_reference(reference)
                .is_some_and(|backend| !backend.saves)
        })
        .map(|reference| reference.kind.clone())
}

/// A new member: the template, labelled with the pool and its revision, controlled by the pool,
/// already holding the machine-protection finalizer.
fn new_member(pool: &VirtualMachinePool, revision: &str) -> Result<VirtualMachine> {
    let name = pool.name_any();
    let template = crate::revision::member_template(pool);
    // The CRD refuses reserved keys in a template, but a pool stored before that rule may still
    // carry one; `banlieue.io/claim` copied here would make the member unclaimable.
    let mut labels = without_reserved_keys(&template.metadata.labels);
    let annotations = without_reserved_keys(&template.metadata.annotations);
    labels.insert(names::LABEL_POOL.to_owned(), name.clone());
    labels.insert(names::LABEL_POOL_REVISION.to_owned(), revision.to_owned());
    let owner = controller_owner_reference(pool).ok_or_else(|| crate::Error::NoUid {
        kind: "VirtualMachinePool",
        name: name.clone(),
    })?;
    Ok(VirtualMachine {
        metadata: ObjectMeta {
            generate_name: Some(format!("{name}-")),
            namespace: pool.metadata.namespace.clone(),
            labels: Some(labels),
            annotations: (!annotations.is_empty()).then_some(annotations),
            owner_references: Some(vec![owner]),
            finalizers: Some(vec![names::FINALIZER_MACHINE_PROTECTION.to_owned()]),
            ..ObjectMeta::default()
        },
        spec: template.spec,
        status: None,
    })
}

fn without_reserved_keys(map: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    map.iter()
        .filter(|(key, _)| !names::is_reserved_key(key))
        .map(|(key, value)| (key.clone(), value.clone()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_reserved_claim_label_in_a_stored_template_is_not_copied_onto_members() {
        let pool: VirtualMachinePool = serde_json::from_value(json!({
            "apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachinePool",
            "metadata": { "name": "p", "namespace": "ns", "uid": "u-1" },
            "spec": {
                "replicas": 1,
                "updateStrategy": { "type": "Replace" },
                "template": {
                    "metadata": {
                        "labels": { "banlieue.io/claim": "someone", "team": "a" },
                        "annotations": { "banlieue.io/subject-id": "mallory" }
                    },
                    "spec": { "classRef": { "name": "c" }, "imageRef": { "name": "i" },
                              "storageClassName": "s", "networkClassName": "n" }
                }
            }
        }))
        .expect("pool");
        let member = new_member(&pool, "rev1").expect("member");
        let labels = member.metadata.labels.expect("labels");
        assert!(!labels.contains_key(names::LABEL_CLAIM), "{labels:?}");
        assert_eq!(labels.get("team").map(String::as_str), Some("a"));
        assert_eq!(labels.get(names::LABEL_POOL).map(String::as_str), Some("p"));
        assert_eq!(member.metadata.annotations, None);
    }

    #[test]
    fn a_create_counts_as_seen_once_cached_even_if_already_bound_or_elsewhere() {
        let vm = |namespace: &str, name: &str, labels: serde_json::Value| {
            Arc::new(
                serde_json::from_value::<VirtualMachine>(json!({
                    "apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachine",
                    "metadata": { "name": name, "namespace": namespace, "labels": labels },
                    "spec": { "classRef": { "name": "c" }, "imageRef": { "name": "i" },
                              "storageClassName": "s", "networkClassName": "n" }
                }))
                .expect("vm"),
            )
        };
        let cached = vec![
            vm("ns", "p-warm", json!({ names::LABEL_POOL: "p" })),
            // Bound by a waiting claim before the pool looked: no pool label any more.
            vm("ns", "p-bound", json!({ names::LABEL_CLAIM: "c1" })),
            vm("other", "p-elsewhere", json!({ names::LABEL_POOL: "p" })),
        ];
        let seen = names_in_cache(&cached, "ns");
        assert_eq!(seen, BTreeSet::from(["p-bound", "p-warm"]));

        let expectations = crate::expectations::Expectations::default();
        for member in ["p-warm", "p-bound", "p-not-yet"] {
            expectations.created("ns/p", member);
        }
        assert_eq!(expectations.pending("ns/p", |m| seen.contains(m)), 1);
    }
}

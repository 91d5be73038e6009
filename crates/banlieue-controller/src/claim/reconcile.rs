//! The VirtualMachineClaim reconciler: bind a member once, mirror it, release it by deletion.
//!
//! The bind is one JSON merge patch on the member carrying its resourceVersion (ADR-0057). The
//! controller can only patch claims; it never creates or updates one.

use std::sync::Arc;
use std::time::{Duration, Instant};

use banlieue_api::conditions::{self, reasons, status, types};
use banlieue_api::names;
use banlieue_api::{
    ClaimPhase, LocalObjectReference, VirtualMachine, VirtualMachineClaim,
    VirtualMachineClaimStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, Preconditions};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use serde_json::json;

use super::decide;
use crate::context::{Context, cached, namespace_of, uid_of};
use crate::crash::{CrashPoint, crash_at};
use crate::error::{Result, is_conflict, is_not_found};
use crate::member::{MemberView, is_bound_to, is_unclaimed_member};
use crate::metrics::BindLabels;
use crate::revision::pool_revision;
use crate::scheduling::{controller_owner_reference, image_revision};

/// How often a releasing claim looks at its member again, in case the delete event is missed.
const RELEASE_POLL: Duration = Duration::from_secs(2);
/// Picks per reconcile before giving the other claims a turn.
const MAX_BIND_ATTEMPTS: usize = 8;

/// Writes the claim's status and remembers the write until the cache shows it.
async fn write_status(
    this: &ClaimRef<'_>,
    ctx: &Context,
    next: &VirtualMachineClaimStatus,
) -> Result<()> {
    let written = ctx.patch_status(&this.api, &this.name, next).await?;
    ctx.claim_writes.wrote(this.claim, written);
    Ok(())
}

/// A waiting claim looks again at the resync, or sooner when a write waits for its window.
fn requeue_waiting(ctx: &Context, delay: Option<Duration>) -> Action {
    Action::requeue(delay.map_or(ctx.config.resync, |d| d.min(ctx.config.resync)))
}

/// One claim, as the reconciler handles it.
struct ClaimRef<'a> {
    claim: &'a VirtualMachineClaim,
    namespace: String,
    name: String,
    uid: String,
    api: Api<VirtualMachineClaim>,
}

pub(crate) async fn reconcile(
    claim: Arc<VirtualMachineClaim>,
    ctx: Arc<Context>,
) -> Result<Action> {
    ctx.readiness.wait().await?;
    // A claim whose Bound status this process wrote but the cache does not show yet (the
    // member's bind reached the cache first and woke it) must not be bound, or written, again.
    let claim = ctx.claim_writes.freshest(claim);
    let namespace = namespace_of(claim.as_ref(), "VirtualMachineClaim")?;
    let api: Api<VirtualMachineClaim> = ctx.api(&namespace);
    let claim = if claim.metadata.deletion_timestamp.is_none()
        && !claim
            .finalizers()
            .iter()
            .any(|f| f == names::FINALIZER_CLAIM_PROTECTION)
    {
        // Go on with the object the patch returned: waiting for the watch to bring it back
        // would add a round trip to every bind.
        Arc::new(
            ctx.add_finalizer(&api, claim.as_ref(), names::FINALIZER_CLAIM_PROTECTION)
                .await?,
        )
    } else {
        claim
    };
    let this = ClaimRef {
        claim: claim.as_ref(),
        name: claim.name_any(),
        uid: uid_of(claim.as_ref(), "VirtualMachineClaim")?,
        api,
        namespace,
    };
    if claim.metadata.deletion_timestamp.is_some() {
        return release(&this, &ctx, true).await;
    }
    let status = claim.status.clone().unwrap_or_default();
    match status.phase {
        Some(ClaimPhase::Failed) => Ok(Action::await_change()),
        Some(ClaimPhase::Releasing) => release(&this, &ctx, false).await,
        Some(ClaimPhase::Bound) => bound(&this, &ctx, &status).await,
        Some(ClaimPhase::Pending) | None => pending(&this, &ctx, &status).await,
    }
}

/// A Pending claim: complete a bind committed earlier, or pick a member and bind it.
async fn pending(
    this: &ClaimRef<'_>,
    ctx: &Context,
    status: &VirtualMachineClaimStatus,
) -> Result<Action> {
    if let Some(member) = committed_member(this, ctx).await? {
        return complete_bind(this, ctx, status, &member).await;
    }
    let Some(pool) = cached(
        &ctx.stores.pools,
        &this.namespace,
        &this.claim.spec.pool_ref.name,
    ) else {
        let pool_name = &this.claim.spec.pool_ref.name;
        let delay = write_pending(
            this,
            ctx,
            status,
            reasons::POOL_NOT_FOUND,
            decide::pool_not_found_message(pool_name),
        )
        .await?;
        return Ok(requeue_waiting(ctx, delay));
    };
    let pool_name = pool.name_any();
    let pool_uid = uid_of(pool.as_ref(), "VirtualMachinePool")?;
    if let Some(max) = pool.spec.max_claims_per_subject {
        let claims = ctx.stores.claims.state();
        let ahead = decide::subject_claims_ahead(this.claim, claims.iter().map(AsRef::as_ref));
        if ahead >= usize::try_from(max).unwrap_or(0) {
            let delay = write_pending(
                this,
                ctx,
                status,
                reasons::SUBJECT_LIMIT_REACHED,
                decide::subject_limit_message(this.claim, ahead, max),
            )
            .await?;
            return Ok(requeue_waiting(ctx, delay));
        }
    }
    let image = cached(
        &ctx.stores.images,
        &this.namespace,
        &pool.spec.template.spec.image_ref.name,
    );
    let revision = pool_revision(&pool, image.as_deref().and_then(image_revision).as_deref());
    let vms = ctx.api::<VirtualMachine>(&this.namespace);

    let mut members: Vec<VirtualMachine> = cached_vms(ctx, &this.namespace, |vm| {
        is_unclaimed_member(vm, &pool_name, &pool_uid)
    })
    .collect();
    let hosts = ctx.host_states(&this.namespace);
    for _ in 0..MAX_BIND_ATTEMPTS {
        let views: Vec<MemberView> = members
            .iter()
            .map(|vm| MemberView::of(vm, pool.spec.readiness).on_host(hosts.of(vm)))
            .collect();
        let candidates = decide::candidates(&views, &revision, |member| {
            ctx.reservations.is_held(&this.namespace, member)
        });
        let Some((chosen, held)) = candidates.into_iter().find_map(|m| {
            let held = ctx.reservations.try_bind(&this.namespace, &m.name)?;
            Some((m, held))
        }) else {
            let delay = write_pending(
                this,
                ctx,
                status,
                reasons::NO_MEMBER_AVAILABLE,
                decide::no_member_message_of(&pool, &views),
            )
            .await?;
            return Ok(requeue_waiting(ctx, delay));
        };
        let member_name = chosen.name.clone();
        match bind_patch(this, &vms, &member_name, chosen.resource_version.as_deref()).await {
            Ok(member) => {
                held.bound();
                ctx.assign(&this.uid, &member_name);
                crash_at(CrashPoint::AfterMemberPatch);
                return complete_bind(this, ctx, status, &member).await;
            }
            Err(error) if is_conflict(&error) || is_not_found(&error) => {
                if is_conflict(&error) {
                    ctx.metrics.bind_conflicts.inc();
                }
                drop(held);
                tracing::debug!(claim = %this.name, member = %member_name, "bind lost a race; re-reading the pool");
                // The cache is what was stale: ask the API server, which cannot disagree with
                // itself.
                if let Some(member) = bound_member_from_api(this, &vms).await? {
                    return complete_bind(this, ctx, status, &member).await;
                }
                let selector = format!("{}={pool_name}", names::LABEL_POOL);
                members = vms
                    .list(&ListParams::default().labels(&selector))
                    .await?
                    .items
                    .into_iter()
                    .filter(|vm| is_unclaimed_member(vm, &pool_name, &pool_uid))
                    .collect();
            }
            Err(error) => {
                drop(held);
                // Neither a conflict nor a refusal: the patch may have been applied with the
                // answer lost (an API server restarting, a connection reset). Remembered as
                // this claim's member, so the next reconcile reads that member from the API
                // server first ([`committed_member`]) and completes the bind if it took,
                // instead of binding a second member to the claim.
                ctx.assign(&this.uid, &member_name);
                ctx.metrics.bind_outcomes_unknown.inc();
                return Err(error.into());
            }
        }
    }
    // Every attempt lost a race: try again soon, with whatever the cache shows then.
    Ok(Action::requeue(Duration::from_millis(50)))
}

async fn bind_patch(
    this: &ClaimRef<'_>,
    vms: &Api<VirtualMachine>,
    member: &str,
    resource_version: Option<&str>,
) -> Result<VirtualMachine, kube::Error> {
    bind_member(vms, this.claim, member, resource_version).await
}

/// The one write that binds `member` to `claim`: claim label set, pool label removed, owner
/// moved from the pool to the claim, subject and bind time recorded, all conditional on the
/// resourceVersion the member was chosen at. A 409 means someone wrote the member since.
pub async fn bind_member(
    vms: &Api<VirtualMachine>,
    claim: &VirtualMachineClaim,
    member: &str,
    resource_version: Option<&str>,
) -> Result<VirtualMachine, kube::Error> {
    let owner = controller_owner_reference(claim);
    // Whole seconds: the status's boundAt is a metav1.Time, which keeps no fraction, and the
    // annotation must be the same instant so a status completed after a crash agrees with it.
    let now =
        Timestamp::from_second(Timestamp::now().as_second()).unwrap_or_else(|_| Timestamp::now());
    let patch = json!({
        "metadata": {
            "resourceVersion": resource_version,
            "labels": {
                names::LABEL_CLAIM: claim.name_any(),
                names::LABEL_POOL: null,
            },
            "ownerReferences": [owner],
            "annotations": {
                names::ANNOTATION_SUBJECT_ISSUER: claim.spec.subject.issuer,
                names::ANNOTATION_SUBJECT_ID: claim.spec.subject.id,
                names::ANNOTATION_BOUND_AT: now.to_string(),
            },
        },
    });
    // The subject's keys travel with the bind, in the same write: the member's machine is
    // given them next, and the guest installs them (AccessReady). Only when there are keys:
    // in a merge patch, a `spec` of null would remove the member's whole spec.
    let mut patch = patch;
    if let Some(access) = &claim.spec.access {
        patch["spec"] = json!({ "access": access });
    }
    vms.patch(member, &PatchParams::default(), &Patch::Merge(&patch))
        .await
}

/// A member already bound to this claim: one this process bound, or one the cache shows.
async fn committed_member(this: &ClaimRef<'_>, ctx: &Context) -> Result<Option<VirtualMachine>> {
    if let Some(name) = ctx.assignment(&this.uid) {
        if let Some(vm) = cached(&ctx.stores.vms, &this.namespace, &name)
            .filter(|vm| is_bound_to(vm, &this.name, &this.uid))
        {
            return Ok(Some(vm.as_ref().clone()));
        }
        let vms = ctx.api::<VirtualMachine>(&this.namespace);
        match vms.get_opt(&name).await? {
            Some(vm) if is_bound_to(&vm, &this.name, &this.uid) => return Ok(Some(vm)),
            _ => ctx.forget_assignment(&this.uid),
        }
    }
    Ok(cached_vms(ctx, &this.namespace, |vm| {
        is_bound_to(vm, &this.name, &this.uid)
    })
    .next())
}

/// The cached VirtualMachines of `namespace` that satisfy `keep`.
fn cached_vms(
    ctx: &Context,
    namespace: &str,
    keep: impl Fn(&VirtualMachine) -> bool,
) -> impl Iterator<Item = VirtualMachine> {
    ctx.stores
        .vms
        .state()
        .into_iter()
        .filter(move |vm| vm.metadata.namespace.as_deref() == Some(namespace) && keep(vm))
        .map(|vm| vm.as_ref().clone())
}

async fn bound_member_from_api(
    this: &ClaimRef<'_>,
    vms: &Api<VirtualMachine>,
) -> Result<Option<VirtualMachine>> {
    Ok(claim_members(this, vms).await?.into_iter().next())
}

/// Members bound to this claim, from the API server.
async fn claim_members(
    this: &ClaimRef<'_>,
    vms: &Api<VirtualMachine>,
) -> Result<Vec<VirtualMachine>> {
    let selector = format!("{}={}", names::LABEL_CLAIM, this.name);
    Ok(vms
        .list(&ListParams::default().labels(&selector))
        .await?
        .items
        .into_iter()
        .filter(|vm| is_bound_to(vm, &this.name, &this.uid))
        .collect())
}

/// Writes the Bound status for `member`. boundAt comes from the member's annotation, so a
/// status completed after a crash still tells the time of the bind and the TTL is not
/// extended.
async fn complete_bind(
    this: &ClaimRef<'_>,
    ctx: &Context,
    status: &VirtualMachineClaimStatus,
    member: &VirtualMachine,
) -> Result<Action> {
    let member_name = member.name_any();
    let bound_at = member
        .annotations()
        .get(names::ANNOTATION_BOUND_AT)
        .and_then(|t| t.parse::<Timestamp>().ok())
        .unwrap_or_else(Timestamp::now);
    let expires_at = decide::expires_at(bound_at, this.claim.spec.ttl_seconds);
    let mut next = status.clone();
    next.phase = decide::advance(status.phase, ClaimPhase::Bound);
    if next.phase != Some(ClaimPhase::Bound) {
        return Ok(Action::await_change());
    }
    next.virtual_machine_ref = Some(LocalObjectReference::new(&member_name));
    next.bound_at = Some(Time(bound_at));
    next.expires_at = Some(Time(expires_at));
    mirror_member(&mut next, member, this.claim);
    conditions::set(
        &mut next.conditions,
        conditions::new(
            types::BOUND,
            status::TRUE,
            reasons::BOUND,
            format!("bound to member {member_name}"),
            this.claim.metadata.generation,
        ),
        Time(Timestamp::now()),
    );
    write_status(this, ctx, &next).await?;
    record_resume(this, ctx, status, &next);
    if let Some(created) = &this.claim.metadata.creation_timestamp {
        let latency = bound_at.duration_since(created.0);
        let labels = BindLabels {
            namespace: this.claim.namespace().unwrap_or_default(),
            pool: this.claim.spec.pool_ref.name.clone(),
            start: decide::start_of(status),
        };
        ctx.metrics.bound(labels, latency.as_secs_f64());
    }
    crash_at(CrashPoint::AfterClaimStatus);
    // No Event: the Bound condition says when and to which member, and on the path every claim
    // takes an Event is one more write per claim (Events are kept for what needs attention).
    Ok(Action::requeue(until(expires_at).min(ctx.config.resync)))
}

/// A Bound claim: fail if its member went away, release it at expiry, else mirror it.
/// Deletes members bound to this claim other than `member`, the one its status names. The
/// claim's user was never handed them; one can only come from a bind whose answer was lost
/// and whose member was not found again before another was bound. Read from the cache: a
/// member the cache does not show yet is found on a later pass.
async fn delete_extra_members(
    this: &ClaimRef<'_>,
    ctx: &Context,
    vms: &Api<VirtualMachine>,
    member: &str,
) -> Result<()> {
    let extra: Vec<VirtualMachine> = cached_vms(ctx, &this.namespace, |vm| {
        vm.metadata.deletion_timestamp.is_none()
            && vm.name_any() != member
            && is_bound_to(vm, &this.name, &this.uid)
    })
    .collect();
    for vm in extra {
        let name = vm.name_any();
        tracing::warn!(claim = %this.name, member = %name, "a second member bound to the claim; deleting it");
        // Only the version the cache showed: a member's finalizer keeps it after the delete, and
        // a pass that runs before the cache shows the deletion must not delete (and count) it twice.
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: vm.metadata.uid.clone(),
                resource_version: vm.metadata.resource_version.clone(),
            }),
            ..DeleteParams::default()
        };
        match vms.delete(&name, &params).await {
            Ok(_) => {
                ctx.metrics.extra_members_deleted.inc();
            }
            // Changed since the cache saw it: a later pass looks again.
            Err(error) if is_not_found(&error) || is_conflict(&error) => {}
            Err(error) => return Err(error.into()),
        }
    }
    Ok(())
}

async fn bound(
    this: &ClaimRef<'_>,
    ctx: &Context,
    status: &VirtualMachineClaimStatus,
) -> Result<Action> {
    let vms = ctx.api::<VirtualMachine>(&this.namespace);
    let member_name = status
        .virtual_machine_ref
        .as_ref()
        .map(|r| r.name.clone())
        .unwrap_or_default();
    let member = match cached(&ctx.stores.vms, &this.namespace, &member_name)
        .filter(|vm| is_bound_to(vm, &this.name, &this.uid))
    {
        Some(vm) => Some(vm.as_ref().clone()),
        // Absent from the cache, or not yet showing the bind: only the API server can say.
        None => vms
            .get_opt(&member_name)
            .await?
            .filter(|vm| is_bound_to(vm, &this.name, &this.uid)),
    };
    let expires_at = status.expires_at.as_ref().map(|t| t.0);
    let expired = expires_at.is_some_and(|t| Timestamp::now() >= t);
    if expired {
        let message = format!(
            "expired at {}; the member is deleted, then the claim",
            expires_at.map(|t| t.to_string()).unwrap_or_default()
        );
        enter_releasing(this, ctx, status, reasons::EXPIRED, message).await?;
        return release_member(this, ctx, false).await;
    }
    match member {
        Some(member) if member.metadata.deletion_timestamp.is_none() => {
            delete_extra_members(this, ctx, &vms, &member_name).await?;
            relay_handover(this.claim, &member, &vms).await?;
            let mut next = status.clone();
            mirror_member(&mut next, &member, this.claim);
            if next != *status {
                write_status(this, ctx, &next).await?;
                record_resume(this, ctx, status, &next);
            }
            let wait = expires_at.map_or(ctx.config.resync, until);
            Ok(Action::requeue(wait.min(ctx.config.resync)))
        }
        _ => {
            let mut next = status.clone();
            next.phase = decide::advance(status.phase, ClaimPhase::Failed);
            next.addresses.clear();
            let message = format!(
                "member {member_name} was deleted out from under the claim; a Failed claim is never rebound"
            );
            conditions::set(
                &mut next.conditions,
                conditions::new(
                    types::BOUND,
                    status::FALSE,
                    reasons::MEMBER_DELETED,
                    message.clone(),
                    this.claim.metadata.generation,
                ),
                Time(Timestamp::now()),
            );
            write_status(this, ctx, &next).await?;
            ctx.forget_assignment(&this.uid);
            ctx.event(
                this.claim,
                EventType::Warning,
                reasons::MEMBER_DELETED,
                message,
            )
            .await;
            Ok(Action::await_change())
        }
    }
}

/// Copies the subject's latest challenge to its member (ADR-0077), which hands it to its
/// machine: a subject may write a new one whenever it verifies. Relayed as written; the
/// controller checks nothing in it, since nothing it could check would make it trusted.
async fn relay_handover(
    claim: &VirtualMachineClaim,
    member: &VirtualMachine,
    vms: &Api<VirtualMachine>,
) -> Result<()> {
    let Some(challenge) = decide::handover_to_relay(claim, member) else {
        return Ok(());
    };
    let patch = json!({ "spec": { "handover": challenge.merge_patch_value() } });
    vms.patch(
        &member.name_any(),
        &PatchParams::default(),
        &Patch::Merge(&patch),
    )
    .await?;
    Ok(())
}

/// Records the resume latency when `next` is the first status to say `Resumed=True`.
fn record_resume(
    this: &ClaimRef<'_>,
    ctx: &Context,
    before: &VirtualMachineClaimStatus,
    next: &VirtualMachineClaimStatus,
) {
    let resumed =
        |s: &VirtualMachineClaimStatus| conditions::is_true(&s.conditions, types::RESUMED);
    if resumed(before) || !resumed(next) {
        return;
    }
    if let Some(bound_at) = &next.bound_at {
        let latency = Timestamp::now().duration_since(bound_at.0);
        ctx.metrics.resumed(
            crate::metrics::PoolLabels {
                namespace: this.namespace.clone(),
                pool: this.claim.spec.pool_ref.name.clone(),
            },
            latency.as_secs_f64(),
        );
    }
}

/// Copies what a consumer reads from the member: its addresses, EK certificates, SSH host
/// keys and attestation (relayed as is: the subject checks it), for a claim with `spec.access` whether its keys are installed, and for a member of a
/// `standby: Saved` pool whether it runs again (ADR-0073).
fn mirror_member(
    next: &mut VirtualMachineClaimStatus,
    member: &VirtualMachine,
    claim: &VirtualMachineClaim,
) {
    let generation = claim.metadata.generation;
    let member_status = member.status.clone().unwrap_or_default();
    next.addresses = member_status.addresses.clone();
    next.tpm_endorsement_certificates = member_status.tpm_endorsement_certificates.clone();
    next.tpm_endorsement_key_digests = member_status.tpm_endorsement_key_digests.clone();
    next.ssh_host_keys = member_status.ssh_host_keys.clone();
    next.attestation = member_status.attestation.clone();
    if let Some(access) = decide::access_ready(claim, member) {
        next.login_user = member_status.login_user.clone();
        conditions::set(&mut next.conditions, access, Time(Timestamp::now()));
    }
    if let Some(resumed) = decide::resumed(member, generation) {
        // Addresses of a machine that does not run yet are not an address to connect to.
        if resumed.status != status::TRUE {
            next.addresses.clear();
        }
        conditions::set(&mut next.conditions, resumed, Time(Timestamp::now()));
    }
}

/// Writes the claim's Pending status, with an Event when its reason changed; a change of the
/// quoted count only waits out its window (returned: when to look again).
async fn write_pending(
    this: &ClaimRef<'_>,
    ctx: &Context,
    status: &VirtualMachineClaimStatus,
    reason: &str,
    message: String,
) -> Result<Option<Duration>> {
    let mut next = status.clone();
    next.phase = decide::advance(status.phase, ClaimPhase::Pending);
    let reason_changed = conditions::find(&status.conditions, types::BOUND)
        .map(|c| c.reason.as_str())
        != Some(reason);
    conditions::set(
        &mut next.conditions,
        conditions::new(
            types::BOUND,
            status::FALSE,
            reason,
            message.clone(),
            this.claim.metadata.generation,
        ),
        Time(Timestamp::now()),
    );
    if next == *status {
        return Ok(None);
    }
    let delay = decide::waiting_write_delay(
        status,
        &next,
        ctx.waiting_writes.since_last(&this.uid, Instant::now()),
    );
    if delay.is_some() {
        return Ok(delay);
    }
    write_status(this, ctx, &next).await?;
    ctx.waiting_writes.wrote(&this.uid, Instant::now());
    if reason_changed {
        ctx.event(this.claim, EventType::Normal, reason, message)
            .await;
    }
    Ok(None)
}

async fn enter_releasing(
    this: &ClaimRef<'_>,
    ctx: &Context,
    status: &VirtualMachineClaimStatus,
    reason: &str,
    message: String,
) -> Result<()> {
    let mut next = status.clone();
    next.phase = decide::advance(status.phase, ClaimPhase::Releasing);
    if next.phase != Some(ClaimPhase::Releasing) || next == *status {
        return Ok(());
    }
    conditions::set(
        &mut next.conditions,
        conditions::new(
            types::BOUND,
            status::FALSE,
            reason,
            message.clone(),
            this.claim.metadata.generation,
        ),
        Time(Timestamp::now()),
    );
    write_status(this, ctx, &next).await?;
    crash_at(CrashPoint::AfterReleasingStatus);
    ctx.event(this.claim, EventType::Normal, reasons::RELEASING, message)
        .await;
    Ok(())
}

/// A deleted or expired claim: Releasing, then delete its member and wait for it to be gone
/// from the API server; then drop the finalizer (deleted) or delete the claim (expired).
async fn release(this: &ClaimRef<'_>, ctx: &Context, deleting: bool) -> Result<Action> {
    let status = this.claim.status.clone().unwrap_or_default();
    if deleting && status.phase != Some(ClaimPhase::Failed) {
        enter_releasing(
            this,
            ctx,
            &status,
            reasons::RELEASING,
            "claim deleted; destroying its member".to_owned(),
        )
        .await?;
    }
    release_member(this, ctx, deleting).await
}

async fn release_member(this: &ClaimRef<'_>, ctx: &Context, deleting: bool) -> Result<Action> {
    let vms = ctx.api::<VirtualMachine>(&this.namespace);
    let members = claim_members(this, &vms).await?;
    if members.is_empty() {
        ctx.forget_assignment(&this.uid);
        ctx.claim_writes.forget(&this.uid);
        if deleting {
            ctx.remove_finalizer(&this.api, this.claim, names::FINALIZER_CLAIM_PROTECTION)
                .await?;
        } else {
            match this.api.delete(&this.name, &DeleteParams::default()).await {
                Ok(_) => {}
                Err(error) if is_not_found(&error) => {}
                Err(error) => return Err(error.into()),
            }
        }
        return Ok(Action::await_change());
    }
    for member in members {
        if member.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let member_name = member.name_any();
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: member.metadata.uid.clone(),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        match vms.delete(&member_name, &params).await {
            Ok(_) => {}
            Err(error) if is_not_found(&error) || is_conflict(&error) => {}
            Err(error) => return Err(error.into()),
        }
        // No Event on the member: the claim's own Releasing status and Event say why it goes,
        // and one write fewer per claim matters at tens of claims per second.
        crash_at(CrashPoint::AfterMemberDelete);
    }
    Ok(Action::requeue(RELEASE_POLL))
}

fn until(deadline: Timestamp) -> Duration {
    let remaining = deadline.duration_since(Timestamp::now());
    if remaining.is_negative() {
        Duration::ZERO
    } else {
        remaining.unsigned_abs() + Duration::from_millis(10)
    }
}

/// Claims to look at again when `pool`'s state changes: every claim naming it.
pub(crate) fn claims_of_pool(
    claims: &kube::runtime::reflector::Store<VirtualMachineClaim>,
    namespace: &str,
    pool: &str,
    pending_only: bool,
) -> Vec<kube::runtime::reflector::ObjectRef<VirtualMachineClaim>> {
    claims
        .state()
        .iter()
        .filter(|c| {
            c.metadata.namespace.as_deref() == Some(namespace)
                && c.spec.pool_ref.name == pool
                && (!pending_only
                    || matches!(
                        c.status.as_ref().and_then(|s| s.phase),
                        None | Some(ClaimPhase::Pending)
                    ))
        })
        .map(|c| kube::runtime::reflector::ObjectRef::from_obj(c.as_ref()))
        .collect()
}

//! 40 claims against 20 ready members: exactly 20 bind, to distinct members, the rest wait with
//! the pool's reason; the pool refills and they bind; no member ever carries two claims.

use std::collections::BTreeSet;
use std::sync::atomic::Ordering;

use banlieue_api::conditions::reasons;
use banlieue_api::{ClaimPhase, VirtualMachineClaim};
use banlieue_testenv::control_plane::wait_for;
use serde_json::json;

use crate::support::fake_provider::FakeProvider;
use crate::support::history::History;
use crate::support::*;

const MEMBERS: usize = 20;
const CLAIMS: usize = 40;

#[tokio::test]
async fn forty_claims_race_for_twenty_members() -> TestResult {
    let h = Harness::new().await?;
    let provider = FakeProvider::start(h.admin.clone(), &h.namespace);
    let controller = h.start_controller().await?;
    h.create_pool(
        "race-pool",
        MEMBERS as i32,
        "InfrastructureReady",
        json!({}),
    )
    .await?;
    h.wait_available("race-pool", MEMBERS as i32).await?;
    let history = History::record(h.admin.clone(), &h.namespace);

    // Refills stay unready until the first round is checked.
    provider.controls.ready_gate.store(false, Ordering::SeqCst);
    let creates = (0..CLAIMS).map(|i| {
        let h = &h;
        async move {
            h.create_claim(&format!("claim-{i:02}"), "race-pool", 3600)
                .await
        }
    });
    for created in futures::future::join_all(creates).await {
        created?;
    }

    let claims = h.api::<VirtualMachineClaim>();
    let first_round = wait_for("20 Bound and 20 Pending with the pool's reason", DEADLINE, || {
        let claims = claims.clone();
        async move {
            let list = claims.list(&Default::default()).await?.items;
            let bound = list.iter().filter(|c| is_bound(c)).count();
            let waiting = list
                .iter()
                .filter(|c| {
                    phase(c) == Some(ClaimPhase::Pending)
                        && bound_condition(c).is_some_and(|b| {
                            b.reason == reasons::NO_MEMBER_AVAILABLE
                                && b.message.starts_with("no Ready, unclaimed member in pool race-pool (pool: Filling: ")
                        })
                })
                .count();
            Ok((bound == MEMBERS && waiting == CLAIMS - MEMBERS).then_some(list))
        }
    })
    .await?;
    let members: BTreeSet<String> = first_round.iter().filter_map(member_name).collect();
    assert_eq!(
        members.len(),
        MEMBERS,
        "each Bound claim holds a distinct member"
    );

    provider.controls.ready_gate.store(true, Ordering::SeqCst);
    let all = wait_for("all 40 Bound", DEADLINE, || {
        let claims = claims.clone();
        async move {
            let list = claims.list(&Default::default()).await?.items;
            Ok((list.iter().filter(|c| is_bound(c)).count() == CLAIMS).then_some(list))
        }
    })
    .await?;
    let members: BTreeSet<String> = all.iter().filter_map(member_name).collect();
    assert_eq!(members.len(), CLAIMS, "40 distinct members");
    // Claims bound in the first round kept their member.
    for claim in first_round.iter().filter(|c| is_bound(c)) {
        let now = all
            .iter()
            .find(|c| c.metadata.name == claim.metadata.name)
            .ok_or("claim vanished")?;
        assert_eq!(member_name(now), member_name(claim));
    }
    history.assert_bound_at_most_once();
    let conflicts = controller.metrics.bind_conflicts.get();
    eprintln!(
        "race: {CLAIMS} claims, {MEMBERS} warm members: {conflicts} bind conflicts (409); {} watch events checked",
        history.seen.lock().map(|s| s.events).unwrap_or_default()
    );
    controller.stop().await?;
    Ok(())
}

/// A bind whose answer was lost can leave a second member bound to a claim that bound another
/// one: that member, never handed to the claim's user, is deleted and the pool refills.
#[tokio::test]
async fn a_second_member_bound_to_a_claim_is_deleted() -> TestResult {
    let h = Harness::new().await?;
    let _provider = FakeProvider::start(h.admin.clone(), &h.namespace);
    let controller = h.start_controller().await?;
    let kept = h.bound_claim("p", 2, "c").await?;
    h.wait_available("p", 2).await?;
    let claims = h.api::<VirtualMachineClaim>();
    let claim = claims.get("c").await?;
    let vms = h.api::<banlieue_api::VirtualMachine>();
    let extra = h
        .members("p")
        .await?
        .into_iter()
        .map(|vm| kube::ResourceExt::name_any(&vm))
        .find(|name| *name != kept)
        .ok_or("no unclaimed member")?;
    // As the lost bind left it (admin: the test plays the controller's earlier write), at the
    // member's latest resourceVersion: the controller may still be writing its status.
    wait_for("the second member bound to the claim", DEADLINE, || {
        let (vms, claim, extra) = (vms.clone(), claim.clone(), extra.clone());
        async move {
            let member = vms.get(&extra).await?;
            match banlieue_controller::bind_member(
                &vms,
                &claim,
                &extra,
                member.metadata.resource_version.as_deref(),
            )
            .await
            {
                Ok(_) => Ok(Some(())),
                Err(kube::Error::Api(status)) if status.code == 409 => Ok(None),
                Err(error) => Err(error.into()),
            }
        }
    })
    .await?;
    wait_for("the second member to be deleted", DEADLINE, || {
        let vms = vms.clone();
        let extra = extra.clone();
        async move {
            Ok(vms
                .get_opt(&extra)
                .await?
                .is_none_or(|vm| vm.metadata.deletion_timestamp.is_some())
                .then_some(()))
        }
    })
    .await?;
    let claim = claims.get("c").await?;
    assert_eq!(
        member_name(&claim),
        Some(kept.clone()),
        "the claim keeps its member"
    );
    assert!(vms.get_opt(&kept).await?.is_some());
    assert_eq!(controller.metrics.extra_members_deleted.get(), 1);
    h.wait_available("p", 2).await?;
    controller.stop().await?;
    Ok(())
}

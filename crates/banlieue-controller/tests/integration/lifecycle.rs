//! Claim and pool lifecycle: release blocks on the member, pool deletion spares bound members,
//! expiry, Failed, PoolNotFound, ReadinessSignalAbsent, revision order, idle expiry, the bind's
//! optimistic concurrency, and the controller's RBAC.

use std::collections::BTreeSet;
use std::sync::atomic::Ordering;

use banlieue_api::conditions::{reasons, types};
use banlieue_api::names;
use banlieue_api::{ClaimPhase, VirtualMachine, VirtualMachineClaim, VirtualMachinePool};
use banlieue_testenv::control_plane::wait_for;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;

use crate::support::fake_provider::FakeProvider;
use crate::support::*;

#[tokio::test]
async fn claim_deletion_blocks_on_the_member_then_the_pool_refills() -> TestResult {
    let h = Harness::new().await?;
    let provider = FakeProvider::start(h.admin.clone(), &h.namespace);
    let controller = h.start_controller().await?;
    let member = h.bound_claim("p", 1, "c").await?;

    provider
        .controls
        .hold_teardown
        .store(true, Ordering::SeqCst);
    let claims = h.api::<VirtualMachineClaim>();
    claims.delete("c", &DeleteParams::default()).await?;
    let releasing = h
        .wait_claim("c", "Releasing with the member being destroyed", |c| {
            phase(c) == Some(ClaimPhase::Releasing)
        })
        .await?;
    assert!(releasing.metadata.deletion_timestamp.is_some());
    let vms = h.api::<VirtualMachine>();
    h.wait_vm(&member, "member deleting", |vm| {
        vm.metadata.deletion_timestamp.is_some()
    })
    .await?;
    // The domain is still being torn down: the claim holds.
    assert!(
        claims.get_opt("c").await?.is_some(),
        "claim deletion waits for the member"
    );

    provider
        .controls
        .hold_teardown
        .store(false, Ordering::SeqCst);
    gone(&claims, "c", "the claim to be gone").await?;
    assert!(
        vms.get_opt(&member).await?.is_none(),
        "the member went before the claim"
    );
    // The refill was made when the claim bound, so one member is available all along; the
    // claimed count drops once the pool sees the member gone.
    h.wait_pool("p", "one available and none claimed", |s| {
        (s.replicas, s.available_replicas, s.claimed_replicas) == (1, 1, 0)
    })
    .await?;
    let refill = h.members("p").await?;
    assert!(refill.iter().all(|m| m.name_any() != member));
    controller.stop().await?;
    Ok(())
}

#[tokio::test]
async fn deleting_the_pool_keeps_bound_members() -> TestResult {
    let h = Harness::new().await?;
    let _provider = FakeProvider::start(h.admin.clone(), &h.namespace);
    let controller = h.start_controller().await?;
    let bound = h.bound_claim("p", 2, "c").await?;
    // Two available is also what the pool said before the bind: wait for the status that
    // counts the bound member, written once the refill exists.
    h.wait_pool("p", "two available besides the bound member", |s| {
        (s.replicas, s.available_replicas, s.claimed_replicas) == (2, 2, 1)
    })
    .await?;
    let unclaimed: Vec<String> = h.members("p").await?.iter().map(|m| m.name_any()).collect();
    assert_eq!(unclaimed.len(), 2);

    h.api::<VirtualMachinePool>()
        .delete("p", &DeleteParams::background())
        .await?;
    let vms = h.api::<VirtualMachine>();
    for name in &unclaimed {
        gone(&vms, name, "unclaimed members to be collected").await?;
    }
    let member = vms.get(&bound).await?;
    assert!(
        member.metadata.deletion_timestamp.is_none(),
        "the bound member lives on"
    );
    let claim = h.api::<VirtualMachineClaim>().get("c").await?;
    assert!(is_bound(&claim));
    controller.stop().await?;
    Ok(())
}

#[tokio::test]
async fn ttl_expiry_deletes_the_member_then_the_claim() -> TestResult {
    let h = Harness::new().await?;
    let provider = FakeProvider::start(h.admin.clone(), &h.namespace);
    let controller = h.start_controller().await?;
    h.create_pool("p", 1, "InfrastructureReady", json!({}))
        .await?;
    h.wait_available("p", 1).await?;
    provider
        .controls
        .hold_teardown
        .store(true, Ordering::SeqCst);
    h.create_claim("c", "p", 3).await?;
    let claim = h.wait_claim("c", "Bound", is_bound).await?;
    let member = member_name(&claim).ok_or("no member")?;

    let expiring = h
        .wait_claim("c", "Releasing, reason Expired", |c| {
            phase(c) == Some(ClaimPhase::Releasing)
                && bound_condition(c).is_some_and(|b| b.reason == reasons::EXPIRED)
        })
        .await?;
    let expires_at = expiring
        .status
        .and_then(|s| s.expires_at)
        .ok_or("no expiresAt")?;
    assert!(k8s_openapi::jiff::Timestamp::now() >= expires_at.0);
    h.wait_vm(&member, "member deleting", |vm| {
        vm.metadata.deletion_timestamp.is_some()
    })
    .await?;
    let claims = h.api::<VirtualMachineClaim>();
    assert!(
        claims.get_opt("c").await?.is_some(),
        "the claim outlives its member"
    );
    provider
        .controls
        .hold_teardown
        .store(false, Ordering::SeqCst);
    gone(&claims, "c", "the expired claim to be deleted").await?;
    assert!(h.api::<VirtualMachine>().get_opt(&member).await?.is_none());
    controller.stop().await?;
    Ok(())
}

#[tokio::test]
async fn member_deleted_by_hand_fails_the_claim_for_good() -> TestResult {
    let h = Harness::new().await?;
    let _provider = FakeProvider::start(h.admin.clone(), &h.namespace);
    let controller = h.start_controller().await?;
    let member = h.bound_claim("p", 1, "c").await?;

    h.api::<VirtualMachine>()
        .delete(&member, &DeleteParams::default())
        .await?;
    let failed = h
        .wait_claim("c", "Failed", |c| phase(c) == Some(ClaimPhase::Failed))
        .await?;
    let condition = bound_condition(&failed).ok_or("no Bound condition")?;
    assert_eq!(condition.reason, reasons::MEMBER_DELETED);
    assert!(condition.message.contains(&member), "{}", condition.message);
    // A fresh member warms up; the Failed claim never takes it.
    h.wait_available("p", 1).await?;
    let later = h
        .wait_claim("c", "still Failed after a resync", |c| {
            phase(c) == Some(ClaimPhase::Failed)
        })
        .await?;
    assert_eq!(member_name(&later), Some(member.clone()));
    tokio::time::sleep(std::time::Duration::from_secs(6)).await; // one resync period
    let later = h.api::<VirtualMachineClaim>().get("c").await?;
    assert_eq!(phase(&later), Some(ClaimPhase::Failed));
    let vms = h
        .api::<VirtualMachine>()
        .list(&Default::default())
        .await?
        .items;
    assert!(
        vms.iter()
            .all(|vm| !vm.labels().contains_key(names::LABEL_CLAIM)),
        "nothing bound to the Failed claim"
    );
    // A Failed claim is released like any other.
    h.api::<VirtualMachineClaim>()
        .delete("c", &DeleteParams::default())
        .await?;
    gone(
        &h.api::<VirtualMachineClaim>(),
        "c",
        "the Failed claim to go",
    )
    .await?;
    controller.stop().await?;
    Ok(())
}

#[tokio::test]
async fn pool_not_found_then_pending_binds_once_the_pool_exists() -> TestResult {
    let h = Harness::new().await?;
    let _provider = FakeProvider::start(h.admin.clone(), &h.namespace);
    let controller = h.start_controller().await?;
    h.create_claim("c", "sandbox-pool", 3600).await?;
    let claim = h
        .wait_claim("c", "PoolNotFound", |c| {
            bound_condition(c).is_some_and(|b| b.reason == reasons::POOL_NOT_FOUND)
        })
        .await?;
    assert_eq!(phase(&claim), Some(ClaimPhase::Pending));
    let condition = bound_condition(&claim).ok_or("no condition")?;
    assert_eq!(condition.message, "pool sandbox-pool does not exist");
    assert_eq!(condition.status, "False");

    h.create_pool("sandbox-pool", 1, "InfrastructureReady", json!({}))
        .await?;
    h.wait_claim("c", "Bound once the pool warms", is_bound)
        .await?;
    controller.stop().await?;
    Ok(())
}

#[tokio::test]
async fn guest_ready_pool_without_the_signal_says_readiness_signal_absent() -> TestResult {
    let h = Harness::new().await?;
    let provider = FakeProvider::start(h.admin.clone(), &h.namespace);
    provider.controls.guest_ready.store(false, Ordering::SeqCst);
    let controller = h.start_controller().await?;
    h.create_pool("p", 1, "GuestReady", json!({})).await?;
    let pool = h
        .wait_pool("p", "Ready=False ReadinessSignalAbsent", |s| {
            s.conditions
                .iter()
                .any(|c| c.type_ == types::READY && c.reason == reasons::READINESS_SIGNAL_ABSENT)
        })
        .await?;
    let status = pool.status.ok_or("no status")?;
    assert_eq!(status.available_replicas, 0);
    assert_eq!(status.ready_replicas, 1);
    h.create_claim("c", "p", 3600).await?;
    let claim = h
        .wait_claim("c", "NoMemberAvailable with the pool's reason", |c| {
            bound_condition(c).is_some_and(|b| b.reason == reasons::NO_MEMBER_AVAILABLE)
        })
        .await?;
    assert_eq!(
        bound_condition(&claim).map(|b| b.message),
        Some(r#"no Ready, unclaimed member in pool p (pool: ReadinessSignalAbsent: no member has published the "GuestReady" condition)"#.to_owned())
    );
    assert_eq!(phase(&claim), Some(ClaimPhase::Pending));
    controller.stop().await?;
    Ok(())
}

#[tokio::test]
async fn current_revision_first_and_stale_when_nothing_fresher() -> TestResult {
    let h = Harness::new().await?;
    let provider = FakeProvider::start(h.admin.clone(), &h.namespace);
    let controller = h.start_controller().await?;
    h.create_pool(
        "p",
        2,
        "InfrastructureReady",
        json!({"updateStrategy": {"type": "OnDelete"}}),
    )
    .await?;
    h.wait_available("p", 2).await?;
    let old: BTreeSet<String> = h.members("p").await?.iter().map(|m| m.name_any()).collect();
    let old_revision = h
        .api::<VirtualMachinePool>()
        .get("p")
        .await?
        .status
        .and_then(|s| s.current_revision);

    // A rebuilt image: a new revision; OnDelete keeps the old members.
    h.apply_image(IMAGE, "r2", true).await?;
    h.wait_pool("p", "a new revision", |s| {
        s.current_revision.is_some() && s.current_revision != old_revision
    })
    .await?;
    h.create_claim("c1", "p", 3600).await?;
    let c1 = h.wait_claim("c1", "Bound", is_bound).await?;
    let first = member_name(&c1).ok_or("no member")?;
    assert!(
        old.contains(&first),
        "nothing fresher was Ready: a stale member is handed out"
    );

    // The refill is current: it goes first although the other old member has been Ready longer.
    // The pool's available count may still be the one from before c1 bound: wait for the refill
    // member itself to exist.
    let vms: Api<VirtualMachine> = h.api();
    let selector = format!("{}=p", names::LABEL_POOL);
    let fresh: Vec<String> = wait_for("the refill member", DEADLINE, || {
        let (vms, selector, old) = (vms.clone(), selector.clone(), &old);
        async move {
            let fresh: Vec<String> = vms
                .list(&kube::api::ListParams::default().labels(&selector))
                .await?
                .items
                .iter()
                .map(|m| m.name_any())
                .filter(|n| !old.contains(n))
                .collect();
            Ok((!fresh.is_empty()).then_some(fresh))
        }
    })
    .await?;
    assert_eq!(fresh.len(), 1, "{fresh:?}");
    // The pool's count may still be the one from before c1 bound: wait for the refill itself.
    h.wait_vm(&fresh[0], "the refill InfrastructureReady", |vm| {
        vm.status.as_ref().is_some_and(|s| {
            banlieue_api::conditions::is_true(&s.conditions, types::INFRASTRUCTURE_READY)
        })
    })
    .await?;
    // The refill after c2 must not be Ready when c3 arrives: only the old member is left.
    provider.controls.ready_gate.store(false, Ordering::SeqCst);
    h.create_claim("c2", "p", 3600).await?;
    let c2 = h.wait_claim("c2", "Bound", is_bound).await?;
    assert_eq!(member_name(&c2), Some(fresh[0].clone()));
    h.create_claim("c3", "p", 3600).await?;
    let c3 = h.wait_claim("c3", "Bound", is_bound).await?;
    let third = member_name(&c3).ok_or("no member")?;
    assert!(old.contains(&third) && third != first);
    controller.stop().await?;
    Ok(())
}

#[tokio::test]
async fn idle_members_are_replaced() -> TestResult {
    let h = Harness::new().await?;
    let _provider = FakeProvider::start(h.admin.clone(), &h.namespace);
    let controller = h.start_controller().await?;
    h.create_pool("p", 1, "InfrastructureReady", json!({"maxIdleSeconds": 3}))
        .await?;
    h.wait_available("p", 1).await?;
    let first = h
        .members("p")
        .await?
        .first()
        .map(|m| m.name_any())
        .ok_or("no member")?;
    let vms = h.api::<VirtualMachine>();
    gone(&vms, &first, "the idle member to be replaced").await?;
    let pool = h.wait_available("p", 1).await?;
    let now = h.members("p").await?;
    assert!(now.iter().all(|m| m.name_any() != first));
    assert_eq!(pool.status.map(|s| s.replicas), Some(1));
    controller.stop().await?;
    Ok(())
}

#[tokio::test]
async fn a_bind_on_a_stale_resource_version_is_rejected() -> TestResult {
    let h = Harness::new().await?;
    let _provider = FakeProvider::start(h.admin.clone(), &h.namespace);
    // No controller: this drives the bind write directly.
    let controller = h.start_controller().await?;
    h.create_pool("p", 1, "InfrastructureReady", json!({}))
        .await?;
    h.wait_available("p", 1).await?;
    controller.stop().await?;
    let vms = h.api::<VirtualMachine>();
    let member = h
        .members("p")
        .await?
        .into_iter()
        .next()
        .ok_or("no member")?;
    let name = member.name_any();
    let stale = member.resource_version();
    vms.patch(
        &name,
        &PatchParams::default(),
        &Patch::Merge(&json!({"metadata": {"annotations": {"touched": "yes"}}})),
    )
    .await?;

    let claim = h.create_claim("c", "p", 60).await?;
    let controller_vms: Api<VirtualMachine> =
        Api::namespaced(h.controller_client().await?, &h.namespace);
    let error = banlieue_controller::bind_member(&controller_vms, &claim, &name, stale.as_deref())
        .await
        .err()
        .ok_or("a stale bind succeeded")?;
    assert!(
        matches!(&error, kube::Error::Api(s) if s.is_conflict()),
        "{error}"
    );
    let unchanged = vms.get(&name).await?;
    assert_eq!(
        unchanged
            .labels()
            .get(names::LABEL_POOL)
            .map(String::as_str),
        Some("p")
    );
    assert!(!unchanged.labels().contains_key(names::LABEL_CLAIM));

    let bound = banlieue_controller::bind_member(
        &controller_vms,
        &claim,
        &name,
        unchanged.resource_version().as_deref(),
    )
    .await?;
    assert_eq!(
        bound.labels().get(names::LABEL_CLAIM).map(String::as_str),
        Some("c")
    );
    assert!(!bound.labels().contains_key(names::LABEL_POOL));
    assert_eq!(bound.owner_references().len(), 1);
    assert_eq!(bound.owner_references()[0].kind, "VirtualMachineClaim");
    Ok(())
}

#[tokio::test]
async fn the_controller_cannot_create_or_update_a_claim() -> TestResult {
    let h = Harness::new().await?;
    let claims: Api<VirtualMachineClaim> =
        Api::namespaced(h.controller_client().await?, &h.namespace);
    let forged: VirtualMachineClaim = serde_json::from_value(json!({
        "apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachineClaim",
        "metadata": {"name": "forged"},
        "spec": {"poolRef": {"name": "p"}, "subject": {"issuer": "https://issuer.example.com", "id": "someone"}, "ttlSeconds": 60}
    }))?;
    let error = claims
        .create(&PostParams::default(), &forged)
        .await
        .err()
        .ok_or("the controller created a claim")?;
    assert!(
        matches!(&error, kube::Error::Api(s) if s.is_forbidden()),
        "{error}"
    );

    let mut real = h.create_claim("real", "p", 60).await?;
    real.metadata.labels = Some([("x".to_owned(), "y".to_owned())].into());
    let error = claims
        .replace("real", &PostParams::default(), &real)
        .await
        .err()
        .ok_or("the controller updated a claim")?;
    assert!(
        matches!(&error, kube::Error::Api(s) if s.is_forbidden()),
        "{error}"
    );
    Ok(())
}

/// `maxClaimsPerSubject: 1`: a subject's second claim waits, saying why, while another
/// subject's binds; it binds once the first is released.
#[tokio::test]
async fn a_subject_holds_at_most_max_claims_per_subject() -> TestResult {
    let h = Harness::new().await?;
    let _provider = FakeProvider::start(h.admin.clone(), &h.namespace);
    let controller = h.start_controller().await?;
    h.create_pool(
        "p",
        2,
        "InfrastructureReady",
        json!({"maxClaimsPerSubject": 1}),
    )
    .await?;
    h.wait_available("p", 2).await?;
    let claims = h.api::<VirtualMachineClaim>();
    let claim = |name: &str, subject: &str| -> serde_json::Result<VirtualMachineClaim> {
        serde_json::from_value(json!({
            "apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachineClaim",
            "metadata": {"name": name},
            "spec": {"poolRef": {"name": "p"},
                     "subject": {"issuer": "https://issuer.example.com", "id": subject},
                     "ttlSeconds": 3600}
        }))
    };
    claims
        .create(&PostParams::default(), &claim("first", "alice")?)
        .await?;
    h.wait_claim("first", "alice's first claim Bound", is_bound)
        .await?;
    claims
        .create(&PostParams::default(), &claim("second", "alice")?)
        .await?;
    let waiting = h
        .wait_claim("second", "alice's second claim held back", |c| {
            bound_condition(c).is_some_and(|b| b.reason == reasons::SUBJECT_LIMIT_REACHED)
        })
        .await?;
    assert_eq!(phase(&waiting), Some(ClaimPhase::Pending));
    let message = bound_condition(&waiting).ok_or("no condition")?.message;
    assert!(
        message.contains(
            "subject alice at https://issuer.example.com holds or waits for 1 claim(s) of pool p"
        ) && message.contains("maxClaimsPerSubject is 1"),
        "{message}"
    );
    // The cap is per subject: bob's claim takes the other warm member.
    claims
        .create(&PostParams::default(), &claim("bobs", "bob")?)
        .await?;
    h.wait_claim("bobs", "bob's claim Bound", is_bound).await?;
    let still = claims.get("second").await?;
    assert_eq!(phase(&still), Some(ClaimPhase::Pending));

    claims.delete("first", &DeleteParams::default()).await?;
    h.wait_claim(
        "second",
        "alice's second claim Bound once her first is released",
        is_bound,
    )
    .await?;
    controller.stop().await?;
    Ok(())
}

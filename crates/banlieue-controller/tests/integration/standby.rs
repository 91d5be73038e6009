//! Saved warm pools (ADR-0073), the controller's half against a real API server: a member of a
//! `standby: Saved` pool is asked to be saved once it is available, still counts as available,
//! and a claim binds it at once but reports `Resumed` (and its addresses) only once its
//! provider says the machine runs again. LibvirtMachine and VSphereMachine save; a kind whose
//! provider cannot (the test-only MemoryMachine) makes the pool say `StandbyNotSupported`.

use std::sync::atomic::Ordering;

use banlieue_api::conditions::{self, reasons, status, types};
use banlieue_api::{Standby, VirtualMachine, VirtualMachineClaim};
use banlieue_testenv::control_plane::wait_for;
use kube::ResourceExt;
use serde_json::json;

use crate::support::backend::backend;
use crate::support::fake_provider::FakeProvider;
use crate::support::*;

fn resumed(claim: &VirtualMachineClaim) -> Option<conditions::Condition> {
    let status = claim.status.as_ref()?;
    conditions::find(&status.conditions, types::RESUMED).cloned()
}

fn standby_of(vm: &VirtualMachine) -> Option<Standby> {
    vm.status.as_ref()?.standby
}

/// Whether the kind under test can be saved, as the controller under test knows it
/// (`MachineBackend.saves`): LibvirtMachine (managed save) and VSphereMachine (suspend) can,
/// the test-only MemoryMachine cannot.
fn kind_saves() -> bool {
    let kind = &backend().kind;
    let saves = backend()
        .machine_backends()
        .get(kind)
        .is_some_and(|b| b.saves);
    assert_eq!(saves, !backend().is_memory(), "{kind:?} saves: {saves}");
    saves
}

/// The name of a member of `pool` whose VirtualMachine reports `standby: Saved`, other than
/// `except`.
async fn saved_member(h: &Harness, pool: &str, except: Option<&str>) -> TestResult<String> {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let members = h.members(pool).await?;
        if let Some(saved) = members.iter().find(|vm| {
            standby_of(vm) == Some(Standby::Saved) && Some(vm.name_any().as_str()) != except
        }) {
            return Ok(saved.name_any());
        }
        if tokio::time::Instant::now() > deadline {
            return Err(format!("no saved member of {pool} after 60 s: {members:#?}").into());
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn a_saved_member_is_available_and_a_claim_waits_for_its_resume() -> TestResult {
    let h = Harness::new().await?;
    let provider = FakeProvider::start(h.admin.clone(), &h.namespace);
    let controller = h.start_controller().await?;
    h.create_pool("p", 1, "InfrastructureReady", json!({"standby": "Saved"}))
        .await?;
    if !kind_saves() {
        // The test-only kind cannot save: the pool says so and stops creating.
        let pool = h
            .wait_pool("p", "StandbyNotSupported", |s| {
                conditions::find(&s.conditions, types::READY)
                    .is_some_and(|c| c.reason == reasons::STANDBY_NOT_SUPPORTED)
            })
            .await?;
        let ready = conditions::find(&pool.status.unwrap_or_default().conditions, types::READY)
            .cloned()
            .ok_or("a Ready condition")?;
        assert!(
            ready.message.contains(backend().kind.as_str()),
            "{}",
            ready.message
        );
        assert_eq!(h.members("p").await?.len(), 1, "no member after the first");
        return Ok(());
    }

    // The member is saved once available, and a saved member is still available.
    let member = saved_member(&h, "p", None).await?;
    let machine = h.machine_api().get(&member).await?;
    assert_eq!(machine.data["spec"]["standby"], "Saved");
    h.wait_available("p", 1).await?;

    // Bound at once; not resumed while its provider has not restored it.
    provider.controls.hold_resume.store(true, Ordering::SeqCst);
    h.create_claim("c", "p", 3600).await?;
    let bound = h
        .wait_claim("c", "Bound, Resumed=False", |c| {
            is_bound(c) && resumed(c).is_some_and(|r| r.status == status::FALSE)
        })
        .await?;
    assert_eq!(member_name(&bound).as_deref(), Some(member.as_str()));
    assert_eq!(resumed(&bound).ok_or("Resumed")?.reason, reasons::RESUMING);
    let bound_status = bound.status.clone().unwrap_or_default();
    assert!(
        bound_status.addresses.is_empty(),
        "no address before the member runs: {:?}",
        bound_status.addresses
    );
    // The bind is one write on the VirtualMachine; the member's reconcile then asks its
    // machine to run, so the machine's spec follows the claim's Bound, not with it.
    let machines = h.machine_api();
    wait_for("the machine asked to run", DEADLINE, || async {
        let machine = machines.get(&member).await?;
        Ok((machine.data["spec"]["standby"] == "Running").then_some(()))
    })
    .await?;

    // Restored: Resumed, with the member's addresses.
    provider.controls.hold_resume.store(false, Ordering::SeqCst);
    let resumed_claim = h
        .wait_claim("c", "Resumed=True", |c| {
            resumed(c).is_some_and(|r| r.status == status::TRUE)
        })
        .await?;
    assert_eq!(
        resumed(&resumed_claim).ok_or("Resumed")?.reason,
        reasons::RESUMED
    );
    assert!(
        !resumed_claim
            .status
            .unwrap_or_default()
            .addresses
            .is_empty(),
        "the resumed member's addresses"
    );
    let series = format!(
        "banlieue_controller_claim_resume_latency_seconds_count{{namespace=\"{}\",pool=\"p\"}} 1",
        h.namespace
    );
    // Recorded once the status write that says Resumed has returned to the controller, which
    // may be just after this test's read of the claim shows it.
    let recorded = wait_for("the resume latency recorded", DEADLINE, || async {
        let metrics = controller.encoded_metrics().unwrap_or_default();
        Ok(metrics.contains(&series).then_some(()))
    })
    .await;
    assert!(
        recorded.is_ok(),
        "{series} missing from:\n{}",
        controller.encoded_metrics()?
    );

    // The refill is saved in its turn.
    h.wait_available("p", 1).await?;
    saved_member(&h, "p", Some(&member)).await?;
    Ok(())
}

#[tokio::test]
async fn a_running_pool_writes_no_standby_anywhere() -> TestResult {
    let h = Harness::new().await?;
    let _provider = FakeProvider::start(h.admin.clone(), &h.namespace);
    let _controller = h.start_controller().await?;
    let member = h.bound_claim("p", 1, "c").await?;
    let vm = h.api::<VirtualMachine>().get(&member).await?;
    assert_eq!(standby_of(&vm), None);
    let machine = h.machine_api().get(&member).await?;
    assert!(machine.data["spec"].get("standby").is_none());
    let claim = h.api::<VirtualMachineClaim>().get("c").await?;
    assert!(
        resumed(&claim).is_none(),
        "no Resumed on a Running pool's claim"
    );
    Ok(())
}

#[tokio::test]
async fn a_member_whose_restore_failed_is_deleted_and_its_claim_fails() -> TestResult {
    if !kind_saves() {
        return Ok(());
    }
    let h = Harness::new().await?;
    let provider = FakeProvider::start(h.admin.clone(), &h.namespace);
    let _controller = h.start_controller().await?;
    h.create_pool("p", 1, "InfrastructureReady", json!({"standby": "Saved"}))
        .await?;
    let member = saved_member(&h, "p", None).await?;
    provider.controls.fail_resume.store(true, Ordering::SeqCst);
    h.create_claim("c", "p", 3600).await?;
    let failed = h
        .wait_claim("c", "Failed", |c| {
            phase(c) == Some(banlieue_api::ClaimPhase::Failed)
        })
        .await?;
    let bound = bound_condition(&failed).ok_or("a Bound condition")?;
    assert_eq!(bound.reason, reasons::MEMBER_DELETED);
    assert!(bound.message.contains(&member), "{}", bound.message);
    gone(&h.api::<VirtualMachine>(), &member, "the member deleted").await?;
    // The pool replaces it.
    provider.controls.fail_resume.store(false, Ordering::SeqCst);
    saved_member(&h, "p", Some(&member)).await?;
    Ok(())
}

#[tokio::test]
async fn a_saved_pool_holds_no_more_members_than_the_save_storage_its_provider_gives() -> TestResult
{
    let h = Harness::new().await?;
    if !kind_saves() {
        // Nothing is placed for a pool the backend cannot save (the first test above).
        return Ok(());
    }
    // Room for two saves of the harness class (2 GiB each).
    let providers = h.api::<banlieue_api::Provider>();
    let give_save_storage = |quantity: &'static str| {
        let providers = providers.clone();
        async move {
            let patch = json!({"spec": {"capabilities": {"saveStorage": quantity}}});
            providers
                .patch(
                    PROVIDER,
                    &kube::api::PatchParams::default(),
                    &kube::api::Patch::Merge(patch),
                )
                .await
        }
    };
    give_save_storage("4Gi").await?;
    let controller = h.start_controller().await?;
    h.create_pool(
        "saved",
        3,
        "InfrastructureReady",
        json!({"standby": "Saved"}),
    )
    .await?;
    let selector = format!("{}=saved", banlieue_api::names::LABEL_POOL);
    let list = kube::api::ListParams::default().labels(&selector);
    let vms = h.api::<VirtualMachine>();
    let refused = wait_for("two placed and one refused", DEADLINE, || async {
        let members = vms.list(&list).await?.items;
        let placed = members
            .iter()
            .filter(|vm| vm.status.as_ref().is_some_and(|s| s.provider_ref.is_some()))
            .count();
        let refused: Vec<String> = members
            .iter()
            .filter_map(|vm| {
                let c = conditions::find(&vm.status.as_ref()?.conditions, types::SCHEDULED)?;
                (c.status == status::FALSE && c.reason == reasons::INSUFFICIENT_CAPACITY)
                    .then(|| c.message.clone())
            })
            .collect();
        Ok((placed == 2 && refused.len() == 1).then_some(refused))
    })
    .await?;
    assert!(
        refused[0].contains(&format!(
            "{PROVIDER} has 0.0 GiB of 4.0 GiB of save storage free"
        )),
        "{}",
        refused[0]
    );
    // The administrator gives more: the waiting member is placed.
    give_save_storage("6Gi").await?;
    wait_for("the third member placed", DEADLINE, || async {
        let placed = h
            .placements("saved")
            .await?
            .iter()
            .filter(|m| m.provider.is_some())
            .count();
        Ok((placed == 3).then_some(()))
    })
    .await?;
    controller.stop().await
}

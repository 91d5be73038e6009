//! Crash safety: the controller, run as a child process, dies at each step of a bind and of a
//! release (BANLIEUE_CRASH_AT) or by SIGKILL in a burst, and a restarted one completes the work:
//! no double bind, no leaked member, no claim stuck.

use std::os::unix::process::ExitStatusExt;
use std::time::Duration;

use banlieue_api::names;
use banlieue_api::{VirtualMachine, VirtualMachineClaim};
use banlieue_controller::CrashPoint;
use banlieue_testenv::control_plane::wait_for;
use kube::ResourceExt;
use kube::api::DeleteParams;
use serde_json::json;

use crate::support::child::ChildController;
use crate::support::fake_provider::FakeProvider;
use crate::support::history::History;
use crate::support::*;

const SIGABRT: i32 = 6;

/// Waits until the namespace holds exactly `n` VirtualMachines, none being deleted.
async fn wait_vm_count(h: &Harness, n: usize) -> TestResult {
    let vms = h.api::<VirtualMachine>();
    let started = std::time::Instant::now();
    loop {
        let list = vms.list(&Default::default()).await?.items;
        if list.len() == n
            && list
                .iter()
                .all(|vm| vm.metadata.deletion_timestamp.is_none())
        {
            return Ok(());
        }
        if started.elapsed() > DEADLINE {
            let seen: Vec<String> = list
                .iter()
                .map(|vm| {
                    format!(
                        "{} {:?} deleting={}",
                        vm.name_any(),
                        vm.labels(),
                        vm.metadata.deletion_timestamp.is_some()
                    )
                })
                .collect();
            return Err(format!("expected {n} VirtualMachines, have {seen:#?}").into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn crash_during_bind(point: CrashPoint) -> TestResult {
    let h = Harness::new().await?;
    let _provider = FakeProvider::start(h.admin.clone(), &h.namespace);
    let dir = std::env::temp_dir();
    let kubeconfig = h.controller_kubeconfig(&dir).await?;
    let mut first = ChildController::spawn(&kubeconfig, &h.namespace, Some(point.name()), 1)?;
    h.create_pool("p", 1, "InfrastructureReady", json!({}))
        .await?;
    h.wait_available("p", 1).await?;
    let history = History::record(h.admin.clone(), &h.namespace);
    h.create_claim("c", "p", 3600).await?;
    let status = first.wait_exit(DEADLINE).await?;
    assert_eq!(
        status.signal(),
        Some(SIGABRT),
        "crashed at {}; log {}",
        point.name(),
        first.log.display()
    );

    let _second = ChildController::spawn(&kubeconfig, &h.namespace, None, 2)?;
    let claim = h
        .wait_claim("c", "Bound after the restart", is_bound)
        .await?;
    let member = member_name(&claim).ok_or("no member")?;
    let vms = h
        .api::<VirtualMachine>()
        .list(&Default::default())
        .await?
        .items;
    let bound: Vec<&VirtualMachine> = vms
        .iter()
        .filter(|vm| vm.labels().get(names::LABEL_CLAIM).map(String::as_str) == Some("c"))
        .collect();
    assert_eq!(bound.len(), 1, "exactly one member bound");
    assert_eq!(bound[0].name_any(), member);
    // The bind time is the one committed before the crash: the TTL is not extended.
    let annotated = bound[0]
        .annotations()
        .get(names::ANNOTATION_BOUND_AT)
        .cloned()
        .ok_or("no bound-at")?;
    let bound_at = claim
        .status
        .as_ref()
        .and_then(|s| s.bound_at.as_ref())
        .ok_or("no boundAt")?;
    assert_eq!(
        annotated.parse::<k8s_openapi::jiff::Timestamp>()?,
        bound_at.0
    );
    h.wait_available("p", 1).await?;
    wait_vm_count(&h, 2).await?;
    history.assert_bound_at_most_once();
    Ok(())
}

async fn crash_during_release(point: CrashPoint) -> TestResult {
    let h = Harness::new().await?;
    let _provider = FakeProvider::start(h.admin.clone(), &h.namespace);
    let dir = std::env::temp_dir();
    let kubeconfig = h.controller_kubeconfig(&dir).await?;
    let mut first = ChildController::spawn(&kubeconfig, &h.namespace, Some(point.name()), 1)?;
    let member = h.bound_claim("p", 1, "c").await?;
    h.api::<VirtualMachineClaim>()
        .delete("c", &DeleteParams::default())
        .await?;
    let status = first.wait_exit(DEADLINE).await?;
    assert_eq!(
        status.signal(),
        Some(SIGABRT),
        "crashed at {}; log {}",
        point.name(),
        first.log.display()
    );

    let _second = ChildController::spawn(&kubeconfig, &h.namespace, None, 2)?;
    let claims = h.api::<VirtualMachineClaim>();
    gone(&claims, "c", "the claim to be released").await?;
    assert!(
        h.api::<VirtualMachine>().get_opt(&member).await?.is_none(),
        "no leaked member"
    );
    h.wait_available("p", 1).await?;
    wait_vm_count(&h, 1).await?;
    Ok(())
}

#[tokio::test]
async fn crash_after_member_patch() -> TestResult {
    crash_during_bind(CrashPoint::AfterMemberPatch).await
}

#[tokio::test]
async fn crash_after_claim_status() -> TestResult {
    crash_during_bind(CrashPoint::AfterClaimStatus).await
}

#[tokio::test]
async fn crash_after_releasing_status() -> TestResult {
    crash_during_release(CrashPoint::AfterReleasingStatus).await
}

#[tokio::test]
async fn crash_after_member_delete() -> TestResult {
    crash_during_release(CrashPoint::AfterMemberDelete).await
}

#[tokio::test]
async fn sigkill_during_a_burst_of_binds() -> TestResult {
    const N: usize = 10;
    let h = Harness::new().await?;
    let _provider = FakeProvider::start(h.admin.clone(), &h.namespace);
    let kubeconfig = h.controller_kubeconfig(&std::env::temp_dir()).await?;
    let mut first = ChildController::spawn(&kubeconfig, &h.namespace, None, 1)?;
    h.create_pool("p", N as i32, "InfrastructureReady", json!({}))
        .await?;
    h.wait_available("p", N as i32).await?;
    let history = History::record(h.admin.clone(), &h.namespace);
    let creates = (0..N).map(|i| {
        let h = &h;
        async move { h.create_claim(&format!("c{i}"), "p", 3600).await }
    });
    for created in futures::future::join_all(creates).await {
        created?;
    }
    // Kill once the first bind landed, with the others in flight.
    let claims = h.api::<VirtualMachineClaim>();
    wait_for("a first bind", DEADLINE, || {
        let claims = claims.clone();
        async move {
            let list = claims.list(&Default::default()).await?.items;
            Ok(list
                .iter()
                .any(|c| {
                    c.status
                        .as_ref()
                        .is_some_and(|s| s.virtual_machine_ref.is_some())
                })
                .then_some(()))
        }
    })
    .await?;
    first.kill()?;
    tokio::time::sleep(Duration::from_millis(200)).await; // let in-flight requests land without a controller

    let _second = ChildController::spawn(&kubeconfig, &h.namespace, None, 2)?;
    let all = wait_for("all claims Bound after the restart", DEADLINE, || {
        let claims = claims.clone();
        async move {
            let list = claims.list(&Default::default()).await?.items;
            Ok((list.iter().filter(|c| is_bound(c)).count() == N).then_some(list))
        }
    })
    .await?;
    let members: std::collections::BTreeSet<String> = all.iter().filter_map(member_name).collect();
    assert_eq!(members.len(), N);
    h.wait_available("p", N as i32).await?;
    wait_vm_count(&h, 2 * N).await?;
    history.assert_bound_at_most_once();
    Ok(())
}

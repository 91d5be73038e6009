//! Two controller replicas (the standalone binary, as the controller's ServiceAccount under the
//! shipped RBAC, deploy/rbac/controller-leader-election-*.yaml included) elect one leader on the
//! Lease `banlieue-controller`: one acts, the other stands by and takes over when the leader is
//! killed, stops, or crashes mid-bind; a leader that cannot renew exits before anyone may take
//! over (ADR-0067).

use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use banlieue_api::VirtualMachineClaim;
use banlieue_api::names;
use banlieue_controller::CrashPoint;
use banlieue_testenv::control_plane::wait_for;
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::RoleBinding;
use kube::ResourceExt;
use kube::api::{DeleteParams, PostParams};
use serde_json::json;

use crate::support::child::{ChildController, Timing};
use crate::support::fake_provider::FakeProvider;
use crate::support::history::History;
use crate::support::*;

const SIGABRT: i32 = 6;

/// Waits until `identity` holds the Lease; returns how long that took.
async fn wait_holder(h: &Harness, identity: &str, deadline: Duration) -> TestResult<Duration> {
    let started = Instant::now();
    wait_for(
        &format!("{identity} to hold the lease"),
        deadline,
        || async {
            Ok(h.lease_holder()
                .await
                .ok()
                .flatten()
                .filter(|holder| holder == identity)
                .map(|_| ()))
        },
    )
    .await?;
    Ok(started.elapsed())
}

/// A namespace with the fake provider, the leader election grant and the controller's
/// kubeconfig.
async fn setup() -> TestResult<(Harness, FakeProvider, PathBuf)> {
    let h = Harness::new().await?;
    let provider = FakeProvider::start(h.admin.clone(), &h.namespace);
    h.grant_leader_election().await?;
    let kubeconfig = h.controller_kubeconfig(&std::env::temp_dir()).await?;
    Ok((h, provider, kubeconfig))
}

fn log_text(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// The bound a standby takes over within once the leader stopped renewing: the lease duration
/// from when it last saw the record change, which it sees at most one jittered retry period
/// (2.2 × retry) after the write, and one more jittered retry period for its next try.
fn takeover_bound(timing: Timing) -> Duration {
    Duration::from_secs_f64(timing.lease_duration + 2.0 * 2.2 * timing.retry_period + 1.0)
}

#[tokio::test]
async fn two_replicas_one_leads_and_a_pool_fills_once() -> TestResult {
    let (h, _provider, kubeconfig) = setup().await?;
    // Both at once: the Lease's create or update guard lets exactly one win.
    let a = ChildController::spawn_candidate(
        &kubeconfig,
        &h.namespace,
        "replica-a",
        None,
        Timing::DEFAULT,
    )?;
    let b = ChildController::spawn_candidate(
        &kubeconfig,
        &h.namespace,
        "replica-b",
        None,
        Timing::DEFAULT,
    )?;
    let leader = wait_for("a leader", DEADLINE, || async {
        Ok(h.lease_holder().await.ok().flatten())
    })
    .await?;
    let history = History::record(h.admin.clone(), &h.namespace);
    h.create_pool("p", 3, "InfrastructureReady", json!({}))
        .await?;
    h.wait_available("p", 3).await?;
    // An observation window of two resyncs: a second acting replica would create members of
    // its own within it.
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(h.members("p").await?.len(), 3);
    let created = history
        .seen
        .lock()
        .map(|s| s.vms.clone())
        .unwrap_or_default();
    assert_eq!(created.len(), 3, "members ever created: {created:?}");
    let lease = h.lease().await?.ok_or("no lease")?;
    assert_eq!(lease.holder_identity.as_deref(), Some(leader.as_str()));
    assert_eq!(lease.lease_transitions, Some(0));
    let (standby_log, leader_log) = if leader == "replica-a" {
        (&b.log, &a.log)
    } else {
        (&a.log, &b.log)
    };
    assert!(log_text(leader_log).contains("became leader"));
    assert!(
        !log_text(standby_log).contains("became leader"),
        "{}",
        standby_log.display()
    );
    Ok(())
}

#[tokio::test]
async fn the_standby_takes_over_from_a_killed_leader_and_binds() -> TestResult {
    let (h, _provider, kubeconfig) = setup().await?;
    let timing = Timing::DEFAULT;
    let mut a =
        ChildController::spawn_candidate(&kubeconfig, &h.namespace, "replica-a", None, timing)?;
    wait_holder(&h, "replica-a", DEADLINE).await?;
    let _b =
        ChildController::spawn_candidate(&kubeconfig, &h.namespace, "replica-b", None, timing)?;
    let history = History::record(h.admin.clone(), &h.namespace);
    h.bound_claim("p", 2, "c1").await?;

    a.kill()?;
    let takeover = wait_holder(&h, "replica-b", Duration::from_secs(60)).await?;
    println!(
        "takeover after SIGKILL of the leader: {takeover:?} (lease {}s, retry {}s)",
        timing.lease_duration, timing.retry_period
    );
    assert!(takeover <= takeover_bound(timing), "{takeover:?}");
    assert_eq!(h.lease().await?.and_then(|l| l.lease_transitions), Some(1));

    h.create_claim("c2", "p", 3600).await?;
    let bound = h
        .wait_claim("c2", "c2 Bound by the new leader", is_bound)
        .await?;
    assert!(member_name(&bound).is_some());
    h.wait_available("p", 2).await?;
    history.assert_bound_at_most_once();
    Ok(())
}

#[tokio::test]
async fn a_stopped_leader_releases_and_the_standby_takes_over_at_once() -> TestResult {
    let (h, _provider, kubeconfig) = setup().await?;
    let timing = Timing::DEFAULT;
    let mut a =
        ChildController::spawn_candidate(&kubeconfig, &h.namespace, "replica-a", None, timing)?;
    wait_holder(&h, "replica-a", DEADLINE).await?;
    let b = ChildController::spawn_candidate(&kubeconfig, &h.namespace, "replica-b", None, timing)?;
    // The standby has seen the lease held before the leader stops.
    wait_for("the standby to stand by", DEADLINE, || async {
        Ok(log_text(&b.log).contains("standing by").then_some(()))
    })
    .await?;

    a.terminate()?;
    let stopped = Instant::now();
    wait_holder(&h, "replica-b", DEADLINE).await?;
    let handover = stopped.elapsed();
    println!("hand-over after SIGTERM of the leader: {handover:?}");
    let status = a.wait_exit(DEADLINE).await?;
    assert!(status.success(), "{status:?}; log {}", a.log.display());
    assert!(log_text(&a.log).contains("released the lease"));
    // Released, not expired: well before the lease duration.
    assert!(
        handover < Duration::from_secs_f64(timing.lease_duration),
        "{handover:?}"
    );
    Ok(())
}

/// A second identity for the standby, bound exactly as the controller's ServiceAccount is
/// (its ClusterRole and the shipped leader election Role), so the test can take the leader's
/// grant away and leave the standby's.
async fn standby_account(h: &Harness) -> TestResult<PathBuf> {
    const STANDBY: &str = "banlieue-controller-standby";
    let account: ServiceAccount = serde_json::from_value(json!({"metadata": {"name": STANDBY}}))?;
    h.api::<ServiceAccount>()
        .create(&PostParams::default(), &account)
        .await?;
    h.bind_controller_roles(STANDBY).await?;
    let lease: RoleBinding = serde_json::from_value(json!({
        "metadata": {"name": STANDBY},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                    "name": "banlieue-controller-leader-election"},
        "subjects": [{"kind": "ServiceAccount", "name": STANDBY, "namespace": h.namespace}]
    }))?;
    h.api::<RoleBinding>()
        .create(&PostParams::default(), &lease)
        .await?;
    let path = std::env::temp_dir().join(format!("{}-standby.kubeconfig", h.namespace));
    h.cp.write_service_account_kubeconfig(&h.namespace, STANDBY, &path)
        .await?;
    Ok(path)
}

#[tokio::test]
async fn a_leader_that_cannot_renew_exits_before_the_standby_takes_over() -> TestResult {
    let (h, _provider, kubeconfig) = setup().await?;
    let standby_kubeconfig = standby_account(&h).await?;
    let timing = Timing::SHORT;
    let mut a =
        ChildController::spawn_candidate(&kubeconfig, &h.namespace, "replica-a", None, timing)?;
    wait_holder(&h, "replica-a", DEADLINE).await?;
    let b = ChildController::spawn_candidate(
        &standby_kubeconfig,
        &h.namespace,
        "replica-b",
        None,
        timing,
    )?;
    h.bound_claim("p", 1, "c1").await?;

    // Watch the Lease: when replica-a's renewals were last seen, and when replica-b took it.
    let started = Instant::now();
    let (mut last_renewal_seen, mut last_renew_time) = (None::<Duration>, None);
    let (mut a_exit, mut b_acquired) = (None, None);
    // Revoking the leader's grant (a RoleBinding of the test's namespace: the administrator's
    // act, as the controller must never be able to grant or revoke its own access) makes
    // every renewal a 403.
    h.revoke_leader_election().await?;
    let revoked = started.elapsed();
    while started.elapsed() < Duration::from_secs(60) && (a_exit.is_none() || b_acquired.is_none())
    {
        if let Some(lease) = h.lease().await? {
            let holder = lease.holder_identity.clone().unwrap_or_default();
            if holder == "replica-a" && lease.renew_time != last_renew_time {
                last_renew_time = lease.renew_time.clone();
                last_renewal_seen = Some(started.elapsed());
            }
            if holder == "replica-b" && b_acquired.is_none() {
                b_acquired = Some(started.elapsed());
            }
        }
        if a_exit.is_none()
            && let Some(status) = a.exited()?
        {
            a_exit = Some((started.elapsed(), status));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (exited_at, status) = a_exit.ok_or("the leader never exited")?;
    let acquired_at = b_acquired.ok_or("the standby never took over")?;
    let renewed_at = last_renewal_seen.ok_or("no renewal seen")?;
    println!(
        "renewals refused from {revoked:?}; last renewal seen {renewed_at:?}; leader exited \
         {exited_at:?} ({status:?}); standby acquired {acquired_at:?}"
    );
    // Exited on its own, with a failure status, not a signal.
    assert_eq!(status.code(), Some(1), "log {}", a.log.display());
    assert!(log_text(&a.log).contains("lost leadership"));
    // Within its renew deadline of the last renewal (plus the watch's polling), well before a
    // lease duration, so before the standby could take over.
    assert!(
        exited_at <= renewed_at + Duration::from_secs_f64(timing.renew_deadline + 0.5),
        "exited {exited_at:?}, last renewal seen {renewed_at:?}"
    );
    assert!(
        exited_at < acquired_at,
        "the standby took over before the leader stopped"
    );
    assert!(log_text(&b.log).contains("became leader"));

    // The new leader serves: a claim made now binds.
    h.create_claim("c2", "p", 3600).await?;
    h.wait_claim("c2", "c2 Bound by the new leader", is_bound)
        .await?;
    Ok(())
}

/// The leader dies at `point` of a bind with a standby running; the standby takes over and
/// completes it: one member per claim, the claim Bound.
async fn leader_crashes_during_bind(point: CrashPoint) -> TestResult {
    let (h, _provider, kubeconfig) = setup().await?;
    let timing = Timing::SHORT;
    let mut a = ChildController::spawn_candidate(
        &kubeconfig,
        &h.namespace,
        "replica-a",
        Some(point.name()),
        timing,
    )?;
    wait_holder(&h, "replica-a", DEADLINE).await?;
    let _b =
        ChildController::spawn_candidate(&kubeconfig, &h.namespace, "replica-b", None, timing)?;
    h.create_pool("p", 1, "InfrastructureReady", json!({}))
        .await?;
    h.wait_available("p", 1).await?;
    let history = History::record(h.admin.clone(), &h.namespace);
    h.create_claim("c", "p", 3600).await?;
    let status = a.wait_exit(DEADLINE).await?;
    assert_eq!(status.signal(), Some(SIGABRT), "log {}", a.log.display());
    let takeover = wait_holder(&h, "replica-b", takeover_bound(timing)).await?;
    // After the takeover: at `after-claim-status` the claim already says Bound, and what is
    // checked is that the new leader neither binds it again nor leaves the pool short.
    let claim = h
        .wait_claim("c", "Bound after the takeover", is_bound)
        .await?;
    println!(
        "{}: the standby took over {takeover:?} after the crash",
        point.name()
    );
    let member = member_name(&claim).ok_or("no member")?;
    // A bound member leaves its pool: look at every VirtualMachine.
    let bound: Vec<String> = h
        .api::<banlieue_api::VirtualMachine>()
        .list(&Default::default())
        .await?
        .items
        .iter()
        .filter(|vm| vm.labels().get(names::LABEL_CLAIM).map(String::as_str) == Some("c"))
        .map(|vm| vm.name_any())
        .collect();
    assert_eq!(bound, [member]);
    // The new leader refills the pool.
    h.wait_available("p", 1).await?;
    history.assert_bound_at_most_once();
    Ok(())
}

/// The leader dies at `point` of a release with a standby running; the standby finishes it.
async fn leader_crashes_during_release(point: CrashPoint) -> TestResult {
    let (h, _provider, kubeconfig) = setup().await?;
    let timing = Timing::SHORT;
    let mut a = ChildController::spawn_candidate(
        &kubeconfig,
        &h.namespace,
        "replica-a",
        Some(point.name()),
        timing,
    )?;
    wait_holder(&h, "replica-a", DEADLINE).await?;
    let _b =
        ChildController::spawn_candidate(&kubeconfig, &h.namespace, "replica-b", None, timing)?;
    let member = h.bound_claim("p", 1, "c").await?;
    let claims = h.api::<VirtualMachineClaim>();
    claims.delete("c", &DeleteParams::default()).await?;
    let status = a.wait_exit(DEADLINE).await?;
    assert_eq!(status.signal(), Some(SIGABRT), "log {}", a.log.display());
    wait_holder(&h, "replica-b", takeover_bound(timing)).await?;
    gone(&claims, "c", "the claim released by the new leader").await?;
    assert!(
        h.api::<banlieue_api::VirtualMachine>()
            .get_opt(&member)
            .await?
            .is_none(),
        "no leaked member"
    );
    h.wait_available("p", 1).await?;
    Ok(())
}

#[tokio::test]
async fn leader_crashes_after_member_patch() -> TestResult {
    leader_crashes_during_bind(CrashPoint::AfterMemberPatch).await
}

#[tokio::test]
async fn leader_crashes_after_claim_status() -> TestResult {
    leader_crashes_during_bind(CrashPoint::AfterClaimStatus).await
}

#[tokio::test]
async fn leader_crashes_after_releasing_status() -> TestResult {
    leader_crashes_during_release(CrashPoint::AfterReleasingStatus).await
}

#[tokio::test]
async fn leader_crashes_after_member_delete() -> TestResult {
    leader_crashes_during_release(CrashPoint::AfterMemberDelete).await
}

//! Pool health: members that do not start in time are replaced with a backoff and named in
//! `Degraded`; refills are capped by `maxProvisioning`.

use std::sync::atomic::Ordering;
use std::time::Duration;

use banlieue_api::VirtualMachinePool;
use banlieue_api::conditions::{self, reasons, status, types};
use serde_json::json;

use crate::support::fake_provider::FakeProvider;
use crate::support::*;

fn degraded(pool: &VirtualMachinePool) -> Option<conditions::Condition> {
    conditions::find(&pool.status.as_ref()?.conditions, types::DEGRADED).cloned()
}

#[tokio::test]
async fn a_member_that_never_starts_is_replaced_after_a_backoff_and_named() -> TestResult {
    let h = Harness::new().await?;
    let provider = FakeProvider::start(h.admin.clone(), &h.namespace);
    provider.controls.ready_gate.store(false, Ordering::SeqCst);
    let controller = h.start_controller().await?;
    h.create_pool(
        "slow",
        1,
        "InfrastructureReady",
        json!({"startupDeadlineSeconds": 2}),
    )
    .await?;
    let first = wait_for_members(&h, "slow", 1).await?;

    let pool = h
        .wait_pool("slow", "Degraded StartupDeadlineExceeded", |s| {
            conditions::find(&s.conditions, types::DEGRADED).is_some_and(|c| {
                c.status == status::TRUE && c.reason == reasons::STARTUP_DEADLINE_EXCEEDED
            })
        })
        .await?;
    let message = degraded(&pool).map(|c| c.message).unwrap_or_default();
    assert!(message.contains(&first[0]), "{message}");
    assert!(message.starts_with("1 members in a row"), "{message}");
    // The failed member is deleted; its replacement waits out the 10 s backoff.
    let replaced = std::time::Instant::now();
    let second = wait_for_new_member(&h, "slow", &first[0]).await?;
    let waited = replaced.elapsed();
    assert!(
        waited >= Duration::from_secs(5),
        "replaced after {waited:?}, before the backoff"
    );

    // The replacement starts: the pool is back at capacity and no longer Degraded.
    provider.controls.ready_gate.store(true, Ordering::SeqCst);
    h.wait_available("slow", 1).await?;
    let pool = h
        .wait_pool("slow", "Degraded=False", |s| {
            conditions::find(&s.conditions, types::DEGRADED)
                .is_some_and(|c| c.status == status::FALSE && c.reason == reasons::MEMBERS_STARTING)
        })
        .await?;
    assert!(degraded(&pool).is_some());
    let members = h.placements("slow").await?;
    assert!(members.iter().any(|m| m.name == second && !m.deleting));
    controller.stop().await
}

#[tokio::test]
async fn max_provisioning_caps_members_being_built() -> TestResult {
    let h = Harness::new().await?;
    let provider = FakeProvider::start(h.admin.clone(), &h.namespace);
    provider.controls.ready_gate.store(false, Ordering::SeqCst);
    let controller = h.start_controller().await?;
    h.create_pool(
        "paced",
        4,
        "InfrastructureReady",
        json!({"maxProvisioning": 2}),
    )
    .await?;
    wait_for_members(&h, "paced", 2).await?;
    // Several resyncs later, still two: neither becomes available, so no third is started.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(h.placements("paced").await?.len(), 2);
    provider.controls.ready_gate.store(true, Ordering::SeqCst);
    h.wait_available("paced", 4).await?;
    controller.stop().await
}

/// Waits until the pool has exactly `n` members not being deleted; returns their names.
async fn wait_for_members(h: &Harness, pool: &str, n: usize) -> TestResult<Vec<String>> {
    Ok(
        banlieue_testenv::control_plane::wait_for("members created", DEADLINE, || async {
            let live: Vec<String> = h
                .placements(pool)
                .await?
                .into_iter()
                .filter(|m| !m.deleting)
                .map(|m| m.name)
                .collect();
            Ok((live.len() == n).then_some(live))
        })
        .await?,
    )
}

/// Waits for a live member other than `old`; returns its name.
async fn wait_for_new_member(h: &Harness, pool: &str, old: &str) -> TestResult<String> {
    Ok(
        banlieue_testenv::control_plane::wait_for("a replacement member", DEADLINE, || async {
            Ok(h.placements(pool)
                .await?
                .into_iter()
                .find(|m| m.name != old && !m.deleting)
                .map(|m| m.name))
        })
        .await?,
    )
}

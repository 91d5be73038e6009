//! The metrics users compare pools by: bind latency and pool hits by warm or cold start, and
//! members by phase.

use std::sync::atomic::Ordering;

use banlieue_controller::member;
use banlieue_controller::metrics::{BindLabels, Metrics, PhaseLabels, START_COLD, START_WARM};

use crate::support::fake_provider::FakeProvider;
use crate::support::*;

fn claims(metrics: &Metrics, namespace: &str, start: &'static str) -> u64 {
    metrics
        .pool_claims
        .get_or_create(&BindLabels {
            namespace: namespace.to_owned(),
            pool: "m".into(),
            start,
        })
        .get()
}

fn members(metrics: &Metrics, namespace: &str, phase: &'static str) -> i64 {
    metrics
        .pool_members
        .get_or_create(&PhaseLabels {
            namespace: namespace.to_owned(),
            pool: "m".into(),
            phase,
        })
        .get()
}

#[tokio::test]
async fn binds_are_counted_warm_or_cold_and_members_by_phase() -> TestResult {
    let h = Harness::new().await?;
    let provider = FakeProvider::start(h.admin.clone(), &h.namespace);
    let controller = h.start_controller().await?;
    let metrics = &controller.metrics;
    let ns = h.namespace.as_str();

    h.create_pool("m", 1, "InfrastructureReady", serde_json::json!({}))
        .await?;
    h.wait_available("m", 1).await?;
    // From now on no new member becomes ready: the refill stays Provisioning.
    provider.controls.ready_gate.store(false, Ordering::SeqCst);

    // A member was waiting: a warm start, a pool hit.
    h.create_claim("first", "m", 3600).await?;
    h.wait_claim("first", "Bound", is_bound).await?;
    // The bind is counted once its status write returns, which the claim's watcher can see
    // first.
    wait_until("the first bind counted", || {
        claims(metrics, ns, START_WARM) + claims(metrics, ns, START_COLD) == 1
    })
    .await?;
    assert_eq!(
        (
            claims(metrics, ns, START_WARM),
            claims(metrics, ns, START_COLD)
        ),
        (1, 0)
    );

    // The next claim waits for the refill: a cold start, a miss.
    h.create_claim("second", "m", 3600).await?;
    wait_until("the refill counted as Provisioning", || {
        members(metrics, ns, member::PHASE_PROVISIONING) == 1
            && members(metrics, ns, member::PHASE_CLAIMED) == 1
    })
    .await?;
    assert_eq!(members(metrics, ns, member::PHASE_AVAILABLE), 0);
    provider.controls.ready_gate.store(true, Ordering::SeqCst);
    h.wait_claim("second", "Bound", is_bound).await?;
    wait_until("the second bind counted", || {
        claims(metrics, ns, START_WARM) + claims(metrics, ns, START_COLD) == 2
    })
    .await?;
    assert_eq!(
        (
            claims(metrics, ns, START_WARM),
            claims(metrics, ns, START_COLD)
        ),
        (1, 1)
    );
    let histogram_text = controller.encoded_metrics()?;
    for series in [
        format!(
            "banlieue_controller_claim_bind_latency_seconds_count{{namespace=\"{ns}\",pool=\"m\",start=\"warm\"}} 1"
        ),
        format!(
            "banlieue_controller_claim_bind_latency_seconds_count{{namespace=\"{ns}\",pool=\"m\",start=\"cold\"}} 1"
        ),
    ] {
        assert!(
            histogram_text.contains(&series),
            "{series} missing from:\n{histogram_text}"
        );
    }

    // The pool refills behind both claims: one Available, two Claimed, nothing in between.
    h.wait_available("m", 1).await?;
    wait_until("members by phase settle", || {
        members(metrics, ns, member::PHASE_AVAILABLE) == 1
            && members(metrics, ns, member::PHASE_CLAIMED) == 2
            && members(metrics, ns, member::PHASE_PROVISIONING) == 0
    })
    .await?;
    controller.stop().await
}

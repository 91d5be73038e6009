//! Chaos: a process of the control plane crashes in the middle of a burst of claims.
//!
//! A pool of warm members, a burst of claims created at a steady rate, and halfway through it
//! etcd or the API server is killed with SIGKILL and started again on its old state, as a
//! control-plane node restart looks to everything else. The controller runs in process as its
//! ServiceAccount under the shipped RBAC; the provider is the contract stand-in, for the
//! machine kind `BANLIEUE_TEST_MACHINE_KIND` names. After the
//! outage every claim must end Bound (there are as many warm members as claims), no member may
//! be bound twice, and no machine or member may be left without its owner.
//!
//! This binary restarts its own control plane, so its tests take turns and no other test
//! binary shares it.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use banlieue_api::names::LABEL_CLAIM;
use banlieue_api::{VirtualMachine, VirtualMachineClaim};
use banlieue_testenv::control_plane::{Component, wait_for};
use kube::api::{ListParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::json;

use support::fake_provider::FakeProvider;
use support::*;

/// Warm members, and claims in the burst.
const CLAIMS: usize = 200;
/// Claims per second in the burst.
const RATE: f64 = 50.0;
/// The crash comes after this many claims were created.
const CRASH_AFTER: usize = CLAIMS / 2;
/// How long the crashed process stays down.
const DOWN_FOR: Duration = Duration::from_secs(3);
/// Filling the pool, and binding every claim after the outage.
const SLOW: Duration = Duration::from_secs(240);

/// How long the members and machines may take to settle once every claim is Bound.
const SETTLE: Duration = Duration::from_secs(60);

/// One test at a time owns the control plane.
static TURN: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn claims_bind_once_each_through_an_api_server_crash() -> TestResult {
    burst_through_a_crash(Component::KubeApiserver).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn claims_bind_once_each_through_an_etcd_crash() -> TestResult {
    burst_through_a_crash(Component::Etcd).await
}

async fn burst_through_a_crash(component: Component) -> TestResult {
    let _turn = TURN.lock().await;
    let h = Harness::new().await?;
    let _provider = FakeProvider::start(h.admin.clone(), &h.namespace);
    let controller = h.start_controller().await?;
    h.create_pool("burst", CLAIMS as i32, "InfrastructureReady", json!({}))
        .await?;
    let filling = Instant::now();
    let pools = h.api::<banlieue_api::VirtualMachinePool>();
    wait_for("the pool to be warm", SLOW, || {
        let pools = pools.clone();
        async move {
            Ok(pools.get_opt("burst").await?.filter(|pool| {
                pool.status
                    .as_ref()
                    .is_some_and(|s| s.available_replicas == CLAIMS as i32)
            }))
        }
    })
    .await?;
    eprintln!(
        "{component:?}: pool of {CLAIMS} warm after {:.1} s",
        filling.elapsed().as_secs_f64()
    );

    // The burst: each claim is created by its own task, which retries through the outage as a
    // user's client would (AlreadyExists after a retry means the first attempt went through).
    let started = Instant::now();
    let interval = Duration::from_secs_f64(1.0 / RATE);
    let mut creators = Vec::new();
    let mut crash = None;
    for i in 0..CLAIMS {
        tokio::time::sleep_until((started + interval * i as u32).into()).await;
        if i == CRASH_AFTER {
            let cp = h.cp;
            crash = Some(tokio::spawn(async move {
                cp.crash_and_restart(component, DOWN_FOR).await
            }));
        }
        let claims = h.api::<VirtualMachineClaim>();
        creators.push(tokio::spawn(create_until_accepted(
            claims,
            format!("c{i:03}"),
        )));
    }
    let readyz_after = crash.ok_or("no crash")?.await??;
    let mut retried = 0;
    for creator in creators {
        retried += creator.await??;
    }
    eprintln!(
        "{component:?}: down {DOWN_FOR:?}, /readyz {:.1} s after the restart; {retried} \
         creates retried through the outage",
        readyz_after.as_secs_f64()
    );

    let claims = h.api::<VirtualMachineClaim>();
    let all_bound = wait_for("every claim to be Bound", SLOW, || {
        let claims = claims.clone();
        async move {
            let list = claims.list(&ListParams::default()).await?.items;
            Ok((list.len() == CLAIMS && list.iter().all(is_bound)).then_some(list))
        }
    })
    .await;
    let list = match all_bound {
        Ok(list) => list,
        Err(error) => {
            for claim in claims.list(&ListParams::default()).await?.items {
                if !is_bound(&claim) {
                    eprintln!(
                        "not bound: {} {:?}",
                        claim.name_any(),
                        bound_condition(&claim)
                    );
                }
            }
            return Err(error.into());
        }
    };
    eprintln!(
        "{component:?}: all {CLAIMS} claims Bound {:.1} s after the burst began; bind \
         conflicts {}, bind answers lost {}",
        started.elapsed().as_secs_f64(),
        controller.metrics.bind_conflicts.get(),
        controller.metrics.bind_outcomes_unknown.get()
    );

    // No member bound twice, and nothing left without its owner. Bound claims come first;
    // the members and machines a crash left half-done are tidied after, so the state is given
    // a while to settle and whatever is still wrong then is reported.
    let settled = Instant::now();
    let last = loop {
        let wrong = violations(&h, &list).await?;
        if wrong.is_empty() || settled.elapsed() > SETTLE {
            break wrong;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert!(
        last.is_empty(),
        "{component:?}: after {SETTLE:?}:\n{}",
        last.join("\n")
    );
    eprintln!(
        "{component:?}: members and machines consistent {:.1} s after every claim was Bound; \
         second members deleted {}",
        settled.elapsed().as_secs_f64(),
        controller.metrics.extra_members_deleted.get()
    );
    assert!(
        controller.is_running(),
        "the controller stopped during the outage"
    );
    controller.stop().await?;
    Ok(())
}

/// What is wrong with the pool's members and machines given the Bound claims `bound`: a
/// member bound twice, a member labelled for a claim that does not name it (or the reverse),
/// a member owned by something other than its pool or its claim, a machine without a live
/// VirtualMachine owning it. Empty when all is well.
async fn violations(h: &Harness, bound: &[VirtualMachineClaim]) -> TestResult<Vec<String>> {
    let mut wrong = Vec::new();
    let mut member_of: BTreeMap<String, String> = BTreeMap::new();
    for claim in bound {
        let member = member_name(claim).ok_or("a Bound claim names no member")?;
        if let Some(other) = member_of.insert(member.clone(), claim.name_any()) {
            wrong.push(format!(
                "{member} is bound to {other} and {}",
                claim.name_any()
            ));
        }
    }
    let vms = h
        .api::<VirtualMachine>()
        .list(&ListParams::default())
        .await?
        .items;
    for vm in &vms {
        let name = vm.name_any();
        let label = vm.labels().get(LABEL_CLAIM);
        let claim = member_of.get(&name);
        if label != claim {
            wrong.push(format!(
                "member {name} is labelled for claim {label:?} but claimed by {claim:?}"
            ));
        }
        let owner = vm
            .owner_references()
            .iter()
            .find(|o| o.controller == Some(true))
            .map(|o| (o.kind.as_str(), o.name.as_str()));
        let expected = match claim {
            Some(claim) => ("VirtualMachineClaim", claim.as_str()),
            None => ("VirtualMachinePool", "burst"),
        };
        if owner != Some(expected) {
            wrong.push(format!(
                "member {name} is owned by {owner:?}, not {expected:?}"
            ));
        }
    }
    let uids: BTreeSet<String> = vms.iter().filter_map(|vm| vm.uid()).collect();
    for machine in h.machines().await? {
        let owner = machine
            .owner_references
            .iter()
            .find(|o| o.controller == Some(true))
            .map(|o| o.uid.clone())
            .unwrap_or_default();
        if !uids.contains(&owner) {
            wrong.push(format!(
                "machine {} has no live VirtualMachine owning it (deleting: {})",
                machine.name, machine.deleting
            ));
        }
    }
    Ok(wrong)
}

/// Creates the claim `name`, retrying through an outage; returns how many retries it took.
async fn create_until_accepted(claims: Api<VirtualMachineClaim>, name: String) -> TestResult<u32> {
    let claim: VirtualMachineClaim = serde_json::from_value(json!({
        "apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachineClaim",
        "metadata": {"name": name},
        "spec": {"poolRef": {"name": "burst"},
                 "subject": {"issuer": "https://issuer.example.com", "id": format!("subject-{name}")},
                 "ttlSeconds": 3600}
    }))?;
    let deadline = Instant::now() + SLOW;
    let mut retries = 0;
    loop {
        match claims.create(&PostParams::default(), &claim).await {
            Ok(_) => return Ok(retries),
            Err(kube::Error::Api(status)) if status.code == 409 && retries > 0 => {
                return Ok(retries);
            }
            // Refused connections, timeouts and 5xx while the process is down.
            Err(_) if Instant::now() < deadline => {
                retries += 1;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(error) => return Err(error.into()),
        }
    }
}

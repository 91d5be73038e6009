//! agent-sandbox v1.0.1 as a real peer, on the test control plane and node: a SandboxWarmPool
//! of the node's pause image fills, a SandboxClaim gets one of its pods (a pod that existed
//! before the claim) and its Sandbox becomes Ready; the claim-to-Ready latency is printed. An
//! ignored test measures a burst of claims on a pool of the same size (run it alone:
//! `cargo test -p banlieue-testenv --test agent_sandbox -- --ignored --nocapture`).

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use banlieue_testenv::agent_sandbox::{self, AgentSandbox, Kind, LAUNCH_TYPE};
use banlieue_testenv::control_plane::{ControlPlane, wait_for};
use futures::{StreamExt as _, TryStreamExt as _};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DynamicObject, ListParams, PostParams};
use kube::runtime::{WatchStreamExt as _, watcher};
use tokio::sync::OnceCell;

const DEADLINE: Duration = Duration::from_secs(120);
const TEMPLATE: &str = "pause";
const POOL: &str = "pause-pool";

/// The control plane and node this binary shares, with agent-sandbox's controller on it.
async fn cluster() -> &'static ControlPlane {
    static AGENT_SANDBOX: OnceCell<AgentSandbox> = OnceCell::const_new();
    let cp = ControlPlane::shared_with_node()
        .await
        .expect("control plane with a node");
    AGENT_SANDBOX
        .get_or_init(|| async { AgentSandbox::start(cp).await.expect("agent-sandbox") })
        .await;
    cp
}

fn api(cp: &ControlPlane, namespace: &str, kind: Kind) -> Api<DynamicObject> {
    Api::namespaced_with(
        cp.client().expect("client"),
        namespace,
        &kind.api_resource(),
    )
}

/// A fresh namespace whose `default` ServiceAccount exists (a Pod is refused until then), with
/// a template of the node's pause image and a warm pool of `replicas` of it, every member Ready.
async fn warm_pool(cp: &ControlPlane, replicas: u32) -> String {
    let ns = cp.fresh_namespace_for_pods().await.expect("namespace");
    api(cp, &ns, Kind::SandboxTemplate)
        .create(
            &PostParams::default(),
            &agent_sandbox::pause_template(TEMPLATE),
        )
        .await
        .expect("create the SandboxTemplate");
    let pool = agent_sandbox::warm_pool(POOL, TEMPLATE, replicas);
    let pools = api(cp, &ns, Kind::SandboxWarmPool);
    let created = Instant::now();
    pools
        .create(&PostParams::default(), &pool)
        .await
        .expect("create the SandboxWarmPool");
    wait_for(
        &format!("the warm pool's {replicas} sandboxes to be Ready"),
        DEADLINE,
        || {
            let pools = pools.clone();
            async move {
                let ready = agent_sandbox::ready_replicas(&pools.get(POOL).await?);
                Ok((ready == u64::from(replicas)).then_some(()))
            }
        },
    )
    .await
    .expect("warm pool Ready");
    eprintln!(
        "warm pool of {replicas}: Ready {:.2} s after its creation",
        created.elapsed().as_secs_f64()
    );
    ns
}

/// The pods of `namespace`, UID by name.
async fn pods(cp: &ControlPlane, namespace: &str) -> BTreeMap<String, String> {
    Api::<Pod>::namespaced(cp.client().expect("client"), namespace)
        .list(&ListParams::default())
        .await
        .expect("list pods")
        .items
        .into_iter()
        .map(|pod| {
            (
                pod.metadata.name.unwrap_or_default(),
                pod.metadata.uid.unwrap_or_default(),
            )
        })
        .collect()
}

/// Creates a claim on the pool for each of `names` at once and returns when each was created
/// (just before its request) and first seen Ready, from a watch opened before the first.
async fn claim_all(
    cp: &ControlPlane,
    namespace: &str,
    names: &[String],
) -> BTreeMap<String, (Instant, Instant)> {
    let claims = api(cp, namespace, Kind::SandboxClaim);
    let wanted: BTreeSet<String> = names.iter().cloned().collect();
    // Listed and watching before the first claim, so no transition to Ready is seen late.
    let mut watch = watcher(claims.clone(), watcher::Config::default())
        .default_backoff()
        .boxed();
    loop {
        let event = watch.try_next().await.expect("watch SandboxClaims");
        if matches!(event, Some(watcher::Event::InitDone) | None) {
            break;
        }
    }
    let mut seen_ready = BTreeMap::new();
    let created = futures::future::join_all(names.iter().map(|name| {
        let claims = claims.clone();
        async move {
            let claim = agent_sandbox::claim(name, POOL);
            let at = Instant::now();
            claims
                .create(&PostParams::default(), &claim)
                .await
                .expect("create a SandboxClaim");
            (name.clone(), at)
        }
    }));
    // Both at once: the watch is polled while the creations run.
    let watched = async {
        while seen_ready.len() < wanted.len() {
            let event = watch
                .try_next()
                .await
                .expect("watch SandboxClaims")
                .expect("the watch does not end");
            let (watcher::Event::Apply(claim) | watcher::Event::InitApply(claim)) = event else {
                continue;
            };
            let name = claim.metadata.name.clone().unwrap_or_default();
            if wanted.contains(&name)
                && agent_sandbox::is_ready(&claim)
                && !seen_ready.contains_key(&name)
            {
                seen_ready.insert(name, Instant::now());
            }
        }
    };
    let (created, ()) = tokio::time::timeout(DEADLINE, async { tokio::join!(created, watched) })
        .await
        .unwrap_or_else(|_| {
            panic!(
                "{} SandboxClaims not all Ready within {DEADLINE:?}",
                names.len()
            )
        });
    created
        .into_iter()
        .map(|(name, at)| {
            let ready_at = seen_ready[&name];
            (name, (at, ready_at))
        })
        .collect()
}

#[tokio::test]
async fn a_claim_gets_a_warm_pod_and_its_sandbox_becomes_ready() {
    let cp = cluster().await;
    let ns = warm_pool(cp, 2).await;
    let warm = pods(cp, &ns).await;
    assert_eq!(warm.len(), 2, "the pool's pods: {warm:?}");

    let timings = claim_all(cp, &ns, &["claim".to_owned()]).await;
    let (created, ready_at) = timings["claim"];
    eprintln!(
        "agent-sandbox: SandboxClaim to Ready in {:.3} s (warm pool of 2, pause image)",
        (ready_at - created).as_secs_f64()
    );

    let claim = api(cp, &ns, Kind::SandboxClaim)
        .get("claim")
        .await
        .expect("the claim");
    let sandbox_name = claim.data["status"]["sandbox"]["name"]
        .as_str()
        .unwrap_or_else(|| panic!("a Ready claim names its Sandbox: {:?}", claim.data))
        .to_owned();
    let sandbox = api(cp, &ns, Kind::Sandbox)
        .get(&sandbox_name)
        .await
        .expect("the claim's Sandbox");
    assert!(
        agent_sandbox::is_ready(&sandbox),
        "the Sandbox is Ready: {:?}",
        sandbox.data
    );
    assert_eq!(
        sandbox
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(LAUNCH_TYPE)),
        Some(&"warm".to_owned()),
        "the Sandbox came from the warm pool"
    );
    // The Sandbox's pod is named after it unless an older adoption recorded another name.
    let pod_name = sandbox
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get("agents.x-k8s.io/pod-name"))
        .cloned()
        .unwrap_or(sandbox_name);
    let pod = Api::<Pod>::namespaced(cp.client().expect("client"), &ns)
        .get(&pod_name)
        .await
        .expect("the Sandbox's pod");
    assert_eq!(
        warm.get(&pod_name),
        pod.metadata.uid.as_ref(),
        "the claim's pod {pod_name} is one that ran before the claim: {warm:?}"
    );
    let running = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    assert_eq!(running, Some("Running"), "the claim's pod runs");
}

/// How long N claims made at once on a pool of N take: p50 of claim-to-Ready, and from the
/// first claim's request to the last claim's Ready.
#[tokio::test]
#[ignore = "a measurement: run alone, with --nocapture"]
async fn burst_of_claims_on_a_warm_pool() {
    let n: usize = std::env::var("BANLIEUE_AGENT_SANDBOX_BURST")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(30);
    let cp = cluster().await;
    let ns = warm_pool(cp, u32::try_from(n).expect("a pool size")).await;
    let warm = pods(cp, &ns).await;
    assert_eq!(warm.len(), n, "the pool's pods");

    let names: Vec<String> = (0..n).map(|i| format!("claim-{i:03}")).collect();
    let timings = claim_all(cp, &ns, &names).await;
    let first = timings.values().map(|(at, _)| *at).min().expect("claims");
    let last = timings.values().map(|(_, at)| *at).max().expect("claims");
    let mut latencies: Vec<Duration> = timings.values().map(|(at, ready)| *ready - *at).collect();
    latencies.sort();
    let at = |q: f64| latencies[((latencies.len() - 1) as f64 * q).round() as usize];

    // Every claim got a pod of the pool, none of them twice.
    let sandboxes: BTreeSet<String> = futures::future::join_all(names.iter().map(|name| {
        let claims = api(cp, &ns, Kind::SandboxClaim);
        async move {
            let claim = claims.get(name).await.expect("a claim");
            claim.data["status"]["sandbox"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned()
        }
    }))
    .await
    .into_iter()
    .collect();
    assert_eq!(sandboxes.len(), n, "one Sandbox per claim: {sandboxes:?}");
    let warm_taken = sandboxes.iter().filter(|s| warm.contains_key(*s)).count();
    eprintln!(
        "agent-sandbox {}: {n} SandboxClaims at once on a warm pool of {n}: claim to Ready \
         p50 {:.3} s, p90 {:.3} s, max {:.3} s; first request to all Ready {:.3} s; \
         {warm_taken} of {n} got a pod of the pool",
        banlieue_testenv::agent_sandbox::VERSION,
        at(0.5).as_secs_f64(),
        at(0.9).as_secs_f64(),
        at(1.0).as_secs_f64(),
        (last - first).as_secs_f64(),
    );
}

//! Benchmarks on the real control plane, ignored by default. Run them with
//!
//! ```text
//! cargo test -p banlieue-controller --release --test perf -- --ignored --nocapture --test-threads 1
//! ```
//!
//! They print figures and assert nothing about time.

mod support;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use banlieue_api::VirtualMachineClaim;
use banlieue_testenv::claim_load::{Usage, api_writes, writes_between};
use banlieue_testenv::control_plane::wait_for;
use futures::StreamExt;
use kube::ResourceExt;
use kube::runtime::watcher;
use serde_json::json;

use support::child::ChildController;
use support::fake_provider::FakeProvider;
use support::*;

const POOL: i32 = 200;

/// Times at which each claim was first seen Bound by a watching client.
fn watch_bound(
    h: &Harness,
) -> (
    Arc<Mutex<HashMap<String, Instant>>>,
    tokio::task::JoinHandle<()>,
) {
    let seen: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let claims = h.api::<VirtualMachineClaim>();
    let record = seen.clone();
    let task = tokio::spawn(async move {
        let mut stream = watcher(claims, watcher::Config::default()).boxed();
        while let Some(event) = stream.next().await {
            if let Ok(watcher::Event::Apply(claim) | watcher::Event::InitApply(claim)) = event
                && is_bound(&claim)
            {
                let mut seen = record.lock().unwrap_or_else(|e| e.into_inner());
                seen.entry(claim.name_any()).or_insert_with(Instant::now);
            }
        }
    });
    (seen, task)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[index.min(sorted.len() - 1)]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

async fn wait_all_bound(
    seen: &Arc<Mutex<HashMap<String, Instant>>>,
    names: &[String],
) -> TestResult {
    let deadline = Duration::from_secs(300);
    wait_for("all claims Bound", deadline, || {
        let seen = seen.clone();
        let names = names.to_vec();
        async move {
            let seen = seen.lock().unwrap_or_else(|e| e.into_inner());
            Ok(names.iter().all(|n| seen.contains_key(n)).then_some(()))
        }
    })
    .await?;
    Ok(())
}

/// The writes between two readings of [`api_writes`], per bound claim, largest first.
fn writes_per_claim(
    before: &BTreeMap<String, f64>,
    after: &BTreeMap<String, f64>,
    claims: usize,
) -> String {
    let rows: Vec<(String, f64)> = writes_between(before, after)
        .into_iter()
        .map(|(resource, n)| (resource, n / claims as f64))
        .filter(|(_, per_claim)| *per_claim >= 0.05)
        .collect();
    let total: f64 = rows.iter().map(|(_, n)| n).sum();
    let detail: Vec<String> = rows
        .iter()
        .map(|(resource, n)| format!("{resource} {n:.1}"))
        .collect();
    format!("{total:.1} writes per claim ({})", detail.join(", "))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark: run with --ignored --release"]
async fn claim_bind_latency_and_burst() -> TestResult {
    let h = Harness::new().await?;
    let _provider = FakeProvider::start(h.admin.clone(), &h.namespace);
    let controller = h.start_controller().await?;
    h.create_pool("bench", POOL, "InfrastructureReady", json!({}))
        .await?;
    let filled = Instant::now();
    h.wait_pool("bench", "warm", |s| s.available_replicas == POOL)
        .await?;
    eprintln!(
        "pool of {POOL}: warm after {:.1} s",
        filled.elapsed().as_secs_f64()
    );
    let (seen, watch) = watch_bound(&h);

    for (rate, count) in [(10u32, 60usize), (50, 150), (100, 200)] {
        h.wait_pool("bench", "warm", |s| s.available_replicas == POOL)
            .await?;
        let conflicts_before = controller.metrics.bind_conflicts.get();
        let writes_before = api_writes(&h.admin).await?;
        let started = Instant::now();
        let interval = Duration::from_secs_f64(1.0 / f64::from(rate));
        let mut created: Vec<(String, tokio::task::JoinHandle<TestResult<Instant>>)> = Vec::new();
        for i in 0..count {
            tokio::time::sleep_until((started + interval * i as u32).into()).await;
            let name = format!("r{rate}-{i:03}");
            let claims = h.api::<VirtualMachineClaim>();
            let claim = claim_object(&name);
            created.push((
                name,
                tokio::spawn(async move {
                    let at = Instant::now();
                    claims.create(&Default::default(), &claim).await?;
                    Ok(at)
                }),
            ));
        }
        let mut sent = HashMap::new();
        for (name, handle) in created {
            sent.insert(name, handle.await??);
        }
        let names: Vec<String> = sent.keys().cloned().collect();
        wait_all_bound(&seen, &names).await?;
        let seen_now = seen.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let mut latencies: Vec<Duration> = sent
            .iter()
            .filter_map(|(name, at)| {
                seen_now
                    .get(name)
                    .map(|bound| bound.saturating_duration_since(*at))
            })
            .collect();
        latencies.sort();
        eprintln!(
            "{rate:>3} claims/s, {count} claims: created->Bound p50 {:.1} ms, p90 {:.1} ms, p99 {:.1} ms, max {:.1} ms; conflicts {}",
            ms(percentile(&latencies, 0.5)),
            ms(percentile(&latencies, 0.9)),
            ms(percentile(&latencies, 0.99)),
            ms(latencies.last().copied().unwrap_or_default()),
            controller.metrics.bind_conflicts.get() - conflicts_before,
        );
        // The pool refilled behind the claims: count the writes of the whole round.
        h.wait_pool("bench", "warm", |s| s.available_replicas == POOL)
            .await?;
        eprintln!(
            "{rate:>3} claims/s: {}",
            writes_per_claim(&writes_before, &api_writes(&h.admin).await?, count)
        );
    }

    // Burst: 200 claims at once against 200 warm members.
    h.wait_pool("bench", "warm", |s| s.available_replicas == POOL)
        .await?;
    let conflicts_before = controller.metrics.bind_conflicts.get();
    let started = Instant::now();
    let creates = (0..POOL).map(|i| {
        let claims = h.api::<VirtualMachineClaim>();
        async move {
            claims
                .create(&Default::default(), &claim_object(&format!("burst-{i:03}")))
                .await
        }
    });
    for result in futures::future::join_all(creates).await {
        result?;
    }
    let created_after = started.elapsed();
    let names: Vec<String> = (0..POOL).map(|i| format!("burst-{i:03}")).collect();
    wait_all_bound(&seen, &names).await?;
    let all_bound = seen
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .filter(|(n, _)| n.starts_with("burst-"))
        .map(|(_, at)| at.saturating_duration_since(started))
        .max()
        .unwrap_or_default();
    eprintln!(
        "burst of {POOL} claims vs {POOL} warm members: all created after {:.0} ms, all Bound after {:.0} ms; conflicts {}",
        ms(created_after),
        ms(all_bound),
        controller.metrics.bind_conflicts.get() - conflicts_before
    );
    watch.abort();
    controller.stop().await?;
    Ok(())
}

fn claim_object(name: &str) -> VirtualMachineClaim {
    VirtualMachineClaim::new(
        name,
        banlieue_api::VirtualMachineClaimSpec {
            pool_ref: banlieue_api::LocalObjectReference::new("bench"),
            subject: banlieue_api::ClaimSubject {
                issuer: "https://issuer.example.com".into(),
                id: format!("subject-{name}"),
            },
            ttl_seconds: 3600,
            access: None,
            handover: None,
        },
    )
}

/// Resident memory (KiB) and CPU time (clock ticks) of a process, from /proc.
fn usage(pid: u32) -> TestResult<(u64, u64)> {
    let usage = Usage::of(pid)?;
    Ok((
        usage.rss_kib,
        (usage.cpu.as_secs_f64() * 100.0).round() as u64,
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark: run with --ignored --release"]
async fn controller_rss_and_cpu_with_1000_members() -> TestResult {
    scale("1,000 members in one pool", 1, 1000).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark: run with --ignored --release"]
async fn controller_rss_and_cpu_with_5000_members_in_50_pools() -> TestResult {
    scale("5,000 members in 50 pools", 50, 100).await
}

/// Sum of `availableReplicas` over the namespace's pools.
async fn available_members(h: &Harness) -> Result<i32, kube::Error> {
    Ok(h.api::<banlieue_api::VirtualMachinePool>()
        .list(&Default::default())
        .await?
        .items
        .iter()
        .filter_map(|p| p.status.as_ref().map(|s| s.available_replicas))
        .sum())
}

/// The controller as its own process filling `pools` pools of `per_pool` members with the
/// contract stand-in as provider: the fill rate, its resident set and CPU while filling and
/// idle, and, after a restart with one member of every pool deleted while it was down, the
/// time from its start until every pool is whole again (lists of every cache, the deleted
/// members' finalizers, then one reconcile of each pool and the replacements made ready).
async fn scale(label: &str, pools: i32, per_pool: i32) -> TestResult {
    let members = pools * per_pool;
    let h = Harness::new().await?;
    let _provider = FakeProvider::start(h.admin.clone(), &h.namespace);
    let kubeconfig = h.controller_kubeconfig(&std::env::temp_dir()).await?;
    // Production's resync period, so idle CPU is what a deployed controller spends.
    let resync = banlieue_controller::ControllerConfig::default().resync;
    let mut child = ChildController::spawn_with_resync(&kubeconfig, &h.namespace, 1, resync, &[])?;
    let pid = child.pid();
    let (rss_start, _) = usage(pid)?;
    let started = Instant::now();
    for pool in 0..pools {
        h.create_pool(
            &format!("p{pool}"),
            per_pool,
            "InfrastructureReady",
            json!({}),
        )
        .await?;
    }
    let peak = Arc::new(std::sync::atomic::AtomicU64::new(rss_start));
    let fill_deadline = Duration::from_secs(60 + members as u64 / 5);
    wait_for(&format!("{members} warm members"), fill_deadline, || {
        let h = &h;
        let peak = peak.clone();
        async move {
            if let Ok((rss, _)) = usage(pid) {
                peak.fetch_max(rss, std::sync::atomic::Ordering::SeqCst);
            }
            Ok((available_members(h).await? == members).then_some(()))
        }
    })
    .await?;
    let (_, ticks_filled) = usage(pid)?;
    let fill = started.elapsed();
    let idle = Duration::from_secs(30);
    tokio::time::sleep(idle).await; // steady state: measure what idle warm pools cost
    let (rss_idle, ticks_idle) = usage(pid)?;

    // Down: one member of every pool goes; up again: how long until all are replaced.
    child.kill()?;
    let vms = h.api::<banlieue_api::VirtualMachine>();
    for pool in 0..pools {
        let member = vms
            .list(
                &kube::api::ListParams::default()
                    .labels(&format!("{}=p{pool}", banlieue_api::names::LABEL_POOL)),
            )
            .await?
            .items
            .into_iter()
            .next()
            .ok_or("a pool without members")?;
        vms.delete(&member.name_any(), &Default::default()).await?;
    }
    let restarted = Instant::now();
    let child = ChildController::spawn_with_resync(&kubeconfig, &h.namespace, 2, resync, &[])?;
    // The pools' statuses still count the deleted members: wholeness is read off the members.
    wait_for("every pool whole again", Duration::from_secs(300), || {
        let vms = vms.clone();
        async move {
            let listed = vms.list(&Default::default()).await?.items;
            let deleting = listed
                .iter()
                .filter(|vm| vm.metadata.deletion_timestamp.is_some())
                .count();
            let ready = listed
                .iter()
                .filter(|vm| {
                    vm.status.as_ref().is_some_and(|s| {
                        banlieue_api::conditions::is_true(
                            &s.conditions,
                            banlieue_api::conditions::types::READY,
                        )
                    })
                })
                .count() as i32;
            Ok((deleting == 0 && ready == members).then_some(()))
        }
    })
    .await?;
    let whole_again = restarted.elapsed();
    let (rss_resynced, _) = usage(child.pid())?;
    let hz = 100.0;
    eprintln!(
        "{label}: filled in {:.1} s ({:.0} members/s) using {:.1} s CPU; RSS at start {:.1} MiB, \
         peak while filling {:.1} MiB, idle {:.1} MiB; idle CPU {:.2}% over {} s (resync {} s); \
         restarted with {pools} members gone: whole again after {:.1} s, RSS {:.1} MiB",
        fill.as_secs_f64(),
        members as f64 / fill.as_secs_f64(),
        ticks_filled as f64 / hz,
        rss_start as f64 / 1024.0,
        peak.load(std::sync::atomic::Ordering::SeqCst).max(rss_idle) as f64 / 1024.0,
        rss_idle as f64 / 1024.0,
        (ticks_idle - ticks_filled) as f64 / hz / idle.as_secs_f64() * 100.0,
        idle.as_secs(),
        resync.as_secs(),
        whole_again.as_secs_f64(),
        rss_resynced as f64 / 1024.0,
    );
    Ok(())
}

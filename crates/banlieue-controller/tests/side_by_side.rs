//! banlieue and agent-sandbox side by side: the same load generator
//! (`banlieue_testenv::claim_load`) drives VirtualMachineClaims on a VirtualMachinePool and
//! SandboxClaims on a SandboxWarmPool, on one control plane with one real node, one system at a
//! time, with the same Poisson arrivals (one seed per run and rate) and the same burst.
//!
//! - banlieue: the controller as its own process (the standalone binary, production resync),
//!   running as its ServiceAccount with the shipped ClusterRole; members are LibvirtMachines
//!   made ready by the contract stand-in (`support::fake_provider`), ~100 ms after they appear.
//! - agent-sandbox v1.0.1: its controller as its own process under its ServiceAccount and the
//!   RBAC it ships; members are pods of the node's pause image, run by the node's kubelet and
//!   containerd.
//!
//! The benchmark (ignored; run it alone, with nothing else on the machine):
//!
//! ```text
//! cargo test -p banlieue-controller --release --test side_by_side -- --ignored --nocapture
//! ```
//!
//! Its knobs: `BANLIEUE_SIDE_BY_SIDE_RUNS` (3), `…_SECONDS` (each rate's arrival window, 5),
//! `…_POOL` (the warm pool and the burst, 300), `…_RATES` (`10,45,100`), `…_DWELL_MS` (how
//! long a claim is held once ready before it is deleted, 1000), `…_QUIET` (how idle the machine
//! must be, over 3 s, before each phase, 0.7), `…_SYSTEMS` (`banlieue` or `agent-sandbox` alone;
//! both by default), `…_CONCURRENT_RECONCILES` (banlieue's `--concurrent-reconciles`; its
//! default otherwise, 32). The smoke test runs the same
//! code at a tiny rate, so it cannot rot.

mod support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use banlieue_api::{VirtualMachine, VirtualMachineClaim, VirtualMachinePool};
use banlieue_testenv::agent_sandbox::{self, AgentSandbox, Kind};
use banlieue_testenv::claim_load::{
    self, Arrivals, ClaimSystem, UsageWindow, api_writes, writes_between,
};
use banlieue_testenv::control_plane::{ControlPlane, wait_for};
use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, ListParams, PostParams};
use serde_json::json;
use tokio::sync::OnceCell;

use support::child::ChildController;
use support::fake_provider::FakeProvider;
use support::{Harness, TestResult, is_bound};

/// Filling a pool of hundreds of pods on two cores takes minutes.
const FILL_DEADLINE: Duration = Duration::from_secs(900);
const PHASE_DEADLINE: Duration = Duration::from_secs(600);
const POOL: &str = "bench";
const QUIET_DEADLINE: Duration = Duration::from_secs(300);
const QUIET_WINDOW: Duration = Duration::from_secs(3);

/// What one run of one system is asked to do.
#[derive(Clone, Debug)]
struct Load {
    pool: usize,
    rates: Vec<f64>,
    window: Duration,
    dwell: Duration,
    /// Before each phase, wait (up to [`QUIET_DEADLINE`]) until the machine is at least this
    /// idle: a teardown's processes outlive its objects.
    quiet: Option<f64>,
    /// Which systems run (both unless `…_SYSTEMS` names one).
    systems: Vec<&'static str>,
}

impl Load {
    fn from_env() -> Self {
        let var = |name: &str| std::env::var(format!("BANLIEUE_SIDE_BY_SIDE_{name}")).ok();
        let number = |name: &str, default: f64| {
            var(name).map_or(default, |v| {
                v.parse()
                    .unwrap_or_else(|_| panic!("BANLIEUE_SIDE_BY_SIDE_{name}={v} is no number"))
            })
        };
        Self {
            pool: number("POOL", 300.0) as usize,
            rates: var("RATES").map_or(vec![10.0, 45.0, 100.0], |v| {
                v.split(',')
                    .map(|r| r.trim().parse().expect("a rate in claims/s"))
                    .collect()
            }),
            window: Duration::from_secs_f64(number("SECONDS", 5.0)),
            dwell: Duration::from_millis(number("DWELL_MS", 1000.0) as u64),
            quiet: Some(number("QUIET", 0.7)),
            systems: ["agent-sandbox", "banlieue"]
                .into_iter()
                .filter(|system| var("SYSTEMS").is_none_or(|v| v.split(',').any(|s| s == *system)))
                .collect(),
        }
    }
}

/// The figures of one phase (a rate, or the burst) of one system in one run.
#[derive(Clone, Debug, Default)]
struct Phase {
    claims: usize,
    latency: claim_load::Quantiles,
    time_to_all: Duration,
    writes_per_claim: f64,
    largest_writes: Vec<(String, f64)>,
    cpu: Duration,
    peak_rss_kib: u64,
    /// Members made warm per second, from the first claim until the pool was full again.
    refill_per_second: f64,
}

/// The control plane with a node, agent-sandbox's controller on it.
async fn cluster() -> TestResult<(&'static ControlPlane, u32)> {
    static AGENT_SANDBOX: OnceCell<AgentSandbox> = OnceCell::const_new();
    let cp = ControlPlane::shared_with_node().await?;
    let agent_sandbox = AGENT_SANDBOX
        .get_or_try_init(|| AgentSandbox::start(cp))
        .await?;
    Ok((cp, agent_sandbox.pid()))
}

struct Banlieue {
    harness: Harness,
    controller: ChildController,
    _provider: FakeProvider,
}

impl Banlieue {
    async fn start(cp: &'static ControlPlane, run: u32, pool: usize) -> TestResult<Self> {
        let harness = Harness::on(cp).await?;
        let provider = FakeProvider::start(harness.admin.clone(), &harness.namespace);
        let kubeconfig = harness.controller_kubeconfig(&std::env::temp_dir()).await?;
        let resync = banlieue_controller::ControllerConfig::default().resync;
        // The production bound unless the knob names another (0: none).
        let concurrency = std::env::var("BANLIEUE_SIDE_BY_SIDE_CONCURRENT_RECONCILES").ok();
        let flags: Vec<&str> = match &concurrency {
            Some(n) => vec!["--concurrent-reconciles", n],
            None => Vec::new(),
        };
        let controller = ChildController::spawn_with_resync(
            &kubeconfig,
            &harness.namespace,
            run,
            resync,
            &flags,
        )?;
        harness
            .create_pool(POOL, i32::try_from(pool)?, "InfrastructureReady", json!({}))
            .await?;
        Ok(Self {
            harness,
            controller,
            _provider: provider,
        })
    }

    /// Deletes the pool and waits until its members are gone.
    async fn stop(self) -> TestResult {
        let pools: Api<VirtualMachinePool> = self.harness.api();
        pools.delete(POOL, &DeleteParams::background()).await?;
        let vms: Api<VirtualMachine> = self.harness.api();
        all_gone(&vms, "banlieue's members", FILL_DEADLINE).await?;
        drop(self.controller);
        Ok(())
    }
}

impl ClaimSystem for Banlieue {
    fn name(&self) -> &str {
        "banlieue"
    }

    fn claims(&self) -> Api<DynamicObject> {
        Api::namespaced_with(
            self.harness.admin.clone(),
            &self.harness.namespace,
            &ApiResource::erase::<VirtualMachineClaim>(&()),
        )
    }

    fn claim(&self, name: &str) -> DynamicObject {
        let claim = VirtualMachineClaim::new(
            name,
            banlieue_api::VirtualMachineClaimSpec {
                pool_ref: banlieue_api::LocalObjectReference::new(POOL),
                subject: banlieue_api::ClaimSubject {
                    issuer: "https://issuer.example.com".into(),
                    id: format!("subject-{name}"),
                },
                ttl_seconds: 3600,
            },
        );
        serde_json::from_value(serde_json::to_value(claim).expect("a claim serialises"))
            .expect("a claim is an object")
    }

    fn is_ready(&self, claim: &DynamicObject) -> bool {
        claim
            .clone()
            .try_parse::<VirtualMachineClaim>()
            .is_ok_and(|claim| is_bound(&claim))
    }

    async fn warm(&self) -> claim_load::Result<usize> {
        let pool = self
            .harness
            .api::<VirtualMachinePool>()
            .get(POOL)
            .await
            .map_err(|source| claim_load::Error::Kube {
                what: "read banlieue's pool".into(),
                source,
            })?;
        Ok(pool
            .status
            .map_or(0, |s| usize::try_from(s.available_replicas).unwrap_or(0)))
    }

    fn controller_pid(&self) -> u32 {
        self.controller.pid()
    }
}

struct AgentSandboxPool {
    admin: Client,
    namespace: String,
    pid: u32,
}

impl AgentSandboxPool {
    async fn start(cp: &ControlPlane, pid: u32, pool: usize) -> TestResult<Self> {
        let namespace = cp.fresh_namespace_for_pods().await?;
        let admin = cp.client()?;
        let this = Self {
            admin,
            namespace,
            pid,
        };
        this.api(Kind::SandboxTemplate)
            .create(&PostParams::default(), &agent_sandbox::pause_template(POOL))
            .await?;
        this.api(Kind::SandboxWarmPool)
            .create(
                &PostParams::default(),
                &agent_sandbox::warm_pool(POOL, POOL, u32::try_from(pool)?),
            )
            .await?;
        Ok(this)
    }

    fn api(&self, kind: Kind) -> Api<DynamicObject> {
        Api::namespaced_with(self.admin.clone(), &self.namespace, &kind.api_resource())
    }

    /// Deletes the pool and waits until every pod of the namespace is gone, so the next
    /// system's phases do not share the node with a teardown.
    async fn stop(self) -> TestResult {
        self.api(Kind::SandboxWarmPool)
            .delete(POOL, &DeleteParams::background())
            .await?;
        let pods: Api<Pod> = Api::namespaced(self.admin.clone(), &self.namespace);
        all_gone(&pods, "agent-sandbox's pods", FILL_DEADLINE).await
    }
}

impl ClaimSystem for AgentSandboxPool {
    fn name(&self) -> &str {
        "agent-sandbox"
    }

    fn claims(&self) -> Api<DynamicObject> {
        self.api(Kind::SandboxClaim)
    }

    fn claim(&self, name: &str) -> DynamicObject {
        agent_sandbox::claim(name, POOL)
    }

    fn is_ready(&self, claim: &DynamicObject) -> bool {
        agent_sandbox::is_ready(claim)
    }

    async fn warm(&self) -> claim_load::Result<usize> {
        let pool = self
            .api(Kind::SandboxWarmPool)
            .get(POOL)
            .await
            .map_err(|source| claim_load::Error::Kube {
                what: "read agent-sandbox's warm pool".into(),
                source,
            })?;
        Ok(usize::try_from(agent_sandbox::ready_replicas(&pool)).unwrap_or(usize::MAX))
    }

    fn controller_pid(&self) -> u32 {
        self.pid
    }
}

/// Waits until `api` lists nothing (deleted objects may wait on finalizers, pods on the kubelet).
async fn all_gone<K>(api: &Api<K>, what: &str, deadline: Duration) -> TestResult
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    wait_for(&format!("{what} gone"), deadline, || async {
        Ok(api
            .list(&ListParams::default())
            .await?
            .items
            .is_empty()
            .then_some(()))
    })
    .await?;
    Ok(())
}

/// One phase: from a full pool, `arrivals`, then until the pool is full again and every claim
/// is gone (deleted `dwell` after it was ready, or all at once after a burst), so the writes
/// counted are the whole of what the claims cost, refill and release included.
async fn phase(
    system: &impl ClaimSystem,
    admin: &Client,
    pool: usize,
    prefix: &str,
    arrivals: Arrivals,
    dwell: Option<Duration>,
    quiet: Option<f64>,
) -> TestResult<Phase> {
    claim_load::wait_warm(system, pool, FILL_DEADLINE).await?;
    if let Some(min_idle) = quiet {
        match claim_load::wait_quiet(min_idle, QUIET_WINDOW, QUIET_DEADLINE).await {
            Ok(idle) => eprintln!("{prefix}: machine {:.0}% idle", idle * 100.0),
            Err(e) => eprintln!("{prefix}: measured anyway: {e}"),
        }
    }
    let writes_before = api_writes(admin).await?;
    let usage = UsageWindow::start(system.controller_pid())?;
    let outcome = claim_load::drive(system, prefix, arrivals, dwell, PHASE_DEADLINE).await?;
    let refilled = claim_load::wait_warm(system, pool, FILL_DEADLINE).await?;
    if dwell.is_none() {
        let claims = system.claims();
        for claim in &outcome.claims {
            claims
                .delete(&claim.name, &DeleteParams::background())
                .await?;
        }
    }
    let what = format!("{}'s claims", system.name());
    all_gone(&system.claims(), &what, PHASE_DEADLINE).await?;
    let writes = writes_between(&writes_before, &api_writes(admin).await?);
    let usage = usage.stop()?;
    let claims = outcome.claims.len();
    let refill_from = outcome.first_request().unwrap_or(refilled);
    let total: f64 = writes.iter().map(|(_, n)| n).sum();
    Ok(Phase {
        claims,
        latency: outcome.quantiles(),
        time_to_all: outcome.time_to_all(),
        writes_per_claim: total / claims.max(1) as f64,
        largest_writes: writes
            .into_iter()
            .take(6)
            .map(|(resource, n)| (resource, n / claims.max(1) as f64))
            .collect(),
        cpu: usage.cpu,
        peak_rss_kib: usage.peak_rss_kib,
        refill_per_second: claims as f64
            / refilled
                .saturating_duration_since(refill_from)
                .as_secs_f64(),
    })
}

/// Every phase of `load` on one system: each rate, then the burst.
async fn phases(
    system: &impl ClaimSystem,
    admin: &Client,
    load: &Load,
    run: u32,
) -> TestResult<BTreeMap<String, Phase>> {
    let filling = Instant::now();
    claim_load::wait_warm(system, load.pool, FILL_DEADLINE).await?;
    eprintln!(
        "run {run}, {}: pool of {} warm after {:.1} s",
        system.name(),
        load.pool,
        filling.elapsed().as_secs_f64()
    );
    let mut phases = BTreeMap::new();
    for (i, rate) in load.rates.iter().enumerate() {
        // One seed per run and rate: both systems see the same arrivals.
        let arrivals = Arrivals::Poisson {
            rate: *rate,
            duration: load.window,
            seed: u64::from(run) * 1_000 + i as u64,
        };
        let name = format!("{rate}/s");
        let measured = phase(
            system,
            admin,
            load.pool,
            &format!("r{i}-run{run}"),
            arrivals,
            Some(load.dwell),
            load.quiet,
        )
        .await?;
        report(system.name(), run, &name, &measured);
        phases.insert(name, measured);
    }
    let burst = Arrivals::Burst { count: load.pool };
    let measured = phase(
        system,
        admin,
        load.pool,
        &format!("burst-run{run}"),
        burst,
        None,
        load.quiet,
    )
    .await?;
    report(system.name(), run, "burst", &measured);
    phases.insert("burst".into(), measured);
    Ok(phases)
}

fn report(system: &str, run: u32, phase: &str, p: &Phase) {
    let writes: Vec<String> = p
        .largest_writes
        .iter()
        .map(|(resource, n)| format!("{resource} {n:.1}"))
        .collect();
    eprintln!(
        "run {run}, {system}, {phase}: {} claims, ready p50 {:.1} ms, p90 {:.1} ms, p99 {:.1} ms, \
         max {:.1} ms, all after {:.2} s; {:.1} writes per claim ({}); controller CPU {:.2} s, \
         peak RSS {:.1} MiB; refill {:.1} members/s",
        p.claims,
        ms(p.latency.p50),
        ms(p.latency.p90),
        ms(p.latency.p99),
        ms(p.latency.max),
        p.time_to_all.as_secs_f64(),
        p.writes_per_claim,
        writes.join(", "),
        p.cpu.as_secs_f64(),
        p.peak_rss_kib as f64 / 1024.0,
        p.refill_per_second,
    );
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Runs `load` `runs` times on both systems, alternating which goes first, and returns each
/// system's phases of each run.
async fn side_by_side(
    load: &Load,
    runs: u32,
) -> TestResult<BTreeMap<&'static str, Vec<BTreeMap<String, Phase>>>> {
    let (cp, agent_sandbox_pid) = cluster().await?;
    let admin = cp.client()?;
    let mut results: BTreeMap<&'static str, Vec<BTreeMap<String, Phase>>> = BTreeMap::new();
    for run in 1..=runs {
        let banlieue_first = run % 2 == 0;
        for turn in 0..2 {
            let banlieue_turn = (turn == 0) == banlieue_first;
            if !load.systems.contains(&if banlieue_turn {
                "banlieue"
            } else {
                "agent-sandbox"
            }) {
                continue;
            }
            if banlieue_turn {
                let system = Banlieue::start(cp, run, load.pool).await?;
                let measured = phases(&system, &admin, load, run).await?;
                system.stop().await?;
                results.entry("banlieue").or_default().push(measured);
            } else {
                let system = AgentSandboxPool::start(cp, agent_sandbox_pid, load.pool).await?;
                let measured = phases(&system, &admin, load, run).await?;
                system.stop().await?;
                results.entry("agent-sandbox").or_default().push(measured);
            }
        }
    }
    Ok(results)
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(f64::NAN)
}

/// One markdown table: each figure's median over the runs for both systems, banlieue's over
/// agent-sandbox's, and every run's value.
fn table(results: &BTreeMap<&'static str, Vec<BTreeMap<String, Phase>>>, load: &Load) -> String {
    type Figure = (&'static str, fn(&Phase) -> f64);
    let figures: [Figure; 8] = [
        ("p50 ms", |p| ms(p.latency.p50)),
        ("p90 ms", |p| ms(p.latency.p90)),
        ("p99 ms", |p| ms(p.latency.p99)),
        ("first claim to all ready, s", |p| {
            p.time_to_all.as_secs_f64()
        }),
        ("API writes per claim", |p| p.writes_per_claim),
        ("controller CPU s", |p| p.cpu.as_secs_f64()),
        ("controller peak RSS MiB", |p| {
            p.peak_rss_kib as f64 / 1024.0
        }),
        ("refill, members/s", |p| p.refill_per_second),
    ];
    let mut phase_names: Vec<String> = load.rates.iter().map(|r| format!("{r}/s")).collect();
    phase_names.push("burst".into());
    let mut out = String::from(
        "| phase | figure | agent-sandbox (runs) | banlieue (runs) | banlieue / agent-sandbox |\n\
         |---|---|---|---|---|\n",
    );
    for phase in &phase_names {
        for (figure, value) in &figures {
            let values = |system: &str| -> Vec<f64> {
                results
                    .get(system)
                    .into_iter()
                    .flatten()
                    .filter_map(|run| run.get(phase).map(value))
                    .collect()
            };
            let (theirs, ours) = (values("agent-sandbox"), values("banlieue"));
            let runs = |v: &[f64]| {
                v.iter()
                    .map(|x| format!("{x:.1}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            let (m_theirs, m_ours) = (median(theirs.clone()), median(ours.clone()));
            out.push_str(&format!(
                "| {phase} | {figure} | **{m_theirs:.1}** ({}) | **{m_ours:.1}** ({}) | {:.2} |\n",
                runs(&theirs),
                runs(&ours),
                m_ours / m_theirs,
            ));
        }
    }
    out
}

/// The harness at a tiny rate: both systems get every claim ready, each phase counts its
/// writes and the controllers' usage, and the pools refill.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_benchmark_harness_runs_both_systems_at_a_tiny_rate() -> TestResult {
    let load = Load {
        pool: 3,
        rates: vec![2.0],
        window: Duration::from_secs(2),
        dwell: Duration::from_millis(200),
        // The suite runs other jobs beside this one: the machine is never quiet.
        quiet: None,
        systems: vec!["agent-sandbox", "banlieue"],
    };
    let results = side_by_side(&load, 1).await?;
    for system in ["agent-sandbox", "banlieue"] {
        let run = &results[system][0];
        let poisson = &run["2/s"];
        let expected = Arrivals::Poisson {
            rate: 2.0,
            duration: load.window,
            seed: 1_000,
        }
        .offsets()
        .len();
        assert!(expected > 0, "the smoke run's seed gives arrivals");
        assert_eq!(
            poisson.claims, expected,
            "{system}: every arrival was a claim"
        );
        let burst = &run["burst"];
        assert_eq!(
            burst.claims, load.pool,
            "{system}: the burst claimed the pool"
        );
        for (name, phase) in run {
            assert!(
                phase.latency.p50 > Duration::ZERO && phase.latency.max <= PHASE_DEADLINE,
                "{system} {name}: latencies measured: {phase:?}"
            );
            // At least the claim's create and its delete, whatever else the system writes.
            assert!(
                phase.writes_per_claim >= 2.0,
                "{system} {name}: writes counted: {phase:?}"
            );
            assert!(
                phase.peak_rss_kib > 0 && phase.refill_per_second > 0.0,
                "{system} {name}: usage and refill measured: {phase:?}"
            );
        }
    }
    eprintln!("{}", table(&results, &load));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark: run alone with --ignored --release --nocapture"]
async fn banlieue_and_agent_sandbox_side_by_side() -> TestResult {
    let load = Load::from_env();
    let runs: u32 = std::env::var("BANLIEUE_SIDE_BY_SIDE_RUNS")
        .ok()
        .map_or(3, |v| v.parse().expect("a number of runs"));
    eprintln!("side by side: {load:?}, {runs} runs");
    let results = side_by_side(&load, runs).await?;
    eprintln!("{}", table(&results, &load));
    Ok(())
}

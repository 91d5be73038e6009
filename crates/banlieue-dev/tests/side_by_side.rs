//! banlieue and agent-sandbox side by side: the same load generator
//! (`banlieue_testenv::claim_load`) drives VirtualMachineClaims on a VirtualMachinePool and
//! SandboxClaims on a SandboxWarmPool, on one control plane with one real node, one system at a
//! time, with the same Poisson arrivals (one seed per run and rate) and the same burst.
//!
//! - banlieue: the controller as its own process (the standalone binary, production resync),
//!   running as its ServiceAccount with the shipped ClusterRole; members are LibvirtMachines
//!   made ready by the contract stand-in (`support::fake_provider`), ~100 ms after they appear.
//! - banlieue-libvirt: the same controller; members are real domains of a local libvirtd,
//!   realised by the libvirt provider's workload (in this process, as the ServiceAccount the
//!   Provider operator made for it, as `banlieue-dev up` runs it): `dev up --guest none`'s
//!   disk under TCG (a boot sector that halts the vCPU), 32 MiB. Each claim's release
//!   destroys a QEMU process and the refill starts another.
//! - agent-sandbox v1.0.1: its controller as its own process under its ServiceAccount and the
//!   RBAC it ships; members are pods of the node's pause image, run by the node's kubelet and
//!   containerd.
//!
//! The benchmark (ignored; run it alone, with nothing else on the machine):
//!
//! ```text
//! cargo test -p banlieue-dev --release --test side_by_side -- --ignored --nocapture
//! ```
//!
//! Its knobs: `BANLIEUE_SIDE_BY_SIDE_RUNS` (3), `…_SECONDS` (each rate's arrival window, 5),
//! `…_POOL` (the warm pool and the burst, 300), `…_RATES` (`10,45,100`), `…_DWELL_MS` (how
//! long a claim is held once ready before it is deleted, 1000), `…_QUIET` (how idle the machine
//! must be, over 3 s, before each phase, 0.7), `…_SYSTEMS` (a comma-separated subset of
//! `agent-sandbox`, `banlieue` and `banlieue-libvirt`; all three by default),
//! `…_CONCURRENT_RECONCILES` (banlieue's `--concurrent-reconciles`; its
//! default otherwise, 32). The smoke test runs the same
//! code at a tiny rate, so it cannot rot.

// The controller's test support (its fixtures, the contract stand-in, the controller as a child
// process), shared rather than copied. The benchmark lives here, not beside that support,
// because it also needs `banlieue-dev`'s wiring, which depends on the controller: as the
// controller's test it made banlieue-controller dev-depend on a crate that depends on it.
#[path = "../../banlieue-controller/tests/support/mod.rs"]
mod support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use banlieue_api::names::SYSTEM_NAMESPACE;
use banlieue_api::{VMClass, VirtualMachine, VirtualMachineClaim, VirtualMachinePool};
use banlieue_dev::objects;
use banlieue_provider_libvirt::domain_xml::DomainType;
use banlieue_testenv::agent_sandbox::{self, AgentSandbox, Kind};
use banlieue_testenv::claim_load::{
    self, Arrivals, ClaimSystem, UsageWindow, api_writes, writes_between,
};
use banlieue_testenv::control_plane::{ControlPlane, wait_for};
use banlieue_testenv::libvirtd::{Libvirtd, LibvirtdOptions};
use banlieue_testenv::node::pod_is_ready;
use k8s_openapi::api::core::v1::{Event, Node, Pod};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::Client;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, ListParams, PostParams};
use serde_json::json;
use tokio::sync::OnceCell;
use tokio_util::sync::CancellationToken;

use support::child::ChildController;
use support::fake_provider::FakeProvider;
use support::{Harness, TestResult, is_bound};

/// Filling a pool of hundreds of pods on two cores takes minutes.
const FILL_DEADLINE: Duration = Duration::from_secs(900);
const PHASE_DEADLINE: Duration = Duration::from_secs(600);
const POOL: &str = "bench";
/// The systems, in the order of the first run (each later run starts one further along).
const AGENT_SANDBOX: &str = "agent-sandbox";
const BANLIEUE: &str = "banlieue";
const BANLIEUE_LIBVIRT: &str = "banlieue-libvirt";
const SYSTEMS: [&str; 3] = [AGENT_SANDBOX, BANLIEUE, BANLIEUE_LIBVIRT];
/// The libvirt members' class: no OS, so as little memory as SeaBIOS needs; 300 of them
/// fit the host's memory (the scheduler counts each member's class).
const EMPTY_CLASS: &str = "bench-empty";
const EMPTY_CLASS_MEMORY: &str = "32Mi";
const QUIET_DEADLINE: Duration = Duration::from_secs(300);
const QUIET_WINDOW: Duration = Duration::from_secs(3);
/// How long a full pool may settle before the machine's idleness at rest is taken as it is.
const AT_REST_DEADLINE: Duration = Duration::from_secs(60);

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
            systems: SYSTEMS
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
async fn cluster() -> TestResult<(&'static ControlPlane, &'static AgentSandbox)> {
    static AGENT_SANDBOX: OnceCell<AgentSandbox> = OnceCell::const_new();
    let cp = ControlPlane::shared_with_node().await?;
    let agent_sandbox = AGENT_SANDBOX
        .get_or_try_init(|| AgentSandbox::start(cp))
        .await?;
    Ok((cp, agent_sandbox))
}

/// A local libvirtd registered as `banlieue-dev up` registers it (the Provider `local` in the
/// system namespace), its operator and workload running in this process as their
/// ServiceAccounts; started once for the whole benchmark, as agent-sandbox's controller is.
struct LibvirtHost {
    libvirtd: Libvirtd,
    shutdown: CancellationToken,
    workers: Vec<tokio::task::JoinHandle<()>>,
}

impl LibvirtHost {
    async fn start(cp: &ControlPlane) -> TestResult<Self> {
        let libvirtd = Libvirtd::start(LibvirtdOptions::default())
            .await
            .map_err(|e| e.to_string())?;
        let admin = cp.client()?;
        banlieue_dev::bootstrap_cluster_without_workloads(&admin).await?;
        // Unique per process: the bridge lives in the host's network namespace.
        banlieue_dev::prepare_libvirt(&libvirtd, &format!("bsb{}", std::process::id())).await?;
        let mut class = objects::provider_class(objects::DEV_IMAGE);
        // The workload runs in this process; its Deployment's pod must not start on the node
        // (a second workload, and a pull of an image the node does not have).
        class.spec.pod.node_selector = BTreeMap::from([(
            "banlieue.io/benchmark-runs-the-workload-in-process".to_owned(),
            "true".to_owned(),
        )]);
        banlieue_dev::register_provider(&admin, &libvirtd, &class).await?;
        let shutdown = CancellationToken::new();
        let mut workers = banlieue_dev::spawn_operator(cp, SYSTEM_NAMESPACE, &shutdown).await?;
        let mut registry = prometheus_client::registry::Registry::default();
        workers.extend(
            banlieue_dev::spawn_provider_workload(
                cp,
                objects::PROVIDER,
                Some(DomainType::Qemu),
                FILL_DEADLINE,
                &mut registry,
                &shutdown,
            )
            .await?,
        );
        banlieue_dev::apply(&admin, &objects::image()).await?;
        let mut empty = objects::class();
        empty.metadata.name = Some(EMPTY_CLASS.to_owned());
        empty.spec.memory = Quantity(EMPTY_CLASS_MEMORY.to_owned());
        banlieue_dev::apply::<VMClass>(&admin, &empty).await?;
        Ok(Self {
            libvirtd,
            shutdown,
            workers,
        })
    }

    /// Stops the workload and the operator, then the daemon and its guests. A daemon that
    /// exited meanwhile is an error that says how, with the ends of its stderr and log (the
    /// log kept whole in the temporary directory: the instance's own goes with it).
    async fn stop(mut self) -> TestResult {
        self.shutdown.cancel();
        for worker in self.workers {
            let _ = worker.await;
        }
        if let Some(status) = self.libvirtd.exit_status() {
            let kept = std::env::temp_dir().join(format!(
                "banlieue-side-by-side-libvirtd-{}.log",
                std::process::id()
            ));
            // Best effort: a copy that fails must not hide how the daemon ended.
            let kept = match std::fs::copy(self.libvirtd.log_file(), &kept) {
                Ok(_) => format!("its log is kept in {}", kept.display()),
                Err(error) => format!("its log could not be kept in {} ({error})", kept.display()),
            };
            return Err(format!(
                "libvirtd exited during the benchmark ({status}); {kept}; the ends of its \
                 stderr and log (files deleted with the instance):\n{}",
                self.libvirtd.diagnostics()
            )
            .into());
        }
        banlieue_dev::release_host(&self.libvirtd).await?;
        drop(self.libvirtd);
        Ok(())
    }
}

/// Where banlieue's members come from.
enum Members {
    /// LibvirtMachines the contract stand-in makes ready, in a namespace of their own (the
    /// stand-in stops when dropped).
    StandIn { _provider: FakeProvider },
    /// Empty domains of the [`LibvirtHost`], in the system namespace.
    Libvirt,
}

struct Banlieue {
    admin: Client,
    namespace: String,
    controller: ChildController,
    members: Members,
}

impl Banlieue {
    async fn start(cp: &'static ControlPlane, run: u32, pool: usize) -> TestResult<Self> {
        let harness = Harness::on(cp).await?;
        let provider = FakeProvider::start(harness.admin.clone(), &harness.namespace);
        let kubeconfig = harness.controller_kubeconfig(&std::env::temp_dir()).await?;
        let controller = Self::controller(&kubeconfig, &harness.namespace, run)?;
        harness
            .create_pool(POOL, i32::try_from(pool)?, "InfrastructureReady", json!({}))
            .await?;
        Ok(Self {
            admin: harness.admin.clone(),
            namespace: harness.namespace.clone(),
            controller,
            members: Members::StandIn {
                _provider: provider,
            },
        })
    }

    /// banlieue on the [`LibvirtHost`]: the controller as the ServiceAccount `banlieue
    /// bootstrap` made, serving the system namespace, and a pool of empty domains there.
    async fn on_libvirt(cp: &ControlPlane, run: u32, pool: usize) -> TestResult<Self> {
        let kubeconfig = std::env::temp_dir().join(format!(
            "banlieue-side-by-side-libvirt-{}.kubeconfig",
            std::process::id()
        ));
        cp.write_service_account_kubeconfig(SYSTEM_NAMESPACE, "banlieue-controller", &kubeconfig)
            .await?;
        let controller = Self::controller(&kubeconfig, SYSTEM_NAMESPACE, run)?;
        let mut members = objects::pool();
        members.metadata.name = Some(POOL.to_owned());
        members.spec.replicas = i32::try_from(pool)?;
        members.spec.template.spec.class_ref.name = EMPTY_CLASS.to_owned();
        let admin = cp.client()?;
        Api::<VirtualMachinePool>::namespaced(admin.clone(), SYSTEM_NAMESPACE)
            .create(&PostParams::default(), &members)
            .await?;
        Ok(Self {
            admin,
            namespace: SYSTEM_NAMESPACE.to_owned(),
            controller,
            members: Members::Libvirt,
        })
    }

    /// The standalone controller at production resync, with the concurrency bound the knob
    /// names (0: none), else its default.
    fn controller(
        kubeconfig: &std::path::Path,
        namespace: &str,
        run: u32,
    ) -> TestResult<ChildController> {
        let resync = banlieue_controller::ControllerConfig::default().resync;
        let concurrency = std::env::var("BANLIEUE_SIDE_BY_SIDE_CONCURRENT_RECONCILES").ok();
        let flags: Vec<&str> = match &concurrency {
            Some(n) => vec!["--concurrent-reconciles", n],
            None => Vec::new(),
        };
        ChildController::spawn_with_resync(kubeconfig, namespace, run, resync, &flags)
    }

    fn api<K>(&self) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
    {
        Api::namespaced(self.admin.clone(), &self.namespace)
    }

    /// Deletes the pool and waits until its members are gone (for libvirt, their domains
    /// destroyed: the provider releases each member's finalizer after).
    async fn stop(self) -> TestResult {
        self.api::<VirtualMachinePool>()
            .delete(POOL, &DeleteParams::background())
            .await?;
        all_gone(
            &self.api::<VirtualMachine>(),
            "banlieue's members",
            FILL_DEADLINE,
        )
        .await?;
        drop(self.controller);
        Ok(())
    }
}

impl ClaimSystem for Banlieue {
    fn name(&self) -> &str {
        match self.members {
            Members::StandIn { .. } => BANLIEUE,
            Members::Libvirt => BANLIEUE_LIBVIRT,
        }
    }

    fn claims(&self) -> Api<DynamicObject> {
        Api::namespaced_with(
            self.admin.clone(),
            &self.namespace,
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
                access: None,
                handover: None,
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

    /// The pool's counts and Ready condition, then its members that are not Ready, with their
    /// conditions: what a pool that stopped short of full was waiting for.
    async fn shortfall(&self) -> Vec<String> {
        let summary = |conditions: &[banlieue_api::conditions::Condition]| {
            conditions
                .iter()
                .map(|c| format!("{}={} {}: {}", c.type_, c.status, c.reason, c.message))
                .collect::<Vec<_>>()
                .join("; ")
        };
        let mut lines = Vec::new();
        match self.api::<VirtualMachinePool>().get(POOL).await {
            Ok(pool) => {
                let status = pool.status.unwrap_or_default();
                lines.push(format!(
                    "pool: {} replicas, {} ready, {} available, {} claimed; {}",
                    status.replicas,
                    status.ready_replicas,
                    status.available_replicas,
                    status.claimed_replicas,
                    summary(&status.conditions)
                ));
            }
            Err(error) => lines.push(format!("pool: {error}")),
        }
        let selector = format!("{}={POOL}", banlieue_api::names::LABEL_POOL);
        match self
            .api::<VirtualMachine>()
            .list(&ListParams::default().labels(&selector))
            .await
        {
            Ok(members) => lines.extend(
                members
                    .items
                    .iter()
                    .filter(|vm| {
                        vm.metadata.deletion_timestamp.is_some()
                            || !vm.status.as_ref().is_some_and(|s| {
                                banlieue_api::conditions::is_true(
                                    &s.conditions,
                                    banlieue_api::conditions::types::READY,
                                )
                            })
                    })
                    .take(20)
                    .map(|vm| {
                        let conditions = vm
                            .status
                            .as_ref()
                            .map_or_else(String::new, |s| summary(&s.conditions));
                        let deleting = if vm.metadata.deletion_timestamp.is_some() {
                            " (deleting)"
                        } else {
                            ""
                        };
                        format!(
                            "member {}{deleting}: {conditions}",
                            vm.metadata.name.as_deref().unwrap_or_default()
                        )
                    }),
            ),
            Err(error) => lines.push(format!("members: {error}")),
        }
        lines
    }
}

struct AgentSandboxPool {
    admin: Client,
    namespace: String,
    controller: &'static AgentSandbox,
}

impl AgentSandboxPool {
    async fn start(
        cp: &ControlPlane,
        controller: &'static AgentSandbox,
        pool: usize,
    ) -> TestResult<Self> {
        let namespace = cp.fresh_namespace_for_pods().await?;
        let admin = cp.client()?;
        let this = Self {
            admin,
            namespace,
            controller,
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
        self.controller.pid()
    }

    /// The pool's status, whether its controller still runs, the node's conditions and
    /// taints, the namespace's pods by phase and readiness, the first ones not ready with why,
    /// and the namespace's Warning events: what a pool that stopped short of full was waiting
    /// for.
    async fn shortfall(&self) -> Vec<String> {
        let mut lines = Vec::new();
        match self.api(Kind::SandboxWarmPool).get(POOL).await {
            Ok(pool) => lines.push(format!("pool status: {}", pool.data["status"])),
            Err(error) => lines.push(format!("pool: {error}")),
        }
        let pid = self.controller.pid();
        let alive = if banlieue_testenv::is_running(pid) {
            "running"
        } else {
            "gone"
        };
        lines.push(format!("controller pid {pid}: {alive}"));
        lines.push(log_errors(self.controller.log_path()));
        let nodes: Api<Node> = Api::all(self.admin.clone());
        match nodes.list(&ListParams::default()).await {
            Ok(nodes) => lines.extend(nodes.items.iter().map(node_summary)),
            Err(error) => lines.push(format!("nodes: {error}")),
        }
        let pods: Api<Pod> = Api::namespaced(self.admin.clone(), &self.namespace);
        match pods.list(&ListParams::default()).await {
            Ok(pods) => {
                let mut by_phase = BTreeMap::<String, (usize, usize)>::new();
                for pod in &pods.items {
                    let phase = pod.status.as_ref().and_then(|s| s.phase.clone());
                    let entry = by_phase.entry(phase.unwrap_or_default()).or_default();
                    entry.0 += 1;
                    entry.1 += usize::from(pod_is_ready(pod));
                }
                lines.push(format!("pods by phase (count, ready): {by_phase:?}"));
                let not_ready = pods.items.iter().filter(|pod| !pod_is_ready(pod));
                lines.extend(not_ready.take(10).map(pod_summary));
            }
            Err(error) => lines.push(format!("pods: {error}")),
        }
        lines.extend(warnings(&self.admin, &self.namespace).await);
        lines
    }
}

/// The Warning events of `namespace` (a sandbox that failed to start, an image not found), the
/// same reason and message counted once, the most frequent first, at most ten.
async fn warnings(admin: &Client, namespace: &str) -> Vec<String> {
    let events: Api<Event> = Api::namespaced(admin.clone(), namespace);
    let listed = match events
        .list(&ListParams::default().fields("type=Warning"))
        .await
    {
        Ok(listed) => listed.items,
        Err(error) => return vec![format!("events: {error}")],
    };
    let mut counted = BTreeMap::<(String, String), i64>::new();
    for event in listed {
        let reason = event.reason.unwrap_or_default();
        let message: String = event
            .message
            .unwrap_or_default()
            .chars()
            .take(300)
            .collect();
        *counted.entry((reason, message)).or_default() += i64::from(event.count.unwrap_or(1));
    }
    let mut counted: Vec<_> = counted.into_iter().collect();
    counted.sort_by_key(|(_, count)| std::cmp::Reverse(*count));
    (counted.into_iter().take(10))
        .map(|((reason, message), count)| format!("warning {reason} ×{count}: {message}"))
        .collect()
}

/// How many error lines controller-runtime's JSON log holds, and the last three, each its
/// message and error: a controller that runs but cannot reach the API server (refused as
/// `Unauthorized`, say) says so only there.
fn log_errors(log: &std::path::Path) -> String {
    let text = match std::fs::read_to_string(log) {
        Ok(text) => text,
        Err(error) => return format!("controller log {}: {error}", log.display()),
    };
    let errors: Vec<String> = (text.lines())
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|entry| entry["level"] == "error")
        .map(|entry| {
            let field = |name: &str| entry[name].as_str().unwrap_or_default().to_owned();
            format!("{}: {}", field("msg"), field("error"))
        })
        .collect();
    let last = &errors[errors.len().saturating_sub(3)..];
    format!(
        "controller log {}: {} error lines; the last: {}",
        log.display(),
        errors.len(),
        last.join(" | ")
    )
}

#[test]
fn a_controller_log_s_errors_are_counted_and_the_last_three_quoted() -> TestResult {
    let log = std::env::temp_dir().join(format!(
        "banlieue-side-by-side-log-errors-{}.log",
        std::process::id()
    ));
    let mut text = String::from("not JSON\n");
    for n in 1..=4 {
        text += &format!(
            "{{\"level\":\"error\",\"msg\":\"Failed to watch {n}\",\"error\":\"Unauthorized\"}}\n"
        );
        text += "{\"level\":\"info\",\"msg\":\"Starting workers\"}\n";
    }
    std::fs::write(&log, text)?;
    let summary = log_errors(&log);
    std::fs::remove_file(&log)?;
    assert!(summary.contains(": 4 error lines"), "{summary}");
    assert!(!summary.contains("watch 1"), "{summary}");
    for n in 2..=4 {
        assert!(
            summary.contains(&format!("Failed to watch {n}: Unauthorized")),
            "{summary}"
        );
    }
    assert!(!summary.contains("Starting workers"), "{summary}");
    let missing = log_errors(&log);
    assert!(missing.contains(".log: No such file"), "{missing}");
    Ok(())
}

/// A node's conditions, taints and pod capacity, on one line.
fn node_summary(node: &Node) -> String {
    let status = node.status.clone().unwrap_or_default();
    let conditions: Vec<String> = (status.conditions.unwrap_or_default().iter())
        .map(|c| format!("{}={}", c.type_, c.status))
        .collect();
    let taints: Vec<String> = (node.spec.as_ref().and_then(|spec| spec.taints.clone()))
        .unwrap_or_default()
        .iter()
        .map(|t| format!("{}:{}", t.key, t.effect))
        .collect();
    let pods = (status.allocatable).and_then(|a| a.get("pods").map(|q| q.0.clone()));
    format!(
        "node {}: {}; taints {taints:?}; allocatable pods {pods:?}",
        node.metadata.name.as_deref().unwrap_or_default(),
        conditions.join(" "),
    )
}

/// A pod's node, conditions and why its containers wait, on one line.
fn pod_summary(pod: &Pod) -> String {
    let status = pod.status.clone().unwrap_or_default();
    let conditions: Vec<String> = (status.conditions.unwrap_or_default().iter())
        .map(|c| {
            let message = c.message.as_deref().unwrap_or_default();
            format!("{}={} {message}", c.type_, c.status)
        })
        .collect();
    let waiting: Vec<String> = (status.container_statuses.unwrap_or_default().iter())
        .filter_map(|c| c.state.as_ref()?.waiting.as_ref())
        .map(|w| {
            let reason = w.reason.as_deref().unwrap_or_default();
            format!("{reason}: {}", w.message.as_deref().unwrap_or_default())
        })
        .collect();
    format!(
        "pod {} on {:?}: {}; waiting: {waiting:?}",
        pod.metadata.name.as_deref().unwrap_or_default(),
        pod.spec.as_ref().and_then(|s| s.node_name.clone()),
        conditions.join("; ")
    )
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

/// One phase: from a full pool, `arrivals`, each claim deleted `dwell` after it is ready, then
/// until the pool is full again and every claim is gone, so the writes counted are the whole
/// of what the claims cost, refill and release included. The burst's claims are released the
/// same way: held until the refill ended, 300 bound libvirt members and their 300 replacements
/// would be 600 QEMU processes, more than this machine's memory holds.
async fn phase(
    system: &impl ClaimSystem,
    admin: &Client,
    pool: usize,
    prefix: &str,
    arrivals: Arrivals,
    dwell: Duration,
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
    let outcome = claim_load::drive(system, prefix, arrivals, Some(dwell), PHASE_DEADLINE).await?;
    let refilled = claim_load::wait_warm(system, pool, FILL_DEADLINE).await?;
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
    let quiet = match load.quiet {
        Some(wanted) => Some(at_rest(system, wanted).await?),
        None => None,
    };
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
            load.dwell,
            quiet,
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
        load.dwell,
        quiet,
    )
    .await?;
    report(system.name(), run, "burst", &measured);
    phases.insert("burst".into(), measured);
    Ok(phases)
}

/// How idle the phases of `system` wait for the machine to be: `wanted`, unless the system's
/// own full pool at rest leaves it busier (300 QEMU processes under TCG, even halted, use about
/// a core between them); then a little under what the pool at rest leaves.
async fn at_rest(system: &impl ClaimSystem, wanted: f64) -> TestResult<f64> {
    let idle = match claim_load::wait_quiet(wanted, QUIET_WINDOW, AT_REST_DEADLINE).await {
        Ok(idle) => idle,
        Err(claim_load::Error::NotQuiet { idle, .. }) => idle,
        Err(e) => return Err(e.into()),
    };
    let quiet = if idle >= wanted { wanted } else { idle - 0.05 };
    eprintln!(
        "{}: the full pool at rest leaves the machine {:.0}% idle; phases wait for {:.0}%",
        system.name(),
        idle * 100.0,
        quiet * 100.0
    );
    Ok(quiet)
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

/// Runs `load` `runs` times on each of its systems, each run starting one system further
/// along [`SYSTEMS`], and returns each system's phases of each run.
async fn side_by_side(
    load: &Load,
    runs: u32,
) -> TestResult<BTreeMap<&'static str, Vec<BTreeMap<String, Phase>>>> {
    let (cp, agent_sandbox) = cluster().await?;
    let libvirt = if load.systems.contains(&BANLIEUE_LIBVIRT) {
        Some(LibvirtHost::start(cp).await?)
    } else {
        None
    };
    let outcome = every_run(cp, agent_sandbox, load, runs).await;
    // The daemon and its guests go whatever happened; the bridge too, unless that failed.
    let Some(host) = libvirt else {
        return outcome;
    };
    match (outcome, host.stop().await) {
        (outcome, Ok(())) => outcome,
        (Ok(_), Err(stop)) => Err(stop),
        // The run's own error first: the host's (a daemon gone, say) is what explains it.
        (Err(run), Err(stop)) => {
            Err(format!("{run}\nthen, stopping the libvirt host: {stop}").into())
        }
    }
}

async fn every_run(
    cp: &'static ControlPlane,
    agent_sandbox: &'static AgentSandbox,
    load: &Load,
    runs: u32,
) -> TestResult<BTreeMap<&'static str, Vec<BTreeMap<String, Phase>>>> {
    let admin = cp.client()?;
    let mut results: BTreeMap<&'static str, Vec<BTreeMap<String, Phase>>> = BTreeMap::new();
    for run in 1..=runs {
        let mut order = load.systems.clone();
        if !order.is_empty() {
            let first = (run as usize - 1) % order.len();
            order.rotate_left(first);
        }
        for system in order {
            let measured = match system {
                AGENT_SANDBOX => {
                    let system = AgentSandboxPool::start(cp, agent_sandbox, load.pool).await?;
                    let measured = phases(&system, &admin, load, run).await?;
                    system.stop().await?;
                    measured
                }
                BANLIEUE | BANLIEUE_LIBVIRT => {
                    let system = if system == BANLIEUE {
                        Banlieue::start(cp, run, load.pool).await?
                    } else {
                        Banlieue::on_libvirt(cp, run, load.pool).await?
                    };
                    let measured = phases(&system, &admin, load, run).await?;
                    system.stop().await?;
                    measured
                }
                other => return Err(format!("no system {other}").into()),
            };
            results.entry(system).or_default().push(measured);
        }
    }
    Ok(results)
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(f64::NAN)
}

/// One markdown table: each figure's median over the runs for every system, each banlieue
/// system's over agent-sandbox's, and every run's value.
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
    let systems: Vec<&str> = SYSTEMS
        .into_iter()
        .filter(|s| results.contains_key(s))
        .collect();
    let compared = |system: &str| system != AGENT_SANDBOX && results.contains_key(AGENT_SANDBOX);
    let mut header = String::from("| phase | figure |");
    let mut rule = String::from("|---|---|");
    for system in &systems {
        header.push_str(&format!(" {system} (runs) |"));
        rule.push_str("---|");
        if compared(system) {
            header.push_str(&format!(" {system} / {AGENT_SANDBOX} |"));
            rule.push_str("---|");
        }
    }
    let mut out = format!("{header}\n{rule}\n");
    let mut phase_names: Vec<String> = load.rates.iter().map(|r| format!("{r}/s")).collect();
    phase_names.push("burst".into());
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
            let theirs = median(values(AGENT_SANDBOX));
            out.push_str(&format!("| {phase} | {figure} |"));
            for system in &systems {
                let runs = values(system);
                let listed: Vec<String> = runs.iter().map(|x| format!("{x:.1}")).collect();
                let m = median(runs);
                out.push_str(&format!(" **{m:.1}** ({}) |", listed.join(", ")));
                if compared(system) {
                    out.push_str(&format!(" {:.2} |", m / theirs));
                }
            }
            out.push('\n');
        }
    }
    out
}

/// The harness at a tiny rate: every system gets every claim ready (banlieue-libvirt's from
/// three real domains), each phase counts its writes and the controllers' usage, and the
/// pools refill.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_benchmark_harness_runs_every_system_at_a_tiny_rate() -> TestResult {
    let load = Load {
        pool: 3,
        rates: vec![2.0],
        window: Duration::from_secs(2),
        dwell: Duration::from_millis(200),
        // The suite runs other jobs beside this one: the machine is never quiet.
        quiet: None,
        systems: SYSTEMS.to_vec(),
    };
    let results = side_by_side(&load, 1).await?;
    for system in SYSTEMS {
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

    // What agent-sandbox's error says when its pool does not fill, read here from a full pool:
    // the pool's status, its controller, the node, the pods, and the namespace's warnings (two
    // alike, posted here, counted as one line; a Normal one left out).
    let (cp, controller) = cluster().await?;
    let pid = controller.pid();
    let pool = AgentSandboxPool::start(cp, controller, 2).await?;
    claim_load::wait_warm(&pool, 2, FILL_DEADLINE).await?;
    let events: Api<Event> = Api::namespaced(pool.admin.clone(), &pool.namespace);
    for (name, kind) in [("a", "Warning"), ("b", "Warning"), ("c", "Normal")] {
        let event = Event {
            metadata: kube::api::ObjectMeta {
                name: Some(format!("smoke-{name}")),
                ..Default::default()
            },
            type_: Some(kind.to_owned()),
            reason: Some(format!("Smoke{kind}")),
            message: Some("posted by the smoke test".to_owned()),
            // The API server wants the involved object in the event's own namespace.
            involved_object: k8s_openapi::api::core::v1::ObjectReference {
                kind: Some("SandboxWarmPool".to_owned()),
                name: Some(POOL.to_owned()),
                namespace: Some(pool.namespace.clone()),
                ..Default::default()
            },
            ..Default::default()
        };
        events.create(&PostParams::default(), &event).await?;
    }
    let diagnosis = pool.shortfall().await.join("\n");
    assert!(
        !diagnosis.contains("SmokeNormal"),
        "a Normal event in:\n{diagnosis}"
    );
    for expected in [
        "\"readyReplicas\":2".to_owned(),
        format!("controller pid {pid}: running"),
        format!("controller log {}: ", controller.log_path().display()),
        "Ready=True".to_owned(),
        "\"Running\": (2, 2)".to_owned(),
        "warning SmokeWarning ×2: posted by the smoke test".to_owned(),
    ] {
        assert!(
            diagnosis.contains(&expected),
            "no {expected} in:\n{diagnosis}"
        );
    }
    pool.stop().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark: run alone with --ignored --release --nocapture"]
async fn banlieue_and_agent_sandbox_side_by_side() -> TestResult {
    // The libvirt provider and the operator run in this process: their warnings (a domain that
    // failed to start, say) belong in the benchmark's output. RUST_LOG widens it.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .try_init();
    let load = Load::from_env();
    let runs: u32 = std::env::var("BANLIEUE_SIDE_BY_SIDE_RUNS")
        .ok()
        .map_or(3, |v| v.parse().expect("a number of runs"));
    eprintln!("side by side: {load:?}, {runs} runs");
    let results = side_by_side(&load, runs).await?;
    eprintln!("{}", table(&results, &load));
    Ok(())
}

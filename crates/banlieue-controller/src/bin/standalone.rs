//! Runs the controller against a kubeconfig, for tests that kill and restart it and for local
//! experiments:
//!
//! ```text
//! cargo run -p banlieue-controller --bin banlieue-controller-standalone -- KUBECONFIG [NAMESPACE]
//!     [--leader-elect[=true|false] | --no-leader-elect]
//!     [--lease-duration-seconds S] [--renew-deadline-seconds S] [--retry-period-seconds S]
//!     [--resync-seconds S] [--placement-kind API_VERSION/KIND/PLURAL/FINALIZER]
//! ```
//!
//! As `banlieue controller`, it first takes the Lease `banlieue-controller` (in NAMESPACE when
//! given, else the pod's namespace) and exits with status 1 as soon as it loses it; the holder
//! identity is `POD_NAME`, else host name and pid. `BANLIEUE_CRASH_AT=<point>` aborts it at that
//! step of a bind or release (see `banlieue_controller::crash`). SIGTERM or SIGINT stops it
//! gracefully and releases the Lease. `--placement-kind` adds a machine kind whose spec is its
//! placement (`MachineBackend::of_placement`), as a test backend's CRD defines it, e.g.
//! `test.banlieue.io/v1alpha1/MemoryMachine/memorymachines/test.banlieue.io/memory-protection`.

use std::path::PathBuf;
use std::time::Duration;

use banlieue_controller::machine_builder::{MachineBackend, MachineBackends};
use banlieue_controller::{ControllerConfig, LEASE_NAME, Metrics, run};
use banlieue_runtime::leader::{self, LeaderElector, LeaseConfig};
use futures::FutureExt;
use kube::config::{KubeConfigOptions, Kubeconfig};
use tokio::signal::unix::{SignalKind, signal};

const USAGE: &str = "usage: controller KUBECONFIG [NAMESPACE] [--leader-elect[=BOOL] | --no-leader-elect] \
     [--lease-duration-seconds S] [--renew-deadline-seconds S] [--retry-period-seconds S] \
     [--resync-seconds S] [--concurrent-reconciles N] \
     [--placement-kind API_VERSION/KIND/PLURAL/FINALIZER]";

#[derive(Debug)]
struct Args {
    kubeconfig: PathBuf,
    namespace: Option<String>,
    leader_elect: bool,
    lease_duration: Duration,
    renew_deadline: Duration,
    retry_period: Duration,
    /// How often every object is reconciled again without a change: short by default, so
    /// tests see periodic work soon; benchmarks pass the production default.
    resync: Duration,
    /// Machine kinds added to the built-in ones.
    placement_kinds: Vec<MachineBackend>,
    /// Objects each reconciler works on at once (0: no bound).
    concurrent_reconciles: u16,
}

fn parse_args(mut args: impl Iterator<Item = String>) -> Result<Args, String> {
    let mut positional = Vec::new();
    let mut parsed = Args {
        kubeconfig: PathBuf::new(),
        namespace: None,
        leader_elect: true,
        lease_duration: leader::DEFAULT_LEASE_DURATION,
        renew_deadline: leader::DEFAULT_RENEW_DEADLINE,
        retry_period: leader::DEFAULT_RETRY_PERIOD,
        resync: Duration::from_secs(5),
        placement_kinds: Vec::new(),
        concurrent_reconciles: ControllerConfig::default().concurrent_reconciles,
    };
    let seconds = |value: Option<String>| -> Result<Duration, String> {
        let value = value.ok_or(USAGE)?;
        value
            .parse::<f64>()
            .ok()
            .and_then(|s| Duration::try_from_secs_f64(s).ok())
            .ok_or_else(|| format!("not a number of seconds: {value}"))
    };
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--leader-elect" | "--leader-elect=true" => parsed.leader_elect = true,
            "--no-leader-elect" | "--leader-elect=false" => parsed.leader_elect = false,
            "--lease-duration-seconds" => parsed.lease_duration = seconds(args.next())?,
            "--renew-deadline-seconds" => parsed.renew_deadline = seconds(args.next())?,
            "--retry-period-seconds" => parsed.retry_period = seconds(args.next())?,
            "--resync-seconds" => parsed.resync = seconds(args.next())?,
            "--concurrent-reconciles" => {
                let value = args.next().ok_or(USAGE)?;
                parsed.concurrent_reconciles = value
                    .parse()
                    .map_err(|_| format!("not a count of reconciles: {value}"))?;
            }
            "--placement-kind" => parsed
                .placement_kinds
                .push(placement_kind(&args.next().ok_or(USAGE)?)?),
            flag if flag.starts_with("--") => return Err(format!("unknown flag {flag}; {USAGE}")),
            _ => positional.push(arg),
        }
    }
    let mut positional = positional.into_iter();
    parsed.kubeconfig = PathBuf::from(positional.next().ok_or(USAGE)?);
    parsed.namespace = positional.next();
    if positional.next().is_some() {
        return Err(USAGE.into());
    }
    Ok(parsed)
}

/// `GROUP/VERSION/KIND/PLURAL/FINALIZER` (the finalizer may hold a `/`) as a kind whose spec
/// is its placement. The names live as long as the process, which reads them once.
/// The kinds whose CRDs `banlieue-api` holds, built as the binary's descriptors build them.
/// This test binary cannot depend on the provider crates (they would be the controller's
/// dependencies), so it lists their builders where the API crate keeps them; any other kind is
/// added with `--placement-kind`.
fn in_tree_backends() -> MachineBackends {
    MachineBackends::new([
        banlieue_api::machine::libvirt_machine_backend(),
        banlieue_api::vsphere::machine_backend(),
    ])
}

fn placement_kind(value: &str) -> Result<MachineBackend, String> {
    let malformed = || format!("--placement-kind {value:?}: {USAGE}");
    let mut parts = value.splitn(5, '/');
    let mut next = || {
        parts
            .next()
            .filter(|part| !part.is_empty())
            .ok_or_else(malformed)
    };
    let (group, version, kind, plural, finalizer) = (next()?, next()?, next()?, next()?, next()?);
    banlieue_api::MachineKind::new(kind).map_err(|e| e.to_string())?;
    let leak = |text: &str| -> &'static str { Box::leak(text.to_owned().into_boxed_str()) };
    Ok(MachineBackend::of_placement(
        &format!("{group}/{version}"),
        leak(kind),
        plural,
        leak(finalizer),
    ))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "warn,banlieue_controller=info,banlieue_runtime=info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = parse_args(std::env::args().skip(1))?;
    let _ = rustls::crypto::ring::default_provider().install_default();
    let config = kube::Config::from_custom_kubeconfig(
        Kubeconfig::read_from(&args.kubeconfig)?,
        &KubeConfigOptions::default(),
    )
    .await?;
    let client = kube::Client::try_from(config)?;
    let mut terminate = signal(SignalKind::terminate())?;
    let shutdown = async move {
        tokio::select! {
            _ = terminate.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
    }
    .shared();

    let leadership = if args.leader_elect {
        let lease = LeaseConfig {
            lease_duration: args.lease_duration,
            renew_deadline: args.renew_deadline,
            retry_period: args.retry_period,
            ..LeaseConfig::new(
                args.namespace
                    .clone()
                    .unwrap_or_else(leader::namespace_from_environment),
                LEASE_NAME,
                leader::identity_from_environment(),
            )
        };
        let elector = LeaderElector::new(client.clone(), lease)?;
        tokio::select! {
            leadership = elector.acquire() => Some(leadership),
            _ = shutdown.clone() => return Ok(()),
        }
    } else {
        None
    };

    let config = ControllerConfig {
        namespace: args.namespace,
        readiness_signal_grace: Duration::from_secs(2),
        resync: args.resync,
        concurrent_reconciles: args.concurrent_reconciles,
        machine_backends: args
            .placement_kinds
            .into_iter()
            .fold(in_tree_backends(), MachineBackends::with),
        ..ControllerConfig::default()
    };
    let lost = match &leadership {
        Some(leadership) => leadership.lost().boxed(),
        None => futures::future::pending().boxed(),
    };
    tokio::select! {
        result = run(client, config, Metrics::unregistered(), shutdown) => result?,
        // Fencing: another replica may take the Lease over once the lease duration has passed
        // since the last renewal; exit now, with reconciles in flight, rather than drain.
        _ = lost => {
            tracing::error!("lost leadership; exiting");
            std::process::exit(1);
        }
    }
    if let Some(leadership) = leadership {
        leadership.release().await?;
    }
    Ok(())
}

//! Benchmark, not a test: LibvirtMachines created → domains running, and deleted → gone, for
//! several machine counts on one real libvirtd (QEMU under TCG). Ignored by default; run with
//!
//! ```text
//! BANLIEUE_BENCH_MACHINES=1,20,50 cargo test --release -p banlieue-provider-libvirt \
//!     --test bench_machines -- --ignored --nocapture
//! ```
//!
//! The provider runs in this process, so the CPU and RSS printed are the provider's plus the
//! benchmark's own small kube client; libvirtd and QEMU are other processes.

mod common;

use std::time::{Duration, Instant};

use anyhow::Result;
use banlieue_api::conditions;
use banlieue_api::{
    Firmware, LibvirtDisk, LibvirtMachine, LibvirtMachineSpec, LocalObjectReference, Provider,
};
use banlieue_provider_libvirt::domain_xml::DomainType;
use banlieue_provider_libvirt::machine::{ProviderConfig, run_provider};
use banlieue_testenv::poll;
use common::{Host, control_plane, credentials, none_left, provider};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::{Api, DeleteParams, PostParams};

/// User and system CPU time of this process, and its current and peak RSS in KiB.
fn usage() -> (Duration, u64, u64) {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the parenthesised command name; utime and stime are the 12th and 13th.
    let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<u64>().ok())
            .unwrap_or(0)
    };
    // CLK_TCK is 100 on Linux.
    let cpu = Duration::from_millis((ticks(11) + ticks(12)) * 10);
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let kib = |key: &str| {
        status
            .lines()
            .find(|l| l.starts_with(key))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    (cpu, kib("VmRSS:"), kib("VmHWM:"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark: run with --ignored --nocapture"]
async fn machines_to_running_and_back() -> Result<()> {
    let counts: Vec<usize> = std::env::var("BANLIEUE_BENCH_MACHINES")
        .unwrap_or_else(|_| "1,20".into())
        .split(',')
        .filter_map(|c| c.trim().parse().ok())
        .collect();
    let host = Host::start().await?;
    host.create_raw_volume("base.raw", 1 << 20).await?;
    let cp = control_plane().await;
    let kube = cp.client()?;
    println!(
        "machines  create→running  per machine  delete→gone  per machine  provider CPU  RSS now/peak"
    );
    for n in counts {
        let ns = cp.fresh_namespace().await?;
        credentials(&kube, &ns, &host).await?;
        Api::<Provider>::namespaced(kube.clone(), &ns)
            .create(
                &PostParams::default(),
                &provider(
                    "bench",
                    "libvirt",
                    &host.libvirtd.tls_uri(),
                    host.capabilities(),
                ),
            )
            .await?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let mut cfg = ProviderConfig::new("bench", &ns);
        cfg.domain_type = Some(DomainType::Qemu);
        let metrics = banlieue_provider_libvirt::metrics::Metrics::unregistered();
        let task = tokio::spawn(run_provider(kube.clone(), cfg, metrics, async move {
            let _ = stopped.await;
        }));
        let api: Api<LibvirtMachine> = Api::namespaced(kube.clone(), &ns);
        let (cpu0, _, _) = usage();
        let started = Instant::now();
        for i in 0..n {
            let m = LibvirtMachine::new(
                &format!("m{i}"),
                LibvirtMachineSpec {
                    provider_ref: LocalObjectReference::new("bench"),
                    pool: host.pool.clone(),
                    network: host.network.clone(),
                    disk: LibvirtDisk {
                        backing_volume: Some("base.raw".into()),
                        install_media: None,
                        size: Quantity("64Mi".into()),
                    },
                    firmware: Firmware::Bios,
                    tpm_enabled: false,
                    secure_boot: false,
                    cpu: 1,
                    memory: Quantity("64Mi".into()),
                    user_data: None,
                    user_data_secret_ref: None,
                    standby: None,
                    access: None,
                    handover: None,
                    egress: None,
                },
            );
            api.create(&PostParams::default(), &m).await?;
        }
        poll::until("all running", Duration::from_secs(900), || async {
            let list = api.list(&Default::default()).await?;
            let running = list
                .items
                .iter()
                .filter(|m| {
                    m.status
                        .as_ref()
                        .is_some_and(|s| conditions::is_true(&s.contract.conditions, "Ready"))
                })
                .count();
            Ok((running == n).then_some(()))
        })
        .await?;
        let up = started.elapsed();
        let deleting = Instant::now();
        api.delete_collection(&DeleteParams::default(), &Default::default())
            .await?;
        none_left(&api, "all deleted", 900).await?;
        let down = deleting.elapsed();
        let (cpu1, rss, hwm) = usage();
        println!(
            "{n:>8}  {:>13.2?}  {:>11.2?}  {:>11.2?}  {:>11.2?}  {:>12.2?}  {} / {} MiB",
            up,
            up / n as u32,
            down,
            down / n as u32,
            cpu1 - cpu0,
            rss / 1024,
            hwm / 1024
        );
        let _ = stop.send(());
        let _ = task.await;
    }
    Ok(())
}

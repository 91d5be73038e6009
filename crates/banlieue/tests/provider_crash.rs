//! Chaos: the libvirt provider process dies in the middle of making a machine.
//!
//! A real control plane and a real libvirtd registered as a Provider; the controller and the
//! operator run in this process as the controller's ServiceAccount, and the Provider's workload
//! runs as a separate `banlieue provider libvirt run` process with the ServiceAccount the
//! operator made for it (its token in a kubeconfig), under the shipped RBAC. Its first run has
//! `BANLIEUE_CRASH_AT` set, so it aborts at one step:
//!
//! - `after-domain-define`: right after its first domain is defined. The host then holds a
//!   defined, stopped domain; the next run must adopt and start that very domain (same UUID,
//!   never a second definition).
//! - `after-volume-create`: right after its first volume is created, as when the reply of a
//!   create is lost. The volume must already be recorded as the machine's, so the next run
//!   reuses it instead of refusing it as someone else's (`VolumeNotOwned`).
//!
//! Then the pool's member becomes available and a claim binds it; deleting the pool leaves no
//! domain and no volume of the member's behind. Each run acts only while it holds the
//! provider's own Lease: the second waits for the crashed run's to expire, and a third started
//! beside the second stays standby.

// Shared with multi_host.rs, which starts three daemons; this binary needs one.
#[allow(dead_code)]
mod hosts;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use banlieue_api::names::SYSTEM_NAMESPACE;
use banlieue_api::{
    ClaimPhase, LibvirtMachine, VirtualMachine, VirtualMachineClaim, VirtualMachinePool,
};
use banlieue_dev::{self as dev, objects};
use banlieue_operator::workloads::workload_name;
use banlieue_provider_libvirt::domain_type::DOMAIN_TYPE_ENV;
use banlieue_provider_libvirt::machine::{CRASH_AFTER_DOMAIN_DEFINE, CRASH_AFTER_VOLUME_CREATE};
use banlieue_testenv::control_plane::ControlPlane;
use banlieue_testenv::libvirtd::{Libvirtd, LibvirtdOptions};
use banlieue_testenv::poll;
use hosts::{BoxError, Host};
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::{Client, ResourceExt};
use tokio_util::sync::CancellationToken;

const BIN: &str = env!("CARGO_BIN_EXE_banlieue");
const DEADLINE: Duration = Duration::from_secs(90);
const POOL: &str = "crash";

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_provider_killed_between_define_and_start_adopts_its_domain() -> Result<(), BoxError> {
    killed_at(CRASH_AFTER_DOMAIN_DEFINE).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_provider_killed_right_after_creating_a_volume_reuses_it() -> Result<(), BoxError> {
    killed_at(CRASH_AFTER_VOLUME_CREATE).await
}

/// One scenario at a time: the hosts' networks are named after this process.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn killed_at(point: &'static str) -> Result<(), BoxError> {
    let _turn = ONE_AT_A_TIME.lock().await;
    if !Libvirtd::available().map_err(|e| banlieue_testenv::control_plane::error_chain(&e))? {
        return Ok(());
    }
    let (control_plane, libvirtd) = tokio::try_join!(
        async { ControlPlane::start().await.map_err(BoxError::from) },
        async {
            Libvirtd::start(LibvirtdOptions::default())
                .await
                .map_err(|e| BoxError::from(banlieue_testenv::control_plane::error_chain(&e)))
        },
    )?;
    let admin = control_plane.client()?;
    dev::bootstrap_cluster(&admin).await?;
    dev::admit_claimant(&admin).await?;
    let hosts = hosts::register(&admin, vec![libvirtd]).await?;
    let shutdown = CancellationToken::new();
    // The controller and the operator only: the host's workload is the child process.
    let workers = hosts::spawn_roles(&control_plane, &[], DEADLINE, DEADLINE, &shutdown).await?;
    let logs = tempfile::tempdir()?;
    let outcome = scenario(&control_plane, &admin, &hosts[0], logs.path(), point).await;
    shutdown.cancel();
    for worker in workers {
        let _ = worker.await;
    }
    let released = hosts::release(&hosts).await;
    if outcome.is_err() {
        for log in ["first.log", "second.log", "third.log"] {
            let text = std::fs::read_to_string(logs.path().join(log)).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(30).collect();
            eprintln!(
                "--- provider {log} (end)\n{}",
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            );
        }
        eprintln!("{}", hosts[0].libvirtd.diagnostics());
    }
    outcome?;
    released
}

async fn scenario(
    control_plane: &ControlPlane,
    admin: &Client,
    host: &Host,
    logs: &std::path::Path,
    point: &'static str,
) -> Result<(), BoxError> {
    // The operator's workload for the Provider: its ServiceAccount and grants.
    let account = workload_name(&host.provider);
    let deployments: Api<k8s_openapi::api::apps::v1::Deployment> =
        Api::namespaced(admin.clone(), SYSTEM_NAMESPACE);
    poll::until("the operator to create the workload", DEADLINE, || async {
        Ok(deployments.get_opt(&account).await?.map(|_| ()))
    })
    .await?;
    let kubeconfig = logs.join("provider.kubeconfig");
    control_plane
        .write_service_account_kubeconfig(SYSTEM_NAMESPACE, &account, &kubeconfig)
        .await?;

    let mut first = ProviderProcess::start(
        &host.provider,
        &kubeconfig,
        &logs.join("first.log"),
        Some(point),
    )?;
    hosts::wait_ready(admin, std::slice::from_ref(host), DEADLINE).await?;
    // It acts only while it holds its own Lease (its Role grants it by name).
    let leases: Api<Lease> = Api::namespaced(admin.clone(), SYSTEM_NAMESPACE);
    let holder = |lease: Option<Lease>| {
        lease
            .and_then(|l| l.spec)
            .and_then(|s| s.holder_identity)
            .unwrap_or_default()
    };
    let first_pid = format!("_{}", first.child.id());
    assert!(
        holder(leases.get_opt(&account).await?).ends_with(&first_pid),
        "the first run does not hold Lease {account}"
    );
    dev::apply(admin, &objects::image()).await?;
    dev::apply(admin, &objects::class()).await?;
    let mut pool = objects::pool();
    pool.metadata.name = Some(POOL.into());
    pool.spec.replicas = 1;
    dev::apply(admin, &pool).await?;

    // The first run dies by SIGABRT at the crash point.
    let aborted = Instant::now();
    let status = loop {
        if let Some(status) = first.child.try_wait()? {
            break status;
        }
        if aborted.elapsed() > DEADLINE {
            return Err(format!("the provider did not abort at {point}").into());
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    assert!(!status.success(), "the provider exited normally: {status}");
    let machines: Api<LibvirtMachine> = Api::namespaced(admin.clone(), SYSTEM_NAMESPACE);
    let listed = machines.list(&ListParams::default()).await?.items;
    let recorded: Vec<_> = listed
        .iter()
        .map(|m| {
            let status = m.status.clone().unwrap_or_default();
            (
                m.name_any(),
                status.domain_name,
                status.domain_uuid,
                status.volumes,
            )
        })
        .collect();
    let [machine] = <[LibvirtMachine; 1]>::try_from(listed)
        .map_err(|_| format!("one LibvirtMachine for a pool of one, found {recorded:?}"))?;
    let defined = hosts::domains(&host.libvirtd).await?;
    // The UUID of the domain the crashed run defined, which the next run must keep.
    let crashed_uuid = if point == CRASH_AFTER_DOMAIN_DEFINE {
        assert_eq!(defined.len(), 1, "domains after the crash: {defined:?}");
        let domain = defined[0].clone();
        assert!(
            hosts::running_domains(&host.libvirtd).await?.is_empty(),
            "the domain was started before the crash"
        );
        let uuid = host.libvirtd.virsh(["domuuid", domain.as_str()]).await?;
        if machine
            .status
            .as_ref()
            .and_then(|s| s.domain_uuid.as_deref())
            != Some(uuid.trim())
        {
            return Err(format!(
                "the crashed run did not record the UUID {} of {domain} before defining it: {recorded:?}",
                uuid.trim()
            )
            .into());
        }
        Some(uuid)
    } else {
        assert!(defined.is_empty(), "domains after the crash: {defined:?}");
        let volumes = host
            .libvirtd
            .virsh(["vol-list", objects::STORAGE_POOL])
            .await?;
        let made: Vec<&str> = volumes
            .lines()
            .filter_map(|line| line.split_whitespace().next())
            .filter(|name| name.contains(&machine.name_any()))
            .collect();
        let owned = machine.status.clone().unwrap_or_default().volumes;
        assert_eq!(made.len(), 1, "volumes after the crash:\n{volumes}");
        assert_eq!(
            owned,
            vec![made[0].to_owned()],
            "the crashed run made a volume it had not recorded as its own"
        );
        None
    };

    // The next run adopts the defined domain and starts it.
    let restarted = Instant::now();
    let mut second =
        ProviderProcess::start(&host.provider, &kubeconfig, &logs.join("second.log"), None)?;
    let pools: Api<VirtualMachinePool> = Api::namespaced(admin.clone(), SYSTEM_NAMESPACE);
    poll::until("the member to be available", DEADLINE, || async {
        let pool = pools.get(POOL).await?;
        Ok(pool
            .status
            .filter(|s| s.available_replicas == 1)
            .map(|_| ()))
    })
    .await?;
    eprintln!(
        "member available {:.1?} after the provider restarted (the crashed run's Lease had to \
         expire first)",
        restarted.elapsed()
    );
    let second_pid = format!("_{}", second.child.id());
    let lease = leases.get(&account).await?;
    assert!(
        holder(Some(lease.clone())).ends_with(&second_pid),
        "the second run acts without holding Lease {account}"
    );
    assert!(
        lease
            .spec
            .and_then(|s| s.lease_transitions)
            .is_some_and(|t| t >= 1),
        "the second run did not take the Lease over"
    );
    // A third run for the same host (a replacement pod while the old one still runs) waits.
    let mut third =
        ProviderProcess::start(&host.provider, &kubeconfig, &logs.join("third.log"), None)?;
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(
        third.child.try_wait()?.is_none(),
        "the standby run exited: see third.log"
    );
    assert!(
        holder(leases.get_opt(&account).await?).ends_with(&second_pid),
        "a second provider took the Lease of a live one"
    );
    third.stop();
    let defined = hosts::domains(&host.libvirtd).await?;
    assert_eq!(
        defined.len(),
        1,
        "domains once the member is available: {defined:?}"
    );
    let domain = defined[0].clone();
    assert_eq!(
        hosts::running_domains(&host.libvirtd).await?,
        vec![domain.clone()]
    );
    if let Some(uuid) = crashed_uuid {
        let again = host.libvirtd.virsh(["domuuid", domain.as_str()]).await?;
        assert_eq!(again.trim(), uuid.trim(), "the domain was defined again");
    }

    let alice = control_plane.client_as(objects::CLAIMANT).await?;
    let mut claim = objects::claim();
    claim.metadata.name = Some("after-crash".into());
    claim.spec.pool_ref.name = POOL.into();
    Api::<VirtualMachineClaim>::namespaced(alice, SYSTEM_NAMESPACE)
        .create(&PostParams::default(), &claim)
        .await?;
    let claims: Api<VirtualMachineClaim> = Api::namespaced(admin.clone(), SYSTEM_NAMESPACE);
    let bound = poll::until("the claim to bind", DEADLINE, || async {
        let c = claims.get("after-crash").await?;
        let st = c.status.unwrap_or_default();
        Ok((st.phase == Some(ClaimPhase::Bound))
            .then_some(st.virtual_machine_ref.map(|r| r.name))
            .flatten())
    })
    .await?;
    assert_eq!(
        bound,
        machine.name_any(),
        "the adopted member is the one bound"
    );

    // Everything goes when the claim and the pool do.
    claims
        .delete("after-crash", &DeleteParams::default())
        .await?;
    pools.delete(POOL, &DeleteParams::default()).await?;
    let vms: Api<VirtualMachine> = Api::namespaced(admin.clone(), SYSTEM_NAMESPACE);
    poll::until("every member and machine to be gone", DEADLINE, || async {
        let left = vms.list(&ListParams::default()).await?.items.len()
            + machines.list(&ListParams::default()).await?.items.len();
        Ok((left == 0).then_some(()))
    })
    .await?;
    assert_eq!(hosts::domains(&host.libvirtd).await?, Vec::<String>::new());
    let volumes = host
        .libvirtd
        .virsh(["vol-list", objects::STORAGE_POOL])
        .await?;
    assert!(
        !volumes.contains(&machine.name_any()),
        "a volume of the member is left:\n{volumes}"
    );
    second.stop();
    Ok(())
}

/// `banlieue provider libvirt run` as a child process, as the workload's ServiceAccount.
struct ProviderProcess {
    child: Child,
}

impl ProviderProcess {
    fn start(
        provider: &str,
        kubeconfig: &std::path::Path,
        log: &std::path::Path,
        crash_at: Option<&str>,
    ) -> Result<Self, BoxError> {
        let mut command = Command::new(BIN);
        command
            .args(["provider", "libvirt", "run", "--provider", provider])
            .args(["--namespace", SYSTEM_NAMESPACE])
            .args(["--metrics-address", "127.0.0.1:0"])
            .env("KUBECONFIG", kubeconfig)
            .env(DOMAIN_TYPE_ENV, "qemu")
            .env_remove(banlieue_runtime::crash::CRASH_AT_ENV)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(log)?);
        if let Some(point) = crash_at {
            command.env(banlieue_runtime::crash::CRASH_AT_ENV, point);
        }
        Ok(Self {
            child: command.spawn()?,
        })
    }

    /// Stops it by PID and reaps it.
    fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for ProviderProcess {
    fn drop(&mut self) {
        self.stop();
    }
}

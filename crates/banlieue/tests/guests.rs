//! Real guests end to end: a real control plane and a real libvirtd, the controller and the
//! Provider's workload running in this process as their ServiceAccounts under the shipped RBAC
//! (wired as `banlieue dev up` wires them), and pools of the test guest image
//! (`scripts/guest-image`: Debian, cloud-init, qemu-guest-agent, a vTPM and banlieue's
//! guest-phase layer) booting under TCG.
//!
//! What only a booted guest can show, each checked against the guest itself through its agent
//! with `virsh` (a client independent of banlieue's):
//! - a `readiness: GuestReady` pool hands out no member before its guest reports `ready`; the
//!   claim then carries the guest's address, and its EK certificates, byte for byte what
//!   `tpm2_nvread` reads inside the guest, chaining to this host's swtpm-localca issuer and
//!   root named by the Provider's `ekTrustBundle`, with the public key the TPM reports, and
//!   different from the other member's;
//! - cloud-init consumed the seed: the user-data's file exists, the instance-id is the
//!   domain's UUID, and a replacement member is a new instance;
//! - a claim carrying its subject's key on a warm member gets `AccessReady` without a cold
//!   start; `banlieue claim ssh`, as the subject with her own kubeconfig, runs a command there
//!   over the guests' network with the host key pinned from the claim (the one sshd serves,
//!   read from inside the guest); another subject's key is refused by that guest, an
//!   unclaimed member refuses the subject's key, and each member has its own host key;
//! - the agent going away is reported on the machine and touches nothing bound;
//! - a guest that answers for its agent and trickles files out is given up on after a few
//!   reads, and its machine's teardown is not held up;
//! - a guest without the guest-phase layer leaves its pool `ReadinessSignalAbsent`;
//! - a Deferred image installs itself onto an empty disk, reboots, and only then is handed out;
//! - a `standby: Saved` pool's member is saved once GuestReady, bound at once, and `Resumed`
//!   with the same vTPM and a clock set to the host's (a second test, beside the first).
//!
//! Guests are booted once for the whole file (two, then two more), since each costs about a
//! minute of both cores. The figures it prints (create → GuestReady, claim → Bound, agent
//! commands per machine per minute) are in docs/performance.md.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use banlieue_api::conditions::{self, reasons, status, types};
use banlieue_api::names::{self, SYSTEM_NAMESPACE};
use banlieue_api::{
    ClaimPhase, LibvirtMachine, LocalObjectReference, PoolReadiness, Provider, Standby,
    VirtualMachine, VirtualMachineClaim, VirtualMachinePool,
};
use banlieue_dev::{self as dev, objects};
use banlieue_provider_libvirt::domain_xml::DomainType;
use banlieue_testenv::control_plane::ControlPlane;
use banlieue_testenv::guest_agent;
use banlieue_testenv::libvirtd::{Libvirtd, LibvirtdOptions};
use banlieue_testenv::poll;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::{Client, ResourceExt};
use prometheus_client::registry::Registry;
use sha2::{Digest, Sha256};
use tokio_util::sync::CancellationToken;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Any one wait for a boot: TCG guests, two at a time, on a busy 2-core machine.
// Three boots at once took 122–224 s here depending on what else ran.
const BOOT_DEADLINE: Duration = Duration::from_secs(300);
/// The layered pool's `startupDeadlineSeconds`: a TCG guest that hangs in its boot (one in a
/// few dozen did here: its agent never connected) is replaced as a user's pool would replace it,
/// so waits for that pool's guests allow one replacement's boot after the deadline.
const STARTUP_DEADLINE: Duration = BOOT_DEADLINE;
const POOL_BOOT_DEADLINE: Duration = Duration::from_secs(BOOT_DEADLINE.as_secs() * 2);
/// Any other wait.
const DEADLINE: Duration = Duration::from_secs(60);
/// How often the waits here ask: less often than the default, since the guests boot under TCG
/// on the same busy cores as the API server the probes call.
const GUEST_POLL_INTERVAL: Duration = Duration::from_millis(500);
/// The network of the first test's guests (its bridge is this and the process id).
const GUEST_NETWORK: &str = "bng";

/// The pool of layered guests, and the one whose guests remove the layer at boot.
const POOL: &str = "guests";
const NO_LAYER_POOL: &str = "no-layer";
/// The pool of the Deferred image.
const DEFERRED_POOL: &str = "installed";
/// How long GuestReady members may stay silent before their pool says ReadinessSignalAbsent.
const SIGNAL_GRACE: Duration = Duration::from_secs(45);
/// How long agent commands are counted once every guest is ready and nothing happens.
const QUIET: Duration = Duration::from_secs(65);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn real_guests_through_pools_and_claims() -> Result<(), BoxError> {
    let mut host = DevHost::start().await?;
    let outcome = match host.set_up(GUEST_NETWORK, Some(SIGNAL_GRACE)).await {
        Ok(()) => scenario(&host).await,
        Err(e) => Err(e),
    };
    host.finish(outcome).await
}

/// A real control plane and libvirtd, with the controller and the Provider's workload running
/// in this process as their ServiceAccounts (as `banlieue-dev up` wires them), the test guest
/// image uploaded, and the guest image and class applied: what each test of this file runs on.
struct DevHost {
    control_plane: ControlPlane,
    libvirtd: Libvirtd,
    shutdown: CancellationToken,
    workers: Vec<tokio::task::JoinHandle<()>>,
    registry: Registry,
}

impl DevHost {
    async fn start() -> Result<DevHost, BoxError> {
        let (control_plane, libvirtd) = tokio::try_join!(
            async { ControlPlane::start().await.map_err(BoxError::from) },
            async {
                Libvirtd::start(LibvirtdOptions::default())
                    .await
                    .map_err(|e| BoxError::from(e.to_string()))
            },
        )?;
        Ok(DevHost {
            control_plane,
            libvirtd,
            shutdown: CancellationToken::new(),
            workers: Vec::new(),
            registry: Registry::default(),
        })
    }

    /// Bootstraps the cluster, prepares libvirt (its network named `<network>`+pid), and
    /// starts the controller (with `signal_grace` as its readiness-signal grace) and the
    /// Provider's workload.
    async fn set_up(
        &mut self,
        network: &str,
        signal_grace: Option<Duration>,
    ) -> Result<(), BoxError> {
        let admin = self.control_plane.client()?;
        let image = banlieue_testenv::guest_image::path()
            .await
            .map_err(|e| banlieue_testenv::control_plane::error_chain(&e))?;
        dev::bootstrap_cluster(&admin).await?;
        dev::admit_claimant(&admin).await?;
        dev::prepare_libvirt(&self.libvirtd, &format!("{network}{}", std::process::id())).await?;
        dev::upload_guest_image(&self.libvirtd, &image).await?;
        dev::register_provider(
            &admin,
            &self.libvirtd,
            &objects::provider_class(objects::DEV_IMAGE),
        )
        .await?;
        self.workers.extend(
            dev::spawn_controller_with(
                &self.control_plane,
                &mut self.registry,
                &self.shutdown,
                signal_grace,
            )
            .await?,
        );
        self.workers.extend(
            dev::spawn_provider_workload(
                &self.control_plane,
                objects::PROVIDER,
                Some(DomainType::Qemu),
                DEADLINE,
                &mut self.registry,
                &self.shutdown,
            )
            .await?,
        );
        dev::apply(&admin, &objects::guest_image()).await?;
        dev::apply(&admin, &objects::guest_class()).await?;
        Ok(())
    }

    /// Stops the workers, releases the host's domains and volumes, and returns `outcome`
    /// (printing the daemon's diagnostics when it failed).
    async fn finish(self, outcome: Result<(), BoxError>) -> Result<(), BoxError> {
        self.shutdown.cancel();
        for worker in self.workers {
            let _ = worker.await;
        }
        let released = dev::release_host(&self.libvirtd).await;
        if outcome.is_err() {
            eprintln!("libvirtd: {}", self.libvirtd.diagnostics());
        }
        outcome?;
        released
    }
}

/// A `standby: Saved` pool of real guests (ADR-0073), on a control plane and libvirtd of its
/// own, beside the scenario above: the member boots to GuestReady, is saved (no QEMU process
/// left, a managed save image on the host), is bound at once by a claim, and is `Resumed` once
/// restored. The restored guest's TPM still holds the key of the EK certificate on the claim,
/// and its clock was set to the host's although it slept while saved. Releasing it leaves no
/// domain and no save image.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_saved_guest_is_resumed_with_its_tpm_and_its_clock() -> Result<(), BoxError> {
    let mut host = DevHost::start().await?;
    let outcome = match host.set_up("bns", None).await {
        Ok(()) => saved_scenario(&host).await,
        Err(e) => Err(e),
    };
    host.finish(outcome).await
}

/// The saved pool of [`a_saved_guest_is_resumed_with_its_tpm_and_its_clock`].
const SAVED_POOL: &str = "saved";
/// The InfrastructureReady pool of the side-by-side benchmark.
const INFRASTRUCTURE_POOL: &str = "infrastructure";
/// How long the saved member sleeps before it is claimed: its clock falls this far behind
/// unless the provider sets it.
const SAVED_SLEEP: Duration = Duration::from_secs(30);

async fn saved_scenario(host: &DevHost) -> Result<(), BoxError> {
    let (control_plane, libvirtd) = (&host.control_plane, &host.libvirtd);
    let admin = control_plane.client()?;
    let mut pool = guest_pool(SAVED_POOL, 1, objects::GUEST_USER_DATA);
    pool.spec.standby = Some(Standby::Saved);
    pool.spec.startup_deadline_seconds = Some(STARTUP_DEADLINE.as_secs() as i64);
    let created = Instant::now();
    dev::apply(&admin, &pool).await?;

    let vms: Api<VirtualMachine> = Api::namespaced(admin.clone(), SYSTEM_NAMESPACE);
    let machines: Api<LibvirtMachine> = Api::namespaced(admin.clone(), SYSTEM_NAMESPACE);
    let saved = members_on_failure(
        poll::until_every(
            "a member saved",
            POOL_BOOT_DEADLINE,
            GUEST_POLL_INTERVAL,
            || async {
                Ok(pool_members(&vms, SAVED_POOL)
                    .await?
                    .into_iter()
                    .find(|vm| vm.status.as_ref().and_then(|s| s.standby) == Some(Standby::Saved)))
            },
        )
        .await,
        &vms,
        SAVED_POOL,
    )
    .await?;
    let saved_after = created.elapsed();
    let member = saved.name_any();
    let saved_status = saved.status.clone().unwrap_or_default();
    assert!(guest_ready(&saved), "only a GuestReady member is saved");
    assert_eq!(
        saved_status.tpm_endorsement_key_digests.len(),
        2,
        "EK certificates recorded before the save"
    );
    let domain = machines
        .get(&member)
        .await?
        .status
        .and_then(|s| s.domain_name)
        .ok_or("the saved machine names no domain")?;
    // Checked with virsh, a client independent of banlieue's.
    let state = libvirtd.virsh(["domstate", domain.as_str()]).await?;
    assert_eq!(state.trim(), "shut off", "a saved domain runs no QEMU");
    let info = libvirtd.virsh(["dominfo", domain.as_str()]).await?;
    assert!(
        info.lines()
            .any(|l| l.starts_with("Managed save:") && l.trim_end().ends_with("yes")),
        "a managed save image: {info}"
    );
    assert!(
        libvirtd.guest_pids().is_empty(),
        "no guest process holds memory while the only member is saved: {:?}",
        libvirtd.guest_pids()
    );
    let image_file = save_image(libvirtd, &domain)?.ok_or("no save image on the host")?;
    let image_bytes = std::fs::metadata(&image_file)?.len();

    tokio::time::sleep(SAVED_SLEEP).await;
    let alice = control_plane.client_as(objects::CLAIMANT).await?;
    let claims: Api<VirtualMachineClaim> = Api::namespaced(alice, SYSTEM_NAMESPACE);
    let mut claim = claim("resumed");
    claim.spec.pool_ref.name = SAVED_POOL.into();
    // With alice's key: delivered once the restored guest's agent answers.
    let keys = tempfile::tempdir()?;
    let (_, alice_public) = ssh_key(keys.path(), "alice")?;
    claim.spec.access = Some(banlieue_api::access::ClaimAccess {
        ssh_authorized_keys: vec![alice_public.clone()],
        user: Some("alice".into()),
    });
    let claims_admin: Api<VirtualMachineClaim> = Api::namespaced(admin.clone(), SYSTEM_NAMESPACE);
    let times = create_timed(&claims, &claims_admin, &claim, true).await?;
    let (bound_after, resumed_after) = (times.bound, times.resumed.ok_or("resumed")?);
    let access_after = times.access.ok_or("no AccessReady after the resume")?;
    let resumed = claims_admin
        .get("resumed")
        .await?
        .status
        .unwrap_or_default();
    assert_eq!(
        resumed
            .virtual_machine_ref
            .as_ref()
            .map(|r| r.name.as_str()),
        Some(member.as_str()),
        "the saved member is the one bound"
    );
    assert!(
        !resumed.addresses.is_empty(),
        "a resumed claim has its address"
    );
    assert_eq!(
        resumed.tpm_endorsement_key_digests, saved_status.tpm_endorsement_key_digests,
        "the claim carries the certificates recorded before the save"
    );
    // The keys are in the restored guest, in the file sshd reads for alice alone.
    assert_eq!(resumed.login_user.as_deref(), Some("alice"));
    let installed = guest_agent::read_text(libvirtd, &domain, "/run/banlieue/keys/alice").await?;
    assert_eq!(installed, format!("{alice_public}\n"));
    // The same vTPM: the key the restored guest's TPM reports is the one certified.
    let guest_key = guest_ek_public_key_digest(libvirtd, &domain).await?;
    assert_eq!(
        Some(&guest_key),
        resumed.tpm_endorsement_key_digests.first()
    );
    // The guest slept SAVED_SLEEP and more; its clock was set to the host's on resume.
    let guest_now = guest_agent::run(libvirtd, &domain, "/usr/bin/date", &["+%s"]).await?;
    let guest_now: i64 = String::from_utf8(guest_now)?.trim().parse()?;
    let host_now = k8s_openapi::jiff::Timestamp::now().as_second();
    let skew = (host_now - guest_now).abs();
    assert!(
        skew < (SAVED_SLEEP.as_secs() / 3) as i64,
        "the restored guest's clock is {skew} s off the host's"
    );
    let rss = libvirtd
        .guest_pids()
        .into_iter()
        .map(resident_bytes)
        .sum::<u64>();
    eprintln!(
        "saved pool: create → saved {:.1} s, save image {:.0} MiB; claim → Bound {:.2} s, \
         claim → Resumed {:.2} s, → AccessReady {:.2} s; guest processes after the resume \
         hold {:.0} MiB resident; clock skew after the resume {skew} s",
        saved_after.as_secs_f64(),
        image_bytes as f64 / f64::from(1 << 20),
        bound_after.as_secs_f64(),
        resumed_after.as_secs_f64(),
        access_after.as_secs_f64(),
        rss as f64 / f64::from(1 << 20),
    );
    eprintln!("saved pool: {}", resume_parts(&host.registry)?);

    // Released: the domain and its save image go with the claim. The pool's refill is saved
    // in its turn, so wait for the claim's member only.
    claims_admin
        .delete("resumed", &DeleteParams::default())
        .await?;
    poll::until_every(
        "the released member gone",
        DEADLINE,
        GUEST_POLL_INTERVAL,
        || async { Ok(vms.get_opt(&member).await?.is_none().then_some(())) },
    )
    .await?;
    let listed = libvirtd.virsh(["list", "--all", "--name"]).await?;
    assert!(
        !listed.lines().any(|l| l.trim() == domain),
        "domain {domain} outlived its claim"
    );
    assert!(
        !image_file.exists(),
        "the save image {} outlived its machine",
        image_file.display()
    );
    Ok(())
}

/// The figures of docs/performance.md's "Saved warm pools", run by hand (each claim waits for
/// its pool's refill, about a minute of both cores per claim):
/// `BANLIEUE_SAVED_BENCH_CLAIMS` rounds (default 20) of one claim on each of three pools of
/// `BANLIEUE_SAVED_BENCH_MEMBERS` members (default 2) of the same guest: a GuestReady
/// `Running` pool, a GuestReady `Saved` one, and an InfrastructureReady `Running` one (its
/// members handed out once their domain runs). Each claim is made once its pool has a member
/// ready to take (saved, for the saved pool), so every claim is warm. Prints the guest
/// processes' resident memory with the running pool alone and once the saved pool is full, the
/// save images' size, and p50/p90/p99 of claim → Bound on each pool and → Resumed on the
/// saved one.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "a benchmark of real guests under TCG: minutes of both cores per claim"]
async fn saved_and_running_pools_side_by_side() -> Result<(), BoxError> {
    let mut host = DevHost::start().await?;
    let outcome = match host.set_up("bnb", None).await {
        Ok(()) => side_by_side(&host).await,
        Err(e) => Err(e),
    };
    host.finish(outcome).await
}

async fn side_by_side(host: &DevHost) -> Result<(), BoxError> {
    let members = bench_knob("BANLIEUE_SAVED_BENCH_MEMBERS", 2)?;
    let rounds = bench_knob("BANLIEUE_SAVED_BENCH_CLAIMS", 20)?;
    let (control_plane, libvirtd) = (&host.control_plane, &host.libvirtd);
    let admin = control_plane.client()?;
    let vms: Api<VirtualMachine> = Api::namespaced(admin.clone(), SYSTEM_NAMESPACE);
    let machines: Api<LibvirtMachine> = Api::namespaced(admin.clone(), SYSTEM_NAMESPACE);
    let resident = || {
        libvirtd
            .guest_pids()
            .into_iter()
            .map(resident_bytes)
            .sum::<u64>()
    };
    let mib = |bytes: u64| bytes as f64 / f64::from(1 << 20);

    const RUNNING_POOL: &str = "warm";
    dev::apply(
        &admin,
        &guest_pool(RUNNING_POOL, members as i32, objects::GUEST_USER_DATA),
    )
    .await?;
    let ready = |pool: &'static str, saved: bool| {
        let vms = vms.clone();
        async move {
            Ok::<_, BoxError>(
                pool_members(&vms, pool)
                    .await?
                    .into_iter()
                    .filter(|vm| !vm.labels().contains_key(names::LABEL_CLAIM))
                    .filter(|vm| {
                        let ready = if pool == INFRASTRUCTURE_POOL {
                            infrastructure_ready(vm)
                        } else {
                            guest_ready(vm)
                        };
                        ready
                            && (!saved
                                || vm.status.as_ref().and_then(|s| s.standby)
                                    == Some(Standby::Saved))
                    })
                    .count(),
            )
        }
    };
    poll::until_every(
        "the running pool full",
        POOL_BOOT_DEADLINE,
        GUEST_POLL_INTERVAL,
        || async { Ok((ready(RUNNING_POOL, false).await? >= members).then_some(())) },
    )
    .await?;
    let running_rss = resident();
    let mut saved = guest_pool(SAVED_POOL, members as i32, objects::GUEST_USER_DATA);
    saved.spec.standby = Some(Standby::Saved);
    dev::apply(&admin, &saved).await?;
    poll::until_every(
        "the saved pool full",
        POOL_BOOT_DEADLINE,
        GUEST_POLL_INTERVAL,
        || async { Ok((ready(SAVED_POOL, true).await? >= members).then_some(())) },
    )
    .await?;
    let both_rss = resident();
    // Handed out as soon as the domain runs: the same guests, without waiting for their boot.
    let mut infrastructure = guest_pool(
        INFRASTRUCTURE_POOL,
        members as i32,
        objects::GUEST_USER_DATA,
    );
    infrastructure.spec.readiness = PoolReadiness::InfrastructureReady;
    dev::apply(&admin, &infrastructure).await?;
    poll::until_every(
        "the InfrastructureReady pool full",
        POOL_BOOT_DEADLINE,
        GUEST_POLL_INTERVAL,
        || async { Ok((ready(INFRASTRUCTURE_POOL, false).await? >= members).then_some(())) },
    )
    .await?;
    let mut images = 0;
    for vm in pool_members(&vms, SAVED_POOL).await? {
        if let Some(domain) = machines
            .get(&vm.name_any())
            .await?
            .status
            .and_then(|s| s.domain_name)
            && let Some(file) = save_image(libvirtd, &domain)?
        {
            images += std::fs::metadata(file)?.len();
        }
    }
    eprintln!(
        "{members} running members: guest processes hold {:.0} MiB resident; with {members} \
         saved members beside them: {:.0} MiB ({:+.0} MiB); save images {:.0} MiB in all",
        mib(running_rss),
        mib(both_rss),
        mib(both_rss) - mib(running_rss),
        mib(images)
    );

    let alice = control_plane.client_as(objects::CLAIMANT).await?;
    let claims: Api<VirtualMachineClaim> = Api::namespaced(alice, SYSTEM_NAMESPACE);
    let claims_admin: Api<VirtualMachineClaim> = Api::namespaced(admin.clone(), SYSTEM_NAMESPACE);
    let (mut warm_bound, mut saved_bound, mut saved_resumed) = (vec![], vec![], vec![]);
    let mut infrastructure_bound = vec![];
    for round in 0..rounds {
        for (pool, is_saved) in [
            (RUNNING_POOL, false),
            (SAVED_POOL, true),
            (INFRASTRUCTURE_POOL, false),
        ] {
            poll::until_every(
                "a member to take",
                POOL_BOOT_DEADLINE,
                GUEST_POLL_INTERVAL,
                || async { Ok((ready(pool, is_saved).await? >= 1).then_some(())) },
            )
            .await?;
            let name = format!("{pool}-{round}");
            let mut c = claim(&name);
            c.spec.pool_ref.name = pool.into();
            let times = create_timed(&claims, &claims_admin, &c, is_saved).await?;
            let bound = times.bound.as_secs_f64();
            if is_saved {
                saved_bound.push(bound);
                saved_resumed.push(times.resumed.ok_or("not resumed")?.as_secs_f64());
            } else if pool == INFRASTRUCTURE_POOL {
                infrastructure_bound.push(bound);
            } else {
                warm_bound.push(bound);
            }
            claims_admin.delete(&name, &DeleteParams::default()).await?;
        }
    }
    print_percentiles(
        "",
        [
            ("running pool (GuestReady), claim → Bound", &mut warm_bound),
            (
                "running pool (InfrastructureReady), claim → Bound",
                &mut infrastructure_bound,
            ),
            ("saved pool, claim → Bound", &mut saved_bound),
            ("saved pool, claim → Resumed", &mut saved_resumed),
        ],
    );
    eprintln!("saved pool: {}", resume_parts(&host.registry)?);
    Ok(())
}

/// The figures of docs/performance.md's "Per-claim access", run by hand (each claim waits for
/// its pool's refill): `BANLIEUE_ACCESS_BENCH_CLAIMS` claims (default 20), each with its own
/// key, one after another on a GuestReady pool of `BANLIEUE_ACCESS_BENCH_MEMBERS` members
/// (default 2), each made once the pool has a ready member, so every claim is warm. Prints
/// p50/p90/p99 of claim → Bound, claim → AccessReady and the difference, each timed from a
/// watch opened before the claim's create.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "a benchmark of real guests under TCG: a minute of both cores per claim"]
async fn access_on_a_warm_pool() -> Result<(), BoxError> {
    let mut host = DevHost::start().await?;
    let outcome = match host.set_up("bna", None).await {
        Ok(()) => access_bench(&host).await,
        Err(e) => Err(e),
    };
    host.finish(outcome).await
}

async fn access_bench(host: &DevHost) -> Result<(), BoxError> {
    let members = bench_knob("BANLIEUE_ACCESS_BENCH_MEMBERS", 2)?;
    let rounds = bench_knob("BANLIEUE_ACCESS_BENCH_CLAIMS", 20)?;
    let control_plane = &host.control_plane;
    let admin = control_plane.client()?;
    let vms: Api<VirtualMachine> = Api::namespaced(admin.clone(), SYSTEM_NAMESPACE);
    const POOL: &str = "keyed";
    dev::apply(
        &admin,
        &guest_pool(POOL, members as i32, objects::GUEST_USER_DATA),
    )
    .await?;
    let alice = control_plane.client_as(objects::CLAIMANT).await?;
    let claims: Api<VirtualMachineClaim> = Api::namespaced(alice, SYSTEM_NAMESPACE);
    let claims_admin: Api<VirtualMachineClaim> = Api::namespaced(admin.clone(), SYSTEM_NAMESPACE);
    let keys = tempfile::tempdir()?;
    let (mut bound, mut access, mut added) = (vec![], vec![], vec![]);
    for round in 0..rounds {
        an_unclaimed_ready_member(&vms, POOL).await?;
        let name = format!("{POOL}-{round}");
        let (_, public) = ssh_key(keys.path(), &name)?;
        let mut c = claim(&name);
        c.spec.pool_ref.name = POOL.into();
        c.spec.access = Some(banlieue_api::access::ClaimAccess {
            ssh_authorized_keys: vec![public],
            user: None,
        });
        let times = create_timed(&claims, &claims_admin, &c, false).await?;
        let ready = times.access.ok_or("no AccessReady")?;
        bound.push(times.bound.as_secs_f64());
        access.push(ready.as_secs_f64());
        added.push(ready.saturating_sub(times.bound).as_secs_f64());
        claims_admin.delete(&name, &DeleteParams::default()).await?;
    }
    print_percentiles(
        "access on a warm GuestReady pool, ",
        [
            ("claim → Bound", &mut bound),
            ("claim → AccessReady", &mut access),
            ("Bound → AccessReady", &mut added),
        ],
    );
    Ok(())
}

/// `BANLIEUE_HANDOVER_BENCH_CLAIMS` claims (default 20) on a pool of
/// `BANLIEUE_HANDOVER_BENCH_MEMBERS` (default 2), each made once the pool has a ready member;
/// each claim's subject verifies its VM as `banlieue claim verify` does, the moment its claim
/// is Bound. Prints p50/p90/p99 of claim → Bound and Bound → verified (challenge made, written,
/// relayed, activated and quoted in the guest's vTPM, relayed back, checked).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "a benchmark of real guests under TCG: a minute of both cores per claim"]
async fn handover_on_a_warm_pool() -> Result<(), BoxError> {
    let mut host = DevHost::start().await?;
    let outcome = match host.set_up("bnh", None).await {
        Ok(()) => handover_bench(&host).await,
        Err(e) => Err(e),
    };
    host.finish(outcome).await
}

async fn handover_bench(host: &DevHost) -> Result<(), BoxError> {
    let members = bench_knob("BANLIEUE_HANDOVER_BENCH_MEMBERS", 2)?;
    let rounds = bench_knob("BANLIEUE_HANDOVER_BENCH_CLAIMS", 20)?;
    let control_plane = &host.control_plane;
    let admin = control_plane.client()?;
    let vms: Api<VirtualMachine> = Api::namespaced(admin.clone(), SYSTEM_NAMESPACE);
    const POOL: &str = "attested";
    dev::apply(
        &admin,
        &guest_pool(POOL, members as i32, objects::GUEST_USER_DATA),
    )
    .await?;
    let alice = control_plane.client_as(objects::CLAIMANT).await?;
    let claims: Api<VirtualMachineClaim> = Api::namespaced(alice.clone(), SYSTEM_NAMESPACE);
    let claims_admin: Api<VirtualMachineClaim> = Api::namespaced(admin.clone(), SYSTEM_NAMESPACE);
    let trust = banlieue::claim_verify::Trust {
        bundle: dev::swtpm_localca_bundle()?,
        ..Default::default()
    };
    let (mut bound, mut verified) = (vec![], vec![]);
    for round in 0..rounds {
        an_unclaimed_ready_member(&vms, POOL).await?;
        let name = format!("{POOL}-{round}");
        let mut c = claim(&name);
        c.spec.pool_ref.name = POOL.into();
        let times = create_timed(&claims, &claims_admin, &c, false).await?;
        let started = Instant::now();
        let mut steps = Vec::new();
        banlieue::claim_verify::verify(
            &alice,
            SYSTEM_NAMESPACE,
            &name,
            &trust,
            DEADLINE,
            &mut steps,
        )
        .await?;
        bound.push(times.bound.as_secs_f64());
        verified.push(started.elapsed().as_secs_f64());
        claims_admin.delete(&name, &DeleteParams::default()).await?;
    }
    print_percentiles(
        "handover on a warm GuestReady pool, ",
        [
            ("claim → Bound", &mut bound),
            ("Bound → verified", &mut verified),
        ],
    );
    Ok(())
}

/// Waits until `pool` has a GuestReady member no claim holds: a claim made then is warm.
async fn an_unclaimed_ready_member(vms: &Api<VirtualMachine>, pool: &str) -> Result<(), BoxError> {
    poll::until_every(
        "a member to take",
        POOL_BOOT_DEADLINE,
        GUEST_POLL_INTERVAL,
        || async {
            Ok(pool_members(vms, pool)
                .await?
                .iter()
                .any(|vm| !vm.labels().contains_key(names::LABEL_CLAIM) && guest_ready(vm))
                .then_some(()))
        },
    )
    .await?;
    Ok(())
}

/// A benchmark's setting from the environment, `default` when unset.
fn bench_knob(name: &str, default: usize) -> Result<usize, BoxError> {
    match std::env::var(name) {
        Ok(v) => Ok(v.parse()?),
        Err(_) => Ok(default),
    }
}

/// One line per figure: its count and p50, p90 and p99 in seconds.
fn print_percentiles<const N: usize>(prefix: &str, rows: [(&str, &mut Vec<f64>); N]) {
    for (what, samples) in rows {
        eprintln!(
            "{prefix}{what}: n={} p50 {:.3} s, p90 {:.3} s, p99 {:.3} s",
            samples.len(),
            percentile(samples, 0.50),
            percentile(samples, 0.90),
            percentile(samples, 0.99)
        );
    }
}

/// The `p`-quantile (nearest rank) of `samples`.
fn percentile(samples: &mut [f64], p: f64) -> f64 {
    if samples.is_empty() {
        return f64::NAN;
    }
    samples.sort_by(f64::total_cmp);
    let rank = (p * samples.len() as f64).ceil() as usize;
    samples[rank.clamp(1, samples.len()) - 1]
}

/// The managed save image libvirt keeps for `domain` under the daemon's own directories.
fn save_image(libvirtd: &Libvirtd, domain: &str) -> Result<Option<std::path::PathBuf>, BoxError> {
    let wanted = format!("{domain}.save");
    let mut stack = vec![libvirtd.dir().to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let kind = entry.file_type()?;
            if kind.is_dir() && !kind.is_symlink() {
                stack.push(path);
            } else if entry.file_name().to_string_lossy() == wanted {
                return Ok(Some(path));
            }
        }
    }
    Ok(None)
}

/// VmRSS of process `pid` in bytes (0 when it is gone).
fn resident_bytes(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|status| {
            status.lines().find_map(|l| {
                let kib = l.strip_prefix("VmRSS:")?.trim().strip_suffix("kB")?.trim();
                kib.parse::<u64>().ok()
            })
        })
        .map_or(0, |kib| kib * 1024)
}

async fn scenario(host: &DevHost) -> Result<(), BoxError> {
    let (control_plane, libvirtd, registry) = (&host.control_plane, &host.libvirtd, &host.registry);
    let admin = control_plane.client()?;

    // Two warm members of the layered image, and one of a pool whose guests remove the layer
    // at boot; the claim is made before any has booted.
    let token = format!("seed-{}", std::process::id());
    let pool_created = Instant::now();
    let mut layered = guest_pool(POOL, 2, &marker_user_data(&token));
    layered.spec.startup_deadline_seconds = Some(STARTUP_DEADLINE.as_secs() as i64);
    dev::apply(&admin, &layered).await?;
    dev::apply(&admin, &guest_pool(NO_LAYER_POOL, 1, NO_LAYER_USER_DATA)).await?;
    let alice = control_plane.client_as(objects::CLAIMANT).await?;
    let claims: Api<VirtualMachineClaim> = Api::namespaced(alice, SYSTEM_NAMESPACE);
    claims
        .create(&PostParams::default(), &claim("first"))
        .await?;

    let vms: Api<VirtualMachine> = Api::namespaced(admin.clone(), SYSTEM_NAMESPACE);
    let machines: Api<LibvirtMachine> = Api::namespaced(admin.clone(), SYSTEM_NAMESPACE);
    let claims_admin: Api<VirtualMachineClaim> = Api::namespaced(admin.clone(), SYSTEM_NAMESPACE);

    // No member is handed out before its guest says `ready`: every look at the claim while no
    // member's GuestReady is True finds it waiting for a member.
    let bound = members_on_failure(
        poll::until_every(
            "the first claim to bind a booted guest",
            POOL_BOOT_DEADLINE,
            GUEST_POLL_INTERVAL,
            || async {
                let claim = claims_admin.get("first").await?;
                let members = pool_members(&vms, POOL).await?;
                let any_ready = members.iter().any(guest_ready);
                let st = claim.status.clone().unwrap_or_default();
                if st.phase == Some(ClaimPhase::Bound) {
                    return Ok(Some(claim));
                }
                let why = conditions::find(&st.conditions, types::BOUND)
                    .map(|c| c.reason.clone())
                    .unwrap_or_default();
                let expected_wait = why.is_empty() || why == reasons::NO_MEMBER_AVAILABLE;
                if !any_ready && !expected_wait {
                    return Err(format!("a claim waiting for guests says {why}").into());
                }
                Ok(None)
            },
        )
        .await,
        &vms,
        POOL,
    )
    .await?;
    let first_bound = pool_created.elapsed();
    let st = bound.status.clone().unwrap_or_default();
    let member = st
        .virtual_machine_ref
        .clone()
        .ok_or("a Bound claim names no member")?
        .name;
    let vm = vms.get(&member).await?;
    let vm_status = vm.status.clone().unwrap_or_default();
    let guest_ready_since = conditions::find(&vm_status.conditions, types::GUEST_READY)
        .filter(|c| c.status == status::TRUE)
        .map(|c| c.last_transition_time.0)
        .ok_or("the bound member's GuestReady is not True")?;
    let bound_at = st.bound_at.clone().ok_or("no boundAt")?.0;
    assert!(
        guest_ready_since <= bound_at,
        "bound at {bound_at} before the guest was ready at {guest_ready_since}"
    );
    assert_eq!(vm_status.guest_phase.as_deref(), Some("ready"));
    let domain = names::domain_name(SYSTEM_NAMESPACE, &member);
    eprintln!("first claim Bound to {domain} {first_bound:.1?} after the pool was created");

    // The claim's address is the guest's: what its NIC carries, made from its MAC.
    let mac = domain_mac(libvirtd, &domain).await?;
    let expected = objects::guest_address(&mac).ok_or("no address for the MAC")?;
    let claimed: Vec<&str> = st.addresses.iter().map(|a| a.address.as_str()).collect();
    assert_eq!(claimed, vec![expected.as_str()], "claim addresses");
    let ip = guest_agent::run(libvirtd, &domain, "/usr/sbin/ip", &["-4", "-o", "addr"]).await?;
    assert!(
        String::from_utf8_lossy(&ip).contains(&format!("inet {expected}/15")),
        "the guest's own addresses: {}",
        String::from_utf8_lossy(&ip)
    );

    // cloud-init consumed the seed: the user-data's file, and the domain UUID as instance-id.
    let marker = guest_agent::read_text(libvirtd, &domain, MARKER).await?;
    assert_eq!(marker.trim(), token);
    let uuid = domain_uuid(&machines, &member).await?;
    let instance_id =
        guest_agent::read_text(libvirtd, &domain, "/var/lib/cloud/data/instance-id").await?;
    assert_eq!(instance_id.trim(), uuid, "instance-id");

    // The EK certificates on the claim are the TPM's, as the guest reads them.
    check_ek_certificates(&admin, libvirtd, &domain, &st.tpm_endorsement_certificates).await?;
    assert_eq!(
        st.tpm_endorsement_key_digests.len(),
        st.tpm_endorsement_certificates.len()
    );
    let tpm_rsa = guest_ek_public_key_digest(libvirtd, &domain).await?;
    assert_eq!(
        st.tpm_endorsement_key_digests[0], tpm_rsa,
        "the RSA EK certificate's key is not the key the guest's TPM reports"
    );

    // The other member, once ready too, has its own TPM and so its own certificates.
    let other = members_on_failure(
        poll::until_every(
            "the second member to be GuestReady",
            POOL_BOOT_DEADLINE,
            GUEST_POLL_INTERVAL,
            || async {
                let members = pool_members(&vms, POOL).await?;
                Ok(members
                    .into_iter()
                    .find(|vm| vm.name_any() != member && guest_ready(vm)))
            },
        )
        .await,
        &vms,
        POOL,
    )
    .await?;
    let other_digests = other
        .status
        .clone()
        .unwrap_or_default()
        .tpm_endorsement_key_digests;
    assert_eq!(other_digests.len(), 2);
    assert!(
        other_digests
            .iter()
            .all(|d| !st.tpm_endorsement_key_digests.contains(d)),
        "two members share an EK"
    );

    // A claim against the warm pool, timed from a watch so that the figure compares with the
    // claim benchmark's against InfrastructureReady pools.
    // It carries alice's key: installed after the bind, with no cold start.
    let keys = tempfile::tempdir()?;
    let (alice_key, alice_public) = ssh_key(keys.path(), "alice")?;
    let (bob_key, _) = ssh_key(keys.path(), "bob")?;
    let mut keyed = claim("warm");
    keyed.spec.access = Some(banlieue_api::access::ClaimAccess {
        ssh_authorized_keys: vec![alice_public],
        user: Some("alice".into()),
    });
    let warm = create_timed(&claims, &claims_admin, &keyed, false).await?;
    let access_after = warm.access.ok_or("no AccessReady")?;
    eprintln!(
        "claim against a warm GuestReady pool Bound in {:.3?}, AccessReady in {access_after:.3?} \
         ({:.3?} after Bound)",
        warm.bound,
        access_after.saturating_sub(warm.bound)
    );
    let claimed_keys = check_access(
        control_plane,
        libvirtd,
        &claims_admin,
        "warm",
        (&alice_key, &bob_key),
    )
    .await?;

    // The layerless guests' pool says why it never fills.
    let pools: Api<VirtualMachinePool> = Api::namespaced(admin.clone(), SYSTEM_NAMESPACE);
    let absent = poll::until_every(
        "the layerless pool to say ReadinessSignalAbsent",
        BOOT_DEADLINE + SIGNAL_GRACE,
        GUEST_POLL_INTERVAL,
        || async {
            let pool = pools.get(NO_LAYER_POOL).await?;
            let conds = pool.status.map(|s| s.conditions).unwrap_or_default();
            Ok(conditions::find(&conds, types::READY)
                .filter(|c| c.reason == reasons::READINESS_SIGNAL_ABSENT)
                .cloned())
        },
    )
    .await?;
    eprintln!("layerless pool: {}: {}", absent.reason, absent.message);
    // The pool gives up after the grace, which a guest booting under load may outlast: until
    // its agent connects, the provider cannot yet tell that the guest has no phase file. A
    // member may also be replaced meanwhile (a guest that failed under load), so each poll
    // looks at the pool's members of the moment.
    let seen = std::cell::RefCell::new(std::collections::BTreeSet::new());
    let guest = poll::until_every(
        "a layerless machine's GuestReady once its agent answers",
        BOOT_DEADLINE,
        GUEST_POLL_INTERVAL,
        || async {
            for member in pool_members(&vms, NO_LAYER_POOL).await? {
                let name = member.name_any();
                if seen.borrow_mut().insert(name.clone()) {
                    eprintln!("layerless pool member: {name}");
                }
                let Some(machine) = machines.get_opt(&name).await? else {
                    continue;
                };
                let conditions = machine.status.unwrap_or_default().contract.conditions;
                if let Some(guest) = conditions::find(&conditions, types::GUEST_READY)
                    .filter(|guest| guest.reason != reasons::AGENT_NOT_CONNECTED)
                {
                    return Ok(Some(guest.clone()));
                }
            }
            Ok(None)
        },
    )
    .await?;
    assert_eq!(
        (guest.status.as_str(), guest.reason.as_str()),
        (status::UNKNOWN, reasons::GUEST_PHASE_ABSENT),
        "{}",
        guest.message
    );
    pools
        .delete(NO_LAYER_POOL, &DeleteParams::default())
        .await?;

    // The refill: two new members, each a new instance of cloud-init.
    let refill = members_on_failure(
        poll::until_every(
            "the pool to refill with ready guests",
            POOL_BOOT_DEADLINE,
            GUEST_POLL_INTERVAL,
            || async {
                let members = pool_members(&vms, POOL).await?;
                let warm: Vec<String> = members
                    .iter()
                    .filter(|vm| !vm.labels().contains_key(names::LABEL_CLAIM) && guest_ready(vm))
                    .map(|vm| vm.name_any())
                    .collect();
                let gone = pool_members_all(&vms, NO_LAYER_POOL).await?.is_empty();
                Ok((warm.len() == 2 && gone).then_some(warm))
            },
        )
        .await,
        &vms,
        POOL,
    )
    .await?;
    for name in &refill {
        let id = guest_agent::read_text(
            libvirtd,
            &names::domain_name(SYSTEM_NAMESPACE, name),
            "/var/lib/cloud/data/instance-id",
        )
        .await?;
        assert_eq!(id.trim(), domain_uuid(&machines, name).await?);
        assert_ne!(id.trim(), uuid, "a replacement reuses the instance-id");
    }
    check_unclaimed_refuses(&vms, &refill[0], &claimed_keys, &alice_key).await?;
    eprintln!(
        "guest_ready_seconds over {} guests: {:.1} s on average",
        metric(registry, "guest_ready_seconds_count")?,
        metric(registry, "guest_ready_seconds_sum")?
            / metric(registry, "guest_ready_seconds_count")?
    );

    // Ready guests cost only events and the resync: agent commands while four ready guests
    // sit idle.
    let guests = machines.list(&ListParams::default()).await?.items.len();
    let before = metric(registry, "agent_commands_total")?;
    tokio::time::sleep(QUIET).await;
    let after = metric(registry, "agent_commands_total")?;
    let per_minute = (after - before) / guests as f64 * 60.0 / QUIET.as_secs_f64();
    eprintln!(
        "agent commands once ready: {} in {QUIET:?} for {guests} guests = {per_minute:.1} per \
         machine per minute",
        after - before
    );

    // The agent goes away in the bound guest: reported, and nothing bound is touched.
    guest_agent::run(
        libvirtd,
        &domain,
        "/bin/sh",
        &[
            "-c",
            "(sleep 1; systemctl stop qemu-guest-agent) >/dev/null 2>&1 &",
        ],
    )
    .await?;
    poll::until_every(
        "the machine to report its agent gone",
        DEADLINE,
        GUEST_POLL_INTERVAL,
        || async {
            let m = machines.get(&member).await?;
            let conds = m.status.map(|s| s.contract.conditions).unwrap_or_default();
            Ok(conditions::find(&conds, types::AGENT_CONNECTED)
                .filter(|c| c.status == status::FALSE && c.reason == reasons::AGENT_NOT_CONNECTED)
                .map(|_| ()))
        },
    )
    .await?;
    let still = claims_admin.get("first").await?;
    assert_eq!(
        still.status.as_ref().and_then(|s| s.phase),
        Some(ClaimPhase::Bound)
    );
    let vm = vms.get(&member).await?;
    assert!(vm.metadata.deletion_timestamp.is_none());
    assert!(guest_ready(&vm), "GuestReady is final for the boot");

    hostile_agent(&admin, libvirtd, &claims_admin, &machines).await?;
    // The Deferred claim is also the fresh claim of a legitimate user after the hostile guest:
    // it binds through the same Provider the trickling agent tried to hold.
    deferred_install(&admin, libvirtd, &claims, &vms).await
}

/// Stands in for qemu-guest-agent on the guest's own virtio-serial port, as the guest's root
/// can: it answers every command, but gives each file out one byte at a time and never says
/// `eof`. libvirt's `guest-sync` before each command is answered as qemu-ga answers it.
const HOSTILE_AGENT: &str = r#"
import json, os, subprocess, time
time.sleep(2)  # let the guest-exec that started this finish first
subprocess.run(["systemctl", "stop", "qemu-guest-agent"])
port = os.open("/dev/virtio-ports/org.qemu.guest_agent.0", os.O_RDWR)
pending = b""
while True:
    chunk = os.read(port, 4096)
    if not chunk:
        time.sleep(0.1)
        continue
    pending += chunk.replace(b"\xff", b"")
    while b"\n" in pending:
        line, pending = pending.split(b"\n", 1)
        try:
            command = json.loads(line)
        except ValueError:
            continue
        name = command.get("execute", "")
        arguments = command.get("arguments", {})
        if name.startswith("guest-sync"):
            reply = {"return": arguments.get("id")}
        elif name == "guest-file-open":
            reply = {"return": 7}
        elif name == "guest-file-read":
            time.sleep(0.2)
            reply = {"return": {"count": 1, "buf-b64": "cg==", "eof": False}}
        else:
            reply = {"return": {}}
        prefix = b"\xff" if name == "guest-sync-delimited" else b""
        os.write(port, prefix + json.dumps(reply).encode() + b"\n")
"#;

/// A guest whose root answers for its agent and trickles the phase file out a byte at a time
/// cannot hold its machine: the provider gives up after its read cap and says so, and releasing
/// the claim tears the machine down at once (before the cap, each look could take 16,385 reads).
async fn hostile_agent(
    admin: &Client,
    libvirtd: &Libvirtd,
    claims: &Api<VirtualMachineClaim>,
    machines: &Api<LibvirtMachine>,
) -> Result<(), BoxError> {
    use kube::api::{Patch, PatchParams};
    // No refill: the warm members go, and no new guest boots beside the next steps.
    let pools: Api<VirtualMachinePool> = Api::namespaced(admin.clone(), SYSTEM_NAMESPACE);
    pools
        .patch(
            POOL,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"replicas": 0}})),
        )
        .await?;
    let member = claims
        .get("warm")
        .await?
        .status
        .and_then(|s| s.virtual_machine_ref)
        .ok_or("the warm claim names no member")?
        .name;
    let domain = names::domain_name(SYSTEM_NAMESPACE, &member);
    guest_agent::run(
        libvirtd,
        &domain,
        "/usr/bin/systemd-run",
        &[
            "--unit=hostile-agent",
            "/usr/bin/python3",
            "-c",
            HOSTILE_AGENT,
        ],
    )
    .await?;
    let said = poll::until_every(
        "the provider to give up on the trickling agent",
        DEADLINE,
        GUEST_POLL_INTERVAL,
        || async {
            let m = machines.get(&member).await?;
            let conds = m.status.map(|s| s.contract.conditions).unwrap_or_default();
            Ok(conditions::find(&conds, types::AGENT_CONNECTED)
                .filter(|c| c.status == status::FALSE && c.message.contains("reads"))
                .cloned())
        },
    )
    .await?;
    eprintln!("hostile agent: {}: {}", said.reason, said.message);
    let released = Instant::now();
    claims.delete("warm", &DeleteParams::default()).await?;
    poll::until_every(
        "the hostile guest's machine to be torn down",
        DEADLINE,
        GUEST_POLL_INTERVAL,
        || async { Ok(machines.get_opt(&member).await?.is_none().then_some(())) },
    )
    .await?;
    eprintln!(
        "hostile guest's machine gone {:.1?} after its claim was released",
        released.elapsed()
    );
    Ok(())
}

/// A Deferred image: each member boots the installer CD beside its empty disk; the installer
/// writes the test guest onto the disk and reboots into it. The GuestReady pool hands the member
/// out only once the installed system, running from the machine's own disk, says `ready`.
async fn deferred_install(
    admin: &Client,
    libvirtd: &Libvirtd,
    claims: &Api<VirtualMachineClaim>,
    vms: &Api<VirtualMachine>,
) -> Result<(), BoxError> {
    let installer = banlieue_testenv::guest_image::installer_path()
        .await
        .map_err(|e| banlieue_testenv::control_plane::error_chain(&e))?;
    dev::upload_volume(libvirtd, &installer, objects::INSTALLER_VOLUME).await?;
    dev::apply(admin, &objects::installer_image()).await?;
    let mut pool = guest_pool(DEFERRED_POOL, 1, objects::GUEST_USER_DATA);
    pool.spec.template.spec.image_ref = LocalObjectReference::new(objects::INSTALLER_IMAGE);
    let created = Instant::now();
    dev::apply(admin, &pool).await?;
    let mut installed = claim("installed");
    installed.spec.pool_ref.name = DEFERRED_POOL.into();
    claims.create(&PostParams::default(), &installed).await?;

    // An install and two boots.
    let bound = poll::until_every(
        "the Deferred pool's claim to bind",
        BOOT_DEADLINE * 2,
        GUEST_POLL_INTERVAL,
        || async {
            let claim = claims.get("installed").await?;
            let bound = claim.status.as_ref().and_then(|s| s.phase) == Some(ClaimPhase::Bound);
            Ok(bound.then_some(claim))
        },
    )
    .await?;
    eprintln!(
        "Deferred claim Bound {:.1?} after its pool was created (install, reboot, boot)",
        created.elapsed()
    );
    let st = bound.status.unwrap_or_default();
    let member = st
        .virtual_machine_ref
        .ok_or("a Bound claim names no member")?
        .name;
    let vm = vms.get(&member).await?;
    assert!(guest_ready(&vm));
    assert_eq!(
        vm.status.as_ref().and_then(|s| s.guest_phase.as_deref()),
        Some("ready")
    );
    assert_eq!(st.tpm_endorsement_certificates.len(), 2, "EK certificates");
    let domain = names::domain_name(SYSTEM_NAMESPACE, &member);
    // The running system is the installed one, on the machine's own disk, with the install
    // medium still attached and no backing file under the disk.
    let root = guest_agent::run(
        libvirtd,
        &domain,
        "/usr/bin/findmnt",
        &["-n", "-o", "SOURCE", "/"],
    )
    .await?;
    assert_eq!(String::from_utf8_lossy(&root).trim(), "/dev/vda2");
    let xml = libvirtd.virsh(["dumpxml", &domain]).await?;
    assert!(
        xml.contains(objects::INSTALLER_VOLUME),
        "install medium attached"
    );
    assert!(
        !xml.contains(objects::GUEST_IMAGE_VOLUME),
        "a Deferred disk has no backing image"
    );
    Ok(())
}

/// The file the pool's user-data writes, which the test reads back through the agent.
const MARKER: &str = "/var/lib/banlieue-test/seed-marker";

/// The dev guest user-data (an address on the isolated network) plus a file holding `token`.
/// A key pair made by `ssh-keygen` in `dir`: the private key's path and the public line.
fn ssh_key(dir: &std::path::Path, who: &str) -> Result<(std::path::PathBuf, String), BoxError> {
    let path = dir.join(who);
    let made = std::process::Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-C", who, "-f"])
        .arg(&path)
        .status()?;
    if !made.success() {
        return Err(format!("ssh-keygen for {who}: {made}").into());
    }
    let public = std::fs::read_to_string(path.with_extension("pub"))?;
    Ok((path, public.trim().to_owned()))
}

/// `banlieue claim -n SYSTEM_NAMESPACE ssh NAME -i KEY -- ARGS` as alice, with alice's own
/// kubeconfig: the VM verified first with the EK trust bundle at `trust_bundle`, or not
/// (`--no-verify`).
async fn claim_ssh(
    control_plane: &ControlPlane,
    name: &str,
    key: &std::path::Path,
    trust_bundle: Option<&std::path::Path>,
    args: &[&str],
) -> Result<std::process::Output, BoxError> {
    let key = key.display().to_string();
    let bundle = trust_bundle.map(|b| b.display().to_string());
    let mut line = vec!["ssh", name, "-i", &key];
    match &bundle {
        Some(bundle) => line.extend(["--trust-bundle", bundle]),
        None => line.push("--no-verify"),
    }
    line.push("--");
    line.extend(args);
    claim_cli_as_alice(control_plane, &line).await
}

/// `banlieue claim -n SYSTEM_NAMESPACE ARGS` as alice, with alice's own kubeconfig.
async fn claim_cli_as_alice(
    control_plane: &ControlPlane,
    args: &[&str],
) -> Result<std::process::Output, BoxError> {
    let kubeconfig = control_plane
        .kubeconfig(objects::CLAIMANT)
        .ok_or("alice's kubeconfig")?
        .to_owned();
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_banlieue"));
    command
        .env("KUBECONFIG", kubeconfig)
        .env_remove("BANLIEUE_EK_TRUST_BUNDLE")
        .args(["claim", "-n", SYSTEM_NAMESPACE])
        .args(args)
        .stdin(std::process::Stdio::null());
    Ok(tokio::task::spawn_blocking(move || command.output()).await??)
}

/// PCR reference values (ADR-0077): alice writes the values a verified boot quoted, then
/// verifies against them; those `banlieue imagebuild pcrs` computes from the image are the
/// boot's PCR 4 and 5 and verify alone; the file with PCR 4 (the boot chain's EFI
/// applications) changed is refused naming that PCR.
async fn check_references(
    control_plane: &ControlPlane,
    (libvirtd, domain): (&Libvirtd, &str),
    name: &str,
    bundle: &std::path::Path,
) -> Result<(), BoxError> {
    let dir = tempfile::tempdir()?;
    let written = dir.path().join("pcrs");
    let bundle_arg = bundle.display().to_string();
    let written_arg = written.display().to_string();
    let verify = |extra: Vec<String>| {
        let mut line: Vec<String> = ["verify", name, "--trust-bundle", &bundle_arg]
            .map(str::to_owned)
            .into();
        line.extend(extra);
        async move {
            let line: Vec<&str> = line.iter().map(String::as_str).collect();
            claim_cli_as_alice(control_plane, &line).await
        }
    };
    let out = verify(vec!["--write-pcrs".into(), written_arg.clone()]).await?;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let references = std::fs::read_to_string(&written)?;
    assert_eq!(references.lines().count(), 8, "{references}");
    let out = verify(vec!["--pcr-references".into(), written_arg.clone()]).await?;
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "{said}\nthe guest's side:\n{}",
        guest_handover_log(libvirtd, domain).await
    );
    assert!(
        said.contains("ok  reference values: PCRs 0,1,2,3,4,5,6,7 hold the values declared"),
        "{said}"
    );
    // The image's own: PCR 4 and 5 computed from the test image's bytes with `banlieue
    // imagebuild pcrs` (what the image builder publishes on a VMImage) are the boot's, and a
    // verify against that file alone checks those two.
    let image = banlieue_testenv::guest_image::path().await?;
    let from_image = dir.path().join("image.pcrs");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_banlieue"))
        .args(["imagebuild", "pcrs"])
        .arg(&image)
        .arg("--write")
        .arg(&from_image)
        .output()?;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let computed = std::fs::read_to_string(&from_image)?;
    let booted: String = references
        .lines()
        .filter(|l| l.starts_with("4 ") || l.starts_with("5 "))
        .map(|l| format!("{l}\n"))
        .collect();
    assert_eq!(
        computed, booted,
        "computed from the image against a boot's quote"
    );
    let out = verify(vec![
        "--pcr-references".into(),
        from_image.display().to_string(),
    ])
    .await?;
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{said}");
    assert!(
        said.contains("ok  reference values: PCRs 4,5 hold the values declared"),
        "{said}"
    );
    let other_boot: String = references
        .lines()
        .map(|l| match l.strip_prefix("4 ") {
            Some(_) => format!("4 {}\n", "5a".repeat(32)),
            None => format!("{l}\n"),
        })
        .collect();
    std::fs::write(&written, other_boot)?;
    let out = verify(vec!["--pcr-references".into(), written_arg]).await?;
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "another boot chain's PCR 4 was accepted"
    );
    assert!(
        said.contains(&format!(
            "not the reference value {} declared for the image",
            "5a".repeat(32)
        )),
        "{said}"
    );
    Ok(())
}

/// What the guest's layer did with the challenges relayed to it, for a failed handover's
/// message: its attestation units' journal and the attest directory.
async fn guest_handover_log(libvirtd: &Libvirtd, domain: &str) -> String {
    let script = "journalctl -o short-precise --no-pager -u banlieue-guest-attest.path \
                  -u banlieue-guest-attest.service | tail -30; ls -la --time-style=+%T.%N \
                  /run/banlieue/attest; cat /run/banlieue/attest/activate";
    match guest_agent::run(libvirtd, domain, "/bin/sh", &["-c", script]).await {
        Ok(out) => String::from_utf8_lossy(&out).into_owned(),
        Err(e) => format!("(the guest agent: {e})"),
    }
}

/// A secret only alice's VM can open (ADR-0077): sealed by her with `banlieue claim seal`,
/// opened by her verified guest for her login alone, and nowhere in the API server's store,
/// where the sealed bytes are (read from etcd's own files: its WAL and database).
async fn check_seal(
    control_plane: &ControlPlane,
    libvirtd: &Libvirtd,
    name: &str,
    domain: &str,
    bundle: &std::path::Path,
) -> Result<(), BoxError> {
    use banlieue_attest::rand_core::{OsRng, RngCore};
    let mut nonce = [0u8; 12];
    OsRng.fill_bytes(&mut nonce);
    let token = format!("alice's deploy token {}", hex(&nonce));
    let file = tempfile::NamedTempFile::new()?;
    std::fs::write(file.path(), &token)?;
    let file_arg = file.path().display().to_string();
    let bundle_arg = bundle.display().to_string();
    let sealed = claim_cli_as_alice(
        control_plane,
        &[
            "seal",
            name,
            "--from-file",
            &file_arg,
            "--trust-bundle",
            &bundle_arg,
        ],
    )
    .await?;
    let said = String::from_utf8_lossy(&sealed.stderr);
    assert!(sealed.status.success(), "banlieue claim seal: {said}");
    assert!(
        String::from_utf8_lossy(&sealed.stdout)
            .contains("sealed payload opened at /run/banlieue/sealed/payload"),
        "{}",
        String::from_utf8_lossy(&sealed.stdout)
    );
    assert!(
        said.contains("ok  sealed payload: opened by the verified guest"),
        "{said}"
    );
    let opened = guest_agent::read_text(libvirtd, domain, "/run/banlieue/sealed/payload").await?;
    assert_eq!(opened, token, "the payload her guest opened");
    let mode = guest_agent::run(
        libvirtd,
        domain,
        "/usr/bin/stat",
        &["-c", "%a %U", "/run/banlieue/sealed/payload"],
    )
    .await?;
    assert_eq!(String::from_utf8_lossy(&mode).trim(), "600 alice");

    let store = control_plane
        .state_dir()
        .ok_or("a local control plane")?
        .join("etcd");
    let stored = claims_sealed(control_plane, name).await?;
    let (mut sealed_seen, mut token_seen) = (false, false);
    for path in files_under(&store)? {
        let bytes = std::fs::read(&path)?;
        sealed_seen |= contains(&bytes, stored.as_bytes());
        token_seen |= contains(&bytes, token.as_bytes());
    }
    assert!(
        sealed_seen,
        "the sealed bytes are not in {}: the wrong store",
        store.display()
    );
    assert!(!token_seen, "alice's payload is in the API server's store");
    Ok(())
}

/// The claim's `spec.handover.sealed`, as the API server stores it.
async fn claims_sealed(control_plane: &ControlPlane, name: &str) -> Result<String, BoxError> {
    let claims: Api<VirtualMachineClaim> =
        Api::namespaced(control_plane.client()?, SYSTEM_NAMESPACE);
    Ok(claims
        .get(name)
        .await?
        .spec
        .handover
        .and_then(|h| h.sealed)
        .ok_or("no sealed payload on the claim")?)
}

fn files_under(dir: &std::path::Path) -> Result<Vec<std::path::PathBuf>, BoxError> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            out.extend(files_under(&path)?);
        } else {
            out.push(path);
        }
    }
    Ok(out)
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// The claim's keys in its guest: the claim names the login and the guest's own host key;
/// `banlieue claim ssh` runs a command there as alice with that key pinned; bob's key is
/// refused by the same guest. Returns the claim's host keys.
async fn check_access(
    control_plane: &ControlPlane,
    libvirtd: &Libvirtd,
    claims: &Api<VirtualMachineClaim>,
    name: &str,
    (alice_key, bob_key): (&std::path::Path, &std::path::Path),
) -> Result<Vec<String>, BoxError> {
    let claim = claims.get(name).await?;
    let st = claim.status.clone().unwrap_or_default();
    assert_eq!(st.login_user.as_deref(), Some("alice"));
    let member = st.virtual_machine_ref.clone().ok_or("no member")?.name;
    let domain = names::domain_name(SYSTEM_NAMESPACE, &member);
    let bridge = format!("{GUEST_NETWORK}{}", std::process::id());
    let address = st.addresses.first().ok_or("no address")?.address.clone();
    banlieue_testenv::guest_network::route_to_guest(&bridge, &address)?;
    // The pinned key is the one sshd serves, read from inside the guest.
    let served =
        guest_agent::read_text(libvirtd, &domain, "/etc/ssh/ssh_host_ed25519_key.pub").await?;
    let served: Vec<&str> = served.split_whitespace().take(2).collect();
    assert_eq!(st.ssh_host_keys, vec![served.join(" ")], "sshHostKeys");

    // Verified first (ADR-0077): the guest's TPM, certified by swtpm-localca, answers alice's
    // challenge and quotes the host key that is then pinned.
    let bundle = tempfile::NamedTempFile::new()?;
    std::fs::write(bundle.path(), dev::swtpm_localca_bundle()?)?;
    let ran = claim_ssh(
        control_plane,
        name,
        alice_key,
        Some(bundle.path()),
        &["id", "-un"],
    )
    .await?;
    let said = String::from_utf8_lossy(&ran.stderr);
    assert!(ran.status.success(), "banlieue claim ssh as alice: {said}");
    assert_eq!(String::from_utf8_lossy(&ran.stdout).trim(), "alice");
    for step in [
        "ok  EK certificate 0",
        "ok  activation: the guest's TPM released the credential's secret",
        "ok  quote: signed by the attestation key",
        "ok  event log: the firmware's ",
        "ok  host keys: the claim's 1 SSH host key(s) are those the quoted guest holds",
        &format!("claim {name}: verified in "),
    ] {
        assert!(said.contains(step), "{step:?} not in:\n{said}");
    }
    if let Some(line) = said.lines().find(|l| l.contains(": verified in ")) {
        eprintln!("banlieue claim ssh as alice: {line}");
    }
    let answered = claims
        .get(name)
        .await?
        .status
        .unwrap_or_default()
        .attestation;
    assert!(
        answered
            .and_then(|a| a.answer)
            .and_then(|a| a.quote)
            .is_some(),
        "the relayed answer is on the claim"
    );

    check_seal(control_plane, libvirtd, name, &domain, bundle.path()).await?;
    check_references(control_plane, (libvirtd, &domain), name, bundle.path()).await?;

    let refused = claim_ssh(control_plane, name, bob_key, None, &["true"]).await?;
    assert!(
        !refused.status.success(),
        "bob's key opened alice's sandbox"
    );
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(said.contains("Permission denied"), "{said}");

    Ok(st.ssh_host_keys)
}

/// An unclaimed member (`unclaimed`, ready) has its own host key, not the claimed
/// `claimed_keys`, and accepts no consumer's key: a member holds none before its bind.
async fn check_unclaimed_refuses(
    vms: &Api<VirtualMachine>,
    unclaimed: &str,
    claimed_keys: &[String],
    alice_key: &std::path::Path,
) -> Result<(), BoxError> {
    let bridge = format!("{GUEST_NETWORK}{}", std::process::id());
    // An unclaimed member: its own host key, and no consumer's key is accepted there.
    let unclaimed = vms.get(unclaimed).await?;
    let unclaimed_status = unclaimed.status.clone().unwrap_or_default();
    assert!(!unclaimed_status.ssh_host_keys.is_empty());
    assert_ne!(
        unclaimed_status.ssh_host_keys, claimed_keys,
        "two members share a host key"
    );
    let address = unclaimed_status
        .addresses
        .first()
        .ok_or("the unclaimed member has no address")?
        .address
        .clone();
    banlieue_testenv::guest_network::route_to_guest(&bridge, &address)?;
    let known_hosts = tempfile::NamedTempFile::new()?;
    std::fs::write(
        known_hosts.path(),
        unclaimed_status
            .ssh_host_keys
            .iter()
            .map(|k| format!("{address} {k}\n"))
            .collect::<String>(),
    )?;
    let output = std::process::Command::new("ssh")
        .args([
            "-o",
            "StrictHostKeyChecking=yes",
            "-o",
            "BatchMode=yes",
            "-o",
            "ConnectTimeout=15",
            "-o",
        ])
        .arg(format!(
            "UserKnownHostsFile={}",
            known_hosts.path().display()
        ))
        .args(["-o", "IdentitiesOnly=yes", "-i"])
        .arg(alice_key)
        .arg(format!("alice@{address}"))
        .arg("true")
        .stdin(std::process::Stdio::null())
        .output()?;
    assert!(
        !output.status.success(),
        "an unclaimed member accepted alice's key"
    );
    let said = String::from_utf8_lossy(&output.stderr);
    assert!(said.contains("Permission denied"), "{said}");
    Ok(())
}

fn marker_user_data(token: &str) -> String {
    format!(
        "{}write_files:\n  - path: {MARKER}\n    content: \"{token}\\n\"\n",
        objects::GUEST_USER_DATA
    )
}

/// Removes the guest-phase layer before it could say anything: to the provider this guest is
/// one whose image never had it (its agent answers; there is no phase file).
const NO_LAYER_USER_DATA: &str = r#"#cloud-config
bootcmd:
  - [sh, -c, 'systemctl mask --runtime banlieue-guest-phase.service; rm -rf /run/banlieue']
"#;

fn guest_pool(name: &str, replicas: i32, user_data: &str) -> VirtualMachinePool {
    let mut pool = objects::guest_pool();
    pool.metadata.name = Some(name.into());
    pool.spec.replicas = replicas;
    pool.spec.template.spec.user_data = Some(user_data.into());
    assert_eq!(pool.spec.readiness, PoolReadiness::GuestReady);
    pool
}

fn claim(name: &str) -> VirtualMachineClaim {
    let mut claim = objects::claim();
    claim.metadata.name = Some(name.into());
    claim.spec.pool_ref.name = POOL.into();
    claim
}

fn infrastructure_ready(vm: &VirtualMachine) -> bool {
    vm.status
        .as_ref()
        .is_some_and(|s| conditions::is_true(&s.conditions, types::INFRASTRUCTURE_READY))
}

fn guest_ready(vm: &VirtualMachine) -> bool {
    vm.status
        .as_ref()
        .is_some_and(|s| conditions::is_true(&s.conditions, types::GUEST_READY))
}

async fn domain_uuid(machines: &Api<LibvirtMachine>, name: &str) -> Result<String, BoxError> {
    machines
        .get(name)
        .await?
        .status
        .and_then(|s| s.domain_uuid)
        .ok_or_else(|| format!("LibvirtMachine {name} has no domainUuid").into())
}

/// The pool's members that are not being deleted.
async fn pool_members(
    vms: &Api<VirtualMachine>,
    pool: &str,
) -> Result<Vec<VirtualMachine>, BoxError> {
    Ok(pool_members_all(vms, pool)
        .await?
        .into_iter()
        .filter(|vm| vm.metadata.deletion_timestamp.is_none())
        .collect())
}

async fn pool_members_all(
    vms: &Api<VirtualMachine>,
    pool: &str,
) -> Result<Vec<VirtualMachine>, BoxError> {
    let selector = format!("{}={pool}", names::LABEL_POOL);
    Ok(vms
        .list(&ListParams::default().labels(&selector))
        .await?
        .items)
}

/// The MAC of the domain's one interface, from its live XML.
async fn domain_mac(libvirtd: &Libvirtd, domain: &str) -> Result<String, BoxError> {
    let xml = libvirtd.virsh(["dumpxml", domain]).await?;
    let start = xml
        .find("<mac address='")
        .ok_or("no <mac> in the domain XML")?
        + 14;
    Ok(xml[start..start + 17].to_owned())
}

/// Plays the verifier: resolves the Provider's ekTrustBundle (a ConfigMap of this host's
/// swtpm-localca issuer and root), and checks that each certificate on the claim chains to it
/// and is byte for byte what `tpm2_nvread` reads from the TPM's EK certificate index.
async fn check_ek_certificates(
    admin: &Client,
    libvirtd: &Libvirtd,
    domain: &str,
    certificates: &[String],
) -> Result<(), BoxError> {
    assert_eq!(certificates.len(), 2, "the RSA and the ECC EK certificate");
    // The bundle exists once swtpm_localca made its CA, at the first vTPM start.
    dev::apply(
        admin,
        &objects::ek_trust_configmap(&dev::swtpm_localca_bundle()?),
    )
    .await?;
    let providers: Api<Provider> = Api::namespaced(admin.clone(), SYSTEM_NAMESPACE);
    let provider = providers.get(objects::PROVIDER).await?;
    let source = provider
        .spec
        .attestation
        .and_then(|a| a.ek_trust_bundle)
        .and_then(|b| b.config_map_ref)
        .ok_or("the Provider names no ekTrustBundle ConfigMap")?;
    let configmaps: Api<ConfigMap> = Api::namespaced(admin.clone(), SYSTEM_NAMESPACE);
    let bundle = configmaps
        .get(&source.name)
        .await?
        .data
        .unwrap_or_default()
        .remove(&source.key)
        .ok_or("the ekTrustBundle key is missing")?;
    let dir = tempfile::tempdir()?;
    let bundle_file = dir.path().join("bundle.pem");
    std::fs::write(&bundle_file, &bundle)?;

    for (pem, index) in certificates.iter().zip(["0x01c00002", "0x01c00016"]) {
        let der = pem_to_der(pem)?;
        let nv = guest_agent::run(libvirtd, domain, "/usr/bin/tpm2_nvread", &[index]).await?;
        assert_eq!(
            der, nv,
            "the certificate on the claim is not what NV index {index} holds"
        );
        let cert_file = dir.path().join(format!("{index}.pem"));
        std::fs::write(&cert_file, pem)?;
        let verify = std::process::Command::new("openssl")
            .args(["verify", "-CAfile"])
            .arg(&bundle_file)
            .arg(&cert_file)
            .output()?;
        assert!(
            verify.status.success(),
            "NV index {index}'s certificate does not chain to the ekTrustBundle: {}{}",
            String::from_utf8_lossy(&verify.stdout),
            String::from_utf8_lossy(&verify.stderr)
        );
    }
    let distinct: BTreeMap<&String, ()> = certificates.iter().map(|c| (c, ())).collect();
    assert_eq!(distinct.len(), 2);
    Ok(())
}

/// `sha256:<hex>` of the RSA EK public key as the guest's TPM itself reports it
/// (`tpm2_createek` with the default RSA template, the one the index-0x01c00002 certificate
/// is issued for), as DER SubjectPublicKeyInfo.
async fn guest_ek_public_key_digest(libvirtd: &Libvirtd, domain: &str) -> Result<String, BoxError> {
    guest_agent::run(
        libvirtd,
        domain,
        "/usr/bin/tpm2_createek",
        &[
            "-c",
            "/run/ek.ctx",
            "-G",
            "rsa",
            "-u",
            "/run/ek.pem",
            "-f",
            "pem",
        ],
    )
    .await?;
    let pem = guest_agent::read_text(libvirtd, domain, "/run/ek.pem").await?;
    let der = pem_to_der(&pem)?;
    Ok(format!("sha256:{}", hex(&Sha256::digest(&der))))
}

fn pem_to_der(pem: &str) -> Result<Vec<u8>, BoxError> {
    use base64::Engine;
    let body: String = pem.lines().filter(|l| !l.starts_with("-----")).collect();
    Ok(base64::engine::general_purpose::STANDARD.decode(body)?)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Where a resume's time went, from the provider's histograms: the restore itself (QEMU
/// started from the save image) and the guest agent's answer to the clock being set.
fn resume_parts(registry: &Registry) -> Result<String, BoxError> {
    let mean = |name: &str| -> Result<(f64, f64), BoxError> {
        let count = metric(registry, &format!("{name}_count"))?;
        Ok((count, metric(registry, &format!("{name}_sum"))? / count))
    };
    let (restores, restore) = mean("restore_seconds")?;
    let (_, clock) = mean("clock_set_seconds")?;
    Ok(format!(
        "{restores} restores took {restore:.2} s each on average (domain started from its save \
         image), then {clock:.2} s until the guest's clock was set through its agent"
    ))
}

/// The value of a provider metric (`banlieue_provider_libvirt_<name>`) in `registry`.
fn metric(registry: &Registry, name: &str) -> Result<f64, BoxError> {
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, registry)?;
    let full = format!("banlieue_provider_libvirt_{name} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&full))
        .ok_or_else(|| format!("no metric {full:?}").into())
        .and_then(|v| v.trim().parse::<f64>().map_err(BoxError::from))
}

/// `result`, printing first, when it is an error, what each of the pool's members reports:
/// a failed wait for guests then says which guest was stuck and where.
async fn members_on_failure<T>(
    result: Result<T, poll::PollTimeout>,
    vms: &Api<VirtualMachine>,
    pool: &str,
) -> Result<T, BoxError> {
    if result.is_err() {
        for vm in pool_members_all(vms, pool).await.unwrap_or_default() {
            let status = vm.status.clone().unwrap_or_default();
            let conditions: Vec<String> = status
                .conditions
                .iter()
                .map(|c| format!("{}={} {}: {}", c.type_, c.status, c.reason, c.message))
                .collect();
            eprintln!(
                "member {} (created {:?}, deleting {}, phase {:?}): {}",
                vm.name_any(),
                vm.metadata.creation_timestamp.as_ref().map(|t| t.0),
                vm.metadata.deletion_timestamp.is_some(),
                status.guest_phase,
                conditions.join("; ")
            );
        }
    }
    Ok(result?)
}

/// How long a claim took, from its create, as a watch on it opened before the create saw it:
/// the moment the API server shows each step, not a poll's next tick.
#[derive(Clone, Copy, Debug)]
struct ClaimTimes {
    bound: Duration,
    /// Until `Resumed=True`, when it was waited for.
    resumed: Option<Duration>,
    /// Until `AccessReady=True`, for a claim with `spec.access`.
    access: Option<Duration>,
}

/// Creates `claim` through `claims` (the claimant's client) and times it through `watch` (the
/// admin's) until it is Bound and, with `wait_resumed`, until its `Resumed` condition is True.
async fn create_timed(
    claims: &Api<VirtualMachineClaim>,
    watch: &Api<VirtualMachineClaim>,
    claim: &VirtualMachineClaim,
    wait_resumed: bool,
) -> Result<ClaimTimes, BoxError> {
    use futures::TryStreamExt as _;
    use kube::runtime::watcher;
    let name = claim.name_any();
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut events = std::pin::pin!(watcher(watch.clone(), config));
    // Open once its first list is done: nothing that follows the create is missed.
    while !matches!(
        events.try_next().await?.ok_or("the watch ended")?,
        watcher::Event::InitDone
    ) {}
    let made = Instant::now();
    claims.create(&PostParams::default(), claim).await?;
    let (mut bound, mut resumed, mut access) = (None, None, None);
    let wait_access = claim.spec.access.is_some();
    let seen = tokio::time::timeout(DEADLINE, async {
        while let Some(event) = events.try_next().await? {
            let (watcher::Event::Apply(c) | watcher::Event::InitApply(c)) = event else {
                continue;
            };
            let status = c.status.unwrap_or_default();
            if bound.is_none() && status.phase == Some(ClaimPhase::Bound) {
                bound = Some(made.elapsed());
            }
            if resumed.is_none() && conditions::is_true(&status.conditions, types::RESUMED) {
                resumed = Some(made.elapsed());
            }
            if access.is_none() && conditions::is_true(&status.conditions, types::ACCESS_READY) {
                access = Some(made.elapsed());
            }
            if let Some(refused) = conditions::find(&status.conditions, types::ACCESS_READY)
                .filter(|c| c.reason == reasons::ACCESS_REFUSED)
            {
                return Err(format!("claim {name}: {}", refused.message).into());
            }
            if let Some(bound) = bound
                && (resumed.is_some() || !wait_resumed)
                && (access.is_some() || !wait_access)
            {
                return Ok::<_, BoxError>(ClaimTimes {
                    bound,
                    resumed,
                    access,
                });
            }
        }
        Err("the watch ended".into())
    })
    .await;
    seen.map_err(|_| {
        format!(
            "claim {name}: not Bound{}{} within {DEADLINE:?}",
            if wait_resumed { " and Resumed" } else { "" },
            if wait_access { " and AccessReady" } else { "" }
        )
    })?
}

//! A pool across three real libvirt hosts, and a host that goes away: a real control plane,
//! three private libvirtd instances on loopback registered as three Providers, the controller
//! and the Provider operator running in this process as the controller's ServiceAccount and each
//! Provider's workload as the ServiceAccount the operator made for it, all under the shipped RBAC
//! (as `banlieue dev up` wires its one host).
//!
//! What it shows against the hosts themselves (through `virsh`, a client independent of
//! banlieue's):
//! - a pool of six spreads two to a host (ADR-0066);
//! - a host declared full (`memoryOvercommitPercent`) takes no new member, and a machine that
//!   fits nowhere is `InsufficientCapacity`, naming every host;
//! - a host whose libvirtd stops is reported not Ready by its workload; after the controller's
//!   `provider_lost_after` its unclaimed members are replaced on the other hosts while their
//!   deletions wait for the host, a claim bound there stays Bound, and once the daemon is back
//!   (same state, same port) the provider destroys the replaced members' domains and the
//!   deletions complete (ADR-0068).
//!
//! Guests have no OS to boot: an InfrastructureReady member only needs its domain running.

mod hosts;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use banlieue_api::conditions::{self, reasons, status, types};
use banlieue_api::names::{self, SYSTEM_NAMESPACE};
use banlieue_api::{
    ClaimPhase, LocalObjectReference, Provider, VMClass, VMImage, VirtualMachine,
    VirtualMachineClaim, VirtualMachinePool, ZonePhase,
};
use banlieue_dev::{self as dev, objects};
use banlieue_testenv::control_plane::ControlPlane;
use banlieue_testenv::libvirtd::Libvirtd;
use banlieue_testenv::poll;
use hosts::{BoxError, Host};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use tokio_util::sync::CancellationToken;

/// Any one wait but the ones below.
const DEADLINE: Duration = Duration::from_secs(60);
/// How long a Provider may stay not Ready before its host is lost.
const LOST_AFTER: Duration = Duration::from_secs(5);
/// Until a stopped host's Provider says Ready=False: its workload probes the host every 60 s.
const DETECT_DEADLINE: Duration = Duration::from_secs(90);
const POOL: &str = "spread";
const CLAIM: &str = "held";

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_pool_across_three_hosts_and_a_host_that_goes_away() -> Result<(), BoxError> {
    if !Libvirtd::available().map_err(|e| banlieue_testenv::control_plane::error_chain(&e))? {
        return Ok(());
    }
    let started = Instant::now();
    let (control_plane, daemons) = tokio::try_join!(
        async { ControlPlane::start().await.map_err(BoxError::from) },
        hosts::start_three_daemons(),
    )?;
    eprintln!(
        "control plane and three libvirtd up in {:.1?}",
        started.elapsed()
    );
    let admin = control_plane.client()?;
    dev::bootstrap_cluster(&admin).await?;
    dev::admit_claimant(&admin).await?;
    let mut hosts = hosts::register(&admin, daemons).await?;
    let shutdown = CancellationToken::new();
    let outcome =
        match hosts::spawn_roles(&control_plane, &hosts, LOST_AFTER, DEADLINE, &shutdown).await {
            Ok(workers) => {
                let outcome = scenario(&control_plane, &admin, &mut hosts).await;
                shutdown.cancel();
                for worker in workers {
                    let _ = worker.await;
                }
                outcome
            }
            Err(e) => Err(e),
        };
    shutdown.cancel();
    let released = hosts::release(&hosts).await;
    if outcome.is_err() {
        if let Err(e) = describe(&admin).await {
            eprintln!("describe: {e}");
        }
        for host in &hosts {
            eprintln!("{}: {}", host.provider, host.libvirtd.diagnostics());
        }
    }
    outcome?;
    eprintln!("whole test: {:.1?}", started.elapsed());
    released
}

async fn scenario(
    control_plane: &ControlPlane,
    admin: &Client,
    hosts: &mut [Host],
) -> Result<(), BoxError> {
    hosts::wait_ready(admin, hosts, DEADLINE).await?;
    dev::apply(admin, &objects::image()).await?;
    dev::apply(admin, &objects::class()).await?;
    // A member is only placed where its image is Ready: every host, before the pool exists.
    let images: Api<VMImage> = Api::namespaced(admin.clone(), SYSTEM_NAMESPACE);
    poll::until("the image to be Ready on every host", DEADLINE, || async {
        let image = images.get(objects::IMAGE).await?;
        let per_provider = image.status.map(|s| s.per_provider).unwrap_or_default();
        let everywhere = hosts.iter().all(|h| {
            per_provider.iter().any(|p| {
                p.provider == h.provider
                    && p.zones
                        .iter()
                        .any(|z| z.pool == objects::STORAGE_POOL && z.phase == ZonePhase::Ready)
            })
        });
        Ok(everywhere.then_some(()))
    })
    .await?;
    let vms: Api<VirtualMachine> = Api::namespaced(admin.clone(), SYSTEM_NAMESPACE);
    let pools: Api<VirtualMachinePool> = Api::namespaced(admin.clone(), SYSTEM_NAMESPACE);
    let providers: Api<Provider> = Api::namespaced(admin.clone(), SYSTEM_NAMESPACE);
    let names: Vec<String> = hosts.iter().map(|h| h.provider.clone()).collect();

    // 1. Six members, two to a host, each host really running its two.
    let created = Instant::now();
    let mut pool = objects::pool();
    pool.metadata.name = Some(POOL.into());
    pool.spec.replicas = 6;
    dev::apply(admin, &pool).await?;
    poll::until("six available members", DEADLINE, || async {
        Ok(settled(&pools, &vms, 6).await?.then_some(()))
    })
    .await?;
    eprintln!("pool of 6 available in {:.1?}", created.elapsed());
    let members = live_members(&vms).await?;
    assert_eq!(
        per_host(&members, &names),
        vec![2, 2, 2],
        "spread of six members"
    );
    check_domains(hosts, &members).await?;

    // The claim is taken now, so that the host declared full next is another one than the
    // claim's (X), and X's unclaimed members, when it goes, can only be replaced on the third.
    let alice = control_plane.client_as(objects::CLAIMANT).await?;
    let mut claim = objects::claim();
    claim.metadata.name = Some(CLAIM.into());
    claim.spec.pool_ref.name = POOL.into();
    Api::<VirtualMachineClaim>::namespaced(alice, SYSTEM_NAMESPACE)
        .create(&PostParams::default(), &claim)
        .await?;
    let claims: Api<VirtualMachineClaim> = Api::namespaced(admin.clone(), SYSTEM_NAMESPACE);
    let claimed = poll::until("the claim to bind", DEADLINE, || async {
        let c = claims.get(CLAIM).await?;
        let st = c.status.unwrap_or_default();
        Ok((st.phase == Some(ClaimPhase::Bound))
            .then_some(st.virtual_machine_ref.map(|r| r.name))
            .flatten())
    })
    .await?;
    poll::until("the pool to refill after the claim", DEADLINE, || async {
        Ok(settled(&pools, &vms, 6).await?.then_some(()))
    })
    .await?;
    let members = live_members(&vms).await?;
    let claimed_vm = members
        .iter()
        .find(|vm| vm.name_any() == claimed)
        .ok_or("the claimed member is gone")?;
    let lost_provider = provider_of(claimed_vm).ok_or("the claimed member has no Provider")?;
    let x = names
        .iter()
        .position(|n| *n == lost_provider)
        .ok_or("the claimed member is on an unknown Provider")?;
    // The refill went to the host with the fewest members of the pool: X, which the claim
    // took one from.
    let mut expected = vec![2, 2, 2];
    expected[x] = 3;
    assert_eq!(per_host(&members, &names), expected, "after the refill");
    let full = (x + 1) % hosts.len();
    let other = (x + 2) % hosts.len();

    // 2. A host declared full takes no new member.
    let capacity = memory_capacity(&providers, &names[full]).await?;
    let class_bytes = bytes_of(&objects::class().spec.memory)?;
    assert!(
        capacity / 100 < 3 * class_bytes,
        "this machine has too much memory ({capacity} bytes) for 1% of it to be full with two \
         members of {class_bytes} bytes"
    );
    let generation = providers
        .patch(
            &names[full],
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"capabilities": {"memoryOvercommitPercent": 1}}})),
        )
        .await?
        .metadata
        .generation;
    // The workload re-publishes Ready for the new generation; by then the controller has long
    // seen the change, which arrived first on the same watch stream.
    poll::until(
        "the full host's Provider to be re-probed",
        DEADLINE,
        || async {
            let p = providers.get(&names[full]).await?;
            let seen = p
                .status
                .as_ref()
                .and_then(|s| conditions::find(&s.conditions, types::READY))
                .is_some_and(|c| c.observed_generation == generation && c.status == status::TRUE);
            Ok(seen.then_some(()))
        },
    )
    .await?;
    let scaled = Instant::now();
    pools
        .patch(
            POOL,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 8}})),
        )
        .await?;
    poll::until("eight available members", DEADLINE, || async {
        Ok(settled(&pools, &vms, 8).await?.then_some(()))
    })
    .await?;
    eprintln!("scaled to 8 in {:.1?}", scaled.elapsed());
    let members = live_members(&vms).await?;
    expected[x] = 4;
    expected[other] = 3;
    assert_eq!(
        per_host(&members, &names),
        expected,
        "members per host with {} full",
        names[full]
    );
    check_domains(hosts, &members).await?;
    too_big_fits_nowhere(admin, &providers, &vms, &names).await?;

    // 3. X's libvirtd stops.
    let doomed: Vec<String> = members
        .iter()
        .filter(|vm| {
            provider_of(vm).as_deref() == Some(lost_provider.as_str()) && !claimed_by_any(vm)
        })
        .map(|vm| vm.name_any())
        .collect();
    assert_eq!(doomed.len(), 3, "unclaimed members on {lost_provider}");
    eprintln!(
        "claim {CLAIM} bound to {claimed} on {lost_provider}, which also runs {doomed:?}; \
         stopping its libvirtd ({} is full)",
        names[full]
    );

    tokio::task::block_in_place(|| hosts[x].libvirtd.stop());
    let stopped = Instant::now();
    poll::until(
        "the stopped host's Provider to say Ready=False",
        DETECT_DEADLINE,
        || async {
            let p = providers.get(&lost_provider).await?;
            Ok((hosts::ready_status(&p) == status::FALSE).then_some(()))
        },
    )
    .await?;
    let not_ready = Instant::now();
    eprintln!(
        "Provider {lost_provider} Ready=False {:.1?} after its libvirtd stopped",
        stopped.elapsed()
    );
    poll::until(
        "the lost host's members to be replaced",
        LOST_AFTER + DEADLINE,
        || async {
            let all = pool_members(&vms).await?;
            let live_unclaimed_on_x = all.iter().any(|vm| {
                vm.metadata.deletion_timestamp.is_none()
                    && !claimed_by_any(vm)
                    && provider_of(vm).as_deref() == Some(lost_provider.as_str())
            });
            Ok((!live_unclaimed_on_x && settled(&pools, &vms, 8).await?).then_some(()))
        },
    )
    .await?;
    eprintln!(
        "replaced {:.1?} after Ready=False was seen ({:.1?} after the {LOST_AFTER:?} grace)",
        not_ready.elapsed(),
        not_ready.elapsed().saturating_sub(LOST_AFTER)
    );
    // Their deletions wait for the host: nothing is let go of by force.
    for name in &doomed {
        let vm = vms
            .get_opt(name)
            .await?
            .ok_or_else(|| format!("{name} went while its host was away"))?;
        assert!(
            vm.metadata.deletion_timestamp.is_some(),
            "{name} is not being deleted"
        );
    }
    let members = live_members(&vms).await?;
    // The full host took none of the replacements; the lost one keeps only the claimed member.
    expected[x] = 1;
    expected[other] = 6;
    assert_eq!(
        per_host(&members, &names),
        expected,
        "members per host once replaced"
    );
    assert_eq!(
        members
            .iter()
            .filter(|vm| provider_of(vm).as_deref() == Some(lost_provider.as_str()))
            .map(|vm| vm.name_any())
            .collect::<Vec<_>>(),
        vec![claimed.clone()],
        "live members on the lost host"
    );
    assert_bound(&claims, &vms, &claimed).await?;

    // X comes back with the same state and port: the replaced members' domains go, and so do
    // their VirtualMachines.
    hosts[x]
        .libvirtd
        .start_again()
        .await
        .map_err(|e| banlieue_testenv::control_plane::error_chain(&e))?;
    let back = Instant::now();
    let doomed_domains: BTreeSet<String> = doomed
        .iter()
        .map(|n| names::domain_name(SYSTEM_NAMESPACE, n))
        .collect();
    let libvirtd = &hosts[x].libvirtd;
    poll::until(
        "the replaced members' domains and objects to go",
        DEADLINE,
        || async {
            for name in &doomed {
                if vms.get_opt(name).await?.is_some() {
                    return Ok(None);
                }
            }
            let left = hosts::domains(libvirtd).await?;
            Ok((!left.iter().any(|d| doomed_domains.contains(d))).then_some(()))
        },
    )
    .await?;
    eprintln!(
        "host back: replaced members' domains destroyed and their objects gone in {:.1?}",
        back.elapsed()
    );
    let left: BTreeSet<String> = hosts::domains(libvirtd).await?.into_iter().collect();
    assert_eq!(
        left,
        BTreeSet::from([names::domain_name(SYSTEM_NAMESPACE, &claimed)]),
        "domains on the returned host"
    );
    assert_bound(&claims, &vms, &claimed).await?;
    check_domains(hosts, &live_members(&vms).await?).await
}

/// Prints the pool's, the machines' and the Providers' statuses, for a failure's message.
async fn describe(admin: &Client) -> Result<(), BoxError> {
    let pools: Api<VirtualMachinePool> = Api::namespaced(admin.clone(), SYSTEM_NAMESPACE);
    let vms: Api<VirtualMachine> = Api::namespaced(admin.clone(), SYSTEM_NAMESPACE);
    let providers: Api<Provider> = Api::namespaced(admin.clone(), SYSTEM_NAMESPACE);
    eprintln!(
        "pool: {}",
        serde_json::to_string(&pools.get(POOL).await?.status)?
    );
    for vm in pool_members(&vms).await? {
        eprintln!(
            "vm {} labels {:?} deleting {:?} finalizers {:?} status {}",
            vm.name_any(),
            vm.labels(),
            vm.metadata.deletion_timestamp,
            vm.metadata.finalizers,
            serde_json::to_string(&vm.status)?
        );
    }
    for p in providers.list(&ListParams::default()).await?.items {
        eprintln!(
            "provider {} spec {} status {}",
            p.name_any(),
            serde_json::to_string(&p.spec.capabilities)?,
            serde_json::to_string(&p.status.map(|s| s.conditions))?
        );
    }
    Ok(())
}

/// A machine whose class is larger than any host: Scheduled=False, InsufficientCapacity,
/// naming every host.
async fn too_big_fits_nowhere(
    admin: &Client,
    providers: &Api<Provider>,
    vms: &Api<VirtualMachine>,
    names: &[String],
) -> Result<(), BoxError> {
    let mut largest = 0;
    for name in names {
        largest = largest.max(memory_capacity(providers, name).await?);
    }
    let mut class = objects::class();
    class.metadata.name = Some("larger-than-any-host".into());
    class.spec.memory = Quantity(format!("{}Gi", (largest >> 30) + 1));
    dev::apply(admin, &class).await?;
    let mut vm = VirtualMachine::new("too-big", objects::pool().spec.template.spec);
    vm.metadata.namespace = Some(SYSTEM_NAMESPACE.into());
    vm.spec.class_ref = LocalObjectReference::new("larger-than-any-host");
    vms.create(&PostParams::default(), &vm).await?;
    let why = poll::until("too-big to be InsufficientCapacity", DEADLINE, || async {
        let vm = vms.get("too-big").await?;
        let conds = vm.status.map(|s| s.conditions).unwrap_or_default();
        Ok(conditions::find(&conds, types::SCHEDULED)
            .filter(|c| c.status == status::FALSE && c.reason == reasons::INSUFFICIENT_CAPACITY)
            .map(|c| c.message.clone()))
    })
    .await?;
    eprintln!("too-big: InsufficientCapacity: {why}");
    for name in names {
        assert!(why.contains(name.as_str()), "{name} not named: {why}");
    }
    vms.delete("too-big", &DeleteParams::default()).await?;
    poll::until("too-big to go", DEADLINE, || async {
        Ok(vms.get_opt("too-big").await?.is_none().then_some(()))
    })
    .await?;
    Api::<VMClass>::namespaced(admin.clone(), SYSTEM_NAMESPACE)
        .delete("larger-than-any-host", &DeleteParams::default())
        .await?;
    Ok(())
}

/// Whether the pool has `available` available members and exactly that many unclaimed live
/// ones (nothing being built), each placed on a Provider.
async fn settled(
    pools: &Api<VirtualMachinePool>,
    vms: &Api<VirtualMachine>,
    available: i32,
) -> Result<bool, BoxError> {
    let st = pools.get(POOL).await?.status.unwrap_or_default();
    let members = live_members(vms).await?;
    let unclaimed = members.iter().filter(|vm| !claimed_by_any(vm)).count();
    Ok(st.available_replicas == available
        && usize::try_from(available).is_ok_and(|n| n == unclaimed)
        && members.iter().all(|vm| provider_of(vm).is_some()))
}

/// The claim is Bound to `member`, which is not being deleted.
async fn assert_bound(
    claims: &Api<VirtualMachineClaim>,
    vms: &Api<VirtualMachine>,
    member: &str,
) -> Result<(), BoxError> {
    let st = claims.get(CLAIM).await?.status.unwrap_or_default();
    assert_eq!(st.phase, Some(ClaimPhase::Bound), "claim phase");
    assert_eq!(
        st.virtual_machine_ref.map(|r| r.name).as_deref(),
        Some(member)
    );
    let vm = vms.get(member).await?;
    assert!(
        vm.metadata.deletion_timestamp.is_none(),
        "the bound member is being deleted"
    );
    Ok(())
}

/// Each host runs exactly the domains of the live members placed on it.
async fn check_domains(hosts: &[Host], members: &[VirtualMachine]) -> Result<(), BoxError> {
    for host in hosts {
        let expected: BTreeSet<String> = members
            .iter()
            .filter(|vm| provider_of(vm).as_deref() == Some(host.provider.as_str()))
            .map(|vm| names::domain_name(SYSTEM_NAMESPACE, &vm.name_any()))
            .collect();
        let running: BTreeSet<String> = hosts::running_domains(&host.libvirtd)
            .await?
            .into_iter()
            .collect();
        assert_eq!(running, expected, "domains running on {}", host.provider);
    }
    Ok(())
}

/// Live members per host, in the order of `names`.
fn per_host(members: &[VirtualMachine], names: &[String]) -> Vec<usize> {
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for vm in members {
        if let Some(p) = provider_of(vm) {
            *counts
                .entry(names.iter().find(|n| **n == p).map_or("?", |n| n))
                .or_default() += 1;
        }
    }
    names
        .iter()
        .map(|n| counts.get(n.as_str()).copied().unwrap_or(0))
        .collect()
}

fn provider_of(vm: &VirtualMachine) -> Option<String> {
    vm.status
        .as_ref()
        .and_then(|s| s.provider_ref.as_ref())
        .map(|r| r.name.clone())
}

fn claimed_by_any(vm: &VirtualMachine) -> bool {
    vm.labels().contains_key(names::LABEL_CLAIM)
}

/// Every VirtualMachine of the namespace, those being deleted included: the pool's members
/// and the one it handed out, which leaves the pool when bound (its pool label goes).
async fn pool_members(vms: &Api<VirtualMachine>) -> Result<Vec<VirtualMachine>, BoxError> {
    Ok(vms.list(&ListParams::default()).await?.items)
}

/// [`pool_members`] that are not being deleted.
async fn live_members(vms: &Api<VirtualMachine>) -> Result<Vec<VirtualMachine>, BoxError> {
    Ok(pool_members(vms)
        .await?
        .into_iter()
        .filter(|vm| vm.metadata.deletion_timestamp.is_none())
        .collect())
}

/// The memory the Provider's workload measured on its host, in bytes.
async fn memory_capacity(providers: &Api<Provider>, name: &str) -> Result<u64, BoxError> {
    providers
        .get(name)
        .await?
        .status
        .and_then(|s| s.failure_domains.into_iter().find_map(|d| d.capacity))
        .map(|c| c.memory_bytes)
        .ok_or_else(|| format!("Provider {name} published no capacity").into())
}

/// A binary-suffixed quantity (`128Mi`, `1Gi`) in bytes.
fn bytes_of(quantity: &Quantity) -> Result<u64, BoxError> {
    let q = quantity.0.as_str();
    let (digits, unit) = q.split_at(q.find(|c: char| !c.is_ascii_digit()).unwrap_or(q.len()));
    let shift = match unit {
        "" => 0,
        "Ki" => 10,
        "Mi" => 20,
        "Gi" => 30,
        _ => return Err(format!("unexpected quantity {q}").into()),
    };
    Ok(digits.parse::<u64>()? << shift)
}

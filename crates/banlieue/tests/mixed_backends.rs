//! Two backends behind one controller: a real control plane, one controller and its Provider
//! operator (in this process, as the controller's ServiceAccount), a libvirt Provider on a
//! private libvirtd and a vSphere Provider on vcsim (govmomi's simulator), each with a pool.
//!
//! The operator makes each Provider's workload from its ProviderClass's machine kind: the
//! Deployment runs `provider libvirt run` or `provider vsphere run`, and the vSphere class's
//! ClusterRole is bound in the Provider's namespace. Each workload then runs in this process
//! as the ServiceAccount the operator made for it, under the shipped RBAC (as `banlieue dev
//! up` runs its one host), so a grant the operator forgets fails here.
//!
//! What it shows, against the backends themselves (`virsh` and a vSphere session of the
//! test's own):
//! - the scheduler places each pool's member on the only Provider offering its storage and
//!   network classes, and the controller writes a LibvirtMachine or a VSphereMachine for it;
//! - a claim against each pool binds: the libvirt pool waits for InfrastructureReady (the
//!   domain runs; it has no OS to boot), the vSphere pool for GuestReady, which the test
//!   gives as a guest would, by setting `guestinfo.banlieue.phase` to `ready` in vcsim;
//! - a tenant's Template image naming an ordinary VM, or a path outside the Provider's template
//!   folders, fails its zone saying why, and the claims still bind after it;
//! - deleting the claims (and then the pools) leaves no domain on libvirtd and no VM in vcsim.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use banlieue_api::names::{self, SYSTEM_NAMESPACE};
use banlieue_api::vsphere::GUESTINFO_PHASE;
use banlieue_api::{
    ClaimPhase, KeySelector, LocalObjectReference, MachineKind, NetworkClassMapping, NetworkTarget,
    PoolReadiness, Provider, ProviderCapabilities, ProviderClass, ProviderConnection, ProviderSpec,
    StorageClassMapping, StorageTarget, VMImage, VSphereCapabilities, VSphereDatacenter,
    VSphereMachine, ValueOrSource, VirtualMachine, VirtualMachineClaim, VirtualMachinePool,
};
use banlieue_dev::{self as dev, objects};
use banlieue_operator::workloads;
use banlieue_provider_libvirt::domain_xml::DomainType;
use banlieue_testenv::control_plane::ControlPlane;
use banlieue_testenv::libvirtd::{Libvirtd, LibvirtdOptions};
use banlieue_testenv::poll;
use banlieue_testenv::vcsim::{Vcsim, VcsimOptions};
use banlieue_vsphere::{Credentials, ReconfigSpec};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::api::rbac::v1::RoleBinding;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::{Client, ResourceExt};
use prometheus_client::registry::Registry;
use serde_json::json;
use tokio_util::sync::CancellationToken;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Any one wait.
const DEADLINE: Duration = Duration::from_secs(60);
const VSPHERE_CLASS: &str = "vsphere";
const VSPHERE_PROVIDER: &str = "vcenter";
const VSPHERE_STORAGE_CLASS: &str = "vsphere-datastore";
const VSPHERE_NETWORK_CLASS: &str = "vsphere-network";
const VSPHERE_IMAGE: &str = "vsphere-template";
/// vcsim's model VM, cloned as the template (docs/vsphere-client.md).
const TEMPLATE: &str = "DC0/vm/DC0_C0_RP0_VM0";
const LIBVIRT_POOL: &str = "libvirt-pool";
const VSPHERE_POOL: &str = "vsphere-pool";
/// The controller's ServiceAccount, from deploy/controller.yaml.
const CONTROLLER_SERVICE_ACCOUNT: &str = "banlieue-controller";

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_controller_runs_a_libvirt_and_a_vsphere_provider() -> Result<(), BoxError> {
    if !Libvirtd::available().map_err(|e| banlieue_testenv::control_plane::error_chain(&e))? {
        return Ok(());
    }
    if !Vcsim::available().map_err(|e| format!("{e:#}"))? {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "vcsim is not built: scripts/control-plane build-vcsim"
        );
        eprintln!("SKIPPED: vcsim is not built (scripts/control-plane build-vcsim)");
        return Ok(());
    }
    let started = Instant::now();
    let (control_plane, libvirtd, vcsim) = tokio::try_join!(
        async { ControlPlane::start().await.map_err(BoxError::from) },
        async {
            Libvirtd::start(LibvirtdOptions::default())
                .await
                .map_err(|e| BoxError::from(banlieue_testenv::control_plane::error_chain(&e)))
        },
        async {
            Vcsim::start(VcsimOptions::new())
                .await
                .map_err(|e| BoxError::from(format!("{e:#}")))
        },
    )?;
    eprintln!(
        "control plane, libvirtd and vcsim up in {:.1?}",
        started.elapsed()
    );
    let shutdown = CancellationToken::new();
    let mut workers = Vec::new();
    let outcome = scenario(&control_plane, &libvirtd, &vcsim, &shutdown, &mut workers).await;
    shutdown.cancel();
    for worker in workers {
        let _ = worker.await;
    }
    let released = dev::release_host(&libvirtd).await;
    if outcome.is_err() {
        if let Ok(admin) = control_plane.client()
            && let Err(e) = describe(&admin).await
        {
            eprintln!("describe: {e}");
        }
        eprintln!("libvirtd: {}", libvirtd.diagnostics());
    }
    outcome?;
    eprintln!("whole test: {:.1?}", started.elapsed());
    released
}

async fn scenario(
    control_plane: &ControlPlane,
    libvirtd: &Libvirtd,
    vcsim: &Vcsim,
    shutdown: &CancellationToken,
    workers: &mut Vec<tokio::task::JoinHandle<()>>,
) -> Result<(), BoxError> {
    let admin = control_plane.client()?;
    dev::bootstrap_cluster(&admin).await?;
    dev::admit_claimant(&admin).await?;
    dev::prepare_libvirt(libvirtd, &format!("bnx{}", std::process::id() % 1_000_000)).await?;
    register_libvirt(&admin, libvirtd).await?;
    register_vsphere(&admin, vcsim).await?;

    // One controller, one operator: every workload below is the operator's.
    let controller = control_plane
        .client_as_service_account(SYSTEM_NAMESPACE, CONTROLLER_SERVICE_ACCOUNT)
        .await?;
    workers.extend(banlieue::roles::spawn_all(
        &controller,
        &mut Registry::default(),
        shutdown,
        banlieue::roles::Roles {
            controller: true,
            operator: true,
            ..banlieue::roles::Roles::default()
        },
    )?);
    workers.extend(
        dev::spawn_provider_workload(
            control_plane,
            objects::PROVIDER,
            Some(DomainType::Qemu),
            DEADLINE,
            &mut Registry::default(),
            shutdown,
        )
        .await?,
    );
    workers.extend(spawn_vsphere_workload(control_plane, &admin, shutdown).await?);
    check_operator_objects(&admin).await?;

    let providers: Api<Provider> = Api::namespaced(admin.clone(), SYSTEM_NAMESPACE);
    for provider in [objects::PROVIDER, VSPHERE_PROVIDER] {
        poll::until(&format!("Provider {provider} Ready"), DEADLINE, || async {
            let p = providers.get(provider).await?;
            let ready = p
                .status
                .as_ref()
                .and_then(|s| {
                    banlieue_api::conditions::find(
                        &s.conditions,
                        banlieue_api::conditions::types::READY,
                    )
                })
                .is_some_and(|c| c.status == banlieue_api::conditions::status::TRUE);
            Ok(ready.then_some(()))
        })
        .await?;
    }
    // One failure domain per cluster, measured as a libvirt host is, so the scheduler limits
    // both the same way.
    let domains: Vec<(String, bool)> = providers
        .get(VSPHERE_PROVIDER)
        .await?
        .status
        .map(|s| {
            s.failure_domains
                .into_iter()
                .map(|d| (d.name, d.capacity.is_some_and(|c| c.memory_bytes > 0)))
                .collect()
        })
        .unwrap_or_default();
    assert_eq!(
        domains,
        [("DC0/DC0_C0".to_owned(), true)],
        "the vCenter's failure domains, with their capacity"
    );

    dev::apply(&admin, &objects::image()).await?;
    dev::apply(&admin, &vsphere_image()).await?;
    dev::apply(&admin, &objects::class()).await?;
    let mut libvirt_pool = objects::pool();
    libvirt_pool.metadata.name = Some(LIBVIRT_POOL.into());
    dev::apply(&admin, &libvirt_pool).await?;
    dev::apply(&admin, &vsphere_pool()).await?;

    // The vSphere member: a VSphereMachine cloned into the cluster, waiting for its guest.
    let vms: Api<VirtualMachine> = Api::namespaced(admin.clone(), SYSTEM_NAMESPACE);
    let vsphere_machines: Api<VSphereMachine> = Api::namespaced(admin.clone(), SYSTEM_NAMESPACE);
    let placed = Instant::now();
    let member = poll::until("a VSphereMachine powered on", DEADLINE, || async {
        let ready = vsphere_machines
            .list(&ListParams::default())
            .await?
            .items
            .into_iter()
            .find(|m| m.status.as_ref().is_some_and(|s| s.contract.ready));
        Ok(ready)
    })
    .await?;
    eprintln!(
        "vSphere member {} powered on in {:.1?}",
        member.name_any(),
        placed.elapsed()
    );
    assert_eq!(
        (
            member.spec.datacenter.as_str(),
            member.spec.cluster.as_str()
        ),
        ("DC0", "DC0_C0")
    );
    assert_eq!(member.spec.template, TEMPLATE);
    assert_eq!(member.spec.datastore.as_deref(), Some("LocalDS_0"));
    assert_eq!(member.spec.provider_ref.name, VSPHERE_PROVIDER);
    let vm = vms.get(&member.name_any()).await?;
    let machine_ref = vm
        .status
        .as_ref()
        .and_then(|s| s.machine_ref.clone())
        .ok_or("the vSphere member has no machineRef")?;
    assert_eq!(machine_ref.kind, "VSphereMachine");

    // The guest says it is ready, as its guest-phase layer would.
    let vc = banlieue_vsphere::Client::connect(
        vcsim.url(),
        vcsim.ca_pem(),
        Credentials::new(vcsim.username(), vcsim.password()),
    )
    .await?;
    let vm_name = names::domain_name(SYSTEM_NAMESPACE, &member.name_any());
    let vm_ref = vc
        .vm_by_name(&vm_name)
        .await?
        .ok_or_else(|| format!("no VM {vm_name} in vcsim"))?;
    let task = vc
        .reconfigure_vm(
            &vm_ref,
            &ReconfigSpec {
                extra_config: vec![(GUESTINFO_PHASE.to_owned(), "ready".to_owned())],
                ..ReconfigSpec::default()
            },
        )
        .await?;
    tokio::time::timeout(DEADLINE, vc.wait_task(&task)).await??;

    // Row 2 of the isolation review on vSphere: bob, who may write VMImages and nothing else,
    // names a VM that is no template and a template path outside the declared folders. The
    // vSphere Provider fails each zone saying why, and the claims below still bind.
    template_attacks_are_refused(control_plane, &admin).await?;

    // A claim against each pool.
    let alice = control_plane.client_as(objects::CLAIMANT).await?;
    let alice_claims: Api<VirtualMachineClaim> = Api::namespaced(alice, SYSTEM_NAMESPACE);
    for pool in [LIBVIRT_POOL, VSPHERE_POOL] {
        let mut claim = objects::claim();
        claim.metadata.name = Some(claim_name(pool));
        claim.spec.pool_ref.name = pool.into();
        alice_claims.create(&PostParams::default(), &claim).await?;
    }
    let claims: Api<VirtualMachineClaim> = Api::namespaced(admin.clone(), SYSTEM_NAMESPACE);
    let mut bound = Vec::new();
    for pool in [LIBVIRT_POOL, VSPHERE_POOL] {
        let name = claim_name(pool);
        let vm = poll::until(&format!("claim {name} to bind"), DEADLINE, || async {
            let st = claims.get(&name).await?.status.unwrap_or_default();
            Ok((st.phase == Some(ClaimPhase::Bound))
                .then_some(st.virtual_machine_ref.map(|r| r.name))
                .flatten())
        })
        .await?;
        eprintln!("claim {name} bound to {vm}");
        bound.push(vm);
    }
    let [libvirt_vm, vsphere_vm] = [bound[0].clone(), bound[1].clone()];
    assert_eq!(vsphere_vm, member.name_any(), "the guest-ready member");
    assert_eq!(provider_of(&vms.get(&libvirt_vm).await?), objects::PROVIDER);
    assert_eq!(provider_of(&vms.get(&vsphere_vm).await?), VSPHERE_PROVIDER);
    let libvirt_domain = names::domain_name(SYSTEM_NAMESPACE, &libvirt_vm);
    let running = virsh_names(libvirtd, "--state-running").await?;
    assert!(
        running.contains(&libvirt_domain),
        "{libvirt_domain} not running: {running:?}"
    );

    // Deleting the claims deletes their machines, down to the domain and the VM.
    for pool in [LIBVIRT_POOL, VSPHERE_POOL] {
        claims
            .delete(&claim_name(pool), &DeleteParams::default())
            .await?;
    }
    let deleted = Instant::now();
    poll::until(
        "the claimed domain and VM to be destroyed",
        DEADLINE,
        || async {
            let domain_left = virsh_names(libvirtd, "--all")
                .await?
                .contains(&libvirt_domain);
            let vm_left = vc.vm_by_name(&vm_name).await?.is_some();
            let objects_left = vms.get_opt(&libvirt_vm).await?.is_some()
                || vms.get_opt(&vsphere_vm).await?.is_some();
            Ok((!domain_left && !vm_left && !objects_left).then_some(()))
        },
    )
    .await?;
    eprintln!(
        "claims deleted: domain and VM destroyed in {:.1?}",
        deleted.elapsed()
    );

    // The pools' refills go with their pools: nothing is left on either backend.
    let seen: BTreeSet<String> = vms
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .map(|vm| vm.name_any())
        .collect();
    let pools: Api<VirtualMachinePool> = Api::namespaced(admin.clone(), SYSTEM_NAMESPACE);
    for pool in [LIBVIRT_POOL, VSPHERE_POOL] {
        pools.delete(pool, &DeleteParams::default()).await?;
    }
    // Every member seen until the last is gone, so none of their VMs escapes the check.
    let seen = std::sync::Mutex::new(seen);
    poll::until("every VirtualMachine to go", DEADLINE, || async {
        let left = vms.list(&ListParams::default()).await?.items;
        seen.lock()
            .map_err(|_| "poisoned")?
            .extend(left.iter().map(|vm| vm.name_any()));
        Ok(left.is_empty().then_some(()))
    })
    .await?;
    let seen = seen.into_inner().map_err(|_| "poisoned")?;
    let domains = virsh_names(libvirtd, "--all").await?;
    assert!(domains.is_empty(), "domains left on libvirtd: {domains:?}");
    for name in &seen {
        let vm = names::domain_name(SYSTEM_NAMESPACE, name);
        assert_eq!(vc.vm_by_name(&vm).await?, None, "VM {vm} left in vcsim");
    }
    assert!(
        vsphere_machines
            .list(&ListParams::default())
            .await?
            .items
            .is_empty(),
        "VSphereMachines left"
    );
    vc.logout().await?;
    Ok(())
}

/// The libvirt Provider of `banlieue dev up`, without the vTPM it does not need here.
async fn register_libvirt(admin: &Client, libvirtd: &Libvirtd) -> Result<(), BoxError> {
    let cert = std::fs::read(libvirtd.client_cert_path())?;
    let key = std::fs::read(libvirtd.client_key_path())?;
    let ca = std::fs::read_to_string(libvirtd.ca_cert_path())?;
    dev::apply(admin, &objects::credentials_secret(&cert, &key)).await?;
    dev::apply(admin, &objects::ca_configmap(&ca)).await?;
    dev::apply(admin, &objects::provider_class(objects::DEV_IMAGE)).await?;
    let mut provider = objects::provider(&libvirtd.tls_uri());
    provider.spec.capabilities.features.clear();
    provider.spec.attestation = None;
    dev::apply(admin, &provider).await?;
    Ok(())
}

/// The vSphere class (no additionalRules: its role holds its machine rights), the vCenter's
/// credentials Secret and CA ConfigMap, and its Provider: one cluster, a datastore and a
/// network, under classes only it offers.
async fn register_vsphere(admin: &Client, vcsim: &Vcsim) -> Result<(), BoxError> {
    // The administrator's template: vcsim's model VM, powered off and marked.
    let vc = banlieue_vsphere::Client::connect(
        vcsim.url(),
        vcsim.ca_pem(),
        Credentials::new(vcsim.username(), vcsim.password()),
    )
    .await?;
    let model = vc
        .find_by_inventory_path(TEMPLATE)
        .await?
        .ok_or("no model VM in vcsim")?;
    let off = vc.power_off_vm(&model).await?;
    vc.wait_task(&off).await?;
    vc.mark_as_template(&model).await?;
    let _ = vc.logout().await;
    let mut class: ProviderClass = objects::provider_class(objects::DEV_IMAGE);
    class.metadata.name = Some(VSPHERE_CLASS.into());
    class.spec.machine_kind = MachineKind::VSPHERE_MACHINE;
    class.spec.additional_rules.clear();
    dev::apply(admin, &class).await?;
    let secret: Secret = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "vcenter-creds", "namespace": SYSTEM_NAMESPACE},
        "stringData": {"username": vcsim.username(), "password": vcsim.password()},
    }))?;
    dev::apply(admin, &secret).await?;
    let ca: ConfigMap = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "vcenter-ca", "namespace": SYSTEM_NAMESPACE},
        "data": {"ca.crt": vcsim.ca_pem()},
    }))?;
    dev::apply(admin, &ca).await?;
    let mut provider = Provider::new(
        VSPHERE_PROVIDER,
        ProviderSpec {
            provider_class_ref: LocalObjectReference::new(VSPHERE_CLASS),
            connection: ProviderConnection {
                endpoint: vcsim.url().to_owned(),
                credentials_ref: LocalObjectReference::new("vcenter-creds"),
                ca_bundle: ValueOrSource {
                    config_map_ref: Some(KeySelector {
                        name: "vcenter-ca".into(),
                        key: "ca.crt".into(),
                    }),
                    ..ValueOrSource::default()
                },
            },
            capabilities: ProviderCapabilities {
                storage_classes: vec![StorageClassMapping {
                    name: VSPHERE_STORAGE_CLASS.into(),
                    target: StorageTarget {
                        pool: "LocalDS_0".into(),
                    },
                }],
                network_classes: vec![NetworkClassMapping {
                    name: VSPHERE_NETWORK_CLASS.into(),
                    target: NetworkTarget {
                        network: "VM Network".into(),
                    },
                }],
                vsphere: Some(VSphereCapabilities {
                    datacenters: vec![VSphereDatacenter {
                        name: "DC0".into(),
                        clusters: vec!["DC0_C0".into()],
                    }],
                    template_folders: vec!["DC0/vm".into()],
                    vm_folders: Vec::new(),
                }),
                ..ProviderCapabilities::default()
            },
            attestation: None,
        },
    );
    provider.metadata.namespace = Some(SYSTEM_NAMESPACE.into());
    dev::apply(admin, &provider).await?;
    Ok(())
}

/// Runs the vSphere Provider's workload in this process as the ServiceAccount the operator
/// made for it, once the operator has applied its Deployment (its last object).
async fn spawn_vsphere_workload(
    control_plane: &ControlPlane,
    admin: &Client,
    shutdown: &CancellationToken,
) -> Result<Vec<tokio::task::JoinHandle<()>>, BoxError> {
    let name = workloads::workload_name(VSPHERE_PROVIDER);
    let deployments: Api<Deployment> = Api::namespaced(admin.clone(), SYSTEM_NAMESPACE);
    poll::until(
        &format!("the operator's Deployment {name}"),
        DEADLINE,
        || async { Ok(deployments.get_opt(&name).await?.map(|_| ())) },
    )
    .await?;
    let client = control_plane
        .client_as_service_account(SYSTEM_NAMESPACE, &name)
        .await?;
    // The authorizer learns of the operator's bindings through its informer.
    let machines: Api<VSphereMachine> = Api::namespaced(client.clone(), SYSTEM_NAMESPACE);
    let own: Api<Provider> = Api::namespaced(client.clone(), SYSTEM_NAMESPACE);
    poll::until("the vSphere workload's grants", DEADLINE, || async {
        let granted = own.get(VSPHERE_PROVIDER).await.is_ok()
            && machines.list(&ListParams::default().limit(1)).await.is_ok();
        Ok(granted.then_some(()))
    })
    .await?;
    banlieue::roles::spawn_all(
        &client,
        &mut Registry::default(),
        shutdown,
        banlieue::roles::Roles {
            provider: Some(banlieue::roles::ProviderRole {
                backend: banlieue_provider_vsphere::backend::descriptor(),
                name: VSPHERE_PROVIDER.to_owned(),
                namespace: SYSTEM_NAMESPACE.to_owned(),
            }),
            ..banlieue::roles::Roles::default()
        },
    )
}

/// Each Deployment runs its class's provider, and the vSphere class's role is bound beside
/// the vSphere Provider, where its machines are.
async fn check_operator_objects(admin: &Client) -> Result<(), BoxError> {
    let deployments: Api<Deployment> = Api::namespaced(admin.clone(), SYSTEM_NAMESPACE);
    for (provider, backend) in [
        (objects::PROVIDER, "libvirt"),
        (VSPHERE_PROVIDER, "vsphere"),
    ] {
        let deployment = deployments.get(&workloads::workload_name(provider)).await?;
        let args = deployment
            .spec
            .template
            .spec
            .and_then(|s| s.containers.into_iter().next())
            .and_then(|c| c.args)
            .unwrap_or_default();
        assert_eq!(
            args,
            [
                "provider",
                backend,
                "run",
                "--provider",
                provider,
                "--namespace",
                SYSTEM_NAMESPACE
            ],
            "the workload of {provider}"
        );
    }
    let bindings: Api<RoleBinding> = Api::namespaced(admin.clone(), SYSTEM_NAMESPACE);
    let class_binding = bindings
        .get(&format!(
            "{}-class",
            workloads::workload_name(VSPHERE_PROVIDER)
        ))
        .await?;
    assert_eq!(
        class_binding.role_ref.name,
        workloads::class_role_name(VSPHERE_CLASS)
    );
    Ok(())
}

/// bob's Template images, each refused by the vSphere Provider with its reason, then deleted.
async fn template_attacks_are_refused(
    control_plane: &ControlPlane,
    admin: &Client,
) -> Result<(), BoxError> {
    let bob = control_plane
        .tenant_writing(SYSTEM_NAMESPACE, "bob", "vmimages")
        .await?;
    let bobs: Api<VMImage> = Api::namespaced(bob, SYSTEM_NAMESPACE);
    let images: Api<VMImage> = Api::namespaced(admin.clone(), SYSTEM_NAMESPACE);
    for (name, template, says) in [
        // Another cluster's ordinary VM, in the declared folder.
        (
            "borrowed-vm",
            "DC0/vm/DC0_C1_RP0_VM0",
            "is a VM, not a template",
        ),
        (
            "outside-folders",
            "DC0/host/DC0_C0",
            "is not in a template folder the Provider declares",
        ),
    ] {
        let mut image = vsphere_image();
        image.metadata.name = Some(name.into());
        image.spec.sources[0].template = Some(template.into());
        bobs.create(&PostParams::default(), &image).await?;
        let zone = poll::until(&format!("VMImage {name}'s zone"), DEADLINE, || async {
            let image = images.get(name).await?;
            Ok(image
                .status
                .into_iter()
                .flat_map(|s| s.per_provider)
                .find(|p| p.provider == VSPHERE_PROVIDER)
                .and_then(|p| p.zones.into_iter().next()))
        })
        .await?;
        let message = zone.message.clone().unwrap_or_default();
        if zone.phase != banlieue_api::ZonePhase::Failed || !message.contains(says) {
            return Err(format!(
                "VMImage {name}: zone {:?} {message:?}; expected Failed saying {says:?}",
                zone.phase
            )
            .into());
        }
        eprintln!("bob's Template {template}: refused: {message}");
        images.delete(name, &DeleteParams::default()).await?;
    }
    Ok(())
}

/// The vcsim model VM as a Template image of the vSphere class.
fn vsphere_image() -> VMImage {
    serde_json::from_value(json!({
        "apiVersion": "banlieue.io/v1alpha1", "kind": "VMImage",
        "metadata": {"name": VSPHERE_IMAGE, "namespace": SYSTEM_NAMESPACE},
        "spec": {"installMode": "Immediate", "revision": "1",
                 "sources": [{"providerClass": VSPHERE_CLASS, "kind": "Template",
                              "template": TEMPLATE}]}
    }))
    .expect("a valid VMImage")
}

/// One warm member on the vCenter, handed out once its guest is ready.
fn vsphere_pool() -> VirtualMachinePool {
    let mut pool = objects::pool();
    pool.metadata.name = Some(VSPHERE_POOL.into());
    let spec = &mut pool.spec.template.spec;
    spec.image_ref = LocalObjectReference::new(VSPHERE_IMAGE);
    spec.storage_class_name = VSPHERE_STORAGE_CLASS.into();
    spec.network_class_name = VSPHERE_NETWORK_CLASS.into();
    pool.spec.readiness = PoolReadiness::GuestReady;
    pool
}

fn claim_name(pool: &str) -> String {
    format!("{pool}-claim")
}

fn provider_of(vm: &VirtualMachine) -> String {
    vm.status
        .as_ref()
        .and_then(|s| s.provider_ref.as_ref())
        .map(|r| r.name.clone())
        .unwrap_or_default()
}

/// The domains libvirtd knows (`--all` or `--state-running`), through `virsh`: a client
/// independent of banlieue's.
async fn virsh_names(libvirtd: &Libvirtd, which: &str) -> Result<Vec<String>, BoxError> {
    let listed = libvirtd.virsh(["list", which, "--name"]).await?;
    Ok(listed
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect())
}

/// The pools', VirtualMachines' and machines' statuses, for a failure's message.
async fn describe(admin: &Client) -> Result<(), BoxError> {
    let pools: Api<VirtualMachinePool> = Api::namespaced(admin.clone(), SYSTEM_NAMESPACE);
    for pool in pools.list(&ListParams::default()).await?.items {
        eprintln!(
            "pool {}: {}",
            pool.name_any(),
            serde_json::to_string(&pool.status)?
        );
    }
    let vms: Api<VirtualMachine> = Api::namespaced(admin.clone(), SYSTEM_NAMESPACE);
    for vm in vms.list(&ListParams::default()).await?.items {
        eprintln!(
            "vm {}: {}",
            vm.name_any(),
            serde_json::to_string(&vm.status)?
        );
    }
    let machines: Api<VSphereMachine> = Api::namespaced(admin.clone(), SYSTEM_NAMESPACE);
    for m in machines.list(&ListParams::default()).await?.items {
        eprintln!(
            "vspheremachine {}: {}",
            m.name_any(),
            serde_json::to_string(&m.status)?
        );
    }
    let providers: Api<Provider> = Api::namespaced(admin.clone(), SYSTEM_NAMESPACE);
    for p in providers.list(&ListParams::default()).await?.items {
        eprintln!(
            "provider {}: {}",
            p.name_any(),
            serde_json::to_string(&p.status)?
        );
    }
    let images: Api<VMImage> = Api::namespaced(admin.clone(), SYSTEM_NAMESPACE);
    for i in images.list(&ListParams::default()).await?.items {
        eprintln!(
            "vmimage {}: {}",
            i.name_any(),
            serde_json::to_string(&i.status)?
        );
    }
    Ok(())
}

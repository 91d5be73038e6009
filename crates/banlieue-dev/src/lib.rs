//! `banlieue-dev up` / `banlieue-dev down`: the embedded local default. A control plane and a libvirtd
//! on loopback, bootstrap and the admission policy, a Provider for that libvirtd, the
//! controller and the provider in this process, then a pool and a claim that binds.
//!
//! `dev up --deployed` is the same job with the operator as users deploy it: a node runs
//! banlieue's image (`scripts/image`), and the controller and the Provider's workload are its
//! pods, started by their Deployments.
//!
//! A crate of its own, never linked by the product binary: it runs the local peers with the
//! test harness (`banlieue-testenv`), and the system tests in `crates/banlieue/tests` share its
//! wiring (the objects, the libvirt host's preparation, the roles run in process).

pub mod objects;
mod table;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use banlieue_api::conditions::{self, reasons, types};
use banlieue_api::names::SYSTEM_NAMESPACE;
use banlieue_api::{ClaimPhase, VirtualMachineClaim};
use banlieue_libvirt::flags::{StoragePoolCreateFlags, StorageVolCreateFlags};
use banlieue_libvirt::stream::TransferOptions;
use banlieue_libvirt::{
    CaBundle, Client as LibvirtClient, Identity, Network, StoragePool, StorageVol,
};
use banlieue_provider_libvirt::domain_xml::DomainType;
use banlieue_testenv::control_plane::ControlPlane;
use banlieue_testenv::is_running;
use banlieue_testenv::libvirtd::{Libvirtd, LibvirtdOptions};
use banlieue_testenv::node::pod_is_ready;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Client, Resource};
use prometheus_client::registry::Registry;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio_util::sync::CancellationToken;

use banlieue::apply::FIELD_MANAGER;
use banlieue::{bootstrap, observe};

/// Writes a progress line to stderr, never panicking: after its caller is gone (a closed pipe),
/// `dev up` must still tear down what it started.
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Size of the BackingFile image: enough for QEMU to open, small enough to write instantly.
const IMAGE_BYTES: u64 = 4 << 20;

/// The BackingFile image's first sector: `cli; hlt; jmp back to hlt` and the boot signature.
/// SeaBIOS boots it and the vCPU sleeps for good; with no bootable disk SeaBIOS would keep
/// looking for one, and under TCG a few hundred such domains keep two cores busy.
const HALTING_BOOT_SECTOR: [u8; 512] = {
    let mut sector = [0u8; 512];
    sector[0] = 0xFA; // cli
    sector[1] = 0xF4; // hlt
    sector[2] = 0xEB; // jmp short, relative to the next instruction (offset 4)...
    sector[3] = 0xFD; // ...-3: back to the hlt
    sector[510] = 0x55;
    sector[511] = 0xAA;
    sector
};

#[derive(Debug, clap::Subcommand)]
pub enum DevCommand {
    /// Start a local control plane and libvirtd, bootstrap, register a Provider, run the
    /// controller and provider in process, and bind a claim from a warm pool.
    ///
    /// Keeps running until Ctrl-C or `banlieue-dev down`, then tears everything down.
    Up(UpArgs),
    /// Stop a running `banlieue-dev up`, which tears everything down.
    Down,
}

#[derive(Debug, clap::Args)]
pub struct UpArgs {
    /// Exit 0 as soon as the claim is Bound (after tearing everything down).
    #[arg(long)]
    pub non_interactive: bool,
    /// Give up when the claim is not Bound within this many seconds.
    #[arg(long, default_value_t = 600)]
    pub timeout_seconds: u64,
    /// Address of the /metrics, /healthz and /readyz endpoint.
    #[arg(long, default_value = "127.0.0.1:0")]
    pub metrics_address: std::net::SocketAddr,
    /// Domain type of the guests: `qemu` (TCG emulation, works everywhere) or `kvm` (needs a
    /// usable /dev/kvm; some machines have the device but fail KVM guests).
    #[arg(long, default_value = "qemu", value_parser = ["qemu", "kvm"])]
    pub domain_type: String,
    /// Run the controller and the Provider's workload as pods on a local node, from banlieue's
    /// container image, instead of in this process.
    #[arg(long)]
    pub deployed: bool,
    /// The image's docker archive for `--deployed` [default:
    /// ~/.cache/banlieue/image/banlieue-<version>.docker.tar, which `scripts/image` writes].
    #[arg(long, requires = "deployed")]
    pub image_archive: Option<PathBuf>,
    /// The guest the pool's VMs boot. `debian` is the test image `scripts/guest-image` builds
    /// (cached in ~/.cache/banlieue/images), with cloud-init, qemu-guest-agent, a vTPM and
    /// banlieue's guest-phase layer: the pool waits for GuestReady and the claim carries the
    /// guest's address, phase and EK certificates (about a minute and a half under TCG).
    /// `none` binds a domain whose disk holds no operating system, in seconds.
    #[arg(long, default_value = "debian", value_parser = ["debian", "none"])]
    pub guest: String,
}

impl UpArgs {
    /// Whether the pool's VMs boot a real guest (`--guest debian`, the default).
    fn boots_guest(&self) -> bool {
        self.guest != "none"
    }

    /// The image archive `--deployed` loads onto the node.
    fn image_archive(&self) -> PathBuf {
        // Where scripts/image writes it, even when XDG_CACHE_HOME moves dev up's own files.
        self.image_archive.clone().unwrap_or_else(|| {
            banlieue_testenv::control_plane::banlieue_cache()
                .join("image")
                .join(format!("banlieue-{}.docker.tar", env!("CARGO_PKG_VERSION")))
        })
    }
}

/// Where `dev up` records its PID for `dev down`.
fn pid_file() -> PathBuf {
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir);
    cache.join("banlieue").join("dev").join("dev-up.pid")
}

/// Prints one progress line with the time since start.
struct Progress {
    started: Instant,
    step: usize,
}

impl Progress {
    const STEPS: usize = 10;

    fn step(&mut self, what: &str) {
        self.step += 1;
        say!(
            "[{}/{}] {what} ({:.1} s)",
            self.step,
            Self::STEPS,
            self.started.elapsed().as_secs_f64()
        );
    }

    fn note(&self, what: &str) {
        say!(
            "      {what} ({:.1} s)",
            self.started.elapsed().as_secs_f64()
        );
    }
}

pub async fn run(command: DevCommand) -> Result<(), BoxError> {
    match command {
        DevCommand::Up(args) => up(args).await,
        DevCommand::Down => down().await,
    }
}

async fn up(args: UpArgs) -> Result<(), BoxError> {
    let mut progress = Progress {
        started: Instant::now(),
        step: 0,
    };
    let pid_path = pid_file();
    if let Some(parent) = pid_path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::write(&pid_path, std::process::id().to_string())?;
    let _pid_guard = RemoveOnDrop(pid_path);

    let archive = args.image_archive();
    if args.deployed && !archive.is_file() {
        return Err(format!(
            "--deployed needs banlieue's image: {} is missing; build it with scripts/image \
             (or name another with --image-archive)",
            archive.display()
        )
        .into());
    }
    if args.deployed {
        progress.step("starting the control plane, a node and libvirtd on loopback");
        // The archive is whatever scripts/image last wrote: say which, so a stale one shows.
        let written = std::fs::metadata(&archive)
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .map(|age| format!("written {} s ago", age.as_secs()))
            .unwrap_or_default();
        progress.note(&format!("image: {} {written}", archive.display()));
    } else {
        progress.step("starting the control plane and libvirtd on loopback");
    }
    let (control_plane, libvirtd) = tokio::try_join!(
        async {
            if args.deployed {
                let control_plane = ControlPlane::start_with_node().await?;
                if let Some(node) = control_plane.node() {
                    node.import_image(&archive).await?;
                }
                Ok(control_plane)
            } else {
                ControlPlane::start().await.map_err(BoxError::from)
            }
        },
        async {
            Libvirtd::start(LibvirtdOptions::default())
                .await
                .map_err(|e| BoxError::from(e.to_string()))
        },
    )?;
    let peers = Peers {
        control_plane,
        libvirtd,
        // Unique per run: the bridge lives in the host's network namespace, which parallel
        // runs share.
        bridge: format!("bnl{}", std::process::id()),
    };
    let shutdown = CancellationToken::new();
    let mut workers = Vec::new();
    // Installed before anything is announced, so a stop request is never missed.
    let stop = banlieue::roles::stop_requested();
    let outcome = tokio::select! {
        outcome = drive(&args, &peers, &shutdown, &stop, &mut workers, &mut progress) => outcome,
        _ = stop.cancelled() => {
            if args.non_interactive { Err("interrupted".into()) } else { Ok(()) }
        }
    };

    say!("tearing down");
    shutdown.cancel();
    banlieue::roles::join_all(workers).await;
    if let Err(error) = release_host(&peers.libvirtd).await {
        say!("      could not remove the dev network: {error}");
    }
    let left = peers.stop();
    if !left.is_empty() {
        return Err(format!("still running after tear-down: {}", left.join(", ")).into());
    }
    say!("done ({:.1} s)", progress.started.elapsed().as_secs_f64());
    outcome
}

/// The local peers of one run.
struct Peers {
    control_plane: ControlPlane,
    libvirtd: Libvirtd,
    bridge: String,
}

impl Peers {
    /// Stops every process started for the run; returns those still alive afterwards.
    fn stop(self) -> Vec<String> {
        let node_pids = self
            .control_plane
            .node()
            .map(|n| n.pids())
            .unwrap_or_default();
        let mut started: Vec<(String, u32)> = self
            .control_plane
            .pids()
            .into_iter()
            .chain(node_pids)
            .map(|(name, pid)| (name.to_owned(), pid))
            .collect();
        started.push(("libvirtd".into(), self.libvirtd.pid()));
        started.extend(
            self.libvirtd
                .guest_pids()
                .into_iter()
                .map(|pid| ("qemu".to_owned(), pid)),
        );
        drop(self.libvirtd);
        drop(self.control_plane);
        started
            .iter()
            .filter(|(_, pid)| is_running(*pid))
            .map(|(name, pid)| format!("{name} (PID {pid})"))
            .collect()
    }
}

/// Everything between starting the peers and tearing them down.
async fn drive(
    args: &UpArgs,
    peers: &Peers,
    shutdown: &CancellationToken,
    stop: &CancellationToken,
    workers: &mut Vec<tokio::task::JoinHandle<()>>,
    progress: &mut Progress,
) -> Result<(), BoxError> {
    let (control_plane, libvirtd) = (&peers.control_plane, &peers.libvirtd);
    let kube = control_plane.client()?;
    let kubeconfig = control_plane
        .kubeconfig("admin")
        .map(|p| p.display().to_string())
        .unwrap_or_default();
    progress.note(&format!("kubeconfig: {kubeconfig}"));
    progress.note(&format!("libvirtd: {}", libvirtd.tls_uri()));

    progress.step("bootstrapping: namespace, CRDs, RBAC, controller Deployment");
    bootstrap_cluster(&kube).await?;

    progress.step("applying the claim-subject admission policy");
    admit_claimant(&kube).await?;

    progress.step("preparing libvirt: storage pool, isolated network, image volume");
    prepare_libvirt(libvirtd, &peers.bridge).await?;
    if args.boots_guest() {
        let image = banlieue_testenv::guest_image::path()
            .await
            .map_err(|e| banlieue_testenv::control_plane::error_chain(&e))?;
        progress.note(&format!("guest image: {}", image.display()));
        upload_guest_image(libvirtd, &image).await?;
    }

    progress.step("registering a Provider for the local libvirtd");
    let class = if args.deployed {
        objects::deployed_provider_class(bootstrap::DEFAULT_IMAGE, &args.domain_type)
    } else {
        objects::provider_class(objects::DEV_IMAGE)
    };
    register_provider(&kube, libvirtd, &class).await?;

    if args.deployed {
        progress.step("waiting for the controller's pod, as its ServiceAccount");
        let deadline = Duration::from_secs(args.timeout_seconds);
        let pod = ready_pod(
            &kube,
            "app.kubernetes.io/name=banlieue-controller",
            deadline,
        )
        .await?;
        progress.note(&format!("pod {pod}"));
        progress.step("waiting for the Provider's workload pod, which the operator made");
        let selector = format!("banlieue.io/provider={}", objects::PROVIDER);
        let pod = ready_pod(&kube, &selector, deadline).await?;
        progress.note(&format!("pod {pod}"));
        progress.note(&format!(
            "KUBECONFIG={kubeconfig} kubectl -n {SYSTEM_NAMESPACE} logs {pod}"
        ));
    } else {
        spawn_roles(args, control_plane, shutdown, workers, progress).await?;
    }

    progress.step("creating the image and the class");
    let guest = args.boots_guest();
    if guest {
        apply(&kube, &objects::guest_image()).await?;
        apply(&kube, &objects::guest_class()).await?;
    } else {
        apply(&kube, &objects::image()).await?;
        apply(&kube, &objects::class()).await?;
    }

    progress.step("creating the pool and the claim");
    if guest {
        progress.note("the pool waits for GuestReady: the guest boots under TCG (about a minute)");
        apply(&kube, &objects::guest_pool()).await?;
    } else {
        apply(&kube, &objects::pool()).await?;
    }
    let alice = control_plane.client_as(objects::CLAIMANT).await?;
    let claims: Api<VirtualMachineClaim> = Api::namespaced(alice, SYSTEM_NAMESPACE);
    let mut claim = objects::claim();
    // A guest with the layer takes alice's key after the bind: the key is dev up's own.
    let ssh_key = if guest {
        let key = dev_ssh_key()?;
        progress.note(&format!("alice's SSH key: {}", key.private.display()));
        claim.spec.access = Some(banlieue_api::access::ClaimAccess {
            ssh_authorized_keys: vec![key.public.clone()],
            user: None,
        });
        Some(key)
    } else {
        None
    };
    claims.create(&PostParams::default(), &claim).await?;

    progress.step("waiting for the claim to be Bound");
    let deadline = Duration::from_secs(args.timeout_seconds);
    tokio::select! {
        bound = wait_bound(&kube, deadline, progress) => bound?,
        _ = shutdown.cancelled() => return Err("a role failed; see the log above".into()),
    }
    println!("{}", table::claims_view(&kube, SYSTEM_NAMESPACE).await?);
    // The kubectl built with the control plane, of the same release, as the guides expect.
    let built = banlieue_testenv::control_plane::bin_dir().join("kubectl");
    let kubectl = if built.is_file() {
        built.display().to_string()
    } else {
        "kubectl".to_owned()
    };
    println!("kubeconfig: {kubeconfig}");
    println!("  KUBECONFIG={kubeconfig} {kubectl} get vmclaim,bvm,lvmachine -n {SYSTEM_NAMESPACE}");
    if args.deployed {
        println!("  KUBECONFIG={kubeconfig} {kubectl} get pods -n {SYSTEM_NAMESPACE}");
    }
    if let Some(key) = &ssh_key {
        report_guest(&kube, libvirtd).await?;
        try_ssh(control_plane, &peers.bridge, key, deadline).await?;
    }
    if !args.non_interactive {
        say!("running; Ctrl-C or `banlieue-dev down` tears everything down");
        tokio::select! {
            _ = stop.cancelled() => {}
            _ = shutdown.cancelled() => return Err("a role failed; see the log above".into()),
        }
    }
    Ok(())
}

/// Runs the controller and the Provider's workload in this process, each as its ServiceAccount
/// under the shipped RBAC: admin only set up what an administrator sets up.
async fn spawn_roles(
    args: &UpArgs,
    control_plane: &ControlPlane,
    shutdown: &CancellationToken,
    workers: &mut Vec<tokio::task::JoinHandle<()>>,
    progress: &mut Progress,
) -> Result<(), BoxError> {
    progress.step("running the controller in this process, as its ServiceAccount");
    let mut registry = Registry::default();
    workers.extend(spawn_controller(control_plane, &mut registry, shutdown).await?);
    progress
        .step("running the Provider's workload in this process, as the account the operator made");
    workers.extend(
        spawn_provider_workload(
            control_plane,
            objects::PROVIDER,
            DomainType::parse(&args.domain_type),
            Duration::from_secs(args.timeout_seconds),
            &mut registry,
            shutdown,
        )
        .await?,
    );
    let readiness = observe::Readiness::default();
    let metrics =
        observe::spawn_server(args.metrics_address, Arc::new(registry), readiness.clone()).await?;
    readiness.set(true);
    progress.note(&format!("metrics: http://{metrics}/metrics"));
    Ok(())
}

/// Bootstraps an empty cluster as `banlieue bootstrap` does: namespaces, CRDs, RBAC and the
/// controller Deployment.
pub async fn bootstrap_cluster(kube: &Client) -> Result<(), BoxError> {
    let objects = bootstrap::bootstrap_objects()?;
    bootstrap::apply_all(kube, &objects, |_| {}).await?;
    Ok(())
}

/// [`bootstrap_cluster`] without its Deployments, for a cluster with a node whose roles run
/// in this process: there a controller pod would be a second controller, and a pod of an image
/// the node lacks a pull from a registry.
pub async fn bootstrap_cluster_without_workloads(kube: &Client) -> Result<(), BoxError> {
    let objects: Vec<_> = bootstrap::bootstrap_objects()?
        .into_iter()
        .filter(|o| o.types.as_ref().is_none_or(|t| t.kind != "Deployment"))
        .collect();
    bootstrap::apply_all(kube, &objects, |_| {}).await?;
    Ok(())
}

/// Applies the shipped admission policies with the dev issuer and images, and lets [`objects::CLAIMANT`]
/// create and read claims in the system namespace.
pub async fn admit_claimant(kube: &Client) -> Result<(), BoxError> {
    let admission = bootstrap::objects_of(bootstrap::ADMISSION)?;
    bootstrap::apply_all(kube, &admission, |_| {}).await?;
    apply(kube, &objects::claim_policy_configmap()).await?;
    apply(kube, &objects::workload_images_configmap()).await?;
    let (role, binding) = objects::claimant_rbac();
    apply(kube, &role).await?;
    apply(kube, &binding).await?;
    Ok(())
}

/// Gives `libvirtd` the storage pool, the isolated network on `bridge` and the image volume.
pub async fn prepare_libvirt(libvirtd: &Libvirtd, bridge: &str) -> Result<(), BoxError> {
    let host = connect(libvirtd).await?;
    let pool_dir = libvirtd.create_pool_dir(objects::STORAGE_POOL)?;
    prepare_host(&host, &pool_dir.display().to_string(), bridge).await?;
    host.close().await?;
    Ok(())
}

/// Registers the Provider [`objects::PROVIDER`] for `libvirtd`: its credentials Secret, its CA
/// ConfigMap, the ProviderClass `class` and the Provider, as an administrator would.
pub async fn register_provider(
    kube: &Client,
    libvirtd: &Libvirtd,
    class: &banlieue_api::ProviderClass,
) -> Result<(), BoxError> {
    let cert = std::fs::read(libvirtd.client_cert_path())?;
    let key = std::fs::read(libvirtd.client_key_path())?;
    let ca_pem = std::fs::read_to_string(libvirtd.ca_cert_path())?;
    apply(kube, &objects::credentials_secret(&cert, &key)).await?;
    apply(kube, &objects::ca_configmap(&ca_pem)).await?;
    apply(kube, class).await?;
    apply(kube, &objects::provider(&libvirtd.tls_uri())).await?;
    Ok(())
}

/// The local default with stand-in members, for system tests: the cluster bootstrapped with
/// the shipped admission policies and the claimant admitted, `libvirtd` prepared (its network
/// on `bridge`), the Provider registered, the controller and the Provider's workload running
/// in this process as their ServiceAccounts (plain `qemu` domains, which any host runs; its
/// account made within `deadline`), and the dev image and class applied. The pool is the
/// caller's. Returns the workers, which stop with `shutdown`.
pub async fn start_stand_in_default(
    control_plane: &ControlPlane,
    libvirtd: &Libvirtd,
    bridge: &str,
    deadline: Duration,
    registry: &mut Registry,
    shutdown: &CancellationToken,
) -> Result<Vec<tokio::task::JoinHandle<()>>, BoxError> {
    let admin = control_plane.client()?;
    bootstrap_cluster(&admin).await?;
    admit_claimant(&admin).await?;
    prepare_libvirt(libvirtd, bridge).await?;
    register_provider(
        &admin,
        libvirtd,
        &objects::provider_class(objects::DEV_IMAGE),
    )
    .await?;
    let mut workers = spawn_controller(control_plane, registry, shutdown).await?;
    workers.extend(
        spawn_provider_workload(
            control_plane,
            objects::PROVIDER,
            Some(DomainType::Qemu),
            deadline,
            registry,
            shutdown,
        )
        .await?,
    );
    apply(&admin, &objects::image()).await?;
    apply(&admin, &objects::class()).await?;
    Ok(workers)
}

/// Runs the controller and the Provider operator in this process as the controller's
/// ServiceAccount, under the shipped RBAC.
pub async fn spawn_controller(
    control_plane: &ControlPlane,
    registry: &mut Registry,
    shutdown: &CancellationToken,
) -> Result<Vec<tokio::task::JoinHandle<()>>, BoxError> {
    spawn_controller_with(control_plane, registry, shutdown, None).await
}

/// [`spawn_controller`] with the ReadinessSignalAbsent grace set (`None`: the default).
pub async fn spawn_controller_with(
    control_plane: &ControlPlane,
    registry: &mut Registry,
    shutdown: &CancellationToken,
    readiness_signal_grace: Option<Duration>,
) -> Result<Vec<tokio::task::JoinHandle<()>>, BoxError> {
    let controller = control_plane
        .client_as_service_account(SYSTEM_NAMESPACE, CONTROLLER_SERVICE_ACCOUNT)
        .await?;
    banlieue::roles::spawn_all(
        &controller,
        registry,
        shutdown,
        banlieue::roles::Roles {
            controller: true,
            operator: true,
            readiness_signal_grace,
            ..banlieue::roles::Roles::default()
        },
    )
}

/// Runs the Provider operator alone in this process, as the controller's ServiceAccount,
/// watching only `namespace`'s Providers: for a control plane other tests' Providers share.
pub async fn spawn_operator(
    control_plane: &ControlPlane,
    namespace: &str,
    shutdown: &CancellationToken,
) -> Result<Vec<tokio::task::JoinHandle<()>>, BoxError> {
    let kube = control_plane
        .client_as_service_account(SYSTEM_NAMESPACE, CONTROLLER_SERVICE_ACCOUNT)
        .await?;
    banlieue::roles::spawn_all(
        &kube,
        &mut Registry::default(),
        shutdown,
        banlieue::roles::Roles {
            operator: true,
            operator_namespace: Some(namespace.to_owned()),
            ..banlieue::roles::Roles::default()
        },
    )
}

/// Runs the workload of the Provider `provider` (in the system namespace) in this process, as
/// the ServiceAccount the operator made for it, once the operator has made it (within
/// `deadline`).
pub async fn spawn_provider_workload(
    control_plane: &ControlPlane,
    provider: &str,
    domain_type: Option<DomainType>,
    deadline: Duration,
    registry: &mut Registry,
    shutdown: &CancellationToken,
) -> Result<Vec<tokio::task::JoinHandle<()>>, BoxError> {
    let workload = workload_account(&control_plane.client()?, provider, deadline).await?;
    let client = control_plane
        .client_as_service_account(SYSTEM_NAMESPACE, &workload)
        .await?;
    banlieue::roles::spawn_all(
        &client,
        registry,
        shutdown,
        banlieue::roles::Roles {
            provider: Some(banlieue::roles::ProviderRole {
                backend: banlieue_provider_libvirt::backend::descriptor_forcing(domain_type),
                name: provider.to_owned(),
                namespace: SYSTEM_NAMESPACE.to_owned(),
            }),
            ..banlieue::roles::Roles::default()
        },
    )
}

/// The controller's ServiceAccount, from deploy/controller.yaml.
const CONTROLLER_SERVICE_ACCOUNT: &str = "banlieue-controller";

/// Waits for the operator to create the Provider's workload and returns its ServiceAccount's
/// name. The Deployment is the operator's last object, so its grants exist once it does, as
/// they do before a pod of it starts in a cluster.
async fn workload_account(
    kube: &kube::Client,
    provider: &str,
    deadline: Duration,
) -> Result<String, BoxError> {
    let name = banlieue_provider_kit::workload_names::workload_name(provider);
    let deployments: Api<k8s_openapi::api::apps::v1::Deployment> =
        Api::namespaced(kube.clone(), SYSTEM_NAMESPACE);
    let until = tokio::time::Instant::now() + deadline;
    loop {
        if deployments.get_opt(&name).await?.is_some() {
            return Ok(name);
        }
        if tokio::time::Instant::now() >= until {
            return Err(format!(
                "the operator did not create the workload {name} within {deadline:?}"
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits for a Ready pod of `selector` in the system namespace; returns its name.
async fn ready_pod(kube: &Client, selector: &str, deadline: Duration) -> Result<String, BoxError> {
    let pods: Api<k8s_openapi::api::core::v1::Pod> =
        Api::namespaced(kube.clone(), SYSTEM_NAMESPACE);
    let until = tokio::time::Instant::now() + deadline;
    loop {
        let list = pods
            .list(&kube::api::ListParams::default().labels(selector))
            .await?;
        let ready = (list.items.into_iter())
            .find(|pod| pod.metadata.deletion_timestamp.is_none() && pod_is_ready(pod));
        if let Some(name) = ready.and_then(|pod| pod.metadata.name) {
            return Ok(name);
        }
        if tokio::time::Instant::now() >= until {
            return Err(format!("no Ready pod {selector} within {deadline:?}").into());
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

async fn connect(libvirtd: &Libvirtd) -> Result<LibvirtClient, BoxError> {
    let identity = Identity::from_files(&libvirtd.client_cert_path(), &libvirtd.client_key_path())?;
    let ca = CaBundle::from_file(&libvirtd.ca_cert_path())?;
    Ok(LibvirtClient::connect(&libvirtd.tls_uri(), &identity, &ca).await?)
}

/// Stops the dev network, whose bridge would otherwise outlive the daemon on the host.
pub async fn release_host(libvirtd: &Libvirtd) -> Result<(), BoxError> {
    let host = connect(libvirtd).await?;
    if let Some(network) = Network::lookup_by_name(&host, objects::NETWORK).await? {
        network.destroy().await?;
    }
    host.close().await?;
    Ok(())
}

/// The storage pool, the isolated network and the image volume.
async fn prepare_host(host: &LibvirtClient, pool_dir: &str, bridge: &str) -> Result<(), BoxError> {
    let pool = StoragePool::define_xml(host, &objects::storage_pool_xml(pool_dir)).await?;
    pool.create(StoragePoolCreateFlags::empty()).await?;
    Network::define_xml(host, &objects::network_xml(bridge))
        .await?
        .create()
        .await?;
    let volume = StorageVol::create_xml(
        &pool,
        &banlieue_provider_libvirt::volume_xml::raw(objects::IMAGE_VOLUME, IMAGE_BYTES),
        StorageVolCreateFlags::empty(),
    )
    .await?;
    let zeros = tokio::io::AsyncReadExt::take(
        tokio::io::repeat(0),
        IMAGE_BYTES - HALTING_BOOT_SECTOR.len() as u64,
    );
    let mut disk = tokio::io::AsyncReadExt::chain(&HALTING_BOOT_SECTOR[..], zeros);
    volume
        .upload(
            &mut disk,
            TransferOptions::new().length(IMAGE_BYTES).sparse(true),
        )
        .await?;
    Ok(())
}

/// Uploads the test guest image as the qcow2 volume [`objects::GUEST_IMAGE_VOLUME`].
pub async fn upload_guest_image(
    libvirtd: &Libvirtd,
    image: &std::path::Path,
) -> Result<(), BoxError> {
    upload_volume(libvirtd, image, objects::GUEST_IMAGE_VOLUME).await
}

/// Uploads `file` into the dev storage pool as the volume `name`, byte for byte.
pub async fn upload_volume(
    libvirtd: &Libvirtd,
    file: &std::path::Path,
    name: &str,
) -> Result<(), BoxError> {
    let host = connect(libvirtd).await?;
    let pool = StoragePool::lookup_by_name(&host, objects::STORAGE_POOL)
        .await?
        .ok_or("the dev storage pool is missing")?;
    let bytes = std::fs::metadata(file)?.len();
    let volume = StorageVol::create_xml(
        &pool,
        &banlieue_provider_libvirt::volume_xml::raw(name, bytes),
        StorageVolCreateFlags::empty(),
    )
    .await?;
    let mut file = tokio::fs::File::open(file).await?;
    volume
        .upload(&mut file, TransferOptions::new().length(bytes).sparse(true))
        .await?;
    host.close().await?;
    Ok(())
}

/// The host's swtpm-localca issuer and root certificates, which sign every vTPM's EK
/// certificate here: what the Provider's `ekTrustBundle` names. swtpm_localca makes them on
/// the first vTPM start, so they are read after a guest booted.
pub fn swtpm_localca_bundle() -> Result<String, BoxError> {
    let dir = std::path::Path::new(SWTPM_LOCALCA_DIR);
    let mut pem = String::new();
    for file in ["issuercert.pem", "swtpm-localca-rootca-cert.pem"] {
        let path = dir.join(file);
        pem.push_str(
            &std::fs::read_to_string(&path).map_err(|e| format!("read {}: {e}", path.display()))?,
        );
    }
    Ok(pem)
}

/// dev up's own SSH key pair for alice's claim, kept beside its PID file so that a second run
/// reuses it.
struct DevSshKey {
    private: PathBuf,
    public: String,
}

fn dev_ssh_key() -> Result<DevSshKey, BoxError> {
    let private = pid_file().with_file_name("id_ed25519");
    if !private.is_file() {
        let made = std::process::Command::new("ssh-keygen")
            .args([
                "-q",
                "-t",
                "ed25519",
                "-N",
                "",
                "-C",
                "alice@banlieue-dev",
                "-f",
            ])
            .arg(&private)
            .stdin(std::process::Stdio::null())
            .output()
            .map_err(|e| format!("run ssh-keygen (openssh-client): {e}"))?;
        if !made.status.success() {
            return Err(format!(
                "ssh-keygen: {}",
                String::from_utf8_lossy(&made.stderr).trim()
            )
            .into());
        }
    }
    let public = std::fs::read_to_string(private.with_extension("pub"))?;
    Ok(DevSshKey {
        private,
        public: public.trim().to_owned(),
    })
}

/// Waits for the claim's keys in its guest, routes the host to the guest on the isolated
/// network, then prints the `banlieue claim ssh` line to try and runs it once, so that what
/// is printed is known to work.
async fn try_ssh(
    control_plane: &ControlPlane,
    bridge: &str,
    key: &DevSshKey,
    deadline: Duration,
) -> Result<(), BoxError> {
    let alice = control_plane.client_as(objects::CLAIMANT).await?;
    let claims: Api<VirtualMachineClaim> = Api::namespaced(alice, SYSTEM_NAMESPACE);
    let until = Instant::now() + deadline;
    let status = loop {
        let status = claims.get(objects::CLAIM).await?.status.unwrap_or_default();
        match conditions::find(&status.conditions, types::ACCESS_READY) {
            Some(c) if c.status == "True" => break status,
            // Final: the member is single-use, its guest will not think again.
            Some(c) if c.reason == reasons::ACCESS_REFUSED => {
                return Err(format!("alice's key: {}", c.message).into());
            }
            last => {
                if Instant::now() >= until {
                    return Err(format!(
                        "the claim's keys not in its guest within {deadline:?}: {}",
                        last.map_or("no AccessReady".to_owned(), |c| c.message.clone())
                    )
                    .into());
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let address = status
        .addresses
        .first()
        .map(|a| a.address.clone())
        .ok_or("the claim has no address")?;
    banlieue_testenv::guest_network::route_to_guest(bridge, &address)?;
    let kubeconfig = control_plane
        .kubeconfig(objects::CLAIMANT)
        .ok_or("alice's kubeconfig")?
        .display()
        .to_string();
    // The product's binary, built beside this one (scripts/run builds both).
    let banlieue = std::env::current_exe()?.with_file_name("banlieue");
    // What alice's administrator gives her: the Provider's EK trust bundle, to prove the VM
    // with before its host key is trusted (ADR-0077).
    let bundle = pid_file().with_file_name("ek-trust-bundle.pem");
    std::fs::write(&bundle, swtpm_localca_bundle()?)?;
    let line = format!(
        "KUBECONFIG={kubeconfig} {} claim -n {SYSTEM_NAMESPACE} ssh {} -i {} --trust-bundle {} -- uname -a",
        banlieue.display(),
        objects::CLAIM,
        key.private.display(),
        bundle.display()
    );
    println!(
        "  as alice, over SSH once her VM is verified, the host key it quoted pinned (login {}):",
        status.login_user.as_deref().unwrap_or("?")
    );
    println!("  {line}");
    if !banlieue.is_file() {
        println!(
            "  ({} is not built: scripts/run builds it)",
            banlieue.display()
        );
        return Ok(());
    }
    let ran = tokio::process::Command::new(&banlieue)
        .env("KUBECONFIG", &kubeconfig)
        .args(["claim", "-n", SYSTEM_NAMESPACE, "ssh", objects::CLAIM, "-i"])
        .arg(&key.private)
        .arg("--trust-bundle")
        .arg(&bundle)
        .args(["--", "uname", "-a"])
        .stdin(std::process::Stdio::null())
        .output()
        .await?;
    if !ran.status.success() {
        return Err(format!(
            "banlieue claim ssh: {}",
            String::from_utf8_lossy(&ran.stderr).trim()
        )
        .into());
    }
    // The verifier's steps, as it printed them.
    for step in String::from_utf8_lossy(&ran.stderr).lines() {
        println!("  {}", step.trim_start());
    }
    println!("  ran: {}", String::from_utf8_lossy(&ran.stdout).trim());
    Ok(())
}

/// Where swtpm_localca keeps its CA (`/etc/swtpm-localca.conf`).
pub const SWTPM_LOCALCA_DIR: &str = "/var/lib/swtpm-localca";

/// Publishes the trust bundle and prints what the guest reported and how to reach it.
async fn report_guest(kube: &Client, libvirtd: &Libvirtd) -> Result<(), BoxError> {
    apply(kube, &objects::ek_trust_configmap(&swtpm_localca_bundle()?)).await?;
    let claims: Api<VirtualMachineClaim> = Api::namespaced(kube.clone(), SYSTEM_NAMESPACE);
    let claim = claims.get(objects::CLAIM).await?;
    let status = claim.status.unwrap_or_default();
    let vm = status
        .virtual_machine_ref
        .map(|r| r.name)
        .unwrap_or_default();
    let vms: Api<banlieue_api::VirtualMachine> = Api::namespaced(kube.clone(), SYSTEM_NAMESPACE);
    let phase = vms
        .get(&vm)
        .await?
        .status
        .and_then(|s| s.guest_phase)
        .unwrap_or_default();
    let domain = banlieue_api::names::domain_name(SYSTEM_NAMESPACE, &vm);
    println!("guest: phase {phase:?}, domain {domain}");
    for a in &status.addresses {
        println!("  address {} {}", a.type_, a.address);
    }
    for digest in &status.tpm_endorsement_key_digests {
        println!("  EK public key {digest}");
    }
    println!(
        "  {} EK certificate(s) on the claim, issued by swtpm-localca ({} is the Provider's ekTrustBundle)",
        status.tpm_endorsement_certificates.len(),
        objects::EK_TRUST_CONFIGMAP
    );
    let uri = libvirtd.virsh_uri();
    println!("  serial console: virsh -c '{uri}' console {domain}");
    println!(
        "  a command in the guest: virsh -c '{uri}' qemu-agent-command {domain} \\
    '{{\"execute\":\"guest-exec\",\"arguments\":{{\"path\":\"/usr/bin/uname\",\"arg\":[\"-a\"],\"capture-output\":true}}}}'"
    );
    Ok(())
}

async fn wait_bound(
    kube: &Client,
    deadline: Duration,
    progress: &Progress,
) -> Result<(), BoxError> {
    let claims: Api<VirtualMachineClaim> = Api::namespaced(kube.clone(), SYSTEM_NAMESPACE);
    let started = Instant::now();
    let mut last = String::new();
    let mut last_members = String::new();
    loop {
        let claim = claims.get(objects::CLAIM).await?;
        let status = claim.status.unwrap_or_default();
        if status.phase == Some(ClaimPhase::Bound) {
            return Ok(());
        }
        let why = status
            .conditions
            .iter()
            .find(|c| c.type_ == "Bound")
            .map(|c| format!("{}: {}", c.reason, c.message))
            .unwrap_or_else(|| "waiting for the controller".into());
        let phase = status
            .phase
            .map(|p| format!("{p:?}"))
            .unwrap_or_else(|| "new".into());
        let line = format!("claim {phase}: {why}");
        if line != last {
            progress.note(&line);
            last = line;
        }
        // What the claim's message cannot say: which member is stuck where, and replacements.
        let members = pool_members(kube).await.unwrap_or_default();
        if members != last_members {
            for member in members.lines() {
                progress.note(member);
            }
            last_members = members;
        }
        if started.elapsed() > deadline {
            return Err(format!(
                "the claim was not Bound within {deadline:?}: {last}; the pool's members: {}",
                if last_members.is_empty() {
                    "none"
                } else {
                    &last_members
                }
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// One line per member of the pool (its readiness conditions) and one for a Degraded pool.
async fn pool_members(kube: &Client) -> Result<String, kube::Error> {
    use banlieue_api::conditions::{find, types};
    let pools: Api<banlieue_api::VirtualMachinePool> =
        Api::namespaced(kube.clone(), SYSTEM_NAMESPACE);
    let vms: Api<banlieue_api::VirtualMachine> = Api::namespaced(kube.clone(), SYSTEM_NAMESPACE);
    let mut lines = Vec::new();
    let pool = pools.get(objects::POOL).await?;
    if let Some(degraded) = pool
        .status
        .as_ref()
        .and_then(|s| find(&s.conditions, types::DEGRADED))
        .filter(|c| c.status == banlieue_api::conditions::status::TRUE)
    {
        lines.push(format!(
            "pool Degraded: {}: {}",
            degraded.reason, degraded.message
        ));
    }
    let selector = format!("{}={}", banlieue_api::names::LABEL_POOL, objects::POOL);
    for vm in vms
        .list(&kube::api::ListParams::default().labels(&selector))
        .await?
    {
        let name = vm.metadata.name.clone().unwrap_or_default();
        let conditions = vm.status.map(|s| s.conditions).unwrap_or_default();
        let shown: Vec<String> = [types::INFRASTRUCTURE_READY, types::GUEST_READY]
            .into_iter()
            .filter_map(|t| find(&conditions, t))
            .map(|c| format!("{}={} {}", c.type_, c.status, c.reason))
            .collect();
        lines.push(format!(
            "member {name}: {}",
            if shown.is_empty() {
                "no conditions yet".to_owned()
            } else {
                shown.join(", ")
            }
        ));
    }
    Ok(lines.join("\n"))
}

async fn down() -> Result<(), BoxError> {
    let path = pid_file();
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            println!("no `banlieue-dev up` is running");
            return Ok(());
        }
        Err(e) => return Err(e.into()),
    };
    let pid: i32 = text
        .trim()
        .parse()
        .map_err(|_| format!("{}: not a PID: {text:?}", path.display()))?;
    // Only signal the process if it is really a dev up: the PID may have been reused.
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let args: Vec<&[u8]> = cmdline.split(|&b| b == 0).collect();
    let program = |arg: &[u8]| arg.ends_with(b"banlieue-dev");
    let is_dev_up = args.windows(2).any(|w| program(w[0]) && w[1] == b"up");
    if !is_dev_up {
        let _ = std::fs::remove_file(&path);
        println!("no `banlieue-dev up` is running (stale PID file removed)");
        return Ok(());
    }
    let process = rustix::process::Pid::from_raw(pid).ok_or("invalid PID")?;
    rustix::process::kill_process(process, rustix::process::Signal::TERM)?;
    println!("stopping banlieue-dev up (PID {pid})");
    let deadline = Instant::now() + Duration::from_secs(120);
    while is_running(pid as u32) {
        if Instant::now() > deadline {
            return Err(format!("PID {pid} did not exit within 120 s").into());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    println!("stopped; nothing is left running");
    Ok(())
}

/// Server-side applies a typed object with the bootstrap field manager.
pub async fn apply<K>(kube: &Client, object: &K) -> Result<(), BoxError>
where
    K: Resource<DynamicType = ()> + Serialize + DeserializeOwned + Clone + std::fmt::Debug,
    K::Scope: ScopeApi<K>,
{
    let name = object.meta().name.clone().ok_or("object without a name")?;
    let api = K::Scope::api(kube, object.meta().namespace.as_deref());
    api.patch(
        &name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(object),
    )
    .await?;
    Ok(())
}

/// Picks a namespaced or cluster-wide `Api` from the object's scope.
pub trait ScopeApi<K> {
    fn api(kube: &Client, namespace: Option<&str>) -> Api<K>;
}

impl<K> ScopeApi<K> for k8s_openapi::NamespaceResourceScope
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>,
{
    fn api(kube: &Client, namespace: Option<&str>) -> Api<K> {
        Api::namespaced(kube.clone(), namespace.unwrap_or("default"))
    }
}

impl<K> ScopeApi<K> for k8s_openapi::ClusterResourceScope
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::ClusterResourceScope>,
{
    fn api(kube: &Client, _: Option<&str>) -> Api<K> {
        Api::all(kube.clone())
    }
}

struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_dev_image_boots_into_a_halt_it_never_leaves() {
        let sector = HALTING_BOOT_SECTOR;
        assert_eq!(
            &sector[510..],
            [0x55, 0xAA],
            "SeaBIOS boots only a signed sector"
        );
        assert_eq!(&sector[..2], [0xFA, 0xF4], "interrupts off, then hlt");
        // The short jump after the hlt lands on the hlt: an NMI's return halts again.
        assert_eq!(sector[2], 0xEB);
        let next = 4_i64;
        assert_eq!(next + i64::from(sector[3] as i8), 1);
    }
}

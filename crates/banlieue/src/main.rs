//! The banlieue binary: one executable for every role, chosen by subcommand.

// A product function stays under clippy.toml's line limit (tests may be longer).
#![cfg_attr(not(test), deny(clippy::too_many_lines))]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

#[cfg(feature = "libvirt")]
use banlieue::libvirt;
use banlieue::roles::{self, Roles};
use banlieue::{bootstrap, cidata, login, observe};
use banlieue_runtime::leader::{self, LeaderElector, LeaseConfig};
use clap::{Args, Parser, Subcommand};
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;

/// banlieue: single-use VM sandboxes on Kubernetes, on libvirt/KVM hosts.
///
/// Kubernetes access uses the current kubeconfig (KUBECONFIG, ~/.kube/config) or the
/// in-cluster service account.
#[derive(Debug, Parser)]
#[command(name = "banlieue", version, about, propagate_version = true)]
struct Cli {
    #[command(flatten)]
    log: observe::LogArgs,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the controller: VirtualMachine scheduling, pools and claims, and the Provider
    /// operator that creates each Provider's workload. It never talks to libvirt.
    Controller(ControllerArgs),
    /// Provider roles: `banlieue provider <backend> run`.
    Provider(ProviderCommand),
    /// A consumer's claims: `create POOL --ttl 1h --ssh-key ~/.ssh/id_ed25519.pub --wait`,
    /// `list`, `release NAME`. As the kubeconfig's user, in its context's namespace or `-n`.
    Claim(banlieue::claim_cli::ClaimCommand),
    /// Print every CustomResourceDefinition as YAML, or write one file per CRD.
    Crds {
        /// Write `<name>.yaml` files into this directory instead of printing.
        #[arg(long, value_name = "DIR")]
        out: Option<PathBuf>,
    },
    /// Write what deploy/ holds because of this build's backends: each CRD's file, each
    /// backend's class ClusterRole, and the generated lists in the other manifests.
    Manifests {
        /// The directory the kustomize base is in.
        #[arg(default_value = "deploy", value_name = "DIR")]
        deploy: PathBuf,
        /// Write nothing; fail when a file differs from what would be written.
        #[arg(long)]
        check: bool,
    },
    /// Apply the namespaces, CRDs, RBAC and the controller and image builder Deployments to the
    /// current kubeconfig.
    ///
    /// Server-side apply, idempotent; prints what changed. Applies the isolation policies of
    /// deploy/admission/ too, creating their ConfigMaps when missing and leaving them as the
    /// site edited them otherwise.
    Bootstrap {
        /// The controller's container image (see docs/guides/image.md).
        #[arg(long, value_name = "IMAGE", default_value = bootstrap::DEFAULT_IMAGE,
              value_parser = clap::builder::NonEmptyStringValueParser::new())]
        image: String,
        /// Leave deploy/admission/ out, for a cluster that enforces the same rules its own way
        /// (docs/security.md, "Turning the policies off").
        #[arg(long)]
        without_admission: bool,
    },
    /// Inspect libvirt hosts and the libvirt protocol through banlieue's own client.
    #[cfg(feature = "libvirt")]
    #[command(subcommand)]
    Libvirt(libvirt::Command),
    /// Build a cloud-init NoCloud seed ISO (label `cidata`) in process.
    Cidata(cidata::CidataArgs),
    /// Log in at an OIDC issuer for kubectl: an exec credential plugin printing an
    /// ExecCredential (cached ID token, refresh, or a browser login with PKCE).
    Login(login::LoginArgs),
    /// The image builder: VMImage Url sources into raw disk artifacts (ADR-0010, ADR-0064).
    #[command(subcommand)]
    Imagebuild(ImagebuildCommand),
}

#[derive(Debug, Subcommand)]
enum ImagebuildCommand {
    /// Run the build reconciler: resolve each VMImage's Url source to a manifest digest and
    /// keep one build Job per digest in the build namespace.
    Controller(ImagebuildControllerArgs),
    /// Build one VMImage's artifact (what a build Job runs): pull the pinned reference, verify
    /// every blob, write the raw disk onto the artifacts volume, publish it on the VMImage.
    ///
    /// Registry credentials and CA are read from the objects the VMImage names, in the build
    /// namespace, through the Kubernetes API, never from the command line.
    Run {
        /// The VMImage being built.
        #[arg(long)]
        vmimage: String,
        /// The VMImage's namespace.
        #[arg(long)]
        namespace: String,
        /// The build namespace, where the pull Secret and CA ConfigMap the VMImage names live.
        #[arg(long, default_value = banlieue_api::names::DEFAULT_BUILD_NAMESPACE)]
        credentials_namespace: String,
        /// The source's repository pinned to the digest to build (`repo@sha256:…`).
        #[arg(long)]
        reference: String,
        /// The artifacts volume's mount point.
        #[arg(long, default_value = "/artifacts")]
        artifacts: PathBuf,
        /// The artifacts PVC, named on the published artifact.
        #[arg(long, default_value = "banlieue-artifacts")]
        claim_name: String,
        /// Refuse disks larger than this many bytes.
        #[arg(long, default_value_t = banlieue_imagebuilder::build::DEFAULT_MAX_DISK_BYTES)]
        max_disk_bytes: u64,
    },
    /// Compute a disk image's PCR reference values: PCR 4 (its boot chain) and PCR 5 (its
    /// partition table) as an EDK2 firmware (OVMF) measures a boot of it through shim, from
    /// the image's bytes (raw or qcow2), as the build publishes them on a VMImage. Prints each
    /// measurement; `--write` saves the file `banlieue claim verify --pcr-references` reads.
    Pcrs {
        /// The disk image (raw or qcow2), e.g. pulled from the registry by its digest.
        image: PathBuf,
        /// An EFI application of the boot chain, as a path on the EFI system partition, in the
        /// order they start (repeat the flag). Shim's chain when none is given:
        /// `\EFI\BOOT\BOOTX64.EFI` then `\EFI\BOOT\grubx64.efi`.
        #[arg(long = "loader")]
        loaders: Vec<String>,
        /// Write the reference file here.
        #[arg(long)]
        write: Option<PathBuf>,
    },
}

#[derive(Debug, Args)]
struct ImagebuildControllerArgs {
    #[command(flatten)]
    serve: ServeArgs,
    /// Build only the VMImages of these namespaces (repeat the flag, or separate them with
    /// commas; all namespaces when none is given).
    #[arg(
        long = "namespace",
        env = "BANLIEUE_IMAGEBUILD_WATCH_NAMESPACE",
        value_delimiter = ','
    )]
    namespaces: Vec<String>,
    /// The build namespace, where build Jobs run next to the artifacts PVC.
    #[arg(long, default_value = banlieue_api::names::DEFAULT_BUILD_NAMESPACE)]
    build_namespace: String,
    /// The artifacts PVC in the build namespace.
    #[arg(long, default_value = "banlieue-artifacts")]
    artifacts_claim: String,
    /// The ServiceAccount build pods run as.
    #[arg(long, default_value = "banlieue-build")]
    build_service_account: String,
    /// The container image build pods run (banlieue's own).
    #[arg(long, env = "BANLIEUE_IMAGE", default_value = banlieue::bootstrap::DEFAULT_IMAGE)]
    build_image: String,
    /// How often a built tag is resolved again, to notice that it moved.
    #[arg(long, default_value_t = 600)]
    refresh_seconds: u64,
    /// The only registries VMImage Url sources may name (host, or host:port as the reference
    /// writes it; repeat the flag or separate with commas). Any other is RegistryNotAllowed and
    /// never contacted. Every registry when none is given.
    #[arg(
        long = "allowed-registries",
        env = "BANLIEUE_ALLOWED_REGISTRIES",
        value_delimiter = ','
    )]
    allowed_registries: Vec<String>,
}

/// `banlieue provider <backend> …`: one of the backends this build holds
/// ([`banlieue::backends`]).
#[derive(Debug, Args)]
struct ProviderCommand {
    /// The backend.
    #[arg(value_parser = clap::builder::PossibleValuesParser::new(banlieue::backends::names()))]
    backend: String,
    #[command(subcommand)]
    action: ProviderAction,
}

#[derive(Debug, Subcommand)]
enum ProviderAction {
    /// Run one Provider's workload: reach its host (a libvirtd, a vCenter) and publish its
    /// readiness and failure domains, realise its machines, and (libvirt) import its images.
    Run {
        /// The Provider's name.
        #[arg(long)]
        provider: String,
        /// The Provider's namespace.
        #[arg(long)]
        namespace: String,
        #[command(flatten)]
        serve: ServeArgs,
        #[command(flatten)]
        election: ElectionArgs,
    },
    /// Import an image file into a storage pool of a Provider (what a libvirt import Job runs).
    ///
    /// The endpoint and TLS material are read from the Provider through the Kubernetes API,
    /// never from the command line.
    #[cfg(feature = "libvirt")]
    Import {
        /// The VMImage being imported.
        #[arg(long)]
        vmimage: String,
        /// The Provider whose host receives the image.
        #[arg(long)]
        provider: String,
        /// The Provider's namespace.
        #[arg(long)]
        provider_namespace: String,
        /// The storage pool on the host.
        #[arg(long)]
        pool: String,
        /// The raw image file.
        #[arg(long)]
        source: PathBuf,
        /// The volume the import Job was made for; the import refuses to write another.
        #[arg(long)]
        volume: Option<String>,
        /// The VMImage revision the import Job was made for; the import refuses another.
        #[arg(long)]
        revision: Option<String>,
        /// The directory the source must resolve inside.
        #[arg(long, default_value = "/artifacts")]
        artifacts_root: PathBuf,
    },
}

#[derive(Debug, Args)]
struct ControllerArgs {
    #[command(flatten)]
    serve: ServeArgs,
    #[command(flatten)]
    election: ElectionArgs,
    /// How long the members of a GuestReady pool may run without any of them publishing
    /// GuestReady before the pool reports ReadinessSignalAbsent.
    #[arg(
        long,
        default_value_t = 300,
        env = "BANLIEUE_READINESS_SIGNAL_GRACE_SECONDS"
    )]
    readiness_signal_grace_seconds: u64,
    /// How long a Provider may stay not Ready before pools replace their unclaimed members on
    /// it with members on other hosts.
    #[arg(
        long,
        default_value_t = 300,
        env = "BANLIEUE_PROVIDER_LOST_AFTER_SECONDS"
    )]
    provider_lost_after_seconds: u64,
}

/// Leader election on a Lease (ADR-0067): the controller's `banlieue-controller`, a provider's
/// named after its workload account (`banlieue-provider-<provider>`) in the Provider's namespace.
#[derive(Debug, Args)]
struct ElectionArgs {
    /// Take the Lease before acting, so that of several replicas (or a pod on a partitioned node
    /// and its replacement) one acts; exit with status 1 when it is lost. The controller's is
    /// `banlieue-controller` in the pod's namespace (POD_NAMESPACE, else the in-cluster
    /// namespace, else banlieue-system); a provider's is named after its workload account, in
    /// the Provider's namespace. The holder identity is POD_NAME, else the host name and pid.
    #[arg(long, num_args = 0..=1, default_value_t = true, default_missing_value = "true",
          action = clap::ArgAction::Set, value_name = "BOOL")]
    leader_elect: bool,
    /// Act without leader election: for a single replica, or a controller run in a test.
    #[arg(long, conflicts_with = "leader_elect")]
    no_leader_elect: bool,
    /// How long a replica's hold on the Lease lasts after its last renewal, as the others
    /// count it.
    #[arg(long, default_value_t = 15, value_name = "SECONDS")]
    leader_elect_lease_duration: u64,
    /// How long the leader keeps acting without a successful renewal; less than the lease
    /// duration.
    #[arg(long, default_value_t = 10, value_name = "SECONDS")]
    leader_elect_renew_deadline: u64,
    /// How often the leader renews and a standby tries to acquire.
    #[arg(long, default_value_t = 2, value_name = "SECONDS")]
    leader_elect_retry_period: u64,
}

impl ElectionArgs {
    /// The Lease `name` in `namespace` to take, or `None` without leader election.
    fn lease(&self, namespace: String, name: &str) -> Option<LeaseConfig> {
        if !self.leader_elect || self.no_leader_elect {
            return None;
        }
        Some(LeaseConfig {
            lease_duration: Duration::from_secs(self.leader_elect_lease_duration),
            renew_deadline: Duration::from_secs(self.leader_elect_renew_deadline),
            retry_period: Duration::from_secs(self.leader_elect_retry_period),
            ..LeaseConfig::new(namespace, name, leader::identity_from_environment())
        })
    }
}

#[derive(Debug, Args)]
struct ServeArgs {
    /// Address of the /metrics, /healthz and /readyz endpoint.
    #[arg(long, default_value = "0.0.0.0:8080", env = "BANLIEUE_METRICS_ADDRESS")]
    metrics_address: SocketAddr,
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Runs `future` on a multi-threaded runtime; the short-lived subcommands stay synchronous.
fn block_on<F>(future: F) -> Result<(), BoxError>
where
    F: Future<Output = Result<(), BoxError>>,
{
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(future)
}

/// Runs `roles` until SIGTERM or Ctrl-C, serving metrics and health meanwhile. With `lease`,
/// first waits to hold it, exits at once (status 1) if it is lost, and releases it once the
/// roles have stopped.
async fn serve(roles: Roles, args: ServeArgs, lease: Option<LeaseConfig>) -> Result<(), BoxError> {
    // Before anything can announce the process, so an early SIGTERM is a stop, not a miss.
    let stop = roles::stop_requested();
    let kube = kube::Client::try_default().await?;
    let leadership = match lease {
        Some(lease) => {
            let elector = LeaderElector::new(kube.clone(), lease)?;
            tokio::select! {
                leadership = elector.acquire() => Some(leadership),
                _ = stop.cancelled() => return Ok(()),
            }
        }
        None => None,
    };
    let lost = leadership.as_ref().map(leader::Leadership::lost);
    let lost = async move {
        match lost {
            Some(lost) => lost.await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(lost);
    let shutdown = CancellationToken::new();
    let mut registry = Registry::default();
    let tasks = roles::spawn_all(&kube, &mut registry, &shutdown, roles)?;
    let readiness = observe::Readiness::default();
    let address =
        observe::spawn_server(args.metrics_address, Arc::new(registry), readiness.clone()).await?;
    readiness.set(true);
    tracing::info!(%address, "serving /metrics, /healthz and /readyz");
    tokio::select! {
        _ = stop.cancelled() => shutdown.cancel(),
        _ = shutdown.cancelled() => {}
        _ = &mut lost => fence(),
    }
    readiness.set(false);
    // Still the leader while the roles drain, and still fenced if that ends meanwhile.
    tokio::select! {
        _ = roles::join_all(tasks) => {}
        _ = &mut lost => fence(),
    }
    if let Some(leadership) = leadership {
        leadership.release().await?;
    }
    if stop.is_cancelled() {
        Ok(())
    } else {
        Err("a role failed; see the log above".into())
    }
}

/// The Lease a provider workload holds while it acts: named after its workload account, which
/// its own Role grants it by name.
fn provider_lease_name(provider: &str) -> String {
    banlieue_provider_kit::workload_names::workload_name(provider)
}

/// Leadership was lost: another replica may take the Lease over once the lease duration has
/// passed since the last renewal, and this one must have stopped writing by then. Exiting at
/// once, with reconciles in flight, is the simplest stop that cannot be late (as
/// kube-controller-manager does); the Deployment restarts the pod as a standby.
fn fence() -> ! {
    tracing::error!("lost leadership; exiting");
    std::process::exit(1)
}

fn crds(out: Option<PathBuf>) -> Result<(), BoxError> {
    match out {
        None => print!(
            "{}",
            banlieue_api::render::crds_yaml_of(&banlieue::backends::crds())
        ),
        Some(dir) => {
            std::fs::create_dir_all(&dir)?;
            for (name, text) in banlieue_api::render::crd_files_of(&banlieue::backends::crds())? {
                let path = dir.join(name);
                std::fs::write(&path, text)?;
                println!("wrote {}", path.display());
            }
        }
    }
    Ok(())
}

fn manifests(deploy: PathBuf, check: bool) -> Result<(), BoxError> {
    let hand_written = banlieue::manifests::manifest_paths(&deploy);
    if hand_written.is_empty() {
        return Err(format!("{} holds no manifests", deploy.display()).into());
    }
    let wanted = banlieue::manifests::wanted(&hand_written, |path| {
        std::fs::read_to_string(deploy.join(path)).ok()
    })?;
    let mut stale = Vec::new();
    for file in wanted {
        let path = deploy.join(&file.path);
        if std::fs::read_to_string(&path).ok().as_ref() == Some(&file.text) {
            continue;
        }
        if check {
            stale.push(path.display().to_string());
            continue;
        }
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        std::fs::write(&path, file.text)?;
        println!("wrote {}", path.display());
    }
    if !stale.is_empty() {
        return Err(format!(
            "differ from the backends (run `banlieue manifests`): {}",
            stale.join(", ")
        )
        .into());
    }
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    observe::init_tracing(cli.log.log_format);
    let result = match cli.command {
        Command::Controller(args) => controller(args),
        Command::Provider(command) => provider(command),
        Command::Crds { out } => crds(out),
        Command::Claim(command) => block_on(async {
            banlieue::claim_cli::run(command)
                .await
                .map_err(BoxError::from)
        }),
        Command::Manifests { deploy, check } => manifests(deploy, check),
        Command::Bootstrap {
            image,
            without_admission,
        } => block_on(async {
            let client = kube::Client::try_default().await?;
            bootstrap::run(client, &image, !without_admission).await?;
            Ok(())
        }),
        #[cfg(feature = "libvirt")]
        Command::Libvirt(cmd) => libvirt::run(cmd).map_err(|e| e.to_string().into()),
        Command::Cidata(args) => return cidata::run(&args),
        Command::Login(args) => {
            login::run(&args).map_err(|e| banlieue_api::conditions::error_message(&e).into())
        }
        Command::Imagebuild(command) => imagebuild(command),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!(
                "error: {}",
                banlieue_api::conditions::error_message(e.as_ref())
            );
            ExitCode::FAILURE
        }
    }
}

/// `banlieue controller`.
fn controller(args: ControllerArgs) -> Result<(), BoxError> {
    block_on(serve(
        Roles {
            controller: true,
            operator: true,
            readiness_signal_grace: Some(Duration::from_secs(args.readiness_signal_grace_seconds)),
            provider_lost_after: Some(Duration::from_secs(args.provider_lost_after_seconds)),
            ..Roles::default()
        },
        args.serve,
        args.election.lease(
            leader::namespace_from_environment(),
            banlieue_controller::LEASE_NAME,
        ),
    ))
}

/// `banlieue provider …`.
fn provider(command: ProviderCommand) -> Result<(), BoxError> {
    let ProviderCommand { backend, action } = command;
    match action {
        ProviderAction::Run {
            provider,
            namespace,
            serve: args,
            election,
        } => {
            let backend =
                banlieue_provider_kit::descriptor::find(&banlieue::backends::all(), &backend)
                    .cloned()
                    .ok_or_else(|| format!("this build has no {backend} backend"))?;
            let lease = election.lease(namespace.clone(), &provider_lease_name(&provider));
            block_on(serve(
                Roles {
                    provider: Some(roles::ProviderRole {
                        backend,
                        name: provider,
                        namespace,
                    }),
                    ..Roles::default()
                },
                args,
                lease,
            ))
        }
        #[cfg(feature = "libvirt")]
        ProviderAction::Import {
            vmimage,
            provider,
            provider_namespace,
            pool,
            source,
            volume,
            revision,
            artifacts_root,
        } => {
            if backend != "libvirt" {
                return Err(format!(
                    "import is the libvirt provider's: banlieue provider libvirt import (not {backend})"
                )
                .into());
            }
            libvirt_import(banlieue_provider_libvirt::image::ImportArgs {
                vmimage,
                provider,
                provider_namespace,
                pool,
                source,
                volume,
                revision,
                artifacts_root,
            })
        }
    }
}

/// `banlieue provider libvirt import`.
#[cfg(feature = "libvirt")]
fn libvirt_import(args: banlieue_provider_libvirt::image::ImportArgs) -> Result<(), BoxError> {
    block_on(async {
        let kube = kube::Client::try_default().await?;
        use banlieue_provider_libvirt::image::{ImportOutcome, run_import};
        match run_import(kube, args).await? {
            ImportOutcome::AlreadyComplete { volume, .. } => {
                println!("volume {volume} is already complete in the pool; nothing to do")
            }
            ImportOutcome::Imported { volume, .. } => println!("imported volume {volume}"),
        }
        Ok(())
    })
}

/// `banlieue imagebuild …`.
fn imagebuild(command: ImagebuildCommand) -> Result<(), BoxError> {
    match command {
        ImagebuildCommand::Controller(args) => imagebuild_controller(args),
        ImagebuildCommand::Run {
            vmimage,
            namespace,
            credentials_namespace,
            reference,
            artifacts,
            claim_name,
            max_disk_bytes,
        } => imagebuild_run(banlieue_imagebuilder::build::BuildArgs {
            vmimage,
            namespace,
            credentials_namespace,
            reference,
            artifacts,
            claim_name: Some(claim_name),
            max_disk_bytes,
        }),
        ImagebuildCommand::Pcrs {
            image,
            loaders,
            write,
        } => {
            let scratch = tempfile::tempdir()?;
            let measured = banlieue::image_pcrs::measure(&image, &loaders, scratch.path())?;
            print!("{}", banlieue::image_pcrs::describe(&measured.prediction));
            if let Some(path) = write {
                std::fs::write(&path, &measured.references)
                    .map_err(|e| format!("writing {}: {e}", path.display()))?;
                eprintln!("wrote {}", path.display());
            }
            Ok(())
        }
    }
}

/// `banlieue imagebuild controller`.
fn imagebuild_controller(args: ImagebuildControllerArgs) -> Result<(), BoxError> {
    let mut config = banlieue_imagebuilder::reconcile::ReconcilerConfig {
        namespaces: args.namespaces,
        refresh: Duration::from_secs(args.refresh_seconds.max(1)),
        allowed_registries: args.allowed_registries,
        ..Default::default()
    };
    config.build.namespace = args.build_namespace;
    config.build.artifacts_claim = args.artifacts_claim;
    config.build.service_account = args.build_service_account;
    config.build.image = args.build_image;
    block_on(serve(
        Roles {
            imagebuilder: Some(config),
            ..Roles::default()
        },
        args.serve,
        None,
    ))
}

/// `banlieue imagebuild run`.
fn imagebuild_run(args: banlieue_imagebuilder::build::BuildArgs) -> Result<(), BoxError> {
    use banlieue_imagebuilder::build::{self, BuildOutcome};
    block_on(async {
        let kube = kube::Client::try_default().await?;
        match build::run(kube, args).await? {
            BuildOutcome::Built(r) => {
                println!("built {} bytes, sha256 {}", r.size_bytes, r.sha256)
            }
            BuildOutcome::Reused(r) => {
                println!(
                    "reused the artifact already built: {} bytes, sha256 {}",
                    r.size_bytes, r.sha256
                )
            }
            BuildOutcome::Superseded => {
                println!("the VMImage now names another digest; nothing published")
            }
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn election(args: &[&str]) -> Result<Option<LeaseConfig>, clap::Error> {
        let cli = Cli::try_parse_from(["banlieue", "controller"].iter().chain(args))?;
        match cli.command {
            Command::Controller(args) => Ok(args.election.lease(
                leader::namespace_from_environment(),
                banlieue_controller::LEASE_NAME,
            )),
            _ => unreachable!("parsed a controller command"),
        }
    }

    #[test]
    fn the_vsphere_provider_runs_one_provider() {
        let cli = Cli::try_parse_from([
            "banlieue",
            "provider",
            "vsphere",
            "run",
            "--provider",
            "vc-1",
            "--namespace",
            "ns",
        ])
        .unwrap();
        let Command::Provider(ProviderCommand {
            backend,
            action:
                ProviderAction::Run {
                    provider,
                    namespace,
                    ..
                },
        }) = cli.command
        else {
            panic!("not the vSphere provider: {:?}", cli.command);
        };
        assert_eq!(backend, "vsphere");
        assert_eq!((provider.as_str(), namespace.as_str()), ("vc-1", "ns"));
        assert!(
            Cli::try_parse_from(["banlieue", "provider", "vsphere", "run", "--provider", "x"])
                .is_err()
        );
    }

    #[test]
    fn the_controller_elects_a_leader_unless_told_not_to() {
        let lease = election(&[]).unwrap().expect("leader election by default");
        assert_eq!(lease.name, "banlieue-controller");
        assert_eq!(
            (
                lease.lease_duration,
                lease.renew_deadline,
                lease.retry_period
            ),
            (
                Duration::from_secs(15),
                Duration::from_secs(10),
                Duration::from_secs(2)
            )
        );
        assert!(election(&["--leader-elect"]).unwrap().is_some());
        assert!(election(&["--leader-elect=true"]).unwrap().is_some());
        assert!(election(&["--leader-elect=false"]).unwrap().is_none());
        assert!(election(&["--no-leader-elect"]).unwrap().is_none());
        assert!(election(&["--leader-elect", "--no-leader-elect"]).is_err());
        let short = election(&["--leader-elect-lease-duration", "6"])
            .unwrap()
            .unwrap();
        assert_eq!(short.lease_duration, Duration::from_secs(6));
    }

    /// Each provider holds its own Lease in its Provider's namespace, named as the Role the
    /// operator makes grants it (a pod on a partitioned node and its replacement never both act).
    #[test]
    fn a_provider_elects_on_its_own_lease_in_its_namespace() {
        for backend in ["libvirt", "vsphere"] {
            let parse = |extra: &[&str]| {
                let args = [
                    "banlieue",
                    "provider",
                    backend,
                    "run",
                    "--provider",
                    "edge-7",
                ]
                .into_iter()
                .chain(["--namespace", "team-a"])
                .chain(extra.iter().copied());
                let cli = Cli::try_parse_from(args).unwrap();
                match cli.command {
                    Command::Provider(ProviderCommand {
                        action:
                            ProviderAction::Run {
                                provider,
                                namespace,
                                election,
                                ..
                            },
                        ..
                    }) => election.lease(namespace, &provider_lease_name(&provider)),
                    other => panic!("not a provider run: {other:?}"),
                }
            };
            let lease = parse(&[]).expect("leader election by default");
            assert_eq!(
                (lease.namespace.as_str(), lease.name.as_str()),
                ("team-a", "banlieue-provider-edge-7")
            );
            let granted = banlieue_operator::workloads::own_lease_and_provider_rules("edge-7");
            assert!(
                granted.iter().any(|r| {
                    r.resources.as_deref() == Some(&["leases".to_owned()][..])
                        && r.resource_names.as_deref() == Some(&[lease.name.clone()][..])
                        && r.verbs.contains(&"update".to_owned())
                }),
                "{granted:?}"
            );
            assert!(parse(&["--no-leader-elect"]).is_none());
        }
    }
}

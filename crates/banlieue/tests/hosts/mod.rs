//! Several real libvirt hosts behind one control plane: each a private libvirtd on loopback
//! with the dev storage pool, an isolated network of its own and the dev image volume,
//! registered as its own Provider (credentials Secret, CA ConfigMap, Provider), whose workload
//! runs in this process as the ServiceAccount the operator made for it, as `banlieue dev up`
//! wires its one host.

use std::time::Duration;

use banlieue_api::conditions::{self, status, types};
use banlieue_api::names::SYSTEM_NAMESPACE;
use banlieue_api::{KeySelector, LocalObjectReference, Provider};
use banlieue_dev::{self as dev, objects};
use banlieue_provider_libvirt::domain_xml::DomainType;
use banlieue_testenv::control_plane::ControlPlane;
use banlieue_testenv::libvirtd::{Libvirtd, LibvirtdOptions};
use banlieue_testenv::poll;
use kube::Client;
use kube::api::Api;
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The controller's ServiceAccount, from deploy/controller.yaml.
const CONTROLLER_SERVICE_ACCOUNT: &str = "banlieue-controller";

/// One libvirt host and the Provider registered for it.
pub struct Host {
    /// The Provider's name.
    pub provider: String,
    pub libvirtd: Libvirtd,
}

/// Starts three libvirtd instances at once, each with its own state.
pub async fn start_three_daemons() -> Result<Vec<Libvirtd>, BoxError> {
    let start = || async {
        Libvirtd::start(LibvirtdOptions::default())
            .await
            .map_err(|e| BoxError::from(banlieue_testenv::control_plane::error_chain(&e)))
    };
    let (a, b, c) = tokio::try_join!(start(), start(), start())?;
    Ok(vec![a, b, c])
}

/// Gives each daemon the dev storage pool (with the dev image volume, the BackingFile source
/// of [`objects::image`]) and an isolated network on a bridge of its own, and registers it as
/// the Provider `host-<i>` of the dev ProviderClass.
pub async fn register(admin: &Client, daemons: Vec<Libvirtd>) -> Result<Vec<Host>, BoxError> {
    dev::apply(admin, &objects::provider_class("banlieue:dev")).await?;
    let mut hosts = Vec::new();
    for (i, libvirtd) in daemons.into_iter().enumerate() {
        // Bridges are the machine's, not the daemon's: the names must differ (15 bytes at most).
        let bridge = format!("bnm{}x{i}", std::process::id() % 1_000_000);
        dev::prepare_libvirt(&libvirtd, &bridge).await?;
        let provider = format!("host-{i}");
        let secret = format!("{provider}-creds");
        let ca = format!("{provider}-ca");
        let mut creds = objects::credentials_secret(
            &std::fs::read(libvirtd.client_cert_path())?,
            &std::fs::read(libvirtd.client_key_path())?,
        );
        creds.metadata.name = Some(secret.clone());
        dev::apply(admin, &creds).await?;
        let mut bundle = objects::ca_configmap(&std::fs::read_to_string(libvirtd.ca_cert_path())?);
        bundle.metadata.name = Some(ca.clone());
        dev::apply(admin, &bundle).await?;
        let mut object = objects::provider(&libvirtd.tls_uri());
        object.metadata.name = Some(provider.clone());
        object.spec.connection.credentials_ref = LocalObjectReference::new(&secret);
        object.spec.connection.ca_bundle.config_map_ref = Some(KeySelector {
            name: ca,
            key: "ca.crt".into(),
        });
        // No vTPM guests here, and so no EK trust bundle to name.
        object.spec.capabilities.features.clear();
        object.spec.attestation = None;
        dev::apply(admin, &object).await?;
        hosts.push(Host { provider, libvirtd });
    }
    Ok(hosts)
}

/// Runs the controller (with `provider_lost_after`) and the Provider operator in this process
/// as the controller's ServiceAccount, then each host's workload as its own ServiceAccount,
/// all under the shipped RBAC.
pub async fn spawn_roles(
    control_plane: &ControlPlane,
    hosts: &[Host],
    provider_lost_after: Duration,
    deadline: Duration,
    shutdown: &CancellationToken,
) -> Result<Vec<tokio::task::JoinHandle<()>>, BoxError> {
    let controller = control_plane
        .client_as_service_account(SYSTEM_NAMESPACE, CONTROLLER_SERVICE_ACCOUNT)
        .await?;
    let mut workers = banlieue::roles::spawn_all(
        &controller,
        &mut Registry::default(),
        shutdown,
        banlieue::roles::Roles {
            controller: true,
            operator: true,
            provider_lost_after: Some(provider_lost_after),
            ..banlieue::roles::Roles::default()
        },
    )?;
    for host in hosts {
        // A registry each: the three workloads register the same metric names.
        workers.extend(
            dev::spawn_provider_workload(
                control_plane,
                &host.provider,
                Some(DomainType::Qemu),
                deadline,
                &mut Registry::default(),
                shutdown,
            )
            .await?,
        );
    }
    Ok(workers)
}

/// The Provider's Ready condition status (`True`, `False`, or empty before any).
pub fn ready_status(provider: &Provider) -> String {
    provider
        .status
        .as_ref()
        .and_then(|s| conditions::find(&s.conditions, types::READY))
        .map(|c| c.status.clone())
        .unwrap_or_default()
}

/// Waits until every host's Provider is Ready with a measured capacity.
pub async fn wait_ready(
    admin: &Client,
    hosts: &[Host],
    deadline: Duration,
) -> Result<(), BoxError> {
    let providers: Api<Provider> = Api::namespaced(admin.clone(), SYSTEM_NAMESPACE);
    for host in hosts {
        poll::until(
            &format!("Provider {} to be Ready", host.provider),
            deadline,
            || async {
                let p = providers.get(&host.provider).await?;
                let measured = p
                    .status
                    .as_ref()
                    .is_some_and(|s| s.failure_domains.iter().any(|d| d.capacity.is_some()));
                Ok((ready_status(&p) == status::TRUE && measured).then_some(()))
            },
        )
        .await?;
    }
    Ok(())
}

/// Stops each host's dev network, whose bridge would otherwise outlive its daemon.
pub async fn release(hosts: &[Host]) -> Result<(), BoxError> {
    for host in hosts {
        if host.libvirtd.is_running() {
            dev::release_host(&host.libvirtd).await?;
        }
    }
    Ok(())
}

/// The names of the domains (running or not) the daemon knows, through `virsh`: a client
/// independent of banlieue's.
pub async fn domains(libvirtd: &Libvirtd) -> Result<Vec<String>, BoxError> {
    let listed = libvirtd.virsh(["list", "--all", "--name"]).await?;
    Ok(listed
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect())
}

/// The names of the running domains, through `virsh`.
pub async fn running_domains(libvirtd: &Libvirtd) -> Result<Vec<String>, BoxError> {
    let listed = libvirtd
        .virsh(["list", "--state-running", "--name"])
        .await?;
    Ok(listed
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect())
}

//! A Provider's readiness, published by the Provider's own workload: connect with its
//! credentials, narrow the declared capabilities to what the host has (ADR-0039) and publish one
//! failure domain. It runs here, beside the machines, because only this workload may read the
//! credentials Secret: the controller process never reads a Secret and never talks to libvirt
//! (ADR-0063).

pub mod narrow;

use std::future::Future;
use std::time::Duration;

use banlieue_api::{DomainCapacity, Provider};
use banlieue_libvirt::flags::{ConnectListAllNetworksFlags, ConnectListAllStoragePoolsFlags};
use banlieue_libvirt::{Client, Network, StoragePool};
use banlieue_provider_kit::error::Core;
use banlieue_provider_kit::provider_status::{self, LoopSettings, Probe, Reached};

use crate::connection;
use crate::error::{Error, Result};
use narrow::HostInventory;

/// The field manager and Event reporter of the workload's status writes.
pub const FIELD_MANAGER: &str = "banlieue-provider-libvirt";

/// Settings of the status loop of one Provider's workload.
#[derive(Clone, Debug)]
pub struct StatusConfig {
    pub provider: String,
    pub namespace: String,
    /// How often the host is probed again when nothing changed.
    pub probe_interval: Duration,
    /// Deadline of each libvirt call of a probe.
    pub call_timeout: Duration,
}

impl StatusConfig {
    pub fn new(provider: impl Into<String>, namespace: impl Into<String>) -> StatusConfig {
        StatusConfig {
            provider: provider.into(),
            namespace: namespace.into(),
            probe_interval: Duration::from_secs(60),
            call_timeout: Duration::from_secs(30),
        }
    }
}

/// Probes the Provider's host and publishes its Ready condition and failure domain until
/// `shutdown` completes (the kit's status loop around [`HostProbe`]).
pub async fn run_status(
    client: kube::Client,
    cfg: StatusConfig,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) -> Result<()> {
    let settings = LoopSettings {
        provider: cfg.provider.clone(),
        namespace: cfg.namespace.clone(),
        probe_interval: cfg.probe_interval,
        reporter: FIELD_MANAGER,
    };
    provider_status::run(HostProbe { cfg }, client, settings, shutdown).await;
    Ok(())
}

/// What the libvirt status loop probes: the host's name, pools, networks and size.
struct HostProbe {
    cfg: StatusConfig,
}

impl Probe for HostProbe {
    type Error = Error;

    async fn probe(&self, kube: &kube::Client, provider: &Provider) -> Result<Reached> {
        let narrowed = probe_host(kube, provider, &self.cfg).await?;
        Ok(Reached {
            ready: narrow::ready_condition(&narrowed, provider.metadata.generation),
            failure_domains: vec![narrowed.failure_domain],
        })
    }

    fn reason(error: &Error) -> &'static str {
        error.reason()
    }

    fn spec_error(error: &Error) -> bool {
        matches!(error, Error::Core(Core::UnsupportedScheme(_)))
    }

    fn patch_failed(error: kube::Error) -> Error {
        Error::kube("patch Provider status")(error)
    }
}

/// Connects with the Provider's credentials and narrows its declaration.
async fn probe_host(
    kube: &kube::Client,
    provider: &Provider,
    cfg: &StatusConfig,
) -> Result<narrow::Narrowed> {
    let endpoint = &provider.spec.connection.endpoint;
    connection::check_endpoint(endpoint)?;
    let creds = connection::load(kube, provider).await?;
    let client = connection::connect(
        endpoint,
        &creds,
        connection::client_options(cfg.call_timeout),
    )
    .await?;
    let inventory = inventory(&client).await;
    let _ = client.close().await;
    Ok(narrow::narrow(&provider.spec.capabilities, &inventory?))
}

async fn inventory(client: &Client) -> Result<HostInventory> {
    let hostname = client
        .hostname()
        .await
        .map_err(Error::libvirt("read the host name"))?;
    let pools = StoragePool::list_all(client, ConnectListAllStoragePoolsFlags::empty())
        .await
        .map_err(Error::libvirt("list storage pools"))?
        .iter()
        .map(|p| p.name().to_owned())
        .collect();
    let networks = Network::list_all(client, ConnectListAllNetworksFlags::empty())
        .await
        .map_err(Error::libvirt("list networks"))?
        .iter()
        .map(|n| n.name().to_owned())
        .collect();
    let node = client
        .node_info()
        .await
        .map_err(Error::libvirt("read the host's memory and CPUs"))?;
    Ok(HostInventory {
        hostname,
        pools,
        networks,
        capacity: Some(DomainCapacity {
            memory_bytes: node.memory_kib.saturating_mul(1024),
            cpus: node.cpus,
        }),
    })
}

//! A vSphere Provider's readiness, published by its own workload: log in with its
//! credentials, narrow the declared datacenters and clusters to what vCenter has (ADR-0039,
//! ADR-0069) and publish one failure domain per cluster found. Only this workload reads the
//! credentials Secret (ADR-0063).

use std::future::Future;
use std::time::Duration;

use banlieue_api::{DomainCapacity, Provider};
use banlieue_provider_kit::error::Core;
use banlieue_provider_kit::provider_status::{self, LoopSettings, Probe, Reached};
use banlieue_vsphere::{Client, PropertyValue};

use crate::connection;
use crate::error::{Error, Result};
use crate::narrow::{self, DatacenterInventory, Inventory, Narrowed};

/// The field manager and Event reporter of the workload's status writes.
pub const FIELD_MANAGER: &str = "banlieue-provider-vsphere";

/// Settings of the status loop of one Provider's workload.
#[derive(Clone, Debug)]
pub struct StatusConfig {
    pub provider: String,
    pub namespace: String,
    /// How often vCenter is probed again when nothing changed.
    pub probe_interval: Duration,
    /// Deadline of a whole probe once logged in.
    pub probe_timeout: Duration,
}

impl StatusConfig {
    /// Defaults: a probe every 60 s, each bounded to 60 s.
    pub fn new(provider: impl Into<String>, namespace: impl Into<String>) -> StatusConfig {
        StatusConfig {
            provider: provider.into(),
            namespace: namespace.into(),
            probe_interval: Duration::from_secs(60),
            probe_timeout: Duration::from_secs(60),
        }
    }
}

/// Probes the Provider's vCenter and publishes its Ready condition and failure domains until
/// `shutdown` completes (the kit's status loop around [`VCenterProbe`]).
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
    provider_status::run(VCenterProbe { cfg }, client, settings, shutdown).await;
    Ok(())
}

/// What the vSphere status loop probes: the datacenters, clusters, datastores and networks.
struct VCenterProbe {
    cfg: StatusConfig,
}

impl Probe for VCenterProbe {
    type Error = Error;

    async fn probe(&self, kube: &kube::Client, provider: &Provider) -> Result<Reached> {
        let narrowed = probe(kube, provider, &self.cfg).await?;
        let endpoint = &provider.spec.connection.endpoint;
        Ok(Reached {
            ready: narrow::ready_condition(&narrowed, endpoint, provider.metadata.generation),
            failure_domains: narrowed.failure_domains,
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

/// Logs in with the Provider's credentials, reads the inventory and narrows the declaration.
async fn probe(kube: &kube::Client, provider: &Provider, cfg: &StatusConfig) -> Result<Narrowed> {
    let endpoint = &provider.spec.connection.endpoint;
    connection::check_endpoint(endpoint)?;
    let creds = connection::load(kube, provider).await?;
    let client = connection::connect(endpoint, &creds).await?;
    let found = match tokio::time::timeout(cfg.probe_timeout, inventory(&client)).await {
        Ok(found) => found,
        Err(_) => Err(Error::TaskTimeout {
            what: "read the vCenter inventory".into(),
            after: cfg.probe_timeout,
        }),
    };
    // A session left open would idle out on the server; failing to end it changes nothing.
    let _ = tokio::time::timeout(Duration::from_secs(5), client.logout()).await;
    Ok(narrow::narrow(&provider.spec.capabilities, &found?))
}

/// Every datacenter with its clusters, datastores and networks, by name.
pub async fn inventory(client: &Client) -> Result<Inventory> {
    let mut found = Inventory::new();
    let datacenters = client
        .datacenters()
        .await
        .map_err(Error::vsphere("list the datacenters"))?;
    for dc in datacenters {
        let listed = client
            .clusters(&dc.moref)
            .await
            .map_err(Error::vsphere(format!("list the clusters of {}", dc.name)))?;
        let capacities = listed
            .iter()
            .filter_map(|c| {
                let capacity = DomainCapacity {
                    memory_bytes: c.total_memory_bytes?,
                    cpus: c.cpu_threads.unwrap_or(0),
                };
                Some((c.name.clone(), capacity))
            })
            .collect();
        let clusters = listed.into_iter().map(|c| c.name).collect();
        let names = |kind: &'static str| {
            let client = client.clone();
            let moref = dc.moref.clone();
            let dc_name = dc.name.clone();
            async move {
                let objects = client
                    .objects_of(&moref, kind, &["name"])
                    .await
                    .map_err(Error::vsphere(format!("list the {kind}s of {dc_name}")))?;
                Ok::<_, Error>(
                    objects
                        .iter()
                        .filter_map(|o| o.get("name").and_then(PropertyValue::text))
                        .map(str::to_owned)
                        .collect(),
                )
            }
        };
        let datastores = names("Datastore").await?;
        let networks = names("Network").await?;
        found.insert(
            dc.name,
            DatacenterInventory {
                clusters,
                capacities,
                datastores,
                networks,
            },
        );
    }
    Ok(found)
}

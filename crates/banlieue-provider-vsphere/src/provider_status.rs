//! A vSphere Provider's readiness, published by its own workload: log in with its
//! credentials, narrow the declared datacenters and clusters to what vCenter has (ADR-0039,
//! ADR-0069) and publish one failure domain per cluster found. Only this workload reads the
//! credentials Secret (ADR-0063).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use banlieue_api::conditions::{self, Condition, error_message, status, types};
use banlieue_api::{DomainCapacity, FailureDomain, Provider};
use banlieue_provider_kit::ErrorBackoff;
use banlieue_vsphere::{Client, PropertyValue};
use futures::StreamExt;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::watcher;

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

struct Context {
    kube: kube::Client,
    api: Api<Provider>,
    cfg: StatusConfig,
    recorder: Recorder,
    backoff: ErrorBackoff,
}

/// This loop's name in its backoff keys.
const BACKOFF_KEY: &str = "status";

/// Probes the Provider's vCenter and publishes its Ready condition and failure domains until
/// `shutdown` completes. It watches only its own Provider, by name.
pub async fn run_status(
    client: kube::Client,
    cfg: StatusConfig,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) -> Result<()> {
    let api: Api<Provider> = Api::namespaced(client.clone(), &cfg.namespace);
    let watch = watcher::Config::default().fields(&format!("metadata.name={}", cfg.provider));
    let ctx = Arc::new(Context {
        kube: client.clone(),
        api: api.clone(),
        recorder: Recorder::new(
            client,
            Reporter {
                controller: FIELD_MANAGER.into(),
                instance: None,
            },
        ),
        cfg,
        backoff: banlieue_provider_kit::error_backoff(),
    });
    Controller::new(api, watch)
        .graceful_shutdown_on(shutdown)
        .run(
            |provider, ctx| async move {
                let key = ErrorBackoff::key_of(BACKOFF_KEY, provider.as_ref());
                ctx.backoff
                    .track(&key, reconcile(provider, ctx.clone()).await)
            },
            error_policy,
            ctx,
        )
        .for_each(|result| async move {
            if let Err(e) = result {
                tracing::debug!(error = %error_message(&e), "provider status");
            }
        })
        .await;
    Ok(())
}

fn error_policy(provider: Arc<Provider>, error: &Error, ctx: Arc<Context>) -> Action {
    let delay = ctx
        .backoff
        .failed(&ErrorBackoff::key_of(BACKOFF_KEY, provider.as_ref()));
    tracing::warn!(error = %error_message(error), retry_in = ?delay, "provider status failed");
    Action::requeue(delay)
}

#[tracing::instrument(skip_all, fields(provider = %provider.name_any()))]
async fn reconcile(provider: Arc<Provider>, ctx: Arc<Context>) -> Result<Action> {
    // A Provider being deleted is the operator's to report on; machines keep being torn down.
    if provider.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let outcome = probe(&ctx.kube, &provider, &ctx.cfg).await;
    let generation = provider.metadata.generation;
    let endpoint = &provider.spec.connection.endpoint;
    let (ready, failure_domains) = decide(&outcome, endpoint, generation);
    banlieue_provider_kit::provider_status::publish(
        &ctx.api,
        &ctx.recorder,
        &provider,
        ready,
        failure_domains,
    )
    .await
    .map_err(Error::kube("patch Provider status"))?;
    Ok(match outcome {
        // The spec's fault: nothing changes until the spec does.
        Err(Error::UnsupportedScheme(_)) => Action::await_change(),
        _ => Action::requeue(ctx.cfg.probe_interval),
    })
}

/// The Ready condition and failure domains a probe's outcome publishes. A vCenter that was
/// not reached publishes no failure domain.
pub fn decide(
    outcome: &Result<Narrowed>,
    endpoint: &str,
    generation: Option<i64>,
) -> (Condition, Vec<FailureDomain>) {
    match outcome {
        Ok(narrowed) => (
            narrow::ready_condition(narrowed, endpoint, generation),
            narrowed.failure_domains.clone(),
        ),
        Err(e) => (
            conditions::new(
                types::READY,
                status::FALSE,
                e.reason(),
                error_message(e),
                generation,
            ),
            Vec::new(),
        ),
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

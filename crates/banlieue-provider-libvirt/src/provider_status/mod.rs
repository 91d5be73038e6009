//! A Provider's readiness, published by the Provider's own workload: connect with its
//! credentials, narrow the declared capabilities to what the host has (ADR-0039) and publish one
//! failure domain. It runs here, beside the machines, because only this workload may read the
//! credentials Secret: the controller process never reads a Secret and never talks to libvirt
//! (ADR-0063).

pub mod narrow;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use banlieue_api::conditions::{self, Condition, error_message, status, types};
use banlieue_api::{DomainCapacity, FailureDomain, Provider};
use banlieue_libvirt::flags::{ConnectListAllNetworksFlags, ConnectListAllStoragePoolsFlags};
use banlieue_libvirt::{Client, Network, StoragePool};
use banlieue_runtime::reconcile::ErrorBackoff;
use futures::StreamExt;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::watcher;

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

struct Context {
    kube: kube::Client,
    api: Api<Provider>,
    cfg: StatusConfig,
    recorder: Recorder,
    backoff: ErrorBackoff,
}

/// Probes the Provider's host and publishes its Ready condition and failure domain until
/// `shutdown` completes. It watches only its own Provider (by name), which is all its Role
/// allows it to read.
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
                let key = ErrorBackoff::key_of("status", provider.as_ref());
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
        .failed(&ErrorBackoff::key_of("status", provider.as_ref()));
    tracing::warn!(error = %error_message(error), ?delay, "provider status failed");
    Action::requeue(delay)
}

#[tracing::instrument(skip_all, fields(provider = %provider.name_any()))]
async fn reconcile(provider: Arc<Provider>, ctx: Arc<Context>) -> Result<Action> {
    // A Provider being deleted is the operator's to report on (MachinesRemain); the machines
    // keep being torn down meanwhile.
    if provider.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let outcome = probe_host(&ctx.kube, &provider, &ctx.cfg).await;
    let generation = provider.metadata.generation;
    let (ready, failure_domains) = decide(&outcome, generation);
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
        // A scheme error is the spec's fault: nothing changes until the spec does.
        Err(Error::UnsupportedScheme(_)) => Action::await_change(),
        _ => Action::requeue(ctx.cfg.probe_interval),
    })
}

/// The Ready condition and failure domains a probe's outcome publishes. A host that was not
/// reached publishes no failure domain: a Provider never advertises a host it cannot reach.
pub fn decide(
    outcome: &Result<narrow::Narrowed>,
    generation: Option<i64>,
) -> (Condition, Vec<FailureDomain>) {
    match outcome {
        Ok(narrowed) => (
            narrow::ready_condition(narrowed, generation),
            vec![narrowed.failure_domain.clone()],
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

//! The per-Provider VMImage reconcile (observe → decide → act): for each VMImage in the
//! Provider's namespace with a source for the Provider's class, one import Job per storage pool
//! (Url) or a presence check (BackingFile), mirrored into this provider's entry of
//! `status.perProvider[]`.
//!
//! Status is written read-modify-write with the object's resourceVersion in the merge patch:
//! other providers write their own entries of the same list, and a conflict (409) means
//! "read again and re-merge", never "overwrite".

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use banlieue_api::artifacts::Sharing;
use banlieue_api::names::{LABEL_PROVIDER, LABEL_VMIMAGE};
use banlieue_api::{ImageSourceKind, Provider, ProviderClass, VMImage, ZoneImageStatus, ZonePhase};
use banlieue_libvirt::StoragePool;
use banlieue_provider_kit::backoff::Backoff;
use banlieue_provider_kit::image_zones::{self, ZonesError};
use banlieue_runtime::artifacts;
use banlieue_runtime::reconcile::ErrorBackoff;
use futures::StreamExt;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::api::PostParams;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Api, ResourceExt};
use prometheus_client::metrics::gauge::Gauge;
use tracing::{debug, info, warn};

use super::decide::{self, ArtifactState, ImportSettings, Presence};
use super::error::{Error, Result, api_status};
use crate::machine::host::{Host, HostConnector};

use banlieue_api::conditions::error_message;

/// Which Provider this reconcile serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageReconcilerConfig {
    /// The Provider's name.
    pub provider: String,
    /// The Provider's namespace, which is also where its VMImages are.
    pub namespace: String,
    /// How often an image is looked at again without a change (BackingFile volumes and Job
    /// progress are not all watchable).
    pub resync: Duration,
}

impl ImageReconcilerConfig {
    pub fn new(provider: impl Into<String>, namespace: impl Into<String>) -> Self {
        ImageReconcilerConfig {
            provider: provider.into(),
            namespace: namespace.into(),
            resync: Duration::from_secs(60),
        }
    }
}

/// Deadline of each libvirt call of a BackingFile check.
const LIBVIRT_CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// The result of creating-or-adopting one import Job.
#[derive(Debug)]
enum JobState {
    Present(Box<Job>),
    /// 403 on jobs in the build namespace.
    Forbidden,
}

/// One reconcile of images for one Provider. Holds a libvirt connection for BackingFile
/// checks, opened on first use and reopened when it dies.
pub struct ImageReconciler {
    client: kube::Client,
    cfg: ImageReconcilerConfig,
    /// The session type the machine reconcile uses, but a session of its own: the workload
    /// starts this reconciler and the machine reconcile separately (`backend::tasks`), each from
    /// a kube client and its settings, so there is no one session to hand to both yet.
    host: Host,
    backoff: ErrorBackoff,
}

impl std::fmt::Debug for ImageReconciler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ImageReconciler")
            .field("cfg", &self.cfg)
            .finish_non_exhaustive()
    }
}

impl ImageReconciler {
    pub fn new(client: kube::Client, cfg: ImageReconcilerConfig) -> Self {
        let host = Host::new(HostConnector::new(
            client.clone(),
            &cfg.namespace,
            &cfg.provider,
            None,
            LIBVIRT_CALL_TIMEOUT,
            // Not the workload's `host_connected`, which counts the machine reconcile's session.
            Gauge::default(),
        ));
        ImageReconciler {
            client,
            cfg,
            host,
            backoff: banlieue_provider_kit::error_backoff(),
        }
    }

    /// Reconciles one image: returns this provider's zones as written to its status, or
    /// `None` when the image has no source for this provider's class (nothing is written).
    pub async fn reconcile(&self, image: &VMImage) -> Result<Option<Vec<ZoneImageStatus>>> {
        let image_name = image.name_any();
        let provider = self.provider().await?;
        let class_name = provider.spec.provider_class_ref.name.clone();
        let Some(source) = decide::source_for_class(image, &class_name) else {
            return Ok(None);
        };
        let pools = decide::storage_pools(&provider);
        if pools.is_empty() {
            return Err(Error::NoFailureDomain(self.cfg.provider.clone()));
        }
        let revision = decide::revision(image);
        let zones = match source.kind {
            ImageSourceKind::Url => {
                let classes: Api<ProviderClass> = Api::all(self.client.clone());
                let class = classes
                    .get(&class_name)
                    .await
                    .map_err(|e| Error::kube(format!("providerclass {class_name}"), e))?;
                let artifact = image
                    .status
                    .as_ref()
                    .and_then(|s| s.build_artifact.as_ref());
                match decide::artifact_state(artifact) {
                    ArtifactState::Pending(why) => pools
                        .iter()
                        .map(|pool| decide::zone_build_pending(pool, &why))
                        .collect(),
                    ArtifactState::Ready(artifact) => {
                        let volume = decide::url_volume_name(image);
                        let namespace = image.namespace().unwrap_or_default();
                        let request = |pool| decide::ImportRequest {
                            image: &image_name,
                            image_namespace: &namespace,
                            revision: &revision,
                            volume: &volume,
                            pool,
                            artifact: &artifact,
                        };
                        let requests: Vec<_> = pools.iter().map(|p| request(p.as_str())).collect();
                        self.import_zones(&provider, &class, &requests).await?
                    }
                }
            }
            ImageSourceKind::BackingFile => {
                let volume = source.volume.clone().unwrap_or_default();
                let refusal = decide::backing_file_refusal(
                    &volume,
                    &provider.name_any(),
                    &provider.spec.capabilities.backing_file_volumes,
                );
                let mut zones = Vec::with_capacity(pools.len());
                for pool in &pools {
                    let presence = match &refusal {
                        Some(why) => Presence::Refused(why.message().to_owned()),
                        None => self.backing_file_presence(pool, &volume).await,
                    };
                    zones.push(decide::zone_backing_file(pool, &volume, &presence));
                }
                zones
            }
            // A vSphere template: nothing a libvirt pool can hold.
            ImageSourceKind::Template => pools
                .iter()
                .map(|pool| decide::zone_wrong_kind(pool, &class_name))
                .collect(),
        };
        self.write_status(&image_name, zones.clone(), &revision)
            .await?;
        Ok(Some(zones))
    }

    async fn provider(&self) -> Result<Provider> {
        let providers: Api<Provider> = Api::namespaced(self.client.clone(), &self.cfg.namespace);
        providers.get(&self.cfg.provider).await.map_err(|e| {
            Error::kube(
                format!("provider {}/{}", self.cfg.namespace, self.cfg.provider),
                e,
            )
        })
    }

    /// Creates or adopts each pool's Job and mirrors it into a zone.
    async fn import_zones(
        &self,
        provider: &Provider,
        class: &ProviderClass,
        requests: &[decide::ImportRequest<'_>],
    ) -> Result<Vec<ZoneImageStatus>> {
        let settings = ImportSettings::of(class);
        let account = settings.account_for(&self.cfg.namespace, &self.cfg.provider);
        let class_name = class.name_any();
        let jobs: Api<Job> = Api::namespaced(self.client.clone(), &settings.namespace);
        let mut zones = Vec::with_capacity(requests.len());
        let sharing = if requests.is_empty() {
            Sharing::OneNode
        } else {
            artifacts::sharing(&self.client, &settings.namespace, &settings.artifacts_claim).await
        };
        for request in requests {
            let (pool, volume) = (request.pool, request.volume);
            let desired = decide::import_job(request, provider, class, sharing);
            let zone = match ensure_job(&jobs, &desired).await? {
                JobState::Present(job) => decide::zone_from_job(pool, volume, &job),
                JobState::Forbidden => {
                    decide::zone_jobs_forbidden(pool, volume, &settings.namespace, &class_name)
                }
            };
            zones.push(zone);
        }
        if zones.iter().any(|z| z.phase == ZonePhase::Importing)
            && self.service_account_missing(&settings, &account).await
        {
            let sa = account.clone();
            zones = zones
                .into_iter()
                .map(|z| {
                    decide::with_missing_service_account(z, &settings.namespace, &sa, &class_name)
                })
                .collect();
        }
        Ok(zones)
    }

    /// Whether the Jobs' ServiceAccount is known to be absent. Any other answer (403
    /// included: the provider need not be allowed to read ServiceAccounts) is not evidence.
    async fn service_account_missing(&self, settings: &ImportSettings, account: &str) -> bool {
        let accounts: Api<ServiceAccount> =
            Api::namespaced(self.client.clone(), &settings.namespace);
        match accounts.get(account).await {
            Err(e) if api_status(&e) == Some(404) => true,
            Err(e) => {
                debug!(error = %e, "cannot tell whether the import ServiceAccount exists");
                false
            }
            Ok(_) => false,
        }
    }

    async fn backing_file_presence(&self, pool: &str, name: &str) -> Presence {
        let client = match self.host.connection().await {
            Ok(session) => session.client,
            Err(e) => {
                return Presence::Unknown(format!("cannot reach the host: {}", error_message(&e)));
            }
        };
        let pool_handle = match StoragePool::lookup_by_name(&client, pool).await {
            Ok(Some(p)) => p,
            Ok(None) => return Presence::Unknown(format!("storage pool {pool} does not exist")),
            Err(e) => {
                let e = Error::libvirt(format!("look up storage pool {pool}"), e);
                return Presence::Unknown(error_message(&e));
            }
        };
        match super::import::lookup_volume(&pool_handle, name).await {
            Ok(Some(_)) => Presence::Present,
            Ok(None) => Presence::Absent,
            Err(e) => Presence::Unknown(error_message(&e)),
        }
    }

    /// Replaces this provider's entry of `status.perProvider[]` (the kit's compare-and-swap,
    /// retried on conflict).
    async fn write_status(
        &self,
        image: &str,
        zones: Vec<ZoneImageStatus>,
        revision: &str,
    ) -> Result<()> {
        let images: Api<VMImage> = Api::namespaced(self.client.clone(), &self.cfg.namespace);
        image_zones::publish(&images, image, &self.cfg.provider, zones, |_| {
            revision.to_owned()
        })
        .await
        .map_err(|e| match e {
            ZonesError::Kube { what, source } => Error::kube(what, source),
            ZonesError::Conflicts { image } => Error::StatusConflict(image),
        })
    }
}

/// Gets the Job by its deterministic name, creating it only when absent: a Job that exists is
/// adopted whatever its state, so a re-reconcile never starts a second transfer.
async fn ensure_job(jobs: &Api<Job>, desired: &Job) -> Result<JobState> {
    let name = desired.metadata.name.clone().unwrap_or_default();
    match jobs.get(&name).await {
        Ok(job) => return Ok(JobState::Present(Box::new(job))),
        Err(e) if api_status(&e) == Some(403) => return Ok(JobState::Forbidden),
        Err(e) if api_status(&e) == Some(404) => {}
        Err(e) => return Err(Error::kube(format!("job {name}"), e)),
    }
    match jobs.create(&PostParams::default(), desired).await {
        Ok(job) => {
            info!(job = %name, "created import Job");
            Ok(JobState::Present(Box::new(job)))
        }
        Err(e) if api_status(&e) == Some(403) => Ok(JobState::Forbidden),
        // Created between our get and create: adopt it.
        Err(e) if api_status(&e) == Some(409) => jobs
            .get(&name)
            .await
            .map(|job| JobState::Present(Box::new(job)))
            .map_err(|e| Error::kube(format!("job {name}"), e)),
        Err(e) => Err(Error::kube(format!("create job {name}"), e)),
    }
}

/// The build namespace of the Provider's class, where its import Jobs run.
async fn build_namespace(reconciler: &ImageReconciler, client: &kube::Client) -> Result<String> {
    let provider = reconciler.provider().await?;
    let class_name = provider.spec.provider_class_ref.name.clone();
    let classes: Api<ProviderClass> = Api::all(client.clone());
    match classes.get(&class_name).await {
        Ok(class) => Ok(ImportSettings::of(&class).namespace),
        Err(e) => Err(Error::kube(format!("providerclass {class_name}"), e)),
    }
}

/// Runs the image reconcile of one Provider until `shutdown` resolves. Watches the Provider's
/// VMImages, its import Jobs in the build namespace (label `banlieue.io/provider`), and the
/// Provider itself (new pools re-reconcile every image).
pub async fn run_image_reconciler(
    client: kube::Client,
    cfg: ImageReconcilerConfig,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) -> Result<()> {
    let reconciler = Arc::new(ImageReconciler::new(client.clone(), cfg.clone()));
    let shutdown = futures::FutureExt::shared(Box::pin(shutdown));
    // A new workload may start before the API server's authorizer has seen its grants, or
    // while its Provider is briefly unreadable: wait and retry rather than fail the process.
    // Starts shorter than the kit's error backoff: no image is served until this read works.
    let mut backoff = Backoff::new(Duration::from_millis(500), Duration::from_secs(30));
    let build_namespace = loop {
        match build_namespace(&reconciler, &client).await {
            Ok(namespace) => break namespace,
            Err(e) => {
                let retry_in = backoff.failed();
                warn!(error = %error_message(&e), ?retry_in, "image reconciler not started");
                tokio::select! {
                    _ = tokio::time::sleep(retry_in) => {}
                    _ = shutdown.clone() => return Ok(()),
                }
            }
        }
    };

    let images: Api<VMImage> = Api::namespaced(client.clone(), &cfg.namespace);
    let jobs: Api<Job> = Api::namespaced(client.clone(), &build_namespace);
    let providers: Api<Provider> = Api::namespaced(client.clone(), &cfg.namespace);
    let controller = Controller::new(images, watcher::Config::default());
    let store = controller.store();
    let image_namespace = cfg.namespace.clone();
    controller
        .watches(
            jobs,
            watcher::Config::default().labels(&format!("{LABEL_PROVIDER}={}", cfg.provider)),
            move |job: Job| {
                job.labels()
                    .get(LABEL_VMIMAGE)
                    .map(|image| ObjectRef::<VMImage>::new(image).within(&image_namespace))
            },
        )
        .watches(
            providers,
            watcher::Config::default().fields(&format!("metadata.name={}", cfg.provider)),
            move |_: Provider| {
                store
                    .state()
                    .iter()
                    .map(|image| ObjectRef::from_obj(&**image))
                    .collect::<Vec<_>>()
            },
        )
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, reconciler)
        .for_each(|result| async move {
            if let Err(e) = result {
                debug!(error = %e, "image reconcile");
            }
        })
        .await;
    Ok(())
}

async fn reconcile(image: Arc<VMImage>, ctx: Arc<ImageReconciler>) -> Result<Action> {
    ctx.reconcile(&image).await?;
    ctx.backoff
        .succeeded(&ErrorBackoff::key_of(BACKOFF_KEY, image.as_ref()));
    Ok(Action::requeue(ctx.cfg.resync))
}

/// The image reconciler's name in its backoff keys.
const BACKOFF_KEY: &str = "image";

fn error_policy(image: Arc<VMImage>, error: &Error, ctx: Arc<ImageReconciler>) -> Action {
    let delay = ctx
        .backoff
        .failed(&ErrorBackoff::key_of(BACKOFF_KEY, image.as_ref()));
    warn!(vmimage = %image.name_any(), error = %error_message(error), retry_in = ?delay, "image reconcile failed");
    Action::requeue(delay)
}

//! The build reconciler (`banlieue imagebuild controller`): for each VMImage with a Url source
//! it resolves the reference to a manifest digest, makes sure a build Job of that digest
//! exists in the build namespace, and says on `status.buildArtifact` where the build stands
//! until the Job's own reports take over. Resolving again every refresh period is what turns a
//! tag that moved into a new build (ADR-0064).

use std::sync::Arc;
use std::time::Duration;

use banlieue_api::VMImage;
use banlieue_api::names::{LABEL_MANAGED_BY, LABEL_VMIMAGE};
use banlieue_runtime::reconcile::ErrorBackoff;
use futures::{FutureExt as _, StreamExt};
use k8s_openapi::api::batch::v1::Job;
use kube::api::{Api, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Client, ResourceExt};

use crate::credentials;
use crate::decide::{self, BuildSettings, LABEL_VMIMAGE_NAMESPACE, MANAGED_BY};
use crate::publish;
use crate::pull::{self, Puller};
use crate::reason::BuildError;

/// How the reconciler runs.
#[derive(Clone, Debug)]
pub struct ReconcilerConfig {
    pub build: BuildSettings,
    /// The namespaces whose VMImages are built; all namespaces when empty.
    pub namespaces: Vec<String>,
    /// How often a built tag is resolved again, to notice that it moved.
    pub refresh: Duration,
    /// How soon a VMImage whose reconcile failed (a reference that did not resolve, an API
    /// call) is tried again; each further failure of the same VMImage doubles it, up to
    /// `retry_max`, and a success starts over.
    pub retry: Duration,
    /// The longest wait between two tries of a failing VMImage.
    pub retry_max: Duration,
    /// The registries (host, with its port when the reference names one) Url sources may
    /// name; every registry when empty. Any other is `RegistryNotAllowed`, never contacted.
    pub allowed_registries: Vec<String>,
}

impl Default for ReconcilerConfig {
    fn default() -> Self {
        ReconcilerConfig {
            build: BuildSettings::default(),
            namespaces: Vec::new(),
            refresh: Duration::from_secs(600),
            retry: Duration::from_secs(30),
            retry_max: Duration::from_secs(600),
            allowed_registries: Vec::new(),
        }
    }
}

/// A reconcile failure: an API call that failed (retried on the backoff).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ReconcileError(#[from] kube::Error);

struct Context {
    client: Client,
    config: ReconcilerConfig,
    backoff: ErrorBackoff,
}

/// The key of `image` in the backoff.
fn backoff_key(image: &VMImage) -> String {
    ErrorBackoff::key_of("build", image)
}

/// Runs until `shutdown` completes: one controller per namespace it is limited to, or one for
/// the whole cluster.
pub async fn run(
    client: Client,
    config: ReconcilerConfig,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) -> Result<(), kube::Error> {
    let scopes: Vec<Option<String>> = if config.namespaces.is_empty() {
        vec![None]
    } else {
        config.namespaces.iter().cloned().map(Some).collect()
    };
    let shutdown = shutdown.shared();
    let ctx = Arc::new(Context {
        client: client.clone(),
        backoff: ErrorBackoff::new(config.retry, config.retry_max),
        config,
    });
    let controllers = scopes.into_iter().map(|scope| {
        let (ctx, shutdown) = (ctx.clone(), shutdown.clone());
        let images: Api<VMImage> = match &scope {
            Some(ns) => Api::namespaced(client.clone(), ns),
            None => Api::all(client.clone()),
        };
        let jobs: Api<Job> = Api::namespaced(client.clone(), &ctx.config.build.namespace);
        let selector = format!("{LABEL_MANAGED_BY}={MANAGED_BY}");
        Controller::new(images, watcher::Config::default())
            .watches(
                jobs,
                watcher::Config::default().labels(&selector),
                move |job| {
                    let labels = job.labels();
                    let name = labels.get(LABEL_VMIMAGE)?;
                    let namespace = labels.get(LABEL_VMIMAGE_NAMESPACE)?;
                    if scope.as_ref().is_some_and(|only| only != namespace) {
                        return None;
                    }
                    Some(ObjectRef::<VMImage>::new(name).within(namespace))
                },
            )
            .graceful_shutdown_on(shutdown)
            .run(reconcile, error_policy, ctx)
            .for_each(|result| async move {
                if let Err(e) = result {
                    tracing::debug!(error = %e, "build reconcile");
                }
            })
    });
    futures::future::join_all(controllers).await;
    Ok(())
}

fn error_policy(image: Arc<VMImage>, error: &ReconcileError, ctx: Arc<Context>) -> Action {
    let delay = ctx.backoff.failed(&backoff_key(&image));
    tracing::warn!(vmimage = %image.name_any(), error = %error, retry_in = ?delay, "build reconcile failed");
    Action::requeue(delay)
}

async fn reconcile(image: Arc<VMImage>, ctx: Arc<Context>) -> Result<Action, ReconcileError> {
    let Some(source) = decide::url_source(&image) else {
        return Ok(Action::await_change());
    };
    let name = image.name_any();
    let namespace = image.namespace().unwrap_or_default();
    let url = source.url.clone().unwrap_or_default();
    // The registry's credentials and CA live in the build namespace: the providers that share
    // the VMImage's namespace may read its Secrets, and must not read these.
    let resolved = resolve(
        &ctx.client,
        &ctx.config.build.namespace,
        &ctx.config.allowed_registries,
        source,
        &url,
    )
    .await;
    let job_name = resolved
        .as_ref()
        .ok()
        .map(|(_, digest)| decide::job_name(&namespace, &name, digest));
    let jobs: Api<Job> = Api::namespaced(ctx.client.clone(), &ctx.config.build.namespace);
    let job = match &job_name {
        Some(job_name) => jobs.get_opt(job_name).await?,
        None => None,
    };
    let current = image
        .status
        .as_ref()
        .and_then(|s| s.build_artifact.as_ref());
    let plan = decide::plan(
        current,
        resolved.as_ref().map(|(_, d)| d.as_str()),
        &decide::job_state(job.as_ref()),
    );
    if let (Some(digest), Ok((reference, _))) = (&plan.create_job, &resolved) {
        let pinned = pull::pinned(reference, digest).to_string();
        let build = &ctx.config.build;
        let sharing = banlieue_runtime::artifacts::sharing(
            &ctx.client,
            &build.namespace,
            &build.artifacts_claim,
        )
        .await;
        let job = decide::build_job(build, &namespace, &name, digest, &pinned, sharing);
        match jobs.create(&PostParams::default(), &job).await {
            Ok(_) => tracing::info!(vmimage = %name, digest, "build Job created"),
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => return Err(e.into()),
        }
    }
    if let Some(status) = &plan.status {
        let api = Api::<VMImage>::namespaced(ctx.client.clone(), &namespace);
        publish::replace(&api, &name, status).await?;
    }
    let key = backoff_key(&image);
    Ok(match &resolved {
        Err(e) => {
            let delay = ctx.backoff.failed(&key);
            tracing::warn!(vmimage = %name, reason = %e.reason, retry_in = ?delay, "{}", e.message);
            Action::requeue(delay)
        }
        Ok(_) => {
            ctx.backoff.succeeded(&key);
            Action::requeue(ctx.config.refresh)
        }
    })
}

/// The source's reference and the digest it resolves to now, with the credentials and CA the
/// source names in `credentials_namespace`; a registry off `allowed_registries` is refused
/// before it is contacted.
async fn resolve(
    client: &Client,
    credentials_namespace: &str,
    allowed_registries: &[String],
    source: &banlieue_api::ImageSource,
    url: &str,
) -> Result<(oci_client::Reference, String), BuildError> {
    let reference = pull::parse_reference(url)?;
    if let Some(refused) = decide::registry_refusal(reference.registry(), allowed_registries) {
        return Err(refused);
    }
    let access = credentials::load_access(
        client,
        credentials_namespace,
        source,
        reference.resolve_registry(),
    )
    .await?;
    let digest = Puller::new(&reference, &access)?
        .resolve(&reference)
        .await?;
    Ok((reference, digest))
}

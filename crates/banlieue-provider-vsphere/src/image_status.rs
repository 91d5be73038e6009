//! VMImages with a Template source for this Provider's class: the workload looks the template
//! up in vCenter and publishes its entry of `status.perProvider[]`, one zone per datastore its
//! failure domains offer (`pool` is the datastore, `volume` the template's inventory path).
//! That is the shape the controller's scheduler reads for every backend: a VM is placed where
//! its image has a Ready zone on the storage class's target.

use std::collections::BTreeSet;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use banlieue_api::conditions::{error_message, reasons};
use banlieue_api::{ImageSourceKind, Provider, VMImage, ZoneImageStatus, ZonePhase};
use banlieue_provider_kit::ErrorBackoff;
use banlieue_provider_kit::error::Core;
use banlieue_provider_kit::image_zones::{self, ZonesError};
use futures::StreamExt;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::watcher;

use crate::connection;
use crate::error::{Error, Result};
use crate::template::{self, TemplateSight};
use banlieue_api::vsphere::template_folder_refusal;

/// Settings of the image loop of one Provider's workload.
#[derive(Clone, Debug)]
pub struct ImageConfig {
    pub provider: String,
    pub namespace: String,
    /// How often a template is looked up again when nothing changed (it may be deleted or
    /// renamed in vCenter, which sends the cluster no event).
    pub recheck: Duration,
}

impl ImageConfig {
    /// Defaults: every template looked up again each 5 minutes.
    pub fn new(provider: impl Into<String>, namespace: impl Into<String>) -> ImageConfig {
        ImageConfig {
            provider: provider.into(),
            namespace: namespace.into(),
            recheck: Duration::from_secs(300),
        }
    }
}

struct Context {
    kube: kube::Client,
    cfg: ImageConfig,
    backoff: ErrorBackoff,
}

/// This loop's name in its backoff keys.
const BACKOFF_KEY: &str = "image status";

/// Publishes this Provider's entry of every Template image's status until `shutdown`.
pub async fn run_images(
    client: kube::Client,
    cfg: ImageConfig,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) -> Result<()> {
    let images: Api<VMImage> = Api::namespaced(client.clone(), &cfg.namespace);
    let ctx = Arc::new(Context {
        kube: client,
        cfg,
        backoff: banlieue_provider_kit::error_backoff(),
    });
    Controller::new(images, watcher::Config::default())
        .graceful_shutdown_on(shutdown)
        .run(
            |image, ctx| async move {
                let key = ErrorBackoff::key_of(BACKOFF_KEY, image.as_ref());
                ctx.backoff.track(&key, reconcile(image, ctx.clone()).await)
            },
            error_policy,
            ctx,
        )
        .for_each(|result| async move {
            if let Err(e) = result {
                tracing::debug!(error = %error_message(&e), "image status");
            }
        })
        .await;
    Ok(())
}

fn error_policy(image: Arc<VMImage>, error: &Error, ctx: Arc<Context>) -> Action {
    let delay = ctx
        .backoff
        .failed(&ErrorBackoff::key_of(BACKOFF_KEY, image.as_ref()));
    tracing::warn!(error = %error_message(error), retry_in = ?delay, "image status failed");
    Action::requeue(delay)
}

async fn reconcile(image: Arc<VMImage>, ctx: Arc<Context>) -> Result<Action> {
    let providers: Api<Provider> = Api::namespaced(ctx.kube.clone(), &ctx.cfg.namespace);
    let provider = providers
        .get(&ctx.cfg.provider)
        .await
        .map_err(Error::kube(format!("provider {}", ctx.cfg.provider)))?;
    let class = &provider.spec.provider_class_ref.name;
    let Some(template) = template_of(&image, class) else {
        return Ok(Action::await_change());
    };
    let datastores = datastores(&provider);
    if datastores.is_empty() {
        // No failure domain published yet: the status loop has not reached vCenter. Retried
        // on the error backoff, as the libvirt image reconciler retries the same wait.
        return Err(Error::Core(Core::Invalid {
            reason: reasons::PROVIDER_NOT_READY,
            message: format!(
                "provider {} has no failure domain yet (the provider has not reached vCenter)",
                ctx.cfg.provider
            ),
        }));
    }
    let found = match lookup(&ctx.kube, &provider, template).await {
        Ok(found) => Ok(found),
        Err(e) => Err(error_message(&e)),
    };
    let zones = zones(&datastores, template, &found);
    write_status(&ctx, &image.name_any(), zones).await?;
    Ok(Action::requeue(ctx.cfg.recheck))
}

/// The template path of `image`'s Template source for `class`, if it has one.
pub fn template_of<'a>(image: &'a VMImage, class: &str) -> Option<&'a str> {
    image
        .spec
        .sources
        .iter()
        .find(|s| s.provider_class == class && s.kind == ImageSourceKind::Template)
        .and_then(|s| s.template.as_deref())
}

/// The datastores the Provider's failure domains offer, each once.
fn datastores(provider: &Provider) -> BTreeSet<String> {
    provider
        .status
        .iter()
        .flat_map(|s| &s.failure_domains)
        .flat_map(|d| &d.storage_classes)
        .map(|c| c.target.pool.clone())
        .collect()
}

async fn lookup(kube: &kube::Client, provider: &Provider, template: &str) -> Result<TemplateSight> {
    // Refused by the declaration alone: no session for a path the Provider never clones.
    if let Some(why) = template_folder_refusal(template, template::declared_folders(provider)) {
        return Ok(TemplateSight::Refused(why));
    }
    let endpoint = &provider.spec.connection.endpoint;
    connection::check_endpoint(endpoint)?;
    let credentials = connection::load(kube, provider).await?;
    let client = connection::connect(endpoint, &credentials).await?;
    let sight = template::look(&client, provider, template).await;
    let _ = client.logout().await;
    sight.map_err(Error::vsphere(format!("look up {template}")))
}

/// One zone per datastore: Ready with the template as its volume when vCenter has it and the
/// Provider may clone it, Failed naming the path and why (or why it could not be looked up)
/// otherwise.
pub fn zones(
    datastores: &BTreeSet<String>,
    template: &str,
    found: &std::result::Result<TemplateSight, String>,
) -> Vec<ZoneImageStatus> {
    let (phase, message) = match found {
        Ok(TemplateSight::Template(_)) => (ZonePhase::Ready, None),
        Ok(TemplateSight::Refused(why)) => (ZonePhase::Failed, Some(why.clone())),
        Ok(TemplateSight::Missing) => (
            ZonePhase::Failed,
            Some(format!(
                "no VM or template at {template} in vCenter (govc ls {template})"
            )),
        ),
        Err(why) => (
            ZonePhase::Failed,
            Some(format!("could not look up {template}: {why}")),
        ),
    };
    datastores
        .iter()
        .map(|datastore| ZoneImageStatus {
            pool: datastore.clone(),
            phase,
            volume: (phase == ZonePhase::Ready).then(|| template.to_owned()),
            message: message.clone(),
        })
        .collect()
}

/// Replaces this provider's entry (the kit's compare-and-swap, retried on conflict: other
/// providers write their own entries of the same list).
async fn write_status(ctx: &Context, image: &str, zones: Vec<ZoneImageStatus>) -> Result<()> {
    let images: Api<VMImage> = Api::namespaced(ctx.kube.clone(), &ctx.cfg.namespace);
    image_zones::publish(
        &images,
        image,
        &ctx.cfg.provider,
        zones,
        banlieue_api::image::revision,
    )
    .await
    .map_err(|e| match e {
        ZonesError::Kube { what, source } => Error::kube(what)(source),
        conflicts @ ZonesError::Conflicts { .. } => Error::Core(Core::Invalid {
            reason: banlieue_api::vsphere::reasons::VSPHERE_ERROR,
            message: conflicts.to_string(),
        }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_found_template_is_ready_on_every_datastore_and_a_missing_one_named() {
        let datastores: BTreeSet<String> = ["LocalDS_0", "LocalDS_1"].map(String::from).into();
        let ready = zones(
            &datastores,
            "DC0/vm/t",
            &Ok(TemplateSight::Template(
                banlieue_vsphere::ManagedObjectRef::new("VirtualMachine", "vm-1"),
            )),
        );
        assert_eq!(ready.len(), 2);
        assert!(ready.iter().all(|z| z.phase == ZonePhase::Ready
            && z.volume.as_deref() == Some("DC0/vm/t")
            && z.message.is_none()));
        let refused = zones(
            &datastores,
            "DC0/vm/t",
            &Ok(TemplateSight::Refused(
                "DC0/vm/t is a VM, not a template".into(),
            )),
        );
        assert!(refused.iter().all(|z| z.phase == ZonePhase::Failed
            && z.volume.is_none()
            && z.message.as_deref() == Some("DC0/vm/t is a VM, not a template")));
        let missing = zones(&datastores, "DC0/vm/t", &Ok(TemplateSight::Missing));
        assert!(
            missing
                .iter()
                .all(|z| z.phase == ZonePhase::Failed && z.volume.is_none())
        );
        assert!(
            missing[0]
                .message
                .as_deref()
                .unwrap_or("")
                .contains("DC0/vm/t")
        );
        let unreachable = zones(&datastores, "DC0/vm/t", &Err("login refused".into()));
        assert!(
            unreachable[0]
                .message
                .as_deref()
                .unwrap_or("")
                .contains("login refused")
        );
    }
}

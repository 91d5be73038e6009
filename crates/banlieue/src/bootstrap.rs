//! `banlieue bootstrap`: the namespaces, CRDs, RBAC, the controller and image builder
//! Deployments and, unless turned off, the isolation policies of `deploy/admission/`, by
//! server-side apply. The policies' ConfigMaps are the site's to edit: they are created when
//! missing and never set back.

use std::time::Duration;

use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Client;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams};

use crate::apply::{self, Applied, ApplyError};

include!(concat!(env!("OUT_DIR"), "/manifests.rs"));

/// How long a CRD may take to become Established before bootstrap gives up.
const CRD_ESTABLISHED_DEADLINE: Duration = Duration::from_secs(60);

/// The image this binary is packaged as by `scripts/image`, and the one `banlieue bootstrap`
/// deploys unless told otherwise. `localhost/` names no registry: an image that was not loaded
/// onto the nodes or pushed under another name fails to pull instead of being looked up on a
/// public registry.
pub const DEFAULT_IMAGE: &str = concat!("localhost/banlieue:", env!("CARGO_PKG_VERSION"));

/// The controller Deployment of `deploy/controller.yaml` and its container.
const CONTROLLER_NAMESPACE: &str = "banlieue-system";
const CONTROLLER_DEPLOYMENT: &str = "banlieue-controller";
const CONTROLLER_CONTAINER: &str = "controller";

#[derive(Debug, thiserror::Error)]
pub enum BootstrapError {
    #[error(transparent)]
    Apply(#[from] ApplyError),
    #[error("CRD {0} did not become Established within {1:?}")]
    NotEstablished(String, Duration),
    #[error("reading CRD {0}: {1}")]
    Crd(String, #[source] kube::Error),
    #[error("removing the per-Provider ClusterRoleBindings of an earlier release ({0}): {1}")]
    Legacy(String, #[source] kube::Error),
    #[error("encoding CRD {0}: {1}")]
    Encode(String, #[source] serde_json::Error),
    #[error(
        "no container {CONTROLLER_CONTAINER:?} in Deployment \
         {CONTROLLER_NAMESPACE}/{CONTROLLER_DEPLOYMENT} to set the image of"
    )]
    NoControllerContainer,
    #[error("reading the cluster's version: {0}")]
    Version(#[source] kube::Error),
    #[error(transparent)]
    Unsupported(#[from] crate::supported_kubernetes::Unsupported),
    #[error(
        "{failed} of {total} objects could not be applied (each is named above); the rest were"
    )]
    Incomplete { failed: usize, total: usize },
}

/// Parses the embedded manifests of `table` into objects.
pub fn objects_of(table: &[(&str, &str)]) -> Result<Vec<DynamicObject>, ApplyError> {
    let mut objects = Vec::new();
    for (name, text) in table {
        objects.extend(apply::parse_documents(name, text)?);
    }
    Ok(objects)
}

/// The objects bootstrap applies, in dependency order: namespaces, CRDs (from the types, the
/// same ones `deploy/crds/` holds), access control, then workloads.
pub fn bootstrap_objects() -> Result<Vec<DynamicObject>, BootstrapError> {
    let mut objects = objects_of(BOOTSTRAP)?;
    for crd in crate::backends::crds() {
        let name = crd.metadata.name.clone().unwrap_or_default();
        let value =
            serde_json::to_value(&crd).map_err(|e| BootstrapError::Encode(name.clone(), e))?;
        objects.push(serde_json::from_value(value).map_err(|e| BootstrapError::Encode(name, e))?);
    }
    objects.sort_by_key(|o| apply_rank(o.types.as_ref().map(|t| t.kind.as_str()).unwrap_or("")));
    Ok(objects)
}

/// The ConfigMaps of `deploy/admission/` that the site edits after the install (its issuers
/// and brokers, the images it runs): a second install leaves them as they are, but for adding
/// the image it installs to the workload policy's list.
const SITE_CONFIGMAPS: [&str; 2] = ["banlieue-claim-subject-policy", "banlieue-workload-images"];

/// The workload policy's ConfigMap and the key listing the images banlieue's identities may
/// start.
const WORKLOAD_IMAGES_CONFIGMAP: &str = "banlieue-workload-images";

/// The isolation policies of `deploy/admission/` with their ConfigMaps, the workload policy
/// listing `image`: what an install applies unless the site brings its own (docs/security.md,
/// "Turning the policies off").
pub fn admission_objects(image: &str) -> Result<Vec<DynamicObject>, BootstrapError> {
    let mut objects = objects_of(ADMISSION)?;
    set_workload_image(&mut objects, image);
    objects.sort_by_key(|o| apply_rank(o.types.as_ref().map(|t| t.kind.as_str()).unwrap_or("")));
    Ok(objects)
}

/// Lists `image` alone in the workload policy's ConfigMap among `objects`, as the chart lists
/// its `image` first.
pub fn set_workload_image(objects: &mut [DynamicObject], image: &str) {
    for object in objects.iter_mut().filter(|o| {
        o.types.as_ref().is_some_and(|t| t.kind == "ConfigMap")
            && o.metadata.name.as_deref() == Some(WORKLOAD_IMAGES_CONFIGMAP)
    }) {
        if let Some(data) = object.data.get_mut("data").and_then(|d| d.as_object_mut()) {
            data.insert("images".into(), image.into());
        }
    }
}

/// Creates a policy's ConfigMap the site edits when it is missing, and otherwise leaves it as
/// the site made it, but for one thing: the workload policy must list the image this install
/// runs, or the controller's own Deployment and the Providers' are refused. A missing image is
/// added to the site's list, which is otherwise kept.
async fn keep_site_configmap(
    client: &Client,
    object: &DynamicObject,
) -> Result<apply::Applied, ApplyError> {
    let applied = apply::create_if_absent(client, object).await?;
    let wanted = object.data.pointer("/data/images").and_then(|v| v.as_str());
    let (Some(wanted), apply::Change::Unchanged) = (wanted, &applied.change) else {
        return Ok(applied);
    };
    let namespace = object.metadata.namespace.as_deref().unwrap_or_default();
    let name = object.metadata.name.as_deref().unwrap_or_default();
    let api: Api<k8s_openapi::api::core::v1::ConfigMap> =
        Api::namespaced(client.clone(), namespace);
    let failed = |source| ApplyError::Api {
        object: applied.object.clone(),
        source,
    };
    let existing = api.get(name).await.map_err(failed)?;
    let listed = existing
        .data
        .as_ref()
        .and_then(|d| d.get("images"))
        .map(String::as_str)
        .unwrap_or_default();
    let Some(images) = images_with(listed, wanted) else {
        return Ok(applied);
    };
    let patch = serde_json::json!({"data": {"images": images}});
    api.patch(
        name,
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(&patch),
    )
    .await
    .map_err(failed)?;
    Ok(apply::Applied {
        object: applied.object,
        change: apply::Change::Configured,
    })
}

/// The site's image list `listed` with every entry of `wanted` it lacks appended, one per
/// line, or `None` when it lists them all. Entries are separated by commas or newlines, and a
/// line starting with `#` is a comment, as the workload policy reads them.
fn images_with(listed: &str, wanted: &str) -> Option<String> {
    let entries = |text: &str| -> Vec<String> {
        text.replace(',', "\n")
            .lines()
            .map(str::trim)
            .filter(|e| !e.is_empty() && !e.starts_with('#'))
            .map(str::to_owned)
            .collect()
    };
    let have = entries(listed);
    let missing: Vec<String> = entries(wanted)
        .into_iter()
        .filter(|w| !have.contains(w))
        .collect();
    if missing.is_empty() {
        return None;
    }
    let kept = listed.trim_end();
    Some(if kept.is_empty() {
        missing.join("\n")
    } else {
        format!("{kept}\n{}", missing.join("\n"))
    })
}

/// How long a Deployment refused by the workload policy is applied again: the policy reads its
/// image list through an informer, so an image this run just added to the list may not be seen
/// yet when the Deployment follows it.
const WORKLOAD_POLICY_CATCH_UP: Duration = Duration::from_secs(10);

/// [`apply::apply`], again for up to [`WORKLOAD_POLICY_CATCH_UP`] while the workload policy
/// refuses a Deployment.
async fn apply_judged(client: &Client, object: &DynamicObject) -> Result<Applied, ApplyError> {
    let deadline = tokio::time::Instant::now() + WORKLOAD_POLICY_CATCH_UP;
    loop {
        match apply::apply(client, object).await {
            Err(error)
                if error.to_string().contains("banlieue-workload-pins")
                    && tokio::time::Instant::now() < deadline =>
            {
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            outcome => return outcome,
        }
    }
}

/// Whether `object` is one of the [`SITE_CONFIGMAPS`].
fn site_owned(object: &DynamicObject) -> bool {
    object.types.as_ref().is_some_and(|t| t.kind == "ConfigMap")
        && object
            .metadata
            .name
            .as_deref()
            .is_some_and(|n| SITE_CONFIGMAPS.contains(&n))
}

/// Sets the image of the controller Deployment's container among `objects`.
pub fn set_controller_image(
    objects: &mut [DynamicObject],
    image: &str,
) -> Result<(), BootstrapError> {
    let deployment = objects
        .iter_mut()
        .find(|o| {
            o.types.as_ref().is_some_and(|t| t.kind == "Deployment")
                && o.metadata.namespace.as_deref() == Some(CONTROLLER_NAMESPACE)
                && o.metadata.name.as_deref() == Some(CONTROLLER_DEPLOYMENT)
        })
        .ok_or(BootstrapError::NoControllerContainer)?;
    let container = deployment
        .data
        .pointer_mut("/spec/template/spec/containers")
        .and_then(|c| c.as_array_mut())
        .and_then(|containers| {
            containers
                .iter_mut()
                .find(|c| c.get("name").and_then(|n| n.as_str()) == Some(CONTROLLER_CONTAINER))
        })
        .and_then(|c| c.as_object_mut())
        .ok_or(BootstrapError::NoControllerContainer)?;
    container.insert("image".into(), image.into());
    Ok(())
}

/// The image builder's Deployment (`deploy/imagebuilder.yaml`) and its container.
const IMAGEBUILDER_DEPLOYMENT: &str = "banlieue-imagebuilder";
const IMAGEBUILDER_CONTAINER: &str = "imagebuilder";

/// Sets the image of the image builder's container among `objects`, and the image its build
/// Jobs run (`BANLIEUE_IMAGE`): the same binary in both.
pub fn set_imagebuilder_image(objects: &mut [DynamicObject], image: &str) {
    let container = objects
        .iter_mut()
        .find(|o| {
            o.types.as_ref().is_some_and(|t| t.kind == "Deployment")
                && o.metadata.name.as_deref() == Some(IMAGEBUILDER_DEPLOYMENT)
        })
        .and_then(|d| d.data.pointer_mut("/spec/template/spec/containers"))
        .and_then(|c| c.as_array_mut())
        .and_then(|containers| {
            containers
                .iter_mut()
                .find(|c| c.get("name").and_then(|n| n.as_str()) == Some(IMAGEBUILDER_CONTAINER))
        })
        .and_then(|c| c.as_object_mut());
    let Some(container) = container else {
        return;
    };
    container.insert("image".into(), image.into());
    let env = container
        .entry("env")
        .or_insert_with(|| serde_json::Value::Array(Vec::new()));
    if let Some(env) = env.as_array_mut() {
        env.retain(|e| e.get("name").and_then(|n| n.as_str()) != Some("BANLIEUE_IMAGE"));
        env.push(serde_json::json!({"name": "BANLIEUE_IMAGE", "value": image}));
    }
}

/// Lower applies first; the sort is stable, so file order holds within a rank.
fn apply_rank(kind: &str) -> u8 {
    match kind {
        "Namespace" => 0,
        "CustomResourceDefinition" => 1,
        "ServiceAccount" | "ClusterRole" | "Role" => 2,
        "ClusterRoleBinding" | "RoleBinding" => 3,
        "ConfigMap" | "Secret" => 4,
        "Deployment" => 9,
        _ => 5,
    }
}

/// Applies every object of `objects`, waiting for each CRD to be Established before anything
/// that could depend on it; reports each object's change through `report`.
pub async fn apply_all(
    client: &Client,
    objects: &[DynamicObject],
    mut report: impl FnMut(&Applied),
) -> Result<Vec<Applied>, BootstrapError> {
    let mut applied = Vec::with_capacity(objects.len());
    for object in objects {
        let result = apply::apply(client, object).await?;
        report(&result);
        if object
            .types
            .as_ref()
            .is_some_and(|t| t.kind == "CustomResourceDefinition")
        {
            wait_established(client, object.metadata.name.as_deref().unwrap_or_default()).await?;
        }
        applied.push(result);
    }
    Ok(applied)
}

async fn wait_established(client: &Client, name: &str) -> Result<(), BootstrapError> {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let deadline = tokio::time::Instant::now() + CRD_ESTABLISHED_DEADLINE;
    loop {
        let crd = crds
            .get(name)
            .await
            .map_err(|e| BootstrapError::Crd(name.into(), e))?;
        let established = crd
            .status
            .and_then(|s| s.conditions)
            .unwrap_or_default()
            .iter()
            .any(|c| c.type_ == "Established" && c.status == "True");
        if established {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(BootstrapError::NotEstablished(
                name.into(),
                CRD_ESTABLISHED_DEADLINE,
            ));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Printed after a bootstrap that applied the isolation policies.
pub const ADMISSION_APPLIED: &str = "\
The isolation policies of deploy/admission/ are in force. Claims are denied until ConfigMap
banlieue-system/banlieue-claim-subject-policy lists your issuers (its shipped entry is a
placeholder), and banlieue's identities start only the images ConfigMap
banlieue-system/banlieue-workload-images lists (the one installed here). A later bootstrap
leaves both ConfigMaps as you edited them.";

/// Printed after `bootstrap --without-admission`.
pub const ADMISSION_SKIPPED: &str = "\
deploy/admission/ was not applied (--without-admission). Until your cluster enforces the same
rules, claims are not checked against their creator, any writer of VirtualMachines may reshape
another subject's VM, and banlieue's identities may start any workload they may create
(docs/security.md, \"Turning the policies off\").";

/// `banlieue bootstrap`, the controller running `image`: refuses a cluster older than the
/// supported window before writing anything, then applies every object it can and names those
/// it could not.
pub async fn run(client: Client, image: &str, admission: bool) -> Result<(), BootstrapError> {
    let info = client
        .apiserver_version()
        .await
        .map_err(BootstrapError::Version)?;
    let (major, minor) = crate::supported_kubernetes::check(&info)?;
    println!("Kubernetes v{major}.{minor}: supported");
    let mut objects = bootstrap_objects()?;
    set_controller_image(&mut objects, image)?;
    set_imagebuilder_image(&mut objects, image);
    if admission {
        objects.extend(admission_objects(image)?);
        // The workload policy's image list before the Deployments it judges.
        objects
            .sort_by_key(|o| apply_rank(o.types.as_ref().map(|t| t.kind.as_str()).unwrap_or("")));
    }
    let report = apply_each(&client, &objects, |line| println!("{line}")).await;
    let changed = report
        .applied
        .iter()
        .filter(|a| a.change != apply::Change::Unchanged)
        .count();
    println!(
        "{changed} of {} objects changed, {} skipped, {} failed",
        report.applied.len(),
        report.skipped.len(),
        report.failed.len()
    );
    for name in remove_legacy_provider_bindings(&client).await? {
        println!(
            "clusterrolebinding.rbac.authorization.k8s.io/{name} deleted (replaced by banlieue-providers)"
        );
    }
    // A warning, not a failure: the volume is the site's to make, and may come later.
    match crate::artifacts_volume::check(&client).await {
        Ok(Some(warning)) => eprintln!("warning: {warning}"),
        Ok(None) => {}
        Err(e) => eprintln!("warning: could not check the artifacts volume: {e}"),
    }
    eprintln!(
        "{}",
        if admission {
            ADMISSION_APPLIED
        } else {
            ADMISSION_SKIPPED
        }
    );
    match report.failed.len() {
        0 => Ok(()),
        failed => Err(BootstrapError::Incomplete {
            failed,
            total: objects.len(),
        }),
    }
}

/// What [`apply_each`] did with each object.
#[derive(Debug, Default)]
pub struct ApplyReport {
    pub applied: Vec<Applied>,
    /// Optional objects whose API the cluster does not serve, each with what replaces it.
    pub skipped: Vec<String>,
    /// Objects that could not be applied, each with why.
    pub failed: Vec<String>,
}

/// Applies every object of `objects` it can, in order, waiting for each CRD to be Established;
/// an object that fails does not stop the ones after it. An optional object ([`optional`])
/// whose API the cluster does not serve is skipped. `say` gets one line per object.
pub async fn apply_each(
    client: &Client,
    objects: &[DynamicObject],
    mut say: impl FnMut(&str),
) -> ApplyReport {
    let mut report = ApplyReport::default();
    for object in objects {
        let written = if site_owned(object) {
            keep_site_configmap(client, object).await
        } else {
            apply_judged(client, object).await
        };
        let outcome = match written {
            Ok(applied) => match object.types.as_ref().map(|t| t.kind.as_str()) {
                Some("CustomResourceDefinition") => {
                    wait_established(client, object.metadata.name.as_deref().unwrap_or_default())
                        .await
                        .map(|()| applied)
                }
                _ => Ok(applied),
            },
            Err(error) => Err(BootstrapError::Apply(error)),
        };
        match outcome {
            Ok(applied) => {
                say(&applied.to_string());
                report.applied.push(applied);
            }
            Err(error) => match optional(object).filter(|_| not_served(&error)) {
                Some(instead) => {
                    let line = format!("skipped: {}; {instead}", label(object));
                    say(&line);
                    report.skipped.push(line);
                }
                None => {
                    let line = format!("failed: {error}");
                    say(&line);
                    report.failed.push(line);
                }
            },
        }
    }
    report
}

/// What stands in for an object bootstrap may do without, where the cluster does not serve
/// its API: the claim-protection policy (a MutatingAdmissionPolicy, GA in Kubernetes v1.36).
fn optional(object: &DynamicObject) -> Option<&'static str> {
    let kind = object.types.as_ref().map(|t| t.kind.as_str())?;
    let claim_protection = object.metadata.name.as_deref() == Some("banlieue-claim-protection");
    (claim_protection
        && matches!(
            kind,
            "MutatingAdmissionPolicy" | "MutatingAdmissionPolicyBinding"
        ))
    .then_some(
        "this cluster does not serve it: the controller adds banlieue.io/claim-protection to \
         each claim itself, one more write per claim",
    )
}

/// Whether `error` says the cluster does not serve the object's API (group, version or kind).
fn not_served(error: &BootstrapError) -> bool {
    match error {
        BootstrapError::Apply(ApplyError::Api { source, .. }) => match source {
            kube::Error::Discovery(_) => true,
            kube::Error::Api(status) => status.code == 404,
            _ => false,
        },
        _ => false,
    }
}

fn label(object: &DynamicObject) -> String {
    let kind = object
        .types
        .as_ref()
        .map(|t| t.kind.as_str())
        .unwrap_or("?");
    let name = object.metadata.name.as_deref().unwrap_or_default();
    match &object.metadata.namespace {
        Some(ns) => format!("{kind}/{ns}/{name}"),
        None => format!("{kind}/{name}"),
    }
}

/// The operator's label on the objects it made for a Provider.
const OPERATOR_MANAGED: &str = "app.kubernetes.io/managed-by=banlieue-operator";

/// Deletes the ClusterRoleBindings an earlier operator made per Provider to
/// `banlieue-provider-cluster`: every Provider's account is now a subject of the one shipped
/// binding `banlieue-providers`, and the controller may no longer delete ClusterRoleBindings
/// itself. Returns the names deleted.
pub async fn remove_legacy_provider_bindings(
    client: &Client,
) -> Result<Vec<String>, BootstrapError> {
    let api: Api<ClusterRoleBinding> = Api::all(client.clone());
    let listed = api
        .list(&ListParams::default().labels(OPERATOR_MANAGED))
        .await
        .map_err(|e| BootstrapError::Legacy("list".into(), e))?;
    let mut deleted = Vec::new();
    for binding in listed.items {
        if binding.role_ref.name != "banlieue-provider-cluster" {
            continue;
        }
        let name = binding.metadata.name.unwrap_or_default();
        match api.delete(&name, &DeleteParams::default()).await {
            Ok(_) => deleted.push(name),
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(BootstrapError::Legacy(format!("delete {name}"), e)),
        }
    }
    Ok(deleted)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_install_adds_its_image_to_the_sites_list_and_keeps_the_rest() {
        assert_eq!(images_with("a:1\n# ours\nb:2", "b:2"), None);
        assert_eq!(images_with("a:1, b:2", "b:2"), None);
        assert_eq!(
            images_with("a:1\n# ours\n", "c:3").as_deref(),
            Some("a:1\n# ours\nc:3")
        );
        assert_eq!(images_with("", "c:3").as_deref(), Some("c:3"));
    }

    #[test]
    fn the_admission_objects_are_every_policy_and_list_the_installed_image() {
        let objects = bootstrap_objects().unwrap();
        assert!(objects.iter().all(|o| {
            let kind = o.types.as_ref().map(|t| t.kind.as_str()).unwrap_or("");
            !kind.starts_with("ValidatingAdmissionPolicy")
        }));
        let admission = admission_objects("registry.test/banlieue:9").unwrap();
        let policies = admission
            .iter()
            .filter(|o| {
                o.types
                    .as_ref()
                    .is_some_and(|t| t.kind == "ValidatingAdmissionPolicy")
            })
            .count();
        assert_eq!(
            policies,
            ADMISSION
                .iter()
                .map(|(_, text)| text.matches("kind: ValidatingAdmissionPolicy\n").count())
                .sum::<usize>()
        );
        let images = admission
            .iter()
            .find(|o| o.metadata.name.as_deref() == Some(WORKLOAD_IMAGES_CONFIGMAP))
            .and_then(|o| o.data.pointer("/data/images"))
            .and_then(|v| v.as_str());
        assert_eq!(images, Some("registry.test/banlieue:9"));
        assert!(admission.iter().filter(|o| site_owned(o)).count() == SITE_CONFIGMAPS.len());
    }

    fn controller_image(objects: &[DynamicObject]) -> Option<&str> {
        objects
            .iter()
            .find(|o| {
                o.types.as_ref().is_some_and(|t| t.kind == "Deployment")
                    && o.metadata.name.as_deref() == Some(CONTROLLER_DEPLOYMENT)
            })?
            .data
            .pointer("/spec/template/spec/containers/0/image")?
            .as_str()
    }

    #[test]
    fn set_controller_image_changes_only_that_image() {
        let mut objects = bootstrap_objects().unwrap();
        let before = objects.clone();
        set_controller_image(&mut objects, "registry.test/banlieue:x").unwrap();
        assert_eq!(controller_image(&objects), Some("registry.test/banlieue:x"));
        let changed: Vec<_> = objects
            .iter()
            .zip(&before)
            .filter(|(a, b)| a.data != b.data)
            .map(|(a, _)| a.metadata.name.clone())
            .collect();
        assert_eq!(changed, [Some(CONTROLLER_DEPLOYMENT.to_owned())]);
    }

    #[test]
    fn the_image_builder_runs_and_builds_with_the_same_image() {
        let mut objects = bootstrap_objects().unwrap();
        set_imagebuilder_image(&mut objects, "registry.test/banlieue:x");
        let builder = objects
            .iter()
            .find(|o| {
                o.types.as_ref().is_some_and(|t| t.kind == "Deployment")
                    && o.metadata.name.as_deref() == Some(IMAGEBUILDER_DEPLOYMENT)
            })
            .unwrap();
        let container = builder
            .data
            .pointer("/spec/template/spec/containers/0")
            .unwrap();
        assert_eq!(container["image"], "registry.test/banlieue:x");
        let images: Vec<_> = container["env"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["name"] == "BANLIEUE_IMAGE")
            .map(|e| e["value"].clone())
            .collect();
        assert_eq!(images, ["registry.test/banlieue:x"]);
    }

    #[test]
    fn set_controller_image_without_the_deployment_is_an_error() {
        let mut objects = objects_of(ADMISSION).unwrap();
        assert!(matches!(
            set_controller_image(&mut objects, "x"),
            Err(BootstrapError::NoControllerContainer)
        ));
    }

    /// The shipped manifests name the image `scripts/image` builds from this source, so a
    /// version bump that forgets them fails here.
    #[test]
    fn shipped_manifests_name_the_default_image() {
        assert_eq!(
            controller_image(&bootstrap_objects().unwrap()),
            Some(DEFAULT_IMAGE)
        );
        let class = objects_of(EXAMPLES)
            .unwrap()
            .into_iter()
            .find(|o| o.types.as_ref().is_some_and(|t| t.kind == "ProviderClass"))
            .expect("an example ProviderClass");
        assert_eq!(
            class.data.pointer("/spec/image").and_then(|i| i.as_str()),
            Some(DEFAULT_IMAGE)
        );
        // The admission policy's list of images banlieue's identities may start.
        let images = objects_of(ADMISSION)
            .unwrap()
            .into_iter()
            .find(|o| o.metadata.name.as_deref() == Some(WORKLOAD_IMAGES_CONFIGMAP))
            .and_then(|o| o.data.pointer("/data/images")?.as_str().map(str::to_owned))
            .unwrap_or_default();
        assert!(
            images.split([',', '\n']).any(|l| l.trim() == DEFAULT_IMAGE),
            "deploy/admission/workload-images.yaml does not list {DEFAULT_IMAGE}"
        );
    }

    #[test]
    fn the_controller_keeps_a_replica_through_disruptions() {
        let objects = bootstrap_objects().unwrap();
        let of_kind = |kind: &str| {
            objects
                .iter()
                .find(|o| {
                    o.types.as_ref().is_some_and(|t| t.kind == kind)
                        && o.metadata.name.as_deref() == Some(CONTROLLER_DEPLOYMENT)
                })
                .unwrap_or_else(|| panic!("no {kind} {CONTROLLER_DEPLOYMENT}"))
        };
        let budget = of_kind("PodDisruptionBudget");
        let deployment = of_kind("Deployment");
        assert_eq!(
            budget.metadata.namespace.as_deref(),
            Some(CONTROLLER_NAMESPACE)
        );
        assert_eq!(budget.data.pointer("/spec/minAvailable"), Some(&1.into()));
        assert_eq!(deployment.data.pointer("/spec/replicas"), Some(&2.into()));
        // The budget's selector picks the Deployment's pods.
        let selector = budget
            .data
            .pointer("/spec/selector/matchLabels")
            .and_then(|s| s.as_object())
            .unwrap();
        let labels = deployment
            .data
            .pointer("/spec/template/metadata/labels")
            .and_then(|l| l.as_object())
            .unwrap();
        assert!(!selector.is_empty());
        assert!(selector.iter().all(|(k, v)| labels.get(k) == Some(v)));
    }

    #[test]
    fn crds_precede_what_uses_them() {
        let objects = bootstrap_objects().unwrap();
        let kinds: Vec<&str> = objects
            .iter()
            .map(|o| o.types.as_ref().map(|t| t.kind.as_str()).unwrap_or(""))
            .collect();
        let first_crd = kinds
            .iter()
            .position(|k| *k == "CustomResourceDefinition")
            .unwrap();
        assert_eq!(
            kinds
                .iter()
                .filter(|k| **k == "CustomResourceDefinition")
                .count(),
            crate::backends::crds().len()
        );
        assert!(
            kinds[..first_crd].iter().all(|k| *k == "Namespace"),
            "{kinds:?}"
        );
        if let Some(deployment) = kinds.iter().position(|k| *k == "Deployment") {
            assert!(
                kinds[deployment..].iter().all(|k| *k == "Deployment"),
                "{kinds:?}"
            );
        }
    }
}

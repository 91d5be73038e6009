//! Server-side apply of multi-document YAML files, of any kind the server knows.

use std::path::Path;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Client;
use kube::api::{Api, DynamicObject, GroupVersionKind, Patch, PatchParams};
use kube::discovery::{self, Scope};

use super::{CRD_DEADLINE, Error, Result, wait_for};

/// The field manager of everything the harness applies.
pub const FIELD_MANAGER: &str = "banlieue-testenv";

/// Server-side applies every document of the YAML file at `path` with `client`, forcing
/// ownership of conflicting fields (the file is the truth in tests). Namespaced objects
/// without a namespace go to `namespace`, else `default`. A CRD is waited on until
/// Established before the next document is applied.
pub async fn apply_yaml_with(
    client: &Client,
    path: &Path,
    namespace: Option<&str>,
) -> Result<Vec<DynamicObject>> {
    let text = std::fs::read_to_string(path)
        .map_err(|source| Error::io(format!("read {}", path.display()), source))?;
    let documents: Vec<serde_json::Value> =
        serde_saphyr::from_multiple(&text).map_err(|source| Error::Yaml {
            path: path.to_owned(),
            source: Box::new(source),
        })?;
    let invalid = |index: usize, reason: String| Error::InvalidDocument {
        path: path.to_owned(),
        index,
        reason,
    };
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let mut applied = Vec::new();
    for (index, document) in documents.into_iter().enumerate() {
        if document.is_null() {
            continue;
        }
        let object: DynamicObject =
            serde_json::from_value(document).map_err(|e| invalid(index, e.to_string()))?;
        let types = object
            .types
            .as_ref()
            .ok_or_else(|| invalid(index, "no apiVersion or kind".into()))?;
        let gvk = GroupVersionKind::try_from(types).map_err(|e| invalid(index, e.to_string()))?;
        let name = object
            .metadata
            .name
            .clone()
            .ok_or_else(|| invalid(index, "no metadata.name".into()))?;
        let (resource, capabilities) = discovery::pinned_kind(client, &gvk).await?;
        let api: Api<DynamicObject> = match capabilities.scope {
            Scope::Namespaced => {
                let namespace = object
                    .metadata
                    .namespace
                    .as_deref()
                    .or(namespace)
                    .unwrap_or("default");
                Api::namespaced_with(client.clone(), namespace, &resource)
            }
            Scope::Cluster => Api::all_with(client.clone(), &resource),
        };
        let result = api.patch(&name, &params, &Patch::Apply(&object)).await?;
        if gvk.group == "apiextensions.k8s.io" && gvk.kind == "CustomResourceDefinition" {
            wait_established(client, &name).await?;
        }
        applied.push(result);
    }
    Ok(applied)
}

/// Server-side applies `crds` (forcing ownership, as [`FIELD_MANAGER`]) and waits until each is
/// Established. Tests install banlieue's CRDs from its types (`banlieue_api::crds()`) rather
/// than from deploy/crds, so they exercise the types even before the files are regenerated.
pub async fn apply_crds(
    client: &Client,
    crds: impl IntoIterator<Item = CustomResourceDefinition>,
) -> Result<()> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let mut names = Vec::new();
    for crd in crds {
        let name = crd
            .metadata
            .name
            .clone()
            .ok_or(Error::Unnamed("CustomResourceDefinition"))?;
        api.patch(&name, &params, &Patch::Apply(&crd)).await?;
        names.push(name);
    }
    // Applied all at once, then waited on: the server establishes them side by side.
    for name in names {
        wait_established(client, &name).await?;
    }
    Ok(())
}

/// Waits until the CRD `name` is Established, i.e. served.
pub async fn wait_established(client: &Client, name: &str) -> Result<()> {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    wait_for(
        &format!("CRD {name} to be Established"),
        CRD_DEADLINE,
        || {
            let crds = crds.clone();
            async move {
                let crd = crds.get(name).await?;
                let established = crd
                    .status
                    .and_then(|status| status.conditions)
                    .unwrap_or_default()
                    .iter()
                    .any(|c| c.type_ == "Established" && c.status == "True");
                Ok(established.then_some(()))
            }
        },
    )
    .await
}

//! Shared by the tests that run against the real control plane: the CRDs installed from the
//! types, strict server-side apply of the repository's YAML, and small claim helpers.
#![allow(dead_code)] // Each test binary uses its own subset.

use std::path::{Path, PathBuf};

use banlieue_testenv::control_plane::ControlPlane;
use kube::api::{
    Api, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams, ValidationDirective,
};
use kube::discovery::{self, Scope};
use kube::{Client, Error};
use serde_json::{Value, json};
use tokio::sync::OnceCell;

pub const FIELD_MANAGER: &str = "banlieue-api-tests";

/// The shared control plane, with every CRD installed from `banlieue_api::crds()` (not from
/// deploy/crds, so the tests exercise the types even before the files are regenerated).
pub async fn control_plane() -> &'static ControlPlane {
    static READY: OnceCell<&'static ControlPlane> = OnceCell::const_new();
    READY
        .get_or_init(|| async {
            let control_plane = ControlPlane::shared()
                .await
                .expect("start the control plane");
            let client = control_plane.client().expect("admin client");
            install_crds(&client).await;
            control_plane
        })
        .await
}

/// Applies every CRD from the types and waits until each is established.
pub async fn install_crds(client: &Client) {
    banlieue_testenv::control_plane::apply_crds(client, banlieue_api::crds())
        .await
        .expect("install the CRDs");
}

pub use banlieue_testenv::repo_path;

/// The `.yaml` files of a repository directory, sorted by name.
pub fn yaml_files(relative: &str) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(repo_path(relative))
        .expect("read a manifest directory")
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|path| path.extension().is_some_and(|ext| ext == "yaml"))
        .collect();
    files.sort();
    files
}

/// The documents of a YAML file.
pub fn documents(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).expect("read a YAML file");
    serde_saphyr::from_multiple::<Value>(&text)
        .unwrap_or_else(|e| panic!("parse {}: {e}", path.display()))
        .into_iter()
        .filter(|d| !d.is_null())
        .collect()
}

/// The API of an object's kind, in `namespace` (or the object's own) when namespaced.
pub async fn api_for(
    client: &Client,
    object: &Value,
    namespace: Option<&str>,
) -> Api<DynamicObject> {
    let api_version = object["apiVersion"].as_str().expect("apiVersion");
    let kind = object["kind"].as_str().expect("kind");
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    let gvk = GroupVersionKind::gvk(group, version, kind);
    let (resource, capabilities) = discovery::pinned_kind(client, &gvk)
        .await
        .unwrap_or_else(|e| panic!("discover {api_version} {kind}: {e}"));
    match capabilities.scope {
        Scope::Namespaced => {
            let ns = namespace
                .or(object["metadata"]["namespace"].as_str())
                .unwrap_or("default");
            Api::namespaced_with(client.clone(), ns, &resource)
        }
        Scope::Cluster => Api::all_with(client.clone(), &resource),
    }
}

/// Server-side applies one object with strict field validation, as `kubectl apply
/// --server-side` does: an unknown or duplicated field is an error, not a silent drop.
pub async fn apply_strict(
    client: &Client,
    object: &Value,
    namespace: Option<&str>,
) -> Result<DynamicObject, Error> {
    let api = api_for(client, object, namespace).await;
    let name = object["metadata"]["name"].as_str().expect("metadata.name");
    let mut object = object.clone();
    if let Some(ns) = namespace {
        object["metadata"]["namespace"] = json!(ns);
    }
    let mut params = PatchParams::apply(FIELD_MANAGER).force();
    params.field_validation = Some(ValidationDirective::Strict);
    api.patch(name, &params, &Patch::Apply(&object)).await
}

/// Applies every document of a repository file; panics with the server's message on failure.
pub async fn apply_file(
    client: &Client,
    relative: &str,
    namespace: Option<&str>,
) -> Vec<DynamicObject> {
    let mut applied = Vec::new();
    for document in documents(&repo_path(relative)) {
        let result = apply_strict(client, &document, namespace).await;
        applied.push(result.unwrap_or_else(|e| panic!("apply {relative}: {e}")));
    }
    applied
}

/// The claims API of a namespace, untyped so that tests can send what the types cannot express.
pub fn claims(client: &Client, namespace: &str) -> Api<DynamicObject> {
    let resource = kube::api::ApiResource::erase::<banlieue_api::VirtualMachineClaim>(&());
    Api::namespaced_with(client.clone(), namespace, &resource)
}

pub fn claim(name: &str, issuer: &str, id: &str) -> Value {
    json!({
        "apiVersion": "banlieue.io/v1alpha1",
        "kind": "VirtualMachineClaim",
        "metadata": { "name": name },
        "spec": {
            "poolRef": { "name": "sandbox-pool" },
            "subject": { "issuer": issuer, "id": id },
            "ttlSeconds": 900
        }
    })
}

/// Creates an object from JSON; the API server's answer, error included.
pub async fn create(api: &Api<DynamicObject>, object: Value) -> Result<DynamicObject, Error> {
    let object: DynamicObject = serde_json::from_value(object).expect("a valid object");
    api.create(&PostParams::default(), &object).await
}

/// The API server's refusal: (HTTP code, message). Panics if the call succeeded.
pub fn refusal<T: std::fmt::Debug>(result: Result<T, Error>) -> (u16, String) {
    match result {
        Err(Error::Api(status)) => (status.code, status.message.clone()),
        other => panic!("expected the API server to refuse, got {other:?}"),
    }
}

/// A dry-run create of a claim naming `(issuer, id)`: admission runs in full, nothing is stored.
pub async fn try_claim(
    api: &Api<DynamicObject>,
    issuer: &str,
    id: &str,
) -> Result<DynamicObject, Error> {
    dry_run_create(api, claim("probe", issuer, id)).await
}

/// A dry-run create of `object`: what admission says, with nothing stored.
pub async fn dry_run_create(
    api: &Api<DynamicObject>,
    object: Value,
) -> Result<DynamicObject, Error> {
    let object: DynamicObject = serde_json::from_value(object).expect("object");
    api.create(
        &PostParams {
            dry_run: true,
            ..PostParams::default()
        },
        &object,
    )
    .await
}

/// The message of a 403 refusal (a failed validation). Panics on anything else.
pub fn forbidden(result: Result<DynamicObject, Error>) -> String {
    let (code, message) = refusal(result);
    assert_eq!(code, 403, "{message}");
    message
}

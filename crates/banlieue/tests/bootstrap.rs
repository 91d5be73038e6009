//! `banlieue bootstrap` against a real API server: everything applies, a second run changes
//! nothing, the admission policy is left for the operator to apply, and `--image` names the
//! controller's image; it replaces an earlier release's per-Provider ClusterRoleBindings and
//! keeps the Provider accounts the operator added to the shared one.

use banlieue::apply::Change;
use banlieue::bootstrap;
use banlieue_testenv::control_plane::ControlPlane;
use k8s_openapi::api::apps::v1::Deployment;
use kube::api::{Api, DynamicObject};
use kube::discovery::ApiResource;

const BIN: &str = env!("CARGO_BIN_EXE_banlieue");

/// Bootstrap's objects are cluster-wide and the control plane is shared: the tests that apply
/// them take turns, or one would see the other's changes.
static CLUSTER_WIDE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test]
async fn bootstrap_is_idempotent_and_leaves_admission_alone() {
    let _turn = CLUSTER_WIDE.lock().await;
    let control_plane = ControlPlane::shared().await.expect("control plane");
    let client = control_plane.client().unwrap();
    let objects = bootstrap::bootstrap_objects().unwrap();

    let first = bootstrap::apply_all(&client, &objects, |_| {})
        .await
        .unwrap();
    assert_eq!(first.len(), objects.len());
    let second = bootstrap::apply_all(&client, &objects, |_| {})
        .await
        .unwrap();
    let changed: Vec<_> = second
        .iter()
        .filter(|a| a.change != Change::Unchanged)
        .collect();
    assert!(changed.is_empty(), "second bootstrap changed {changed:?}");

    // Every CRD is served after bootstrap.
    for crd in banlieue_api::crds() {
        let names = &crd.spec.names;
        let resource = ApiResource {
            group: crd.spec.group.clone(),
            version: "v1alpha1".into(),
            api_version: format!("{}/v1alpha1", crd.spec.group),
            kind: names.kind.clone(),
            plural: names.plural.clone(),
        };
        let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
        api.list(&Default::default())
            .await
            .unwrap_or_else(|e| panic!("{} not served: {e}", names.plural));
    }

    // The claim-subject policy is not part of bootstrap.
    let policies: Api<k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicy> =
        Api::all(client.clone());
    let names: Vec<String> = policies
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|p| p.metadata.name)
        .collect();
    assert!(
        names.iter().all(|n| !n.contains("banlieue")),
        "bootstrap applied an admission policy: {names:?}"
    );
}

/// The image of the controller container of the applied Deployment.
async fn controller_image(client: &kube::Client) -> String {
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), "banlieue-system");
    let deployment = deployments.get("banlieue-controller").await.unwrap();
    let containers = deployment.spec.template.spec.unwrap().containers;
    let controller = containers.iter().find(|c| c.name == "controller").unwrap();
    controller.image.clone().unwrap()
}

/// `banlieue bootstrap ARGS` as an operator runs it, with the control plane's admin kubeconfig;
/// against an external cluster (no kubeconfig file here), the same function in process.
async fn run_bootstrap(control_plane: &ControlPlane, image: Option<&str>) {
    let Some(kubeconfig) = control_plane.kubeconfig("admin") else {
        let client = control_plane.client().unwrap();
        let image = image.unwrap_or(bootstrap::DEFAULT_IMAGE);
        return bootstrap::run(client, image).await.unwrap();
    };
    let mut command = tokio::process::Command::new(BIN);
    command.arg("bootstrap").env("KUBECONFIG", kubeconfig);
    if let Some(image) = image {
        command.args(["--image", image]);
    }
    let output = command.output().await.unwrap();
    assert!(
        output.status.success(),
        "banlieue bootstrap failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

#[tokio::test]
async fn bootstrap_image_names_the_controller_image() {
    let _turn = CLUSTER_WIDE.lock().await;
    let control_plane = ControlPlane::shared().await.expect("control plane");
    let client = control_plane.client().unwrap();

    let pushed = "registry.test:5000/team/banlieue@sha256:\
                  0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
    run_bootstrap(control_plane, Some(pushed)).await;
    assert_eq!(controller_image(&client).await, pushed);

    // Without the flag, the image this binary is built as: the crate's version.
    run_bootstrap(control_plane, None).await;
    assert_eq!(controller_image(&client).await, bootstrap::DEFAULT_IMAGE);
    assert_eq!(
        bootstrap::DEFAULT_IMAGE,
        format!("localhost/banlieue:{}", env!("CARGO_PKG_VERSION"))
    );
}

#[tokio::test]
async fn bootstrap_replaces_per_provider_bindings_and_keeps_the_operators_subjects() {
    use k8s_openapi::api::rbac::v1::{ClusterRoleBinding, Subject};
    use kube::api::{DeleteParams, PostParams};
    let _turn = CLUSTER_WIDE.lock().await;
    let control_plane = ControlPlane::shared().await.expect("control plane");
    let client = control_plane.client().unwrap();
    run_bootstrap(control_plane, None).await;
    let bindings: Api<ClusterRoleBinding> = Api::all(client.clone());
    let binding = |name: &str, role: &str| -> ClusterRoleBinding {
        serde_json::from_value(serde_json::json!({
            "metadata": { "name": name,
                          "labels": { "app.kubernetes.io/managed-by": "banlieue-operator" } },
            "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role },
            "subjects": [{ "kind": "ServiceAccount", "name": "banlieue-provider-old", "namespace": "old" }]
        }))
        .unwrap()
    };
    // An earlier release's binding, and one of the same label to another role (not ours).
    let legacy = "banlieue-provider-old-old-0011aabb";
    let other = "banlieue-bootstrap-test-other-role";
    for (name, role) in [
        (legacy, "banlieue-provider-cluster"),
        (other, "banlieue-provider-base"),
    ] {
        let _ = bindings.delete(name, &DeleteParams::default()).await;
        bindings
            .create(&PostParams::default(), &binding(name, role))
            .await
            .unwrap();
    }
    // The operator's account in the shared binding, as the operator adds it (an update).
    let mut shared = bindings.get("banlieue-providers").await.unwrap();
    let ours = Subject {
        kind: "ServiceAccount".into(),
        name: "banlieue-provider-edge".into(),
        namespace: Some("bootstrap-test".into()),
        api_group: None,
    };
    let mut subjects = shared.subjects.clone().unwrap_or_default();
    subjects.retain(|s| s != &ours);
    subjects.push(ours.clone());
    shared.subjects = Some(subjects);
    bindings
        .replace("banlieue-providers", &PostParams::default(), &shared)
        .await
        .unwrap();

    run_bootstrap(control_plane, None).await;
    assert!(
        bindings.get_opt(legacy).await.unwrap().is_none(),
        "legacy binding kept"
    );
    assert!(
        bindings.get_opt(other).await.unwrap().is_some(),
        "another role's binding deleted"
    );
    let shared = bindings.get("banlieue-providers").await.unwrap();
    assert!(
        shared.subjects.unwrap_or_default().contains(&ours),
        "bootstrap dropped the operator's subject"
    );
    bindings
        .delete(other, &DeleteParams::default())
        .await
        .unwrap();
}

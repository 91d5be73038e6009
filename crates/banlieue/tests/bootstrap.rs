//! `banlieue bootstrap` against a real API server: everything applies, the isolation policies
//! included, a second run changes nothing and keeps the site's edits of the policies'
//! ConfigMaps, and `--image` names the
//! controller's image; it replaces an earlier release's per-Provider ClusterRoleBindings and
//! keeps the Provider accounts the operator added to the shared one.

use banlieue::apply::Change;
use banlieue::bootstrap;
use banlieue_testenv::control_plane::ControlPlane;
use banlieue_testenv::manifests::{assert_same, by_identity};
use k8s_openapi::api::apps::v1::Deployment;
use kube::api::{Api, DynamicObject};
use kube::discovery::ApiResource;

const BIN: &str = env!("CARGO_BIN_EXE_banlieue");

/// Bootstrap's objects are cluster-wide and the control plane is shared: the tests that apply
/// them take turns, or one would see the other's changes.
static CLUSTER_WIDE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test]
async fn bootstrap_is_idempotent_applies_the_policies_and_keeps_the_sites_configmaps() {
    let _turn = CLUSTER_WIDE.lock().await;
    let control_plane = ControlPlane::shared().await.expect("control plane");
    let client = control_plane.client().unwrap();
    let mut objects = bootstrap::bootstrap_objects().unwrap();
    objects.extend(bootstrap::admission_objects(bootstrap::DEFAULT_IMAGE).unwrap());

    // Everything applies; only the claim-protection policy is skipped, and only where its API
    // is not served (before Kubernetes v1.36).
    let skipped = if serves_mutating_policies(&client).await {
        0
    } else {
        2
    };
    let first = bootstrap::apply_each(&client, &objects, |_| {}).await;
    assert!(first.failed.is_empty(), "{:?}", first.failed);
    assert_eq!(first.skipped.len(), skipped, "{:?}", first.skipped);
    assert_eq!(first.applied.len(), objects.len() - skipped);
    let second = bootstrap::apply_each(&client, &objects, |_| {}).await;
    let changed: Vec<_> = second
        .applied
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

    // Every isolation policy is in force, each bound.
    let policies: Api<k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicy> =
        Api::all(client.clone());
    let bindings: Api<
        k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicyBinding,
    > = Api::all(client.clone());
    for policy in objects.iter().filter(|o| {
        o.types
            .as_ref()
            .is_some_and(|t| t.kind == "ValidatingAdmissionPolicy")
    }) {
        let name = policy.metadata.name.as_deref().unwrap_or_default();
        assert!(policies.get_opt(name).await.unwrap().is_some(), "{name}");
        assert!(bindings.get_opt(name).await.unwrap().is_some(), "{name}");
    }

    // The site lists its issuers; the next bootstrap leaves them.
    let config_maps: Api<k8s_openapi::api::core::v1::ConfigMap> =
        Api::namespaced(client.clone(), "banlieue-system");
    let edited = serde_json::json!({"data": {"issuers": "https://login.site.test=oidc:\n"}});
    config_maps
        .patch(
            "banlieue-claim-subject-policy",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&edited),
        )
        .await
        .unwrap();
    let third = bootstrap::apply_each(&client, &objects, |_| {}).await;
    assert!(third.failed.is_empty(), "{:?}", third.failed);
    let kept = config_maps
        .get("banlieue-claim-subject-policy")
        .await
        .unwrap();
    assert_eq!(
        kept.data
            .unwrap_or_default()
            .get("issuers")
            .map(String::as_str),
        Some("https://login.site.test=oidc:\n"),
        "a second bootstrap set the site's issuers back"
    );
    // Back to the shipped placeholder for the other tests.
    let shipped = serde_json::json!({"data": {"issuers": "https://issuer.example.com\n"}});
    config_maps
        .patch(
            "banlieue-claim-subject-policy",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&shipped),
        )
        .await
        .unwrap();
}

/// Whether the cluster serves MutatingAdmissionPolicy v1 (Kubernetes v1.36 and later).
async fn serves_mutating_policies(client: &kube::Client) -> bool {
    banlieue_testenv::manifests::serves_mutating_admission_policies(client)
        .await
        .expect("admissionregistration.k8s.io/v1")
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
        return bootstrap::run(client, image, true).await.unwrap();
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
    // The workload policy lets both run (each install adds its image, keeping the list).
    let listed = kube::Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(
        client.clone(),
        "banlieue-system",
    )
    .get("banlieue-workload-images")
    .await
    .unwrap()
    .data
    .unwrap_or_default()
    .remove("images")
    .unwrap_or_default();
    for image in [pushed, bootstrap::DEFAULT_IMAGE] {
        assert!(
            listed.lines().any(|l| l.trim() == image),
            "{image} is not in {listed:?}"
        );
    }
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

/// `kubectl apply -k deploy/`, the install without the binary (deploy/kustomization.yaml):
/// kustomize renders exactly the objects `banlieue bootstrap` applies; an overlay's `images:`
/// sets what `bootstrap --image` sets (the controller's and the image builder's image, and the
/// image builder's BANLIEUE_IMAGE); and the overlay applied to the API server installs the
/// controller with that image.
#[tokio::test]
async fn the_kustomize_base_is_what_bootstrap_applies() {
    let kubectl = banlieue_testenv::control_plane::bin_dir().join("kubectl");
    if !kubectl.is_file() && std::env::var_os("BANLIEUE_ALLOW_MISSING_PEERS").is_some() {
        eprintln!("SKIPPED: no kubectl (BANLIEUE_ALLOW_MISSING_PEERS is set)");
        return;
    }
    let deploy = banlieue_testenv::repo_path("deploy");
    let render = |dir: &std::path::Path| {
        let out = std::process::Command::new(&kubectl)
            .arg("kustomize")
            .arg(dir)
            .output()
            .expect("run kubectl kustomize");
        assert!(
            out.status.success(),
            "kubectl kustomize {}: {}",
            dir.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8(out.stdout).expect("UTF-8");
        cel_spaced(by_identity(
            &bootstrap::objects_of(&[("kustomize", text.as_str())]).expect("objects"),
        ))
    };
    let by_identity = |objects: &[DynamicObject]| cel_spaced(by_identity(objects));
    let mut expected = bootstrap::bootstrap_objects().expect("bootstrap's objects");
    let mut installed = expected.clone();
    installed.extend(bootstrap::admission_objects(bootstrap::DEFAULT_IMAGE).expect("policies"));
    assert_same("kustomize", &render(&deploy), &by_identity(&installed));

    let pushed = ("registry.test:5000/team/banlieue", "1.2.3");
    let overlay = tempfile::tempdir().expect("a temporary directory");
    banlieue_testenv::manifests::write_image_overlay(overlay.path(), pushed.0, pushed.1)
        .expect("write the overlay");
    let image = format!("{}:{}", pushed.0, pushed.1);
    bootstrap::set_controller_image(&mut expected, &image).expect("the controller's image");
    bootstrap::set_imagebuilder_image(&mut expected, &image);
    expected.extend(bootstrap::admission_objects(&image).expect("policies"));
    assert_same(
        "kustomize",
        &render(overlay.path()),
        &by_identity(&expected),
    );

    let _turn = CLUSTER_WIDE.lock().await;
    let control_plane = ControlPlane::shared().await.expect("control plane");
    let client = control_plane.client().unwrap();
    if !serves_mutating_policies(&client).await {
        // Before Kubernetes v1.36 the overlay leaves out the claim-protection policy, as the
        // README says (the controller adds the finalizer itself), and renders the rest.
        banlieue_testenv::manifests::leave_out_claim_protection(overlay.path())
            .expect("patch the overlay");
        let without: Vec<DynamicObject> = expected
            .iter()
            .filter(|o| {
                !o.types
                    .as_ref()
                    .is_some_and(|t| t.kind.starts_with("MutatingAdmissionPolicy"))
            })
            .cloned()
            .collect();
        assert_same("kustomize", &render(overlay.path()), &by_identity(&without));
    }
    let kubeconfig = control_plane.kubeconfig("admin").expect("admin kubeconfig");
    let out = std::process::Command::new(&kubectl)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args([
            "apply",
            "--server-side",
            "--force-conflicts",
            "--field-manager",
            "kustomize-test",
            "-k",
        ])
        .arg(overlay.path())
        .output()
        .expect("run kubectl apply -k");
    assert!(
        out.status.success(),
        "kubectl apply -k: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(controller_image(&client).await, image);
    // Back to what the other tests expect; bootstrap takes the fields over.
    run_bootstrap(control_plane, None).await;
}

/// The objects with every string of an admission policy's spec reduced to single spaces.
/// kustomize re-folds the policies' `>-` scalars, turning a line break before a more-indented
/// line into two; CEL reads any run of whitespace between tokens alike, and no expression of
/// ours has a line break inside a string literal, so the policies are the same.
fn cel_spaced(
    mut objects: std::collections::BTreeMap<String, serde_json::Value>,
) -> std::collections::BTreeMap<String, serde_json::Value> {
    fn spaced(value: &mut serde_json::Value) {
        match value {
            serde_json::Value::String(s) => {
                *s = s.split_whitespace().collect::<Vec<_>>().join(" ");
            }
            serde_json::Value::Array(items) => items.iter_mut().for_each(spaced),
            serde_json::Value::Object(fields) => fields.values_mut().for_each(spaced),
            _ => {}
        }
    }
    for object in objects.values_mut() {
        if object["kind"] == "ValidatingAdmissionPolicy" {
            spaced(&mut object["spec"]);
        }
    }
    objects
}

/// Bootstrap applies every object it can: an object the cluster cannot take does not stop the
/// ones after it and is named; the claim-protection policy, where its API is not served (a
/// cluster before MutatingAdmissionPolicy v1), is skipped saying what stands in for it. The
/// test control plane is inside the supported window.
#[tokio::test]
async fn bootstrap_applies_what_it_can_and_names_what_it_could_not() {
    let control_plane = ControlPlane::shared().await.expect("control plane");
    let client = control_plane.client().unwrap();
    let info = client.apiserver_version().await.expect("/version");
    banlieue::supported_kubernetes::check(&info).expect("the test cluster is supported");

    let namespace = control_plane.fresh_namespace().await.expect("a namespace");
    let config_map = |name: &str, namespace: &str| {
        format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\n  namespace: {namespace}\n"
        )
    };
    let manifest = [
        config_map("first", &namespace),
        // The claim-protection policy at an API version no cluster serves.
        "apiVersion: admissionregistration.k8s.io/v9\nkind: MutatingAdmissionPolicy\n\
         metadata:\n  name: banlieue-claim-protection\n"
            .to_owned(),
        // Anything else the cluster cannot take is a failure, named.
        "apiVersion: widgets.example.com/v1\nkind: Widget\nmetadata:\n  name: w\n".to_owned(),
        config_map("orphan", "no-such-namespace"),
        config_map("last", &namespace),
    ]
    .join("---\n");
    let objects = bootstrap::objects_of(&[("test", manifest.as_str())]).expect("objects");
    let mut said = Vec::new();
    let report = bootstrap::apply_each(&client, &objects, |line| said.push(line.to_owned())).await;
    assert_eq!(report.applied.len(), 2, "{said:#?}");
    assert_eq!(report.skipped.len(), 1, "{said:#?}");
    assert!(
        report.skipped[0].contains("MutatingAdmissionPolicy/banlieue-claim-protection")
            && report.skipped[0].contains("the controller adds banlieue.io/claim-protection"),
        "{said:#?}"
    );
    assert_eq!(report.failed.len(), 2, "{said:#?}");
    assert!(report.failed[0].contains("Widget/w"), "{said:#?}");
    assert!(
        report.failed[1].contains("ConfigMap/no-such-namespace/orphan"),
        "{said:#?}"
    );
    let config_maps: Api<k8s_openapi::api::core::v1::ConfigMap> =
        Api::namespaced(client, &namespace);
    for name in ["first", "last"] {
        assert!(
            config_maps.get_opt(name).await.unwrap().is_some(),
            "{name} was not applied: {said:#?}"
        );
    }
}

/// What bootstrap says of the artifacts volume, against the API server: nothing for the
/// shipped ReadWriteOnce PVC on one node, a note that every Job runs on the volume's node once
/// a second schedulable node joins, nothing more for an unschedulable one.
#[tokio::test]
async fn a_read_write_once_artifacts_volume_is_named_on_more_than_one_node() {
    use k8s_openapi::api::core::v1::{Node, PersistentVolumeClaim};
    use kube::api::{DeleteParams, PostParams};
    let _turn = CLUSTER_WIDE.lock().await;
    let control_plane = ControlPlane::shared().await.expect("control plane");
    let client = control_plane.client().unwrap();
    run_bootstrap(control_plane, None).await;

    let said = banlieue::artifacts_volume::check(&client).await.unwrap();
    assert!(
        said.as_deref()
            .is_some_and(|s| s.contains("does not exist yet")),
        "{said:?}"
    );
    let text = std::fs::read_to_string(banlieue_testenv::repo_path(
        "deploy/imagebuild/artifacts-pvc.yaml",
    ))
    .unwrap();
    let shipped = bootstrap::objects_of(&[("artifacts-pvc.yaml", text.as_str())]).unwrap();
    let pvc: PersistentVolumeClaim =
        serde_json::from_value(serde_json::to_value(&shipped[0]).unwrap()).unwrap();
    let claims: Api<PersistentVolumeClaim> =
        Api::namespaced(client.clone(), banlieue::artifacts_volume::NAMESPACE);
    claims.create(&PostParams::default(), &pvc).await.unwrap();

    let nodes: Api<Node> = Api::all(client.clone());
    let existing = nodes.list(&Default::default()).await.unwrap().items.len();
    let node = |name: &str, unschedulable: bool| -> Node {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name},
            "spec": {"unschedulable": unschedulable},
        }))
        .unwrap()
    };
    // Node objects alone: the API server counts them; no kubelet is needed to be counted.
    let mut made = Vec::new();
    for i in existing..2 {
        let name = format!("artifacts-test-{i}");
        nodes
            .create(&PostParams::default(), &node(&name, false))
            .await
            .unwrap();
        made.push(name);
    }
    let said = banlieue::artifacts_volume::check(&client).await.unwrap();
    assert!(
        said.as_deref().is_some_and(
            |s| s.contains("is ReadWriteOnce and the cluster has 2 schedulable nodes")
        ),
        "{said:?}"
    );
    // A cordoned node takes no Jobs.
    nodes
        .create(
            &PostParams::default(),
            &node("artifacts-test-cordoned", true),
        )
        .await
        .unwrap();
    made.push("artifacts-test-cordoned".into());
    let said = banlieue::artifacts_volume::check(&client).await.unwrap();
    assert!(
        said.as_deref()
            .is_some_and(|s| s.contains("has 2 schedulable")),
        "{said:?}"
    );

    for name in made {
        nodes.delete(&name, &DeleteParams::default()).await.unwrap();
    }
    claims
        .delete(banlieue::artifacts_volume::CLAIM, &DeleteParams::default())
        .await
        .unwrap();
}

//! The Helm chart (`deploy/helm/banlieue`) with the real `helm` (built from the Go module proxy
//! by `scripts/control-plane build-helm`): `helm lint` passes; `helm template` renders exactly
//! the objects `banlieue bootstrap` applies, modulo the annotation that keeps CRDs on
//! uninstall, with the image, replicas and resources of the values; with `admission.enabled`
//! also deploy/admission/ with the site's issuers, brokers and images; and `helm install`,
//! `upgrade` and `uninstall` against a real API server install, change and remove the release
//! while the CRDs and namespaces, and so every stored claim, pool and machine, stay.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;

use banlieue::bootstrap;
use banlieue_testenv::control_plane::{ControlPlane, ControlPlaneOptions};
use banlieue_testenv::manifests::{assert_same, by_identity};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DynamicObject, PostParams};
use serde_json::{Value, json};

/// The annotation the chart adds to each CRD and namespace, and nothing else does.
const KEEP: &str = "helm.sh/resource-policy";
/// The API of the claim-protection policy, as helm names a served kind.
const MUTATING_POLICY: &str = "admissionregistration.k8s.io/v1/MutatingAdmissionPolicy";

struct Helm {
    binary: PathBuf,
    home: tempfile::TempDir,
}

impl Helm {
    /// The helm the set-up built, or None where it is allowed to be missing.
    fn find() -> Option<Helm> {
        let binary = banlieue_testenv::control_plane::bin_dir().join("helm");
        if !binary.is_file() {
            assert!(
                std::env::var_os("BANLIEUE_ALLOW_MISSING_PEERS").is_some(),
                "no helm at {}: run scripts/setup helm",
                binary.display()
            );
            eprintln!("SKIPPED: no helm (BANLIEUE_ALLOW_MISSING_PEERS is set)");
            return None;
        }
        let home = tempfile::tempdir().expect("a home for helm");
        Some(Helm { binary, home })
    }

    /// Runs helm with `args`; its configuration and caches in a directory of the test's own.
    fn run(&self, args: &[&str]) -> String {
        let out = Command::new(&self.binary)
            .args(args)
            .env("HELM_CACHE_HOME", self.home.path().join("cache"))
            .env("HELM_CONFIG_HOME", self.home.path().join("config"))
            .env("HELM_DATA_HOME", self.home.path().join("data"))
            .output()
            .expect("run helm");
        assert!(
            out.status.success(),
            "helm {args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).expect("UTF-8")
    }

    /// `helm template` of the chart with `sets`, as objects by identity, for a cluster that
    /// serves MutatingAdmissionPolicy v1 (Kubernetes v1.36 and later): helm's own list of API
    /// versions does not name it.
    fn template(&self, sets: &[&str]) -> BTreeMap<String, Value> {
        self.template_with(&["--api-versions", MUTATING_POLICY], sets)
    }

    fn template_with(&self, options: &[&str], sets: &[&str]) -> BTreeMap<String, Value> {
        let chart = chart();
        let mut args = vec!["template", "banlieue", chart.to_str().expect("UTF-8 path")];
        args.extend(options);
        for set in sets {
            args.extend(["--set", set]);
        }
        let text = self.run(&args);
        by_identity(&bootstrap::objects_of(&[("helm template", text.as_str())]).expect("objects"))
    }
}

fn chart() -> PathBuf {
    banlieue_testenv::repo_path("deploy/helm/banlieue")
}

/// Takes the chart's keep annotation off every CRD and namespace of `rendered`, checking each
/// had it.
fn without_keep(mut rendered: BTreeMap<String, Value>) -> BTreeMap<String, Value> {
    for (key, object) in rendered.iter_mut() {
        if object["kind"] != "CustomResourceDefinition" && object["kind"] != "Namespace" {
            continue;
        }
        let annotations = object["metadata"]["annotations"]
            .as_object_mut()
            .unwrap_or_else(|| panic!("{key} has no annotations"));
        assert_eq!(annotations.remove(KEEP), Some(json!("keep")), "{key}");
        if annotations.is_empty() {
            object["metadata"]
                .as_object_mut()
                .expect("metadata")
                .remove("annotations");
        }
    }
    rendered
}

#[test]
fn the_chart_lints_and_renders_what_bootstrap_applies() {
    let Some(helm) = Helm::find() else { return };
    helm.run(&["lint", "--strict", chart().to_str().expect("UTF-8 path")]);

    // The defaults: bootstrap's objects and its isolation policies, the claim-protection
    // policy included (helm's own API versions serve it).
    let with_admission = |mut objects: Vec<DynamicObject>, image: &str| {
        objects.extend(bootstrap::admission_objects(image).expect("the admission objects"));
        objects
    };
    let installed = || {
        with_admission(
            bootstrap::bootstrap_objects().expect("bootstrap's objects"),
            bootstrap::DEFAULT_IMAGE,
        )
    };
    let expected = by_identity(&installed());
    assert_same(
        "helm template",
        &without_keep(helm.template(&[])),
        &expected,
    );

    // The image, replicas and resources of the values, where bootstrap --image puts the image.
    let image = "registry.test:5000/team/banlieue:1.2.3";
    let mut objects = bootstrap::bootstrap_objects().expect("bootstrap's objects");
    bootstrap::set_controller_image(&mut objects, image).expect("the controller's image");
    bootstrap::set_imagebuilder_image(&mut objects, image);
    let mut expected = by_identity(&with_admission(objects.clone(), image));
    let controller = expected
        .get_mut("apps/v1 Deployment banlieue-system/banlieue-controller")
        .expect("the controller");
    controller["spec"]["replicas"] = json!(3);
    controller["spec"]["template"]["spec"]["containers"][0]["resources"] =
        json!({"requests": {"cpu": "100m", "memory": "128Mi"}});
    let rendered = helm.template(&[
        &format!("image={image}"),
        "controller.replicas=3",
        "controller.resources.requests.cpu=100m",
        "controller.resources.requests.memory=128Mi",
    ]);
    assert_same("helm template", &without_keep(rendered), &expected);

    // Namespaces made elsewhere, and no claim-protection policy: bootstrap's objects but those.
    let mutating = |o: &Value| {
        o["kind"]
            .as_str()
            .is_some_and(|k| k.starts_with("MutatingAdmissionPolicy"))
    };
    let rendered = helm.template(&["namespaces.create=false", "claimProtection=false"]);
    let expected: BTreeMap<String, Value> = by_identity(&installed())
        .into_iter()
        .filter(|(_, o)| o["kind"] != "Namespace" && !mutating(o))
        .collect();
    assert_same("helm template", &without_keep(rendered), &expected);
    // A cluster that does not serve the policy's API (before v1.36) gets everything but it,
    // as bootstrap skips it there.
    let rendered = helm.template_with(&[], &[]);
    let expected: BTreeMap<String, Value> = by_identity(&installed())
        .into_iter()
        .filter(|(_, o)| !mutating(o))
        .collect();
    assert_same("helm template", &without_keep(rendered), &expected);

    // The opt-out: bootstrap's objects alone, as `bootstrap --without-admission` applies.
    let rendered = without_keep(helm.template(&["admission.enabled=false"]));
    let expected = by_identity(&bootstrap::bootstrap_objects().expect("bootstrap's objects"));
    assert_same("helm template", &rendered, &expected);

    // The admission policies, with the site's ConfigMaps.
    let rendered = without_keep(helm.template(&[
        &format!("image={image}"),
        "admission.issuers={https://issuer.a.test=oidc-a:,https://issuer.b.test=oidc-b:}",
        "admission.brokers={oidc-b:broker}",
        "admission.administrators={oidc-a:ops}",
        "admission.workloadImages={registry.test:5000/team/provider:7}",
    ]));
    let mut expected = by_identity(&with_admission(objects, image));
    for (key, data) in [
        (
            "v1 ConfigMap banlieue-system/banlieue-claim-subject-policy",
            json!({"issuers": "https://issuer.a.test=oidc-a:\nhttps://issuer.b.test=oidc-b:\n",
                   "brokers": "oidc-b:broker", "administrators": "oidc-a:ops"}),
        ),
        (
            "v1 ConfigMap banlieue-system/banlieue-workload-images",
            json!({"images": format!("{image}\nregistry.test:5000/team/provider:7"),
                   "importAccounts": ""}),
        ),
    ] {
        expected.get_mut(key).unwrap_or_else(|| panic!("no {key}"))["data"] = data;
    }
    assert_same("helm template", &rendered, &expected);
}

/// `helm install`, `upgrade` and `uninstall` against the API server (no node: the objects,
/// not the pods): the release makes bootstrap's objects, an upgrade changes the controller's
/// image and replicas, and uninstalling removes the Deployments but keeps every CRD and
/// namespace, and a pool stored in them.
#[tokio::test]
async fn install_upgrade_and_uninstall_keep_what_users_stored() {
    let Some(helm) = Helm::find() else { return };
    // A cluster without banlieue: Helm refuses to adopt CRDs it did not make.
    let control_plane =
        ControlPlane::start_with(ControlPlaneOptions::default().without_banlieue_crds())
            .await
            .expect("control plane");
    let kubeconfig = control_plane
        .kubeconfig("admin")
        .expect("admin kubeconfig")
        .to_path_buf();
    let client = control_plane.client().unwrap();
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let chart = chart();
    let release = |verb: &str, sets: &[&str]| {
        let mut args = vec![
            verb,
            "banlieue",
            chart.to_str().expect("UTF-8 path"),
            "--kubeconfig",
            kubeconfig.to_str().expect("UTF-8 path"),
            "--namespace",
            "banlieue-helm",
            "--create-namespace",
        ];
        for set in sets {
            args.extend(["--set", set]);
        }
        helm.run(&args)
    };
    release("install", &["image=registry.test/banlieue:1"]);
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), "banlieue-system");
    let controller = deployments.get("banlieue-controller").await.unwrap();
    assert_eq!(image_of(&controller), "registry.test/banlieue:1");
    assert_eq!(controller.spec.replicas, Some(2));

    // Something a user stored, under one of the chart's CRDs.
    let pools = Api::<DynamicObject>::namespaced_with(
        client.clone(),
        "banlieue-system",
        &kube::api::ApiResource::erase::<banlieue_api::VirtualMachinePool>(&()),
    );
    let pool: DynamicObject = serde_json::from_value(
        serde_json::to_value(banlieue_dev::objects::pool()).expect("a pool"),
    )
    .expect("a pool");
    pools.create(&PostParams::default(), &pool).await.unwrap();

    release(
        "upgrade",
        &["image=registry.test/banlieue:2", "controller.replicas=1"],
    );
    let controller = deployments.get("banlieue-controller").await.unwrap();
    assert_eq!(image_of(&controller), "registry.test/banlieue:2");
    assert_eq!(controller.spec.replicas, Some(1));
    assert!(
        pools
            .get_opt(banlieue_dev::objects::POOL)
            .await
            .unwrap()
            .is_some()
    );

    helm.run(&[
        "uninstall",
        "banlieue",
        "--kubeconfig",
        kubeconfig.to_str().expect("UTF-8 path"),
        "--namespace",
        "banlieue-helm",
        "--wait",
    ]);
    assert!(
        deployments
            .get_opt("banlieue-controller")
            .await
            .unwrap()
            .is_none()
    );
    for crd in banlieue_api::crds() {
        let name = crd.metadata.name.expect("a name");
        assert!(
            crds.get_opt(&name).await.unwrap().is_some(),
            "{name} was deleted"
        );
    }
    assert!(
        pools
            .get_opt(banlieue_dev::objects::POOL)
            .await
            .unwrap()
            .is_some(),
        "the stored pool went with the release"
    );
}

fn image_of(deployment: &Deployment) -> String {
    deployment
        .spec
        .template
        .spec
        .as_ref()
        .and_then(|s| s.containers.first())
        .and_then(|c| c.image.clone())
        .unwrap_or_default()
}

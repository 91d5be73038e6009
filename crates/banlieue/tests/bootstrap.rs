//! `banlieue bootstrap` against a real API server: everything applies, a second run changes
//! nothing, and the admission policy is left for the operator to apply.

use banlieue::apply::Change;
use banlieue::bootstrap;
use banlieue_testenv::control_plane::ControlPlane;
use kube::api::{Api, DynamicObject};
use kube::discovery::ApiResource;

#[tokio::test]
async fn bootstrap_is_idempotent_and_leaves_admission_alone() {
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

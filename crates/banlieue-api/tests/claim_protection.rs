//! deploy/claim-protection.yaml against the real API server: a claim is created holding the
//! controller's finalizer, whatever else its creator set, so the controller never spends a
//! write adding it. Its own binary: the binding is cluster-wide, and a claim holding the
//! finalizer is only released by a running controller.

mod common;

use std::time::Duration;

use banlieue_api::names;
use banlieue_testenv::control_plane::wait_for;
use common::{apply_file, claim, claims, control_plane, create};

fn finalizers(object: &kube::api::DynamicObject) -> Vec<String> {
    object.metadata.finalizers.clone().unwrap_or_default()
}

#[tokio::test]
async fn claims_are_created_holding_the_claim_protection_finalizer() {
    let cp = control_plane().await;
    let admin = cp.client().expect("admin client");
    let namespace = cp.fresh_namespace().await.expect("namespace");
    let api = claims(&admin, &namespace);

    let before = create(&api, claim("before", "https://issuer.example.com", "a"))
        .await
        .expect("create");
    assert!(
        finalizers(&before).is_empty(),
        "nothing adds it before the policy"
    );

    apply_file(&admin, "deploy/claim-protection.yaml", None).await;
    // A policy is in force once the admission plugin's informer has it.
    let mut n = 0;
    let first = wait_for("the policy in force", Duration::from_secs(30), || {
        n += 1;
        let api = api.clone();
        let name = format!("probe-{n}");
        async move {
            let created = create(&api, claim(&name, "https://issuer.example.com", "a")).await?;
            Ok((!finalizers(&created).is_empty()).then_some(created))
        }
    })
    .await
    .expect("the policy takes effect");
    assert_eq!(finalizers(&first), vec![names::FINALIZER_CLAIM_PROTECTION]);

    // The creator's own finalizers are kept, and the controller's is never doubled.
    let mut own = claim("own", "https://issuer.example.com", "a");
    own["metadata"]["finalizers"] =
        serde_json::json!(["example.com/audit", names::FINALIZER_CLAIM_PROTECTION]);
    let created = create(&api, own).await.expect("create");
    assert_eq!(
        finalizers(&created),
        vec!["example.com/audit", names::FINALIZER_CLAIM_PROTECTION]
    );
}

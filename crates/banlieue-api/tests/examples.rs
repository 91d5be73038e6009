//! Every example applies, as it is, to a real API server with strict field validation, and
//! reads back as the Rust types.

mod common;

use common::{apply_file, control_plane, documents, repo_path, yaml_files};
use serde_json::Value;

/// The example files the guides name, which must exist under these exact names.
const NAMED_BY_THE_GUIDES: &[&str] = &[
    "02-provider-libvirt-edge.yaml",
    "09-providerclass-libvirt.yaml",
    "17-virtualmachine-libvirt.yaml",
    "19-virtualmachinepool.yaml",
    "20-virtualmachineclaim.yaml",
];

fn parse_as<T: serde::de::DeserializeOwned>(object: &Value) -> T {
    serde_json::from_value(object.clone()).unwrap_or_else(|e| {
        panic!(
            "{} {} does not read back as its type: {e}",
            object["kind"], object["metadata"]["name"]
        )
    })
}

/// What the server stored reads back as banlieue-api's type of that kind.
fn check_type(object: &Value) {
    match object["kind"].as_str() {
        Some("Provider") => drop(parse_as::<banlieue_api::Provider>(object)),
        Some("ProviderClass") => drop(parse_as::<banlieue_api::ProviderClass>(object)),
        Some("VMImage") => drop(parse_as::<banlieue_api::VMImage>(object)),
        Some("VMClass") => drop(parse_as::<banlieue_api::VMClass>(object)),
        Some("VirtualMachine") => drop(parse_as::<banlieue_api::VirtualMachine>(object)),
        Some("VirtualMachinePool") => drop(parse_as::<banlieue_api::VirtualMachinePool>(object)),
        Some("VirtualMachineClaim") => drop(parse_as::<banlieue_api::VirtualMachineClaim>(object)),
        _ => {}
    }
}

#[tokio::test]
async fn every_example_applies_in_order_and_reads_back_as_its_type() {
    let cp = control_plane().await;
    let client = cp.client().expect("client");
    let files = yaml_files("examples");
    let names: Vec<String> = files
        .iter()
        .filter_map(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .collect();
    for named in NAMED_BY_THE_GUIDES {
        assert!(
            names.iter().any(|n| n == named),
            "examples/{named} is missing"
        );
    }

    let mut applied = 0;
    for name in &names {
        let relative = format!("examples/{name}");
        for document in documents(&repo_path(&relative)) {
            // The examples all live in banlieue-system (or are cluster-scoped).
            let namespace = document["metadata"]["namespace"].as_str();
            if document["kind"] != "Namespace" && document["kind"] != "ProviderClass" {
                assert_eq!(
                    namespace,
                    Some("banlieue-system"),
                    "{relative}: {}",
                    document["metadata"]["name"]
                );
            }
        }
        for object in apply_file(&client, &relative, None).await {
            let value = serde_json::to_value(&object).expect("JSON");
            check_type(&value);
            applied += 1;
        }
    }
    assert!(applied >= 10, "applied {applied} objects");

    // The server filled the defaults the guide relies on.
    let providers: kube::Api<banlieue_api::Provider> =
        kube::Api::namespaced(client.clone(), "banlieue-system");
    let edge = providers
        .get("libvirt-edge-host-7")
        .await
        .expect("the edge Provider");
    let ca = edge.spec.connection.ca_bundle.source();
    match ca {
        Some(banlieue_api::Source::ConfigMap(key)) => {
            assert_eq!(
                (key.name.as_str(), key.key.as_str()),
                ("libvirt-edge-ca", "ca.crt")
            );
        }
        other => panic!("caBundle should be the libvirt-edge-ca ConfigMap, got {other:?}"),
    }
    let classes: kube::Api<banlieue_api::ProviderClass> = kube::Api::all(client.clone());
    let libvirt = classes
        .get("libvirt")
        .await
        .expect("the libvirt ProviderClass");
    let jobs = libvirt
        .spec
        .additional_rules
        .iter()
        .find(|rule| rule.resources.as_deref() == Some(&["jobs".to_owned()][..]))
        .expect("a rule for jobs, so import Jobs do not fail with 403");
    assert_eq!(jobs.api_groups.as_deref(), Some(&["batch".to_owned()][..]));
    for verb in ["create", "get", "list", "watch", "delete"] {
        assert!(
            jobs.verbs.iter().any(|v| v == verb),
            "jobs rule lacks {verb}"
        );
    }
    let claims: kube::Api<banlieue_api::VirtualMachineClaim> =
        kube::Api::namespaced(client.clone(), "banlieue-system");
    let claim = claims
        .get("sandbox-for-alice")
        .await
        .expect("the example claim");
    assert_eq!(claim.spec.pool_ref.name, "sandbox-pool");
    assert_eq!(claim.spec.ttl_seconds, 900);
    // The saved pool's field is stored, not pruned.
    let pools: kube::Api<banlieue_api::VirtualMachinePool> =
        kube::Api::namespaced(client.clone(), "banlieue-system");
    let saved = pools.get("saved-pool").await.expect("the saved pool");
    assert_eq!(saved.spec.standby, Some(banlieue_api::Standby::Saved));
}

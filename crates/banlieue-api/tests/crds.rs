//! The CRD manifests: `deploy/crds/` matches the types, the YAML is faithful, and the schema
//! teaches the API (descriptions, printer columns, short names).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use banlieue_api::render;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, JSONSchemaProps,
};

/// Set to regenerate `deploy/crds/` from the types instead of comparing.
const UPDATE_ENV: &str = "BANLIEUE_UPDATE_CRDS";
const REGENERATE: &str = "cargo run -p banlieue -- crds --out deploy/crds \
     (or: BANLIEUE_UPDATE_CRDS=1 cargo test -p banlieue-api --test crds)";

fn crd_dir() -> PathBuf {
    banlieue_testenv::repo_path("deploy/crds")
}

fn yaml_files(dir: &Path) -> BTreeSet<String> {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(|entry| entry.ok())
                .map(|entry| entry.file_name().to_string_lossy().into_owned())
                .filter(|name| name.ends_with(".yaml"))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn deploy_crds_match_the_types() {
    let dir = crd_dir();
    let files = render::crd_files().expect("render the CRDs");
    let expected: BTreeSet<String> = files.iter().map(|(name, _)| name.clone()).collect();

    if std::env::var_os(UPDATE_ENV).is_some() {
        std::fs::create_dir_all(&dir).expect("create deploy/crds");
        for stale in yaml_files(&dir).difference(&expected) {
            std::fs::remove_file(dir.join(stale)).expect("remove a stale CRD file");
        }
        for (name, text) in &files {
            std::fs::write(dir.join(name), text).expect("write a CRD file");
        }
        return;
    }

    let mut drift = Vec::new();
    for (name, text) in &files {
        match std::fs::read_to_string(dir.join(name)) {
            Ok(committed) if committed == *text => {}
            Ok(_) => drift.push(format!("{name} differs from the types")),
            Err(_) => drift.push(format!("{name} is missing")),
        }
    }
    for extra in yaml_files(&dir).difference(&expected) {
        drift.push(format!("{extra} is not a CRD of banlieue-api"));
    }
    assert!(
        drift.is_empty(),
        "deploy/crds/ has drifted from crates/banlieue-api:\n  {}\nregenerate with: {REGENERATE}",
        drift.join("\n  ")
    );
}

#[test]
fn rendered_yaml_reads_back_as_the_crds() {
    let documents: Vec<serde_json::Value> =
        serde_saphyr::from_multiple(&render::crds_yaml()).expect("parse the rendered YAML");
    let expected: Vec<serde_json::Value> = banlieue_api::crds()
        .iter()
        .map(|crd| serde_json::to_value(crd).expect("CRD to JSON"))
        .collect();
    assert_eq!(documents.len(), expected.len());
    for (read, crd) in documents.iter().zip(&expected) {
        assert_eq!(read, crd, "a CRD changed on its way through YAML");
    }
}

#[test]
fn crd_yaml_snapshot() {
    insta::assert_snapshot!("crds", render::crds_yaml());
}

fn crd(plural: &str) -> CustomResourceDefinition {
    banlieue_api::crds()
        .into_iter()
        .find(|crd| crd.spec.names.plural == plural)
        .unwrap_or_else(|| panic!("no CRD {plural}"))
}

/// Every property of every schema, with its path.
fn properties<'a>(
    path: &str,
    schema: &'a JSONSchemaProps,
    out: &mut Vec<(String, &'a JSONSchemaProps)>,
) {
    for (name, property) in schema.properties.iter().flatten() {
        let path = format!("{path}.{name}");
        out.push((path.clone(), property));
        properties(&path, property, out);
    }
    if let Some(k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::JSONSchemaPropsOrArray::Schema(items)) = &schema.items {
        properties(&format!("{path}[]"), items, out);
    }
}

#[test]
fn every_field_has_a_description_for_kubectl_explain() {
    let mut missing = Vec::new();
    for crd in banlieue_api::crds() {
        for version in &crd.spec.versions {
            let schema = version
                .schema
                .as_ref()
                .and_then(|s| s.open_api_v3_schema.as_ref())
                .expect("a schema");
            if schema.description.as_deref().is_none_or(str::is_empty) {
                missing.push(crd.spec.names.kind.clone());
            }
            let mut all = Vec::new();
            properties(&crd.spec.names.kind, schema, &mut all);
            for (path, property) in all {
                let described = property
                    .description
                    .as_deref()
                    .is_some_and(|d| !d.is_empty() && !d.starts_with("Auto-generated"));
                if !described {
                    missing.push(path);
                }
            }
        }
    }
    assert!(
        missing.is_empty(),
        "fields without a description: {missing:#?}"
    );
}

fn columns(plural: &str) -> Vec<(String, String, String)> {
    crd(plural).spec.versions[0]
        .additional_printer_columns
        .iter()
        .flatten()
        .map(|c| (c.name.to_uppercase(), c.type_.clone(), c.json_path.clone()))
        .collect()
}

#[test]
fn claim_columns_are_name_pool_vm_phase_expires_age() {
    let columns = columns("virtualmachineclaims");
    let names: Vec<&str> = columns.iter().map(|(n, _, _)| n.as_str()).collect();
    // NAME is implicit: kubectl always prints it first.
    assert_eq!(names, ["POOL", "VM", "PHASE", "EXPIRES", "AGE"]);
    // A date column counts backwards from its timestamp; a deadline in the future would print
    // as <invalid>, so EXPIRES is a string holding the absolute time.
    assert_eq!(columns[3].1, "string");
    assert_eq!(columns[3].2, ".status.expiresAt");
    assert_eq!(columns[4].1, "date");
    assert_eq!(columns[4].2, ".metadata.creationTimestamp");
}

#[test]
fn pool_has_a_scale_subresource() {
    let pool = crd("virtualmachinepools");
    let scale = pool.spec.versions[0]
        .subresources
        .as_ref()
        .and_then(|s| s.scale.as_ref())
        .expect("scale subresource");
    assert_eq!(scale.spec_replicas_path, ".spec.replicas");
    assert_eq!(scale.status_replicas_path, ".status.replicas");
    assert_eq!(
        scale.label_selector_path.as_deref(),
        Some(".status.selector")
    );
}

/// KubeVirt's short names (kubevirt.io, pool.kubevirt.io, instancetype.kubevirt.io,
/// snapshot/export/clone/migrations, CDI), which a cluster running both must keep apart.
const KUBEVIRT_SHORT_NAMES: &[&str] = &[
    "vm",
    "vms",
    "vmi",
    "vmis",
    "vmirs",
    "vmirss",
    "vmipreset",
    "vmipresets",
    "vmim",
    "vmims",
    "vmpool",
    "vmpools",
    "vminstancetype",
    "vminstancetypes",
    "vmf",
    "vmfs",
    "vmclusterinstancetype",
    "vmclusterinstancetypes",
    "vmcf",
    "vmcfs",
    "vmpref",
    "vmprefs",
    "vmp",
    "vmps",
    "vmclusterpref",
    "vmclusterprefs",
    "vmcp",
    "vmcps",
    "vmsnapshot",
    "vmsnapshots",
    "vmss",
    "vmsnapshotcontent",
    "vmsnapshotcontents",
    "vmrestore",
    "vmrestores",
    "vmexport",
    "vmexports",
    "vmclone",
    "vmclones",
    "kv",
    "kvs",
    "dv",
    "dvs",
    "das",
    "dic",
    "dics",
    "cdi",
    "cdis",
    "migrationpolicy",
];

#[test]
fn short_names_are_ours_and_do_not_collide_with_kubevirt() {
    let mut seen = BTreeSet::new();
    let mut names = Vec::new();
    for crd in banlieue_api::crds() {
        let short = crd.spec.names.short_names.clone().unwrap_or_default();
        assert_eq!(
            crd.spec.names.categories.as_deref(),
            Some(&["banlieue".to_owned()][..]),
            "{} is in category banlieue",
            crd.spec.names.kind
        );
        for name in &short {
            assert!(
                !KUBEVIRT_SHORT_NAMES.contains(&name.as_str()),
                "{name} is a KubeVirt short name"
            );
            assert!(seen.insert(name.clone()), "{name} used twice");
        }
        names.push((crd.spec.names.kind.clone(), short));
    }
    // ADR-0056.
    let expected: Vec<(String, Vec<String>)> = [
        ("ProviderClass", "vmproviderclass"),
        ("Provider", "vmprovider"),
        ("VMImage", "vmimage"),
        ("VMClass", "vmclass"),
        ("VirtualMachine", "bvm"),
        ("LibvirtMachine", "lvmachine"),
        ("VSphereMachine", "vsmachine"),
        ("VirtualMachinePool", "bvmpool"),
        ("VirtualMachineClaim", "vmclaim"),
    ]
    .into_iter()
    .map(|(kind, short)| (kind.to_owned(), vec![short.to_owned()]))
    .collect();
    assert_eq!(names, expected);
}

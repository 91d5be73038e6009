//! Comparing sets of Kubernetes objects rendered by different installers (`banlieue bootstrap`,
//! kustomize, Helm): by identity, field by field, naming the first place two differ.

use std::collections::BTreeMap;
use std::path::Path;

use kube::api::DynamicObject;
use serde_json::Value;

/// Writes `dir/kustomization.yaml`: the README's overlay, the repository's `deploy/` with the
/// image `name:tag` set by `images:`. kustomize takes a base by a relative path only.
pub fn write_image_overlay(dir: &Path, name: &str, tag: &str) -> std::io::Result<()> {
    write_image_overlay_of(dir, &crate::repo_path("deploy"), name, tag)
}

/// [`write_image_overlay`] of another `deploy/` directory (an earlier release's).
pub fn write_image_overlay_of(
    dir: &Path,
    deploy: &Path,
    name: &str,
    tag: &str,
) -> std::io::Result<()> {
    let deploy = deploy.canonicalize()?;
    let up = dir
        .canonicalize()?
        .components()
        .skip(1)
        .map(|_| "..")
        .collect::<Vec<_>>()
        .join("/");
    std::fs::write(
        dir.join("kustomization.yaml"),
        format!(
            "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n\
             resources:\n  - {up}{}\n\
             images:\n  - name: localhost/banlieue\n    newName: {name}\n    newTag: \"{tag}\"\n",
            deploy.display()
        ),
    )
}

/// Appends to the overlay in `dir` what the README has users on Kubernetes before v1.36 add:
/// patches deleting the claim-protection MutatingAdmissionPolicy and its binding, whose API
/// those releases do not serve (the controller adds the claim finalizer itself there).
pub fn leave_out_claim_protection(dir: &Path) -> std::io::Result<()> {
    let file = dir.join("kustomization.yaml");
    let mut text = std::fs::read_to_string(&file)?;
    text.push_str("patches:\n");
    for kind in ["MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding"] {
        text.push_str(&format!(
            "  - patch: |\n      $patch: delete\n      \
             apiVersion: admissionregistration.k8s.io/v1\n      kind: {kind}\n      \
             metadata:\n        name: banlieue-claim-protection\n"
        ));
    }
    std::fs::write(file, text)
}

/// Whether the cluster serves MutatingAdmissionPolicy v1 (Kubernetes v1.36 and later), which
/// the claim-protection policy needs.
pub async fn serves_mutating_admission_policies(client: &kube::Client) -> kube::Result<bool> {
    Ok(client
        .list_api_group_resources("admissionregistration.k8s.io/v1")
        .await?
        .resources
        .iter()
        .any(|r| r.kind == "MutatingAdmissionPolicy"))
}

/// Objects by `apiVersion kind namespace/name`, as JSON.
pub fn by_identity(objects: &[DynamicObject]) -> BTreeMap<String, Value> {
    objects
        .iter()
        .map(|o| {
            let types = o.types.clone().unwrap_or_default();
            let key = format!(
                "{} {} {}/{}",
                types.api_version,
                types.kind,
                o.metadata.namespace.as_deref().unwrap_or(""),
                o.metadata.name.as_deref().unwrap_or("")
            );
            (key, serde_json::to_value(o).expect("an object is JSON"))
        })
        .collect()
}

/// Panics unless `rendered` (by `renderer`) holds exactly the objects of `expected`, each
/// equal field by field; the message names the first difference.
pub fn assert_same(
    renderer: &str,
    rendered: &BTreeMap<String, Value>,
    expected: &BTreeMap<String, Value>,
) {
    let keys = |m: &BTreeMap<String, Value>| m.keys().cloned().collect::<Vec<_>>();
    assert_eq!(
        keys(rendered),
        keys(expected),
        "{renderer}: the same objects"
    );
    for (key, object) in expected {
        if let Some(at) = first_difference(&rendered[key], object, String::new()) {
            panic!("{renderer}: {key} differs at {at}");
        }
    }
}

/// The JSON pointer of the first place `a` and `b` differ, with both values there.
pub fn first_difference(a: &Value, b: &Value, at: String) -> Option<String> {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => x.keys().chain(y.keys()).find_map(|k| {
            let (l, r) = (
                x.get(k).unwrap_or(&Value::Null),
                y.get(k).unwrap_or(&Value::Null),
            );
            first_difference(l, r, format!("{at}/{k}"))
        }),
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => x
            .iter()
            .zip(y)
            .enumerate()
            .find_map(|(i, (l, r))| first_difference(l, r, format!("{at}/{i}"))),
        // The CRD generator writes a bound as 512.0, YAML as 512: the same number.
        (Value::Number(x), Value::Number(y)) if x.as_f64() == y.as_f64() => None,
        _ if a == b => None,
        _ => Some(format!("{at}: rendered {a}, expected {b}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_first_difference_is_named_and_equal_numbers_are_equal() {
        let a = json!({"spec": {"max": 512, "list": [1, {"x": "a"}]}});
        let b = json!({"spec": {"max": 512.0, "list": [1, {"x": "b"}]}});
        assert_eq!(
            first_difference(&a, &b, String::new()).as_deref(),
            Some("/spec/list/1/x: rendered \"a\", expected \"b\"")
        );
        assert_eq!(first_difference(&a, &a, String::new()), None);
        let missing = json!({"spec": {"max": 512, "list": [1, {"x": "a"}], "extra": true}});
        assert!(first_difference(&missing, &a, String::new()).is_some());
    }
}

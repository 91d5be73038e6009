//! Whether the artifacts volume can work on this cluster: build Jobs write it and import Jobs
//! read it (ADR-0010, ADR-0016), each where the scheduler puts them. A ReadWriteOnce volume is
//! mounted by one node at a time, so with more than one schedulable node a Job placed on
//! another node than the one holding it waits forever. `banlieue bootstrap` says so.

use k8s_openapi::api::core::v1::{Node, PersistentVolumeClaim};
use kube::Client;
use kube::api::Api;

/// The shipped artifacts PVC (`deploy/imagebuild/artifacts-pvc.yaml`).
pub const NAMESPACE: &str = banlieue_api::names::DEFAULT_BUILD_NAMESPACE;
pub const CLAIM: &str = "banlieue-artifacts";

/// What to tell the administrator about a PVC with `access_modes` on a cluster of
/// `schedulable_nodes`, if anything.
pub fn warning(access_modes: Option<&[String]>, schedulable_nodes: usize) -> Option<String> {
    let Some(modes) = access_modes else {
        return Some(format!(
            "PersistentVolumeClaim {NAMESPACE}/{CLAIM} does not exist yet: image builds and \
             imports wait for it; set its size and storage class in \
             deploy/imagebuild/artifacts-pvc.yaml and apply it"
        ));
    };
    let shared = modes.iter().any(|m| m == "ReadWriteMany");
    (!shared && schedulable_nodes > 1).then(|| {
        format!(
            "PersistentVolumeClaim {NAMESPACE}/{CLAIM} is {} and the cluster has \
             {schedulable_nodes} schedulable nodes: a build or import Job placed on another node \
             than the one holding the volume waits forever; use a ReadWriteMany storage class \
             (docs/guides/image-builder.md)",
            modes.join(", ")
        )
    })
}

/// Reads the PVC and the nodes, and returns [`warning`]'s verdict.
pub async fn check(client: &Client) -> Result<Option<String>, kube::Error> {
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), NAMESPACE);
    let modes = claims
        .get_opt(CLAIM)
        .await?
        .map(|c| c.spec.and_then(|s| s.access_modes).unwrap_or_default());
    let nodes: Api<Node> = Api::all(client.clone());
    let schedulable = nodes
        .list(&Default::default())
        .await?
        .items
        .iter()
        .filter(|n| {
            !n.spec
                .as_ref()
                .and_then(|s| s.unschedulable)
                .unwrap_or(false)
        })
        .count();
    Ok(warning(modes.as_deref(), schedulable))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn modes(m: &[&str]) -> Vec<String> {
        m.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn read_write_once_works_on_one_node_and_is_named_on_more() {
        let rwo = modes(&["ReadWriteOnce"]);
        assert_eq!(warning(Some(&rwo), 1), None);
        let said = warning(Some(&rwo), 3).expect("a warning");
        assert!(said.contains("is ReadWriteOnce and the cluster has 3 schedulable nodes"));
        let rwop = modes(&["ReadWriteOncePod"]);
        assert!(warning(Some(&rwop), 2).is_some());
    }

    #[test]
    fn read_write_many_works_anywhere_and_a_missing_claim_is_named() {
        assert_eq!(warning(Some(&modes(&["ReadWriteMany"])), 5), None);
        assert_eq!(
            warning(Some(&modes(&["ReadWriteOnce", "ReadWriteMany"])), 5),
            None
        );
        assert!(
            warning(None, 1)
                .expect("a note")
                .contains("does not exist yet")
        );
    }
}

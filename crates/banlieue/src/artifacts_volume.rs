//! Whether the artifacts volume can work on this cluster: build Jobs write it and import Jobs
//! read it (ADR-0010, ADR-0016). A volume that is not ReadWriteMany is mounted by one node at a
//! time; the Jobs then follow each other onto the node that holds it
//! ([`banlieue_api::artifacts`]), which works on any number of nodes but does every build and
//! import on that one node. `banlieue bootstrap` says what the shipped claim will do here.

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
    let has = |mode: &str| modes.iter().any(|m| m == mode);
    let listed = modes.join(", ");
    if has("ReadWriteMany") {
        None
    } else if has("ReadWriteOnce") {
        (schedulable_nodes > 1).then(|| {
            format!(
                "PersistentVolumeClaim {NAMESPACE}/{CLAIM} is {listed} and the cluster has \
                 {schedulable_nodes} schedulable nodes: every build and import Job runs on the \
                 node that holds the volume; a ReadWriteMany storage class lets them spread \
                 (docs/guides/image-builder.md)"
            )
        })
    } else if has("ReadWriteOncePod") {
        Some(format!(
            "PersistentVolumeClaim {NAMESPACE}/{CLAIM} is ReadWriteOncePod: one pod at a time \
             mounts it, so builds and imports wait for each other; ReadWriteOnce lets them \
             share its node (docs/guides/image-builder.md)"
        ))
    } else {
        Some(format!(
            "PersistentVolumeClaim {NAMESPACE}/{CLAIM} is {listed}: build Jobs cannot write \
             it; it must be ReadWriteOnce or ReadWriteMany (docs/guides/image-builder.md)"
        ))
    }
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
        let said = warning(Some(&rwo), 3).expect("a note");
        assert!(
            said.contains("is ReadWriteOnce and the cluster has 3 schedulable nodes"),
            "{said}"
        );
        assert!(
            said.contains("runs on the node that holds the volume"),
            "{said}"
        );
    }

    #[test]
    fn a_claim_that_serialises_or_cannot_be_written_is_named_on_any_cluster() {
        let rwop = warning(Some(&modes(&["ReadWriteOncePod"])), 1).expect("a warning");
        assert!(rwop.contains("wait for each other"), "{rwop}");
        let rox = warning(Some(&modes(&["ReadOnlyMany"])), 1).expect("a warning");
        assert!(rox.contains("build Jobs cannot write it"), "{rox}");
        // ReadWriteOnce beside ReadWriteOncePod is still shared by the pods of one node.
        assert_eq!(
            warning(Some(&modes(&["ReadWriteOncePod", "ReadWriteOnce"])), 1),
            None
        );
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

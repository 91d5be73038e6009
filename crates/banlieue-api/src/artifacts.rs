//! Where the pods that mount the artifacts volume may run. Build Jobs write it and import Jobs
//! read it (ADR-0010, ADR-0016). A ReadWriteOnce volume is attached to one node at a time: a
//! Job's pod on another node than the one holding it cannot mount it and waits. So every such
//! pod carries [`LABEL_ARTIFACTS_CLAIM`] and, unless the volume is ReadWriteMany, a required pod
//! affinity to the other pods carrying it, per node. The scheduler then puts each pod on the
//! node where the volume's live users are. The first one, with no other to follow, may go
//! anywhere: a pod that matches its own affinity term is not held back by it. Pods that ended
//! (Succeeded, Failed) do not count: the scheduler does not keep them.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Affinity, PodAffinity, PodAffinityTerm};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

/// On every build and import pod: the name of the artifacts claim it mounts.
pub const LABEL_ARTIFACTS_CLAIM: &str = "banlieue.io/artifacts-claim";

/// The node label the pods are kept together by: one node.
const TOPOLOGY_HOSTNAME: &str = "kubernetes.io/hostname";

/// How the artifacts volume may be shared between nodes, from its claim's access modes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sharing {
    /// `ReadWriteMany`: mounted on any number of nodes at once.
    AnyNode,
    /// Anything else, or a claim that could not be read: one node at a time.
    OneNode,
}

impl Sharing {
    /// `access_modes` of the claim's spec; `None` when it could not be read, which is taken
    /// as the narrower case, since following the other pods only costs spreading.
    pub fn of(access_modes: Option<&[String]>) -> Sharing {
        match access_modes {
            Some(modes) if modes.iter().any(|m| m == "ReadWriteMany") => Sharing::AnyNode,
            _ => Sharing::OneNode,
        }
    }
}

/// The labels and affinity of a pod that mounts the artifacts claim `claim`.
#[derive(Clone, Debug, PartialEq)]
pub struct Placement {
    pub labels: BTreeMap<String, String>,
    pub affinity: Option<Affinity>,
}

/// Where a pod mounting `claim`, shared as `sharing`, may run.
pub fn placement(claim: &str, sharing: Sharing) -> Placement {
    let labels = BTreeMap::from([(LABEL_ARTIFACTS_CLAIM.to_owned(), claim.to_owned())]);
    let affinity = (sharing == Sharing::OneNode).then(|| Affinity {
        pod_affinity: Some(PodAffinity {
            required_during_scheduling_ignored_during_execution: Some(vec![PodAffinityTerm {
                label_selector: Some(LabelSelector {
                    match_labels: Some(labels.clone()),
                    ..LabelSelector::default()
                }),
                topology_key: TOPOLOGY_HOSTNAME.to_owned(),
                ..PodAffinityTerm::default()
            }]),
            ..PodAffinity::default()
        }),
        ..Affinity::default()
    });
    Placement { labels, affinity }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn modes(m: &[&str]) -> Vec<String> {
        m.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn only_read_write_many_is_shared_between_nodes() {
        assert_eq!(
            Sharing::of(Some(&modes(&["ReadWriteMany"]))),
            Sharing::AnyNode
        );
        assert_eq!(
            Sharing::of(Some(&modes(&["ReadWriteOnce", "ReadWriteMany"]))),
            Sharing::AnyNode
        );
        for one in [
            &["ReadWriteOnce"][..],
            &["ReadWriteOncePod"],
            &["ReadOnlyMany"],
            &[],
        ] {
            assert_eq!(Sharing::of(Some(&modes(one))), Sharing::OneNode, "{one:?}");
        }
        assert_eq!(Sharing::of(None), Sharing::OneNode, "an unread claim");
    }

    #[test]
    fn pods_on_a_one_node_volume_follow_each_other_per_node() {
        let p = placement("banlieue-artifacts", Sharing::OneNode);
        assert_eq!(
            p.labels.get(LABEL_ARTIFACTS_CLAIM).map(String::as_str),
            Some("banlieue-artifacts")
        );
        let terms = p
            .affinity
            .and_then(|a| a.pod_affinity)
            .and_then(|a| a.required_during_scheduling_ignored_during_execution)
            .expect("a required pod affinity");
        assert_eq!(terms.len(), 1);
        assert_eq!(terms[0].topology_key, "kubernetes.io/hostname");
        // The term selects exactly the labels the pod itself carries: the first pod, with
        // no other to follow, matches its own term and may be scheduled.
        let selected = terms[0]
            .label_selector
            .as_ref()
            .and_then(|s| s.match_labels.clone());
        assert_eq!(selected, Some(p.labels));
        // Scoped to the pod's own namespace, where the claim is.
        assert_eq!(terms[0].namespaces, None);
        assert_eq!(terms[0].namespace_selector, None);
    }

    #[test]
    fn pods_on_a_shared_volume_run_anywhere_but_stay_labelled() {
        let p = placement("artifacts", Sharing::AnyNode);
        assert_eq!(p.affinity, None);
        assert_eq!(
            p.labels.get(LABEL_ARTIFACTS_CLAIM).map(String::as_str),
            Some("artifacts")
        );
    }
}

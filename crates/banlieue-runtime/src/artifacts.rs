//! Reads how the artifacts volume is shared, for the build and import Jobs' placement
//! ([`banlieue_api::artifacts`]).

use std::sync::atomic::{AtomicBool, Ordering};

use banlieue_api::artifacts::Sharing;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::Client;
use kube::api::Api;

/// How the claim `claim` in `namespace` is shared, from its access modes. A claim that does
/// not exist yet, or cannot be read, counts as one node at a time: keeping the Jobs together
/// only costs spreading, placing them apart can leave one waiting forever.
pub async fn sharing(client: &Client, namespace: &str, claim: &str) -> Sharing {
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), namespace);
    match claims.get_opt(claim).await {
        Ok(found) => {
            let modes = found.and_then(|c| c.spec).and_then(|s| s.access_modes);
            Sharing::of(modes.as_deref())
        }
        Err(error) => {
            // Once per process at warning level: an install whose role lacks the rule hits this
            // on every reconcile, and the Jobs still run.
            static WARNED: AtomicBool = AtomicBool::new(false);
            if WARNED.swap(true, Ordering::Relaxed) {
                tracing::debug!(%namespace, %claim, %error, "the artifacts claim could not be read");
            } else {
                tracing::warn!(%namespace, %claim, %error, "the artifacts claim could not be read; its Jobs are kept on one node (said once)");
            }
            Sharing::OneNode
        }
    }
}

//! Finalizer edits that cannot clobber a concurrent writer.

use kube::api::{Api, Patch, PatchParams};
use kube::{Resource, ResourceExt};
use serde_json::json;

use crate::error::{Error, Result};

/// Sets the finalizer list, guarded by the object's resourceVersion: a merge patch carrying
/// `metadata.resourceVersion` fails with 409 when someone else changed the object since it
/// was read, so a finalizer another controller added in between is never dropped.
pub async fn patch<K>(api: &Api<K>, object: &K, finalizers: Vec<String>) -> Result<()>
where
    K: Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let name = object.name_any();
    api.patch(
        &name,
        &PatchParams::default(),
        &Patch::Merge(json!({
            "metadata": {
                "resourceVersion": object.resource_version(),
                "finalizers": finalizers,
            }
        })),
    )
    .await
    .map_err(Error::kube(format!(
        "update the finalizers of {} {name}",
        K::kind(&())
    )))?;
    Ok(())
}

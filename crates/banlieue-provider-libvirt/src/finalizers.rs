//! The provider's finalizers, edited through the protocol every banlieue reconciler shares
//! ([`banlieue_runtime::reconcile`]): JSON patches that test what was read, so a concurrent
//! writer's finalizer is never dropped.

use banlieue_runtime::reconcile::{self, PatchError};
use kube::api::Api;
use kube::{Resource, ResourceExt};

use crate::error::{Error, Result};

/// Adds `finalizer` to `object` unless it already holds it.
pub async fn add<K>(api: &Api<K>, object: &K, finalizer: &str) -> Result<()>
where
    K: Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    reconcile::add_finalizer(api, object, finalizer)
        .await
        .map_err(patch_error(object))?;
    Ok(())
}

/// Removes `finalizer` from `object` when it holds it; an object already gone is not an error.
pub async fn remove<K>(api: &Api<K>, object: &K, finalizer: &str) -> Result<()>
where
    K: Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    reconcile::remove_finalizer(api, object, finalizer)
        .await
        .map_err(patch_error(object))
}

fn patch_error<K>(object: &K) -> impl FnOnce(PatchError) -> Error
where
    K: Resource<DynamicType = ()>,
{
    let what = format!(
        "update the finalizers of {} {}",
        K::kind(&()),
        object.name_any()
    );
    move |error| match error {
        PatchError::Kube(source) => Error::Kube { what, source },
        PatchError::Encode(source) => Error::Encode { what, source },
    }
}

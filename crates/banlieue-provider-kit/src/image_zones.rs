//! A provider's zones of a VMImage: each provider writes its own entry of
//! `status.perProvider[]` (one zone per storage target it imports to), and the phase and
//! revision that follow from all entries. Providers of one namespace write the same list, so
//! every write is a compare-and-swap on the resourceVersion read, retried on conflict.

use banlieue_api::image::merged_status;
use banlieue_api::{VMImage, ZoneImageStatus};
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};

/// How many conflicting writes in a row are retried before giving up.
pub const ATTEMPTS: usize = 8;

/// Why a provider's zones were not written.
#[derive(Debug, thiserror::Error)]
pub enum ZonesError {
    #[error("{what}")]
    Kube {
        what: String,
        #[source]
        source: kube::Error,
    },
    #[error("status of vmimage {image}: {ATTEMPTS} write conflicts in a row")]
    Conflicts { image: String },
}

/// Replaces `provider`'s entry of the VMImage `image`'s `status.perProvider[]` with `zones`,
/// the image's revision being `revision` of the object read; writes nothing when the status
/// already says so. The VMImage is read as the object, not its status subresource: the same
/// bytes, and the only one of the two a provider's role may read.
pub async fn publish(
    images: &Api<VMImage>,
    image: &str,
    provider: &str,
    zones: Vec<ZoneImageStatus>,
    revision: impl Fn(&VMImage) -> String,
) -> Result<(), ZonesError> {
    for _ in 0..ATTEMPTS {
        let current = images.get(image).await.map_err(|source| ZonesError::Kube {
            what: format!("vmimage {image}"),
            source,
        })?;
        let merged = merged_status(
            current.status.as_ref(),
            provider,
            zones.clone(),
            &revision(&current),
        );
        if current.status.as_ref() == Some(&merged) {
            return Ok(());
        }
        let patch = serde_json::json!({
            "metadata": { "resourceVersion": current.resource_version() },
            "status": merged,
        });
        match images
            .patch_status(image, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(status)) if status.code == 409 => continue,
            Err(source) => {
                return Err(ZonesError::Kube {
                    what: format!("status of vmimage {image}"),
                    source,
                });
            }
        }
    }
    Err(ZonesError::Conflicts {
        image: image.to_owned(),
    })
}

//! The pure half of the image reconcile: which pools, which Jobs, what each zone says, and how
//! this provider's entry merges into a VMImage status that other providers write too.

use banlieue_api::image::ARTIFACT_KIND_CLOUD_IMAGE;
/// Shared with every provider: they all write the same `status.revision` and `phase`.
pub use banlieue_api::image::{content_revision, merged_status, overall_phase, revision};
use banlieue_api::{ArtifactPhase, BuildArtifact, ImageSource, Provider, VMImage};

pub use banlieue_provider_kit::import_settings::{DEFAULT_ARTIFACTS_CLAIM, ImportSettings};

mod backing_file;
#[cfg(test)]
mod fixtures;
mod job;
mod zone;

pub use backing_file::{
    BackingFileRefusal, Presence, backing_file_refusal, is_declared_backing_file, zone_backing_file,
};
pub use job::{
    DEADLINE_BASE_SECONDS, DEADLINE_MIN_BYTES_PER_SECOND, DEADLINE_UNKNOWN_SIZE_SECONDS,
    IMPORT_UID, ImportRequest, active_deadline_seconds, import_args, import_job, import_job_name,
    import_resources, job_labels,
};
pub use zone::{
    with_missing_service_account, zone_build_pending, zone_from_job, zone_jobs_forbidden,
    zone_wrong_kind,
};

/// Where the import Job mounts the artifacts PVC.
pub const ARTIFACTS_MOUNT: &str = "/artifacts";
/// The value of `app.kubernetes.io/managed-by` on import Jobs.
pub const MANAGED_BY: &str = "banlieue";
/// The import container's name.
pub const CONTAINER_NAME: &str = "import";
/// The example that carries the `jobs` grant.
pub const PROVIDER_CLASS_EXAMPLE: &str = "examples/09-providerclass-libvirt.yaml";

/// The volume a Url import writes in each pool: `<image>-<revision>-<8 hex>.raw`, the hex from
/// the SHA-256 of the image's namespace and [`content_revision`]. The revision in the name
/// means a new revision never overwrites a volume that running machines use as backing; the
/// hex means two images share a volume only when they are one namespace's same name and
/// content: a `spec.revision` someone else chose, or the same name in another namespace, never
/// makes this image's machines boot another's bytes (the import finds a complete volume under
/// that name and keeps it).
pub fn url_volume_name(image: &VMImage) -> String {
    use sha2::{Digest, Sha256};
    let namespace = image.metadata.namespace.as_deref().unwrap_or_default();
    let content = content_revision(image);
    let mut hasher = Sha256::new();
    // Length-prefixed, so no two different pairs hash alike.
    for field in [namespace, content.as_str()] {
        hasher.update((field.len() as u64).to_be_bytes());
        hasher.update(field.as_bytes());
    }
    let id: String = hasher.finalize()[..4]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let name = image.metadata.name.as_deref().unwrap_or_default();
    format!("{name}-{}-{id}.raw", revision(image))
}

/// The image's source for `class`, if it has one.
pub fn source_for_class<'a>(image: &'a VMImage, class: &str) -> Option<&'a ImageSource> {
    image
        .spec
        .sources
        .iter()
        .find(|s| s.provider_class == class)
}

/// The storage pools the Provider advertises: its (single) failure domain's storage classes,
/// each pool once, in declaration order.
pub fn storage_pools(provider: &Provider) -> Vec<String> {
    let mut pools: Vec<String> = Vec::new();
    let Some(domain) = provider
        .status
        .as_ref()
        .and_then(|s| s.failure_domains.first())
    else {
        return pools;
    };
    for class in &domain.storage_classes {
        if !pools.contains(&class.target.pool) {
            pools.push(class.target.pool.clone());
        }
    }
    pools
}

/// Whether a Url source's build half is done, and where its file is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ArtifactState {
    /// Ready, with the file's path inside the PVC (no leading `/`), and what the build says
    /// of its bytes.
    Ready(Artifact),
    /// Not (yet) usable; the text says why, for the zone's message.
    Pending(String),
}

/// A Ready build artifact, as far as an import is concerned.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Artifact {
    /// Path inside the artifacts PVC, without a leading `/`.
    pub path: String,
    /// SHA-256 the build recorded, hex.
    pub sha256: Option<String>,
    /// Size the build recorded.
    pub size_bytes: Option<u64>,
}

/// Reads `status.buildArtifact`: only a Ready `cloudImage` with a path can be imported.
pub fn artifact_state(artifact: Option<&BuildArtifact>) -> ArtifactState {
    let Some(a) = artifact else {
        return ArtifactState::Pending("no build artifact yet (banlieue-imagebuilder)".into());
    };
    if a.kind != ARTIFACT_KIND_CLOUD_IMAGE {
        return ArtifactState::Pending(format!(
            "build artifact kind {:?} is not {ARTIFACT_KIND_CLOUD_IMAGE}",
            a.kind
        ));
    }
    if a.phase != ArtifactPhase::Ready {
        return ArtifactState::Pending(format!("build artifact is {:?}", a.phase));
    }
    match a.path.as_deref().map(|p| p.trim_start_matches('/')) {
        Some(p) if !p.is_empty() && !p.split('/').any(|c| c == "..") => {
            ArtifactState::Ready(Artifact {
                path: p.to_owned(),
                sha256: a.sha256.clone().filter(|s| !s.is_empty()),
                size_bytes: a.size_bytes.and_then(|n| u64::try_from(n).ok()),
            })
        }
        _ => ArtifactState::Pending("build artifact is Ready but names no usable path".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::image::decide::fixtures::*;
    use banlieue_api::ImportJobSettings;
    use banlieue_api::VMImageStatus;

    #[test]
    fn revision_is_the_spec_or_follows_the_sources() {
        assert_eq!(revision(&image(Some("v3"), "oci://a")), "v3");
        let a = revision(&image(None, "oci://a"));
        assert_eq!(a, revision(&image(None, "oci://a")));
        assert_ne!(a, revision(&image(None, "oci://b")));
        assert_eq!(a.len(), 11);
    }

    #[test]
    fn a_volume_name_is_the_images_own_whatever_revision_it_claims() {
        let in_namespace = |ns: &str, revision: Option<&str>, url: &str| {
            let mut i = image(revision, url);
            i.metadata.namespace = Some(ns.into());
            url_volume_name(&i)
        };
        let a = in_namespace("team-a", None, "oci://a");
        let r = revision(&image(None, "oci://a"));
        assert!(
            a.starts_with(&format!("ubuntu-{r}-")) && a.ends_with(".raw"),
            "{a}"
        );
        assert_eq!(
            a.len(),
            "ubuntu-".len() + r.len() + "-".len() + 8 + ".raw".len()
        );
        // The same image again is the same volume: a restart imports nothing new.
        assert_eq!(a, in_namespace("team-a", None, "oci://a"));
        // Another namespace's image of the same name and sources has its own.
        assert_ne!(a, in_namespace("team-b", None, "oci://a"));
        // A revision chosen to match another image's does not share its volume.
        let pinned = in_namespace("team-a", Some("v1"), "oci://a");
        assert!(pinned.starts_with("ubuntu-v1-"), "{pinned}");
        assert_ne!(pinned, in_namespace("team-a", Some("v1"), "oci://evil"));
        assert_ne!(pinned, in_namespace("team-b", Some("v1"), "oci://a"));
    }

    #[test]
    fn a_moved_tag_is_a_new_revision_unless_the_spec_pins_one() {
        let built = |spec: Option<&str>, digest: &str| {
            let mut i = image(spec, "oci://a:latest");
            i.status = Some(VMImageStatus {
                build_artifact: Some(BuildArtifact {
                    manifest_digest: Some(digest.into()),
                    ..BuildArtifact::default()
                }),
                ..VMImageStatus::default()
            });
            revision(&i)
        };
        let unbuilt = revision(&image(None, "oci://a:latest"));
        assert_ne!(built(None, "sha256:01"), unbuilt);
        assert_ne!(built(None, "sha256:01"), built(None, "sha256:02"));
        assert_eq!(built(None, "sha256:01"), built(None, "sha256:01"));
        assert_eq!(built(Some("v3"), "sha256:02"), "v3");
    }

    #[test]
    fn pools_come_from_the_first_failure_domain_once_each() {
        let p = provider(&[("gold", "nvme"), ("std", "default"), ("fast", "nvme")]);
        assert_eq!(storage_pools(&p), vec!["nvme", "default"]);
        let mut none = p.clone();
        none.status = None;
        assert!(storage_pools(&none).is_empty());
    }

    #[test]
    fn settings_default_to_the_build_namespace_and_artifacts_claim() {
        let s = ImportSettings::of(&class(Default::default()));
        assert_eq!(s.namespace, "banlieue-imagebuild");
        assert_eq!(s.artifacts_claim, "banlieue-artifacts");
        // No account named: each Provider its own, distinct across namespaces.
        let own = s.account_for("team-a", "edge");
        assert!(own.starts_with("banlieue-import-team-a-edge-"), "{own}");
        assert_ne!(own, s.account_for("team-a-edge", ""));
        assert_ne!(own, s.account_for("team", "a-edge"));
        let s = ImportSettings::of(&class(ImportJobSettings {
            namespace: Some("build".into()),
            service_account_name: Some("importer".into()),
            artifacts_claim_name: Some("arts".into()),
        }));
        assert_eq!(
            (
                s.namespace.as_str(),
                s.account_for("team-a", "edge").as_str()
            ),
            ("build", "importer")
        );
    }

    #[test]
    fn only_a_ready_cloud_image_with_a_path_is_importable() {
        let ready = |path: Option<&str>, kind: &str, phase| BuildArtifact {
            kind: kind.into(),
            claim_name: None,
            path: path.map(str::to_owned),
            size_bytes: None,
            sha256: None,
            phase,
            ..Default::default()
        };
        assert!(matches!(artifact_state(None), ArtifactState::Pending(_)));
        assert!(matches!(
            artifact_state(Some(&ready(
                Some("a.raw"),
                "cloudImage",
                ArtifactPhase::Building
            ))),
            ArtifactState::Pending(_)
        ));
        assert!(matches!(
            artifact_state(Some(&ready(Some("a.raw"), "iso", ArtifactPhase::Ready))),
            ArtifactState::Pending(_)
        ));
        assert!(matches!(
            artifact_state(Some(&ready(
                Some("../etc/x"),
                "cloudImage",
                ArtifactPhase::Ready
            ))),
            ArtifactState::Pending(_)
        ));
        assert_eq!(
            artifact_state(Some(&ready(
                Some("/img/a.raw"),
                "cloudImage",
                ArtifactPhase::Ready
            ))),
            ArtifactState::Ready(Artifact {
                path: "img/a.raw".into(),
                sha256: None,
                size_bytes: None,
            })
        );
    }
}

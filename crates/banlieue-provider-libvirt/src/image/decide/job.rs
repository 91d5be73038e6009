//! Import Jobs: one per image revision, pool and artifact, named so that a new revision or a
//! rebuilt artifact is a new Job, running hardened within a deadline that follows the size.

use std::collections::BTreeMap;

use banlieue_api::names::{self, LABEL_MANAGED_BY, LABEL_PROVIDER, LABEL_VMIMAGE};
use banlieue_api::{Provider, ProviderClass};
use banlieue_api::{artifacts, pods};
use k8s_openapi::api::batch::v1::{Job, JobSpec};
use k8s_openapi::api::core::v1::{
    Container, PersistentVolumeClaimVolumeSource, PodSpec, PodTemplateSpec, ResourceRequirements,
    Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use sha2::{Digest, Sha256};

use super::{ARTIFACTS_MOUNT, Artifact, CONTAINER_NAME, ImportSettings, MANAGED_BY};

/// One import: which image, of which revision, into which volume of which pool, from which
/// artifact. Everything that makes two imports different is here, and in the Job's name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImportRequest<'a> {
    pub image: &'a str,
    /// The VMImage's namespace (the Provider's).
    pub image_namespace: &'a str,
    pub revision: &'a str,
    /// The volume the import writes ([`url_volume_name`]).
    pub volume: &'a str,
    pub pool: &'a str,
    pub artifact: &'a Artifact,
}

/// The Job's container arguments after the class's own: the guide's command line, and the
/// volume and revision the Job was made for, which the importer checks against the VMImage.
pub fn import_args(request: &ImportRequest<'_>, provider: &str) -> Vec<String> {
    [
        "provider",
        "libvirt",
        "import",
        "--vmimage",
        request.image,
        "--provider",
        provider,
        "--provider-namespace",
        request.image_namespace,
        "--pool",
        request.pool,
        "--source",
        &format!("{ARTIFACTS_MOUNT}/{}", request.artifact.path),
        "--volume",
        request.volume,
        "--revision",
        request.revision,
    ]
    .into_iter()
    .map(str::to_owned)
    .collect()
}

/// The import Job's name: `import-<image>-<provider>-<pool>` to read, then 10 hex digits of
/// the SHA-256 of everything else that tells two imports apart (the image's namespace, its
/// revision, the artifact's path, digest and size), within 63 characters. A new revision or a
/// rebuilt artifact is a new Job, never the adoption of an old one that finished.
pub fn import_job_name(request: &ImportRequest<'_>, provider: &str) -> String {
    let mut hasher = Sha256::new();
    let size = request
        .artifact
        .size_bytes
        .map(|n| n.to_string())
        .unwrap_or_default();
    for field in [
        request.image_namespace,
        request.image,
        provider,
        request.pool,
        request.revision,
        request.volume,
        request.artifact.path.as_str(),
        request.artifact.sha256.as_deref().unwrap_or(""),
        size.as_str(),
    ] {
        // Length-prefixed, so no two different tuples hash alike.
        hasher.update((field.len() as u64).to_be_bytes());
        hasher.update(field.as_bytes());
    }
    let digest = hasher.finalize();
    let hash: String = digest[..5].iter().map(|b| format!("{b:02x}")).collect();
    let readable = names::import_job_name(request.image, provider, request.pool);
    // The readable part is cut so that the hash always survives whole.
    let keep = names::MAX_NAME_LEN - hash.len() - 1;
    let prefix = readable
        .get(..keep.min(readable.len()))
        .unwrap_or(&readable)
        .trim_end_matches(['-', '.']);
    names::shorten(&format!("{prefix}-{hash}"))
}

/// The user the importer runs as: the distroless `nonroot` user, owner of nothing on the
/// node.
pub const IMPORT_UID: i64 = pods::NONROOT_UID;

/// Fixed part of an import's deadline, for pod start, image pull and the TLS handshake.
pub const DEADLINE_BASE_SECONDS: u64 = 600;
/// The slowest throughput an import is allowed, in bytes per second (10 MB/s): a WAN link to
/// an edge host, well below what a LAN import reaches.
pub const DEADLINE_MIN_BYTES_PER_SECOND: u64 = 10_000_000;
/// The deadline when the build recorded no size: 6 hours.
pub const DEADLINE_UNKNOWN_SIZE_SECONDS: i64 = 6 * 3600;

/// `activeDeadlineSeconds` of an import Job: `2 × (600 + ⌈size / 10 MB/s⌉)`, since the
/// deadline covers the Job's one retry too. A stuck import ends and reports Failed instead of
/// holding the pool's volume name forever.
pub fn active_deadline_seconds(size_bytes: Option<u64>) -> i64 {
    match size_bytes {
        Some(size) => {
            let transfer = size.div_ceil(DEADLINE_MIN_BYTES_PER_SECOND);
            let seconds = DEADLINE_BASE_SECONDS
                .saturating_add(transfer)
                .saturating_mul(2);
            i64::try_from(seconds).unwrap_or(i64::MAX)
        }
        None => DEADLINE_UNKNOWN_SIZE_SECONDS,
    }
}

/// The importer's resources: one stream packet in memory and one TLS connection, whatever
/// the image size.
pub fn import_resources() -> ResourceRequirements {
    let q = |s: &str| Quantity(s.to_owned());
    ResourceRequirements {
        requests: Some(BTreeMap::from([
            ("cpu".to_owned(), q("100m")),
            ("memory".to_owned(), q("64Mi")),
        ])),
        limits: Some(BTreeMap::from([
            ("cpu".to_owned(), q("1")),
            ("memory".to_owned(), q("256Mi")),
        ])),
        ..ResourceRequirements::default()
    }
}

/// The labels of an import Job (and its pods).
pub fn job_labels(image: &str, provider: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (LABEL_VMIMAGE.to_owned(), image.to_owned()),
        (LABEL_PROVIDER.to_owned(), provider.to_owned()),
        (LABEL_MANAGED_BY.to_owned(), MANAGED_BY.to_owned()),
    ])
}

/// The import Job for `request` on `provider`, its pod placed by how the artifacts volume is
/// shared (`sharing`). Its name is a function of the request, which is what makes adoption
/// possible.
pub fn import_job(
    request: &ImportRequest<'_>,
    provider: &Provider,
    class: &ProviderClass,
    sharing: artifacts::Sharing,
) -> Job {
    let provider_name = provider.metadata.name.as_deref().unwrap_or_default();
    let settings = ImportSettings::of(class);
    let labels = job_labels(request.image, provider_name);
    let placement = artifacts::placement(&settings.artifacts_claim, sharing);
    let mut pod_labels = labels.clone();
    pod_labels.extend(placement.labels);
    let mut args = class.spec.args.clone();
    args.extend(import_args(request, provider_name));
    Job {
        metadata: ObjectMeta {
            name: Some(import_job_name(request, provider_name)),
            namespace: Some(settings.namespace.clone()),
            labels: Some(labels.clone()),
            ..ObjectMeta::default()
        },
        spec: Some(JobSpec {
            // A partial upload restarts from zero: one retry, never a loop (ADR-0010).
            backoff_limit: Some(1),
            active_deadline_seconds: Some(active_deadline_seconds(request.artifact.size_bytes)),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(pod_labels),
                    ..ObjectMeta::default()
                }),
                spec: Some(PodSpec {
                    restart_policy: Some("Never".into()),
                    affinity: placement.affinity,
                    // Never the build namespace's `default` account (ADR-0063).
                    service_account_name: Some(settings.account_for(
                        provider.metadata.namespace.as_deref().unwrap_or_default(),
                        provider_name,
                    )),
                    // The importer reads one file and talks TLS: it needs no privilege, no
                    // writable root and no capability.
                    security_context: Some(pods::restricted_pod(None)),
                    containers: vec![Container {
                        name: CONTAINER_NAME.into(),
                        image: Some(class.spec.image.clone()),
                        command: (!class.spec.command.is_empty())
                            .then(|| class.spec.command.clone()),
                        args: Some(args),
                        resources: Some(import_resources()),
                        security_context: Some(pods::restricted_container()),
                        volume_mounts: Some(vec![VolumeMount {
                            name: "artifacts".into(),
                            mount_path: ARTIFACTS_MOUNT.into(),
                            read_only: Some(true),
                            ..VolumeMount::default()
                        }]),
                        ..Container::default()
                    }],
                    volumes: Some(vec![Volume {
                        name: "artifacts".into(),
                        persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                            claim_name: settings.artifacts_claim.clone(),
                            read_only: Some(true),
                        }),
                        ..Volume::default()
                    }]),
                    ..PodSpec::default()
                }),
            },
            ..JobSpec::default()
        }),
        status: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::image::decide::fixtures::*;

    #[test]
    fn job_carries_the_guides_command_line_after_the_class_args() {
        let job = job_with(None);
        let container = &job
            .spec
            .as_ref()
            .unwrap()
            .template
            .spec
            .as_ref()
            .unwrap()
            .containers[0];
        assert_eq!(
            container.args.as_deref().unwrap().join(" "),
            "--log-format=json provider libvirt import --vmimage ubuntu --provider edge-7 \
             --provider-namespace banlieue-system --pool nvme --source /artifacts/ubuntu.raw \
             --volume ubuntu-v3.raw --revision v3"
        );
        assert_eq!(job.spec.as_ref().unwrap().backoff_limit, Some(1));
        let name = job.metadata.name.as_deref().unwrap();
        assert!(name.starts_with("import-ubuntu-edge-7-nvme-"), "{name}");
        assert_eq!(name.len(), "import-ubuntu-edge-7-nvme-".len() + 10);
    }

    #[test]
    fn import_pods_follow_the_artifacts_volume_unless_it_is_shared() {
        let artifact = artifact(Some(10));
        let pod_of = |sharing| {
            let job = import_job(
                &request(&artifact),
                &provider(&[("gold", "nvme")]),
                &class(Default::default()),
                sharing,
            );
            job.spec.map(|s| s.template).expect("template")
        };
        let one_node = pod_of(artifacts::Sharing::OneNode);
        let labels = one_node.metadata.and_then(|m| m.labels).unwrap_or_default();
        assert_eq!(
            labels
                .get(artifacts::LABEL_ARTIFACTS_CLAIM)
                .map(String::as_str),
            Some("banlieue-artifacts")
        );
        assert_eq!(
            one_node.spec.and_then(|s| s.affinity),
            artifacts::placement("banlieue-artifacts", artifacts::Sharing::OneNode).affinity
        );
        let any_node = pod_of(artifacts::Sharing::AnyNode);
        assert_eq!(any_node.spec.and_then(|s| s.affinity), None);
    }

    #[test]
    fn job_names_tell_apart_everything_that_makes_imports_different() {
        let base_artifact = artifact(Some(10));
        let name = |r: &ImportRequest<'_>| import_job_name(r, "edge-7");
        let base = name(&request(&base_artifact));
        let other_ns = ImportRequest {
            image_namespace: "team-b",
            ..request(&base_artifact)
        };
        let other_revision = ImportRequest {
            revision: "v4",
            volume: "ubuntu-v4.raw",
            ..request(&base_artifact)
        };
        let rebuilt = Artifact {
            sha256: Some("cd".repeat(32)),
            ..base_artifact.clone()
        };
        let moved = Artifact {
            path: "ubuntu-2.raw".into(),
            ..base_artifact.clone()
        };
        let mut all = vec![
            base.clone(),
            name(&other_ns),
            name(&other_revision),
            name(&request(&rebuilt)),
            name(&request(&moved)),
        ];
        all.sort();
        all.dedup();
        assert_eq!(all.len(), 5, "{all:?}");
        assert_eq!(base, name(&request(&base_artifact)), "stable");
        // Long names keep the readable prefix and the whole hash, within 63 characters.
        let long_image = "i".repeat(80);
        let long = ImportRequest {
            image: &long_image,
            ..request(&base_artifact)
        };
        let long_other = ImportRequest {
            revision: "v9",
            ..long.clone()
        };
        let (a, b) = (name(&long), name(&long_other));
        assert!(a.len() <= 63 && b.len() <= 63, "{a} {b}");
        assert!(a.starts_with("import-iiii"), "{a}");
        assert_ne!(a, b);
    }

    #[test]
    fn import_jobs_run_hardened_within_a_deadline_from_the_size() {
        let job = job_with(None);
        let spec = job.spec.as_ref().unwrap();
        // 2 GB: 2 × (600 + 200) seconds.
        assert_eq!(spec.active_deadline_seconds, Some(1600));
        let pod = spec.template.spec.as_ref().unwrap();
        // The class names no account: the Provider's own, never the namespace's `default`.
        let p = provider(&[("gold", "nvme")]);
        let own = ImportSettings::of(&class(Default::default())).account_for(
            p.metadata.namespace.as_deref().unwrap_or_default(),
            p.metadata.name.as_deref().unwrap_or_default(),
        );
        assert!(own.starts_with("banlieue-import-"), "{own}");
        assert_eq!(pod.service_account_name.as_deref(), Some(own.as_str()));
        let psc = pod.security_context.as_ref().unwrap();
        assert_eq!(psc.run_as_non_root, Some(true));
        assert_eq!(psc.run_as_user, Some(65532));
        assert_eq!(
            psc.seccomp_profile.as_ref().map(|p| p.type_.as_str()),
            Some("RuntimeDefault")
        );
        let c = &pod.containers[0];
        let sc = c.security_context.as_ref().unwrap();
        assert_eq!(sc.read_only_root_filesystem, Some(true));
        assert_eq!(sc.allow_privilege_escalation, Some(false));
        assert_eq!(
            sc.capabilities.as_ref().unwrap().drop.as_deref(),
            Some(&["ALL".to_owned()][..])
        );
        let resources = c.resources.as_ref().unwrap();
        let get = |m: &Option<BTreeMap<String, Quantity>>, k: &str| {
            m.as_ref().and_then(|m| m.get(k)).map(|q| q.0.clone())
        };
        assert_eq!(get(&resources.requests, "cpu").as_deref(), Some("100m"));
        assert_eq!(get(&resources.requests, "memory").as_deref(), Some("64Mi"));
        assert_eq!(get(&resources.limits, "cpu").as_deref(), Some("1"));
        assert_eq!(get(&resources.limits, "memory").as_deref(), Some("256Mi"));

        assert_eq!(active_deadline_seconds(Some(1)), 2 * 601);
        assert_eq!(active_deadline_seconds(Some(0)), 1200);
        assert_eq!(active_deadline_seconds(None), 6 * 3600);
        // Any size the API can carry stays a valid deadline.
        assert_eq!(
            active_deadline_seconds(Some(u64::MAX)),
            2 * (600 + 1_844_674_407_371)
        );
    }
}

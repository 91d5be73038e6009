//! The pure half of the image reconcile: which pools, which Jobs, what each zone says, and how
//! this provider's entry merges into a VMImage status that other providers write too.

use std::collections::BTreeMap;

use banlieue_api::image::ARTIFACT_KIND_CLOUD_IMAGE;
/// Shared with every provider: they all write the same `status.revision` and `phase`.
pub use banlieue_api::image::{merged_status, overall_phase, revision};
use banlieue_api::names::{self, LABEL_MANAGED_BY, LABEL_PROVIDER, LABEL_VMIMAGE};
use banlieue_api::pods;
use banlieue_api::{
    ArtifactPhase, BuildArtifact, ImageSource, Provider, ProviderClass, VMImage, ZoneImageStatus,
    ZonePhase,
};
use k8s_openapi::api::batch::v1::{Job, JobSpec};
use k8s_openapi::api::core::v1::{
    Container, PersistentVolumeClaimVolumeSource, PodSpec, PodTemplateSpec, ResourceRequirements,
    Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use sha2::{Digest, Sha256};

pub use banlieue_provider_kit::import_settings::{DEFAULT_ARTIFACTS_CLAIM, ImportSettings};
/// Where the import Job mounts the artifacts PVC.
pub const ARTIFACTS_MOUNT: &str = "/artifacts";
/// The value of `app.kubernetes.io/managed-by` on import Jobs.
pub const MANAGED_BY: &str = "banlieue";
/// The import container's name.
pub const CONTAINER_NAME: &str = "import";
/// The example that carries the `jobs` grant.
pub const PROVIDER_CLASS_EXAMPLE: &str = "examples/09-providerclass-libvirt.yaml";

/// The volume a Url import writes in each pool: `<image>-<revision>.raw`. The revision in the
/// name means a new revision never overwrites a volume that running machines use as backing.
pub fn url_volume_name(image: &str, revision: &str) -> String {
    format!("{image}-{revision}.raw")
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

/// The import Job for `request` on `provider`. Its name is a function of the request, which
/// is what makes adoption possible.
pub fn import_job(request: &ImportRequest<'_>, provider: &Provider, class: &ProviderClass) -> Job {
    let provider_name = provider.metadata.name.as_deref().unwrap_or_default();
    let settings = ImportSettings::of(class);
    let labels = job_labels(request.image, provider_name);
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
                    labels: Some(labels),
                    ..ObjectMeta::default()
                }),
                spec: Some(PodSpec {
                    restart_policy: Some("Never".into()),
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

/// A zone of a source whose kind this provider cannot import (a vSphere Template).
pub fn zone_wrong_kind(pool: &str, class: &str) -> ZoneImageStatus {
    ZoneImageStatus {
        pool: pool.to_owned(),
        phase: ZonePhase::Failed,
        volume: None,
        message: Some(format!(
            "the source for class {class} is a Template, which only vSphere providers clone;              a libvirt class needs a Url or BackingFile source"
        )),
    }
}

/// A zone whose build half is not finished: the problem is upstream.
pub fn zone_build_pending(pool: &str, why: &str) -> ZoneImageStatus {
    ZoneImageStatus {
        pool: pool.to_owned(),
        phase: ZonePhase::BuildPending,
        volume: None,
        message: Some(why.to_owned()),
    }
}

/// A zone mirrored from its import Job: Complete → Ready, Failed → Failed with the Job's
/// reason and message, anything else → Importing.
pub fn zone_from_job(pool: &str, volume: &str, job: &Job) -> ZoneImageStatus {
    let name = job.metadata.name.as_deref().unwrap_or_default();
    let namespace = job.metadata.namespace.as_deref().unwrap_or_default();
    let conditions = job
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_deref())
        .unwrap_or_default();
    let holds = |type_: &str| {
        conditions
            .iter()
            .find(|c| c.type_ == type_ && c.status == "True")
    };
    let (phase, message) = if holds("Complete").is_some() {
        (ZonePhase::Ready, None)
    } else if let Some(failed) = holds("Failed") {
        let reason = failed.reason.as_deref().unwrap_or("Failed");
        let detail = failed.message.as_deref().unwrap_or("");
        (
            ZonePhase::Failed,
            Some(format!(
                "import Job {namespace}/{name} failed: {reason}: {detail}; its log says why \
                 (kubectl -n {namespace} logs job/{name}); delete the Job to retry"
            )),
        )
    } else {
        (
            ZonePhase::Importing,
            Some(format!("import Job {namespace}/{name} is running")),
        )
    };
    ZoneImageStatus {
        pool: pool.to_owned(),
        phase,
        volume: Some(volume.to_owned()),
        message,
    }
}

/// A zone whose Job could not be created because the provider may not create Jobs there.
pub fn zone_jobs_forbidden(
    pool: &str,
    volume: &str,
    namespace: &str,
    class: &str,
) -> ZoneImageStatus {
    ZoneImageStatus {
        pool: pool.to_owned(),
        phase: ZonePhase::Failed,
        volume: Some(volume.to_owned()),
        message: Some(format!(
            "creating the import Job was forbidden (403 on jobs in namespace {namespace}): \
             ProviderClass {class} is missing additionalRules granting create, get, list and \
             watch on batch/jobs; see {PROVIDER_CLASS_EXAMPLE}"
        )),
    }
}

/// An Importing zone whose Job's ServiceAccount does not exist: its pods cannot be created.
pub fn with_missing_service_account(
    mut zone: ZoneImageStatus,
    namespace: &str,
    service_account: &str,
    class: &str,
) -> ZoneImageStatus {
    if zone.phase == ZonePhase::Importing {
        zone.message = Some(format!(
            "ServiceAccount {service_account} not found in namespace {namespace}, so the import \
             Job's pods cannot be created: create it there with read access to Providers, their \
             Secrets and CA ConfigMaps, or set spec.import.serviceAccountName on ProviderClass \
             {class} to one that exists"
        ));
    }
    zone
}

/// Whether `volume` is one the Provider declared for BackingFile sources
/// (`capabilities.backingFileVolumes`: exact names, or prefixes ending in `*`).
pub fn is_declared_backing_file(volume: &str, declared: &[String]) -> bool {
    declared.iter().any(|d| match d.strip_suffix('*') {
        Some(prefix) => volume.starts_with(prefix),
        None => d == volume,
    })
}

/// Why a BackingFile source may not name a volume; [`BackingFileRefusal::message`] says it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BackingFileRefusal {
    /// A machine's own OS disk or seed (another guest's disk or user-data): never.
    MachineVolume(String),
    /// Not in the Provider's `capabilities.backingFileVolumes`. A LibvirtMachine may still
    /// name it if an import made it.
    Undeclared(String),
}

impl BackingFileRefusal {
    pub fn message(&self) -> &str {
        match self {
            BackingFileRefusal::MachineVolume(m) | BackingFileRefusal::Undeclared(m) => m,
        }
    }
}

/// Why a BackingFile source may not name `volume` on this Provider, or `None` when it may: a
/// machine's OS disk or seed never, any other volume only when the administrator declared it.
pub fn backing_file_refusal(
    volume: &str,
    provider: &str,
    declared: &[String],
) -> Option<BackingFileRefusal> {
    if crate::names::is_machine_volume(volume) {
        return Some(BackingFileRefusal::MachineVolume(format!(
            "volume {volume} is a machine's own disk or seed: a BackingFile can never name one"
        )));
    }
    (!is_declared_backing_file(volume, declared)).then(|| {
        BackingFileRefusal::Undeclared(format!(
            "volume {volume} is not declared for BackingFile sources on Provider {provider} \
             (spec.capabilities.backingFileVolumes)"
        ))
    })
}

/// Whether a BackingFile volume is in a pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Presence {
    Present,
    Absent,
    /// The pool itself is missing or the host could not be asked; the text says which.
    Unknown(String),
    /// Not looked for: the source may not name it ([`backing_file_refusal`]).
    Refused(String),
}

/// A BackingFile zone: Ready when the named volume is in the pool, otherwise Failed with the
/// guide's `volume … is not in pool` so the scheduler reports ImageNotReady.
pub fn zone_backing_file(pool: &str, volume: &str, presence: &Presence) -> ZoneImageStatus {
    let (phase, message) = match presence {
        Presence::Refused(why) => (ZonePhase::Failed, Some(why.clone())),
        Presence::Present => (ZonePhase::Ready, None),
        Presence::Absent => (
            ZonePhase::Failed,
            Some(format!(
                "volume {volume} is not in pool {pool}: a BackingFile must already be there \
                 (virsh vol-list {pool})"
            )),
        ),
        Presence::Unknown(why) => (ZonePhase::Failed, Some(why.clone())),
    };
    ZoneImageStatus {
        pool: pool.to_owned(),
        phase,
        volume: Some(volume.to_owned()),
        message,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use banlieue_api::{
        FailureDomain, ImportJobSettings, InstallMode, LocalObjectReference, ProviderClassSpec,
        ProviderConnection, ProviderSpec, ProviderStatus, StorageClassMapping, StorageTarget,
        VMImageSpec, ValueOrSource,
    };
    use banlieue_api::{ImagePhase, ImageSourceKind, ProviderImageStatus, VMImageStatus};
    use k8s_openapi::api::batch::v1::{JobCondition, JobStatus};

    fn image(revision: Option<&str>, url: &str) -> VMImage {
        VMImage::new(
            "ubuntu",
            VMImageSpec {
                install_mode: InstallMode::Immediate,
                revision: revision.map(str::to_owned),
                disk_size: None,
                sources: vec![ImageSource {
                    provider_class: "libvirt".into(),
                    kind: ImageSourceKind::Url,
                    url: Some(url.into()),
                    volume: None,
                    template: None,
                    pull_secret_name: None,
                    ca_config_map_name: None,
                    plain_http: false,
                    token_realm_hosts: Vec::new(),
                }],
            },
        )
    }

    fn provider(pools: &[(&str, &str)]) -> Provider {
        let mut p = Provider::new(
            "edge-7",
            ProviderSpec {
                provider_class_ref: LocalObjectReference::new("libvirt"),
                connection: ProviderConnection {
                    endpoint: "qemu+tls://h/system".into(),
                    credentials_ref: LocalObjectReference::new("creds"),
                    ca_bundle: ValueOrSource::default(),
                },
                capabilities: Default::default(),
                attestation: None,
            },
        );
        p.metadata.namespace = Some("banlieue-system".into());
        p.status = Some(ProviderStatus {
            failure_domains: vec![FailureDomain {
                name: "h".into(),
                storage_classes: pools
                    .iter()
                    .map(|(name, pool)| StorageClassMapping {
                        name: (*name).into(),
                        target: StorageTarget {
                            pool: (*pool).into(),
                        },
                    })
                    .collect(),
                ..FailureDomain::default()
            }],
            ..ProviderStatus::default()
        });
        p
    }

    fn class(import: ImportJobSettings) -> ProviderClass {
        ProviderClass::new(
            "libvirt",
            ProviderClassSpec {
                image: "banlieue:dev".into(),
                command: vec!["/banlieue".into()],
                args: vec!["--log-format=json".into()],
                machine_kind: Default::default(),
                additional_rules: vec![],
                import,
                pod: Default::default(),
            },
        )
    }

    fn artifact(size: Option<u64>) -> Artifact {
        Artifact {
            path: "ubuntu.raw".into(),
            sha256: Some("ab".repeat(32)),
            size_bytes: size,
        }
    }

    fn request<'a>(artifact: &'a Artifact) -> ImportRequest<'a> {
        ImportRequest {
            image: "ubuntu",
            image_namespace: "banlieue-system",
            revision: "v3",
            volume: "ubuntu-v3.raw",
            pool: "nvme",
            artifact,
        }
    }

    fn job_with(condition: Option<(&str, &str, &str)>) -> Job {
        let artifact = artifact(Some(2_000_000_000));
        let mut job = import_job(
            &request(&artifact),
            &provider(&[("gold", "nvme")]),
            &class(Default::default()),
        );
        job.status = Some(JobStatus {
            conditions: condition.map(|(t, reason, message)| {
                vec![JobCondition {
                    type_: t.into(),
                    status: "True".into(),
                    reason: Some(reason.into()),
                    message: Some(message.into()),
                    ..JobCondition::default()
                }]
            }),
            ..JobStatus::default()
        });
        job
    }

    #[test]
    fn revision_is_the_spec_or_follows_the_sources() {
        assert_eq!(revision(&image(Some("v3"), "oci://a")), "v3");
        let a = revision(&image(None, "oci://a"));
        assert_eq!(a, revision(&image(None, "oci://a")));
        assert_ne!(a, revision(&image(None, "oci://b")));
        assert_eq!(a.len(), 11);
        assert_eq!(url_volume_name("ubuntu", &a), format!("ubuntu-{a}.raw"));
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

    #[test]
    fn zones_mirror_the_job() {
        let z = zone_from_job("nvme", "v.raw", &job_with(None));
        assert_eq!(z.phase, ZonePhase::Importing);
        let z = zone_from_job("nvme", "v.raw", &job_with(Some(("Complete", "", ""))));
        assert_eq!((z.phase, z.message), (ZonePhase::Ready, None));
        let z = zone_from_job(
            "nvme",
            "v.raw",
            &job_with(Some((
                "Failed",
                "BackoffLimitExceeded",
                "Job has reached the specified backoff limit",
            ))),
        );
        assert_eq!(z.phase, ZonePhase::Failed);
        let message = z.message.unwrap();
        assert!(
            message.contains("BackoffLimitExceeded: Job has reached"),
            "{message}"
        );
        let sa = with_missing_service_account(
            zone_from_job("nvme", "v.raw", &job_with(None)),
            "banlieue-imagebuild",
            "importer",
            "libvirt",
        );
        assert!(
            sa.message
                .unwrap()
                .contains("ServiceAccount importer not found")
        );
        let forbidden = zone_jobs_forbidden("nvme", "v.raw", "banlieue-imagebuild", "libvirt");
        assert_eq!(forbidden.phase, ZonePhase::Failed);
        assert!(forbidden.message.unwrap().contains("additionalRules"));
    }

    #[test]
    fn a_backing_file_must_be_declared_and_never_a_machines_volume() {
        let declared = ["base.qcow2".to_owned(), "golden-*".to_owned()];
        assert_eq!(backing_file_refusal("base.qcow2", "p", &declared), None);
        assert_eq!(
            backing_file_refusal("golden-2404.raw", "p", &declared),
            None
        );
        let undeclared = backing_file_refusal("base.qcow2.bak", "p", &declared).unwrap();
        assert!(
            matches!(&undeclared, BackingFileRefusal::Undeclared(m) if m.contains("not declared")),
            "{undeclared:?}"
        );
        assert!(backing_file_refusal("golden", "p", &declared).is_some());
        // Whatever the declaration says: not another guest's disk or seed.
        let everything = ["*".to_owned()];
        for volume in ["golden-ns-vm-os.qcow2", "ns-vm-cidata.iso"] {
            let why = backing_file_refusal(volume, "p", &everything).unwrap();
            assert!(
                matches!(&why, BackingFileRefusal::MachineVolume(_))
                    && why.message().contains("a machine's own disk or seed"),
                "{why:?}"
            );
        }
        assert!(
            backing_file_refusal("any.raw", "p", &[]).is_some(),
            "nothing declared"
        );
    }

    #[test]
    fn backing_file_zone_is_ready_only_when_present() {
        assert_eq!(
            zone_backing_file("p", "base.qcow2", &Presence::Present).phase,
            ZonePhase::Ready
        );
        let absent = zone_backing_file("p", "base.qcow2", &Presence::Absent);
        assert_eq!(absent.phase, ZonePhase::Failed);
        assert!(
            absent
                .message
                .unwrap()
                .contains("volume base.qcow2 is not in pool p")
        );
    }

    #[test]
    fn merging_keeps_other_providers_and_recomputes_the_phase() {
        let zone = |pool: &str, phase| ZoneImageStatus {
            pool: pool.into(),
            phase,
            volume: None,
            message: None,
        };
        let current = VMImageStatus {
            per_provider: vec![ProviderImageStatus {
                provider: "other".into(),
                zones: vec![zone("a", ZonePhase::Failed)],
            }],
            ..VMImageStatus::default()
        };
        let merged = merged_status(
            Some(&current),
            "edge-7",
            vec![zone("b", ZonePhase::Importing)],
            "r1",
        );
        assert_eq!(merged.per_provider.len(), 2);
        assert_eq!(merged.per_provider[0], current.per_provider[0]);
        assert_eq!(merged.phase, Some(ImagePhase::Importing));
        assert_eq!(merged.revision.as_deref(), Some("r1"));
        let again = merged_status(
            Some(&merged),
            "edge-7",
            vec![zone("b", ZonePhase::Failed)],
            "r1",
        );
        assert_eq!(again.per_provider.len(), 2);
        assert_eq!(again.phase, Some(ImagePhase::Failed));
        let ready = merged_status(
            Some(&again),
            "edge-7",
            vec![zone("b", ZonePhase::Ready)],
            "r1",
        );
        assert_eq!(ready.phase, Some(ImagePhase::Ready));
        assert_eq!(
            overall_phase(&VMImageStatus::default()),
            ImagePhase::Pending
        );
    }
}

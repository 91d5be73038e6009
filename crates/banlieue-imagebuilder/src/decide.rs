//! The pure half of the build reconcile: which build a VMImage needs, the build Job that makes
//! it, and what `status.buildArtifact` says meanwhile.

use std::collections::BTreeMap;

use banlieue_api::image::ARTIFACT_KIND_CLOUD_IMAGE;
use banlieue_api::names::{self, LABEL_MANAGED_BY, LABEL_VMIMAGE};
use banlieue_api::{ArtifactPhase, BuildArtifact, ImageSource, ImageSourceKind, VMImage};
use banlieue_api::{artifacts, pods};
use k8s_openapi::api::batch::v1::{Job, JobSpec};
use k8s_openapi::api::core::v1::{
    Container, PersistentVolumeClaimVolumeSource, PodSpec, PodTemplateSpec, ResourceRequirements,
    Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use sha2::{Digest, Sha256};

use crate::reason::{BuildError, Reason};

/// `app.kubernetes.io/managed-by` on build Jobs: what the reconciler lists and watches.
pub const MANAGED_BY: &str = "banlieue-imagebuilder";
/// The namespace of the VMImage a build Job serves (Jobs cannot be owned across namespaces).
pub const LABEL_VMIMAGE_NAMESPACE: &str = "banlieue.io/vmimage-namespace";
/// The builder container's name.
pub const CONTAINER_NAME: &str = "build";
/// Where a build Job mounts the artifacts PVC, as import Jobs do.
pub const ARTIFACTS_MOUNT: &str = "/artifacts";
/// The user the builder runs as (the image's `nonroot`); the artifacts volume must let it write.
pub const BUILD_UID: i64 = pods::NONROOT_UID;
/// A build's deadline: pulling and converting tens of GiB fits in it; a stuck one ends Failed.
pub const BUILD_DEADLINE_SECONDS: i64 = 6 * 3600;

/// Where build Jobs run and what they run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BuildSettings {
    /// The build namespace (ADR-0016), where the artifacts PVC is.
    pub namespace: String,
    /// The artifacts PVC.
    pub artifacts_claim: String,
    /// The ServiceAccount build pods run as.
    pub service_account: String,
    /// The container image of build pods: banlieue's own.
    pub image: String,
    /// Its command; the build arguments follow.
    pub command: Vec<String>,
}

impl Default for BuildSettings {
    fn default() -> Self {
        BuildSettings {
            namespace: names::DEFAULT_BUILD_NAMESPACE.to_owned(),
            artifacts_claim: "banlieue-artifacts".to_owned(),
            service_account: "banlieue-build".to_owned(),
            image: "localhost/banlieue:0.1.0".to_owned(),
            command: vec!["/banlieue".to_owned()],
        }
    }
}

/// Refuses `registry` (a reference's host, with its port when it names one) unless it is on
/// `allowed`, compared without case; an empty list allows every registry. A site that lets
/// VMImage authors name any URL otherwise has its image builder contact any HTTPS host they
/// choose, from inside the cluster.
pub fn registry_refusal(registry: &str, allowed: &[String]) -> Option<crate::reason::BuildError> {
    if allowed.is_empty() || allowed.iter().any(|a| a.eq_ignore_ascii_case(registry)) {
        return None;
    }
    Some(crate::reason::BuildError::new(
        crate::reason::Reason::RegistryNotAllowed,
        format!(
            "registry {registry} is not one the image builder may pull from (--allowed-registries: {})",
            allowed.join(", ")
        ),
    ))
}

/// The source a build serves: the image's first `Url` source. (A VMImage has one build
/// artifact; a second Url source, for another provider class, would need its own.)
pub fn url_source(image: &VMImage) -> Option<&ImageSource> {
    image
        .spec
        .sources
        .iter()
        .find(|s| s.kind == ImageSourceKind::Url && s.url.is_some())
}

/// The artifact file of a manifest digest, relative to the artifacts volume: a function of the
/// digest alone, so two VMImages naming the same content share one file and one build.
pub fn artifact_path(manifest_digest: &str) -> String {
    format!("{}.raw", manifest_digest.replace(':', "-"))
}

/// What a build Job of the current digest says, as far as the reconcile cares.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum JobState {
    Absent,
    Running,
    Succeeded,
    /// Failed, with the Job's own reason and message.
    Failed(String),
}

/// What the reconcile does for one VMImage.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Plan {
    /// Replace `status.buildArtifact` with this.
    pub status: Option<BuildArtifact>,
    /// Create the build Job of this digest.
    pub create_job: Option<String>,
}

/// Decides from the resolved digest (or why it did not resolve), the artifact the status holds
/// and the state of the digest's Job.
pub fn plan(
    current: Option<&BuildArtifact>,
    resolved: Result<&str, &BuildError>,
    job: &JobState,
) -> Plan {
    let digest = match resolved {
        Ok(digest) => digest,
        Err(e) => {
            // A Ready artifact keeps serving while its tag cannot be resolved: the registry
            // being down is no reason to stop using what was built (the Event says it).
            if current.is_some_and(|a| a.phase == ArtifactPhase::Ready) {
                return Plan::default();
            }
            let failed = BuildArtifact {
                kind: ARTIFACT_KIND_CLOUD_IMAGE.to_owned(),
                phase: ArtifactPhase::Failed,
                reason: Some(e.reason.as_str().to_owned()),
                message: Some(e.message.clone()),
                ..BuildArtifact::default()
            };
            return Plan {
                status: (current != Some(&failed)).then_some(failed),
                create_job: None,
            };
        }
    };
    let same_digest = current.is_some_and(|a| a.manifest_digest.as_deref() == Some(digest));
    if same_digest && current.is_some_and(|a| a.phase == ArtifactPhase::Ready) {
        return Plan::default();
    }
    let pending = |message: String| BuildArtifact {
        kind: ARTIFACT_KIND_CLOUD_IMAGE.to_owned(),
        phase: ArtifactPhase::Pending,
        manifest_digest: Some(digest.to_owned()),
        message: Some(message),
        ..BuildArtifact::default()
    };
    match job {
        // No Job for this digest: a new digest, or a failed build whose Job someone deleted to
        // retry it. Either way, build.
        JobState::Absent => Plan {
            status: Some(pending(format!("building {digest}"))),
            create_job: Some(digest.to_owned()),
        },
        // The builder reports its own progress; only a status still about another digest is
        // replaced (the builder's writes are guarded by the digest).
        JobState::Running if !same_digest => Plan {
            status: Some(pending(format!("building {digest}"))),
            create_job: None,
        },
        JobState::Running | JobState::Succeeded => Plan::default(),
        JobState::Failed(why) => {
            // The builder's own reason wins; a Job that died without one is BuildJobFailed.
            let reported = same_digest
                && current.is_some_and(|a| a.phase == ArtifactPhase::Failed && a.reason.is_some());
            if reported {
                return Plan::default();
            }
            Plan {
                status: Some(BuildArtifact {
                    kind: ARTIFACT_KIND_CLOUD_IMAGE.to_owned(),
                    phase: ArtifactPhase::Failed,
                    manifest_digest: Some(digest.to_owned()),
                    reason: Some(Reason::BuildJobFailed.as_str().to_owned()),
                    message: Some(format!("{why}; delete the Job to build again")),
                    ..BuildArtifact::default()
                }),
                create_job: None,
            }
        }
    }
}

/// The state of a build Job from its status.
pub fn job_state(job: Option<&Job>) -> JobState {
    let Some(job) = job else {
        return JobState::Absent;
    };
    let conditions = job
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .map(Vec::as_slice)
        .unwrap_or_default();
    for c in conditions {
        if c.status != "True" {
            continue;
        }
        match c.type_.as_str() {
            "Complete" | "SuccessCriteriaMet" => return JobState::Succeeded,
            "Failed" | "FailureTarget" => {
                let name = job.metadata.name.as_deref().unwrap_or_default();
                return JobState::Failed(format!(
                    "build Job {name} failed: {}: {}",
                    c.reason.as_deref().unwrap_or("Failed"),
                    c.message.as_deref().unwrap_or("")
                ));
            }
            _ => {}
        }
    }
    JobState::Running
}

/// A build Job's name: `build-<image>-` and 12 hex digits of the SHA-256 of the image's
/// namespace, name and the digest, within 63 characters. A function of what it builds, so a
/// reconcile that runs again adopts the Job instead of starting a second pull.
pub fn job_name(image_namespace: &str, image: &str, digest: &str) -> String {
    let mut hasher = Sha256::new();
    for field in [image_namespace, image, digest] {
        hasher.update((field.len() as u64).to_be_bytes());
        hasher.update(field.as_bytes());
    }
    let hash: String = hasher.finalize()[..6]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let readable = format!("build-{image}");
    let keep = names::MAX_NAME_LEN - hash.len() - 1;
    let prefix = readable
        .get(..keep.min(readable.len()))
        .unwrap_or(&readable)
        .trim_end_matches(['-', '.']);
    format!("{prefix}-{hash}")
}

/// The labels of a build Job and its pods.
pub fn job_labels(image_namespace: &str, image: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (LABEL_VMIMAGE.to_owned(), image.to_owned()),
        (
            LABEL_VMIMAGE_NAMESPACE.to_owned(),
            image_namespace.to_owned(),
        ),
        (LABEL_MANAGED_BY.to_owned(), MANAGED_BY.to_owned()),
    ])
}

/// The builder's arguments after the image's command: the guide's command line.
pub fn build_args(
    image_namespace: &str,
    image: &str,
    pinned_reference: &str,
    credentials_namespace: &str,
) -> Vec<String> {
    [
        "imagebuild",
        "run",
        "--vmimage",
        image,
        "--namespace",
        image_namespace,
        "--credentials-namespace",
        credentials_namespace,
        "--reference",
        pinned_reference,
        "--artifacts",
        ARTIFACTS_MOUNT,
    ]
    .into_iter()
    .map(str::to_owned)
    .collect()
}

/// The build Job of `image` at `pinned_reference` (`repository@digest`), its pod placed by
/// how the artifacts volume is shared (`sharing`).
pub fn build_job(
    settings: &BuildSettings,
    image_namespace: &str,
    image: &str,
    digest: &str,
    pinned_reference: &str,
    sharing: artifacts::Sharing,
) -> Job {
    let labels = job_labels(image_namespace, image);
    let placement = artifacts::placement(&settings.artifacts_claim, sharing);
    let mut pod_labels = labels.clone();
    pod_labels.extend(placement.labels);
    let q = |s: &str| Quantity(s.to_owned());
    let mut args = settings.command.clone();
    args.extend(build_args(
        image_namespace,
        image,
        pinned_reference,
        &settings.namespace,
    ));
    let (command, args) = match args.split_first() {
        Some((first, rest)) => (vec![first.clone()], rest.to_vec()),
        None => (Vec::new(), args),
    };
    Job {
        metadata: ObjectMeta {
            name: Some(job_name(image_namespace, image, digest)),
            namespace: Some(settings.namespace.clone()),
            labels: Some(labels.clone()),
            ..ObjectMeta::default()
        },
        spec: Some(JobSpec {
            // One retry: a build that failed on a registry hiccup gets a second chance; one
            // that failed on its content fails the same way again.
            backoff_limit: Some(1),
            active_deadline_seconds: Some(BUILD_DEADLINE_SECONDS),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(pod_labels),
                    ..ObjectMeta::default()
                }),
                spec: Some(PodSpec {
                    restart_policy: Some("Never".into()),
                    affinity: placement.affinity,
                    service_account_name: Some(settings.service_account.clone()),
                    // Volumes that honour fsGroup become writable by the builder.
                    security_context: Some(pods::restricted_pod(Some(BUILD_UID))),
                    containers: vec![Container {
                        name: CONTAINER_NAME.into(),
                        image: Some(settings.image.clone()),
                        command: (!command.is_empty()).then_some(command),
                        args: Some(args),
                        resources: Some(ResourceRequirements {
                            requests: Some(BTreeMap::from([
                                ("cpu".to_owned(), q("250m")),
                                ("memory".to_owned(), q("64Mi")),
                            ])),
                            limits: Some(BTreeMap::from([
                                ("cpu".to_owned(), q("2")),
                                ("memory".to_owned(), q("256Mi")),
                            ])),
                            ..ResourceRequirements::default()
                        }),
                        security_context: Some(pods::restricted_container()),
                        volume_mounts: Some(vec![VolumeMount {
                            name: "artifacts".into(),
                            mount_path: ARTIFACTS_MOUNT.into(),
                            ..VolumeMount::default()
                        }]),
                        ..Container::default()
                    }],
                    volumes: Some(vec![Volume {
                        name: "artifacts".into(),
                        persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                            claim_name: settings.artifacts_claim.clone(),
                            read_only: Some(false),
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

    #[test]
    fn only_listed_registries_are_contacted_when_a_list_is_given() {
        let allowed = vec!["registry.corp.test".to_owned(), "127.0.0.1:5000".to_owned()];
        assert!(registry_refusal("anything.example", &[]).is_none());
        assert!(registry_refusal("Registry.Corp.Test", &allowed).is_none());
        assert!(registry_refusal("127.0.0.1:5000", &allowed).is_none());
        let refused = registry_refusal("127.0.0.1:5001", &allowed).expect("another port");
        assert_eq!(refused.reason, crate::reason::Reason::RegistryNotAllowed);
        assert_eq!(
            refused.message,
            "registry 127.0.0.1:5001 is not one the image builder may pull from \
             (--allowed-registries: registry.corp.test, 127.0.0.1:5000)"
        );
    }
    use k8s_openapi::api::batch::v1::{JobCondition, JobStatus};

    const D1: &str = "sha256:1111111111111111111111111111111111111111111111111111111111111111";
    const D2: &str = "sha256:2222222222222222222222222222222222222222222222222222222222222222";

    fn artifact(phase: ArtifactPhase, digest: &str, reason: Option<&str>) -> BuildArtifact {
        BuildArtifact {
            kind: ARTIFACT_KIND_CLOUD_IMAGE.into(),
            phase,
            manifest_digest: Some(digest.into()),
            reason: reason.map(str::to_owned),
            ..BuildArtifact::default()
        }
    }

    #[test]
    fn a_new_digest_gets_a_job_and_a_pending_status() {
        let p = plan(None, Ok(D1), &JobState::Absent);
        assert_eq!(p.create_job.as_deref(), Some(D1));
        let s = p.status.expect("status");
        assert_eq!(s.phase, ArtifactPhase::Pending);
        assert_eq!(s.manifest_digest.as_deref(), Some(D1));
        // A moved tag: the Ready artifact of D1 gives way to the build of D2.
        let ready = artifact(ArtifactPhase::Ready, D1, None);
        let p = plan(Some(&ready), Ok(D2), &JobState::Absent);
        assert_eq!(p.create_job.as_deref(), Some(D2));
    }

    #[test]
    fn a_ready_artifact_of_the_digest_needs_nothing() {
        let ready = artifact(ArtifactPhase::Ready, D1, None);
        assert_eq!(
            plan(Some(&ready), Ok(D1), &JobState::Absent),
            Plan::default()
        );
        assert_eq!(
            plan(Some(&ready), Ok(D1), &JobState::Succeeded),
            Plan::default()
        );
    }

    #[test]
    fn an_unresolvable_tag_fails_unless_something_was_built() {
        let e = BuildError::new(Reason::Unauthorized, "401");
        let p = plan(None, Err(&e), &JobState::Absent);
        let s = p.status.expect("status");
        assert_eq!(s.phase, ArtifactPhase::Failed);
        assert_eq!(s.reason.as_deref(), Some("Unauthorized"));
        assert!(p.create_job.is_none());
        // Written once, not at every resync.
        assert_eq!(plan(Some(&s), Err(&e), &JobState::Absent), Plan::default());
        let ready = artifact(ArtifactPhase::Ready, D1, None);
        assert_eq!(
            plan(Some(&ready), Err(&e), &JobState::Absent),
            Plan::default()
        );
    }

    #[test]
    fn a_failed_job_keeps_the_builders_reason_or_says_it_died() {
        let failed = JobState::Failed("build Job x failed: BackoffLimitExceeded: ".into());
        let reported = artifact(ArtifactPhase::Failed, D1, Some("DigestMismatch"));
        assert_eq!(plan(Some(&reported), Ok(D1), &failed), Plan::default());
        let building = artifact(ArtifactPhase::Building, D1, None);
        let s = plan(Some(&building), Ok(D1), &failed)
            .status
            .expect("status");
        assert_eq!(s.reason.as_deref(), Some("BuildJobFailed"));
        assert!(
            s.message
                .as_deref()
                .is_some_and(|m| m.contains("delete the Job"))
        );
        // A Job deleted after failing is built again.
        assert_eq!(
            plan(Some(&reported), Ok(D1), &JobState::Absent)
                .create_job
                .as_deref(),
            Some(D1)
        );
    }

    #[test]
    fn running_jobs_report_for_themselves() {
        let building = artifact(ArtifactPhase::Building, D1, None);
        assert_eq!(
            plan(Some(&building), Ok(D1), &JobState::Running),
            Plan::default()
        );
        let old = artifact(ArtifactPhase::Ready, D2, None);
        let p = plan(Some(&old), Ok(D1), &JobState::Running);
        assert_eq!(p.status.map(|s| s.phase), Some(ArtifactPhase::Pending));
        assert!(p.create_job.is_none());
    }

    #[test]
    fn job_states_come_from_conditions() {
        let with = |type_: &str| Job {
            status: Some(JobStatus {
                conditions: Some(vec![JobCondition {
                    type_: type_.into(),
                    status: "True".into(),
                    reason: Some("R".into()),
                    message: Some("m".into()),
                    ..JobCondition::default()
                }]),
                ..JobStatus::default()
            }),
            ..Job::default()
        };
        assert_eq!(job_state(None), JobState::Absent);
        assert_eq!(job_state(Some(&Job::default())), JobState::Running);
        assert_eq!(job_state(Some(&with("Complete"))), JobState::Succeeded);
        assert!(
            matches!(job_state(Some(&with("Failed"))), JobState::Failed(m) if m.contains("R: m"))
        );
    }

    #[test]
    fn job_names_are_stable_short_and_distinct() {
        let a = job_name("ns", "debian", D1);
        assert_eq!(a, job_name("ns", "debian", D1));
        assert_ne!(a, job_name("ns", "debian", D2));
        assert_ne!(a, job_name("other", "debian", D1));
        assert!(a.starts_with("build-debian-"));
        let long = job_name("ns", &"x".repeat(253), D1);
        assert!(long.len() <= names::MAX_NAME_LEN);
        assert_eq!(artifact_path(D1), format!("sha256-{}.raw", &D1[7..]));
    }

    #[test]
    fn the_job_runs_the_builder_unprivileged_on_the_artifacts_volume() {
        let settings = BuildSettings::default();
        let job = build_job(
            &settings,
            "banlieue-system",
            "debian",
            D1,
            "r/x@sha256:1",
            artifacts::Sharing::OneNode,
        );
        let template = job.spec.map(|s| s.template).expect("template");
        // Placed with the artifacts volume's other users (banlieue_api::artifacts).
        let labels = template.metadata.and_then(|m| m.labels).unwrap_or_default();
        assert_eq!(
            labels
                .get(artifacts::LABEL_ARTIFACTS_CLAIM)
                .map(String::as_str),
            Some("banlieue-artifacts")
        );
        let pod = template.spec.expect("pod");
        assert_eq!(
            pod.affinity,
            artifacts::placement("banlieue-artifacts", artifacts::Sharing::OneNode).affinity
        );
        assert_eq!(pod.service_account_name.as_deref(), Some("banlieue-build"));
        let c = &pod.containers[0];
        assert_eq!(c.command.as_deref(), Some(&["/banlieue".to_owned()][..]));
        let args = c.args.clone().unwrap_or_default();
        assert_eq!(&args[..2], ["imagebuild", "run"]);
        assert!(
            args.windows(2)
                .any(|w| w == ["--reference", "r/x@sha256:1"])
        );
        // The registry's credentials are read in the build namespace, not the VMImage's.
        assert!(
            args.windows(2)
                .any(|w| w == ["--credentials-namespace", "banlieue-imagebuild"]),
            "{args:?}"
        );
        let sc = c.security_context.as_ref().expect("security context");
        assert_eq!(sc.read_only_root_filesystem, Some(true));
        assert_eq!(
            pod.volumes
                .as_ref()
                .and_then(|v| v[0].persistent_volume_claim.as_ref())
                .map(|p| p.claim_name.as_str()),
            Some("banlieue-artifacts")
        );
    }
}

//! What each zone of this provider's entry says while its import runs: mirrored from the Job,
//! or why there is no Job.

use banlieue_api::{ZoneImageStatus, ZonePhase};
use k8s_openapi::api::batch::v1::Job;

use super::PROVIDER_CLASS_EXAMPLE;

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::image::decide::fixtures::*;
    use crate::image::decide::{merged_status, overall_phase};
    use banlieue_api::{ImagePhase, ProviderImageStatus, VMImageStatus};

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

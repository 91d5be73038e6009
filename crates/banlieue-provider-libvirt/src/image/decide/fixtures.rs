//! What the decision tests build their inputs from.

use banlieue_api::{
    FailureDomain, ImageSource, ImageSourceKind, ImportJobSettings, InstallMode,
    LocalObjectReference, Provider, ProviderClass, ProviderClassSpec, ProviderConnection,
    ProviderSpec, ProviderStatus, StorageClassMapping, StorageTarget, VMImage, VMImageSpec,
    ValueOrSource,
};
use k8s_openapi::api::batch::v1::{Job, JobCondition, JobStatus};

use super::{Artifact, ImportRequest, import_job};

pub(crate) fn image(revision: Option<&str>, url: &str) -> VMImage {
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

pub(crate) fn provider(pools: &[(&str, &str)]) -> Provider {
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

pub(crate) fn class(import: ImportJobSettings) -> ProviderClass {
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

pub(crate) fn artifact(size: Option<u64>) -> Artifact {
    Artifact {
        path: "ubuntu.raw".into(),
        sha256: Some("ab".repeat(32)),
        size_bytes: size,
    }
}

pub(crate) fn request<'a>(artifact: &'a Artifact) -> ImportRequest<'a> {
    ImportRequest {
        image: "ubuntu",
        image_namespace: "banlieue-system",
        revision: "v3",
        volume: "ubuntu-v3.raw",
        pool: "nvme",
        artifact,
    }
}

pub(crate) fn job_with(condition: Option<(&str, &str, &str)>) -> Job {
    let artifact = artifact(Some(2_000_000_000));
    let mut job = import_job(
        &request(&artifact),
        &provider(&[("gold", "nvme")]),
        &class(Default::default()),
        banlieue_api::artifacts::Sharing::OneNode,
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

//! VMImage (a guest image and where it is imported) and VMClass (a machine's size and devices).

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::common::Firmware;
use crate::conditions::Condition;
use sha2::{Digest, Sha256};

/// The desired state of a VMImage.
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "banlieue.io",
    version = "v1alpha1",
    kind = "VMImage",
    doc = "A guest image, its sources per provider class, and its import state on each provider pool.",
    plural = "vmimages",
    namespaced,
    status = "VMImageStatus",
    shortname = "vmimage",
    category = "banlieue",
    printcolumn = r#"{"name":"Mode","type":"string","jsonPath":".spec.installMode"}"#,
    printcolumn = r#"{"name":"Revision","type":"string","jsonPath":".status.revision"}"#,
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct VMImageSpec {
    /// How a machine gets its disk from this image (ADR-0040): Immediate boots an overlay over
    /// the imported image; Deferred and Manual boot the image as install media onto an empty disk.
    pub install_mode: InstallMode,
    /// The image revision. When unset, a revision is derived from the sources' content, so a
    /// changed source is a new revision.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63))]
    pub revision: Option<String>,
    /// Size of a machine's OS disk when its class does not set one. Defaults to 10Gi.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_size: Option<Quantity>,
    /// Where the image comes from, per provider class (at most 16: one per class in use).
    #[schemars(length(min = 1, max = 16))]
    pub sources: Vec<ImageSource>,
}

/// ADR-0040's disk shapes, chosen by the image, never per machine.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum InstallMode {
    /// The image is a bootable disk: each machine gets a copy-on-write overlay over it.
    Immediate,
    /// The image installs itself unattended onto each machine's empty disk.
    Deferred,
    /// Like Deferred, but a person drives the install.
    Manual,
}

/// One source of an image for one provider class.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "self.kind != 'Url' || has(self.url)", "message": "a Url source needs url"},
    {"rule": "self.kind != 'BackingFile' || has(self.volume)", "message": "a BackingFile source needs volume"},
    {"rule": "self.kind != 'Template' || has(self.template)", "message": "a Template source needs template"}
]))]
pub struct ImageSource {
    /// The provider class this source serves, for example `libvirt`.
    #[schemars(length(min = 1, max = 253))]
    pub provider_class: String,
    /// Url: built by banlieue-imagebuilder from an OCI reference and imported by Jobs.
    /// BackingFile: a volume already present in every pool.
    pub kind: ImageSourceKind,
    /// OCI reference of the image (kind Url).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 2048))]
    pub url: Option<String>,
    /// Volume name in the provider's pools (kind BackingFile).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub volume: Option<String>,
    /// Inventory path of the VM or template to clone, for example `DC0/vm/templates/ubuntu`
    /// (kind Template; vSphere).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 2048))]
    pub template: Option<String>,
    /// Registry credentials for a Url source: a Secret of type
    /// `kubernetes.io/dockerconfigjson` in the build namespace (`banlieue-imagebuild`), out of
    /// the reach of the providers of the image's namespace. Anonymous when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub pull_secret_name: Option<String>,
    /// A ConfigMap in the build namespace (`banlieue-imagebuild`) whose `ca.crt` holds the CA
    /// bundle of a private registry, trusted besides the system roots.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub ca_config_map_name: Option<String>,
    /// Speak plain HTTP to the registry. Refused unless the registry is on a loopback address.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub plain_http: bool,
    /// Hosts besides the registry's own whose token service may be given the pull Secret's
    /// credentials, over HTTPS (for Docker Hub, `auth.docker.io`). A registry naming any other
    /// token realm fails with `TokenRealmRefused`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 4), inner(length(min = 1, max = 253)))]
    pub token_realm_hosts: Vec<String>,
}

/// Kinds of image source.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum ImageSourceKind {
    Url,
    BackingFile,
    /// A vSphere template (or VM) every clone starts from.
    Template,
}

/// Observed state of a VMImage.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VMImageStatus {
    /// Ready once some provider zone holds the image; Failed when every zone failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<ImagePhase>,
    /// The effective revision: spec.revision, or one derived from the sources.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<String>,
    /// The artifact banlieue-imagebuilder produced for Url sources.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub build_artifact: Option<BuildArtifact>,
    /// Import state on each provider.
    #[serde(default)]
    pub per_provider: Vec<ProviderImageStatus>,
    /// Conditions of the image.
    #[serde(default)]
    pub conditions: Vec<Condition>,
}

/// Overall phases of an image.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(transform = crate::common::without_description)]
pub enum ImagePhase {
    Pending,
    Building,
    Importing,
    Ready,
    Failed,
}

/// The built artifact of a Url source.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BuildArtifact {
    /// Artifact kind; `cloudImage` is a raw disk image.
    pub kind: String,
    /// The PVC holding it, in the build namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim_name: Option<String>,
    /// Path of the file inside the PVC.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// Size in bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size_bytes: Option<i64>,
    /// SHA-256 of the file, hex.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
    /// Ready once the file is complete.
    pub phase: ArtifactPhase,
    /// The OCI manifest digest the artifact is built from (`sha256:…`): the source's tag as it
    /// resolved. A tag that moves to another digest is a new build and a new image revision.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub manifest_digest: Option<String>,
    /// Why the build is Pending or Failed, as a CamelCase reason (docs/guides/image-builder.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// What happened, for people (at most 4096 bytes: longer ones are cut by the writer, as
    /// condition messages are).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 4096))]
    pub message: Option<String>,
    /// Bytes of the disk written so far, while Building.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes_done: Option<i64>,
    /// Bytes of the disk in all, once known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes_total: Option<i64>,
    /// The values PCR 4 (the boot chain) and PCR 5 (the partition table) hold after an EDK2
    /// firmware (OVMF) boots this disk from its removable-media path through shim, computed
    /// from the disk when it is Ready; empty for a disk that does not boot that way. A subject
    /// recomputes them from the image it pulls by `manifestDigest` (`banlieue imagebuild pcrs`)
    /// rather than trusting them (docs/adr/0077-attested-handover.md).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 24))]
    pub pcr_references: Vec<PcrReference>,
}

/// One PCR's value a boot of an image is expected to show.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PcrReference {
    /// The PCR's index, 0-23.
    #[schemars(range(max = 23))]
    pub pcr: u32,
    /// Its SHA-256 bank's value, 64 lowercase hex digits.
    #[schemars(length(min = 64, max = 64), regex(pattern = r"^[0-9a-f]{64}$"))]
    pub sha256: String,
}

/// The one artifact kind there is.
pub const ARTIFACT_KIND_CLOUD_IMAGE: &str = "cloudImage";

/// Phases of a build artifact.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum ArtifactPhase {
    #[default]
    Pending,
    Building,
    Ready,
    Failed,
}

/// Import state of an image on one provider.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ProviderImageStatus {
    /// Name of the Provider (same namespace as the image's providers).
    pub provider: String,
    /// One entry per pool the provider advertises.
    #[serde(default)]
    pub zones: Vec<ZoneImageStatus>,
}

/// Import state of an image on one storage pool.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ZoneImageStatus {
    /// The storage pool.
    pub pool: String,
    /// Where the import stands.
    pub phase: ZonePhase,
    /// The volume holding the image in the pool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume: Option<String>,
    /// Why, when not Ready (for Failed, the import Job's failure reason).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// Phases of an image on a pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum ZonePhase {
    /// The build artifact is not Ready yet; the problem is upstream.
    BuildPending,
    /// An import Job is running.
    Importing,
    Ready,
    Failed,
}

/// The desired state of a VMClass.
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "banlieue.io",
    version = "v1alpha1",
    kind = "VMClass",
    doc = "A machine size and its devices.",
    plural = "vmclasses",
    namespaced,
    shortname = "vmclass",
    category = "banlieue",
    printcolumn = r#"{"name":"CPU","type":"integer","jsonPath":".spec.cpu"}"#,
    printcolumn = r#"{"name":"Memory","type":"string","jsonPath":".spec.memory"}"#,
    printcolumn = r#"{"name":"Firmware","type":"string","jsonPath":".spec.firmware"}"#,
    printcolumn = r#"{"name":"TPM","type":"boolean","jsonPath":".spec.tpmEnabled"}"#,
    printcolumn = r#"{"name":"SecureBoot","type":"boolean","jsonPath":".spec.secureBoot"}"#
)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "!(has(self.secureBoot) && self.secureBoot) || (has(self.firmware) && self.firmware == 'efi')",
    "message": "secureBoot needs firmware: efi"
}]))]
pub struct VMClassSpec {
    /// Virtual CPUs.
    #[schemars(range(min = 1, max = 512))]
    pub cpu: u32,
    /// Memory, as a Kubernetes quantity (for example `2Gi`).
    pub memory: Quantity,
    /// Firmware: `bios` (default) or `efi`. EFI needs no loader path: the hypervisor picks it.
    #[serde(default)]
    pub firmware: Firmware,
    /// Attach an emulated TPM 2.0. Needs a failure domain that declares the `vtpm` feature.
    #[serde(default)]
    pub tpm_enabled: bool,
    /// Boot with UEFI Secure Boot on and the firmware's default keys (Microsoft's) enrolled,
    /// so only a signed boot chain starts. Needs `firmware: efi`.
    #[serde(default)]
    pub secure_boot: bool,
    /// Size of the OS disk; overrides the image's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_size: Option<Quantity>,
    /// What members may reach over the network, enforced on the host from their first boot
    /// (default deny: only what `allow` lists). Absent: whatever the member's network allows.
    /// Needs a backend that enforces it (libvirt: its network filter driver); a member of
    /// such a class placed on one that cannot is refused, `EgressNotEnforced`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress: Option<crate::egress::ClassEgress>,
}

/// The image's effective revision: `spec.revision`, or its [`content_revision`].
pub fn revision(image: &VMImage) -> String {
    match image.spec.revision.as_deref().filter(|r| !r.is_empty()) {
        Some(r) => r.to_owned(),
        None => content_revision(image),
    }
}

/// `r` and 10 hex digits of the SHA-256 of the image's sources and of the manifest digest its
/// build artifact was made from, whatever `spec.revision` says: a changed source, or a tag
/// that moved to other content, is a new content revision (and a new volume).
pub fn content_revision(image: &VMImage) -> String {
    let mut hasher = Sha256::new();
    for source in &image.spec.sources {
        // Length-prefixed fields, so no two different source lists hash alike.
        for field in [
            source.provider_class.as_str(),
            match source.kind {
                ImageSourceKind::Url => "Url",
                ImageSourceKind::BackingFile => "BackingFile",
                ImageSourceKind::Template => "Template",
            },
            source.url.as_deref().unwrap_or(""),
            source.volume.as_deref().unwrap_or(""),
        ] {
            hasher.update((field.len() as u64).to_be_bytes());
            hasher.update(field.as_bytes());
        }
        // Only for Template sources, so that the revisions of the other kinds stay the ones
        // they always were.
        if source.kind == ImageSourceKind::Template {
            let template = source.template.as_deref().unwrap_or("");
            hasher.update((template.len() as u64).to_be_bytes());
            hasher.update(template.as_bytes());
        }
    }
    // Only when there is one, so that images without a build (BackingFile sources, or a build
    // not yet resolved) keep the revision they always had.
    if let Some(manifest) = image
        .status
        .as_ref()
        .and_then(|s| s.build_artifact.as_ref())
        .and_then(|a| a.manifest_digest.as_deref())
    {
        hasher.update(b"manifest");
        hasher.update((manifest.len() as u64).to_be_bytes());
        hasher.update(manifest.as_bytes());
    }
    let digest = hasher.finalize();
    let hex: String = digest[..5].iter().map(|b| format!("{b:02x}")).collect();
    format!("r{hex}")
}

/// `current` with this provider's entry replaced by `zones` (other providers' entries kept as
/// they are), the revision set and the overall phase recomputed.
pub fn merged_status(
    current: Option<&VMImageStatus>,
    provider: &str,
    zones: Vec<ZoneImageStatus>,
    revision: &str,
) -> VMImageStatus {
    let mut status = current.cloned().unwrap_or_default();
    let entry = ProviderImageStatus {
        provider: provider.to_owned(),
        zones,
    };
    match status
        .per_provider
        .iter_mut()
        .find(|p| p.provider == provider)
    {
        Some(existing) => *existing = entry,
        None => status.per_provider.push(entry),
    }
    status.revision = Some(revision.to_owned());
    status.phase = Some(overall_phase(&status));
    status
}

/// Ready once some zone holds the image; Failed when every zone failed; Importing while a
/// Job runs; Building or Pending while the build half is not done.
pub fn overall_phase(status: &VMImageStatus) -> ImagePhase {
    let zones: Vec<ZonePhase> = status
        .per_provider
        .iter()
        .flat_map(|p| p.zones.iter().map(|z| z.phase))
        .collect();
    if zones.contains(&ZonePhase::Ready) {
        ImagePhase::Ready
    } else if zones.contains(&ZonePhase::Importing) {
        ImagePhase::Importing
    } else if !zones.is_empty() && zones.iter().all(|z| *z == ZonePhase::Failed) {
        ImagePhase::Failed
    } else if status
        .build_artifact
        .as_ref()
        .is_some_and(|a| a.phase == ArtifactPhase::Building)
    {
        ImagePhase::Building
    } else {
        ImagePhase::Pending
    }
}

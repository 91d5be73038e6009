//! `banlieue imagebuild run`: one build, as a Job's pod runs it. Pulls the pinned manifest,
//! classifies it, streams the blobs it needs onto the artifacts volume (each checked against
//! its digest), turns the disk inside into a raw artifact, and publishes it on the VMImage,
//! reporting progress every few seconds while it works.
//!
//! The artifact is named by the manifest digest. A build takes an exclusive lock on it first,
//! so two VMImages naming the same content build it once: the second finds the completion
//! record the first wrote and publishes the same file.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use banlieue_api::image::ARTIFACT_KIND_CLOUD_IMAGE;
use banlieue_api::{ArtifactPhase, BuildArtifact, PcrReference, VMImage};
use banlieue_attest::boot::BootError;
use kube::{Api, Client};
use oci_client::Reference;

use crate::artifact::{self, ArtifactRecord, CompletionRecord};
use crate::convert;
use crate::credentials;
use crate::decide::{self, url_source};
use crate::manifest;
use crate::measure;
use crate::publish::{self, Guarded};
use crate::pull::{self, Puller};
use crate::reason::{BuildError, Reason};

/// How often a running build reports its progress on the VMImage (and in its log).
pub const PROGRESS_INTERVAL: Duration = Duration::from_secs(2);
/// The largest disk a build writes (and the largest download it makes), unless told
/// otherwise: 40 GiB. A build holds its download and the raw disk on the artifacts volume at
/// once, so the default keeps both inside the shipped volume
/// (`deploy/imagebuild/artifacts-pvc.yaml`, 100 GiB) rather than letting one VMImage fill it
/// for everyone's builds.
pub const DEFAULT_MAX_DISK_BYTES: u64 = 40 << 30;

/// What one build is asked to do (the Job's arguments).
#[derive(Clone, Debug)]
pub struct BuildArgs {
    pub vmimage: String,
    pub namespace: String,
    /// Where the pull Secret and CA ConfigMap the VMImage names live: the build namespace,
    /// out of reach of the providers that share the VMImage's namespace.
    pub credentials_namespace: String,
    /// The source's repository pinned to the digest to build (`repo@sha256:…`).
    pub reference: String,
    /// The artifacts volume's mount point.
    pub artifacts: PathBuf,
    /// The artifacts PVC's name, published with the artifact.
    pub claim_name: Option<String>,
    /// Refuse disks (and downloads) larger than this.
    pub max_disk_bytes: u64,
}

/// What a build that succeeded did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BuildOutcome {
    Built(ArtifactRecord),
    /// The artifact of this digest already existed (another VMImage, or an earlier run).
    Reused(ArtifactRecord),
    /// The VMImage has moved on to another digest; nothing was published.
    Superseded,
}

/// Progress shared between the work and the reporter.
#[derive(Debug, Default)]
struct Progress {
    done: AtomicU64,
    total: AtomicU64,
    stage: Mutex<String>,
}

impl Progress {
    fn stage(&self, stage: &str, total: u64) {
        if let Ok(mut s) = self.stage.lock() {
            *s = stage.to_owned();
        }
        self.total.store(total, Ordering::Relaxed);
        self.done.store(0, Ordering::Relaxed);
    }

    fn set(&self, done: u64) {
        self.done.store(done, Ordering::Relaxed);
    }

    fn snapshot(&self) -> (String, u64, u64) {
        let stage = self.stage.lock().map(|s| s.clone()).unwrap_or_default();
        (
            stage,
            self.done.load(Ordering::Relaxed),
            self.total.load(Ordering::Relaxed),
        )
    }
}

/// Runs one build and publishes its outcome (Ready, or Failed with its reason).
pub async fn run(kube: Client, args: BuildArgs) -> Result<BuildOutcome, BuildError> {
    let api = Api::<VMImage>::namespaced(kube.clone(), &args.namespace);
    let reference = pull::parse_reference(&args.reference)?;
    let Some(digest) = reference.digest().map(str::to_owned) else {
        return Err(BuildError::new(
            Reason::InvalidReference,
            format!("--reference {} is not pinned to a digest", args.reference),
        ));
    };
    let progress = Arc::new(Progress::default());
    let reporter = tokio::spawn(report(
        api.clone(),
        args.vmimage.clone(),
        digest.clone(),
        progress.clone(),
    ));
    let result = build(&kube, &api, &args, &reference, &digest, &progress).await;
    reporter.abort();
    let artifact = match &result {
        Ok(record) => {
            let path = args.artifacts.join(decide::artifact_path(&digest));
            let references = tokio::task::spawn_blocking(move || measure::pcr_references(&path))
                .await
                .map_err(|e| BuildError::new(Reason::StorageFailed, e.to_string()))?;
            ready(&args, &digest, record, references)
        }
        Err(e) => BuildArtifact {
            kind: ARTIFACT_KIND_CLOUD_IMAGE.to_owned(),
            phase: ArtifactPhase::Failed,
            manifest_digest: Some(digest.clone()),
            reason: Some(e.reason.as_str().to_owned()),
            message: Some(e.message.clone()),
            ..BuildArtifact::default()
        },
    };
    let published = publish::replace_if_current(&api, &args.vmimage, &digest, &artifact)
        .await
        .map_err(|e| {
            BuildError::new(
                Reason::BuildJobFailed,
                format!("publishing the outcome on VMImage {}: {e}", args.vmimage),
            )
        })?;
    match (result, published) {
        (Err(e), _) => Err(e),
        (Ok(_), Guarded::Superseded) => Ok(BuildOutcome::Superseded),
        (Ok(record), Guarded::Written) if record.reused => Ok(BuildOutcome::Reused(record.record)),
        (Ok(record), Guarded::Written) => Ok(BuildOutcome::Built(record.record)),
    }
}

struct Done {
    record: ArtifactRecord,
    reused: bool,
}

/// The Ready artifact; its message says whether the disk has PCR reference values and, if
/// not, why (a disk that does not boot through shim by EFI has none: not a failure).
fn ready(
    args: &BuildArgs,
    digest: &str,
    done: &Done,
    references: Result<Vec<PcrReference>, BootError>,
) -> BuildArtifact {
    let size = i64::try_from(done.record.size_bytes).ok();
    let (pcr_references, measured) = match references {
        Ok(references) => (
            references,
            "PCR 4 and 5 computed from its boot chain".to_owned(),
        ),
        Err(e) => (Vec::new(), format!("no PCR reference values: {e}")),
    };
    BuildArtifact {
        kind: ARTIFACT_KIND_CLOUD_IMAGE.to_owned(),
        claim_name: args.claim_name.clone(),
        path: Some(decide::artifact_path(digest)),
        size_bytes: size,
        sha256: Some(done.record.sha256.clone()),
        phase: ArtifactPhase::Ready,
        manifest_digest: Some(digest.to_owned()),
        reason: None,
        message: Some(format!("built from {}; {measured}", args.reference)),
        bytes_done: size,
        bytes_total: size,
        pcr_references,
    }
}

async fn build(
    kube: &Client,
    api: &Api<VMImage>,
    args: &BuildArgs,
    reference: &Reference,
    digest: &str,
    progress: &Arc<Progress>,
) -> Result<Done, BuildError> {
    let image = api.get(&args.vmimage).await.map_err(|e| {
        BuildError::new(
            Reason::BuildJobFailed,
            format!("reading VMImage {}/{}: {e}", args.namespace, args.vmimage),
        )
    })?;
    let source = url_source(&image).ok_or_else(|| {
        BuildError::new(
            Reason::InvalidReference,
            format!("VMImage {} has no Url source", args.vmimage),
        )
    })?;
    // The Job builds only what the image names: the same repository, at some digest.
    let declared = pull::parse_reference(source.url.as_deref().unwrap_or_default())?;
    if declared.resolve_registry() != reference.resolve_registry()
        || declared.repository() != reference.repository()
    {
        return Err(BuildError::new(
            Reason::InvalidReference,
            format!(
                "--reference {} is not the repository VMImage {} names ({})",
                args.reference,
                args.vmimage,
                source.url.as_deref().unwrap_or_default()
            ),
        ));
    }
    let access = credentials::load_access(
        kube,
        &args.credentials_namespace,
        source,
        reference.resolve_registry(),
    )
    .await?;

    // The manifest comes first, from the VMImage's own repository with its own credentials:
    // an artifact is shared by every image of the same digest, and knowing a digest (it is in
    // every VMImage's status) must not stand in for being allowed to pull it.
    let puller = Puller::new(reference, &access)?;
    progress.stage("resolving", 0);
    let raw = puller.manifest(reference).await?;

    let final_path = args.artifacts.join(decide::artifact_path(digest));
    let _lock = lock(&final_path).await?;
    if let Some(record) = reusable(&final_path, digest).await {
        tracing::info!(path = %final_path.display(), "artifact of {digest} already built");
        return Ok(Done {
            record,
            reused: true,
        });
    }

    let work = args
        .artifacts
        .join(format!(".work-{}", digest.replace(':', "-")));
    let _ = tokio::fs::remove_dir_all(&work).await;
    tokio::fs::create_dir_all(&work)
        .await
        .map_err(|e| BuildError::from_io("creating the work directory", e))?;
    let result = pull_and_convert(
        &puller,
        &raw,
        args,
        reference,
        (&final_path, &work),
        progress,
    )
    .await;
    let _ = tokio::fs::remove_dir_all(&work).await;
    let record = result?;
    let completion = CompletionRecord::new(digest, &record);
    let record_at = final_path.clone();
    tokio::task::spawn_blocking(move || artifact::write_record(&record_at, &completion))
        .await
        .map_err(|e| BuildError::new(Reason::StorageFailed, e.to_string()))?
        .map_err(convert::build_error)?;
    Ok(Done {
        record,
        reused: false,
    })
}

/// Pulls what the manifest `raw` names and converts it into `final_path`, working in `work`.
async fn pull_and_convert(
    puller: &Puller,
    raw: &[u8],
    args: &BuildArgs,
    reference: &Reference,
    (final_path, work): (&Path, &Path),
    progress: &Arc<Progress>,
) -> Result<ArtifactRecord, BuildError> {
    let manifest = manifest::parse_manifest(raw).map_err(convert::build_error)?;
    let config = match manifest.image_config() {
        Some(config) => Some(
            puller
                .small_blob(reference, &config.digest, config.size, work)
                .await?,
        ),
        None => None,
    };
    let shape =
        crate::classify::classify(&manifest, config.as_deref()).map_err(convert::build_error)?;

    let layers = convert::layers(&shape);
    let total: u64 = layers.iter().map(|l| l.size).sum();
    if total > args.max_disk_bytes {
        return Err(BuildError::new(
            Reason::TooLarge,
            format!(
                "the layers are {total} bytes (at most {})",
                args.max_disk_bytes
            ),
        ));
    }
    progress.stage("downloading", total);
    let mut blobs = Vec::with_capacity(layers.len());
    let mut before = 0;
    for layer in &layers {
        let path = work.join(format!("{}.blob", layer.digest.replace(':', "-")));
        let p = progress.clone();
        puller
            .blob_to_file(reference, &layer.digest, layer.size, &path, &move |n| {
                p.set(before + n)
            })
            .await?;
        before += layer.size;
        blobs.push(path);
    }

    progress.stage("converting", 0);
    let (final_path, work, max) = (final_path.to_owned(), work.to_owned(), args.max_disk_bytes);
    let p = progress.clone();
    tokio::task::spawn_blocking(move || {
        convert::to_artifact(
            &shape,
            &blobs,
            &work,
            &final_path,
            max,
            &mut |done, total| {
                p.total.store(total, Ordering::Relaxed);
                p.set(done);
            },
        )
    })
    .await
    .map_err(|e| BuildError::new(Reason::StorageFailed, e.to_string()))?
}

/// An exclusive lock on the artifact (a `<artifact>.lock` file), held while building.
async fn lock(final_path: &Path) -> Result<std::fs::File, BuildError> {
    let path = final_path.with_extension("raw.lock");
    tokio::task::spawn_blocking(move || {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)?;
        // Blocks while another build of the same digest runs; released when the file closes.
        rustix::fs::flock(&file, rustix::fs::FlockOperation::LockExclusive)?;
        Ok::<_, std::io::Error>(file)
    })
    .await
    .map_err(|e| BuildError::new(Reason::StorageFailed, e.to_string()))?
    .map_err(|e| BuildError::from_io("locking the artifact", e))
}

/// The record of an artifact that is complete for `digest`: its record names the digest and
/// the file has the recorded size.
async fn reusable(final_path: &Path, digest: &str) -> Option<ArtifactRecord> {
    let (path, digest) = (final_path.to_owned(), digest.to_owned());
    let record = tokio::task::spawn_blocking(move || artifact::reusable(&path, &digest))
        .await
        .ok()?
        .ok()??;
    Some(ArtifactRecord {
        size_bytes: record.size_bytes,
        sha256: record.sha256,
    })
}

/// Publishes progress every [`PROGRESS_INTERVAL`] while it changes, and logs it.
async fn report(api: Api<VMImage>, name: String, digest: String, progress: Arc<Progress>) {
    let mut last = None;
    loop {
        tokio::time::sleep(PROGRESS_INTERVAL).await;
        let now = progress.snapshot();
        if last.as_ref() == Some(&now) {
            continue;
        }
        let (stage, done, total) = now.clone();
        tracing::info!(stage, done, total, "build progress");
        let artifact = BuildArtifact {
            kind: ARTIFACT_KIND_CLOUD_IMAGE.to_owned(),
            phase: ArtifactPhase::Building,
            manifest_digest: Some(digest.clone()),
            message: Some(stage),
            bytes_done: i64::try_from(done).ok(),
            bytes_total: (total > 0).then(|| i64::try_from(total).ok()).flatten(),
            ..BuildArtifact::default()
        };
        match publish::replace_if_current(&api, &name, &digest, &artifact).await {
            Ok(Guarded::Written) => last = Some(now),
            Ok(Guarded::Superseded) => return,
            Err(e) => tracing::warn!(error = %e, "could not publish build progress"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_build_within_the_default_limit_fits_the_shipped_artifacts_volume() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../deploy/imagebuild/artifacts-pvc.yaml"
        );
        let text = std::fs::read_to_string(path).expect("the shipped PVC");
        let storage = text
            .lines()
            .find_map(|line| line.trim().strip_prefix("storage:"))
            .map(str::trim)
            .expect("a storage request");
        let volume = banlieue_api::quantity::to_bytes(storage).expect("a quantity");
        // The download and the raw disk at once, each at most the limit.
        assert!(
            2 * DEFAULT_MAX_DISK_BYTES <= volume,
            "{DEFAULT_MAX_DISK_BYTES} twice does not fit {storage}"
        );
    }
}

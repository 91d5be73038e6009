//! `banlieue provider libvirt import`: streams one build artifact into one storage pool.
//!
//! Everything but the flags comes from the Kubernetes API (Provider, its Secret and CA, the
//! VMImage for the volume name), so no key material is ever an argument or an environment
//! variable. The upload holds one stream packet in memory whatever the image size, and the
//! volume only counts as complete once its completion record exists (ADR-0060): a killed
//! import is redone by the Job's one retry.

use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use banlieue_api::{ImageSourceKind, Provider, VMImage};
use banlieue_libvirt::stream::{self, Transfer};
use banlieue_libvirt::{Client, ClientOptions};
use kube::Api;
use sha2::{Digest, Sha256};
use tokio::io::{AsyncRead, ReadBuf};
use tracing::{info, warn};

use super::decide;
use super::error::{Error, Result};
use super::marker::{self, Completeness, Marker};
use super::progress::Progress;
use super::volume;

/// How often progress is logged during an upload.
pub const PROGRESS_INTERVAL: Duration = Duration::from_secs(5);

/// The import command's flags, exactly the guide's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImportArgs {
    pub vmimage: String,
    pub provider: String,
    /// Namespace of the Provider and of the VMImage.
    pub provider_namespace: String,
    pub pool: String,
    /// The raw image, normally `/artifacts/<buildArtifact.path>`.
    pub source: PathBuf,
}

/// What an import did.
#[derive(Debug, Clone, PartialEq)]
pub enum ImportOutcome {
    /// The volume was already complete; nothing was sent.
    AlreadyComplete { volume: String, marker: Marker },
    /// The volume was (re)written and its completion record created.
    Imported {
        volume: String,
        marker: Marker,
        /// Bytes sent as data and skipped as holes.
        transfer: Transfer,
        elapsed: Duration,
    },
}

impl ImportOutcome {
    pub fn volume(&self) -> &str {
        match self {
            ImportOutcome::AlreadyComplete { volume, .. }
            | ImportOutcome::Imported { volume, .. } => volume,
        }
    }
}

/// Imports `args.source` into `args.pool` on the Provider's host, or does nothing when a
/// complete volume is already there.
pub async fn run_import(client: kube::Client, args: ImportArgs) -> Result<ImportOutcome> {
    let namespace = &args.provider_namespace;
    let providers: Api<Provider> = Api::namespaced(client.clone(), namespace);
    let provider = providers
        .get(&args.provider)
        .await
        .map_err(|e| Error::kube(format!("provider {namespace}/{}", args.provider), e))?;
    let images: Api<VMImage> = Api::namespaced(client.clone(), namespace);
    let image = images
        .get(&args.vmimage)
        .await
        .map_err(|e| Error::kube(format!("vmimage {namespace}/{}", args.vmimage), e))?;
    let class = &provider.spec.provider_class_ref.name;
    let volume_name = match decide::source_for_class(&image, class) {
        Some(source) if source.kind == ImageSourceKind::Url => {
            decide::url_volume_name(&args.vmimage, &decide::revision(&image))
        }
        _ => {
            return Err(Error::NoSourceForClass {
                image: args.vmimage.clone(),
                class: class.clone(),
            });
        }
    };

    let source_path = args.source.display().to_string();
    let source_error = |source| Error::Source {
        path: source_path.clone(),
        source,
    };
    let metadata = tokio::fs::metadata(&args.source)
        .await
        .map_err(source_error)?;
    let size = metadata.len();
    if size == 0 || !metadata.is_file() {
        return Err(source_error(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "not a non-empty regular file",
        )));
    }
    // Fewer allocated blocks than bytes means holes: send zero runs as holes then.
    let sparse = metadata.blocks().saturating_mul(512) < size;

    let credentials = crate::connection::load(&client, &provider).await?;
    let endpoint = &provider.spec.connection.endpoint;
    let libvirt =
        crate::connection::connect(endpoint, &credentials, ClientOptions::default()).await?;
    let outcome = import_into_pool(&libvirt, &args, &volume_name, size, sparse).await;
    let _ = libvirt.close().await;
    outcome
}

async fn import_into_pool(
    libvirt: &Client,
    args: &ImportArgs,
    volume_name: &str,
    size: u64,
    sparse: bool,
) -> Result<ImportOutcome> {
    let pool = volume::lookup_pool(libvirt, &args.pool)
        .await?
        .ok_or_else(|| Error::StoragePoolNotFound(args.pool.clone()))?;
    let marker_name = marker::marker_volume_name(volume_name);
    let existing = volume::lookup_volume(libvirt, &pool, volume_name).await?;
    let existing_marker = volume::lookup_volume(libvirt, &pool, &marker_name).await?;
    let capacity = match &existing {
        Some(vol) => Some(volume::capacity(libvirt, vol).await?),
        None => None,
    };
    let marker_bytes = match &existing_marker {
        Some(vol) => Some(volume::read_small(libvirt, vol, marker::MAX_MARKER_BYTES).await?),
        None => None,
    };
    match marker::completeness(volume_name, capacity, marker_bytes.as_deref(), size) {
        Completeness::Complete(marker) => {
            info!(
                volume = volume_name,
                pool = %args.pool,
                size_bytes = marker.size_bytes,
                sha256 = %marker.sha256,
                "volume is already complete in the pool; nothing to import"
            );
            return Ok(ImportOutcome::AlreadyComplete {
                volume: volume_name.to_owned(),
                marker,
            });
        }
        Completeness::Incomplete(why) => {
            warn!(volume = volume_name, pool = %args.pool, "{why}; importing again from the start");
            // The record goes first: a crash between the two deletes leaves a volume without
            // a record, which is still judged incomplete.
            if let Some(vol) = &existing_marker {
                volume::delete(libvirt, vol).await?;
            }
            if let Some(vol) = &existing {
                volume::delete(libvirt, vol).await?;
            }
        }
        Completeness::Absent => {}
    }

    let vol = volume::create_raw(libvirt, &pool, volume_name, size).await?;
    let file = tokio::fs::File::open(&args.source)
        .await
        .map_err(|source| Error::Source {
            path: args.source.display().to_string(),
            source,
        })?;
    let mut reader = HashingReader::new(file);
    info!(
        volume = volume_name,
        pool = %args.pool,
        source = %args.source.display(),
        size_bytes = size,
        sparse,
        "importing"
    );
    let started = Instant::now();
    let mut last_log = started;
    let transfer = stream::upload(libvirt, &vol, &mut reader, size, sparse, |t: Transfer| {
        if last_log.elapsed() >= PROGRESS_INTERVAL {
            last_log = Instant::now();
            log_progress(&Progress::at(t.data + t.holes, size, started.elapsed()));
        }
    })
    .await
    .map_err(|e| Error::libvirt(format!("upload into volume {volume_name}"), e))?;
    let elapsed = started.elapsed();

    // The server confirmed the end of the stream; the record is written only if what was
    // sent and what the volume holds both equal the source.
    let sent = transfer.data + transfer.holes;
    let capacity = volume::capacity(libvirt, &vol).await?;
    if sent != size || capacity != size {
        return Err(Error::Verification {
            volume: volume_name.to_owned(),
            detail: format!("source {size} bytes, sent {sent}, volume capacity {capacity}"),
        });
    }
    let marker = Marker {
        volume: volume_name.to_owned(),
        size_bytes: size,
        sha256: reader.hex_digest(),
    };
    volume::write_small(libvirt, &pool, &marker_name, &marker.to_bytes()).await?;
    log_progress(&Progress::at(sent, size, elapsed));
    info!(
        volume = volume_name,
        pool = %args.pool,
        data_bytes = transfer.data,
        hole_bytes = transfer.holes,
        sha256 = %marker.sha256,
        seconds = elapsed.as_secs_f64(),
        "import complete"
    );
    Ok(ImportOutcome::Imported {
        volume: volume_name.to_owned(),
        marker,
        transfer,
        elapsed,
    })
}

fn log_progress(p: &Progress) {
    info!(
        bytes = p.done,
        total = p.total,
        percent = format_args!("{:.1}", p.percent),
        mb_per_s = format_args!("{:.1}", p.mb_per_s),
        eta_s = p.eta.map(|d| d.as_secs()).unwrap_or(0),
        "import progress"
    );
}

/// Hashes every byte read through it, so the digest costs no second pass over the source.
struct HashingReader<R> {
    inner: R,
    hasher: Sha256,
}

impl<R> HashingReader<R> {
    fn new(inner: R) -> Self {
        HashingReader {
            inner,
            hasher: Sha256::new(),
        }
    }

    fn hex_digest(&self) -> String {
        self.hasher
            .clone()
            .finalize()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }
}

impl<R: AsyncRead + Unpin> AsyncRead for HashingReader<R> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let poll = Pin::new(&mut this.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = &poll {
            this.hasher.update(&buf.filled()[before..]);
        }
        poll
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    #[tokio::test]
    async fn hashing_reader_digests_what_passes() {
        let data = vec![7u8; 300_000];
        let mut reader = HashingReader::new(&data[..]);
        let mut out = Vec::new();
        reader.read_to_end(&mut out).await.unwrap();
        assert_eq!(out, data);
        let expected: String = Sha256::digest(&data)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(reader.hex_digest(), expected);
    }
}

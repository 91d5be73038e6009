//! `banlieue provider libvirt import`: streams one build artifact into one storage pool.
//!
//! Everything but the flags comes from the Kubernetes API (Provider, its Secret and CA, the
//! VMImage for the volume name), so no key material is ever an argument or an environment
//! variable. The upload holds one stream packet in memory whatever the image size, and the
//! volume only counts as complete once its completion record exists (ADR-0060): a killed
//! import is redone by the Job's one retry.

use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use banlieue_api::{ImageSourceKind, Provider, VMImage};
use banlieue_libvirt::flags::StorageVolCreateFlags;
use banlieue_libvirt::stream::{Transfer, TransferOptions};
use banlieue_libvirt::{Client, ClientOptions, StoragePool, StorageVol};
use kube::Api;
use sha2::{Digest, Sha256};
use tokio::io::{AsyncRead, ReadBuf};
use tracing::{info, warn};

use super::decide;
use super::error::{Error, Result};
use super::marker::{self, Completeness, Marker};
use super::progress::Progress;

/// How often progress is logged during an upload.
pub const PROGRESS_INTERVAL: Duration = Duration::from_secs(5);

/// The import command's flags: the guide's, and what the Job was made for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImportArgs {
    pub vmimage: String,
    pub provider: String,
    /// Namespace of the Provider and of the VMImage.
    pub provider_namespace: String,
    pub pool: String,
    /// The raw image, normally `/artifacts/<buildArtifact.path>`.
    pub source: PathBuf,
    /// The volume the Job was made for (`--volume`): the import refuses to write another.
    pub volume: Option<String>,
    /// The revision the Job was made for (`--revision`): the import refuses another.
    pub revision: Option<String>,
    /// The directory the source must resolve inside (`--artifacts-root`).
    pub artifacts_root: PathBuf,
}

impl ImportArgs {
    /// The guide's flags, with nothing expected and the Job's artifacts mount as root.
    pub fn new(
        vmimage: impl Into<String>,
        provider: impl Into<String>,
        provider_namespace: impl Into<String>,
        pool: impl Into<String>,
        source: impl Into<PathBuf>,
    ) -> ImportArgs {
        ImportArgs {
            vmimage: vmimage.into(),
            provider: provider.into(),
            provider_namespace: provider_namespace.into(),
            pool: pool.into(),
            source: source.into(),
            volume: None,
            revision: None,
            artifacts_root: PathBuf::from(decide::ARTIFACTS_MOUNT),
        }
    }
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
    let revision = decide::revision(&image);
    let volume_name = match decide::source_for_class(&image, class) {
        Some(source) if source.kind == ImageSourceKind::Url => decide::url_volume_name(&image),
        _ => {
            return Err(Error::NoSourceForClass {
                image: args.vmimage.clone(),
                class: class.clone(),
            });
        }
    };
    // A Job outlives the spec it was made from: it only ever writes what it was made for.
    for (what, expected, found) in [
        ("revision", &args.revision, &revision),
        ("volume", &args.volume, &volume_name),
    ] {
        if let Some(expected) = expected
            && expected != found
        {
            return Err(Error::Mismatch {
                image: args.vmimage.clone(),
                what,
                expected: expected.clone(),
                found: found.clone(),
            });
        }
    }

    let source = open_source(&args.source, &args.artifacts_root)?;
    let size = source.metadata.len();
    // Fewer allocated blocks than bytes means holes: send zero runs as holes then.
    let sparse = source.metadata.blocks().saturating_mul(512) < size;

    let credentials = crate::connection::load(&client, &provider).await?;
    let endpoint = &provider.spec.connection.endpoint;
    let libvirt =
        crate::connection::connect(endpoint, &credentials, ClientOptions::default()).await?;
    let outcome = import_into_pool(&libvirt, &args, &volume_name, source, sparse).await;
    let _ = libvirt.close().await;
    outcome
}

/// The opened source and what `fstat` said of the handle.
struct Source {
    file: std::fs::File,
    metadata: std::fs::Metadata,
}

/// Opens the source for reading, refusing a symlink as its last component (`O_NOFOLLOW`), a
/// path that resolves outside `root`, and anything but a non-empty regular file as judged on
/// the opened handle, so what is checked is what is read.
fn open_source(path: &Path, root: &Path) -> Result<Source> {
    let shown = path.display().to_string();
    let io = |source| Error::Source {
        path: shown.clone(),
        source,
    };
    let refused = |why: String| Error::SourceRefused {
        path: shown.clone(),
        why,
    };
    let root = std::fs::canonicalize(root).map_err(|e| {
        refused(format!(
            "the artifacts directory {} is unusable: {e}",
            root.display()
        ))
    })?;
    let canonical = std::fs::canonicalize(path).map_err(io)?;
    if !canonical.starts_with(&root) {
        return Err(refused(format!(
            "it resolves to {}, outside the artifacts directory {}",
            canonical.display(),
            root.display()
        )));
    }
    // O_NONBLOCK: opening a FIFO must not wait for a writer; a regular file ignores it.
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| {
            if e.raw_os_error() == Some(libc::ELOOP) {
                refused("it is a symbolic link".into())
            } else {
                io(e)
            }
        })?;
    let metadata = file.metadata().map_err(io)?;
    if !metadata.is_file() || metadata.len() == 0 {
        return Err(refused("not a non-empty regular file".into()));
    }
    // The handle is the file that was checked to be inside the root, not one swapped in
    // between (a directory on the way replaced by a link).
    let checked = std::fs::metadata(&canonical).map_err(io)?;
    if (checked.dev(), checked.ino()) != (metadata.dev(), metadata.ino()) {
        return Err(refused("it changed while being opened".into()));
    }
    Ok(Source { file, metadata })
}

/// SHA-256 of everything `file` holds from its current position, hex.
async fn sha256_of(file: tokio::fs::File) -> std::io::Result<String> {
    let mut reader = HashingReader::new(file);
    tokio::io::copy(&mut reader, &mut tokio::io::sink()).await?;
    Ok(reader.hex_digest())
}

async fn import_into_pool(
    libvirt: &Client,
    args: &ImportArgs,
    volume_name: &str,
    source: Source,
    sparse: bool,
) -> Result<ImportOutcome> {
    let size = source.metadata.len();
    let file = tokio::fs::File::from_std(source.file);
    let pool = StoragePool::lookup_by_name(libvirt, &args.pool)
        .await
        .map_err(|e| Error::libvirt(format!("look up storage pool {}", args.pool), e))?
        .ok_or_else(|| Error::StoragePoolNotFound(args.pool.clone()))?;
    let marker_name = marker::marker_volume_name(volume_name);
    let existing = Existing::look_up(&pool, volume_name, &marker_name).await?;
    match marker::completeness(
        volume_name,
        existing.capacity,
        existing.marker_bytes.as_deref(),
        size,
    ) {
        Completeness::Complete(marker) => {
            return already_complete(args, volume_name, marker, file).await;
        }
        Completeness::Incomplete(why) => {
            warn!(volume = volume_name, pool = %args.pool, "{why}; importing again from the start");
            existing.delete().await?;
        }
        Completeness::Conflict(why) => return Err(Error::CompleteVolumeDiffers(why)),
        Completeness::Absent => {}
    }

    let vol = create_raw(&pool, volume_name, size).await?;
    let (transfer, sha256, elapsed) = upload(args, &vol, volume_name, file, size, sparse).await?;

    // The server confirmed the end of the stream; the record is written only if what was
    // sent and what the volume holds both equal the source.
    let sent = transfer.data + transfer.holes;
    let capacity = volume_capacity(&vol).await?;
    if sent != size || capacity != size {
        return Err(Error::Verification {
            volume: volume_name.to_owned(),
            detail: format!("source {size} bytes, sent {sent}, volume capacity {capacity}"),
        });
    }
    let marker = Marker {
        volume: volume_name.to_owned(),
        size_bytes: size,
        sha256,
    };
    write_small(&pool, &marker_name, &marker.to_bytes()).await?;
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

/// The volume and its completion record as a previous import left them in the pool.
struct Existing {
    volume: Option<StorageVol>,
    marker: Option<StorageVol>,
    /// The volume's capacity.
    capacity: Option<u64>,
    /// What the record holds.
    marker_bytes: Option<Vec<u8>>,
}

impl Existing {
    async fn look_up(pool: &StoragePool, volume_name: &str, marker_name: &str) -> Result<Existing> {
        let volume = lookup_volume(pool, volume_name).await?;
        let marker = lookup_volume(pool, marker_name).await?;
        let capacity = match &volume {
            Some(vol) => Some(volume_capacity(vol).await?),
            None => None,
        };
        let marker_bytes = match &marker {
            // A record too large to be one reads as empty: not a valid record, so incomplete.
            Some(vol) => Some(
                vol.read_small(marker::MAX_MARKER_BYTES)
                    .await
                    .map_err(|e| Error::libvirt(format!("download volume {}", vol.name()), e))?
                    .unwrap_or_default(),
            ),
            None => None,
        };
        Ok(Existing {
            volume,
            marker,
            capacity,
            marker_bytes,
        })
    }

    async fn delete(&self) -> Result<()> {
        // The record goes first: a crash between the two deletes leaves a volume without
        // a record, which is still judged incomplete.
        if let Some(vol) = &self.marker {
            delete(vol).await?;
        }
        if let Some(vol) = &self.volume {
            delete(vol).await?;
        }
        Ok(())
    }
}

/// The outcome for a volume its record calls complete, once the source is known to hold the
/// same bytes.
async fn already_complete(
    args: &ImportArgs,
    volume_name: &str,
    marker: Marker,
    file: tokio::fs::File,
) -> Result<ImportOutcome> {
    // Complete by size is not enough: the same revision rebuilt into other bytes must
    // not pass for the volume machines already back onto.
    let digest = sha256_of(file).await.map_err(|source| Error::Source {
        path: args.source.display().to_string(),
        source,
    })?;
    marker::same_content(&marker, &digest).map_err(Error::CompleteVolumeDiffers)?;
    info!(
        volume = volume_name,
        pool = %args.pool,
        size_bytes = marker.size_bytes,
        sha256 = %marker.sha256,
        "volume is already complete in the pool; nothing to import"
    );
    Ok(ImportOutcome::AlreadyComplete {
        volume: volume_name.to_owned(),
        marker,
    })
}

/// Streams `file` into `vol`, logging progress: what was sent, the source's SHA-256 (hex) and
/// how long it took.
async fn upload(
    args: &ImportArgs,
    vol: &StorageVol,
    volume_name: &str,
    file: tokio::fs::File,
    size: u64,
    sparse: bool,
) -> Result<(Transfer, String, Duration)> {
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
    let options = TransferOptions::new()
        .length(size)
        .sparse(sparse)
        .progress(|t: Transfer| {
            if last_log.elapsed() >= PROGRESS_INTERVAL {
                last_log = Instant::now();
                log_progress(&Progress::at(t.data + t.holes, size, started.elapsed()));
            }
        });
    let transfer = vol
        .upload(&mut reader, options)
        .await
        .map_err(|e| Error::libvirt(format!("upload into volume {volume_name}"), e))?;
    Ok((transfer, reader.hex_digest(), started.elapsed()))
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

/// Looks a volume up in `pool`; `None` when it is not there.
pub(crate) async fn lookup_volume(pool: &StoragePool, name: &str) -> Result<Option<StorageVol>> {
    StorageVol::lookup_by_name(pool, name)
        .await
        .map_err(|e| Error::libvirt(format!("look up volume {name} in pool {}", pool.name()), e))
}

async fn volume_capacity(vol: &StorageVol) -> Result<u64> {
    vol.get_info()
        .await
        .map(|info| info.capacity)
        .map_err(|e| Error::libvirt(format!("read volume {}", vol.name()), e))
}

/// Creates a raw volume of `capacity` bytes with nothing allocated, so holes the upload skips
/// stay holes.
async fn create_raw(pool: &StoragePool, name: &str, capacity: u64) -> Result<StorageVol> {
    let xml = crate::volume_xml::raw(name, capacity);
    StorageVol::create_xml(pool, &xml, StorageVolCreateFlags::empty())
        .await
        .map_err(|e| Error::libvirt(format!("create volume {name} in pool {}", pool.name()), e))
}

/// Deletes a volume; one already gone counts as deleted.
async fn delete(vol: &StorageVol) -> Result<()> {
    match vol.delete().await {
        Err(e) if !e.is_not_found() => {
            Err(Error::libvirt(format!("delete volume {}", vol.name()), e))
        }
        _ => Ok(()),
    }
}

/// Creates a volume holding exactly `bytes`.
async fn write_small(pool: &StoragePool, name: &str, bytes: &[u8]) -> Result<()> {
    let vol = create_raw(pool, name, bytes.len() as u64).await?;
    let mut source = bytes;
    vol.upload(
        &mut source,
        TransferOptions::new().length(bytes.len() as u64),
    )
    .await
    .map_err(|e| Error::libvirt(format!("upload volume {name}"), e))?;
    Ok(())
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

//! From downloaded, digest-verified blobs to one disk file.
//!
//! A disk artifact's layer is decompressed into a work file (or used in place when it is not
//! compressed). A containerDisk's layers are read as tar streams, bottom first, and the one
//! regular file under `disk/` in the merged view (later layers replace files of earlier ones;
//! OCI whiteouts delete them) is extracted into the work file. Nothing else is written: no
//! entry path is ever used as a file system path, links are never followed, and an entry whose
//! path is absolute or has a `..` component refuses the image.
//!
//! Everything streams through constant-size buffers; zero blocks become holes in the work file.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{self, BufRead, BufReader, Read};
use std::path::{Component, Path, PathBuf};

use tar::EntryType;

use crate::classify::{Compression, DiskFormat, Refusal};
use crate::error::{Error, Result};
use crate::sparse::{DiskSink, SparseFile};
use crate::zstd::ZstdFrames;

/// The disk file a build converts into the artifact.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiskFile {
    /// Where it is: the work file, or the blob itself when that needed no decompression.
    pub path: PathBuf,
    /// Its format, from its magic.
    pub format: DiskFormat,
    /// Its length in bytes.
    pub size_bytes: u64,
}

/// The format of a disk from its first bytes: qcow2 when they are `QFI\xfb`, else raw.
pub fn detect_format(head: &[u8]) -> DiskFormat {
    if head.starts_with(&crate::qcow2::MAGIC) {
        DiskFormat::Qcow2
    } else {
        DiskFormat::Raw
    }
}

/// The format of the disk file at `path`, from its magic.
pub fn detect_file_format(path: &Path) -> Result<DiskFormat> {
    let mut head = Vec::with_capacity(4);
    File::open(path)
        .and_then(|f| f.take(4).read_to_end(&mut head))
        .map_err(|source| Error::io("read the disk's magic", path, source))?;
    Ok(detect_format(&head))
}

/// A reader that decompresses `source` per `compression`. gzip may have several members and
/// zstd several frames, as parallel compressors write them.
pub fn decompressor<'a>(source: impl BufRead + 'a, compression: Compression) -> Box<dyn Read + 'a> {
    match compression {
        Compression::None => Box::new(source),
        Compression::Gzip => Box::new(flate2::bufread::MultiGzDecoder::new(source)),
        Compression::Zstd => Box::new(ZstdFrames::new(source)),
    }
}

/// Marks the error a [`Bounded`] reader returns past its limit.
#[derive(Debug)]
struct LimitExceeded;

impl std::fmt::Display for LimitExceeded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("stream exceeds its limit")
    }
}

impl std::error::Error for LimitExceeded {}

/// A reader that fails once more than `left` bytes have been read through it.
struct Bounded<R> {
    inner: R,
    left: u64,
    exceeded: bool,
}

impl<R> Bounded<R> {
    fn new(inner: R, limit: u64) -> Self {
        Self {
            inner,
            left: limit,
            exceeded: false,
        }
    }
}

impl<R: Read> Read for Bounded<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        match self.left.checked_sub(n as u64) {
            Some(left) => {
                self.left = left;
                Ok(n)
            }
            None => {
                self.exceeded = true;
                Err(io::Error::other(LimitExceeded))
            }
        }
    }
}

fn is_limit(e: &io::Error) -> bool {
    e.get_ref().is_some_and(|e| e.is::<LimitExceeded>())
}

fn decode_error(what: String, e: io::Error, limit_what: &'static str, limit: u64) -> Error {
    if is_limit(&e) {
        Error::TooLarge {
            what: limit_what,
            limit,
        }
    } else {
        Error::Decode { what, source: e }
    }
}

/// Copies `reader` into a new sparse file at `out`; returns its length and first four bytes.
fn copy_to_work_file(reader: &mut dyn Read, out: &Path, what: &str) -> Result<(u64, Vec<u8>)> {
    let file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(out)
        .map_err(|source| Error::io("create the work file", out, source))?;
    let mut sparse = SparseFile::new(file);
    let mut buf = vec![0u8; 1 << 20];
    let mut head = Vec::with_capacity(4);
    loop {
        let n = match reader.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(decode_error(what.to_owned(), e, "", 0)),
        };
        let chunk = buf.get(..n).unwrap_or_default();
        if head.len() < 4 {
            let take = (4 - head.len()).min(n);
            head.extend_from_slice(chunk.get(..take).unwrap_or_default());
        }
        sparse
            .write_data(chunk)
            .map_err(|source| Error::io("write the work file", out, source))?;
    }
    let (_, size) = sparse
        .finish()
        .map_err(|source| Error::io("write the work file", out, source))?;
    Ok((size, head))
}

fn check_format(declared: DiskFormat, detected: DiskFormat) -> Result<()> {
    if declared == detected {
        Ok(())
    } else {
        Err(Error::FormatMismatch { declared, detected })
    }
}

/// Turns a disk artifact's layer blob into the disk file.
///
/// An uncompressed blob is the disk itself: no copy is made and the returned path is `blob`.
/// Otherwise the blob is decompressed into `work` (created or truncated), refusing more than
/// `max_bytes` of output. The content's magic must agree with the `format` the manifest
/// declared.
pub fn unpack_disk_artifact(
    blob: &Path,
    format: DiskFormat,
    compression: Compression,
    work: &Path,
    max_bytes: u64,
) -> Result<DiskFile> {
    if compression == Compression::None {
        let size_bytes = std::fs::metadata(blob)
            .map_err(|source| Error::io("stat the disk blob", blob, source))?
            .len();
        if size_bytes > max_bytes {
            return Err(Error::TooLarge {
                what: "disk",
                limit: max_bytes,
            });
        }
        check_format(format, detect_file_format(blob)?)?;
        return Ok(DiskFile {
            path: blob.to_path_buf(),
            format,
            size_bytes,
        });
    }
    let file = File::open(blob).map_err(|source| Error::io("open the disk blob", blob, source))?;
    let mut reader = Bounded::new(
        decompressor(BufReader::with_capacity(1 << 16, file), compression),
        max_bytes,
    );
    let (size_bytes, head) =
        copy_to_work_file(&mut reader, work, "the disk layer").map_err(|e| match e {
            Error::TooLarge { .. } => Error::TooLarge {
                what: "disk",
                limit: max_bytes,
            },
            other => other,
        })?;
    check_format(format, detect_format(&head))?;
    Ok(DiskFile {
        path: work.to_path_buf(),
        format,
        size_bytes,
    })
}

/// One downloaded layer of a container image.
#[derive(Debug, Clone, Copy)]
pub struct LayerBlob<'a> {
    /// The digest-verified blob.
    pub path: &'a Path,
    /// From the layer's media type ([`crate::classify::tar_layer_compression`]).
    pub compression: Compression,
}

/// Bounds on a containerDisk extraction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExtractLimits {
    /// The largest disk file accepted.
    pub max_disk_bytes: u64,
    /// The most bytes one layer's tar stream may decompress to (tar bombs).
    pub max_layer_bytes: u64,
}

/// The path of a tar entry as its normal components, refusing paths that leave the root.
fn entry_components(path: &Path) -> std::result::Result<Vec<String>, Refusal> {
    let mut parts = Vec::new();
    for component in path.components() {
        match component {
            Component::Normal(name) => parts.push(name.to_string_lossy().into_owned()),
            Component::CurDir => {}
            Component::ParentDir | Component::RootDir | Component::Prefix(_) => {
                return Err(Refusal::UnsafePath(path.to_string_lossy().into_owned()));
            }
        }
    }
    Ok(parts)
}

/// What one layer changes in the `disk/` view.
#[derive(Debug, Default)]
struct LayerChanges {
    /// Paths deleted from lower layers (with everything under them).
    whiteouts: Vec<String>,
    /// Directories whose lower-layer content is hidden.
    opaque_dirs: Vec<String>,
    /// Non-directory entries under `disk/`, with whether each is a regular file.
    entries: Vec<(String, bool)>,
    /// The regular disk file last written to the work file by this scan, with its size.
    extracted: Option<(String, u64)>,
}

/// Reads one layer's tar; writes regular files under `disk/` to `work` (all of them, or only
/// `only` when given; a later one overwrites an earlier one).
fn scan_layer(
    index: usize,
    layer: &LayerBlob<'_>,
    work: &Path,
    limits: &ExtractLimits,
    only: Option<&str>,
) -> Result<LayerChanges> {
    let what = || format!("layer {index} ({})", layer.path.display());
    let file = File::open(layer.path)
        .map_err(|source| Error::io("open the layer blob", layer.path, source))?;
    let reader = Bounded::new(
        decompressor(BufReader::with_capacity(1 << 16, file), layer.compression),
        limits.max_layer_bytes,
    );
    let fail = |e: io::Error| decode_error(what(), e, "layer", limits.max_layer_bytes);
    let mut archive = tar::Archive::new(reader);
    let mut changes = LayerChanges::default();
    for entry in archive.entries().map_err(fail)? {
        let mut entry = entry.map_err(fail)?;
        let path = entry.path().map_err(fail)?.into_owned();
        let parts = entry_components(&path)?;
        let Some((name, dirs)) = parts.split_last() else {
            continue;
        };
        let dir = dirs.join("/");
        if name == ".wh..wh..opq" {
            changes.opaque_dirs.push(dir);
            continue;
        }
        if let Some(target) = name.strip_prefix(".wh.") {
            changes.whiteouts.push(if dir.is_empty() {
                target.to_owned()
            } else {
                format!("{dir}/{target}")
            });
            continue;
        }
        if parts.len() < 2 || parts.first().map(String::as_str) != Some("disk") {
            continue;
        }
        let kind = entry.header().entry_type();
        if kind == EntryType::Directory {
            continue;
        }
        let joined = parts.join("/");
        let regular = matches!(
            kind,
            EntryType::Regular | EntryType::Continuous | EntryType::GNUSparse
        );
        changes.entries.push((joined.clone(), regular));
        if !regular || only.is_some_and(|p| p != joined) {
            continue;
        }
        if entry.size() > limits.max_disk_bytes {
            return Err(Error::TooLarge {
                what: "disk",
                limit: limits.max_disk_bytes,
            });
        }
        let mut bounded = Bounded::new(&mut entry, limits.max_disk_bytes);
        let (size, _) = copy_to_work_file(&mut bounded, work, &what()).map_err(|e| match e {
            // The entry's bound and the layer's share the marker: ask the entry's.
            Error::TooLarge { .. } if bounded.exceeded => Error::TooLarge {
                what: "disk",
                limit: limits.max_disk_bytes,
            },
            Error::TooLarge { .. } => Error::TooLarge {
                what: "layer",
                limit: limits.max_layer_bytes,
            },
            other => other,
        })?;
        changes.extracted = Some((joined, size));
    }
    Ok(changes)
}

fn under(path: &str, dir: &str) -> bool {
    dir.is_empty()
        || path
            .strip_prefix(dir)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
}

/// Extracts a containerDisk's disk file from its layers (bottom first) into `work`.
///
/// Refuses ([`Error::Refused`]) images with no file or several files under `disk/` in the
/// merged view, a disk entry that is a link or device, and entries whose path leaves the root.
pub fn extract_container_disk(
    layers: &[LayerBlob<'_>],
    work: &Path,
    limits: &ExtractLimits,
) -> Result<DiskFile> {
    // Path under disk/ → (layer index, regular file).
    let mut view: BTreeMap<String, (usize, bool)> = BTreeMap::new();
    // What the work file holds: (layer index, path, size).
    let mut materialised: Option<(usize, String, u64)> = None;
    for (index, layer) in layers.iter().enumerate() {
        let changes = scan_layer(index, layer, work, limits, None)?;
        for dir in &changes.opaque_dirs {
            view.retain(|path, _| !under(path, dir) || path == dir);
        }
        for target in &changes.whiteouts {
            view.retain(|path, _| !under(path, target));
        }
        for (path, regular) in changes.entries {
            view.insert(path, (index, regular));
        }
        if let Some((path, size)) = changes.extracted {
            materialised = Some((index, path, size));
        }
    }
    let mut files = view.into_iter();
    let (path, (index, regular)) = match (files.next(), files.next()) {
        (None, _) => return Err(Refusal::NoDiskFile.into()),
        (Some(one), None) => one,
        (Some(first), Some(second)) => {
            let mut names = vec![first.0, second.0];
            names.extend(files.map(|(p, _)| p));
            return Err(Refusal::SeveralDiskFiles(names).into());
        }
    };
    if !regular {
        return Err(Refusal::DiskNotRegularFile(path).into());
    }
    let size_bytes = match materialised {
        Some((i, p, size)) if i == index && p == path => size,
        // A file of a later layer was extracted and then whited out: extract the survivor.
        _ => {
            let layer = layers.get(index).ok_or(Refusal::NoDiskFile)?;
            let changes = scan_layer(index, layer, work, limits, Some(&path))?;
            changes.extracted.ok_or(Refusal::NoDiskFile)?.1
        }
    };
    Ok(DiskFile {
        path: work.to_path_buf(),
        format: detect_file_format(work)?,
        size_bytes,
    })
}

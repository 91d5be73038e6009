//! A qcow2 reader that converts an image to raw, following QEMU's `docs/interop/qcow2.txt`.
//!
//! Supported: versions 2 and 3, cluster sizes 512 B to 2 MiB, standard, zero and unallocated
//! clusters, compressed clusters (deflate, and zstd when the header says so), extended L2
//! entries (subclusters), header extensions (walked and bounded; the feature name table names
//! unknown features in errors), and images whose dirty bit is set: the dirty bit only says that
//! refcounts may be stale, and refcounts are never read here.
//!
//! Refused, with a typed error: backing files (the image is not self-contained), encryption,
//! external data files, the corrupt bit (QEMU itself will not trust such an image's metadata for
//! writing; nor does this reader for import), unknown incompatible features and compression
//! types. Snapshots are ignored: the active L1 table is the image.
//!
//! Every offset and count read from the file is bounded before use: the L1 table must lie in
//! the file and cover the virtual size, tables must be cluster-aligned and inside the file, and
//! the virtual size must not exceed the caller's limit. Memory is a few clusters plus a 32 KiB
//! window onto the L1 table, whatever the image's size.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;

use flate2::{Decompress, FlushDecompress, Status};

use crate::artifact::{PROGRESS_INTERVAL, Progress};
use crate::sparse::DiskSink;
use crate::zstd::ZstdFrames;

/// `QFI\xfb`, the first four bytes of every qcow2 file.
pub const MAGIC: [u8; 4] = *b"QFI\xfb";
/// The smallest cluster size QEMU creates: 512 bytes.
pub const MIN_CLUSTER_BITS: u32 = 9;
/// The largest cluster size QEMU creates: 2 MiB.
pub const MAX_CLUSTER_BITS: u32 = 21;
/// QEMU refuses L1 tables larger than this many bytes, and so does this reader.
pub const MAX_L1_BYTES: u64 = 32 << 20;

const V2_HEADER_LEN: usize = 72;
const V3_MIN_HEADER_LEN: usize = 104;
const INCOMPAT_DIRTY: u64 = 1 << 0;
const INCOMPAT_CORRUPT: u64 = 1 << 1;
const INCOMPAT_DATA_FILE: u64 = 1 << 2;
const INCOMPAT_COMPRESSION: u64 = 1 << 3;
const INCOMPAT_EXTL2: u64 = 1 << 4;
const INCOMPAT_KNOWN: u64 =
    INCOMPAT_DIRTY | INCOMPAT_CORRUPT | INCOMPAT_DATA_FILE | INCOMPAT_COMPRESSION | INCOMPAT_EXTL2;
const EXT_END: u32 = 0;
const EXT_FEATURE_NAMES: u32 = 0x6803_f857;
/// Bits 9–55 of L1 and standard L2 entries: a cluster-aligned host offset.
const OFFSET_MASK: u64 = 0x00ff_ffff_ffff_fe00;
const L2_COMPRESSED: u64 = 1 << 62;
const L2_ZERO: u64 = 1 << 0;
const SUBCLUSTERS: u64 = 32;
/// L1 entries read per positioned read.
const L1_WINDOW: u64 = 4096;

/// Why a qcow2 image could not be converted.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Qcow2Error {
    /// The file does not start with [`MAGIC`].
    #[error("refuse a file without the qcow2 magic")]
    NotQcow2,
    /// The file ends before a structure the header promises.
    #[error("refuse a qcow2 file of {len} bytes: its {what} needs {needed}")]
    Truncated {
        /// The structure that is cut off.
        what: &'static str,
        /// The file length it needs.
        needed: u64,
        /// The file's length.
        len: u64,
    },
    /// Only versions 2 and 3 exist.
    #[error("refuse qcow2 version {0}")]
    UnsupportedVersion(u32),
    /// The cluster size is outside 512 B–2 MiB.
    #[error("refuse cluster_bits {0}: qcow2 clusters are 2^9 to 2^21 bytes")]
    InvalidClusterBits(u32),
    /// The image depends on another image.
    #[error("refuse a qcow2 image with backing file {name:?}: import a self-contained image")]
    BackingFile {
        /// The backing file name as the header stores it.
        name: String,
    },
    /// The image is encrypted.
    #[error("refuse an encrypted qcow2 image (method {method})")]
    Encrypted {
        /// The header's crypt_method.
        method: u32,
    },
    /// The image's data lives in another file.
    #[error("refuse a qcow2 image with an external data file")]
    ExternalDataFile,
    /// QEMU marked the image's metadata as inconsistent.
    #[error("refuse a qcow2 image marked corrupt; repair it with qemu-img check -r all")]
    MarkedCorrupt,
    /// Incompatible features this reader does not know.
    #[error("refuse unknown incompatible qcow2 features {bits:#x} {names:?}")]
    UnknownIncompatibleFeatures {
        /// The unknown bits.
        bits: u64,
        /// Their names from the image's feature name table, where it has them.
        names: Vec<String>,
    },
    /// A compression type other than deflate (0) or zstd (1).
    #[error("refuse qcow2 compression type {0}")]
    UnsupportedCompressionType(u8),
    /// The virtual size exceeds the caller's limit.
    #[error("refuse a virtual size of {size} bytes, over the limit of {limit}")]
    VirtualSizeTooLarge {
        /// The header's size.
        size: u64,
        /// The caller's limit.
        limit: u64,
    },
    /// The image's metadata contradicts itself or the file.
    #[error("refuse a corrupt qcow2 image: {0}")]
    Corrupt(String),
    /// A compressed cluster does not decode.
    #[error("decompress the cluster at host offset {offset:#x}")]
    Decompress {
        /// Where the compressed data starts.
        offset: u64,
        /// The decoder's complaint.
        #[source]
        source: io::Error,
    },
    /// Reading the image failed.
    #[error("read the qcow2 image")]
    Read(#[source] io::Error),
    /// Writing the raw output failed.
    #[error("write the raw image")]
    Write(#[source] io::Error),
}

impl Qcow2Error {
    /// Whether the image is well-formed but uses something banlieue does not support, as
    /// opposed to being damaged or failing to read or write.
    pub fn is_unsupported(&self) -> bool {
        matches!(
            self,
            Self::UnsupportedVersion(_)
                | Self::BackingFile { .. }
                | Self::Encrypted { .. }
                | Self::ExternalDataFile
                | Self::UnknownIncompatibleFeatures { .. }
                | Self::UnsupportedCompressionType(_)
                | Self::VirtualSizeTooLarge { .. }
        )
    }
}

/// How compressed clusters are encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClusterCompression {
    /// Raw deflate (no zlib header), QEMU's default.
    Deflate,
    /// zstd frames (`compression_type=zstd`).
    Zstd,
}

/// What this reader uses from a qcow2 header, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    /// 2 or 3.
    pub version: u32,
    /// log2 of the cluster size, 9..=21.
    pub cluster_bits: u32,
    /// The guest-visible size in bytes.
    pub virtual_size: u64,
    /// Entries in the active L1 table.
    pub l1_size: u32,
    /// Where the active L1 table starts.
    pub l1_table_offset: u64,
    /// The incompatible feature bits (0 for version 2).
    pub incompatible_features: u64,
    /// How compressed clusters are encoded.
    pub compression: ClusterCompression,
    /// Whether L2 entries are 128-bit with subcluster bitmaps.
    pub extended_l2: bool,
}

impl Header {
    /// The cluster size in bytes.
    pub fn cluster_size(&self) -> u64 {
        1 << self.cluster_bits
    }

    /// Whether the dirty bit is set (accepted: refcounts are not read).
    pub fn dirty(&self) -> bool {
        self.incompatible_features & INCOMPAT_DIRTY != 0
    }
}

/// Bounds the caller puts on an image.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// The largest virtual size accepted, in bytes.
    pub max_virtual_size: u64,
}

fn be32(b: &[u8], off: usize, what: &'static str) -> Result<u32, Qcow2Error> {
    b.get(off..off + 4)
        .and_then(|s| s.try_into().ok())
        .map(u32::from_be_bytes)
        .ok_or(Qcow2Error::Truncated {
            what,
            needed: off as u64 + 4,
            len: b.len() as u64,
        })
}

fn be64(b: &[u8], off: usize, what: &'static str) -> Result<u64, Qcow2Error> {
    b.get(off..off + 8)
        .and_then(|s| s.try_into().ok())
        .map(u64::from_be_bytes)
        .ok_or(Qcow2Error::Truncated {
            what,
            needed: off as u64 + 8,
            len: b.len() as u64,
        })
}

fn corrupt(msg: impl Into<String>) -> Qcow2Error {
    Qcow2Error::Corrupt(msg.into())
}

/// Parses and validates the header from the start of the file.
///
/// `head` is the file's first bytes: the whole file or at least its first cluster (at most
/// 2 MiB), which holds the header, its extensions and the backing file name.
pub fn parse_header(head: &[u8]) -> Result<Header, Qcow2Error> {
    check_magic(head)?;
    let common = CommonFields::parse(head)?;
    let cluster_size = 1usize << common.cluster_bits;
    let v3 = if common.version == 3 {
        V3Fields::parse(head, cluster_size)?
    } else {
        V3Fields::OF_VERSION_2
    };

    // Extensions run from the end of the header to the end of the first cluster, or to the
    // backing file name if that comes first.
    let mut ext_end = cluster_size.min(head.len());
    if common.backing_file_offset != 0 {
        ext_end = ext_end.min(usize::try_from(common.backing_file_offset).unwrap_or(usize::MAX));
    }
    let feature_names = walk_extensions(head, v3.header_len, ext_end)?;

    if common.backing_file_offset != 0 {
        return Err(backing_file(
            head,
            common.backing_file_offset,
            common.backing_file_size,
        ));
    }
    if common.crypt_method != 0 {
        return Err(Qcow2Error::Encrypted {
            method: common.crypt_method,
        });
    }
    check_incompatible_features(v3.incompatible_features, feature_names, common.cluster_bits)?;
    Ok(Header {
        version: common.version,
        cluster_bits: common.cluster_bits,
        virtual_size: common.virtual_size,
        l1_size: common.l1_size,
        l1_table_offset: common.l1_table_offset,
        incompatible_features: v3.incompatible_features,
        compression: v3.compression,
        extended_l2: v3.incompatible_features & INCOMPAT_EXTL2 != 0,
    })
}

fn check_magic(head: &[u8]) -> Result<(), Qcow2Error> {
    if head.get(..4) == Some(&MAGIC[..]) {
        return Ok(());
    }
    Err(if head.len() < 4 {
        Qcow2Error::Truncated {
            what: "magic",
            needed: 4,
            len: head.len() as u64,
        }
    } else {
        Qcow2Error::NotQcow2
    })
}

/// The header fields of both versions (its first 72 bytes) this reader uses.
struct CommonFields {
    version: u32,
    backing_file_offset: u64,
    backing_file_size: u32,
    cluster_bits: u32,
    virtual_size: u64,
    crypt_method: u32,
    l1_size: u32,
    l1_table_offset: u64,
}

impl CommonFields {
    /// Reads them in file order, refusing a version or cluster size as soon as it is read.
    fn parse(head: &[u8]) -> Result<CommonFields, Qcow2Error> {
        let version = be32(head, 4, "header")?;
        if version != 2 && version != 3 {
            return Err(Qcow2Error::UnsupportedVersion(version));
        }
        let backing_file_offset = be64(head, 8, "header")?;
        let backing_file_size = be32(head, 16, "header")?;
        let cluster_bits = be32(head, 20, "header")?;
        if !(MIN_CLUSTER_BITS..=MAX_CLUSTER_BITS).contains(&cluster_bits) {
            return Err(Qcow2Error::InvalidClusterBits(cluster_bits));
        }
        let virtual_size = be64(head, 24, "header")?;
        let crypt_method = be32(head, 32, "header")?;
        let l1_size = be32(head, 36, "header")?;
        let l1_table_offset = be64(head, 40, "header")?;
        // Fields at 48..72 (refcounts, snapshots) are not needed to read the active image, but
        // a version 2 header is 72 bytes and must be complete.
        be64(head, 64, "header")?;
        Ok(CommonFields {
            version,
            backing_file_offset,
            backing_file_size,
            cluster_bits,
            virtual_size,
            crypt_method,
            l1_size,
            l1_table_offset,
        })
    }
}

/// The header fields only version 3 has.
struct V3Fields {
    incompatible_features: u64,
    header_len: usize,
    compression: ClusterCompression,
}

impl V3Fields {
    /// What a version 2 header amounts to.
    const OF_VERSION_2: V3Fields = V3Fields {
        incompatible_features: 0,
        header_len: V2_HEADER_LEN,
        compression: ClusterCompression::Deflate,
    };

    fn parse(head: &[u8], cluster_size: usize) -> Result<V3Fields, Qcow2Error> {
        let incompatible_features = be64(head, 72, "version 3 header")?;
        let header_len = be32(head, 100, "version 3 header")? as usize;
        if header_len < V3_MIN_HEADER_LEN || header_len > cluster_size {
            return Err(corrupt(format!("header length {header_len}")));
        }
        if head.len() < header_len {
            return Err(Qcow2Error::Truncated {
                what: "header",
                needed: header_len as u64,
                len: head.len() as u64,
            });
        }
        // The compression type byte exists only in headers longer than 104 bytes.
        let compression_type = if header_len > V3_MIN_HEADER_LEN {
            head.get(V3_MIN_HEADER_LEN).copied().unwrap_or(0)
        } else {
            0
        };
        if incompatible_features & INCOMPAT_COMPRESSION == 0 && compression_type != 0 {
            return Err(corrupt(
                "compression type set without the compression type feature bit",
            ));
        }
        let compression = match compression_type {
            0 => ClusterCompression::Deflate,
            1 => ClusterCompression::Zstd,
            other => return Err(Qcow2Error::UnsupportedCompressionType(other)),
        };
        Ok(V3Fields {
            incompatible_features,
            header_len,
            compression,
        })
    }
}

/// The refusal of an image with a backing file, naming the file.
fn backing_file(head: &[u8], offset: u64, size: u32) -> Qcow2Error {
    let start = usize::try_from(offset).unwrap_or(usize::MAX);
    // QEMU bounds the name to 1023 bytes; it lies in the first cluster.
    let len = (size as usize).min(1023);
    let name = head
        .get(start..start.saturating_add(len))
        .map(|b| String::from_utf8_lossy(b).into_owned())
        .unwrap_or_default();
    Qcow2Error::BackingFile { name }
}

/// Refuses incompatible features this reader does not know (named from the image's
/// `feature_names`) or does not support.
fn check_incompatible_features(
    incompatible_features: u64,
    feature_names: Vec<(u8, u8, String)>,
    cluster_bits: u32,
) -> Result<(), Qcow2Error> {
    let unknown = incompatible_features & !INCOMPAT_KNOWN;
    if unknown != 0 {
        let names = feature_names
            .into_iter()
            .filter(|(kind, bit, _)| *kind == 0 && *bit < 64 && unknown & (1 << bit) != 0)
            .map(|(_, _, name)| name)
            .collect();
        return Err(Qcow2Error::UnknownIncompatibleFeatures {
            bits: unknown,
            names,
        });
    }
    if incompatible_features & INCOMPAT_DATA_FILE != 0 {
        return Err(Qcow2Error::ExternalDataFile);
    }
    if incompatible_features & INCOMPAT_CORRUPT != 0 {
        return Err(Qcow2Error::MarkedCorrupt);
    }
    // 32 subclusters of at least 512 bytes each.
    if incompatible_features & INCOMPAT_EXTL2 != 0 && cluster_bits < 14 {
        return Err(corrupt(format!(
            "extended L2 entries with {}-byte clusters",
            1usize << cluster_bits
        )));
    }
    Ok(())
}

/// Walks header extensions in `head[start..end]`; returns the feature name table's entries
/// as (type, bit, name).
fn walk_extensions(
    head: &[u8],
    start: usize,
    end: usize,
) -> Result<Vec<(u8, u8, String)>, Qcow2Error> {
    let mut names = Vec::new();
    let mut off = start;
    // Each step advances by at least 8 bytes within `end` (≤ 2 MiB): the loop is bounded.
    while off + 8 <= end {
        let kind = be32(head, off, "header extension")?;
        let len = be32(head, off + 4, "header extension")? as usize;
        if kind == EXT_END {
            return Ok(names);
        }
        let data_start = off + 8;
        let data_end = data_start
            .checked_add(len)
            .filter(|&e| e <= end)
            .ok_or_else(|| corrupt(format!("header extension {kind:#x} overruns the header")))?;
        if kind == EXT_FEATURE_NAMES {
            let data = head.get(data_start..data_end).unwrap_or_default();
            for entry in data.chunks_exact(48) {
                if let [kind, bit, name @ ..] = entry {
                    let name = name.split(|&b| b == 0).next().unwrap_or_default();
                    names.push((*kind, *bit, String::from_utf8_lossy(name).into_owned()));
                }
            }
        }
        off = data_start + len.div_ceil(8) * 8;
    }
    // Running into the end of the cluster without an end marker: QEMU accepts it too when
    // nothing overruns.
    Ok(names)
}

/// Positioned reads from an image.
pub trait ReadAt {
    /// Reads up to `buf.len()` bytes at `offset`; returns 0 only at end of file.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize>;
}

impl ReadAt for File {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        FileExt::read_at(self, buf, offset)
    }
}

/// An image held in memory.
impl ReadAt for Vec<u8> {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let start = usize::try_from(offset)
            .unwrap_or(usize::MAX)
            .min(self.len());
        let src = self.get(start..).unwrap_or_default();
        let n = src.len().min(buf.len());
        buf.get_mut(..n)
            .unwrap_or_default()
            .copy_from_slice(src.get(..n).unwrap_or_default());
        Ok(n)
    }
}

fn read_exact_at(src: &dyn ReadAt, mut buf: &mut [u8], mut offset: u64) -> io::Result<()> {
    while !buf.is_empty() {
        match src.read_at(buf, offset) {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => {
                buf = buf.get_mut(n..).unwrap_or_default();
                offset += n as u64;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Opens `path` and converts it; see [`convert`].
pub fn convert_file(
    path: &Path,
    sink: &mut dyn DiskSink,
    limits: &Limits,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<Header, Qcow2Error> {
    let file = File::open(path).map_err(Qcow2Error::Read)?;
    let len = file.metadata().map_err(Qcow2Error::Read)?.len();
    convert(&file, len, sink, limits, progress)
}

/// Converts the qcow2 image in `src` (of `src_len` bytes) to raw, appending the whole virtual
/// disk to `sink` from offset 0: unallocated and zero clusters as zero runs, so the sink can
/// leave them as holes.
///
/// `progress(done, total)` gets virtual bytes done out of the virtual size: at the start, at
/// least every 64 MiB, and at the end. Returns the validated header.
pub fn convert(
    src: &dyn ReadAt,
    src_len: u64,
    sink: &mut dyn DiskSink,
    limits: &Limits,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<Header, Qcow2Error> {
    let head_len = src_len.min(1 << MAX_CLUSTER_BITS) as usize;
    let mut head = vec![0u8; head_len];
    read_exact_at(src, &mut head, 0).map_err(Qcow2Error::Read)?;
    let header = parse_header(&head)?;
    drop(head);
    if header.virtual_size > limits.max_virtual_size {
        return Err(Qcow2Error::VirtualSizeTooLarge {
            size: header.virtual_size,
            limit: limits.max_virtual_size,
        });
    }
    let mut converter = Converter::new(&header, src, src_len)?;
    let mut progress = Progress::new(progress, header.virtual_size);
    converter.run(sink, &mut progress)?;
    progress.finish(header.virtual_size);
    Ok(header)
}

struct Converter<'a> {
    src: &'a dyn ReadAt,
    src_len: u64,
    virtual_size: u64,
    cluster_bits: u32,
    cluster_size: u64,
    extended_l2: bool,
    compression: ClusterCompression,
    l2_entry_bytes: u64,
    /// Virtual bytes one L2 table maps.
    l2_span: u64,
    l1_entries: u64,
    l1_table_offset: u64,
    l2: Vec<u8>,
    cluster: Vec<u8>,
    compressed: Vec<u8>,
    inflater: Decompress,
}

impl<'a> Converter<'a> {
    fn new(header: &Header, src: &'a dyn ReadAt, src_len: u64) -> Result<Self, Qcow2Error> {
        let cluster_size = header.cluster_size();
        let l2_entry_bytes = if header.extended_l2 { 16 } else { 8 };
        let l2_span = cluster_size * (cluster_size / l2_entry_bytes);
        let l1_entries = header.virtual_size.div_ceil(l2_span);
        if u64::from(header.l1_size) < l1_entries {
            return Err(corrupt(format!(
                "L1 table of {} entries for a virtual size that needs {l1_entries}",
                header.l1_size
            )));
        }
        let l1_bytes = u64::from(header.l1_size) * 8;
        if l1_bytes > MAX_L1_BYTES {
            return Err(corrupt(format!("L1 table of {l1_bytes} bytes")));
        }
        if l1_entries > 0 {
            if !header.l1_table_offset.is_multiple_of(cluster_size) {
                return Err(corrupt(format!(
                    "L1 table offset {:#x} is not cluster-aligned",
                    header.l1_table_offset
                )));
            }
            let end = header.l1_table_offset.checked_add(l1_entries * 8);
            if end.is_none_or(|end| end > src_len) {
                return Err(corrupt(format!(
                    "L1 table at {:#x} lies beyond the end of the file ({src_len} bytes)",
                    header.l1_table_offset
                )));
            }
        }
        // cluster_size ≤ 2 MiB, so these fit in usize.
        Ok(Self {
            src,
            src_len,
            virtual_size: header.virtual_size,
            cluster_bits: header.cluster_bits,
            cluster_size,
            extended_l2: header.extended_l2,
            compression: header.compression,
            l2_entry_bytes,
            l2_span,
            l1_entries,
            l1_table_offset: header.l1_table_offset,
            l2: vec![0; cluster_size as usize],
            cluster: vec![0; cluster_size as usize],
            compressed: Vec::new(),
            inflater: Decompress::new(false),
        })
    }

    fn run(
        &mut self,
        sink: &mut dyn DiskSink,
        progress: &mut Progress<'_>,
    ) -> Result<(), Qcow2Error> {
        let mut window = vec![0u8; (L1_WINDOW * 8) as usize];
        let mut done = 0u64;
        let mut first = 0u64;
        while first < self.l1_entries {
            let n = (self.l1_entries - first).min(L1_WINDOW);
            let window = window.get_mut(..(n * 8) as usize).unwrap_or_default();
            read_exact_at(self.src, window, self.l1_table_offset + first * 8)
                .map_err(Qcow2Error::Read)?;
            for (i, entry) in window.chunks_exact(8).enumerate() {
                let entry = be64(entry, 0, "L1 entry")?;
                let start = (first + i as u64) * self.l2_span;
                let len = self.l2_span.min(self.virtual_size - start);
                self.emit_l2(entry & OFFSET_MASK, len, sink, progress, &mut done)?;
            }
            first += n;
        }
        if sink.position() != self.virtual_size {
            // Cannot happen when the sink started empty; guards the caller's contract.
            return Err(corrupt(format!(
                "wrote {} bytes for a virtual size of {}",
                sink.position(),
                self.virtual_size
            )));
        }
        Ok(())
    }

    /// Emits the `len` virtual bytes mapped by the L2 table at `l2_offset` (0: unallocated).
    fn emit_l2(
        &mut self,
        l2_offset: u64,
        len: u64,
        sink: &mut dyn DiskSink,
        progress: &mut Progress<'_>,
        done: &mut u64,
    ) -> Result<(), Qcow2Error> {
        if l2_offset == 0 {
            // One L2 table maps up to 128 TiB (2 MiB clusters): report progress on the way.
            let mut left = len;
            while left > 0 {
                let n = left.min(PROGRESS_INTERVAL);
                sink.write_zeros(n).map_err(Qcow2Error::Write)?;
                *done += n;
                left -= n;
                progress.update(*done);
            }
            return Ok(());
        }
        if !l2_offset.is_multiple_of(self.cluster_size) {
            return Err(corrupt(format!(
                "L2 table offset {l2_offset:#x} is not cluster-aligned"
            )));
        }
        if l2_offset
            .checked_add(self.cluster_size)
            .is_none_or(|end| end > self.src_len)
        {
            return Err(corrupt(format!(
                "L2 table at {l2_offset:#x} lies beyond the end of the file"
            )));
        }
        read_exact_at(self.src, &mut self.l2, l2_offset).map_err(Qcow2Error::Read)?;
        let clusters = len.div_ceil(self.cluster_size);
        for c in 0..clusters {
            let at = (c * self.l2_entry_bytes) as usize;
            let entry = be64(&self.l2, at, "L2 entry")?;
            let bitmap = if self.extended_l2 {
                be64(&self.l2, at + 8, "L2 bitmap")?
            } else {
                0
            };
            let cluster_len = self.cluster_size.min(len - c * self.cluster_size);
            self.emit_cluster(entry, bitmap, cluster_len, sink)?;
            *done += cluster_len;
            progress.update(*done);
        }
        Ok(())
    }

    fn emit_cluster(
        &mut self,
        entry: u64,
        bitmap: u64,
        len: u64,
        sink: &mut dyn DiskSink,
    ) -> Result<(), Qcow2Error> {
        // len ≤ cluster_size ≤ 2 MiB.
        let ulen = len as usize;
        if entry & L2_COMPRESSED != 0 {
            if bitmap != 0 {
                return Err(corrupt("compressed cluster with a subcluster bitmap"));
            }
            self.decompress(entry, ulen)?;
            let data = self.cluster.get(..ulen).unwrap_or_default();
            return sink.write_data(data).map_err(Qcow2Error::Write);
        }
        let host = entry & OFFSET_MASK;
        if !host.is_multiple_of(self.cluster_size) {
            return Err(corrupt(format!(
                "data cluster offset {host:#x} is not cluster-aligned"
            )));
        }
        if !self.extended_l2 {
            if entry & L2_ZERO != 0 || host == 0 {
                return sink.write_zeros(len).map_err(Qcow2Error::Write);
            }
            self.read_data(host, ulen)?;
            let data = self.cluster.get(..ulen).unwrap_or_default();
            return sink.write_data(data).map_err(Qcow2Error::Write);
        }
        let allocated = bitmap & 0xffff_ffff;
        let zero = bitmap >> 32;
        if allocated & zero != 0 {
            return Err(corrupt(format!(
                "subclusters {:#x} both allocated and zero",
                allocated & zero
            )));
        }
        if allocated != 0 {
            if host == 0 {
                return Err(corrupt("allocated subclusters without a host cluster"));
            }
            self.read_data(host, ulen)?;
        }
        let sub = self.cluster_size / SUBCLUSTERS;
        // Runs of subclusters of one kind become one call.
        let mut s = 0u64;
        while s < SUBCLUSTERS && s * sub < len {
            let is_data = allocated & (1 << s) != 0;
            let mut e = s + 1;
            while e < SUBCLUSTERS && e * sub < len && (allocated & (1 << e) != 0) == is_data {
                e += 1;
            }
            let start = s * sub;
            let end = (e * sub).min(len);
            if is_data {
                let data = self
                    .cluster
                    .get(start as usize..end as usize)
                    .unwrap_or_default();
                sink.write_data(data).map_err(Qcow2Error::Write)?;
            } else {
                sink.write_zeros(end - start).map_err(Qcow2Error::Write)?;
            }
            s = e;
        }
        Ok(())
    }

    /// Reads `len` bytes of the data cluster at `host` into `self.cluster`. A cluster cut
    /// short by the end of the file reads as zeros past it, as in QEMU: the last cluster of
    /// an image need not be fully written.
    fn read_data(&mut self, host: u64, len: usize) -> Result<(), Qcow2Error> {
        if host >= self.src_len {
            return Err(corrupt(format!(
                "data cluster at {host:#x} lies beyond the end of the file"
            )));
        }
        let avail = ((self.src_len - host).min(len as u64)) as usize;
        let buf = self.cluster.get_mut(..len).unwrap_or_default();
        let (present, past_end) = buf.split_at_mut(avail.min(buf.len()));
        read_exact_at(self.src, present, host).map_err(Qcow2Error::Read)?;
        past_end.fill(0);
        Ok(())
    }

    /// Decodes the compressed cluster described by `entry` into `self.cluster[..len]`.
    fn decompress(&mut self, entry: u64, len: usize) -> Result<(), Qcow2Error> {
        let csize_shift = 62 - (self.cluster_bits - 8);
        let csize_mask = (1u64 << (self.cluster_bits - 8)) - 1;
        let offset = entry & ((1u64 << csize_shift) - 1);
        let sectors = ((entry >> csize_shift) & csize_mask) + 1;
        // The compressed data starts at `offset` and ends in the last of `sectors` 512-byte
        // sectors; at most twice the cluster size.
        let csize = sectors * 512 - (offset & 511);
        if offset >= self.src_len {
            return Err(corrupt(format!(
                "compressed cluster at {offset:#x} lies beyond the end of the file"
            )));
        }
        // The last sector may be cut short by the end of the file.
        let avail = csize.min(self.src_len - offset) as usize;
        self.compressed.resize(avail, 0);
        read_exact_at(self.src, &mut self.compressed, offset).map_err(Qcow2Error::Read)?;
        let out = self.cluster.get_mut(..len).unwrap_or_default();
        let produced = match self.compression {
            ClusterCompression::Deflate => {
                self.inflater.reset(false);
                // The stream may end before the input does (sector padding), and output may
                // fill before the end-of-stream marker is read: both are complete clusters.
                match self
                    .inflater
                    .decompress(&self.compressed, out, FlushDecompress::Finish)
                {
                    Ok(Status::Ok | Status::StreamEnd | Status::BufError) => {
                        self.inflater.total_out() as usize
                    }
                    Err(e) => {
                        return Err(Qcow2Error::Decompress {
                            offset,
                            source: io::Error::new(io::ErrorKind::InvalidData, e),
                        });
                    }
                }
            }
            ClusterCompression::Zstd => {
                // Reading stops once the cluster is full, so the padding after the last frame
                // is never parsed as a frame.
                let mut reader = ZstdFrames::new(&self.compressed[..]);
                fill(&mut reader, out)
                    .map_err(|source| Qcow2Error::Decompress { offset, source })?
            }
        };
        if produced < len {
            return Err(Qcow2Error::Decompress {
                offset,
                source: io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("decodes to {produced} bytes, the cluster needs {len}"),
                ),
            });
        }
        Ok(())
    }
}

/// Reads into `buf` until it is full or the reader ends; returns the bytes read.
fn fill(reader: &mut dyn io::Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match reader.read(buf.get_mut(filled..).unwrap_or_default()) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}

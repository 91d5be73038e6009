//! The artifact: the raw disk image a build produces, written crash-safely, and the small
//! completion record that lets a later build of the same manifest reuse it.
//!
//! The artifact is written to `<final>.tmp` and renamed into place only after its content and
//! length are synced, so a file at the final path is always complete. A build that dies leaves
//! only the `.tmp`, which the next [`ArtifactWriter::create`] truncates.

use std::ffi::OsString;
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::hashing::{HashError, HashThread};
use crate::sparse::{DiskSink, SparseFile};

/// Progress is reported at least this often, in logical bytes.
pub const PROGRESS_INTERVAL: u64 = 64 << 20;

/// The largest completion record read back; real ones are about 200 bytes.
pub const MAX_RECORD_BYTES: u64 = 64 << 10;

/// What a finished artifact is: its logical size and the SHA-256 of all its bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArtifactRecord {
    /// The length of the raw image in bytes.
    pub size_bytes: u64,
    /// Lower-case hex SHA-256 of the raw image, zeros in holes included.
    pub sha256: String,
}

/// `<path><suffix>`, keeping non-UTF-8 names intact.
fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut name = OsString::from(path.as_os_str());
    name.push(suffix);
    PathBuf::from(name)
}

/// The temporary file an artifact is written to before it is renamed into place.
pub fn tmp_path(final_path: &Path) -> PathBuf {
    with_suffix(final_path, ".tmp")
}

/// The completion record that belongs to an artifact: `<artifact>.json`.
pub fn record_path(artifact_path: &Path) -> PathBuf {
    with_suffix(artifact_path, ".json")
}

/// Writes a raw disk image sparsely and hashes its logical content, on a [`HashThread`] of its
/// own.
///
/// Dropping it without [`ArtifactWriter::finish`] leaves only `<final>.tmp` and stops the
/// hashing thread.
#[derive(Debug)]
pub struct ArtifactWriter {
    sparse: SparseFile,
    hasher: HashThread,
    tmp_path: PathBuf,
    final_path: PathBuf,
}

impl ArtifactWriter {
    /// Creates (or truncates) `<final_path>.tmp` for writing.
    pub fn create(final_path: &Path) -> Result<Self> {
        let tmp_path = tmp_path(final_path);
        let file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&tmp_path)
            .map_err(|source| Error::io("create the artifact", &tmp_path, source))?;
        Ok(Self {
            sparse: SparseFile::new(file),
            hasher: HashThread::sha256()?,
            tmp_path,
            final_path: final_path.to_path_buf(),
        })
    }

    /// The temporary file being written.
    pub fn tmp_path(&self) -> &Path {
        &self.tmp_path
    }

    /// Sets the length, syncs the file, waits for the digest, renames the file to the final
    /// path and syncs the directory.
    pub fn finish(self) -> Result<ArtifactRecord> {
        let Self {
            sparse,
            hasher,
            tmp_path,
            final_path,
        } = self;
        let (file, size_bytes) = sparse
            .finish()
            .map_err(|source| Error::io("write the artifact", &tmp_path, source))?;
        // The hashing thread catches up while the file syncs.
        file.sync_all()
            .map_err(|source| Error::io("sync the artifact", &tmp_path, source))?;
        drop(file);
        let digested = hasher.finish()?;
        if digested.len != size_bytes {
            // Cannot happen: both saw the same calls. Guards the digest's meaning.
            return Err(Error::Hash(HashError::Stopped(format!(
                "it hashed {} bytes of {size_bytes}",
                digested.len
            ))));
        }
        std::fs::rename(&tmp_path, &final_path)
            .map_err(|source| Error::io("rename the artifact into place", &final_path, source))?;
        sync_parent(&final_path)?;
        Ok(ArtifactRecord {
            size_bytes,
            sha256: digested.sha256,
        })
    }
}

impl DiskSink for ArtifactWriter {
    fn write_data(&mut self, data: &[u8]) -> io::Result<()> {
        self.hasher.data(data).map_err(io::Error::other)?;
        self.sparse.write_data(data)
    }

    fn write_zeros(&mut self, len: u64) -> io::Result<()> {
        self.hasher.zeros(len).map_err(io::Error::other)?;
        self.sparse.write_zeros(len)
    }

    fn position(&self) -> u64 {
        self.sparse.position()
    }
}

/// Syncs the directory holding `path`, so a rename into it survives a crash.
fn sync_parent(path: &Path) -> Result<()> {
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|source| Error::io("sync the directory", dir, source))
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}

/// Calls `progress` when `done` has moved [`PROGRESS_INTERVAL`] past the last report.
pub(crate) struct Progress<'a> {
    callback: &'a mut dyn FnMut(u64, u64),
    total: u64,
    last: u64,
}

impl<'a> Progress<'a> {
    pub(crate) fn new(callback: &'a mut dyn FnMut(u64, u64), total: u64) -> Self {
        callback(0, total);
        Self {
            callback,
            total,
            last: 0,
        }
    }

    pub(crate) fn update(&mut self, done: u64) {
        if done.saturating_sub(self.last) >= PROGRESS_INTERVAL {
            self.last = done;
            (self.callback)(done, self.total);
        }
    }

    pub(crate) fn finish(&mut self, done: u64) {
        (self.callback)(done, self.total);
    }
}

/// Copies a raw disk image into `sink`, turning zero blocks into holes.
///
/// Returns the number of bytes copied. `progress(done, total)` is called at the start, at least
/// every [`PROGRESS_INTERVAL`] bytes and at the end.
pub fn copy_raw(
    src_path: &Path,
    sink: &mut dyn DiskSink,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<u64> {
    let mut src =
        File::open(src_path).map_err(|source| Error::io("open the raw disk", src_path, source))?;
    let total = src
        .metadata()
        .map_err(|source| Error::io("stat the raw disk", src_path, source))?
        .len();
    let mut progress = Progress::new(progress, total);
    let mut buf = vec![0u8; 1 << 20];
    let mut done = 0u64;
    loop {
        let n = match src.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(source) => return Err(Error::io("read the raw disk", src_path, source)),
        };
        let chunk = buf.get(..n).unwrap_or_default();
        sink.write_data(chunk).map_err(Error::Sink)?;
        done += n as u64;
        progress.update(done);
    }
    progress.finish(done);
    Ok(done)
}

/// The completion record stored beside an artifact as `<artifact>.json`.
///
/// Its presence, with a matching artifact length, means the artifact at that path is the
/// complete raw image of `manifest_digest`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CompletionRecord {
    /// The digest of the manifest the artifact was built from (`sha256:…`).
    pub manifest_digest: String,
    /// The artifact's length in bytes.
    pub size_bytes: u64,
    /// Lower-case hex SHA-256 of the artifact's content.
    pub sha256: String,
}

impl CompletionRecord {
    /// The record of `artifact` built from `manifest_digest`.
    pub fn new(manifest_digest: &str, artifact: &ArtifactRecord) -> Self {
        Self {
            manifest_digest: manifest_digest.to_owned(),
            size_bytes: artifact.size_bytes,
            sha256: artifact.sha256.clone(),
        }
    }
}

/// Writes `<artifact>.json` via a synced temporary file and a rename.
pub fn write_record(artifact_path: &Path, record: &CompletionRecord) -> Result<()> {
    let final_path = record_path(artifact_path);
    let tmp = tmp_path(&final_path);
    let json = serde_json::to_vec_pretty(record).map_err(Error::RecordEncode)?;
    let mut file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(&tmp)
        .map_err(|source| Error::io("create the completion record", &tmp, source))?;
    file.write_all(&json)
        .and_then(|()| file.sync_all())
        .map_err(|source| Error::io("write the completion record", &tmp, source))?;
    drop(file);
    std::fs::rename(&tmp, &final_path)
        .map_err(|source| Error::io("rename the completion record", &final_path, source))?;
    sync_parent(&final_path)
}

/// Reads `<artifact>.json`; `None` when there is none. Records over [`MAX_RECORD_BYTES`] or
/// that do not parse are errors.
pub fn read_record(artifact_path: &Path) -> Result<Option<CompletionRecord>> {
    let path = record_path(artifact_path);
    let file = match File::open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(Error::io("open the completion record", &path, source)),
    };
    let mut bytes = Vec::new();
    file.take(MAX_RECORD_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|source| Error::io("read the completion record", &path, source))?;
    if bytes.len() as u64 > MAX_RECORD_BYTES {
        return Err(Error::TooLarge {
            what: "completion record",
            limit: MAX_RECORD_BYTES,
        });
    }
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|source| Error::RecordDecode { path, source })
}

/// The record of an artifact that can be reused for `manifest_digest`: its record names that
/// digest and the artifact file exists with the recorded length. The content is not rehashed.
pub fn reusable(artifact_path: &Path, manifest_digest: &str) -> Result<Option<CompletionRecord>> {
    let Some(record) = read_record(artifact_path)? else {
        return Ok(None);
    };
    if record.manifest_digest != manifest_digest {
        return Ok(None);
    }
    match std::fs::metadata(artifact_path) {
        Ok(m) if m.is_file() && m.len() == record.size_bytes => Ok(Some(record)),
        Ok(_) => Ok(None),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(Error::io("stat the artifact", artifact_path, source)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sha2::{Digest, Sha256};
    use std::os::unix::fs::MetadataExt;

    fn sha256_hex(bytes: &[u8]) -> String {
        hex(&Sha256::digest(bytes))
    }

    /// Deterministic bytes that are never a whole zero block.
    fn noise(len: usize, seed: u64) -> Vec<u8> {
        let mut x = seed | 1;
        (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 24) as u8 | 1
            })
            .collect()
    }

    #[test]
    fn hash_covers_data_zeros_and_holes_and_content_reads_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("disk.raw");
        let mut w = ArtifactWriter::create(&path).unwrap();
        let mut logical = Vec::new();
        // Odd sizes so blocks straddle calls; explicit zeros as data; holes of odd length.
        let pieces: Vec<Vec<u8>> = vec![
            noise(1000, 1),
            vec![0; 10_000],
            noise(5000, 2),
            noise(3, 3),
            vec![0; 4096 * 3 + 17],
        ];
        for (i, piece) in pieces.iter().enumerate() {
            w.write_data(piece).unwrap();
            logical.extend_from_slice(piece);
            let hole = 4096 * i as u64 + 333;
            w.write_zeros(hole).unwrap();
            logical.resize(logical.len() + hole as usize, 0);
        }
        w.write_data(&noise(10, 4)).unwrap();
        logical.extend_from_slice(&noise(10, 4));
        assert_eq!(w.position(), logical.len() as u64);
        let record = w.finish().unwrap();
        assert_eq!(record.size_bytes, logical.len() as u64);
        assert_eq!(record.sha256, sha256_hex(&logical));
        assert_eq!(std::fs::read(&path).unwrap(), logical);
        assert!(!tmp_path(&path).exists());
    }

    /// One call on a writer: data, or a zero run.
    #[derive(Debug, Clone, Copy)]
    enum Call {
        Data(usize),
        ZeroData(usize),
        Hole(u64),
    }

    /// Writes `calls`, then checks the record against the file read back: its length and the
    /// SHA-256 of all its bytes.
    fn check_layout(name: &str, calls: &[Call]) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("disk.raw");
        let mut w = ArtifactWriter::create(&path).unwrap();
        for (i, call) in calls.iter().enumerate() {
            match *call {
                Call::Data(n) => w.write_data(&noise(n, i as u64)).unwrap(),
                Call::ZeroData(n) => w.write_data(&vec![0; n]).unwrap(),
                Call::Hole(n) => w.write_zeros(n).unwrap(),
            }
        }
        let record = w.finish().unwrap();
        let file = std::fs::read(&path).unwrap();
        assert_eq!(record.size_bytes, file.len() as u64, "{name}");
        assert_eq!(record.sha256, sha256_hex(&file), "{name}");
    }

    #[test]
    fn digest_is_that_of_the_whole_file_wherever_the_holes_are() {
        use Call::{Data, Hole, ZeroData};
        const MIB: usize = 1 << 20;
        let layouts: &[(&str, &[Call])] = &[
            ("empty", &[]),
            ("no hole", &[Data(3 * MIB + 5)]),
            (
                "hole at the start",
                &[Hole(2 * MIB as u64 + 100), Data(MIB)],
            ),
            ("hole at the end", &[Data(MIB + 1), Hole(5 * MIB as u64)]),
            ("holes at both ends", &[Hole(4096), Data(7), Hole(4095)]),
            ("all hole", &[Hole(8 * MIB as u64)]),
            ("all zeros as data", &[ZeroData(2 * MIB + 3)]),
            (
                "holes and zeros between data",
                &[
                    Data(MIB - 1),
                    Hole(1),
                    ZeroData(4096),
                    Hole(MIB as u64 * 3),
                    Hole(17),
                    Data(5 * MIB / 2),
                    ZeroData(1),
                    Data(65_536),
                ],
            ),
        ];
        for (name, calls) in layouts {
            check_layout(name, calls);
        }
    }

    mod generated {
        use super::{Call, check_layout};
        use proptest::prelude::*;

        proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]

        #[test]
        fn digest_is_that_of_the_whole_file_for_any_layout(
            calls in proptest::collection::vec(
                prop_oneof![
                    (0usize..300_000).prop_map(Call::Data),
                    (0usize..20_000).prop_map(Call::ZeroData),
                    (0u64..3_000_000).prop_map(Call::Hole),
                ],
                0..12,
            )
        ) {
            check_layout("generated", &calls);
        }
        }
    }

    #[test]
    fn trailing_zeros_set_the_length() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("disk.raw");
        let mut w = ArtifactWriter::create(&path).unwrap();
        w.write_data(b"boot").unwrap();
        w.write_zeros(1 << 20).unwrap();
        let record = w.finish().unwrap();
        let mut logical = b"boot".to_vec();
        logical.resize(4 + (1 << 20), 0);
        assert_eq!(record.sha256, sha256_hex(&logical));
        assert_eq!(std::fs::read(&path).unwrap(), logical);
    }

    #[test]
    fn finished_file_is_sparse() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("disk.raw");
        let mut w = ArtifactWriter::create(&path).unwrap();
        w.write_data(&noise(8192, 5)).unwrap();
        // Zeros passed as data must become holes too, not only explicit holes.
        w.write_data(&vec![0; 16 << 20]).unwrap();
        w.write_zeros(48 << 20).unwrap();
        w.write_data(&noise(8192, 6)).unwrap();
        let record = w.finish().unwrap();
        let meta = std::fs::metadata(&path).unwrap();
        assert_eq!(meta.len(), record.size_bytes);
        let allocated = meta.blocks() * 512;
        assert!(
            allocated < 1 << 20,
            "{allocated} bytes allocated for 64 MiB"
        );
    }

    #[test]
    fn dropped_writer_leaves_only_tmp_and_next_create_truncates() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("disk.raw");
        {
            let mut w = ArtifactWriter::create(&path).unwrap();
            w.write_data(&noise(3 << 20, 7)).unwrap();
        }
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![OsString::from("disk.raw.tmp")]);
        assert!(std::fs::metadata(tmp_path(&path)).unwrap().len() > 0);

        let mut w = ArtifactWriter::create(&path).unwrap();
        w.write_zeros(8192).unwrap();
        w.write_data(b"x").unwrap();
        w.finish().unwrap();
        let mut expected = vec![0u8; 8192];
        expected.push(b'x');
        assert_eq!(std::fs::read(&path).unwrap(), expected);
    }

    #[test]
    fn copy_raw_keeps_content_and_reports_progress() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("src.raw");
        let mut content = noise(70_000, 8);
        content.resize(3 << 20, 0);
        content.extend_from_slice(&noise(5, 9));
        std::fs::write(&src, &content).unwrap();
        let dst = dir.path().join("disk.raw");
        let mut w = ArtifactWriter::create(&dst).unwrap();
        let mut calls = Vec::new();
        let n = copy_raw(&src, &mut w, &mut |d, t| calls.push((d, t))).unwrap();
        assert_eq!(n, content.len() as u64);
        let record = w.finish().unwrap();
        assert_eq!(record.sha256, sha256_hex(&content));
        assert_eq!(std::fs::read(&dst).unwrap(), content);
        assert_eq!(calls.first(), Some(&(0, n)));
        assert_eq!(calls.last(), Some(&(n, n)));
    }

    #[test]
    fn record_round_trips_and_guards_reuse() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("disk.raw");
        assert_eq!(read_record(&path).unwrap(), None);
        let mut w = ArtifactWriter::create(&path).unwrap();
        w.write_data(b"hello").unwrap();
        let artifact = w.finish().unwrap();
        let record = CompletionRecord::new("sha256:abc", &artifact);
        write_record(&path, &record).unwrap();
        assert_eq!(read_record(&path).unwrap(), Some(record.clone()));
        let json = std::fs::read_to_string(record_path(&path)).unwrap();
        assert!(json.contains("\"manifestDigest\""), "{json}");
        assert!(json.contains("\"sizeBytes\": 5"), "{json}");
        assert_eq!(reusable(&path, "sha256:abc").unwrap(), Some(record));
        assert_eq!(reusable(&path, "sha256:def").unwrap(), None);
        // An artifact of another length is not the one recorded.
        std::fs::write(&path, b"hello!").unwrap();
        assert_eq!(reusable(&path, "sha256:abc").unwrap(), None);
        std::fs::remove_file(&path).unwrap();
        assert_eq!(reusable(&path, "sha256:abc").unwrap(), None);
    }

    #[test]
    fn oversized_or_garbled_record_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("disk.raw");
        std::fs::write(record_path(&path), vec![b' '; 70_000]).unwrap();
        assert!(matches!(read_record(&path), Err(Error::TooLarge { .. })));
        std::fs::write(record_path(&path), b"{\"manifestDigest\": 1}").unwrap();
        assert!(matches!(
            read_record(&path),
            Err(Error::RecordDecode { .. })
        ));
    }
}

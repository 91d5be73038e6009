//! The qcow2 reader against QEMU's own: every image is made by `qemu-img`/`qemu-io`, and the
//! reader's raw output must equal `qemu-img convert -O raw` of the same image, byte for byte,
//! while staying sparse.

use std::fs::File;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};

use banlieue_imagebuilder::ArtifactWriter;
use banlieue_imagebuilder::qcow2::{self, ClusterCompression, Limits, Qcow2Error};
use banlieue_imagebuilder::sparse::{DiskSink, VecSink};

const MIB: u64 = 1 << 20;
/// Not a multiple of any cluster size from 1 KiB up, so the last cluster is partial.
const VIRTUAL: u64 = 40 * MIB + 4608;
const LIMITS: Limits = Limits {
    max_virtual_size: 1 << 40,
};

fn run(program: &str, args: &[&str]) {
    let out = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("run {program}: {e}"));
    assert!(
        out.status.success(),
        "{program} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn qemu_img(args: &[&str]) {
    run("/usr/bin/qemu-img", args);
}

fn qemu_io(image: &Path, commands: &[&str]) {
    let mut args = vec!["-f", "qcow2"];
    for c in commands {
        args.extend(["-c", c]);
    }
    args.push(image.to_str().unwrap());
    run("/usr/bin/qemu-io", &args);
}

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// A raw disk of `size` bytes: scattered extents at odd offsets, half of them noise (which
/// does not compress) and half repetitive text (which does), an explicit zero extent, and
/// holes everywhere else.
fn make_source(path: &Path, size: u64, seed: u64) {
    let file = File::create(path).unwrap();
    file.set_len(size).unwrap();
    let mut rng = Rng(seed);
    for i in 0..24 {
        let len = 1 + rng.next() % (160 * 1024);
        let offset = rng.next() % (size - len);
        let data: Vec<u8> = if i % 2 == 0 {
            (0..len).map(|_| rng.next() as u8).collect()
        } else {
            b"banlieue qcow2 oracle "
                .iter()
                .cycle()
                .take(len as usize)
                .copied()
                .collect()
        };
        file.write_all_at(&data, offset).unwrap();
    }
    // Data right at both ends: the first sector and the partial last cluster.
    file.write_all_at(b"\xeb\x63\x90boot", 0).unwrap();
    file.write_all_at(b"tail", size - 4).unwrap();
    file.write_all_at(&vec![0; 300_000], size / 2 + 7).unwrap();
}

struct Case {
    dir: tempfile::TempDir,
    qcow2: PathBuf,
}

impl Case {
    /// Converts a fresh source with `qemu-img convert -O qcow2 <args>`.
    fn from_source(seed: u64, args: &[&str]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("src.raw");
        make_source(&src, VIRTUAL, seed);
        let qcow2 = dir.path().join("image.qcow2");
        let mut all = vec!["convert", "-f", "raw", "-O", "qcow2"];
        all.extend_from_slice(args);
        all.extend([src.to_str().unwrap(), qcow2.to_str().unwrap()]);
        qemu_img(&all);
        Self { dir, qcow2 }
    }

    /// Converts with this crate and with qemu-img; asserts equal bytes and a sparse output.
    fn check(&self) -> qcow2::Header {
        let expected = self.dir.path().join("expected.raw");
        qemu_img(&[
            "convert",
            "-f",
            "qcow2",
            "-O",
            "raw",
            self.qcow2.to_str().unwrap(),
            expected.to_str().unwrap(),
        ]);
        let out = self.dir.path().join("out.raw");
        let mut writer = ArtifactWriter::create(&out).unwrap();
        let mut last = (0, 0);
        let header =
            qcow2::convert_file(&self.qcow2, &mut writer, &LIMITS, &mut |d, t| last = (d, t))
                .unwrap();
        let record = writer.finish().unwrap();
        assert_eq!(last, (header.virtual_size, header.virtual_size));
        assert_eq!(record.size_bytes, header.virtual_size);
        let ours = std::fs::read(&out).unwrap();
        let theirs = std::fs::read(&expected).unwrap();
        assert_eq!(ours.len(), theirs.len());
        assert_eq!(record.sha256, sha256_hex(&theirs));
        if let Some(at) = ours.iter().zip(&theirs).position(|(a, b)| a != b) {
            panic!("first difference at byte {at:#x}");
        }
        let allocated = std::fs::metadata(&out).unwrap().blocks() * 512;
        assert!(
            allocated < header.virtual_size / 4,
            "{allocated} bytes allocated for {} virtual",
            header.virtual_size
        );
        header
    }
}

#[test]
fn version_2_default_clusters() {
    let h = Case::from_source(1, &["-o", "compat=0.10"]).check();
    assert_eq!((h.version, h.cluster_bits), (2, 16));
}

#[test]
fn version_3_with_512_byte_clusters() {
    let h = Case::from_source(2, &["-o", "compat=1.1,cluster_size=512"]).check();
    assert_eq!((h.version, h.cluster_bits), (3, 9));
}

#[test]
fn version_2_with_2_mib_clusters() {
    let h = Case::from_source(3, &["-o", "compat=0.10,cluster_size=2M"]).check();
    assert_eq!((h.version, h.cluster_bits), (2, 21));
}

#[test]
fn deflate_compressed_clusters() {
    let h = Case::from_source(4, &["-c", "-o", "compat=1.1"]).check();
    assert_eq!(h.compression, ClusterCompression::Deflate);
    let h = Case::from_source(5, &["-c", "-o", "compat=0.10,cluster_size=512"]).check();
    assert_eq!((h.version, h.cluster_bits), (2, 9));
}

#[test]
fn zstd_compressed_clusters() {
    let h = Case::from_source(6, &["-c", "-o", "compression_type=zstd"]).check();
    assert_eq!(h.compression, ClusterCompression::Zstd);
    let h = Case::from_source(7, &["-c", "-o", "compression_type=zstd,cluster_size=2M"]).check();
    assert_eq!(
        (h.compression, h.cluster_bits),
        (ClusterCompression::Zstd, 21)
    );
}

#[test]
fn zero_clusters_and_dirty_bit() {
    let case = Case::from_source(8, &["-o", "compat=1.1,lazy_refcounts=on"]);
    // Zeroes over allocated data (zero flag on an allocated cluster), over a hole, unaligned
    // zeroes (partial clusters get written), and an unmapped range.
    qemu_io(
        &case.qcow2,
        &[
            "write -z 0 4M",
            "write -z 20M 1M",
            "write -z 30001 70000",
            "write -z -u 8M 2M",
            "write -P 0x5a 12M 65536",
        ],
    );
    // Set the dirty bit (incompatible bit 0, the last byte of the field at 72): lazy
    // refcounts leave it set after a crash, and the image stays readable.
    let file = std::fs::OpenOptions::new()
        .write(true)
        .read(true)
        .open(&case.qcow2)
        .unwrap();
    let mut byte = [0u8];
    file.read_exact_at(&mut byte, 79).unwrap();
    file.write_all_at(&[byte[0] | 1], 79).unwrap();
    drop(file);
    let h = case.check();
    assert!(h.dirty());
}

#[test]
fn extended_l2_subclusters() {
    let case = Case::from_source(9, &["-o", "extended_l2=on,cluster_size=64k"]);
    qemu_io(
        &case.qcow2,
        &[
            "write -P 0xab 4k 4k",
            "write -z 128k 64k",
            "write -P 0xcd 200k 6k",
            "write -z 202k 2k",
        ],
    );
    let h = case.check();
    assert!(h.extended_l2);
    let case = Case::from_source(10, &["-c", "-o", "extended_l2=on,cluster_size=128k"]);
    assert!(case.check().extended_l2);
}

fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest as _;
    sha2::Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// An image in memory whose reads fail from the `fail_at`-th on.
struct FailingRead {
    bytes: Vec<u8>,
    reads: AtomicUsize,
    fail_at: usize,
}

impl qcow2::ReadAt for FailingRead {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<usize> {
        if self.reads.fetch_add(1, Ordering::Relaxed) >= self.fail_at {
            return Err(std::io::Error::other("injected read failure"));
        }
        qcow2::ReadAt::read_at(&self.bytes, buf, offset)
    }
}

#[test]
fn a_failing_read_mid_conversion_is_a_typed_error_and_leaves_no_artifact() {
    let case = Case::from_source(11, &["-o", "cluster_size=64k"]);
    let bytes = std::fs::read(&case.qcow2).unwrap();
    let dir = case.dir.path().to_owned();
    let counting = FailingRead {
        bytes: bytes.clone(),
        reads: AtomicUsize::new(0),
        fail_at: usize::MAX,
    };
    let len = bytes.len() as u64;
    qcow2::convert(
        &counting,
        len,
        &mut NullSink::default(),
        &LIMITS,
        &mut |_, _| {},
    )
    .unwrap();
    let reads = counting.reads.load(Ordering::Relaxed);
    assert!(reads > 8, "{reads} reads");
    // The header, the L1 table, the first L2 table, data halfway, the last data cluster.
    for fail_at in [0, 1, 2, reads / 2, reads - 1] {
        let (bytes, dir) = (bytes.clone(), dir.clone());
        let (done, result) = std::sync::mpsc::channel();
        // On a thread of its own so that a hang fails the test instead of stalling it.
        std::thread::spawn(move || {
            let out = dir.join(format!("failed-{fail_at}.raw"));
            let src = FailingRead {
                reads: AtomicUsize::new(0),
                fail_at,
                bytes,
            };
            let mut writer = ArtifactWriter::create(&out).unwrap();
            let converted = qcow2::convert(&src, len, &mut writer, &LIMITS, &mut |_, _| {});
            drop(writer);
            let _ = done.send((converted, out.exists()));
        });
        let (converted, exists) = result
            .recv_timeout(std::time::Duration::from_secs(60))
            .expect("the conversion ends");
        match converted {
            Err(Qcow2Error::Read(e)) => assert_eq!(e.to_string(), "injected read failure"),
            other => panic!("read {fail_at} failing gave {other:?}"),
        }
        assert!(!exists);
    }
}

/// Counts calls; keeps nothing.
#[derive(Default)]
struct NullSink(u64);

impl DiskSink for NullSink {
    fn write_data(&mut self, data: &[u8]) -> std::io::Result<()> {
        self.0 += data.len() as u64;
        Ok(())
    }
    fn write_zeros(&mut self, len: u64) -> std::io::Result<()> {
        self.0 += len;
        Ok(())
    }
    fn position(&self) -> u64 {
        self.0
    }
}

#[test]
fn progress_every_64_mib() {
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("empty.qcow2");
    qemu_img(&["create", "-q", "-f", "qcow2", image.to_str().unwrap(), "1G"]);
    let mut calls = Vec::new();
    qcow2::convert_file(&image, &mut NullSink::default(), &LIMITS, &mut |d, t| {
        calls.push((d, t))
    })
    .unwrap();
    assert_eq!(calls.first(), Some(&(0, 1 << 30)));
    assert_eq!(calls.last(), Some(&(1 << 30, 1 << 30)));
    for pair in calls.windows(2) {
        assert!(pair[1].0 - pair[0].0 <= 64 * MIB, "{pair:?}");
    }
}

/// A small v3 image with data, in memory, for corruption.
fn small_image(dir: &Path, options: &str) -> Vec<u8> {
    let src = dir.join("small.raw");
    let file = File::create(&src).unwrap();
    file.set_len(2 * MIB).unwrap();
    file.write_all_at(b"some data", 5000).unwrap();
    file.write_all_at(&[7u8; 70_000], MIB + 3).unwrap();
    drop(file);
    let image = dir.join("small.qcow2");
    qemu_img(&[
        "convert",
        "-f",
        "raw",
        "-O",
        "qcow2",
        "-o",
        options,
        src.to_str().unwrap(),
        image.to_str().unwrap(),
    ]);
    std::fs::read(&image).unwrap()
}

const SMALL_LIMITS: Limits = Limits {
    max_virtual_size: 8 << 20,
};

fn convert_bytes(bytes: &[u8]) -> Result<Vec<u8>, Qcow2Error> {
    let bytes = bytes.to_vec();
    let mut sink = VecSink::default();
    qcow2::convert(
        &bytes,
        bytes.len() as u64,
        &mut sink,
        &SMALL_LIMITS,
        &mut |_, _| {},
    )?;
    Ok(sink.0)
}

fn put_be64(bytes: &mut [u8], at: usize, v: u64) {
    bytes[at..at + 8].copy_from_slice(&v.to_be_bytes());
}

fn put_be32(bytes: &mut [u8], at: usize, v: u32) {
    bytes[at..at + 4].copy_from_slice(&v.to_be_bytes());
}

#[test]
fn corrupt_and_unsupported_headers_are_typed_errors() {
    let dir = tempfile::tempdir().unwrap();
    let good = small_image(dir.path(), "compat=1.1");
    let raw = convert_bytes(&good).unwrap();
    assert_eq!(&raw[5000..5009], b"some data");

    let err = convert_bytes(&good[..50]).unwrap_err();
    assert!(matches!(err, Qcow2Error::Truncated { .. }), "{err}");
    let err = convert_bytes(b"QFI").unwrap_err();
    assert!(matches!(err, Qcow2Error::Truncated { .. }), "{err}");
    let err = convert_bytes(&[0u8; 4096]).unwrap_err();
    assert!(matches!(err, Qcow2Error::NotQcow2), "{err}");

    let patched = |f: &dyn Fn(&mut Vec<u8>)| {
        let mut b = good.clone();
        f(&mut b);
        convert_bytes(&b).unwrap_err()
    };
    let err = patched(&|b| put_be64(b, 40, 1 << 40));
    assert!(
        matches!(&err, Qcow2Error::Corrupt(m) if m.contains("L1 table")),
        "{err}"
    );
    for bits in [0, 8, 22, 40, u32::MAX] {
        let err = patched(&|b| put_be32(b, 20, bits));
        assert!(
            matches!(err, Qcow2Error::InvalidClusterBits(x) if x == bits),
            "{err}"
        );
    }
    let err = patched(&|b| put_be32(b, 4, 4));
    assert!(matches!(err, Qcow2Error::UnsupportedVersion(4)), "{err}");
    let err = patched(&|b| put_be64(b, 72, 1 << 20));
    assert!(
        matches!(&err, Qcow2Error::UnknownIncompatibleFeatures { bits, .. } if *bits == 1 << 20),
        "{err}"
    );
    assert!(err.is_unsupported());
    let err = patched(&|b| put_be64(b, 72, 1 << 2));
    assert!(matches!(err, Qcow2Error::ExternalDataFile), "{err}");
    let err = patched(&|b| put_be64(b, 72, 1 << 1));
    assert!(matches!(err, Qcow2Error::MarkedCorrupt), "{err}");
    let err = patched(&|b| put_be32(b, 32, 1));
    assert!(matches!(err, Qcow2Error::Encrypted { method: 1 }), "{err}");
    let err = patched(&|b| put_be64(b, 24, 1 << 40));
    assert!(
        matches!(err, Qcow2Error::VirtualSizeTooLarge { .. }),
        "{err}"
    );
    let err = patched(&|b| put_be32(b, 36, 0));
    assert!(matches!(err, Qcow2Error::Corrupt(_)), "{err}");
    let err = patched(&|b| put_be32(b, 36, u32::MAX));
    assert!(matches!(err, Qcow2Error::Corrupt(_)), "{err}");

    // The first L1 entry points past the end of the file, then somewhere unaligned.
    let l1 = u64::from_be_bytes(good[40..48].try_into().unwrap()) as usize;
    let err = patched(&|b| put_be64(b, l1, 1 << 40));
    assert!(
        matches!(&err, Qcow2Error::Corrupt(m) if m.contains("L2 table")),
        "{err}"
    );
    let err = patched(&|b| put_be64(b, l1, 0x10200));
    assert!(matches!(err, Qcow2Error::Corrupt(_)), "{err}");
}

#[test]
fn backing_file_is_refused_with_its_name() {
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().join("base.qcow2");
    let overlay = dir.path().join("overlay.qcow2");
    qemu_img(&["create", "-q", "-f", "qcow2", base.to_str().unwrap(), "1M"]);
    qemu_img(&[
        "create",
        "-q",
        "-f",
        "qcow2",
        "-F",
        "qcow2",
        "-b",
        base.to_str().unwrap(),
        overlay.to_str().unwrap(),
    ]);
    let err = qcow2::convert_file(&overlay, &mut VecSink::default(), &LIMITS, &mut |_, _| {})
        .unwrap_err();
    match &err {
        Qcow2Error::BackingFile { name } => assert!(name.ends_with("base.qcow2"), "{name}"),
        other => panic!("expected BackingFile, got {other}"),
    }
    assert!(err.is_unsupported());
}

#[test]
fn every_truncation_is_an_error_not_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    for options in ["compat=1.1,cluster_size=512", "compat=0.10,cluster_size=1k"] {
        let good = small_image(dir.path(), options);
        let expected = convert_bytes(&good).unwrap();
        let mut errors = 0;
        for len in (0..good.len()).step_by(127) {
            match convert_bytes(&good[..len]) {
                Err(_) => errors += 1,
                // A cut inside the last data cluster reads as zeros past the end, as in QEMU.
                Ok(out) => assert_eq!(out.len(), expected.len()),
            }
        }
        assert!(errors > 0);
    }
}

#[test]
fn compressed_clusters_that_do_not_decode_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    for options in ["compat=1.1", "compression_type=zstd"] {
        let src = dir.path().join("c.raw");
        std::fs::write(&src, b"compressible ".repeat(100_000)).unwrap();
        let image = dir.path().join("c.qcow2");
        qemu_img(&[
            "convert",
            "-c",
            "-f",
            "raw",
            "-O",
            "qcow2",
            "-o",
            options,
            src.to_str().unwrap(),
            image.to_str().unwrap(),
        ]);
        let mut bytes = std::fs::read(&image).unwrap();
        assert!(convert_bytes(&bytes).is_ok());
        // The compressed data follows the metadata clusters; garble the data region.
        let len = bytes.len();
        for b in &mut bytes[len - 2000..] {
            *b = 0xa5;
        }
        let err = convert_bytes(&bytes).unwrap_err();
        assert!(
            matches!(err, Qcow2Error::Decompress { .. }),
            "{options}: {err}"
        );
    }
}

mod flips {
    use super::*;
    use proptest::prelude::*;
    use std::sync::OnceLock;

    fn images() -> &'static [Vec<u8>] {
        static IMAGES: OnceLock<Vec<Vec<u8>>> = OnceLock::new();
        IMAGES.get_or_init(|| {
            let dir = tempfile::tempdir().unwrap();
            [
                "compat=1.1,cluster_size=512",
                "compat=0.10,cluster_size=512",
                "compat=1.1,extended_l2=on,cluster_size=16k",
            ]
            .iter()
            .map(|o| small_image(dir.path(), o))
            .collect()
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

        /// Flipped bytes in the metadata-dense first 8 KiB: any outcome but a panic.
        #[test]
        fn random_flips_never_panic(
            which in 0usize..3,
            flips in prop::collection::vec((0usize..8192, any::<u8>()), 1..8),
        ) {
            let mut bytes = images()[which].clone();
            let len = bytes.len();
            for (at, value) in flips {
                bytes[at % len] ^= value | 1;
            }
            let _ = convert_bytes(&bytes);
        }
    }
}

//! Disk files from layer blobs: tar layers built here (including hostile ones), compressed with
//! gzip and zstd.

use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use banlieue_imagebuilder::layer::{
    self, DiskFile, ExtractLimits, LayerBlob, extract_container_disk, unpack_disk_artifact,
};
use banlieue_imagebuilder::{Compression, DiskFormat, Error, Refusal};

const LIMITS: ExtractLimits = ExtractLimits {
    max_disk_bytes: 64 << 20,
    max_layer_bytes: 128 << 20,
};

enum Entry<'a> {
    File(&'a str, &'a [u8]),
    Symlink(&'a str, &'a str),
}

/// A tar with entries whose names are written raw into the header, so hostile names that
/// `tar::Builder` would refuse can be built.
fn tar(entries: &[Entry<'_>]) -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    for entry in entries {
        let mut header = tar::Header::new_gnu();
        let (name, data, kind) = match entry {
            Entry::File(name, data) => (*name, *data, tar::EntryType::Regular),
            Entry::Symlink(name, target) => {
                header.set_link_name(target).unwrap();
                (*name, &b""[..], tar::EntryType::Symlink)
            }
        };
        let raw = &mut header.as_gnu_mut().unwrap().name;
        raw[..name.len()].copy_from_slice(name.as_bytes());
        header.set_entry_type(kind);
        header.set_size(data.len() as u64);
        header.set_mode(0o644);
        header.set_cksum();
        builder.append(&header, data).unwrap();
    }
    builder.into_inner().unwrap()
}

fn compress(bytes: &[u8], compression: Compression) -> Vec<u8> {
    match compression {
        Compression::None => bytes.to_vec(),
        Compression::Gzip => {
            let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            e.write_all(bytes).unwrap();
            e.finish().unwrap()
        }
        Compression::Zstd => {
            ruzstd::encoding::compress_to_vec(bytes, ruzstd::encoding::CompressionLevel::Fastest)
        }
    }
}

struct Layers {
    dir: tempfile::TempDir,
    blobs: Vec<(PathBuf, Compression)>,
    /// The directory `dir` is in, the test's own: what an escaping path would write next to
    /// `dir` is found there, whatever else the machine's temporary directory holds. Declared
    /// last, so it is removed after `dir`.
    _parent: tempfile::TempDir,
}

impl Layers {
    fn new(layers: &[(&[Entry<'_>], Compression)]) -> Self {
        let parent = tempfile::tempdir().unwrap();
        let dir = tempfile::tempdir_in(parent.path()).unwrap();
        let blobs = layers
            .iter()
            .enumerate()
            .map(|(i, (entries, compression))| {
                let path = dir.path().join(format!("blob{i}"));
                std::fs::write(&path, compress(&tar(entries), *compression)).unwrap();
                (path, *compression)
            })
            .collect();
        Self {
            dir,
            blobs,
            _parent: parent,
        }
    }

    fn work(&self) -> PathBuf {
        self.dir.path().join("work")
    }

    fn extract_with(&self, limits: &ExtractLimits) -> Result<DiskFile, Error> {
        let blobs: Vec<_> = self
            .blobs
            .iter()
            .map(|(path, compression)| LayerBlob {
                path,
                compression: *compression,
            })
            .collect();
        extract_container_disk(&blobs, &self.work(), limits)
    }

    fn extract(&self) -> Result<DiskFile, Error> {
        self.extract_with(&LIMITS)
    }

    fn files(&self) -> Vec<String> {
        let mut names: Vec<_> = std::fs::read_dir(self.dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }
}

fn refusal(result: Result<DiskFile, Error>) -> Refusal {
    match result {
        Err(Error::Refused(r)) => r,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

const QCOW2ISH: &[u8] = b"QFI\xfb not really qcow2";

#[test]
fn extracts_the_disk_file_and_nothing_else() {
    let layers = Layers::new(&[(
        &[
            Entry::File("etc/hosts", b"127.0.0.1 localhost"),
            Entry::File("./disk/disk.img", QCOW2ISH),
            Entry::File("usr/bin/tool", b"\x7fELF"),
        ],
        Compression::Gzip,
    )]);
    let disk = layers.extract().unwrap();
    assert_eq!(disk.path, layers.work());
    assert_eq!(disk.format, DiskFormat::Qcow2);
    assert_eq!(disk.size_bytes, QCOW2ISH.len() as u64);
    assert_eq!(std::fs::read(&disk.path).unwrap(), QCOW2ISH);
    assert_eq!(layers.files(), ["blob0", "work"]);
}

#[test]
fn later_layer_wins_across_compressions() {
    let layers = Layers::new(&[
        (
            &[Entry::File("disk/disk.img", b"old raw")],
            Compression::None,
        ),
        (&[Entry::File("etc/motd", b"hi")], Compression::Gzip),
        (
            &[Entry::File("disk/disk.img", b"new raw")],
            Compression::Zstd,
        ),
    ]);
    let disk = layers.extract().unwrap();
    assert_eq!(disk.format, DiskFormat::Raw);
    assert_eq!(std::fs::read(&disk.path).unwrap(), b"new raw");
}

#[test]
fn whiteouts_delete_lower_files() {
    // A whiteout of the lower file leaves the upper one.
    let layers = Layers::new(&[
        (&[Entry::File("disk/a.img", b"a")], Compression::None),
        (
            &[
                Entry::File("disk/.wh.a.img", b""),
                Entry::File("disk/b.img", b"b"),
            ],
            Compression::Gzip,
        ),
    ]);
    assert_eq!(std::fs::read(layers.extract().unwrap().path).unwrap(), b"b");

    // A whiteout of the upper file leaves the lower one, which must be extracted again.
    let layers = Layers::new(&[
        (&[Entry::File("disk/a.img", b"a")], Compression::Zstd),
        (&[Entry::File("disk/b.img", b"b")], Compression::None),
        (&[Entry::File("disk/.wh.b.img", b"")], Compression::None),
    ]);
    assert_eq!(std::fs::read(layers.extract().unwrap().path).unwrap(), b"a");

    // An opaque directory hides everything below it.
    let layers = Layers::new(&[
        (&[Entry::File("disk/a.img", b"a")], Compression::None),
        (
            &[
                Entry::File("disk/.wh..wh..opq", b""),
                Entry::File("disk/c.img", b"c"),
            ],
            Compression::None,
        ),
    ]);
    assert_eq!(std::fs::read(layers.extract().unwrap().path).unwrap(), b"c");

    // Whiting out disk/ itself leaves nothing.
    let layers = Layers::new(&[
        (&[Entry::File("disk/a.img", b"a")], Compression::None),
        (&[Entry::File(".wh.disk", b"")], Compression::None),
    ]);
    assert_eq!(refusal(layers.extract()), Refusal::NoDiskFile);
}

#[test]
fn refuses_no_disk_file_and_several() {
    let layers = Layers::new(&[(&[Entry::File("etc/hosts", b"x")], Compression::Gzip)]);
    let r = refusal(layers.extract());
    assert_eq!(r, Refusal::NoDiskFile);
    assert_eq!(r.reason(), "UnsupportedImage");

    let layers = Layers::new(&[(
        &[
            Entry::File("disk/a.img", b"a"),
            Entry::File("disk/b.qcow2", b"b"),
        ],
        Compression::None,
    )]);
    assert_eq!(
        refusal(layers.extract()),
        Refusal::SeveralDiskFiles(vec!["disk/a.img".into(), "disk/b.qcow2".into()])
    );

    let layers = Layers::new(&[
        (&[Entry::File("disk/a.img", b"a")], Compression::None),
        (&[Entry::File("disk/sub/b.img", b"b")], Compression::Zstd),
    ]);
    assert!(matches!(
        refusal(layers.extract()),
        Refusal::SeveralDiskFiles(_)
    ));
}

#[test]
fn refuses_paths_that_leave_the_root_and_writes_nothing_there() {
    for name in [
        "../x",
        "/disk/disk.img",
        "disk/../../escape",
        "./../disk/disk.img",
    ] {
        let layers = Layers::new(&[(
            &[
                Entry::File("disk/disk.img", b"fine"),
                Entry::File(name, b"evil"),
            ],
            Compression::Gzip,
        )]);
        let r = refusal(layers.extract());
        assert_eq!(r, Refusal::UnsafePath(name.to_owned()), "{name}");
        // Only the blob and the work file exist; nothing next to or above the directory.
        assert_eq!(layers.files(), ["blob0", "work"], "{name}");
        assert!(!layers.dir.path().parent().unwrap().join("x").exists());
        assert!(!layers.dir.path().parent().unwrap().join("escape").exists());
    }
}

#[test]
fn refuses_a_link_as_the_disk() {
    let layers = Layers::new(&[(
        &[Entry::Symlink("disk/disk.img", "/etc/shadow")],
        Compression::None,
    )]);
    assert_eq!(
        refusal(layers.extract()),
        Refusal::DiskNotRegularFile("disk/disk.img".into())
    );
}

#[test]
fn bounds_the_disk_and_the_layer() {
    let big = vec![1u8; 100_000];
    let layers = Layers::new(&[(&[Entry::File("disk/disk.img", &big)], Compression::Gzip)]);
    let tight_disk = ExtractLimits {
        max_disk_bytes: 50_000,
        max_layer_bytes: 1 << 20,
    };
    assert!(matches!(
        layers.extract_with(&tight_disk),
        Err(Error::TooLarge { what: "disk", .. })
    ));
    let tight_layer = ExtractLimits {
        max_disk_bytes: 1 << 20,
        max_layer_bytes: 50_000,
    };
    assert!(matches!(
        layers.extract_with(&tight_layer),
        Err(Error::TooLarge { what: "layer", .. })
    ));
}

#[test]
fn garbage_layer_is_a_decode_error() {
    let dir = tempfile::tempdir().unwrap();
    let blob = dir.path().join("blob");
    std::fs::write(&blob, b"\x1f\x8b\x08\x00 this is not gzip").unwrap();
    let err = extract_container_disk(
        &[LayerBlob {
            path: &blob,
            compression: Compression::Gzip,
        }],
        &dir.path().join("work"),
        &LIMITS,
    )
    .unwrap_err();
    assert!(matches!(err, Error::Decode { .. }), "{err}");
}

#[test]
fn extracted_disk_is_sparse() {
    let mut disk = vec![0u8; 16 << 20];
    disk[..4].copy_from_slice(b"boot");
    let last = disk.len() - 1;
    disk[last] = 1;
    let layers = Layers::new(&[(&[Entry::File("disk/disk.img", &disk)], Compression::Zstd)]);
    let out = layers.extract().unwrap();
    assert_eq!(out.size_bytes, disk.len() as u64);
    let meta = std::fs::metadata(&out.path).unwrap();
    assert!(meta.blocks() * 512 < 1 << 20, "{} blocks", meta.blocks());
    assert_eq!(std::fs::read(&out.path).unwrap(), disk);
}

fn artifact_blob(dir: &Path, content: &[u8], compression: Compression) -> PathBuf {
    let path = dir.join("blob");
    std::fs::write(&path, compress(content, compression)).unwrap();
    path
}

#[test]
fn unpacks_disk_artifacts() {
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path().join("work");
    let raw: Vec<u8> = (0..300_000u32).map(|i| (i % 253) as u8).collect();
    for compression in [Compression::Gzip, Compression::Zstd] {
        let blob = artifact_blob(dir.path(), &raw, compression);
        let disk =
            unpack_disk_artifact(&blob, DiskFormat::Raw, compression, &work, 1 << 20).unwrap();
        assert_eq!(disk.path, work);
        assert_eq!(disk.size_bytes, raw.len() as u64);
        assert_eq!(std::fs::read(&work).unwrap(), raw);
        let err =
            unpack_disk_artifact(&blob, DiskFormat::Raw, compression, &work, 1000).unwrap_err();
        assert!(matches!(err, Error::TooLarge { what: "disk", .. }), "{err}");
        let err = unpack_disk_artifact(&blob, DiskFormat::Qcow2, compression, &work, 1 << 20)
            .unwrap_err();
        assert!(
            matches!(
                err,
                Error::FormatMismatch {
                    declared: DiskFormat::Qcow2,
                    detected: DiskFormat::Raw
                }
            ),
            "{err}"
        );
    }
    // Uncompressed: the blob is the disk.
    let blob = artifact_blob(dir.path(), QCOW2ISH, Compression::None);
    let disk =
        unpack_disk_artifact(&blob, DiskFormat::Qcow2, Compression::None, &work, 1 << 20).unwrap();
    assert_eq!(disk.path, blob);
    assert_eq!(disk.format, DiskFormat::Qcow2);
    assert_eq!(layer::detect_file_format(&blob).unwrap(), DiskFormat::Qcow2);
}

#[test]
fn compressed_qcow2_artifact_converts_like_qemu_img() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src.raw");
    let file = std::fs::File::create(&src).unwrap();
    file.set_len(8 << 20).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&file, b"hello from the guest", 3 << 20).unwrap();
    drop(file);
    let qcow2 = dir.path().join("image.qcow2");
    let status = std::process::Command::new("/usr/bin/qemu-img")
        .args(["convert", "-q", "-f", "raw", "-O", "qcow2"])
        .args([&src, &qcow2])
        .status()
        .unwrap();
    assert!(status.success());
    let blob = artifact_blob(
        dir.path(),
        &std::fs::read(&qcow2).unwrap(),
        Compression::Zstd,
    );
    let work = dir.path().join("work");
    let disk =
        unpack_disk_artifact(&blob, DiskFormat::Qcow2, Compression::Zstd, &work, 1 << 30).unwrap();
    let out = dir.path().join("disk.raw");
    let mut writer = banlieue_imagebuilder::ArtifactWriter::create(&out).unwrap();
    banlieue_imagebuilder::qcow2::convert_file(
        &disk.path,
        &mut writer,
        &banlieue_imagebuilder::qcow2::Limits {
            max_virtual_size: 1 << 30,
        },
        &mut |_, _| {},
    )
    .unwrap();
    writer.finish().unwrap();
    assert_eq!(std::fs::read(&out).unwrap(), std::fs::read(&src).unwrap());
}

//! Decides, from a manifest (and a container image's config), what an image is and how its
//! disk is to be found — before any layer is downloaded.
//!
//! Two shapes become disks:
//!
//! - **Disk artifacts**: an OCI artifact with exactly one disk layer. A disk layer is one with
//!   a banlieue disk media type ([`media_type`]), or a layer of any media type annotated
//!   [`FORMAT_ANNOTATION`] (`raw` or `qcow2`), optionally with [`COMPRESSION_ANNOTATION`]
//!   (`none`, `gzip` or `zstd`; default `none`). The artifact type (the manifest's
//!   `artifactType`, or else its config media type) must be [`ARTIFACT_TYPE`], the empty
//!   config, or ORAS's default `application/vnd.unknown.artifact.v1`. Other layers (a README,
//!   a signature) are ignored.
//! - **containerDisks** (KubeVirt's convention): a container image whose layers hold exactly
//!   one regular file under `disk/`; the file is found after download by [`crate::layer`].
//!
//! Refused: image indexes and manifest lists (platform selection is the puller's job: resolve
//! a platform manifest first, e.g. with [`select_platform`]), bootable containers (bootc: they
//! need an installer to become a disk, as in CDI), other artifact types, artifacts with no or
//! several disk layers, and layers whose media type is neither a tar nor a disk.

use crate::manifest::{Descriptor, ImageConfig, Manifest, OCI_EMPTY};

/// banlieue's artifact type for a disk artifact (`oras push --artifact-type …`).
pub const ARTIFACT_TYPE: &str = "application/vnd.banlieue.disk.v1";
/// ORAS's artifact type when none is given.
pub const ORAS_UNKNOWN_ARTIFACT: &str = "application/vnd.unknown.artifact.v1";
/// Raw disk layer; `+gzip` and `+zstd` variants are compressed streams of it.
pub const MEDIA_TYPE_RAW: &str = "application/vnd.banlieue.disk.raw";
/// qcow2 disk layer; `+gzip` and `+zstd` variants are compressed streams of it.
pub const MEDIA_TYPE_QCOW2: &str = "application/vnd.banlieue.disk.qcow2";
/// Annotation that marks a layer of any media type as a disk: `raw` or `qcow2`.
pub const FORMAT_ANNOTATION: &str = "io.banlieue.disk.format";
/// Annotation that gives such a layer's compression: `none`, `gzip` or `zstd`.
pub const COMPRESSION_ANNOTATION: &str = "io.banlieue.disk.compression";

/// The condition reason for every [`Refusal`] about the image's shape.
pub const REASON_UNSUPPORTED_IMAGE: &str = "UnsupportedImage";
/// The condition reason for a manifest that contradicts itself.
pub const REASON_INVALID_MANIFEST: &str = "InvalidManifest";

/// A disk image format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DiskFormat {
    /// A raw image: the disk's bytes.
    Raw,
    /// A qcow2 image, converted to raw by [`crate::qcow2`].
    Qcow2,
}

impl DiskFormat {
    fn parse(s: &str) -> Option<Self> {
        match s {
            "raw" => Some(Self::Raw),
            "qcow2" => Some(Self::Qcow2),
            _ => None,
        }
    }
}

/// How a blob is compressed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    /// Stored as is.
    None,
    /// gzip.
    Gzip,
    /// zstd (any number of frames).
    Zstd,
}

impl Compression {
    fn parse(s: &str) -> Option<Self> {
        match s {
            "none" => Some(Self::None),
            "gzip" => Some(Self::Gzip),
            "zstd" => Some(Self::Zstd),
            _ => None,
        }
    }
}

/// The media type of a banlieue disk layer of `format` and `compression`.
pub fn media_type(format: DiskFormat, compression: Compression) -> String {
    let base = match format {
        DiskFormat::Raw => MEDIA_TYPE_RAW,
        DiskFormat::Qcow2 => MEDIA_TYPE_QCOW2,
    };
    match compression {
        Compression::None => base.to_owned(),
        Compression::Gzip => format!("{base}+gzip"),
        Compression::Zstd => format!("{base}+zstd"),
    }
}

/// The compression of a container image layer, from its media type; `None` for media types
/// that are not tar layers.
pub fn tar_layer_compression(media_type: &str) -> Option<Compression> {
    match media_type {
        "application/vnd.oci.image.layer.v1.tar"
        | "application/vnd.oci.image.layer.nondistributable.v1.tar"
        | "application/vnd.docker.image.rootfs.diff.tar" => Some(Compression::None),
        "application/vnd.oci.image.layer.v1.tar+gzip"
        | "application/vnd.oci.image.layer.nondistributable.v1.tar+gzip"
        | "application/vnd.docker.image.rootfs.diff.tar.gzip"
        | "application/vnd.docker.image.rootfs.foreign.diff.tar.gzip" => Some(Compression::Gzip),
        "application/vnd.oci.image.layer.v1.tar+zstd"
        | "application/vnd.oci.image.layer.nondistributable.v1.tar+zstd" => Some(Compression::Zstd),
        _ => None,
    }
}

/// What an image is, and where its disk comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Shape {
    /// An artifact whose one layer is the disk.
    DiskArtifact {
        /// The disk layer.
        layer: Descriptor,
        /// The disk's format once decompressed.
        format: DiskFormat,
        /// How the layer blob is compressed.
        compression: Compression,
    },
    /// A container image with the disk as a file under `disk/`.
    ContainerDisk {
        /// All layers, bottom first; each media type is a tar layer (see
        /// [`tar_layer_compression`]).
        layers: Vec<Descriptor>,
    },
}

/// Why an image is not turned into a disk. [`Refusal::reason`] is a stable condition reason;
/// the `Display` text is the message for a person.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Refusal {
    /// An image index or manifest list.
    #[error(
        "refuse an image index ({platforms}): platform selection is not supported here; \
         reference one platform's manifest by digest"
    )]
    ImageIndex {
        /// The platforms it lists, `os/arch[/variant]`, comma-separated.
        platforms: String,
    },
    /// A bootable container (bootc).
    #[error(
        "refuse a bootable container (bootc) image: it needs an installer (bootc install or \
         bootc-image-builder) to become a disk, as in CDI; publish the resulting disk as an \
         artifact or containerDisk"
    )]
    BootableContainer,
    /// An artifact type banlieue does not know.
    #[error("refuse artifact type {0:?}: not a banlieue disk (expected {ARTIFACT_TYPE:?})")]
    UnknownArtifactType(String),
    /// A manifest with neither an artifact type nor a config.
    #[error("refuse a manifest with no config and no artifact type")]
    NoConfig,
    /// An artifact without a disk layer.
    #[error(
        "refuse an artifact with no disk layer (media type {MEDIA_TYPE_RAW}[+gzip|+zstd], \
         {MEDIA_TYPE_QCOW2}[+gzip|+zstd] or annotation {FORMAT_ANNOTATION})"
    )]
    NoDiskLayer,
    /// An artifact with more than one disk layer.
    #[error("refuse an artifact with {0} disk layers: exactly one is expected")]
    SeveralDiskLayers(usize),
    /// A disk annotation with a value banlieue does not know.
    #[error("refuse annotation {key}={value:?}")]
    InvalidDiskAnnotation {
        /// The annotation key.
        key: &'static str,
        /// Its value.
        value: String,
    },
    /// A container image layer that is not a tar.
    #[error("refuse container image layer media type {0:?}")]
    UnknownLayerMediaType(String),
    /// A container image with no layers.
    #[error("refuse a container image with no layers")]
    NoLayers,
    /// A container image whose config was not supplied to [`classify`].
    #[error("cannot classify a container image without its config")]
    ConfigNotProvided,
    /// A descriptor whose digest is not `sha256:`/`sha512:` hex.
    #[error("refuse descriptor digest {0:?}")]
    InvalidDigest(String),
    /// A containerDisk with no regular file under `disk/`.
    #[error("refuse a containerDisk with no file under disk/")]
    NoDiskFile,
    /// A containerDisk with several files under `disk/`.
    #[error("refuse a containerDisk with several files under disk/: {0:?}")]
    SeveralDiskFiles(Vec<String>),
    /// The entry under `disk/` is a link or device, not a regular file.
    #[error("refuse disk entry {0:?}: not a regular file")]
    DiskNotRegularFile(String),
    /// A layer entry with an absolute path or a `..` component.
    #[error("refuse layer entry {0:?}: path leaves the image root")]
    UnsafePath(String),
}

impl Refusal {
    /// The condition reason: [`REASON_UNSUPPORTED_IMAGE`], or [`REASON_INVALID_MANIFEST`] for
    /// manifests that contradict the specification.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::InvalidDigest(_) | Self::NoConfig => REASON_INVALID_MANIFEST,
            _ => REASON_UNSUPPORTED_IMAGE,
        }
    }
}

/// Labels that mark a bootable container image.
const BOOTC_LABELS: [&str; 2] = ["containers.bootc", "ostree.bootable"];

fn is_bootable(config: &ImageConfig) -> bool {
    BOOTC_LABELS.iter().any(|key| {
        config
            .label(key)
            .is_some_and(|v| matches!(v, "1" | "true" | "yes"))
    })
}

/// The format and compression of a disk layer, `Ok(None)` for other layers.
fn disk_layer(layer: &Descriptor) -> Result<Option<(DiskFormat, Compression)>, Refusal> {
    for (format, base) in [
        (DiskFormat::Raw, MEDIA_TYPE_RAW),
        (DiskFormat::Qcow2, MEDIA_TYPE_QCOW2),
    ] {
        if let Some(rest) = layer.media_type.strip_prefix(base) {
            let compression = match rest {
                "" => Compression::None,
                "+gzip" => Compression::Gzip,
                "+zstd" => Compression::Zstd,
                _ => continue,
            };
            return Ok(Some((format, compression)));
        }
    }
    let Some(value) = layer.annotations.get(FORMAT_ANNOTATION) else {
        return Ok(None);
    };
    let format = DiskFormat::parse(value).ok_or_else(|| Refusal::InvalidDiskAnnotation {
        key: FORMAT_ANNOTATION,
        value: value.clone(),
    })?;
    let compression = match layer.annotations.get(COMPRESSION_ANNOTATION) {
        None => Compression::None,
        Some(value) => Compression::parse(value).ok_or_else(|| Refusal::InvalidDiskAnnotation {
            key: COMPRESSION_ANNOTATION,
            value: value.clone(),
        })?,
    };
    Ok(Some((format, compression)))
}

fn checked(layer: &Descriptor) -> Result<(), Refusal> {
    if layer.has_valid_digest() {
        Ok(())
    } else {
        Err(Refusal::InvalidDigest(layer.digest.clone()))
    }
}

/// Decides the shape of an image.
///
/// `config_json` is the image config blob; it is needed (and read) only when
/// [`Manifest::image_config`] is `Some`, to recognise bootable containers.
pub fn classify(manifest: &Manifest, config_json: Option<&[u8]>) -> crate::Result<Shape> {
    if manifest.is_index() {
        let platforms = manifest
            .manifests
            .iter()
            .filter_map(|m| m.platform.as_ref())
            .map(|p| match &p.variant {
                Some(v) => format!("{}/{}/{v}", p.os, p.architecture),
                None => format!("{}/{}", p.os, p.architecture),
            })
            .collect::<Vec<_>>()
            .join(", ");
        return Err(Refusal::ImageIndex { platforms }.into());
    }
    if manifest.image_config().is_some() {
        let config =
            crate::manifest::parse_image_config(config_json.ok_or(Refusal::ConfigNotProvided)?)?;
        if is_bootable(&config) {
            return Err(Refusal::BootableContainer.into());
        }
        if manifest.layers.is_empty() {
            return Err(Refusal::NoLayers.into());
        }
        for layer in &manifest.layers {
            checked(layer)?;
            if tar_layer_compression(&layer.media_type).is_none() {
                return Err(Refusal::UnknownLayerMediaType(layer.media_type.clone()).into());
            }
        }
        return Ok(Shape::ContainerDisk {
            layers: manifest.layers.clone(),
        });
    }

    // An artifact: OCI 1.1 says its type is artifactType, or else the config's media type.
    let artifact_type = manifest
        .artifact_type
        .as_deref()
        .or(manifest.config.as_ref().map(|c| c.media_type.as_str()))
        .ok_or(Refusal::NoConfig)?;
    if ![ARTIFACT_TYPE, OCI_EMPTY, ORAS_UNKNOWN_ARTIFACT].contains(&artifact_type) {
        return Err(Refusal::UnknownArtifactType(artifact_type.to_owned()).into());
    }
    let mut disks = Vec::new();
    for layer in &manifest.layers {
        if let Some((format, compression)) = disk_layer(layer)? {
            disks.push((layer, format, compression));
        }
    }
    match disks.as_slice() {
        [] => Err(Refusal::NoDiskLayer.into()),
        [(layer, format, compression)] => {
            checked(layer)?;
            Ok(Shape::DiskArtifact {
                layer: (*layer).clone(),
                format: *format,
                compression: *compression,
            })
        }
        several => Err(Refusal::SeveralDiskLayers(several.len()).into()),
    }
}

/// The descriptor of the manifest for `os`/`architecture` in an index, for a puller that
/// chooses to resolve indexes (e.g. `linux`/`amd64`). Entries with a variant match only when
/// no entry without one does.
pub fn select_platform<'a>(
    index: &'a Manifest,
    os: &str,
    architecture: &str,
) -> Option<&'a Descriptor> {
    let matching = || {
        index.manifests.iter().filter(|m| {
            m.platform
                .as_ref()
                .is_some_and(|p| p.os == os && p.architecture == architecture)
        })
    };
    matching()
        .find(|m| m.platform.as_ref().is_some_and(|p| p.variant.is_none()))
        .or_else(|| matching().next())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Error;
    use crate::manifest::{DOCKER_IMAGE_CONFIG, OCI_IMAGE_CONFIG, OCI_INDEX, Platform};
    use std::collections::BTreeMap;

    fn desc(media_type: &str, n: u8) -> Descriptor {
        Descriptor {
            media_type: media_type.to_owned(),
            digest: format!("sha256:{}", format!("{n:02x}").repeat(32)),
            size: 10,
            annotations: BTreeMap::new(),
            platform: None,
            artifact_type: None,
        }
    }

    fn artifact(artifact_type: Option<&str>, layers: Vec<Descriptor>) -> Manifest {
        Manifest {
            schema_version: Some(2),
            media_type: Some(crate::manifest::OCI_MANIFEST.to_owned()),
            artifact_type: artifact_type.map(str::to_owned),
            config: Some(desc(OCI_EMPTY, 0)),
            layers,
            manifests: Vec::new(),
            annotations: BTreeMap::new(),
        }
    }

    fn image(config_type: &str, layers: Vec<Descriptor>) -> Manifest {
        Manifest {
            config: Some(desc(config_type, 0)),
            artifact_type: None,
            ..artifact(None, layers)
        }
    }

    fn refusal(result: crate::Result<Shape>) -> Refusal {
        match result {
            Err(Error::Refused(r)) => r,
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn disk_artifact_by_media_type() {
        for (mt, format, compression) in [
            (MEDIA_TYPE_RAW, DiskFormat::Raw, Compression::None),
            (
                "application/vnd.banlieue.disk.qcow2+zstd",
                DiskFormat::Qcow2,
                Compression::Zstd,
            ),
            (
                "application/vnd.banlieue.disk.raw+gzip",
                DiskFormat::Raw,
                Compression::Gzip,
            ),
        ] {
            assert_eq!(media_type(format, compression), mt);
            let readme = desc("text/markdown", 2);
            let m = artifact(Some(ARTIFACT_TYPE), vec![readme, desc(mt, 1)]);
            assert_eq!(
                classify(&m, None).unwrap(),
                Shape::DiskArtifact {
                    layer: desc(mt, 1),
                    format,
                    compression
                }
            );
        }
    }

    #[test]
    fn disk_artifact_by_annotation_with_oras_default_type() {
        let mut layer = desc("application/octet-stream", 1);
        layer
            .annotations
            .insert(FORMAT_ANNOTATION.into(), "qcow2".into());
        layer
            .annotations
            .insert(COMPRESSION_ANNOTATION.into(), "gzip".into());
        let m = artifact(Some(ORAS_UNKNOWN_ARTIFACT), vec![layer.clone()]);
        assert_eq!(
            classify(&m, None).unwrap(),
            Shape::DiskArtifact {
                layer: layer.clone(),
                format: DiskFormat::Qcow2,
                compression: Compression::Gzip
            }
        );
        // No artifactType: the empty config's media type is the artifact type.
        layer.annotations.remove(COMPRESSION_ANNOTATION);
        let m = artifact(None, vec![layer.clone()]);
        assert!(matches!(
            classify(&m, None).unwrap(),
            Shape::DiskArtifact {
                compression: Compression::None,
                ..
            }
        ));
        layer
            .annotations
            .insert(FORMAT_ANNOTATION.into(), "vmdk".into());
        let r = refusal(classify(&artifact(None, vec![layer]), None));
        assert!(matches!(r, Refusal::InvalidDiskAnnotation { .. }), "{r}");
    }

    #[test]
    fn container_disk_with_oci_and_docker_configs() {
        let layers = vec![
            desc("application/vnd.oci.image.layer.v1.tar+gzip", 1),
            desc("application/vnd.oci.image.layer.v1.tar+zstd", 2),
            desc("application/vnd.oci.image.layer.v1.tar", 3),
        ];
        for config in [OCI_IMAGE_CONFIG, DOCKER_IMAGE_CONFIG] {
            let m = image(config, layers.clone());
            assert_eq!(
                classify(&m, Some(br#"{"config":{"Labels":{"a":"b"}}}"#)).unwrap(),
                Shape::ContainerDisk {
                    layers: layers.clone()
                }
            );
        }
    }

    #[test]
    fn refuses_bootc() {
        for config in [
            &br#"{"config":{"Labels":{"containers.bootc":"1"}}}"#[..],
            br#"{"config":{"Labels":{"ostree.bootable":"true"}}}"#,
        ] {
            let m = image(
                OCI_IMAGE_CONFIG,
                vec![desc("application/vnd.oci.image.layer.v1.tar", 1)],
            );
            let r = refusal(classify(&m, Some(config)));
            assert_eq!(r, Refusal::BootableContainer);
            assert_eq!(r.reason(), REASON_UNSUPPORTED_IMAGE);
            assert!(r.to_string().contains("installer"), "{r}");
        }
    }

    #[test]
    fn refuses_unknown_artifact_type() {
        let m = artifact(
            Some("application/vnd.cncf.helm.config.v1+json"),
            vec![desc(MEDIA_TYPE_RAW, 1)],
        );
        let r = refusal(classify(&m, None));
        assert!(matches!(r, Refusal::UnknownArtifactType(_)), "{r}");
        assert_eq!(r.reason(), REASON_UNSUPPORTED_IMAGE);
    }

    #[test]
    fn refuses_no_and_several_disk_layers() {
        let m = artifact(Some(ARTIFACT_TYPE), vec![desc("text/plain", 1)]);
        assert_eq!(refusal(classify(&m, None)), Refusal::NoDiskLayer);
        let m = artifact(
            Some(ARTIFACT_TYPE),
            vec![
                desc(MEDIA_TYPE_RAW, 1),
                desc("application/vnd.banlieue.disk.qcow2+gzip", 2),
            ],
        );
        assert_eq!(refusal(classify(&m, None)), Refusal::SeveralDiskLayers(2));
    }

    #[test]
    fn refuses_index_naming_its_platforms_and_selects_one() {
        let mut amd = desc(crate::manifest::OCI_MANIFEST, 1);
        amd.platform = Some(Platform {
            architecture: "amd64".into(),
            os: "linux".into(),
            variant: None,
        });
        let mut arm = desc(crate::manifest::OCI_MANIFEST, 2);
        arm.platform = Some(Platform {
            architecture: "arm64".into(),
            os: "linux".into(),
            variant: Some("v8".into()),
        });
        let index = Manifest {
            media_type: Some(OCI_INDEX.into()),
            config: None,
            manifests: vec![arm.clone(), amd.clone()],
            ..artifact(None, Vec::new())
        };
        let r = refusal(classify(&index, None));
        assert_eq!(
            r,
            Refusal::ImageIndex {
                platforms: "linux/arm64/v8, linux/amd64".into()
            }
        );
        assert!(r.to_string().contains("platform selection"), "{r}");
        assert_eq!(select_platform(&index, "linux", "amd64"), Some(&amd));
        assert_eq!(select_platform(&index, "linux", "arm64"), Some(&arm));
        assert_eq!(select_platform(&index, "linux", "s390x"), None);
    }

    #[test]
    fn refuses_non_tar_container_layers_and_bad_digests() {
        let m = image(
            OCI_IMAGE_CONFIG,
            vec![desc("application/vnd.oci.image.layer.v1.tar+lz4", 1)],
        );
        assert!(matches!(
            refusal(classify(&m, Some(b"{}"))),
            Refusal::UnknownLayerMediaType(_)
        ));
        let mut layer = desc(MEDIA_TYPE_RAW, 1);
        layer.digest = "sha256:../../x".into();
        let r = refusal(classify(&artifact(Some(ARTIFACT_TYPE), vec![layer]), None));
        assert_eq!(r.reason(), REASON_INVALID_MANIFEST);
        let m = image(OCI_IMAGE_CONFIG, Vec::new());
        assert_eq!(refusal(classify(&m, Some(b"{}"))), Refusal::NoLayers);
        let m = image(
            OCI_IMAGE_CONFIG,
            vec![desc("application/vnd.oci.image.layer.v1.tar", 1)],
        );
        assert_eq!(refusal(classify(&m, None)), Refusal::ConfigNotProvided);
    }
}

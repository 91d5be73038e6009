//! The blocking middle of a build: from digest-verified blobs on the artifacts volume to the
//! finished artifact, and from this crate's errors to the published reasons.

use std::path::{Path, PathBuf};

use crate::artifact::{self, ArtifactRecord, ArtifactWriter};
use crate::classify::{DiskFormat, Shape, tar_layer_compression};
use crate::error::Error;
use crate::layer::{self, ExtractLimits, LayerBlob};
use crate::manifest::Descriptor;
use crate::qcow2::{self, Limits};
use crate::reason::{BuildError, Reason};

/// The blobs a shape needs, in the order [`to_artifact`] takes their files.
pub fn layers(shape: &Shape) -> Vec<Descriptor> {
    match shape {
        Shape::DiskArtifact { layer, .. } => vec![layer.clone()],
        Shape::ContainerDisk { layers } => layers.clone(),
    }
}

/// Turns the downloaded `blobs` of `shape` into the raw artifact at `final_path` (written as
/// `<final>.tmp`, renamed when complete), using the directory `work` for a decompressed or
/// extracted disk.
/// `progress` gets (bytes done, bytes in all) of the disk. On failure the `.tmp` is removed.
pub fn to_artifact(
    shape: &Shape,
    blobs: &[PathBuf],
    work: &Path,
    final_path: &Path,
    max_disk_bytes: u64,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<ArtifactRecord, BuildError> {
    let result = convert(shape, blobs, work, final_path, max_disk_bytes, progress);
    if result.is_err() {
        let _ = std::fs::remove_file(artifact::tmp_path(final_path));
    }
    result.map_err(build_error)
}

fn convert(
    shape: &Shape,
    blobs: &[PathBuf],
    work: &Path,
    final_path: &Path,
    max_disk_bytes: u64,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<ArtifactRecord, Error> {
    let disk = match shape {
        Shape::DiskArtifact {
            format,
            compression,
            ..
        } => {
            let blob = blobs.first().ok_or(Error::TooLarge {
                what: "layer list (empty)",
                limit: 0,
            })?;
            layer::unpack_disk_artifact(
                blob,
                *format,
                *compression,
                &work.join("disk"),
                max_disk_bytes,
            )?
        }
        Shape::ContainerDisk { layers } => {
            let with_blobs: Vec<LayerBlob<'_>> = layers
                .iter()
                .zip(blobs)
                .map(|(descriptor, path)| LayerBlob {
                    path,
                    // classify accepted only tar layers, so the media type is known.
                    compression: tar_layer_compression(&descriptor.media_type)
                        .unwrap_or(crate::classify::Compression::None),
                })
                .collect();
            layer::extract_container_disk(
                &with_blobs,
                &work.join("disk"),
                &ExtractLimits {
                    max_disk_bytes,
                    max_layer_bytes: max_disk_bytes.saturating_add(1 << 30),
                },
            )?
        }
    };
    let mut writer = ArtifactWriter::create(final_path)?;
    match disk.format {
        DiskFormat::Qcow2 => {
            qcow2::convert_file(
                &disk.path,
                &mut writer,
                &Limits {
                    max_virtual_size: max_disk_bytes,
                },
                progress,
            )?;
        }
        DiskFormat::Raw => {
            artifact::copy_raw(&disk.path, &mut writer, progress)?;
        }
    }
    writer.finish()
}

/// The published reason of a conversion failure.
pub fn build_error(e: Error) -> BuildError {
    let message = error_chain(&e);
    let reason = match &e {
        Error::Refused(_) | Error::FormatMismatch { .. } | Error::Json { .. } => {
            Reason::UnsupportedImage
        }
        Error::Qcow2(q) if q.is_unsupported() => Reason::UnsupportedImage,
        Error::Qcow2(_) | Error::Decode { .. } => Reason::ConversionFailed,
        Error::TooLarge { .. } => Reason::TooLarge,
        Error::Io { source, .. } | Error::Sink(source) => {
            return BuildError::from_io(&message, clone_io(source));
        }
        _ => Reason::StorageFailed,
    };
    BuildError::new(reason, message)
}

fn clone_io(e: &std::io::Error) -> std::io::Error {
    match e.raw_os_error() {
        Some(code) => std::io::Error::from_raw_os_error(code),
        None => std::io::Error::new(e.kind(), e.to_string()),
    }
}

/// An error and its sources, for one message line.
pub fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_and_full_volumes_keep_their_reasons() {
        let refused = build_error(Error::Refused(crate::classify::Refusal::BootableContainer));
        assert_eq!(refused.reason, Reason::UnsupportedImage);
        let full = build_error(Error::Sink(std::io::Error::from_raw_os_error(
            rustix::io::Errno::NOSPC.raw_os_error(),
        )));
        assert_eq!(full.reason, Reason::NoSpace);
        let big = build_error(Error::TooLarge {
            what: "disk",
            limit: 1,
        });
        assert_eq!(big.reason, Reason::TooLarge);
    }
}

use std::io;
use std::path::{Path, PathBuf};

use crate::classify::{DiskFormat, Refusal};
use crate::hashing::HashError;
use crate::qcow2::Qcow2Error;

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong turning pulled blobs into an artifact.
///
/// [`Error::Refused`] and [`Error::Qcow2`] with an unsupported feature describe the image and
/// will not change on retry; I/O errors may.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The image has a shape banlieue does not turn into a disk.
    #[error(transparent)]
    Refused(#[from] Refusal),
    /// The qcow2 disk is unsupported or corrupt.
    #[error("convert the qcow2 disk")]
    Qcow2(#[from] Qcow2Error),
    /// A file operation failed.
    #[error("{op} {path:?}")]
    Io {
        /// What was being done, as a verb phrase.
        op: &'static str,
        /// The file it was done to.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// The artifact's digest could not be computed.
    #[error(transparent)]
    Hash(#[from] HashError),
    /// Writing the output disk failed.
    #[error("write the disk image")]
    Sink(#[source] io::Error),
    /// A compressed stream or tar archive does not decode.
    #[error("decode {what}")]
    Decode {
        /// The stream, e.g. "layer 2".
        what: String,
        /// The decoder's complaint.
        #[source]
        source: io::Error,
    },
    /// Input exceeds a bound.
    #[error("refuse a {what} larger than {limit} bytes")]
    TooLarge {
        /// What was too large.
        what: &'static str,
        /// The bound in bytes.
        limit: u64,
    },
    /// The manifest or image config is not the JSON it claims to be.
    #[error("parse the {what}")]
    Json {
        /// "manifest" or "image config".
        what: &'static str,
        /// The parser's complaint.
        #[source]
        source: serde_json::Error,
    },
    /// The disk's content does not match the format its media type or annotation declares.
    #[error("refuse a disk declared {declared:?} whose content is {detected:?}")]
    FormatMismatch {
        /// From the manifest.
        declared: DiskFormat,
        /// From the content's magic.
        detected: DiskFormat,
    },
    /// The completion record could not be encoded.
    #[error("encode the completion record")]
    RecordEncode(#[source] serde_json::Error),
    /// The completion record on disk does not parse.
    #[error("parse the completion record {path:?}")]
    RecordDecode {
        /// The record file.
        path: PathBuf,
        /// The parser's complaint.
        #[source]
        source: serde_json::Error,
    },
}

impl Error {
    pub(crate) fn io(op: &'static str, path: &Path, source: io::Error) -> Self {
        Self::Io {
            op,
            path: path.to_path_buf(),
            source,
        }
    }
}

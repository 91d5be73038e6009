use std::io;

/// Everything that can go wrong while describing, laying out or writing an image.
///
/// Input that the format cannot represent is refused with a specific variant before a single
/// byte is written; only [`Error::Io`] and the source-length variants can occur mid-write.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A path component is empty (an empty path, or `a//b`).
    #[error("refuse an empty name in path {path:?}")]
    EmptyName {
        /// The path as given.
        path: String,
    },
    /// `.` and `..` name the directory itself and its parent in every reader.
    #[error("refuse the reserved name {name:?}")]
    ReservedName {
        /// The offending component.
        name: String,
    },
    /// Joliet identifiers hold at most [`crate::MAX_JOLIET_NAME_UNITS`] UCS-2 units.
    #[error("refuse name {name:?}: {units} UCS-2 units, Joliet allows {max}")]
    NameTooLong {
        /// The offending component.
        name: String,
        /// Its length in UCS-2 units.
        units: usize,
        /// The limit.
        max: usize,
    },
    /// Joliet forbids `* / : ; ? \` and control characters in identifiers.
    #[error("refuse name {name:?}: Joliet forbids {forbidden:?}")]
    ForbiddenCharacter {
        /// The offending component.
        name: String,
        /// The first forbidden character.
        forbidden: char,
    },
    /// Joliet is UCS-2: characters beyond U+FFFF have no single code unit.
    #[error("refuse name {name:?}: {character:?} is outside UCS-2")]
    NotUcs2 {
        /// The offending component.
        name: String,
        /// The first character beyond U+FFFF.
        character: char,
    },
    /// ISO 9660 stores a file's length in 32 bits.
    #[error("refuse file {path:?}: {size} bytes, the limit is 4 GiB - 1")]
    FileTooLarge {
        /// The file's path.
        path: String,
        /// The declared size.
        size: u64,
    },
    /// ECMA-119 allows at most eight directory levels, the root included.
    #[error("refuse path {path:?}: it needs {levels} directory levels, ECMA-119 allows {max}")]
    TooDeep {
        /// The path as given.
        path: String,
        /// Directory levels the path needs, the root counting as one.
        levels: usize,
        /// The limit.
        max: usize,
    },
    /// The same path was added twice.
    #[error("refuse duplicate path {path:?}")]
    DuplicatePath {
        /// The path as given.
        path: String,
    },
    /// A path runs through something that was added as a file.
    #[error("refuse path {path:?}: {file:?} is a file, not a directory")]
    NotADirectory {
        /// The path as given.
        path: String,
        /// The prefix that is a file.
        file: String,
    },
    /// Path tables number directories in 16 bits.
    #[error("refuse {count} directories, path tables number at most {max}")]
    TooManyDirectories {
        /// Directories in the tree, the root included.
        count: usize,
        /// The limit.
        max: usize,
    },
    /// One directory holds more than [`crate::MAX_DIRECTORY_ENTRIES`] entries.
    #[error("refuse a directory of {count} entries, the limit is {max}")]
    TooManyEntries {
        /// Entries in the directory.
        count: usize,
        /// The limit.
        max: usize,
    },
    /// The volume would exceed 2^32 sectors, or the in-memory limit of [`crate::Image::to_bytes`].
    #[error("refuse an image of {bytes} bytes, the limit is {max}")]
    ImageTooLarge {
        /// The image's size in bytes.
        bytes: u64,
        /// The limit that applies.
        max: u64,
    },
    /// The volume label is empty, too long, or has a character outside the allowed set.
    #[error("refuse volume label {label:?}: {reason}")]
    InvalidVolumeLabel {
        /// The label as given.
        label: String,
        /// Which rule it breaks.
        reason: &'static str,
    },
    /// Directory records store the year as an offset from 1900 in one byte.
    #[error("refuse timestamp {unix_seconds}: ISO 9660 records years 1900 to 2155")]
    TimestampOutOfRange {
        /// Seconds since the Unix epoch.
        unix_seconds: i64,
    },
    /// A meta-data value the seed requires is empty.
    #[error("refuse an empty {field}")]
    EmptyMetaData {
        /// `instance-id` or `local-hostname`.
        field: &'static str,
    },
    /// A source ended before the size it was declared with.
    #[error("read {read} of {declared} declared bytes for {path:?} before the source ended")]
    SourceTooShort {
        /// The file's path.
        path: String,
        /// The declared size.
        declared: u64,
        /// Bytes the source yielded.
        read: u64,
    },
    /// A source yielded more than the size it was declared with.
    #[error("read more than the {declared} declared bytes for {path:?}")]
    SourceTooLong {
        /// The file's path.
        path: String,
        /// The declared size.
        declared: u64,
    },
    /// Reading a source or writing the image failed.
    #[error("read or write image data")]
    Io(#[from] io::Error),
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

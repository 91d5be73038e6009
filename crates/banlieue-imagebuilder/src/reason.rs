//! Why a build did not produce an artifact: one CamelCase reason per thing a user can act on,
//! published as `status.buildArtifact.reason` (the table is in docs/guides/image-builder.md).

/// The reasons a build stops short of Ready.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Reason {
    /// The source's `url` is not an OCI reference.
    InvalidReference,
    /// The registry has no such repository, tag or digest.
    ManifestNotFound,
    /// The registry refused the credentials, or there were none and it wants some.
    Unauthorized,
    /// The pull Secret or CA ConfigMap the source names is missing or malformed.
    CredentialsUnavailable,
    /// The registry could not be reached or failed (TLS, connection, 5xx).
    RegistryUnreachable,
    /// `plainHttp` on a registry that is not on loopback.
    PlainHttpRefused,
    /// The source's registry is not on the image builder's allow-list
    /// (`--allowed-registries`); it was not contacted.
    RegistryNotAllowed,
    /// The registry sent the builder to a token service it may not give credentials to (not
    /// HTTPS, or not on the registry's host or a host the source lists in `tokenRealmHosts`).
    TokenRealmRefused,
    /// What the reference names is not a disk banlieue can build (a bootable container, a
    /// manifest list, no disk layer, several…); the message says which.
    UnsupportedImage,
    /// A blob's bytes do not match its digest.
    DigestMismatch,
    /// A manifest, config or disk is larger than the builder accepts.
    TooLarge,
    /// The disk inside is corrupt or uses a qcow2 feature the converter refuses.
    ConversionFailed,
    /// The artifacts volume is full.
    NoSpace,
    /// Another I/O failure on the artifacts volume.
    StorageFailed,
    /// The build Job failed without saying why (its pod was killed, or could not start).
    BuildJobFailed,
}

impl Reason {
    /// The reason string, as published.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::InvalidReference => "InvalidReference",
            Reason::ManifestNotFound => "ManifestNotFound",
            Reason::Unauthorized => "Unauthorized",
            Reason::CredentialsUnavailable => "CredentialsUnavailable",
            Reason::RegistryUnreachable => "RegistryUnreachable",
            Reason::PlainHttpRefused => "PlainHttpRefused",
            Reason::RegistryNotAllowed => "RegistryNotAllowed",
            Reason::TokenRealmRefused => "TokenRealmRefused",
            Reason::UnsupportedImage => "UnsupportedImage",
            Reason::DigestMismatch => "DigestMismatch",
            Reason::TooLarge => "TooLarge",
            Reason::ConversionFailed => "ConversionFailed",
            Reason::NoSpace => "NoSpace",
            Reason::StorageFailed => "StorageFailed",
            Reason::BuildJobFailed => "BuildJobFailed",
        }
    }

    /// Whether trying again later may succeed without anyone changing anything.
    pub fn is_transient(self) -> bool {
        matches!(self, Reason::RegistryUnreachable | Reason::NoSpace)
    }
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A build failure: its reason and a message for people.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{reason}: {message}")]
pub struct BuildError {
    pub reason: Reason,
    pub message: String,
}

impl BuildError {
    pub fn new(reason: Reason, message: impl Into<String>) -> Self {
        BuildError {
            reason,
            message: message.into(),
        }
    }

    /// An I/O failure while `doing` something on the artifacts volume: a full volume is
    /// NoSpace, anything else StorageFailed.
    pub fn from_io(doing: &str, e: std::io::Error) -> Self {
        let reason = if e.raw_os_error() == Some(rustix::io::Errno::NOSPC.raw_os_error())
            || e.kind() == std::io::ErrorKind::StorageFull
        {
            Reason::NoSpace
        } else {
            Reason::StorageFailed
        };
        BuildError::new(reason, format!("{doing}: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_volume_is_no_space() {
        let full = std::io::Error::from_raw_os_error(rustix::io::Errno::NOSPC.raw_os_error());
        assert_eq!(BuildError::from_io("x", full).reason, Reason::NoSpace);
        let other = std::io::Error::from_raw_os_error(rustix::io::Errno::IO.raw_os_error());
        assert_eq!(
            BuildError::from_io("x", other).reason,
            Reason::StorageFailed
        );
    }
}

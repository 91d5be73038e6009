//! The crate's one error type. Each variant that ends in a condition carries the guide's
//! reason via [`Error::reason`].

use banlieue_api::conditions::reasons;

/// Reasons only this provider reports, beside the shared ones in
/// `banlieue_api::conditions::reasons`.
pub mod provider_reasons {
    pub use banlieue_provider_kit::reasons::USER_DATA_SECRET_REFUSED;
    /// A volume of the machine's name exists on the host, but nothing proves this machine
    /// made it: it is neither adopted nor deleted.
    pub const VOLUME_NOT_OWNED: &str = "VolumeNotOwned";
    /// The machine's image volume is neither one the Provider declared for BackingFile
    /// sources nor one its import made, or it is a machine's own disk or seed.
    pub const IMAGE_VOLUME_REFUSED: &str = "ImageVolumeRefused";
    /// The machine names a storage pool or network its Provider did not declare
    /// (`spec.capabilities.storageClasses` / `networkClasses`): refused before anything is
    /// made, whatever the host has.
    pub const TARGET_NOT_DECLARED: &str = "TargetNotDeclared";
}

/// Everything the provider can fail with.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A Secret, ConfigMap or key the Provider names is missing or unreadable.
    #[error("{0}")]
    CredentialsUnavailable(String),
    /// The endpoint is not `qemu+tls://` (ADR-0011).
    #[error("scheme \"{0}\" is not supported")]
    UnsupportedScheme(String),
    /// TLS or reachability.
    #[error("connect to {endpoint}")]
    ConnectFailed {
        endpoint: String,
        #[source]
        source: banlieue_libvirt::Error,
    },
    /// A libvirt call failed after the connection was made.
    #[error("{what}")]
    Libvirt {
        what: String,
        #[source]
        source: banlieue_libvirt::Error,
    },
    /// The Kubernetes API failed.
    #[error("{what}")]
    Kube {
        what: String,
        #[source]
        source: kube::Error,
    },
    /// A patch could not be encoded.
    #[error("{what}")]
    Encode {
        what: String,
        #[source]
        source: serde_json::Error,
    },
    /// Building the cloud-init seed failed.
    #[error("build the cloud-init seed")]
    Seed(#[source] banlieue_iso::Error),
    /// A reconcile's libvirt calls did not end within its deadline.
    #[error("{what}: not done within {after:?}")]
    Deadline {
        what: &'static str,
        after: std::time::Duration,
    },
    /// The object cannot be realised as written (a message from the guide's table).
    #[error("{message}")]
    Invalid {
        reason: &'static str,
        message: String,
    },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// The condition reason this error is reported with.
    pub fn reason(&self) -> &'static str {
        match self {
            Error::CredentialsUnavailable(_) => reasons::CREDENTIALS_UNAVAILABLE,
            Error::UnsupportedScheme(_) => reasons::UNSUPPORTED_SCHEME,
            Error::ConnectFailed { .. } => reasons::CONNECT_FAILED,
            Error::Libvirt { source, .. } if connection_lost(source) => reasons::CONNECT_FAILED,
            Error::Libvirt { .. } | Error::Seed(_) | Error::Deadline { .. } => {
                reasons::LIBVIRT_ERROR
            }
            Error::Kube { .. } | Error::Encode { .. } => reasons::PROVIDER_NOT_READY,
            Error::Invalid { reason, .. } => reason,
        }
    }

    pub(crate) fn libvirt(
        what: impl Into<String>,
    ) -> impl FnOnce(banlieue_libvirt::Error) -> Error {
        let what = what.into();
        move |source| Error::Libvirt { what, source }
    }

    pub(crate) fn kube(what: impl Into<String>) -> impl FnOnce(kube::Error) -> Error {
        let what = what.into();
        move |source| Error::Kube { what, source }
    }

    /// Whether the libvirt connection this error came from is unusable and must be replaced.
    /// A reconcile past its deadline counts: calls that hang are a connection to replace.
    pub fn is_connection_lost(&self) -> bool {
        match self {
            Error::ConnectFailed { .. } | Error::Deadline { .. } => true,
            Error::Libvirt { source, .. } => connection_lost(source),
            _ => false,
        }
    }
}

impl From<banlieue_provider_kit::credentials::Unavailable> for Error {
    fn from(e: banlieue_provider_kit::credentials::Unavailable) -> Error {
        Error::CredentialsUnavailable(e.0)
    }
}

impl From<banlieue_provider_kit::user_data::UserDataError> for Error {
    fn from(e: banlieue_provider_kit::user_data::UserDataError) -> Error {
        use banlieue_provider_kit::user_data::UserDataError;
        match e {
            UserDataError::Refused(message) => Error::Invalid {
                reason: provider_reasons::USER_DATA_SECRET_REFUSED,
                message,
            },
            UserDataError::Missing(message) => Error::CredentialsUnavailable(message),
            UserDataError::Kube { what, source } => Error::Kube { what, source },
        }
    }
}

fn connection_lost(e: &banlieue_libvirt::Error) -> bool {
    matches!(
        e,
        banlieue_libvirt::Error::ConnectionLost(_)
            | banlieue_libvirt::Error::Closed
            | banlieue_libvirt::Error::Timeout { .. }
    )
}

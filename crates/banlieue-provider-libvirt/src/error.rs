//! The crate's one error type. Each variant that ends in a condition carries the guide's
//! reason via [`Error::reason`].

use banlieue_api::conditions::reasons;
use banlieue_provider_kit::error::Core;

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

/// Everything the provider can fail with: the failures every backend shares ([`Core`]) and
/// libvirt's own.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A failure every backend shares: the Kubernetes API, the Provider's spec, a deadline.
    #[error(transparent)]
    Core(#[from] Core),
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
    /// Building the cloud-init seed failed.
    #[error("build the cloud-init seed")]
    Seed(#[source] banlieue_iso::Error),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// The condition reason this error is reported with.
    pub fn reason(&self) -> &'static str {
        match self {
            Error::Core(core) => core.reason(reasons::LIBVIRT_ERROR),
            Error::ConnectFailed { .. } => reasons::CONNECT_FAILED,
            Error::Libvirt { source, .. } if connection_lost(source) => reasons::CONNECT_FAILED,
            Error::Libvirt { .. } | Error::Seed(_) => reasons::LIBVIRT_ERROR,
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
        move |source| Error::Core(Core::Kube { what, source })
    }

    /// Whether the libvirt connection this error came from is unusable and must be replaced.
    /// A reconcile past its deadline counts: calls that hang are a connection to replace.
    pub fn is_connection_lost(&self) -> bool {
        match self {
            Error::ConnectFailed { .. } | Error::Core(Core::Deadline { .. }) => true,
            Error::Libvirt { source, .. } => connection_lost(source),
            _ => false,
        }
    }
}

impl From<banlieue_provider_kit::credentials::Unavailable> for Error {
    fn from(e: banlieue_provider_kit::credentials::Unavailable) -> Error {
        Error::Core(e.into())
    }
}

impl From<banlieue_provider_kit::user_data::UserDataError> for Error {
    fn from(e: banlieue_provider_kit::user_data::UserDataError) -> Error {
        Error::Core(e.into())
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

//! Errors of image import and of the image reconcile.

/// What can go wrong importing an image or reconciling its import Jobs.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("read {what} from the Kubernetes API")]
    Kube {
        what: String,
        #[source]
        source: kube::Error,
    },
    /// Reading the Provider's TLS material or connecting to its host (the guide's
    /// CredentialsUnavailable, UnsupportedScheme, ConnectFailed).
    #[error(transparent)]
    Connection(#[from] crate::Error),
    #[error("provider {0} has no failure domain yet (the operator has not reached its host)")]
    NoFailureDomain(String),
    #[error("vmimage {image} has no source for provider class {class}")]
    NoSourceForClass { image: String, class: String },
    #[error("libvirt: {what}")]
    Libvirt {
        what: String,
        #[source]
        source: banlieue_libvirt::Error,
    },
    #[error("storage pool {0} does not exist on the host")]
    StoragePoolNotFound(String),
    #[error("read the source {path}")]
    Source {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// The Job was made for another volume or revision than the VMImage now says.
    #[error("the import was made for {what} {expected} but vmimage {image} now says {found}")]
    Mismatch {
        image: String,
        what: &'static str,
        expected: String,
        found: String,
    },
    /// The source is not a regular file inside the artifacts directory.
    #[error("source {path} refused: {why}")]
    SourceRefused { path: String, why: String },
    /// A complete volume of this name holds other bytes than the source.
    #[error("{0}; a new artifact needs a new revision (spec.revision), so it gets a new volume")]
    CompleteVolumeDiffers(String),
    #[error("uploaded volume {volume} does not match the source: {detail}")]
    Verification { volume: String, detail: String },
    #[error("status of vmimage {0} kept changing under concurrent writers")]
    StatusConflict(String),
}

impl Error {
    pub(crate) fn kube(what: impl Into<String>, source: kube::Error) -> Self {
        Error::Kube {
            what: what.into(),
            source,
        }
    }

    pub(crate) fn libvirt(what: impl Into<String>, source: banlieue_libvirt::Error) -> Self {
        Error::Libvirt {
            what: what.into(),
            source,
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The HTTP status of a Kubernetes API error, if the server answered one.
pub(crate) fn api_status(error: &kube::Error) -> Option<u16> {
    match error {
        kube::Error::Api(status) => Some(status.code),
        _ => None,
    }
}

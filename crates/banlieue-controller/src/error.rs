//! The controller's one error type.

/// Errors of a reconcile or of the controller's start-up.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("call the API server")]
    Kube(#[from] kube::Error),
    #[error("encode a patch")]
    Encode(#[from] serde_json::Error),
    #[error("{kind} {name} has no namespace")]
    NoNamespace { kind: &'static str, name: String },
    #[error("{kind} has no name")]
    NoName { kind: &'static str },
    #[error("{kind} {name} has no uid")]
    NoUid { kind: &'static str, name: String },
    #[error("fill the caches")]
    CachesNotReady,
    #[error("the reconcile did not finish within {after:?} and was cancelled")]
    TimedOut { after: std::time::Duration },
    #[error("the cache of {kind} objects stopped")]
    CacheStopped { kind: &'static str },
    #[error("machine {name} is a {kind}, a kind this controller has no builder for")]
    UnknownMachineKind { kind: String, name: String },
    #[error(transparent)]
    Contract(#[from] crate::machine_builder::ContractError),
}

impl From<banlieue_runtime::reconcile::PatchError> for Error {
    /// The shared plumbing's errors are the controller's own two: a call or an encoding.
    fn from(error: banlieue_runtime::reconcile::PatchError) -> Self {
        match error {
            banlieue_runtime::reconcile::PatchError::Kube(e) => Error::Kube(e),
            banlieue_runtime::reconcile::PatchError::Encode(e) => Error::Encode(e),
        }
    }
}

/// `Result` with the controller's error.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// A short, stable label for the reconcile-errors metric.
    pub fn metric_reason(&self) -> &'static str {
        match self {
            Error::Kube(kube::Error::Api(status)) if status.is_conflict() => "Conflict",
            Error::Kube(kube::Error::Api(status)) if status.is_forbidden() => "Forbidden",
            Error::Kube(kube::Error::Api(status)) if status.is_not_found() => "NotFound",
            Error::Kube(kube::Error::Api(_)) => "ApiError",
            Error::Kube(_) => "ApiUnreachable",
            Error::Encode(_) => "Encode",
            Error::NoNamespace { .. }
            | Error::NoName { .. }
            | Error::NoUid { .. }
            | Error::UnknownMachineKind { .. }
            | Error::Contract(_) => "InvalidObject",
            Error::CachesNotReady => "CachesNotReady",
            Error::TimedOut { .. } => "Timeout",
            Error::CacheStopped { .. } => "CacheStopped",
        }
    }
}

/// Whether a kube error is the API server's 409 Conflict.
pub(crate) fn is_conflict(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(status) if status.is_conflict())
}

/// Whether a kube error is the API server's 404 Not Found.
pub(crate) fn is_not_found(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(status) if status.is_not_found())
}

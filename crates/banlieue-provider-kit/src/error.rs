//! The failures every backend shares, with the condition reasons they are reported with. A
//! backend's error holds a [`Core`] beside its own variants (its client's failures, its
//! timeouts), so the machine reconcile can build the shared ones itself
//! ([`crate::machine::Backend::patch_failed`], [`crate::machine::Backend::deadline_exceeded`])
//! and every backend reports them with the same reason and message.

use std::time::Duration;

use banlieue_api::conditions::reasons;
use banlieue_runtime::reconcile::PatchError;

use crate::credentials::Unavailable;
use crate::user_data::UserDataError;

/// A failure that is no backend's own: the Kubernetes API, the Provider's spec, a deadline.
#[derive(Debug, thiserror::Error)]
pub enum Core {
    /// A Secret, ConfigMap or key the Provider names is missing or unusable.
    #[error("{0}")]
    CredentialsUnavailable(String),
    /// The endpoint's scheme is not the one the backend speaks.
    #[error("scheme \"{0}\" is not supported")]
    UnsupportedScheme(String),
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
    /// A reconcile's backend calls did not end within its deadline.
    #[error("{what}: not done within {after:?}")]
    Deadline { what: &'static str, after: Duration },
    /// The object cannot be realised as written (a message from the guide's table).
    #[error("{message}")]
    Invalid {
        reason: &'static str,
        message: String,
    },
}

impl Core {
    /// The condition reason this failure is reported with. A deadline is the backend's own
    /// failure (`LibvirtError`, `VSphereError`): its calls hung, so `backend_failed` names it.
    pub fn reason(&self, backend_failed: &'static str) -> &'static str {
        match self {
            Core::CredentialsUnavailable(_) => reasons::CREDENTIALS_UNAVAILABLE,
            Core::UnsupportedScheme(_) => reasons::UNSUPPORTED_SCHEME,
            Core::Kube { .. } | Core::Encode { .. } => reasons::PROVIDER_NOT_READY,
            Core::Deadline { .. } => backend_failed,
            Core::Invalid { reason, .. } => reason,
        }
    }

    /// A write to the API server, `what`, that failed.
    pub fn patch_failed(what: String, error: PatchError) -> Core {
        match error {
            PatchError::Kube(source) => Core::Kube { what, source },
            PatchError::Encode(source) => Core::Encode { what, source },
        }
    }
}

impl From<Unavailable> for Core {
    fn from(e: Unavailable) -> Core {
        Core::CredentialsUnavailable(e.0)
    }
}

impl From<UserDataError> for Core {
    fn from(e: UserDataError) -> Core {
        match e {
            UserDataError::Refused(message) => Core::Invalid {
                reason: crate::reasons::USER_DATA_SECRET_REFUSED,
                message,
            },
            UserDataError::Missing(message) => Core::CredentialsUnavailable(message),
            UserDataError::Kube { what, source } => Core::Kube { what, source },
        }
    }
}

//! What the operator can fail with. Each error ends in the Provider's Ready condition with
//! [`Error::reason`], or in a retry when the API server failed.

use banlieue_api::conditions::reasons;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The Kubernetes API failed.
    #[error("{what}")]
    Kube {
        what: String,
        #[source]
        source: kube::Error,
    },
    /// The Provider cannot be served as its class is (a message from the guide's table).
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
            Error::Kube { .. } => reasons::PROVIDER_NOT_READY,
            Error::Invalid { reason, .. } => reason,
        }
    }

    pub(crate) fn kube(what: impl Into<String>) -> impl FnOnce(kube::Error) -> Error {
        let what = what.into();
        move |source| Error::Kube { what, source }
    }
}

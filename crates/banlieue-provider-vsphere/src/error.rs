//! The crate's one error type. Each variant carries the condition reason it is reported with
//! ([`Error::reason`]); the condition message is the error with its source chain.

use std::time::Duration;

use banlieue_api::conditions::reasons;

/// Everything the vSphere provider can fail with.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The credentials Secret, the CA source or one of their keys is missing or unusable.
    #[error("{0}")]
    CredentialsUnavailable(String),
    /// The endpoint is not an `https://` URL.
    #[error("scheme \"{0}\" is not supported")]
    UnsupportedScheme(String),
    /// TLS, reachability or the login itself.
    #[error("connect to {endpoint}")]
    ConnectFailed {
        endpoint: String,
        #[source]
        source: banlieue_vsphere::Error,
    },
    /// Connecting took longer than its deadline.
    #[error("connect to {endpoint}: no answer within {after:?}")]
    ConnectTimeout { endpoint: String, after: Duration },
    /// A vSphere call or task failed once connected.
    #[error("{what}")]
    VSphere {
        what: String,
        #[source]
        source: banlieue_vsphere::Error,
    },
    /// A vSphere task did not end within its deadline.
    #[error("{what}: the task did not end within {after:?}")]
    TaskTimeout { what: String, after: Duration },
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
    /// A reconcile's vSphere calls did not end within its deadline.
    #[error("{what}: not done within {after:?}")]
    Deadline { what: &'static str, after: Duration },
    /// The object cannot be realised as written.
    #[error("{message}")]
    Invalid {
        reason: &'static str,
        message: String,
    },
}

/// The crate's result.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// The condition reason this error is reported with.
    pub fn reason(&self) -> &'static str {
        match self {
            Error::CredentialsUnavailable(_) => reasons::CREDENTIALS_UNAVAILABLE,
            Error::UnsupportedScheme(_) => reasons::UNSUPPORTED_SCHEME,
            Error::ConnectFailed { .. } | Error::ConnectTimeout { .. } => reasons::CONNECT_FAILED,
            Error::VSphere { source, .. } if session_lost(source) => reasons::CONNECT_FAILED,
            Error::VSphere { .. } | Error::TaskTimeout { .. } | Error::Deadline { .. } => {
                banlieue_api::vsphere::reasons::VSPHERE_ERROR
            }
            Error::Kube { .. } | Error::Encode { .. } => reasons::PROVIDER_NOT_READY,
            Error::Invalid { reason, .. } => reason,
        }
    }

    /// Whether the session this error came from is unusable and must be replaced.
    /// A reconcile past its deadline counts: calls that hang are a session to replace.
    pub fn is_session_lost(&self) -> bool {
        match self {
            Error::ConnectFailed { .. } | Error::ConnectTimeout { .. } | Error::Deadline { .. } => {
                true
            }
            Error::VSphere { source, .. } => session_lost(source),
            _ => false,
        }
    }

    pub(crate) fn vsphere(
        what: impl Into<String>,
    ) -> impl FnOnce(banlieue_vsphere::Error) -> Error {
        let what = what.into();
        move |source| Error::VSphere { what, source }
    }

    pub(crate) fn kube(what: impl Into<String>) -> impl FnOnce(kube::Error) -> Error {
        let what = what.into();
        move |source| Error::Kube { what, source }
    }

    /// The vim25 fault behind this error, if a server reported one.
    pub fn fault(&self) -> Option<&banlieue_vsphere::Fault> {
        match self {
            Error::ConnectFailed { source, .. } | Error::VSphere { source, .. } => source.fault(),
            _ => None,
        }
    }
}

/// A transport failure or a lost login: the session must be opened again.
fn session_lost(e: &banlieue_vsphere::Error) -> bool {
    matches!(e, banlieue_vsphere::Error::Http { .. })
        || e.fault()
            .is_some_and(|f| f.is_not_authenticated() || f.kind == "InvalidLogin")
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
                reason: banlieue_provider_kit::reasons::USER_DATA_SECRET_REFUSED,
                message,
            },
            UserDataError::Missing(message) => Error::CredentialsUnavailable(message),
            UserDataError::Kube { what, source } => Error::Kube { what, source },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_follow_the_guide() {
        assert_eq!(
            Error::CredentialsUnavailable("x".into()).reason(),
            "CredentialsUnavailable"
        );
        assert_eq!(
            Error::UnsupportedScheme("http".into()).reason(),
            "UnsupportedScheme"
        );
        let fault = banlieue_vsphere::Error::Fault {
            method: "Login",
            fault: banlieue_vsphere::Fault {
                kind: "InvalidLogin".into(),
                message: "bad".into(),
            },
        };
        let e = Error::vsphere("read the datacenters")(fault);
        assert_eq!(e.reason(), "ConnectFailed");
        assert!(e.is_session_lost());
        let e = Error::Invalid {
            reason: banlieue_api::vsphere::reasons::VM_NAME_TAKEN,
            message: "taken".into(),
        };
        assert_eq!(e.reason(), "VMNameTaken");
        assert!(!e.is_session_lost());
    }
}

//! The crate's one error type. Each variant carries the condition reason it is reported with
//! ([`Error::reason`]); the condition message is the error with its source chain.

use std::time::Duration;

use banlieue_api::conditions::reasons;
use banlieue_provider_kit::error::Core;

/// Everything the vSphere provider can fail with: the failures every backend shares
/// ([`Core`]) and vSphere's own.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A failure every backend shares: the Kubernetes API, the Provider's spec, a deadline.
    #[error(transparent)]
    Core(#[from] Core),
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
}

/// The crate's result.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// The condition reason this error is reported with.
    pub fn reason(&self) -> &'static str {
        match self {
            Error::Core(core) => core.reason(banlieue_api::vsphere::reasons::VSPHERE_ERROR),
            Error::ConnectFailed { .. } | Error::ConnectTimeout { .. } => reasons::CONNECT_FAILED,
            Error::VSphere { source, .. } if session_lost(source) => reasons::CONNECT_FAILED,
            Error::VSphere { .. } | Error::TaskTimeout { .. } => {
                banlieue_api::vsphere::reasons::VSPHERE_ERROR
            }
        }
    }

    /// Whether the session this error came from is unusable and must be replaced.
    /// A reconcile past its deadline counts: calls that hang are a session to replace.
    pub fn is_session_lost(&self) -> bool {
        match self {
            Error::ConnectFailed { .. }
            | Error::ConnectTimeout { .. }
            | Error::Core(Core::Deadline { .. }) => true,
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
        move |source| Error::Core(Core::Kube { what, source })
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
        Error::Core(e.into())
    }
}

impl From<banlieue_provider_kit::user_data::UserDataError> for Error {
    fn from(e: banlieue_provider_kit::user_data::UserDataError) -> Error {
        Error::Core(e.into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_follow_the_guide() {
        assert_eq!(
            Error::Core(Core::CredentialsUnavailable("x".into())).reason(),
            "CredentialsUnavailable"
        );
        assert_eq!(
            Error::Core(Core::UnsupportedScheme("http".into())).reason(),
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
        let e = Error::Core(Core::Invalid {
            reason: banlieue_api::vsphere::reasons::VM_NAME_TAKEN,
            message: "taken".into(),
        });
        assert_eq!(e.reason(), "VMNameTaken");
        assert!(!e.is_session_lost());
    }
}

//! The crate's errors, and the typed SOAP fault a server (or a failed task) reports.

use crate::moref::ManagedObjectRef;

/// A vim25 fault: what the server refused and why, from a SOAP fault's detail or a task's
/// `info.error`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fault {
    /// The fault's type: `InvalidLogin`, `NotAuthenticated`, `InvalidPowerState`,
    /// `ManagedObjectNotFound`, …; the SOAP `faultcode` when the server sent no detail.
    pub kind: String,
    /// The server's message (`faultstring`, or a task error's `localizedMessage`).
    pub message: String,
}

impl Fault {
    /// Whether the session is gone (expired, logged out, never logged in).
    pub fn is_not_authenticated(&self) -> bool {
        self.kind == "NotAuthenticated"
    }
}

impl std::fmt::Display for Fault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.message.is_empty() {
            write!(f, "vSphere fault {}", self.kind)
        } else {
            write!(f, "vSphere fault {}: {}", self.kind, self.message)
        }
    }
}

impl std::error::Error for Fault {}

/// What can go wrong talking to vSphere.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The server answered a call with a SOAP fault.
    #[error("call {method}")]
    Fault {
        method: &'static str,
        #[source]
        fault: Fault,
    },
    /// A task ran and ended in `error`.
    #[error("task {task} failed")]
    Task {
        task: ManagedObjectRef,
        #[source]
        fault: Fault,
    },
    #[error("read the CA bundle: {0}")]
    CaBundle(String),
    #[error("set up the HTTPS client")]
    HttpClient(#[source] reqwest::Error),
    #[error("send {method} to {url}")]
    Http {
        method: &'static str,
        url: String,
        #[source]
        source: reqwest::Error,
    },
    #[error("{method}: HTTP {status} without a SOAP answer: {body}")]
    Status {
        method: &'static str,
        status: u16,
        body: String,
    },
    #[error("{method}: the answer is larger than {limit} bytes")]
    TooLarge { method: &'static str, limit: usize },
    #[error("malformed {what}: {reason}")]
    Malformed { what: String, reason: String },
    #[error("{count} virtual machines are named {name:?}")]
    Ambiguous { name: String, count: usize },
}

impl Error {
    /// The vim25 fault behind this error, whether a call or a task reported it.
    pub fn fault(&self) -> Option<&Fault> {
        match self {
            Error::Fault { fault, .. } | Error::Task { fault, .. } => Some(fault),
            _ => None,
        }
    }

    pub(crate) fn malformed(what: impl Into<String>, reason: impl Into<String>) -> Error {
        Error::Malformed {
            what: what.into(),
            reason: reason.into(),
        }
    }
}

/// The crate's result.
pub type Result<T, E = Error> = std::result::Result<T, E>;

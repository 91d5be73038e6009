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
        /// The vim25 method called.
        method: &'static str,
        /// What the server said.
        #[source]
        fault: Fault,
    },
    /// A task ran and ended in `error`.
    #[error("task {task} failed")]
    Task {
        /// The task.
        task: ManagedObjectRef,
        /// Its `info.error`.
        #[source]
        fault: Fault,
    },
    /// The CA bundle holds no usable certificate.
    #[error("read the CA bundle: {0}")]
    CaBundle(String),
    /// The HTTPS client could not be built.
    #[error("set up the HTTPS client")]
    HttpClient(#[source] reqwest::Error),
    /// The request did not get an answer (connection, TLS, timeout).
    #[error("send {method} to {url}")]
    Http {
        /// The vim25 method called.
        method: &'static str,
        /// The SDK URL.
        url: String,
        /// Why.
        #[source]
        source: reqwest::Error,
    },
    /// The server answered with an HTTP error and no SOAP envelope.
    #[error("{method}: HTTP {status} without a SOAP answer: {body}")]
    Status {
        /// The vim25 method called.
        method: &'static str,
        /// The HTTP status.
        status: u16,
        /// The start of the body.
        body: String,
    },
    /// The answer exceeded [`BODY_LIMIT`](crate::BODY_LIMIT).
    #[error("{method}: the answer is larger than {limit} bytes")]
    TooLarge {
        /// The vim25 method called.
        method: &'static str,
        /// The limit.
        limit: usize,
    },
    /// The answer is not what vim25 defines.
    #[error("malformed {what}: {reason}")]
    Malformed {
        /// What was being read.
        what: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A lookup by name found several VMs.
    #[error("{count} virtual machines are named {name:?}")]
    Ambiguous {
        /// The name looked up.
        name: String,
        /// How many VMs have it.
        count: usize,
    },
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

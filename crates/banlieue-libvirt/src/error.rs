//! The client's errors, and libvirt's own error (`remote_error`) as a typed value.

use std::fmt;

use crate::packet::PacketError;
use crate::proto::net::VirNetMessageError;

/// libvirt's error number (`virErrorNumber` in include/libvirt/virterror.h). A newtype, so
/// numbers this version does not name are kept.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ErrorCode(pub i32);

macro_rules! error_codes {
    ($($name:ident = $value:literal,)*) => {
        impl ErrorCode {
            $(pub const $name: ErrorCode = ErrorCode($value);)*

            /// libvirt's name for the code, without the `VIR_ERR_` prefix.
            pub fn name(self) -> Option<&'static str> {
                match self.0 {
                    $($value => Some(stringify!($name)),)*
                    _ => None,
                }
            }
        }
    };
}

// Values from include/libvirt/virterror.h (libvirt 11.3.0), enum virErrorNumber.
error_codes! {
    OK = 0,
    INTERNAL_ERROR = 1,
    NO_MEMORY = 2,
    NO_SUPPORT = 3,
    NO_CONNECT = 5,
    INVALID_CONN = 6,
    INVALID_DOMAIN = 7,
    INVALID_ARG = 8,
    OPERATION_FAILED = 9,
    XML_ERROR = 27,
    DOM_EXIST = 28,
    OPERATION_DENIED = 29,
    OPEN_FAILED = 30,
    READ_FAILED = 31,
    PARSE_FAILED = 32,
    WRITE_FAILED = 34,
    XML_DETAIL = 35,
    INVALID_NETWORK = 36,
    NETWORK_EXIST = 37,
    SYSTEM_ERROR = 38,
    RPC = 39,
    NO_DOMAIN = 42,
    NO_NETWORK = 43,
    AUTH_FAILED = 45,
    INVALID_STORAGE_POOL = 46,
    INVALID_STORAGE_VOL = 47,
    NO_STORAGE_POOL = 49,
    NO_STORAGE_VOL = 50,
    NO_NODE_DEVICE = 53,
    OPERATION_INVALID = 55,
    NO_INTERFACE = 57,
    NO_NWFILTER = 62,
    NO_SECRET = 66,
    CONFIG_UNSUPPORTED = 67,
    OPERATION_TIMEOUT = 68,
    NO_DOMAIN_SNAPSHOT = 72,
    STORAGE_POOL_BUILT = 76,
    OPERATION_ABORTED = 78,
    AGENT_UNRESPONSIVE = 86,
    STORAGE_VOL_EXIST = 90,
    NO_SERVER = 95,
    NO_CLIENT = 96,
    DEVICE_MISSING = 99,
    NO_NWFILTER_BINDING = 101,
    NO_DOMAIN_CHECKPOINT = 103,
    NO_DOMAIN_BACKUP = 104,
    NO_NETWORK_PORT = 107,
    NO_HOSTNAME = 108,
}

impl fmt::Debug for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(n) => write!(f, "VIR_ERR_{n}"),
            None => write!(f, "ErrorCode({})", self.0),
        }
    }
}

/// An error libvirtd reported, with every field of its `remote_error`.
#[derive(Debug, Clone, PartialEq)]
pub struct RemoteError {
    pub code: ErrorCode,
    /// `virErrorDomain`: which part of libvirt raised it.
    pub domain: i32,
    pub message: Option<String>,
    /// `virErrorLevel`: 1 warning, 2 error.
    pub level: i32,
    /// The domain the error is about, by name.
    pub dom: Option<String>,
    pub str1: Option<String>,
    pub str2: Option<String>,
    pub str3: Option<String>,
    pub int1: i32,
    pub int2: i32,
    /// The network the error is about, by name.
    pub net: Option<String>,
}

impl RemoteError {
    /// The object the call named does not exist (domain, network, pool, volume, secret, …).
    pub fn is_not_found(&self) -> bool {
        matches!(
            self.code,
            ErrorCode::NO_DOMAIN
                | ErrorCode::NO_NETWORK
                | ErrorCode::NO_STORAGE_POOL
                | ErrorCode::NO_STORAGE_VOL
                | ErrorCode::NO_NODE_DEVICE
                | ErrorCode::NO_INTERFACE
                | ErrorCode::NO_NWFILTER
                | ErrorCode::NO_SECRET
                | ErrorCode::NO_DOMAIN_SNAPSHOT
                | ErrorCode::NO_DOMAIN_CHECKPOINT
                | ErrorCode::NO_DOMAIN_BACKUP
                | ErrorCode::NO_NETWORK_PORT
                | ErrorCode::NO_NWFILTER_BINDING
        )
    }

    /// The call tried to create something that is already there.
    pub fn is_already_exists(&self) -> bool {
        matches!(
            self.code,
            ErrorCode::DOM_EXIST | ErrorCode::NETWORK_EXIST | ErrorCode::STORAGE_VOL_EXIST
        )
    }
}

impl From<VirNetMessageError> for RemoteError {
    fn from(e: VirNetMessageError) -> Self {
        RemoteError {
            code: ErrorCode(e.code),
            domain: e.domain,
            message: e.message,
            level: e.level,
            dom: e.dom.map(|d| d.name),
            str1: e.str1,
            str2: e.str2,
            str3: e.str3,
            int1: e.int1,
            int2: e.int2,
            net: e.net.map(|n| n.name),
        }
    }
}

impl fmt::Display for RemoteError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let message = self.message.as_deref().unwrap_or("(no message)");
        match self.code.name() {
            Some(n) => write!(f, "{message} (VIR_ERR_{n})"),
            None => write!(f, "{message} (code {})", self.code.0),
        }
    }
}

impl std::error::Error for RemoteError {}

/// Everything the client can fail with.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("scheme \"{0}\" is not supported")]
    UnsupportedScheme(String),
    #[error("invalid libvirt URI {uri:?}: {reason}")]
    InvalidUri { uri: String, reason: &'static str },
    #[error("read TLS material: {0}")]
    TlsMaterial(String),
    #[error("connect to {address}")]
    Connect {
        address: String,
        #[source]
        source: std::io::Error,
    },
    #[error("connect to {address}: no TLS session within {after:?}")]
    ConnectTimeout {
        address: String,
        after: std::time::Duration,
    },
    #[error("TLS handshake with {host}")]
    Tls {
        host: String,
        #[source]
        source: std::io::Error,
    },
    /// The server's certificate is valid and trusted but carries no subject alternative name
    /// for the host the URI names (`kind` is "IP address" or "DNS name"). rustls, like
    /// libvirt, matches an IP host only against IP-address SANs, never against DNS names or
    /// the common name.
    #[error(
        "the server certificate has no subject alternative name for {kind} {host} (it names: {presented}); reissue it with that SAN, or connect by a name it carries"
    )]
    ServerNameNotInCertificate {
        host: String,
        kind: &'static str,
        presented: String,
    },
    #[error(
        "the server refused the client certificate (it ended the connection after the TLS handshake: {detail})"
    )]
    CertificateRefused { detail: String },
    #[error("the server sent {0:#04x} instead of its TLS confirmation byte")]
    BadConfirmation(u8),
    #[error(
        "the server requires authentication {0:?}; only auth \"none\" (a TLS client certificate) is supported"
    )]
    AuthUnsupported(Vec<i32>),
    #[error("libvirt: {0}")]
    Remote(Box<RemoteError>),
    #[error("connection lost: {0}")]
    ConnectionLost(String),
    #[error("the call {procedure} timed out after {after:?}")]
    Timeout {
        procedure: &'static str,
        after: std::time::Duration,
    },
    #[error("the connection is closed")]
    Closed,
    #[error("protocol violation: {0}")]
    Protocol(String),
    #[error(transparent)]
    Packet(#[from] PacketError),
    #[error("encode call arguments")]
    Encode(#[source] crate::xdr::Error),
    #[error("stream I/O")]
    StreamIo(#[source] std::io::Error),
    #[error("reconnect gave up after {attempts} attempts")]
    ReconnectGaveUp {
        attempts: u32,
        #[source]
        last: Box<Error>,
    },
}

impl Error {
    /// A libvirt "not found" error.
    pub fn is_not_found(&self) -> bool {
        matches!(self, Error::Remote(e) if e.is_not_found())
    }

    /// A libvirt "already exists" error.
    pub fn is_already_exists(&self) -> bool {
        matches!(self, Error::Remote(e) if e.is_already_exists())
    }

    /// A failure that trying again later may cure: the peer is unreachable, restarting or
    /// went away. Bad input (URI, TLS material, a certificate either side refuses,
    /// authentication) is not transient.
    pub fn is_transient(&self) -> bool {
        match self {
            // rustls reports a refused certificate or name as InvalidData; anything else
            // during the handshake is the connection failing.
            Error::Tls { source, .. } => source.kind() != std::io::ErrorKind::InvalidData,
            Error::Connect { .. }
            | Error::ConnectTimeout { .. }
            | Error::ConnectionLost(_)
            | Error::Closed
            | Error::Timeout { .. } => true,
            Error::Remote(e) => matches!(e.code, ErrorCode::NO_CONNECT | ErrorCode::RPC),
            _ => false,
        }
    }

    /// The libvirt error, when the server reported one.
    pub fn remote(&self) -> Option<&RemoteError> {
        match self {
            Error::Remote(e) => Some(e),
            _ => None,
        }
    }
}

impl From<RemoteError> for Error {
    fn from(e: RemoteError) -> Self {
        Error::Remote(Box::new(e))
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

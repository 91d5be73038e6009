//! The client's errors, and libvirt's own error (`remote_error`) as a typed value.

use std::fmt;

use crate::packet::PacketError;
use crate::proto::net::VirNetMessageError;

open_enum! {
    /// libvirt's error number (`virErrorNumber` in include/libvirt/virterror.h, libvirt
    /// 11.3.0); `name()` is libvirt's name without the `VIR_ERR_` prefix. Numbers this
    /// version does not name are kept as `Unknown`.
    pub enum ErrorCode {
        /// `VIR_ERR_OK`.
        Ok = 0 => "OK",
        /// `VIR_ERR_INTERNAL_ERROR`.
        InternalError = 1 => "INTERNAL_ERROR",
        /// `VIR_ERR_NO_MEMORY`.
        NoMemory = 2 => "NO_MEMORY",
        /// `VIR_ERR_NO_SUPPORT`.
        NoSupport = 3 => "NO_SUPPORT",
        /// `VIR_ERR_NO_CONNECT`.
        NoConnect = 5 => "NO_CONNECT",
        /// `VIR_ERR_INVALID_CONN`.
        InvalidConn = 6 => "INVALID_CONN",
        /// `VIR_ERR_INVALID_DOMAIN`.
        InvalidDomain = 7 => "INVALID_DOMAIN",
        /// `VIR_ERR_INVALID_ARG`.
        InvalidArg = 8 => "INVALID_ARG",
        /// `VIR_ERR_OPERATION_FAILED`.
        OperationFailed = 9 => "OPERATION_FAILED",
        /// `VIR_ERR_XML_ERROR`.
        XmlError = 27 => "XML_ERROR",
        /// `VIR_ERR_DOM_EXIST`.
        DomExist = 28 => "DOM_EXIST",
        /// `VIR_ERR_OPERATION_DENIED`.
        OperationDenied = 29 => "OPERATION_DENIED",
        /// `VIR_ERR_OPEN_FAILED`.
        OpenFailed = 30 => "OPEN_FAILED",
        /// `VIR_ERR_READ_FAILED`.
        ReadFailed = 31 => "READ_FAILED",
        /// `VIR_ERR_PARSE_FAILED`.
        ParseFailed = 32 => "PARSE_FAILED",
        /// `VIR_ERR_WRITE_FAILED`.
        WriteFailed = 34 => "WRITE_FAILED",
        /// `VIR_ERR_XML_DETAIL`.
        XmlDetail = 35 => "XML_DETAIL",
        /// `VIR_ERR_INVALID_NETWORK`.
        InvalidNetwork = 36 => "INVALID_NETWORK",
        /// `VIR_ERR_NETWORK_EXIST`.
        NetworkExist = 37 => "NETWORK_EXIST",
        /// `VIR_ERR_SYSTEM_ERROR`.
        SystemError = 38 => "SYSTEM_ERROR",
        /// `VIR_ERR_RPC`.
        Rpc = 39 => "RPC",
        /// `VIR_ERR_NO_DOMAIN`.
        NoDomain = 42 => "NO_DOMAIN",
        /// `VIR_ERR_NO_NETWORK`.
        NoNetwork = 43 => "NO_NETWORK",
        /// `VIR_ERR_AUTH_FAILED`.
        AuthFailed = 45 => "AUTH_FAILED",
        /// `VIR_ERR_INVALID_STORAGE_POOL`.
        InvalidStoragePool = 46 => "INVALID_STORAGE_POOL",
        /// `VIR_ERR_INVALID_STORAGE_VOL`.
        InvalidStorageVol = 47 => "INVALID_STORAGE_VOL",
        /// `VIR_ERR_NO_STORAGE_POOL`.
        NoStoragePool = 49 => "NO_STORAGE_POOL",
        /// `VIR_ERR_NO_STORAGE_VOL`.
        NoStorageVol = 50 => "NO_STORAGE_VOL",
        /// `VIR_ERR_NO_NODE_DEVICE`.
        NoNodeDevice = 53 => "NO_NODE_DEVICE",
        /// `VIR_ERR_OPERATION_INVALID`.
        OperationInvalid = 55 => "OPERATION_INVALID",
        /// `VIR_ERR_NO_INTERFACE`.
        NoInterface = 57 => "NO_INTERFACE",
        /// `VIR_ERR_NO_NWFILTER`.
        NoNwfilter = 62 => "NO_NWFILTER",
        /// `VIR_ERR_NO_SECRET`.
        NoSecret = 66 => "NO_SECRET",
        /// `VIR_ERR_CONFIG_UNSUPPORTED`.
        ConfigUnsupported = 67 => "CONFIG_UNSUPPORTED",
        /// `VIR_ERR_OPERATION_TIMEOUT`.
        OperationTimeout = 68 => "OPERATION_TIMEOUT",
        /// `VIR_ERR_NO_DOMAIN_SNAPSHOT`.
        NoDomainSnapshot = 72 => "NO_DOMAIN_SNAPSHOT",
        /// `VIR_ERR_STORAGE_POOL_BUILT`.
        StoragePoolBuilt = 76 => "STORAGE_POOL_BUILT",
        /// `VIR_ERR_OPERATION_ABORTED`.
        OperationAborted = 78 => "OPERATION_ABORTED",
        /// `VIR_ERR_AGENT_UNRESPONSIVE`.
        AgentUnresponsive = 86 => "AGENT_UNRESPONSIVE",
        /// `VIR_ERR_STORAGE_VOL_EXIST`.
        StorageVolExist = 90 => "STORAGE_VOL_EXIST",
        /// `VIR_ERR_NO_SERVER`.
        NoServer = 95 => "NO_SERVER",
        /// `VIR_ERR_NO_CLIENT`.
        NoClient = 96 => "NO_CLIENT",
        /// `VIR_ERR_DEVICE_MISSING`.
        DeviceMissing = 99 => "DEVICE_MISSING",
        /// `VIR_ERR_NO_NWFILTER_BINDING`.
        NoNwfilterBinding = 101 => "NO_NWFILTER_BINDING",
        /// `VIR_ERR_NO_DOMAIN_CHECKPOINT`.
        NoDomainCheckpoint = 103 => "NO_DOMAIN_CHECKPOINT",
        /// `VIR_ERR_NO_DOMAIN_BACKUP`.
        NoDomainBackup = 104 => "NO_DOMAIN_BACKUP",
        /// `VIR_ERR_NO_NETWORK_PORT`.
        NoNetworkPort = 107 => "NO_NETWORK_PORT",
        /// `VIR_ERR_NO_HOSTNAME`.
        NoHostname = 108 => "NO_HOSTNAME",
    }
}

open_enum! {
    /// How severe libvirt considers an error (`virErrorLevel`).
    pub enum ErrorLevel {
        /// `VIR_ERR_NONE`.
        None = 0 => "none",
        /// `VIR_ERR_WARNING`.
        Warning = 1 => "warning",
        /// `VIR_ERR_ERROR`.
        Error = 2 => "error",
    }
}

/// An error libvirtd reported, with every field of its `remote_error`. The struct mirrors the
/// wire type, which libvirt cannot grow without breaking its own protocol, so it is not
/// `#[non_exhaustive]`: tests may build one.
#[derive(Debug, Clone, PartialEq)]
pub struct RemoteError {
    /// What went wrong.
    pub code: ErrorCode,
    /// `virErrorDomain`: which part of libvirt raised it.
    pub domain: i32,
    /// libvirt's message, for people.
    pub message: Option<String>,
    /// How severe libvirt considers it.
    pub level: ErrorLevel,
    /// The domain the error is about, by name.
    pub dom: Option<String>,
    /// Extra information; its meaning depends on `code`.
    pub str1: Option<String>,
    /// Extra information; its meaning depends on `code`.
    pub str2: Option<String>,
    /// Extra information; its meaning depends on `code`.
    pub str3: Option<String>,
    /// Extra information; its meaning depends on `code`.
    pub int1: i32,
    /// Extra information; its meaning depends on `code`.
    pub int2: i32,
    /// The network the error is about, by name.
    pub net: Option<String>,
}

/// The codes [`RemoteError::is_not_found`] accepts.
const NOT_FOUND: &[ErrorCode] = &[
    ErrorCode::NoDomain,
    ErrorCode::NoNetwork,
    ErrorCode::NoStoragePool,
    ErrorCode::NoStorageVol,
    ErrorCode::NoNodeDevice,
    ErrorCode::NoInterface,
    ErrorCode::NoNwfilter,
    ErrorCode::NoSecret,
    ErrorCode::NoDomainSnapshot,
    ErrorCode::NoDomainCheckpoint,
    ErrorCode::NoDomainBackup,
    ErrorCode::NoNetworkPort,
    ErrorCode::NoNwfilterBinding,
];

impl RemoteError {
    /// An error with `code` and `message` and every other field empty, as a server that says
    /// no more would send it.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> RemoteError {
        RemoteError {
            code,
            domain: 0,
            message: Some(message.into()),
            level: ErrorLevel::Error,
            dom: None,
            str1: None,
            str2: None,
            str3: None,
            int1: 0,
            int2: 0,
            net: None,
        }
    }

    /// The object the call named does not exist (domain, network, pool, volume, secret, …).
    pub fn is_not_found(&self) -> bool {
        // By value, so a code built as `Unknown(42)` still counts.
        NOT_FOUND.contains(&self.code)
    }

    /// The call tried to create something that is already there.
    pub fn is_already_exists(&self) -> bool {
        [
            ErrorCode::DomExist,
            ErrorCode::NetworkExist,
            ErrorCode::StorageVolExist,
        ]
        .contains(&self.code)
    }

    /// The daemon does not support what the call asked: its libvirt predates the procedure
    /// (see [`RemoteError::unknown_procedure`]), or its driver does not implement the API
    /// (`VIR_ERR_NO_SUPPORT`, "this function is not supported by the connection driver").
    pub fn is_unsupported(&self) -> bool {
        self.code == ErrorCode::NoSupport || self.unknown_procedure().is_some()
    }

    /// The procedure number the daemon did not know. libvirtd's RPC dispatcher answers a
    /// number it has no procedure for with `VIR_ERR_RPC` and the message
    /// `unknown procedure: N` (libvirt 9.0 and 11.3 alike). The code alone does not tell it
    /// from other RPC failures, so the message is read; it is the daemon's, in the daemon's
    /// locale, and under a translation this is `None` (and the error counts as an RPC
    /// failure, which [`Error::is_transient`] takes for transient).
    pub fn unknown_procedure(&self) -> Option<i32> {
        if self.code != ErrorCode::Rpc {
            return None;
        }
        self.message
            .as_deref()?
            .strip_prefix(UNKNOWN_PROCEDURE)?
            .trim()
            .parse()
            .ok()
    }

    /// The `remote` program's name for [`RemoteError::unknown_procedure`]'s number, when the
    /// number can only be one of that program's. The error does not say which program the
    /// call was for; the `qemu` and `lxc` programs number their few procedures from 1 and
    /// every daemon that speaks them knows the `remote` procedures with those numbers, so a
    /// number above theirs is a `remote` one.
    fn unknown_remote_procedure(&self) -> Option<&'static str> {
        let number = self.unknown_procedure()?;
        let others = crate::proto::qemu::PROCEDURES
            .iter()
            .chain(crate::proto::lxc::PROCEDURES)
            .map(|p| p.number)
            .max()
            .unwrap_or(0);
        if number <= others {
            return None;
        }
        crate::proto::remote::PROCEDURES
            .iter()
            .find(|p| p.number == number)
            .map(|p| p.name)
    }
}

/// How libvirtd's RPC dispatcher words the error for a procedure number it does not know.
const UNKNOWN_PROCEDURE: &str = "unknown procedure:";

impl From<VirNetMessageError> for RemoteError {
    fn from(e: VirNetMessageError) -> Self {
        RemoteError {
            code: ErrorCode::from_raw(e.code),
            domain: e.domain,
            message: e.message,
            level: ErrorLevel::from_raw(e.level),
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
            Some(n) => write!(f, "{message} (VIR_ERR_{n}")?,
            None => write!(f, "{message} (code {}", self.code.raw())?,
        }
        // The daemon names only the number; the procedure's name tells a reader which
        // feature the daemon's libvirt is too old for.
        if let Some(name) = self.unknown_remote_procedure() {
            write!(f, "; the daemon's libvirt predates {name}")?;
        }
        f.write_str(")")
    }
}

impl std::error::Error for RemoteError {}

/// Everything the client can fail with. `#[non_exhaustive]`: new failure modes are added
/// without a breaking change, so a `match` needs a wildcard arm; the `is_*` methods classify.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The URI's scheme names a transport this client does not speak.
    #[error("scheme \"{0}\" is not supported")]
    UnsupportedScheme(String),
    /// A URI parameter that does not apply to the URI's transport (`socket` on a TCP
    /// transport, `pkipath` without TLS).
    #[error("the URI parameter {name:?} does not apply to scheme \"{scheme}\"")]
    UnsupportedUriParameter {
        /// The parameter.
        name: &'static str,
        /// The URI's scheme.
        scheme: String,
    },
    /// The URI's transport is not the one the connect function opens: TLS URIs go to
    /// `Client::connect`, unix socket and plain TCP URIs to `Client::connect_plain`.
    #[error("scheme \"{scheme}\" {reason}")]
    TransportMismatch {
        /// The URI's scheme.
        scheme: String,
        /// What to use instead.
        reason: &'static str,
    },
    /// The URI could not be parsed or names something the client refuses.
    #[error("invalid libvirt URI {uri:?}: {reason}")]
    InvalidUri {
        /// The URI, with any password redacted.
        uri: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A certificate or key could not be read or used.
    #[error("read TLS material: {0}")]
    TlsMaterial(String),
    /// The transport connection could not be opened.
    #[error("connect to {address}")]
    Connect {
        /// `host:port` or a socket path.
        address: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The connection (with TLS: and its handshake) was not up within
    /// `ClientOptions::connect_timeout`.
    #[error("connect to {address}: not connected within {after:?}")]
    ConnectTimeout {
        /// `host:port` or a socket path.
        address: String,
        /// The deadline that passed.
        after: std::time::Duration,
    },
    /// The TLS handshake failed.
    #[error("TLS handshake with {host}")]
    Tls {
        /// The host the URI names.
        host: String,
        /// rustls' error, wrapped in I/O.
        #[source]
        source: std::io::Error,
    },
    /// The server's certificate is valid and trusted but carries no subject alternative name
    /// for the host the URI names. rustls, like libvirt, matches an IP host only against
    /// IP-address SANs, never against DNS names or the common name.
    #[error(
        "the server certificate has no subject alternative name for {kind} {host} (it names: {presented}); reissue it with that SAN, or connect by a name it carries"
    )]
    ServerNameNotInCertificate {
        /// The host the URI names.
        host: String,
        /// "IP address" or "DNS name".
        kind: &'static str,
        /// The names the certificate does carry.
        presented: String,
    },
    /// libvirtd ended the connection after the TLS handshake: it refused the client
    /// certificate.
    #[error(
        "the server refused the client certificate (it ended the connection after the TLS handshake: {detail})"
    )]
    CertificateRefused {
        /// How the connection ended.
        detail: String,
    },
    /// The byte libvirtd sends after the TLS handshake was not 1.
    #[error("the server sent {0:#04x} instead of its TLS confirmation byte")]
    BadConfirmation(u8),
    /// The server offers only authentication schemes this client does not implement
    /// (`remote_auth_type` values).
    #[error(
        "the server requires authentication {0:?}; only auth \"none\" (a TLS client certificate) is supported"
    )]
    AuthUnsupported(Vec<i32>),
    /// libvirtd answered the call with an error.
    #[error("libvirt: {0}")]
    Remote(Box<RemoteError>),
    /// The connection went away (closed, keepalive gave up) while the call waited.
    #[error("connection lost: {0}")]
    ConnectionLost(String),
    /// The call had no reply within its deadline.
    #[error("the call {procedure} timed out after {after:?}")]
    Timeout {
        /// The procedure's name.
        procedure: &'static str,
        /// The deadline that passed.
        after: std::time::Duration,
    },
    /// The connection was closed before the call could be sent.
    #[error("the connection is closed")]
    Closed,
    /// The server broke the protocol in a way the client cannot carry on from.
    #[error("protocol violation: {0}")]
    Protocol(String),
    /// A packet from the server could not be decoded.
    #[error(transparent)]
    Packet(#[from] PacketError),
    /// The call's arguments could not be encoded (a string or array over its bound).
    #[error("encode call arguments")]
    Encode(#[source] crate::xdr::Error),
    /// Reading the source or writing the sink of a stream failed.
    #[error("stream I/O")]
    StreamIo(#[source] std::io::Error),
    /// [`Reconnecting`](crate::Reconnecting) used up its attempts.
    #[error("reconnect gave up after {attempts} attempts")]
    ReconnectGaveUp {
        /// How many connections were tried.
        attempts: u32,
        /// The last attempt's error.
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

    /// A libvirt "unsupported by this daemon" error: the daemon's libvirt predates the
    /// procedure (`unknown procedure: N`, see [`RemoteError::unknown_procedure`]) or its
    /// driver does not implement the API. Not transient: the same daemon answers the same,
    /// so a caller falls back or reports the daemon too old rather than retrying.
    pub fn is_unsupported(&self) -> bool {
        matches!(self, Error::Remote(e) if e.is_unsupported())
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
            // A procedure the daemon does not know stays unknown however often it is asked.
            Error::Remote(e) => {
                [ErrorCode::NoConnect, ErrorCode::Rpc].contains(&e.code)
                    && e.unknown_procedure().is_none()
            }
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

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    /// What libvirtd 9.0 sent for `REMOTE_PROC_NETWORK_SET_METADATA` (444).
    fn unknown_444() -> RemoteError {
        RemoteError {
            domain: 7, // VIR_FROM_RPC
            str1: Some("%s".into()),
            str2: Some("unknown procedure: 444".into()),
            int1: -1,
            int2: -1,
            ..RemoteError::new(ErrorCode::Rpc, "unknown procedure: 444")
        }
    }

    #[test]
    fn an_unknown_procedure_is_unsupported_not_transient_and_named() {
        let e = unknown_444();
        assert!(e.is_unsupported());
        assert_eq!(e.unknown_procedure(), Some(444));
        assert_eq!(
            e.to_string(),
            "unknown procedure: 444 (VIR_ERR_RPC; the daemon's libvirt predates \
             REMOTE_PROC_NETWORK_SET_METADATA)"
        );
        let e = Error::from(e);
        assert!(e.is_unsupported());
        assert!(!e.is_transient() && !e.is_not_found());
        // Other RPC failures stay transient.
        let e = Error::from(RemoteError::new(ErrorCode::Rpc, "cannot write data"));
        assert!(e.is_transient() && !e.is_unsupported());
    }

    #[test]
    fn a_driver_without_the_api_is_unsupported_in_libvirts_words() {
        let e = RemoteError::new(
            ErrorCode::NoSupport,
            "this function is not supported by the connection driver: virDomainGraphicsReload",
        );
        assert!(e.is_unsupported());
        assert_eq!(e.unknown_procedure(), None);
        assert_eq!(
            e.to_string(),
            "this function is not supported by the connection driver: virDomainGraphicsReload \
             (VIR_ERR_NO_SUPPORT)"
        );
        assert!(!Error::from(e).is_transient());
    }

    #[test]
    fn only_the_dispatchers_words_under_its_code_name_a_procedure() {
        // A number the qemu program also uses could be either program's: no name.
        let e = RemoteError::new(ErrorCode::Rpc, "unknown procedure: 7");
        assert_eq!(e.unknown_procedure(), Some(7));
        assert_eq!(e.to_string(), "unknown procedure: 7 (VIR_ERR_RPC)");
        // Past the end of this client's table.
        let e = RemoteError::new(ErrorCode::Rpc, "unknown procedure: 9999");
        assert_eq!(e.unknown_procedure(), Some(9999));
        assert_eq!(e.to_string(), "unknown procedure: 9999 (VIR_ERR_RPC)");
        // Not a number, another code, a translated message.
        for e in [
            RemoteError::new(ErrorCode::Rpc, "unknown procedure: many"),
            RemoteError::new(ErrorCode::InternalError, "unknown procedure: 444"),
            RemoteError::new(ErrorCode::Rpc, "procédure inconnue : 444"),
        ] {
            assert_eq!(e.unknown_procedure(), None, "{e:?}");
            assert!(!e.to_string().contains("predates"), "{e}");
        }
    }
}

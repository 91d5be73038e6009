//! Client URIs and what is said to the server. Transports: `qemu+tls://host[:port]/system`
//! (mutual TLS), `qemu:///system` and `qemu+unix:///system?socket=PATH` (the local unix
//! socket), and `qemu+tcp://host[:port]/system` (plain TCP, for test setups).

use std::path::PathBuf;

use crate::error::{Error, Result};

/// libvirtd's TLS port.
pub const DEFAULT_TLS_PORT: u16 = 16514;
/// libvirtd's plain TCP port.
pub const DEFAULT_TCP_PORT: u16 = 16509;
/// The system daemon's socket (libvirtd; the modular virtqemud listens on
/// `/run/libvirt/virtqemud-sock`, which `?socket=` names).
pub const SYSTEM_SOCKET: &str = "/run/libvirt/libvirt-sock";

/// How the client reaches the daemon.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Transport {
    /// Mutual TLS over TCP (`+tls`), trusting only the given CA.
    Tls,
    /// Plain TCP (`+tcp`): neither encrypted nor authenticated, for test setups on loopback.
    Tcp,
    /// A local unix socket (no suffix, or `+unix`).
    Unix {
        /// The socket's path.
        socket: PathBuf,
    },
}

/// A parsed client URI: `driver[+transport]://[host[:port]]/path[?query]`.
/// `#[non_exhaustive]`: made by [`ConnectUri::parse`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ConnectUri {
    /// `qemu` or `test`.
    pub driver: String,
    /// How to reach the daemon.
    pub transport: Transport,
    /// The host name or IP address (without brackets); empty for a unix socket.
    pub host: String,
    /// The port (16514 for TLS, 16509 for TCP unless the URI names one); 0 for a unix socket.
    pub port: u16,
    /// `/system`, `/session` or, for the test driver, `/default`.
    pub path: String,
    /// virsh's `pkipath` query parameter, if given (TLS only).
    pub pkipath: Option<String>,
}

impl ConnectUri {
    /// Parses a client URI. Supported: `qemu+tls://`, `test+tls://`, `qemu+tcp://`,
    /// `test+tcp://`, `qemu+unix://`, `test+unix://` and `qemu://` with an empty host. Any other
    /// scheme (`qemu+ssh`, `xen`, …) fails here, before any I/O, with
    /// `scheme "<scheme>" is not supported` ([`Error::UnsupportedScheme`]).
    ///
    /// The scheme is matched case-insensitively and normalised to lower case
    /// (`QEMU+TLS://h/system` is `qemu+tls://h/system`): RFC 3986 §3.1 makes schemes
    /// case-insensitive and libvirt itself compares transports without case, so refusing the
    /// upper-case spelling would only confuse. User information (`user:password@host`) is
    /// refused: the client certificate is the only credential, and a password written into an
    /// endpoint would end up in objects, logs and process arguments.
    ///
    /// Query parameters: `pkipath` (TLS) and `socket` (unix; an absolute path). One of them on
    /// a transport it does not apply to is [`Error::UnsupportedUriParameter`]; other
    /// parameters (`no_verify`, `tls_priority`, …) are ignored, never honoured.
    pub fn parse(uri: &str) -> Result<ConnectUri> {
        let invalid = |reason| Error::InvalidUri {
            uri: redacted(uri),
            reason,
        };
        let (scheme, rest) = uri
            .split_once("://")
            .ok_or_else(|| invalid("expected scheme://host/path"))?;
        let scheme = scheme.to_ascii_lowercase();
        let (driver, kind) = match scheme.split_once('+') {
            Some((driver @ ("qemu" | "test"), kind @ ("tls" | "tcp" | "unix"))) => (driver, kind),
            // `test:///default` is libvirt's in-process test driver, not a daemon: only qemu
            // means "the local daemon" without a transport.
            None if scheme == "qemu" => ("qemu", "unix"),
            _ => return Err(Error::UnsupportedScheme(scheme)),
        };
        let (authority, path_query) = match rest.find('/') {
            Some(i) => rest.split_at(i),
            None => (rest, "/"),
        };
        let (path, query) = match path_query.split_once('?') {
            Some((p, q)) => (p, Some(q)),
            None => (path_query, None),
        };
        if authority.contains('@') {
            return Err(invalid(
                "user information (user:password@) is not allowed; the client certificate is the credential",
            ));
        }
        let valid_path = match driver {
            "qemu" => matches!(path, "/system" | "/session"),
            _ => path == "/default",
        };
        if !valid_path {
            return Err(invalid(
                "the path must be /system or /session (test driver: /default)",
            ));
        }
        let param = |name: &str| {
            query
                .into_iter()
                .flat_map(|q| q.split('&'))
                .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
                .map(str::to_string)
        };
        let (pkipath, socket) = (param("pkipath"), param("socket"));
        let refuse = |name: &'static str| Error::UnsupportedUriParameter {
            name,
            scheme: scheme.clone(),
        };
        let (transport, host, port) = match kind {
            "unix" => {
                if !authority.is_empty() {
                    return Err(invalid("a unix socket URI names no host (qemu:///system)"));
                }
                if pkipath.is_some() {
                    return Err(refuse("pkipath"));
                }
                let socket = match socket {
                    Some(s) if s.starts_with('/') => PathBuf::from(s),
                    Some(_) => {
                        return Err(invalid("the socket parameter must be an absolute path"));
                    }
                    None => default_socket(path, std::env::var_os("XDG_RUNTIME_DIR")).ok_or_else(
                        || invalid("a session socket needs XDG_RUNTIME_DIR or ?socket="),
                    )?,
                };
                (Transport::Unix { socket }, String::new(), 0)
            }
            tcp_or_tls => {
                if socket.is_some() {
                    return Err(refuse("socket"));
                }
                let tls = tcp_or_tls == "tls";
                if !tls && pkipath.is_some() {
                    return Err(refuse("pkipath"));
                }
                let (host, port) =
                    split_host_port(authority).ok_or_else(|| invalid("bad host or port"))?;
                if host.is_empty() {
                    return Err(invalid("a host is required"));
                }
                let (transport, default_port) = if tls {
                    (Transport::Tls, DEFAULT_TLS_PORT)
                } else {
                    (Transport::Tcp, DEFAULT_TCP_PORT)
                };
                (transport, host, port.unwrap_or(default_port))
            }
        };
        Ok(ConnectUri {
            driver: driver.to_string(),
            transport,
            host,
            port,
            path: path.to_string(),
            pkipath,
        })
    }

    /// The URI's scheme, normalised: `qemu+tls`, `qemu+tcp` or `qemu+unix` (also for
    /// `qemu:///…`).
    pub fn scheme(&self) -> String {
        let transport = match self.transport {
            Transport::Tls => "tls",
            Transport::Tcp => "tcp",
            Transport::Unix { .. } => "unix",
        };
        format!("{}+{transport}", self.driver)
    }

    /// The URI the daemon is asked to open: `qemu:///system`, never the client URI.
    pub fn server_uri(&self) -> String {
        format!("{}://{}", self.driver, self.path)
    }

    /// `host:port`, with IPv6 literals bracketed; the socket path for a unix socket.
    pub fn address(&self) -> String {
        match &self.transport {
            Transport::Unix { socket } => socket.display().to_string(),
            _ if self.host.contains(':') => format!("[{}]:{}", self.host, self.port),
            _ => format!("{}:{}", self.host, self.port),
        }
    }
}

/// Where libvirt's own client looks for the daemon: the system socket, or
/// `$XDG_RUNTIME_DIR/libvirt/libvirt-sock` for the session daemon.
fn default_socket(path: &str, runtime_dir: Option<std::ffi::OsString>) -> Option<PathBuf> {
    match path {
        "/session" => runtime_dir.map(|d| PathBuf::from(d).join("libvirt/libvirt-sock")),
        _ => Some(PathBuf::from(SYSTEM_SOCKET)),
    }
}

/// `uri` with any user information (`user:password@`) replaced by `***@`, for error messages
/// and conditions: a refused URI must not carry its password into logs.
pub fn redacted(uri: &str) -> String {
    let Some((scheme, rest)) = uri.split_once("://") else {
        return uri.to_string();
    };
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    match rest[..authority_end].rfind('@') {
        Some(at) => format!("{scheme}://***@{}", &rest[at + 1..]),
        None => uri.to_string(),
    }
}

fn split_host_port(authority: &str) -> Option<(String, Option<u16>)> {
    if let Some(rest) = authority.strip_prefix('[') {
        let (host, after) = rest.split_once(']')?;
        let port = match after.strip_prefix(':') {
            Some(p) => Some(p.parse().ok()?),
            None if after.is_empty() => None,
            None => return None,
        };
        return Some((host.to_string(), port));
    }
    match authority.rsplit_once(':') {
        Some((host, port)) => Some((host.to_string(), Some(port.parse().ok()?))),
        None => Some((authority.to_string(), None)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tls_uris() {
        let u = ConnectUri::parse("qemu+tls://kvm-7.example/system").expect("parses");
        assert_eq!(
            (u.host.as_str(), u.port, u.path.as_str()),
            ("kvm-7.example", 16514, "/system")
        );
        assert_eq!(u.server_uri(), "qemu:///system");
        let u = ConnectUri::parse("qemu+tls://127.0.0.1:1234/session?pkipath=/tmp/pki")
            .expect("parses");
        assert_eq!((u.port, u.pkipath.as_deref()), (1234, Some("/tmp/pki")));
        assert_eq!(u.server_uri(), "qemu:///session");
        let u = ConnectUri::parse("test+tls://[::1]:99/default").expect("parses");
        assert_eq!(
            (u.host.as_str(), u.address()),
            ("::1", "[::1]:99".to_string())
        );
        assert_eq!(u.server_uri(), "test:///default");
    }

    #[test]
    fn local_and_tcp_uris() {
        let u = ConnectUri::parse("qemu:///system").expect("parses");
        assert_eq!(
            u.transport,
            Transport::Unix {
                socket: SYSTEM_SOCKET.into()
            }
        );
        assert_eq!(
            (u.scheme(), u.server_uri()),
            ("qemu+unix".into(), "qemu:///system".into())
        );
        let u =
            ConnectUri::parse("qemu+unix:///system?socket=/tmp/x/libvirt-sock").expect("parses");
        assert_eq!(u.address(), "/tmp/x/libvirt-sock");
        let u = ConnectUri::parse("QEMU:///session?socket=/s").expect("parses");
        assert_eq!(u.server_uri(), "qemu:///session");
        assert_eq!(
            default_socket("/session", Some("/run/user/1000".into())),
            Some(PathBuf::from("/run/user/1000/libvirt/libvirt-sock"))
        );
        assert_eq!(default_socket("/session", None), None);
        let u = ConnectUri::parse("qemu+tcp://127.0.0.1/system").expect("parses");
        assert_eq!(
            (u.transport.clone(), u.address()),
            (Transport::Tcp, "127.0.0.1:16509".into())
        );
        let u = ConnectUri::parse("test+tcp://[::1]:99/default?no_verify=1").expect("parses");
        assert_eq!(
            (u.scheme(), u.address()),
            ("test+tcp".into(), "[::1]:99".into())
        );
    }

    #[test]
    fn parameters_of_another_transport_are_refused() {
        for (uri, name) in [
            ("qemu+tls://h/system?socket=/run/x", "socket"),
            ("qemu+tcp://h/system?socket=/run/x", "socket"),
            ("qemu+tcp://h/system?pkipath=/etc", "pkipath"),
            ("qemu+unix:///system?pkipath=/etc", "pkipath"),
            ("qemu:///system?pkipath=/etc", "pkipath"),
        ] {
            match ConnectUri::parse(uri) {
                Err(Error::UnsupportedUriParameter { name: n, .. }) => assert_eq!(n, name, "{uri}"),
                other => panic!("{uri}: {other:?}"),
            }
        }
        for uri in [
            "qemu+unix://host/system",
            "qemu:///system?socket=relative",
            "qemu+unix:///other",
        ] {
            assert!(
                matches!(ConnectUri::parse(uri), Err(Error::InvalidUri { .. })),
                "{uri}"
            );
        }
    }

    #[test]
    fn other_schemes_are_refused_by_name() {
        for (uri, scheme) in [
            ("qemu+ssh://root@kvm/system", "qemu+ssh"),
            ("qemu+libssh2://kvm/system", "qemu+libssh2"),
            ("test:///default", "test"),
            ("xen:///system", "xen"),
            ("lxc+tls://h/system", "lxc+tls"),
        ] {
            let e = ConnectUri::parse(uri).expect_err(uri);
            assert_eq!(
                e.to_string(),
                format!("scheme \"{scheme}\" is not supported")
            );
        }
    }

    #[test]
    fn schemes_are_case_insensitive_and_normalised() {
        let u = ConnectUri::parse("QEMU+TLS://h/system").expect("parses");
        assert_eq!(
            (u.driver.as_str(), u.server_uri()),
            ("qemu", "qemu:///system".into())
        );
        let e = ConnectUri::parse("QEMU+SSH://h/system").expect_err("ssh");
        assert_eq!(e.to_string(), "scheme \"qemu+ssh\" is not supported");
    }

    #[test]
    fn user_information_is_refused() {
        for uri in ["qemu+tls://u:pw@h/system", "qemu+tls://u@h:16514/system"] {
            match ConnectUri::parse(uri) {
                Err(e @ Error::InvalidUri { reason, .. }) => {
                    assert!(reason.starts_with("user information"), "{uri}: {reason}");
                    assert!(
                        !e.to_string().contains("pw"),
                        "the password is redacted: {e}"
                    );
                    assert!(e.to_string().contains("***@h"), "{e}");
                }
                other => panic!("{uri}: {other:?}"),
            }
        }
    }

    #[test]
    fn malformed_uris() {
        for uri in [
            "qemu+tls://",
            "qemu+tls://:5/system",
            "qemu+tls://h:x/system",
            "qemu+tls://h/other",
            "nonsense",
        ] {
            assert!(
                matches!(ConnectUri::parse(uri), Err(Error::InvalidUri { .. })),
                "{uri}"
            );
        }
    }
}

//! Client URIs (`qemu+tls://host[:port]/system`) and what is said to the server.

use crate::error::{Error, Result};

/// libvirtd's TLS port.
pub const DEFAULT_TLS_PORT: u16 = 16514;

/// A parsed `driver+tls://host[:port]/path[?query]` URI.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectUri {
    /// `qemu` or `test`.
    pub driver: String,
    /// The host name or IP address (without brackets).
    pub host: String,
    /// The port; 16514 unless the URI names one.
    pub port: u16,
    /// `/system`, `/session` or, for the test driver, `/default`.
    pub path: String,
    /// virsh's `pkipath` query parameter, if given.
    pub pkipath: Option<String>,
}

impl ConnectUri {
    /// Parses a client URI. Only TLS transports are accepted: any other scheme fails here,
    /// before any I/O, with `scheme "<scheme>" is not supported`.
    ///
    /// The scheme is matched case-insensitively and normalised to lower case
    /// (`QEMU+TLS://h/system` is `qemu+tls://h/system`): RFC 3986 §3.1 makes schemes
    /// case-insensitive and libvirt itself compares transports without case, so refusing the
    /// upper-case spelling would only confuse. User information (`user:password@host`) is
    /// refused: the client certificate is the only credential, and a password written into an
    /// endpoint would end up in objects, logs and process arguments.
    pub fn parse(uri: &str) -> Result<ConnectUri> {
        let invalid = |reason| Error::InvalidUri {
            uri: redacted(uri),
            reason,
        };
        let (scheme, rest) = uri
            .split_once("://")
            .ok_or_else(|| invalid("expected scheme://host/path"))?;
        let scheme = scheme.to_ascii_lowercase();
        let supported = matches!(scheme.as_str(), "qemu+tls" | "test+tls");
        if !supported {
            return Err(Error::UnsupportedScheme(scheme));
        }
        let driver = scheme.trim_end_matches("+tls").to_string();
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
        let (host, port) = split_host_port(authority).ok_or_else(|| invalid("bad host or port"))?;
        if host.is_empty() {
            return Err(invalid("a host is required"));
        }
        let valid_path = match driver.as_str() {
            "qemu" => matches!(path, "/system" | "/session"),
            _ => path == "/default",
        };
        if !valid_path {
            return Err(invalid(
                "the path must be /system or /session (test driver: /default)",
            ));
        }
        let pkipath = query
            .into_iter()
            .flat_map(|q| q.split('&'))
            .find_map(|kv| kv.strip_prefix("pkipath="))
            .map(str::to_string);
        Ok(ConnectUri {
            driver,
            host,
            port: port.unwrap_or(DEFAULT_TLS_PORT),
            path: path.to_string(),
            pkipath,
        })
    }

    /// The URI the daemon is asked to open: `qemu:///system`, never the client URI.
    pub fn server_uri(&self) -> String {
        format!("{}://{}", self.driver, self.path)
    }

    /// `host:port`, with IPv6 literals bracketed.
    pub fn address(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
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
    fn other_schemes_are_refused_by_name() {
        for (uri, scheme) in [
            ("qemu+ssh://root@kvm/system", "qemu+ssh"),
            ("qemu+tcp://kvm/system", "qemu+tcp"),
            ("qemu:///system", "qemu"),
            ("qemu+unix:///system", "qemu+unix"),
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

//! Mutual TLS material: the client identity and the CA bundle, read from PEM. Only the given
//! CA is trusted (no platform store, no public roots); libvirt deployments use a private CA.

use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};

use crate::error::{Error, Result};

/// A client certificate chain and its private key.
#[derive(Debug)]
pub struct Identity {
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
}

impl Clone for Identity {
    fn clone(&self) -> Self {
        Identity {
            chain: self.chain.clone(),
            key: self.key.clone_key(),
        }
    }
}

impl Identity {
    /// From PEM text. The key may be PKCS#1 (`RSA PRIVATE KEY`), PKCS#8 or SEC1 (`EC PRIVATE KEY`).
    pub fn from_pem(cert_pem: &[u8], key_pem: &[u8]) -> Result<Identity> {
        let chain = CertificateDer::pem_slice_iter(cert_pem)
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|e| Error::TlsMaterial(format!("client certificate: {e}")))?;
        if chain.is_empty() {
            return Err(Error::TlsMaterial(
                "client certificate: no CERTIFICATE block".into(),
            ));
        }
        let key = PrivateKeyDer::from_pem_slice(key_pem)
            .map_err(|e| Error::TlsMaterial(format!("client key: {e}")))?;
        Ok(Identity { chain, key })
    }

    /// From files; the key is read from a file, never from an argument or the environment.
    pub fn from_files(cert: &std::path::Path, key: &std::path::Path) -> Result<Identity> {
        let read = |p: &std::path::Path| {
            std::fs::read(p).map_err(|e| Error::TlsMaterial(format!("{}: {e}", p.display())))
        };
        Identity::from_pem(&read(cert)?, &read(key)?)
    }
}

/// The CA certificates that may sign the server's certificate.
#[derive(Debug, Clone)]
pub struct CaBundle {
    roots: Vec<CertificateDer<'static>>,
}

impl CaBundle {
    /// From PEM text holding one or more CERTIFICATE blocks.
    pub fn from_pem(pem: &[u8]) -> Result<CaBundle> {
        let roots = CertificateDer::pem_slice_iter(pem)
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|e| Error::TlsMaterial(format!("CA bundle: {e}")))?;
        if roots.is_empty() {
            return Err(Error::TlsMaterial(
                "CA bundle: no CERTIFICATE block; a CA is required".into(),
            ));
        }
        Ok(CaBundle { roots })
    }

    /// From a PEM file.
    pub fn from_file(path: &std::path::Path) -> Result<CaBundle> {
        let pem = std::fs::read(path)
            .map_err(|e| Error::TlsMaterial(format!("{}: {e}", path.display())))?;
        CaBundle::from_pem(&pem)
    }
}

/// A rustls client configuration trusting only `ca` and presenting `identity`.
pub(crate) fn client_config(
    identity: &Identity,
    ca: &CaBundle,
) -> Result<Arc<rustls::ClientConfig>> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in &ca.roots {
        roots
            .add(cert.clone())
            .map_err(|e| Error::TlsMaterial(format!("CA bundle: {e}")))?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::TlsMaterial(e.to_string()))?
        .with_root_certificates(roots)
        .with_client_auth_cert(identity.chain.clone(), identity.key.clone_key())
        .map_err(|e| Error::TlsMaterial(format!("client identity: {e}")))?;
    Ok(Arc::new(config))
}

/// The name the server's certificate must carry: a DNS name or an IP address SAN.
pub(crate) fn server_name(host: &str) -> Result<ServerName<'static>> {
    ServerName::try_from(host.to_string())
        .map_err(|_| Error::TlsMaterial(format!("{host:?} is not a valid server name")))
}

/// The error of a failed TLS handshake with `host`: a certificate that does not name the host
/// becomes [`Error::ServerNameNotInCertificate`], naming what it does carry; anything else
/// stays [`Error::Tls`].
pub(crate) fn handshake_error(host: &str, source: std::io::Error) -> Error {
    use rustls::{CertificateError, Error as TlsError};
    let cause = source.get_ref().and_then(|e| e.downcast_ref::<TlsError>());
    if let Some(TlsError::InvalidCertificate(CertificateError::NotValidForNameContext {
        expected,
        presented,
    })) = cause
    {
        let kind = match expected {
            ServerName::IpAddress(_) => "IP address",
            _ => "DNS name",
        };
        let presented = if presented.is_empty() {
            "none".to_string()
        } else {
            presented
                .iter()
                .map(|n| san_label(n))
                .collect::<Vec<_>>()
                .join(", ")
        };
        return Error::ServerNameNotInCertificate {
            host: host.to_string(),
            kind,
            presented,
        };
    }
    Error::Tls {
        host: host.to_string(),
        source,
    }
}

/// `DNS:name` / `IP:address` for a SAN as rustls-webpki prints it (`DnsName("name")`,
/// `IpAddress(address)`); anything else as is.
fn san_label(presented: &str) -> String {
    if let Some(name) = presented
        .strip_prefix("DnsName(\"")
        .and_then(|s| s.strip_suffix("\")"))
    {
        return format!("DNS:{name}");
    }
    if let Some(ip) = presented
        .strip_prefix("IpAddress(")
        .and_then(|s| s.strip_suffix(')'))
    {
        return format!("IP:{ip}");
    }
    presented.to_string()
}

#[cfg(test)]
mod tests {
    #[test]
    fn sans_print_like_openssl() {
        assert_eq!(super::san_label("DnsName(\"localhost\")"), "DNS:localhost");
        assert_eq!(super::san_label("IpAddress(10.0.0.1)"), "IP:10.0.0.1");
        assert_eq!(super::san_label("other"), "other");
    }
}

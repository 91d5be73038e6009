//! Throwaway certificate authorities for the local peers: one per control plane, per libvirtd
//! and per registry (the OIDC issuer and vcsim serve with a registry's). Each peer keeps its own
//! file names and directories; what a certificate holds is decided here, once.
//!
//! One profile for every certificate, the strictest a peer asks for, so a certificate that one
//! peer accepts is accepted by all: ECDSA P-256 (fast to generate; Go's TLS, GnuTLS and rustls
//! take it), a fixed validity from 2000 to 2099 (a test machine's clock never makes the PKI "not
//! yet valid"), and on leaves both key-usage bits with the authority key identifier, since
//! libvirt checks digitalSignature and keyEncipherment when key usage is critical (rcgen marks
//! it so), even for keys that never encipher.

use std::fmt;
use std::fs;
use std::io;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, date_time_ymd,
};

/// A certificate authority that issues leaf certificates.
pub(crate) struct Authority {
    issuer: Issuer<'static, KeyPair>,
    cert_pem: String,
    cert_der: Vec<u8>,
    key_pem: String,
}

impl fmt::Debug for Authority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The signing key stays out of test output.
        f.debug_struct("Authority").finish_non_exhaustive()
    }
}

/// What a leaf certificate is for.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Usage<'a> {
    /// TLS server for these names: IP addresses or DNS names.
    Server(&'a [&'a str]),
    /// TLS client.
    Client,
}

/// A leaf certificate to issue.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Leaf<'a> {
    pub common_name: &'a str,
    /// The subject's organization: the API server reads a client's group from it.
    pub organization: Option<&'a str>,
    pub usage: Usage<'a>,
}

/// An issued certificate and its PKCS#8 key, as PEM.
pub(crate) struct Issued {
    pub cert_pem: String,
    pub key_pem: String,
}

impl Authority {
    pub(crate) fn new(common_name: &str) -> Result<Self, rcgen::Error> {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::default();
        params.distinguished_name = name(common_name, None);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        // libvirt refuses a CA whose key usage lacks certificate signing.
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        set_validity(&mut params);
        let cert = params.self_signed(&key)?;
        let key_pem = key.serialize_pem();
        Ok(Self {
            cert_pem: cert.pem(),
            cert_der: cert.der().to_vec(),
            key_pem,
            issuer: Issuer::new(params, key),
        })
    }

    pub(crate) fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    pub(crate) fn cert_der(&self) -> &[u8] {
        &self.cert_der
    }

    /// The CA's own key: the control plane's controller-manager signs CSRs with it.
    pub(crate) fn key_pem(&self) -> &str {
        &self.key_pem
    }

    pub(crate) fn issue(&self, leaf: Leaf<'_>) -> Result<Issued, rcgen::Error> {
        let key = KeyPair::generate()?;
        let (mut params, purpose) = match leaf.usage {
            Usage::Server(names) => (
                CertificateParams::new(names.iter().map(|&n| n.to_owned()).collect::<Vec<_>>())?,
                ExtendedKeyUsagePurpose::ServerAuth,
            ),
            Usage::Client => (
                CertificateParams::default(),
                ExtendedKeyUsagePurpose::ClientAuth,
            ),
        };
        params.distinguished_name = name(leaf.common_name, leaf.organization);
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![purpose];
        params.use_authority_key_identifier_extension = true;
        set_validity(&mut params);
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok(Issued {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }
}

fn name(common_name: &str, organization: Option<&str>) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, common_name);
    if let Some(organization) = organization {
        dn.push(DnType::OrganizationName, organization);
    }
    dn
}

fn set_validity(params: &mut CertificateParams) {
    params.not_before = date_time_ymd(2000, 1, 1);
    params.not_after = date_time_ymd(2099, 12, 31);
}

/// Creates `dir` (and its parents), readable by its owner only.
pub(crate) fn create_private_dir(dir: &Path) -> io::Result<()> {
    fs::create_dir_all(dir)?;
    fs::set_permissions(dir, fs::Permissions::from_mode(0o700))
}

/// Writes `pem` to `path`, readable by its owner only (keys and certificates alike: every peer
/// runs as the test's user).
pub(crate) fn write_private(path: &Path, pem: &str) -> io::Result<()> {
    use io::Write as _;
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?;
    file.write_all(pem.as_bytes())?;
    // An existing file keeps its mode through open(2): set it.
    file.set_permissions(fs::Permissions::from_mode(0o600))
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::sync::Arc;

    use rustls::RootCertStore;
    use rustls::client::WebPkiServerVerifier;
    use rustls::client::danger::ServerCertVerifier;
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
    use rustls::server::WebPkiClientVerifier;

    fn der(pem: &str) -> CertificateDer<'static> {
        CertificateDer::from_pem_slice(pem.as_bytes()).unwrap()
    }

    fn issue(authority: &Authority, usage: Usage<'_>) -> CertificateDer<'static> {
        let leaf = Leaf {
            common_name: "leaf",
            organization: Some("system:masters"),
            usage,
        };
        der(&authority.issue(leaf).unwrap().cert_pem)
    }

    #[test]
    fn leaves_verify_against_their_authority_for_their_use_only() {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let authority = Authority::new("test CA").unwrap();
        let mut roots = RootCertStore::empty();
        roots.add(der(authority.cert_pem())).unwrap();
        assert_eq!(der(authority.cert_pem()).as_ref(), authority.cert_der());
        let roots = Arc::new(roots);
        let servers = WebPkiServerVerifier::builder_with_provider(roots.clone(), provider.clone())
            .build()
            .unwrap();
        let clients = WebPkiClientVerifier::builder_with_provider(roots, provider)
            .build()
            .unwrap();
        let now = UnixTime::now();

        let server = issue(&authority, Usage::Server(&["127.0.0.1", "localhost"]));
        for name in ["127.0.0.1", "localhost"] {
            let name = ServerName::try_from(name).unwrap();
            servers
                .verify_server_cert(&server, &[], &name, &[], now)
                .expect("a server certificate for its names");
        }
        let elsewhere = ServerName::try_from("example.test").unwrap();
        assert!(
            servers
                .verify_server_cert(&server, &[], &elsewhere, &[], now)
                .is_err()
        );
        assert!(clients.verify_client_cert(&server, &[], now).is_err());

        let client = issue(&authority, Usage::Client);
        clients
            .verify_client_cert(&client, &[], now)
            .expect("a client certificate as a client");
        let localhost = ServerName::try_from("localhost").unwrap();
        assert!(
            servers
                .verify_server_cert(&client, &[], &localhost, &[], now)
                .is_err()
        );

        // Another authority's leaf is nobody's.
        let stranger = issue(&Authority::new("other CA").unwrap(), Usage::Client);
        assert!(clients.verify_client_cert(&stranger, &[], now).is_err());
        // The signing key never reaches test output.
        assert_eq!(format!("{authority:?}"), "Authority { .. }");
    }

    #[test]
    fn written_files_are_private_even_when_they_existed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("key.pem");
        fs::write(&path, "old").unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).unwrap();
        write_private(&path, "new").unwrap();
        assert_eq!(fs::read_to_string(&path).unwrap(), "new");
        let mode = fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
    }
}

//! A throwaway PKI for one libvirtd instance, with the file names virsh's `?pkipath=` expects.

use std::fmt;
use std::fs;
use std::net::{IpAddr, Ipv4Addr};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use anyhow::{Context, Result};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType, date_time_ymd,
};

pub(crate) const CA_CERT: &str = "cacert.pem";
pub(crate) const SERVER_CERT: &str = "servercert.pem";
pub(crate) const SERVER_KEY: &str = "serverkey.pem";
pub(crate) const CLIENT_CERT: &str = "clientcert.pem";
pub(crate) const CLIENT_KEY: &str = "clientkey.pem";

/// A certificate authority that can issue leaf certificates.
pub(crate) struct Authority {
    issuer: Issuer<'static, KeyPair>,
    cert_pem: String,
}

impl fmt::Debug for Authority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The signing key stays out of test output.
        f.debug_struct("Authority").finish_non_exhaustive()
    }
}

#[derive(Clone, Copy, Debug)]
enum Role {
    Server,
    Client,
}

impl Authority {
    pub(crate) fn new(common_name: &str) -> Result<Self> {
        let key = KeyPair::generate().context("generate CA key")?;
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        // libvirt refuses a CA whose key usage lacks certificate signing.
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        set_validity(&mut params);
        let cert = params.self_signed(&key).context("self-sign CA")?;
        Ok(Self {
            issuer: Issuer::new(params, key),
            cert_pem: cert.pem(),
        })
    }

    pub(crate) fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// Returns (certificate PEM, PKCS#8 key PEM).
    fn issue(&self, common_name: &str, role: Role) -> Result<(String, String)> {
        let key = KeyPair::generate().context("generate leaf key")?;
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        params
            .distinguished_name
            .push(DnType::OrganizationName, "banlieue tests");
        params.is_ca = IsCa::ExplicitNoCa;
        // libvirt checks both bits when key usage is critical (rcgen marks it so), even for
        // ECDSA keys that never encipher.
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.use_authority_key_identifier_extension = true;
        match role {
            Role::Server => {
                params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
                params.subject_alt_names = vec![
                    SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST)),
                    SanType::DnsName("localhost".try_into()?),
                ];
            }
            Role::Client => {
                params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
            }
        }
        set_validity(&mut params);
        let cert = params
            .signed_by(&key, &self.issuer)
            .with_context(|| format!("sign {common_name} certificate"))?;
        Ok((cert.pem(), key.serialize_pem()))
    }

    /// Writes `cacert.pem`, `servercert.pem`, `serverkey.pem`, `clientcert.pem` and
    /// `clientkey.pem` into `dir`: what libvirtd's `*_file` settings and virsh's `pkipath` read.
    pub(crate) fn write_instance_files(&self, dir: &Path) -> Result<()> {
        create_private_dir(dir)?;
        let (server_cert, server_key) = self.issue("banlieue test libvirtd", Role::Server)?;
        let (client_cert, client_key) = self.issue("banlieue test client", Role::Client)?;
        write(dir, CA_CERT, &self.cert_pem)?;
        write(dir, SERVER_CERT, &server_cert)?;
        write(dir, SERVER_KEY, &server_key)?;
        write(dir, CLIENT_CERT, &client_cert)?;
        write(dir, CLIENT_KEY, &client_key)
    }

    /// Writes a client cert and key issued by this authority, next to `trusted_ca_pem` as
    /// `cacert.pem`, so a client using `dir` trusts the server but presents this CA's cert.
    pub(crate) fn write_client_files(&self, dir: &Path, trusted_ca_pem: &str) -> Result<()> {
        create_private_dir(dir)?;
        let (client_cert, client_key) = self.issue("banlieue other client", Role::Client)?;
        write(dir, CA_CERT, trusted_ca_pem)?;
        write(dir, CLIENT_CERT, &client_cert)?;
        write(dir, CLIENT_KEY, &client_key)
    }
}

fn set_validity(params: &mut CertificateParams) {
    // Fixed and wide, so a test machine's clock never makes the PKI "not yet valid".
    params.not_before = date_time_ymd(2000, 1, 1);
    params.not_after = date_time_ymd(2099, 12, 31);
}

fn create_private_dir(dir: &Path) -> Result<()> {
    fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    fs::set_permissions(dir, fs::Permissions::from_mode(0o700))
        .with_context(|| format!("chmod {}", dir.display()))
}

fn write(dir: &Path, name: &str, pem: &str) -> Result<()> {
    let path = dir.join(name);
    fs::write(&path, pem).with_context(|| format!("write {}", path.display()))?;
    fs::set_permissions(&path, fs::Permissions::from_mode(0o600))
        .with_context(|| format!("chmod {}", path.display()))
}

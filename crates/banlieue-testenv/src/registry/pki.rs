//! A throwaway PKI for one registry: a CA and the serving certificate it signs for
//! `127.0.0.1` and `localhost`. ECDSA P-256, as the control plane's: fast to generate, and
//! accepted by Go's TLS stack, skopeo's and rustls.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DistinguishedName, DnType,
    ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose,
};

use super::Error;

/// The CA's file name in the certificate directory: skopeo and containers' `certs.d` take
/// every `*.crt` there as a CA (and `*.cert` + `*.key` as a client certificate).
pub(crate) const CA_FILE: &str = "ca.crt";

/// What [`generate`] wrote.
#[derive(Debug)]
pub(crate) struct Pki {
    /// `<cert_dir>/ca.crt`, alone in its directory so `--dest-cert-dir` picks up nothing else.
    pub ca_cert: PathBuf,
    pub ca_pem: String,
    pub ca_der: Vec<u8>,
    pub cert_dir: PathBuf,
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
}

/// Writes the CA into `cert_dir` and the serving certificate and key into `server_dir`.
pub(crate) fn generate(cert_dir: &Path, server_dir: &Path) -> Result<Pki, Error> {
    for dir in [cert_dir, server_dir] {
        std::fs::create_dir_all(dir).map_err(|source| Error::io("create the PKI dir", source))?;
    }
    let mut ca_params = CertificateParams::default();
    ca_params.distinguished_name = common_name("banlieue test registry CA");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let issuer = CertifiedIssuer::self_signed(ca_params, KeyPair::generate()?)?;

    let mut server_params =
        CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()])?;
    server_params.distinguished_name = common_name("127.0.0.1");
    server_params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    server_params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    let server_key = KeyPair::generate()?;
    let server = server_params.signed_by(&server_key, &issuer)?;

    let pki = Pki {
        ca_cert: cert_dir.join(CA_FILE),
        ca_pem: issuer.pem(),
        ca_der: issuer.der().to_vec(),
        cert_dir: cert_dir.to_owned(),
        server_cert: server_dir.join("server.crt"),
        server_key: server_dir.join("server.key"),
    };
    write(&pki.ca_cert, &pki.ca_pem)?;
    write(&pki.server_cert, &server.pem())?;
    write(&pki.server_key, &server_key.serialize_pem())?;
    Ok(pki)
}

fn common_name(name: &str) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, name);
    dn
}

fn write(path: &Path, contents: &str) -> Result<(), Error> {
    std::fs::write(path, contents).map_err(|source| Error::io("write PKI files", source))
}

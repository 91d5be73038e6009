//! A throwaway PKI for one control plane: one CA signs the apiserver's serving certificate and
//! every client certificate (the apiserver's `--client-ca-file`), plus the service-account
//! signing key. ECDSA P-256 throughout: fast to generate, and accepted by every component.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DistinguishedName, DnType,
    ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose,
};

use super::Error;

/// Files of a certificate and its key.
#[derive(Debug, Clone)]
pub(crate) struct CertFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// The PKI written under one directory.
#[derive(Debug)]
pub(crate) struct Pki {
    pub ca: CertFiles,
    pub serving: CertFiles,
    pub service_account_key: PathBuf,
    pub service_account_public_key: PathBuf,
    dir: PathBuf,
    issuer: CertifiedIssuer<'static, KeyPair>,
}

impl Pki {
    pub(crate) fn generate(dir: &Path) -> Result<Self, Error> {
        std::fs::create_dir_all(dir).map_err(|source| Error::io("create the PKI dir", source))?;

        let mut ca_params = CertificateParams::default();
        ca_params.distinguished_name = name("banlieue-test-ca", None);
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca_key = KeyPair::generate()?;
        let ca_key_pem = ca_key.serialize_pem();
        let issuer = CertifiedIssuer::self_signed(ca_params, ca_key)?;
        let ca = CertFiles {
            cert: dir.join("ca.crt"),
            key: dir.join("ca.key"),
        };
        write(&ca.cert, &issuer.pem())?;
        write(&ca.key, &ca_key_pem)?;

        let mut serving_params = CertificateParams::new(vec![
            "127.0.0.1".to_owned(),
            "localhost".to_owned(),
            // The in-cluster names and the first service IP, for clients inside the cluster.
            "kubernetes".to_owned(),
            "kubernetes.default".to_owned(),
            "kubernetes.default.svc".to_owned(),
            "10.0.0.1".to_owned(),
        ])?;
        serving_params.distinguished_name = name("kube-apiserver", None);
        serving_params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        serving_params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        let serving = CertFiles {
            cert: dir.join("apiserver.crt"),
            key: dir.join("apiserver.key"),
        };
        let serving_key = KeyPair::generate()?;
        write(
            &serving.cert,
            &serving_params.signed_by(&serving_key, &issuer)?.pem(),
        )?;
        write(&serving.key, &serving_key.serialize_pem())?;

        let sa_key = KeyPair::generate()?;
        let service_account_key = dir.join("service-account.key");
        let service_account_public_key = dir.join("service-account.pub");
        write(&service_account_key, &sa_key.serialize_pem())?;
        write(&service_account_public_key, &sa_key.public_key_pem())?;

        Ok(Self {
            ca,
            serving,
            service_account_key,
            service_account_public_key,
            dir: dir.to_owned(),
            issuer,
        })
    }

    /// A client certificate for `user`, in `group` if given: the apiserver takes the user from
    /// the common name and the groups from the organizations (rcgen writes at most one).
    pub(crate) fn client(&self, user: &str, group: Option<&str>) -> Result<CertFiles, Error> {
        let mut params = CertificateParams::default();
        params.distinguished_name = name(user, group);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        let key = KeyPair::generate()?;
        let file_stem = user.replace(':', "-");
        let files = CertFiles {
            cert: self.dir.join(format!("{file_stem}.crt")),
            key: self.dir.join(format!("{file_stem}.key")),
        };
        write(&files.cert, &params.signed_by(&key, &self.issuer)?.pem())?;
        write(&files.key, &key.serialize_pem())?;
        Ok(files)
    }
}

impl Pki {
    /// A serving certificate for `names` (IP addresses or DNS names), written as
    /// `<file_stem>.crt` and `.key`.
    pub(crate) fn serving(&self, file_stem: &str, names: &[&str]) -> Result<CertFiles, Error> {
        let mut params =
            CertificateParams::new(names.iter().map(|&n| n.to_owned()).collect::<Vec<_>>())?;
        params.distinguished_name = name(names.first().copied().unwrap_or(file_stem), None);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        let key = KeyPair::generate()?;
        let files = CertFiles {
            cert: self.dir.join(format!("{file_stem}.crt")),
            key: self.dir.join(format!("{file_stem}.key")),
        };
        write(&files.cert, &params.signed_by(&key, &self.issuer)?.pem())?;
        write(&files.key, &key.serialize_pem())?;
        Ok(files)
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

fn write(path: &Path, contents: &str) -> Result<(), Error> {
    std::fs::write(path, contents).map_err(|source| Error::io("write PKI files", source))
}

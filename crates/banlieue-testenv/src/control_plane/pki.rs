//! The PKI of one control plane, on [`crate::pki`]: one CA signs the apiserver's serving
//! certificate and every client certificate (the apiserver's `--client-ca-file`), plus the
//! service-account signing key.

use std::path::{Path, PathBuf};

use rcgen::KeyPair;

use super::Error;
use crate::pki::{Authority, Leaf, Usage, create_private_dir, write_private};

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
    authority: Authority,
}

/// The apiserver's names: loopback, and the in-cluster names and first service IP for clients
/// inside the cluster.
const APISERVER_NAMES: [&str; 6] = [
    "127.0.0.1",
    "localhost",
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "10.0.0.1",
];

impl Pki {
    pub(crate) fn generate(dir: &Path) -> Result<Self, Error> {
        create_private_dir(dir).map_err(|source| Error::io("create the PKI dir", source))?;
        let authority = Authority::new("banlieue-test-ca")?;
        let ca = CertFiles {
            cert: dir.join("ca.crt"),
            key: dir.join("ca.key"),
        };
        write(&ca.cert, authority.cert_pem())?;
        write(&ca.key, authority.key_pem())?;
        let sa_key = KeyPair::generate()?;
        let service_account_key = dir.join("service-account.key");
        let service_account_public_key = dir.join("service-account.pub");
        write(&service_account_key, &sa_key.serialize_pem())?;
        write(&service_account_public_key, &sa_key.public_key_pem())?;
        let serving = write_leaf(&authority, dir, "apiserver", serving_leaf(&APISERVER_NAMES))?;
        Ok(Self {
            ca,
            serving,
            service_account_key,
            service_account_public_key,
            dir: dir.to_owned(),
            authority,
        })
    }

    /// A client certificate for `user`, in `group` if given: the apiserver takes the user from
    /// the common name and the groups from the organizations (rcgen writes at most one).
    pub(crate) fn client(&self, user: &str, group: Option<&str>) -> Result<CertFiles, Error> {
        let leaf = Leaf {
            common_name: user,
            organization: group,
            usage: Usage::Client,
        };
        write_leaf(&self.authority, &self.dir, &user.replace(':', "-"), leaf)
    }

    /// A serving certificate for `names` (IP addresses or DNS names), written as
    /// `<file_stem>.crt` and `.key`.
    pub(crate) fn serving(&self, file_stem: &str, names: &[&str]) -> Result<CertFiles, Error> {
        let leaf = Leaf {
            common_name: names.first().copied().unwrap_or(file_stem),
            ..serving_leaf(names)
        };
        write_leaf(&self.authority, &self.dir, file_stem, leaf)
    }
}

/// A serving leaf for `names`, named after the first.
fn serving_leaf<'a>(names: &'a [&'a str]) -> Leaf<'a> {
    Leaf {
        common_name: names.first().copied().unwrap_or_default(),
        organization: None,
        usage: Usage::Server(names),
    }
}

/// Issues `leaf` and writes it as `<file_stem>.crt` and `.key` under `dir`.
fn write_leaf(
    authority: &Authority,
    dir: &Path,
    file_stem: &str,
    leaf: Leaf<'_>,
) -> Result<CertFiles, Error> {
    let issued = authority.issue(leaf)?;
    let files = CertFiles {
        cert: dir.join(format!("{file_stem}.crt")),
        key: dir.join(format!("{file_stem}.key")),
    };
    write(&files.cert, &issued.cert_pem)?;
    write(&files.key, &issued.key_pem)?;
    Ok(files)
}

fn write(path: &Path, contents: &str) -> Result<(), Error> {
    write_private(path, contents).map_err(|source| Error::io("write PKI files", source))
}

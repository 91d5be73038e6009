//! A serving PKI on [`crate::pki`] for one registry (also the OIDC issuer's and vcsim's): a
//! CA, and the certificate it signs for `127.0.0.1` and `localhost`.

use std::path::{Path, PathBuf};

use super::Error;
use crate::pki::{Authority, Leaf, Usage, create_private_dir, write_private};

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
        create_private_dir(dir).map_err(|source| Error::io("create the PKI dir", source))?;
    }
    let authority = Authority::new("banlieue test registry CA")?;
    let server = authority.issue(Leaf {
        common_name: "127.0.0.1",
        organization: None,
        usage: Usage::Server(&["127.0.0.1", "localhost"]),
    })?;
    let pki = Pki {
        ca_cert: cert_dir.join(CA_FILE),
        ca_pem: authority.cert_pem().to_owned(),
        ca_der: authority.cert_der().to_vec(),
        cert_dir: cert_dir.to_owned(),
        server_cert: server_dir.join("server.crt"),
        server_key: server_dir.join("server.key"),
    };
    write(&pki.ca_cert, &pki.ca_pem)?;
    write(&pki.server_cert, &server.cert_pem)?;
    write(&pki.server_key, &server.key_pem)?;
    Ok(pki)
}

fn write(path: &Path, contents: &str) -> Result<(), Error> {
    write_private(path, contents).map_err(|source| Error::io("write PKI files", source))
}

//! The PKI of one libvirtd instance, on [`crate::pki`], with the file names libvirtd's `*_file`
//! settings and virsh's `?pkipath=` expect.

use std::path::Path;

use super::{Error, Result};
use crate::pki::{Authority, Leaf, Usage, create_private_dir, write_private};

pub(crate) const CA_CERT: &str = "cacert.pem";
pub(crate) const SERVER_CERT: &str = "servercert.pem";
pub(crate) const SERVER_KEY: &str = "serverkey.pem";
pub(crate) const CLIENT_CERT: &str = "clientcert.pem";
pub(crate) const CLIENT_KEY: &str = "clientkey.pem";

const ORGANIZATION: Option<&str> = Some("banlieue tests");

/// Writes `cacert.pem`, `servercert.pem`, `serverkey.pem`, `clientcert.pem` and
/// `clientkey.pem`, issued by `authority`, into `dir`.
pub(crate) fn write_instance_files(authority: &Authority, dir: &Path) -> Result<()> {
    let server = authority.issue(Leaf {
        common_name: "banlieue test libvirtd",
        organization: ORGANIZATION,
        usage: Usage::Server(&["127.0.0.1", "localhost"]),
    })?;
    create_private_dir(dir)
        .map_err(|source| Error::io(format!("create {}", dir.display()), source))?;
    write(dir, CA_CERT, authority.cert_pem())?;
    write(dir, SERVER_CERT, &server.cert_pem)?;
    write(dir, SERVER_KEY, &server.key_pem)?;
    write_client(authority, dir, "banlieue test client")
}

/// Writes a client certificate and key issued by `authority` into `dir`, beside
/// `trusted_ca_pem` as `cacert.pem`: a client using `dir` trusts the server but presents
/// `authority`'s certificate.
pub(crate) fn write_client_files(
    authority: &Authority,
    dir: &Path,
    trusted_ca_pem: &str,
) -> Result<()> {
    create_private_dir(dir)
        .map_err(|source| Error::io(format!("create {}", dir.display()), source))?;
    write(dir, CA_CERT, trusted_ca_pem)?;
    write_client(authority, dir, "banlieue other client")
}

fn write_client(authority: &Authority, dir: &Path, common_name: &str) -> Result<()> {
    let client = authority.issue(Leaf {
        common_name,
        organization: ORGANIZATION,
        usage: Usage::Client,
    })?;
    write(dir, CLIENT_CERT, &client.cert_pem)?;
    write(dir, CLIENT_KEY, &client.key_pem)
}

fn write(dir: &Path, name: &str, pem: &str) -> Result<()> {
    let path = dir.join(name);
    write_private(&path, pem)
        .map_err(|source| Error::io(format!("write {}", path.display()), source))
}

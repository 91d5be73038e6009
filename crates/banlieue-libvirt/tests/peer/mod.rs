//! Shared helpers for the tests against a real libvirtd.
#![allow(dead_code)]

use banlieue_libvirt::{CaBundle, Client, Identity};
use banlieue_testenv::libvirtd::{Libvirtd, LibvirtdOptions};

/// A started daemon, or `None` (after a loud message) when it is not installed and
/// `BANLIEUE_ALLOW_MISSING_PEERS=1`.
pub async fn daemon(options: LibvirtdOptions) -> Option<Libvirtd> {
    if !Libvirtd::available().expect("libvirtd is installed (run scripts/setup)") {
        return None;
    }
    Some(Libvirtd::start(options).await.expect("libvirtd starts"))
}

pub fn identity(d: &Libvirtd) -> (Identity, CaBundle) {
    let id =
        Identity::from_files(&d.client_cert_path(), &d.client_key_path()).expect("client identity");
    let ca = CaBundle::from_file(&d.ca_cert_path()).expect("CA");
    (id, ca)
}

pub async fn connect(d: &Libvirtd) -> Client {
    let (id, ca) = identity(d);
    Client::connect(&d.tls_uri(), &id, &ca)
        .await
        .expect("connects")
}

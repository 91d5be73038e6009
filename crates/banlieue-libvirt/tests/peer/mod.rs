//! Shared helpers for the tests against a real libvirtd.
#![allow(dead_code)]

use banlieue_libvirt::{CaBundle, Client, Identity, StoragePool, flags};
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

/// A guest with no disk and no display: enough for define, start and destroy under TCG. It has
/// a guest-agent channel that no agent will ever open.
pub fn tiny_domain_xml(name: &str) -> String {
    format!(
        "<domain type='qemu'><name>{name}</name><memory unit='MiB'>64</memory><vcpu>1</vcpu>\
         <os><type arch='x86_64' machine='pc'>hvm</type></os>\
         <devices><video><model type='none'/></video>\
         <interface type='user'><mac address='52:54:00:12:34:56'/><model type='virtio'/></interface>\
         <channel type='unix'><target type='virtio' name='org.qemu.guest_agent.0'/></channel>\
         </devices></domain>"
    )
}

pub async fn dir_pool(c: &Client, d: &Libvirtd, name: &str) -> StoragePool {
    let path = d.create_pool_dir(name).expect("pool dir");
    let xml = format!(
        "<pool type='dir'><name>{name}</name><target><path>{}</path></target></pool>",
        path.display()
    );
    let pool = StoragePool::define_xml(c, &xml)
        .await
        .expect("pool defined");
    pool.build().await.expect("built");
    pool.create(flags::StoragePoolCreateFlags::empty())
        .await
        .expect("started");
    pool
}

pub fn raw_volume_xml(name: &str, bytes: u64) -> String {
    format!(
        "<volume><name>{name}</name><capacity unit='bytes'>{bytes}</capacity><allocation>0</allocation><target><format type='raw'/></target></volume>"
    )
}

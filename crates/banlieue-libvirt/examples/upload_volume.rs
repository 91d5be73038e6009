//! Uploads a local file into a new raw volume of a storage pool, sending runs of zeros as
//! holes, and reads back its size on the host.
//!
//! ```text
//! cargo run -p banlieue-libvirt --example upload_volume -- \
//!     'qemu+tls://HOST/system?pkipath=DIR' POOL VOLUME FILE
//! ```

use std::path::PathBuf;

use banlieue_libvirt::flags::StorageVolCreateFlags;
use banlieue_libvirt::stream::TransferOptions;
use banlieue_libvirt::{CaBundle, Client, ConnectUri, Identity, StoragePool, StorageVol};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [uri, pool, volume, file] = args.as_slice() else {
        return Err("usage: upload_volume URI POOL VOLUME FILE".into());
    };
    let pki = PathBuf::from(
        ConnectUri::parse(uri)?
            .pkipath
            .ok_or("the URI needs ?pkipath=DIR")?,
    );
    let identity = Identity::from_files(&pki.join("clientcert.pem"), &pki.join("clientkey.pem"))?;
    let ca = CaBundle::from_file(&pki.join("cacert.pem"))?;
    let client = Client::connect(uri, &identity, &ca).await?;

    let pool = StoragePool::lookup_by_name(&client, pool)
        .await?
        .ok_or_else(|| format!("no storage pool {pool:?}"))?;
    let mut source = tokio::fs::File::open(file).await?;
    let length = source.metadata().await?.len();
    let xml = format!(
        "<volume><name>{volume}</name><capacity unit='bytes'>{length}</capacity>\
         <allocation>0</allocation><target><format type='raw'/></target></volume>"
    );
    let vol = StorageVol::create_xml(&pool, &xml, StorageVolCreateFlags::empty()).await?;
    let sent = vol
        .upload(
            &mut source,
            TransferOptions::new().length(length).sparse(true),
        )
        .await?;
    let info = vol.get_info().await?;
    println!(
        "{}: {} bytes sent as data, {} as holes; capacity {}, allocated {} at {}",
        vol.name(),
        sent.data,
        sent.holes,
        info.capacity,
        info.allocation,
        vol.get_path().await?
    );
    client.close().await?;
    Ok(())
}

//! The few storage calls an import needs, over `banlieue-libvirt`'s generated procedures.

use banlieue_libvirt::Client;
use banlieue_libvirt::flags::{StorageVolDownloadFlags, StorageVolUploadFlags};
use banlieue_libvirt::proto::remote::{
    self, RemoteNonnullStoragePool, RemoteNonnullStorageVol, procedures as rp,
};
use banlieue_libvirt::stream;

use super::error::{Error, Result};

/// Looks a pool up by name; `None` when the host has no such pool.
pub async fn lookup_pool(client: &Client, name: &str) -> Result<Option<RemoteNonnullStoragePool>> {
    let args = remote::RemoteStoragePoolLookupByNameArgs { name: name.into() };
    match client.call::<rp::StoragePoolLookupByName>(&args).await {
        Ok(ret) => Ok(Some(ret.pool)),
        Err(e) if e.is_not_found() => Ok(None),
        Err(e) => Err(Error::libvirt(format!("look up storage pool {name}"), e)),
    }
}

/// Looks a volume up in `pool`; `None` when it is not there.
pub async fn lookup_volume(
    client: &Client,
    pool: &RemoteNonnullStoragePool,
    name: &str,
) -> Result<Option<RemoteNonnullStorageVol>> {
    let args = remote::RemoteStorageVolLookupByNameArgs {
        pool: pool.clone(),
        name: name.into(),
    };
    match client.call::<rp::StorageVolLookupByName>(&args).await {
        Ok(ret) => Ok(Some(ret.vol)),
        Err(e) if e.is_not_found() => Ok(None),
        Err(e) => Err(Error::libvirt(
            format!("look up volume {name} in pool {}", pool.name),
            e,
        )),
    }
}

/// The volume's capacity in bytes.
pub async fn capacity(client: &Client, vol: &RemoteNonnullStorageVol) -> Result<u64> {
    let args = remote::RemoteStorageVolGetInfoArgs { vol: vol.clone() };
    client
        .call::<rp::StorageVolGetInfo>(&args)
        .await
        .map(|info| info.capacity)
        .map_err(|e| Error::libvirt(format!("read volume {}", vol.name), e))
}

/// Creates a raw volume of `capacity` bytes with nothing allocated, so holes the upload skips
/// stay holes.
pub async fn create_raw(
    client: &Client,
    pool: &RemoteNonnullStoragePool,
    name: &str,
    capacity: u64,
) -> Result<RemoteNonnullStorageVol> {
    let xml = crate::volume_xml::raw(name, capacity);
    let args = remote::RemoteStorageVolCreateXmlArgs {
        pool: pool.clone(),
        xml,
        flags: 0,
    };
    client
        .call::<rp::StorageVolCreateXml>(&args)
        .await
        .map(|ret| ret.vol)
        .map_err(|e| Error::libvirt(format!("create volume {name} in pool {}", pool.name), e))
}

/// Deletes a volume; one already gone counts as deleted.
pub async fn delete(client: &Client, vol: &RemoteNonnullStorageVol) -> Result<()> {
    let args = remote::RemoteStorageVolDeleteArgs {
        vol: vol.clone(),
        flags: 0,
    };
    match client.call::<rp::StorageVolDelete>(&args).await {
        Ok(()) => Ok(()),
        Err(e) if e.is_not_found() => Ok(()),
        Err(e) => Err(Error::libvirt(format!("delete volume {}", vol.name), e)),
    }
}

/// Reads a small volume whole, refusing one larger than `max` bytes.
pub async fn read_small(
    client: &Client,
    vol: &RemoteNonnullStorageVol,
    max: u64,
) -> Result<Vec<u8>> {
    let size = capacity(client, vol).await?;
    if size > max || size == 0 {
        return Ok(Vec::new());
    }
    let mut bytes = Vec::with_capacity(size as usize);
    // Asking for exactly `size` bytes makes the download refuse anything past them, so a
    // server that lies about the capacity cannot grow this buffer beyond `max`.
    stream::download_range(
        client,
        vol,
        &mut bytes,
        0,
        size,
        StorageVolDownloadFlags::empty(),
        |_| {},
    )
    .await
    .map_err(|e| Error::libvirt(format!("download volume {}", vol.name), e))?;
    Ok(bytes)
}

/// Creates a volume holding exactly `bytes`.
pub async fn write_small(
    client: &Client,
    pool: &RemoteNonnullStoragePool,
    name: &str,
    bytes: &[u8],
) -> Result<()> {
    let vol = create_raw(client, pool, name, bytes.len() as u64).await?;
    let mut source = bytes;
    stream::upload(
        client,
        &vol,
        &mut source,
        bytes.len() as u64,
        StorageVolUploadFlags::empty(),
        |_| {},
    )
    .await
    .map_err(|e| Error::libvirt(format!("upload volume {name}"), e))?;
    Ok(())
}

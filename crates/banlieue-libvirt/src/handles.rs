//! Typed handles over the generated procedures: the calls the libvirt provider makes, with
//! names from libvirt's C API (`virDomainDefineXML` → [`Domain::define_xml`]). A handle is a
//! client clone plus libvirt's reference to the object (name, UUID, and for a domain its id at
//! lookup time); it is cheap to clone and stays valid as long as the object exists.
//!
//! Lookups return `Ok(None)` when the object does not exist; every other failure is an error.
//!
//! ```no_run
//! # async fn demo(client: banlieue_libvirt::Client, xml: String) -> banlieue_libvirt::Result<()> {
//! use banlieue_libvirt::{flags, Domain, DomainState, StoragePool, StorageVol};
//!
//! let dom = Domain::define_xml(&client, &xml).await?;
//! dom.create().await?;
//! assert_eq!(dom.get_state().await?.0, DomainState::RUNNING);
//! dom.destroy_if_running().await?;
//! dom.undefine_flags(flags::DOMAIN_UNDEFINE_NVRAM | flags::DOMAIN_UNDEFINE_TPM).await?;
//! assert!(Domain::lookup_by_name(&client, dom.name()).await?.is_none());
//!
//! if let Some(pool) = StoragePool::lookup_by_name(&client, "images").await? {
//!     if let Some(vol) = StorageVol::lookup_by_name(&pool, "base.qcow2").await? {
//!         let mut out = Vec::new();
//!         vol.download(&mut out, 0, 0, true).await?;
//!     }
//! }
//! # Ok(()) }
//! ```

use tokio::io::{AsyncRead, AsyncWrite};

use crate::client::Client;
use crate::error::{ErrorCode, Result};
use crate::proto::qemu::{self, procedures as qp};
use crate::proto::remote::{self, procedures as rp};
use crate::stream::{self, Transfer};

/// `Ok(None)` for a libvirt "not found" error.
fn found<T>(r: Result<T>) -> Result<Option<T>> {
    match r {
        Ok(v) => Ok(Some(v)),
        Err(e) if e.is_not_found() => Ok(None),
        Err(e) => Err(e),
    }
}

/// `virDomainState`, a newtype so states this version does not name survive.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DomainState(pub i32);

impl DomainState {
    pub const NOSTATE: DomainState = DomainState(0);
    pub const RUNNING: DomainState = DomainState(1);
    pub const BLOCKED: DomainState = DomainState(2);
    pub const PAUSED: DomainState = DomainState(3);
    pub const SHUTDOWN: DomainState = DomainState(4);
    pub const SHUTOFF: DomainState = DomainState(5);
    pub const CRASHED: DomainState = DomainState(6);
    pub const PMSUSPENDED: DomainState = DomainState(7);

    /// virsh's word for the state (`running`, `shut off`, …).
    pub fn name(self) -> Option<&'static str> {
        Some(match self.0 {
            0 => "no state",
            1 => "running",
            2 => "idle",
            3 => "paused",
            4 => "in shutdown",
            5 => "shut off",
            6 => "crashed",
            7 => "pmsuspended",
            _ => return None,
        })
    }
}

impl std::fmt::Debug for DomainState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.name() {
            Some(n) => write!(f, "DomainState({n})"),
            None => write!(f, "DomainState({})", self.0),
        }
    }
}

/// One address of a guest interface (`virDomainIPAddress`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpAddress {
    /// `VIR_IP_ADDR_TYPE_IPV4` (0) or `VIR_IP_ADDR_TYPE_IPV6` (1).
    pub kind: i32,
    pub addr: String,
    pub prefix: u32,
}

/// One guest interface and its addresses (`virDomainInterface`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InterfaceAddresses {
    pub name: String,
    pub hwaddr: Option<String>,
    pub addrs: Vec<IpAddress>,
}

/// A domain (`virDomainPtr`).
#[derive(Debug, Clone)]
pub struct Domain {
    client: Client,
    raw: remote::RemoteNonnullDomain,
}

impl Domain {
    /// Wraps a reference the protocol returned.
    pub fn from_raw(client: &Client, raw: remote::RemoteNonnullDomain) -> Domain {
        Domain {
            client: client.clone(),
            raw,
        }
    }

    pub fn name(&self) -> &str {
        &self.raw.name
    }

    pub fn uuid(&self) -> [u8; 16] {
        self.raw.uuid
    }

    /// The UUID in its usual text form.
    pub fn uuid_string(&self) -> String {
        uuid_string(&self.raw.uuid)
    }

    /// The id at lookup time (`-1` when the domain was not running).
    pub fn id(&self) -> i32 {
        self.raw.id
    }

    pub fn raw(&self) -> &remote::RemoteNonnullDomain {
        &self.raw
    }

    pub fn client(&self) -> &Client {
        &self.client
    }

    /// `virDomainLookupByName`; `None` when there is no such domain.
    pub async fn lookup_by_name(client: &Client, name: &str) -> Result<Option<Domain>> {
        let r = client
            .call::<rp::DomainLookupByName>(&remote::RemoteDomainLookupByNameArgs {
                name: name.to_string(),
            })
            .await;
        Ok(found(r)?.map(|r| Domain::from_raw(client, r.dom)))
    }

    /// `virDomainDefineXML`: defines (or redefines) a persistent domain.
    pub async fn define_xml(client: &Client, xml: &str) -> Result<Domain> {
        let r = client
            .call::<rp::DomainDefineXml>(&remote::RemoteDomainDefineXmlArgs {
                xml: xml.to_string(),
            })
            .await?;
        Ok(Domain::from_raw(client, r.dom))
    }

    /// `virConnectListAllDomains` with `flags` (`flags::CONNECT_LIST_DOMAINS_*`, 0 for all).
    pub async fn list_all(client: &Client, flags: u32) -> Result<Vec<Domain>> {
        let r = client
            .call::<rp::ConnectListAllDomains>(&remote::RemoteConnectListAllDomainsArgs {
                need_results: 1,
                flags,
            })
            .await?;
        Ok(r.domains
            .into_iter()
            .map(|d| Domain::from_raw(client, d))
            .collect())
    }

    /// `virDomainCreate`: starts a defined domain.
    pub async fn create(&self) -> Result<()> {
        self.client
            .call::<rp::DomainCreate>(&remote::RemoteDomainCreateArgs {
                dom: self.raw.clone(),
            })
            .await
    }

    /// `virDomainDestroy`: stops the domain at once; fails with `OPERATION_INVALID` when it is
    /// not running.
    pub async fn destroy(&self) -> Result<()> {
        self.client
            .call::<rp::DomainDestroy>(&remote::RemoteDomainDestroyArgs {
                dom: self.raw.clone(),
            })
            .await
    }

    /// [`Domain::destroy`] that accepts a domain that is not running; returns whether it was.
    pub async fn destroy_if_running(&self) -> Result<bool> {
        match self.destroy().await {
            Ok(()) => Ok(true),
            Err(e) if e.remote().map(|r| r.code) == Some(ErrorCode::OPERATION_INVALID) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// `virDomainUndefineFlags` (`flags::DOMAIN_UNDEFINE_*`).
    pub async fn undefine_flags(&self, flags: u32) -> Result<()> {
        self.client
            .call::<rp::DomainUndefineFlags>(&remote::RemoteDomainUndefineFlagsArgs {
                dom: self.raw.clone(),
                flags,
            })
            .await
    }

    /// `virDomainGetXMLDesc` (`flags::DOMAIN_XML_*`).
    pub async fn get_xml_desc(&self, flags: u32) -> Result<String> {
        let r = self
            .client
            .call::<rp::DomainGetXmlDesc>(&remote::RemoteDomainGetXmlDescArgs {
                dom: self.raw.clone(),
                flags,
            })
            .await?;
        Ok(r.xml)
    }

    /// `virDomainGetState`: the state and its reason (a `virDomain<State>Reason` value).
    pub async fn get_state(&self) -> Result<(DomainState, i32)> {
        let r = self
            .client
            .call::<rp::DomainGetState>(&remote::RemoteDomainGetStateArgs {
                dom: self.raw.clone(),
                flags: 0,
            })
            .await?;
        Ok((DomainState(r.state), r.reason))
    }

    /// `virDomainInterfaceAddresses` from `source`
    /// (`flags::DOMAIN_INTERFACE_ADDRESSES_SRC_{LEASE,AGENT,ARP}`).
    pub async fn interface_addresses(&self, source: u32) -> Result<Vec<InterfaceAddresses>> {
        let r = self
            .client
            .call::<rp::DomainInterfaceAddresses>(&remote::RemoteDomainInterfaceAddressesArgs {
                dom: self.raw.clone(),
                source,
                flags: 0,
            })
            .await?;
        Ok(r.ifaces
            .into_iter()
            .map(|i| InterfaceAddresses {
                name: i.name,
                hwaddr: i.hwaddr,
                addrs: i
                    .addrs
                    .into_iter()
                    .map(|a| IpAddress {
                        kind: a.r#type,
                        addr: a.addr,
                        prefix: a.prefix,
                    })
                    .collect(),
            })
            .collect())
    }

    /// `virDomainQemuAgentCommand`: sends one JSON command to the QEMU guest agent and returns
    /// its JSON reply. `timeout_secs` is libvirt's: a positive number of seconds, or
    /// `flags::DOMAIN_AGENT_RESPONSE_TIMEOUT_{BLOCK,DEFAULT,NOWAIT}`.
    pub async fn agent_command(&self, json: &str, timeout_secs: i32) -> Result<String> {
        let r = self
            .client
            .call::<qp::DomainAgentCommand>(&qemu::QemuDomainAgentCommandArgs {
                dom: self.raw.clone(),
                cmd: json.to_string(),
                timeout: timeout_secs,
                flags: 0,
            })
            .await?;
        Ok(r.result.unwrap_or_default())
    }
}

/// A storage pool (`virStoragePoolPtr`).
#[derive(Debug, Clone)]
pub struct StoragePool {
    client: Client,
    raw: remote::RemoteNonnullStoragePool,
}

impl StoragePool {
    pub fn from_raw(client: &Client, raw: remote::RemoteNonnullStoragePool) -> StoragePool {
        StoragePool {
            client: client.clone(),
            raw,
        }
    }

    pub fn name(&self) -> &str {
        &self.raw.name
    }

    pub fn uuid(&self) -> [u8; 16] {
        self.raw.uuid
    }

    pub fn raw(&self) -> &remote::RemoteNonnullStoragePool {
        &self.raw
    }

    /// `virStoragePoolLookupByName`; `None` when there is no such pool.
    pub async fn lookup_by_name(client: &Client, name: &str) -> Result<Option<StoragePool>> {
        let r = client
            .call::<rp::StoragePoolLookupByName>(&remote::RemoteStoragePoolLookupByNameArgs {
                name: name.to_string(),
            })
            .await;
        Ok(found(r)?.map(|r| StoragePool::from_raw(client, r.pool)))
    }

    /// `virConnectListAllStoragePools` (`virConnectListAllStoragePoolsFlags`, 0 for all).
    pub async fn list_all(client: &Client, flags: u32) -> Result<Vec<StoragePool>> {
        let r = client
            .call::<rp::ConnectListAllStoragePools>(&remote::RemoteConnectListAllStoragePoolsArgs {
                need_results: 1,
                flags,
            })
            .await?;
        Ok(r.pools
            .into_iter()
            .map(|p| StoragePool::from_raw(client, p))
            .collect())
    }

    /// `virStoragePoolDefineXML`: defines a persistent pool (not built, not started).
    pub async fn define_xml(client: &Client, xml: &str) -> Result<StoragePool> {
        let r = client
            .call::<rp::StoragePoolDefineXml>(&remote::RemoteStoragePoolDefineXmlArgs {
                xml: xml.to_string(),
                flags: 0,
            })
            .await?;
        Ok(StoragePool::from_raw(client, r.pool))
    }

    /// `virStoragePoolBuild`: creates the pool's backing (for a dir pool, its directory).
    pub async fn build(&self) -> Result<()> {
        self.client
            .call::<rp::StoragePoolBuild>(&remote::RemoteStoragePoolBuildArgs {
                pool: self.raw.clone(),
                flags: 0,
            })
            .await
    }

    /// `virStoragePoolCreate`: starts a defined pool (`flags::STORAGE_POOL_CREATE_*`).
    pub async fn create(&self, flags: u32) -> Result<()> {
        self.client
            .call::<rp::StoragePoolCreate>(&remote::RemoteStoragePoolCreateArgs {
                pool: self.raw.clone(),
                flags,
            })
            .await
    }

    /// `virStoragePoolDestroy`: stops the pool; its volumes stay.
    pub async fn destroy(&self) -> Result<()> {
        self.client
            .call::<rp::StoragePoolDestroy>(&remote::RemoteStoragePoolDestroyArgs {
                pool: self.raw.clone(),
            })
            .await
    }

    /// `virStoragePoolUndefine`.
    pub async fn undefine(&self) -> Result<()> {
        self.client
            .call::<rp::StoragePoolUndefine>(&remote::RemoteStoragePoolUndefineArgs {
                pool: self.raw.clone(),
            })
            .await
    }

    /// `virStoragePoolRefresh`: rescans the pool's volumes.
    pub async fn refresh(&self) -> Result<()> {
        self.client
            .call::<rp::StoragePoolRefresh>(&remote::RemoteStoragePoolRefreshArgs {
                pool: self.raw.clone(),
                flags: 0,
            })
            .await
    }

    /// `virStoragePoolGetXMLDesc`.
    pub async fn get_xml_desc(&self, flags: u32) -> Result<String> {
        let r = self
            .client
            .call::<rp::StoragePoolGetXmlDesc>(&remote::RemoteStoragePoolGetXmlDescArgs {
                pool: self.raw.clone(),
                flags,
            })
            .await?;
        Ok(r.xml)
    }

    /// `virStoragePoolIsActive`.
    pub async fn is_active(&self) -> Result<bool> {
        let r = self
            .client
            .call::<rp::StoragePoolIsActive>(&remote::RemoteStoragePoolIsActiveArgs {
                pool: self.raw.clone(),
            })
            .await?;
        Ok(r.active != 0)
    }

    /// `virStoragePoolListAllVolumes`.
    pub async fn list_all_volumes(&self) -> Result<Vec<StorageVol>> {
        let r = self
            .client
            .call::<rp::StoragePoolListAllVolumes>(&remote::RemoteStoragePoolListAllVolumesArgs {
                pool: self.raw.clone(),
                need_results: 1,
                flags: 0,
            })
            .await?;
        Ok(r.vols
            .into_iter()
            .map(|v| StorageVol::from_raw(&self.client, v))
            .collect())
    }
}

/// `virStorageVolType`, a newtype so types this version does not name survive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct StorageVolType(pub i32);

impl StorageVolType {
    pub const FILE: StorageVolType = StorageVolType(0);
    pub const BLOCK: StorageVolType = StorageVolType(1);
    pub const DIR: StorageVolType = StorageVolType(2);
    pub const NETWORK: StorageVolType = StorageVolType(3);
    pub const NETDIR: StorageVolType = StorageVolType(4);
    pub const PLOOP: StorageVolType = StorageVolType(5);

    /// virsh's word for the type.
    pub fn name(self) -> Option<&'static str> {
        Some(match self.0 {
            0 => "file",
            1 => "block",
            2 => "dir",
            3 => "network",
            4 => "netdir",
            5 => "ploop",
            _ => return None,
        })
    }
}

/// `virStorageVolInfo`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StorageVolInfo {
    pub kind: StorageVolType,
    /// Logical size in bytes.
    pub capacity: u64,
    /// Bytes allocated on the host.
    pub allocation: u64,
}

/// A storage volume (`virStorageVolPtr`).
#[derive(Debug, Clone)]
pub struct StorageVol {
    client: Client,
    raw: remote::RemoteNonnullStorageVol,
}

impl StorageVol {
    pub fn from_raw(client: &Client, raw: remote::RemoteNonnullStorageVol) -> StorageVol {
        StorageVol {
            client: client.clone(),
            raw,
        }
    }

    pub fn name(&self) -> &str {
        &self.raw.name
    }

    /// The pool's name.
    pub fn pool(&self) -> &str {
        &self.raw.pool
    }

    /// libvirt's key (for a dir pool, the path).
    pub fn key(&self) -> &str {
        &self.raw.key
    }

    pub fn raw(&self) -> &remote::RemoteNonnullStorageVol {
        &self.raw
    }

    /// `virStorageVolLookupByName`; `None` when the pool has no such volume.
    pub async fn lookup_by_name(pool: &StoragePool, name: &str) -> Result<Option<StorageVol>> {
        let r = pool
            .client
            .call::<rp::StorageVolLookupByName>(&remote::RemoteStorageVolLookupByNameArgs {
                pool: pool.raw.clone(),
                name: name.to_string(),
            })
            .await;
        Ok(found(r)?.map(|r| StorageVol::from_raw(&pool.client, r.vol)))
    }

    /// `virStorageVolCreateXML` (`virStorageVolCreateFlags`).
    pub async fn create_xml(pool: &StoragePool, xml: &str, flags: u32) -> Result<StorageVol> {
        let r = pool
            .client
            .call::<rp::StorageVolCreateXml>(&remote::RemoteStorageVolCreateXmlArgs {
                pool: pool.raw.clone(),
                xml: xml.to_string(),
                flags,
            })
            .await?;
        Ok(StorageVol::from_raw(&pool.client, r.vol))
    }

    /// `virStorageVolDelete`.
    pub async fn delete(&self) -> Result<()> {
        self.client
            .call::<rp::StorageVolDelete>(&remote::RemoteStorageVolDeleteArgs {
                vol: self.raw.clone(),
                flags: 0,
            })
            .await
    }

    /// `virStorageVolGetInfo`.
    pub async fn get_info(&self) -> Result<StorageVolInfo> {
        let r = self
            .client
            .call::<rp::StorageVolGetInfo>(&remote::RemoteStorageVolGetInfoArgs {
                vol: self.raw.clone(),
            })
            .await?;
        Ok(StorageVolInfo {
            kind: StorageVolType(i32::from(r.r#type)),
            capacity: r.capacity,
            allocation: r.allocation,
        })
    }

    /// `virStorageVolGetPath`: the path on the host.
    pub async fn get_path(&self) -> Result<String> {
        let r = self
            .client
            .call::<rp::StorageVolGetPath>(&remote::RemoteStorageVolGetPathArgs {
                vol: self.raw.clone(),
            })
            .await?;
        Ok(r.name)
    }

    /// `virStorageVolGetXMLDesc`.
    pub async fn get_xml_desc(&self) -> Result<String> {
        let r = self
            .client
            .call::<rp::StorageVolGetXmlDesc>(&remote::RemoteStorageVolGetXmlDescArgs {
                vol: self.raw.clone(),
                flags: 0,
            })
            .await?;
        Ok(r.xml)
    }

    /// `virStorageVolUpload`: writes what `source` yields, `length` bytes from `offset`
    /// (`length` 0: to the end of `source`). With `sparse`, zero runs travel as holes.
    pub async fn upload<R: AsyncRead + Unpin>(
        &self,
        source: &mut R,
        offset: u64,
        length: u64,
        sparse: bool,
    ) -> Result<Transfer> {
        stream::upload_range(
            &self.client,
            &self.raw,
            source,
            offset,
            length,
            sparse,
            |_| {},
        )
        .await
    }

    /// `virStorageVolDownload`: `length` bytes from `offset` (0: to the end) into `sink`.
    /// With `sparse`, holes cross the network as lengths and are written here as zeros.
    pub async fn download<W: AsyncWrite + Unpin>(
        &self,
        sink: &mut W,
        offset: u64,
        length: u64,
        sparse: bool,
    ) -> Result<Transfer> {
        stream::download_range(
            &self.client,
            &self.raw,
            sink,
            offset,
            length,
            sparse,
            |_| {},
        )
        .await
    }

    /// [`StorageVol::download`] into a file, which it truncates first. A thread of its own
    /// writes the file while the next packets arrive; with `sparse`, holes become holes in the
    /// file rather than written zeros.
    pub async fn download_to_file(
        &self,
        file: tokio::fs::File,
        offset: u64,
        length: u64,
        sparse: bool,
    ) -> Result<Transfer> {
        stream::download_range_to_file(
            &self.client,
            &self.raw,
            file.into_std().await,
            offset,
            length,
            sparse,
            |_| {},
        )
        .await
    }
}

/// A virtual network (`virNetworkPtr`).
#[derive(Debug, Clone)]
pub struct Network {
    client: Client,
    raw: remote::RemoteNonnullNetwork,
}

impl Network {
    pub fn from_raw(client: &Client, raw: remote::RemoteNonnullNetwork) -> Network {
        Network {
            client: client.clone(),
            raw,
        }
    }

    pub fn name(&self) -> &str {
        &self.raw.name
    }

    pub fn uuid(&self) -> [u8; 16] {
        self.raw.uuid
    }

    pub fn raw(&self) -> &remote::RemoteNonnullNetwork {
        &self.raw
    }

    /// `virNetworkLookupByName`; `None` when there is no such network.
    pub async fn lookup_by_name(client: &Client, name: &str) -> Result<Option<Network>> {
        let r = client
            .call::<rp::NetworkLookupByName>(&remote::RemoteNetworkLookupByNameArgs {
                name: name.to_string(),
            })
            .await;
        Ok(found(r)?.map(|r| Network::from_raw(client, r.net)))
    }

    /// `virConnectListAllNetworks` (`virConnectListAllNetworksFlags`, 0 for all).
    pub async fn list_all(client: &Client, flags: u32) -> Result<Vec<Network>> {
        let r = client
            .call::<rp::ConnectListAllNetworks>(&remote::RemoteConnectListAllNetworksArgs {
                need_results: 1,
                flags,
            })
            .await?;
        Ok(r.nets
            .into_iter()
            .map(|n| Network::from_raw(client, n))
            .collect())
    }

    /// `virNetworkIsActive`.
    pub async fn is_active(&self) -> Result<bool> {
        let r = self
            .client
            .call::<rp::NetworkIsActive>(&remote::RemoteNetworkIsActiveArgs {
                net: self.raw.clone(),
            })
            .await?;
        Ok(r.active != 0)
    }
}

/// Connection-level calls.
impl Client {
    /// `virConnectGetVersion`: the hypervisor's version as `major * 1,000,000 + minor * 1,000
    /// + release` (QEMU 10.0.2 → 10000002).
    pub async fn version(&self) -> Result<u64> {
        Ok(self.call::<rp::ConnectGetVersion>(&()).await?.hv_ver)
    }

    /// `virConnectGetLibVersion`: the daemon's libvirt version, same encoding.
    pub async fn lib_version(&self) -> Result<u64> {
        Ok(self.call::<rp::ConnectGetLibVersion>(&()).await?.lib_ver)
    }

    /// `virConnectGetCapabilities`: the host's capabilities XML.
    pub async fn capabilities(&self) -> Result<String> {
        Ok(self
            .call::<rp::ConnectGetCapabilities>(&())
            .await?
            .capabilities)
    }

    /// `virConnectGetHostname`.
    pub async fn hostname(&self) -> Result<String> {
        Ok(self.call::<rp::ConnectGetHostname>(&()).await?.hostname)
    }

    /// [`Domain::list_all`].
    pub async fn list_all_domains(&self, flags: u32) -> Result<Vec<Domain>> {
        Domain::list_all(self, flags).await
    }

    /// [`StoragePool::list_all`].
    pub async fn list_all_storage_pools(&self, flags: u32) -> Result<Vec<StoragePool>> {
        StoragePool::list_all(self, flags).await
    }

    /// [`Network::list_all`].
    pub async fn list_all_networks(&self, flags: u32) -> Result<Vec<Network>> {
        Network::list_all(self, flags).await
    }
}

/// `xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`.
pub fn uuid_string(u: &[u8; 16]) -> String {
    let h: String = u.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

/// `major.minor.release` from libvirt's packed version number.
pub fn version_string(v: u64) -> String {
    format!("{}.{}.{}", v / 1_000_000, (v / 1_000) % 1_000, v % 1_000)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_and_uuids_print_like_virsh() {
        assert_eq!(version_string(11_003_000), "11.3.0");
        assert_eq!(version_string(10_000_002), "10.0.2");
        let u = [
            0x12, 0x34, 0x56, 0x78, 0x9a, 0xbc, 0xde, 0xf0, 0, 1, 2, 3, 4, 5, 6, 7,
        ];
        assert_eq!(uuid_string(&u), "12345678-9abc-def0-0001-020304050607");
        assert_eq!(DomainState::SHUTOFF.name(), Some("shut off"));
        assert_eq!(format!("{:?}", DomainState(42)), "DomainState(42)");
    }
}

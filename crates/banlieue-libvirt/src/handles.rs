//! Typed handles over the generated procedures: the calls the libvirt provider makes, with
//! names from libvirt's C API (`virDomainDefineXML` → [`Domain::define_xml`]). A handle is a
//! client clone plus libvirt's reference to the object (name, UUID, and for a domain its id at
//! lookup time); it is cheap to clone and stays valid as long as the object exists.
//!
//! Lookups return `Ok(None)` when the object does not exist; every other failure is an error.
//!
//! Each handle type carries an example.

use tokio::io::{AsyncRead, AsyncSeek, AsyncWrite};

use crate::client::Client;
use crate::error::{ErrorCode, Result};
use crate::events::MetadataType;
use crate::flags::{
    ConnectListAllDomainsFlags, ConnectListAllNetworksFlags, ConnectListAllStoragePoolsFlags,
    DomainModificationImpact, DomainSaveRestoreFlags, DomainSetTimeFlags, DomainUndefineFlags,
    DomainXmlFlags, StoragePoolCreateFlags, StorageVolCreateFlags, StorageXmlFlags,
};
use crate::proto::qemu::{self, procedures as qp};
use crate::proto::remote::{self, procedures as rp};
use crate::stream::{self, Transfer, TransferOptions};

/// `Ok(None)` for a libvirt "not found" error.
fn found<T>(r: Result<T>) -> Result<Option<T>> {
    match r {
        Ok(v) => Ok(Some(v)),
        Err(e) if e.is_not_found() => Ok(None),
        Err(e) => Err(e),
    }
}

open_enum! {
    /// `virDomainState`; `name()` is virsh's word for it.
    pub enum DomainState {
        /// No state.
        NoState = 0 => "no state",
        /// Running.
        Running = 1 => "running",
        /// Blocked on a resource.
        Blocked = 2 => "idle",
        /// Paused by the user.
        Paused = 3 => "paused",
        /// Being shut down.
        Shutdown = 4 => "in shutdown",
        /// Shut off.
        Shutoff = 5 => "shut off",
        /// Crashed.
        Crashed = 6 => "crashed",
        /// Suspended by guest power management.
        PmSuspended = 7 => "pmsuspended",
    }
}

open_enum! {
    /// `virIPAddrType`: the family of an [`IpAddress`].
    pub enum IpAddressType {
        /// `VIR_IP_ADDR_TYPE_IPV4`.
        Ipv4 = 0 => "ipv4",
        /// `VIR_IP_ADDR_TYPE_IPV6`.
        Ipv6 = 1 => "ipv6",
    }
}

open_enum! {
    /// `virDomainInterfaceAddressesSource`: where [`Domain::interface_addresses`] looks.
    pub enum InterfaceAddressesSource {
        /// The DHCP leases of libvirt's own networks.
        Lease = 0 => "lease",
        /// The guest agent.
        Agent = 1 => "agent",
        /// The host's ARP table.
        Arp = 2 => "arp",
    }
}

/// One address of a guest interface (`virDomainIPAddress`). `#[non_exhaustive]`: build one
/// with [`IpAddress::new`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct IpAddress {
    /// IPv4 or IPv6.
    pub kind: IpAddressType,
    /// The address as text.
    pub addr: String,
    /// The prefix length.
    pub prefix: u32,
}

impl IpAddress {
    /// An address as libvirt reports it.
    pub fn new(kind: IpAddressType, addr: impl Into<String>, prefix: u32) -> IpAddress {
        IpAddress {
            kind,
            addr: addr.into(),
            prefix,
        }
    }
}

/// One guest interface and its addresses (`virDomainInterface`). `#[non_exhaustive]`: build
/// one with [`InterfaceAddresses::new`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct InterfaceAddresses {
    /// The interface's name (host side for leases and ARP, guest side for the agent).
    pub name: String,
    /// Its MAC address, when known.
    pub hwaddr: Option<String>,
    /// Its addresses.
    pub addrs: Vec<IpAddress>,
}

impl InterfaceAddresses {
    /// An interface as libvirt reports it.
    pub fn new(
        name: impl Into<String>,
        hwaddr: Option<String>,
        addrs: Vec<IpAddress>,
    ) -> InterfaceAddresses {
        InterfaceAddresses {
            name: name.into(),
            hwaddr,
            addrs,
        }
    }
}

/// A domain (`virDomainPtr`).
///
/// ```no_run
/// # async fn demo(client: banlieue_libvirt::Client, xml: String) -> banlieue_libvirt::Result<()> {
/// use banlieue_libvirt::flags::DomainUndefineFlags;
/// use banlieue_libvirt::{Domain, DomainState};
///
/// let dom = Domain::define_xml(&client, &xml).await?;
/// dom.create().await?;
/// assert_eq!(dom.get_state().await?.0, DomainState::Running);
/// dom.destroy_if_running().await?;
/// dom.undefine_flags(DomainUndefineFlags::NVRAM | DomainUndefineFlags::TPM).await?;
/// assert!(Domain::lookup_by_name(&client, dom.name()).await?.is_none());
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Domain {
    client: Client,
    raw: remote::RemoteNonnullDomain,
}

impl Domain {
    /// `VIR_DOMAIN_AGENT_RESPONSE_TIMEOUT_BLOCK`: [`Domain::agent_command`] waits forever.
    pub const AGENT_RESPONSE_TIMEOUT_BLOCK: i32 = -2;
    /// `VIR_DOMAIN_AGENT_RESPONSE_TIMEOUT_DEFAULT`: libvirt's default wait.
    pub const AGENT_RESPONSE_TIMEOUT_DEFAULT: i32 = -1;
    /// `VIR_DOMAIN_AGENT_RESPONSE_TIMEOUT_NOWAIT`: do not wait for the reply.
    pub const AGENT_RESPONSE_TIMEOUT_NOWAIT: i32 = 0;

    /// Wraps a reference the protocol returned.
    pub fn from_raw(client: &Client, raw: remote::RemoteNonnullDomain) -> Domain {
        Domain {
            client: client.clone(),
            raw,
        }
    }

    /// The domain's name.
    pub fn name(&self) -> &str {
        &self.raw.name
    }

    /// The domain's UUID.
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

    /// libvirt's reference, for calls through [`Client::call`].
    pub fn raw(&self) -> &remote::RemoteNonnullDomain {
        &self.raw
    }

    /// The connection the handle calls through.
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

    /// `virConnectListAllDomains`; empty flags for all domains.
    pub async fn list_all(
        client: &Client,
        flags: ConnectListAllDomainsFlags,
    ) -> Result<Vec<Domain>> {
        let r = client
            .call::<rp::ConnectListAllDomains>(&remote::RemoteConnectListAllDomainsArgs {
                need_results: 1,
                flags: flags.bits(),
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
            Err(e) if e.remote().map(|r| r.code) == Some(ErrorCode::OperationInvalid) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// `virDomainManagedSave`: saves the running domain's memory and device state to a file
    /// libvirt keeps for it, and stops it (its state is then `Shutoff`). The domain stays
    /// defined (same UUID, vTPM state and NVRAM); the next [`Domain::create`] restores from the
    /// image, which libvirt then removes. [`DomainUndefineFlags::MANAGED_SAVE`] lets an
    /// undefine remove the image with the domain; without it, undefining a saved domain fails.
    ///
    /// ```no_run
    /// # async fn demo(dom: banlieue_libvirt::Domain) -> banlieue_libvirt::Result<()> {
    /// use banlieue_libvirt::DomainState;
    /// use banlieue_libvirt::flags::DomainSaveRestoreFlags;
    ///
    /// dom.managed_save(DomainSaveRestoreFlags::empty()).await?;
    /// assert_eq!(dom.get_state().await?.0, DomainState::Shutoff);
    /// assert!(dom.has_managed_save_image().await?);
    /// dom.create().await?; // restored from the image, not booted
    /// # Ok(()) }
    /// ```
    pub async fn managed_save(&self, flags: DomainSaveRestoreFlags) -> Result<()> {
        self.client
            .call::<rp::DomainManagedSave>(&remote::RemoteDomainManagedSaveArgs {
                dom: self.raw.clone(),
                flags: flags.bits(),
            })
            .await
    }

    /// `virDomainHasManagedSaveImage`: whether a managed save image exists for the domain,
    /// that is whether its next [`Domain::create`] restores rather than boots.
    ///
    /// ```no_run
    /// # async fn demo(dom: banlieue_libvirt::Domain) -> banlieue_libvirt::Result<()> {
    /// if dom.has_managed_save_image().await? {
    ///     println!("{} resumes where it was saved", dom.name());
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn has_managed_save_image(&self) -> Result<bool> {
        let r = self
            .client
            .call::<rp::DomainHasManagedSaveImage>(&remote::RemoteDomainHasManagedSaveImageArgs {
                dom: self.raw.clone(),
                flags: 0,
            })
            .await?;
        Ok(r.result != 0)
    }

    /// `virDomainManagedSaveRemove`: deletes the domain's managed save image; the next
    /// [`Domain::create`] boots it afresh.
    ///
    /// ```no_run
    /// # async fn demo(dom: banlieue_libvirt::Domain) -> banlieue_libvirt::Result<()> {
    /// dom.managed_save_remove().await?;
    /// assert!(!dom.has_managed_save_image().await?);
    /// dom.create().await?; // a fresh boot
    /// # Ok(()) }
    /// ```
    pub async fn managed_save_remove(&self) -> Result<()> {
        self.client
            .call::<rp::DomainManagedSaveRemove>(&remote::RemoteDomainManagedSaveRemoveArgs {
                dom: self.raw.clone(),
                flags: 0,
            })
            .await
    }

    /// `virDomainSetTime`: sets the guest's clock to `seconds` and `nseconds` since the Unix
    /// epoch, or, with [`DomainSetTimeFlags::SYNC`], re-syncs it from the domain's RTC (then
    /// `seconds` and `nseconds` are ignored). Typically called after a restore, whose guest
    /// clock stands where it was when saved.
    ///
    /// Needs the QEMU guest agent running in the guest (and the domain's
    /// `org.qemu.guest_agent.0` channel): without one it fails with
    /// [`ErrorCode::AgentUnresponsive`]. A wire snapshot pins the call; a booted guest with an
    /// agent exercises it in `crates/banlieue/tests/guests.rs`, where the libvirt provider sets
    /// a restored guest's clock to the host's.
    ///
    /// ```no_run
    /// # async fn demo(dom: banlieue_libvirt::Domain) -> banlieue_libvirt::Result<()> {
    /// use banlieue_libvirt::flags::DomainSetTimeFlags;
    ///
    /// let now = std::time::SystemTime::now()
    ///     .duration_since(std::time::UNIX_EPOCH)
    ///     .expect("after 1970");
    /// dom.set_time(now.as_secs() as i64, now.subsec_nanos(), DomainSetTimeFlags::empty())
    ///     .await?;
    /// // Or let the guest take the time from its RTC.
    /// dom.set_time(0, 0, DomainSetTimeFlags::SYNC).await?;
    /// # Ok(()) }
    /// ```
    pub async fn set_time(
        &self,
        seconds: i64,
        nseconds: u32,
        flags: DomainSetTimeFlags,
    ) -> Result<()> {
        self.client
            .call::<rp::DomainSetTime>(&remote::RemoteDomainSetTimeArgs {
                dom: self.raw.clone(),
                seconds,
                nseconds,
                flags: flags.bits(),
            })
            .await
    }

    /// `virDomainUndefineFlags`.
    pub async fn undefine_flags(&self, flags: DomainUndefineFlags) -> Result<()> {
        self.client
            .call::<rp::DomainUndefineFlags>(&remote::RemoteDomainUndefineFlagsArgs {
                dom: self.raw.clone(),
                flags: flags.bits(),
            })
            .await
    }

    /// `virDomainGetXMLDesc`.
    pub async fn get_xml_desc(&self, flags: DomainXmlFlags) -> Result<String> {
        let r = self
            .client
            .call::<rp::DomainGetXmlDesc>(&remote::RemoteDomainGetXmlDescArgs {
                dom: self.raw.clone(),
                flags: flags.bits(),
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
        Ok((DomainState::from_raw(r.state), r.reason))
    }

    /// `virDomainReset`: resets the guest as a reset button would, without a shutdown.
    pub async fn reset(&self) -> Result<()> {
        self.client
            .call::<rp::DomainReset>(&remote::RemoteDomainResetArgs {
                dom: self.raw.clone(),
                flags: 0,
            })
            .await
    }

    /// `virDomainSetMetadata`: sets (`Some`) or removes (`None`) the title, the description,
    /// or (with `key` and `uri`) one element of `<metadata>`.
    pub async fn set_metadata(
        &self,
        kind: MetadataType,
        metadata: Option<&str>,
        element: Option<(&str, &str)>,
        flags: DomainModificationImpact,
    ) -> Result<()> {
        self.client
            .call::<rp::DomainSetMetadata>(&remote::RemoteDomainSetMetadataArgs {
                dom: self.raw.clone(),
                r#type: kind.raw(),
                metadata: metadata.map(str::to_string),
                key: element.map(|(key, _)| key.to_string()),
                uri: element.map(|(_, uri)| uri.to_string()),
                flags: flags.bits(),
            })
            .await
    }

    /// `virDomainGetMetadata`: the title, the description, or (with `uri`) the element of
    /// `<metadata>` in that namespace.
    pub async fn get_metadata(
        &self,
        kind: MetadataType,
        uri: Option<&str>,
        flags: DomainModificationImpact,
    ) -> Result<String> {
        let r = self
            .client
            .call::<rp::DomainGetMetadata>(&remote::RemoteDomainGetMetadataArgs {
                dom: self.raw.clone(),
                r#type: kind.raw(),
                uri: uri.map(str::to_string),
                flags: flags.bits(),
            })
            .await?;
        Ok(r.metadata)
    }

    /// `virDomainPinVcpuFlags`: lets virtual CPU `vcpu` run only on the host CPUs `cpus`.
    pub async fn pin_vcpu(
        &self,
        vcpu: u32,
        cpus: &[u32],
        flags: DomainModificationImpact,
    ) -> Result<()> {
        let mut cpumap = vec![0u8; cpus.iter().max().map_or(0, |&m| m as usize / 8 + 1)];
        for &cpu in cpus {
            cpumap[cpu as usize / 8] |= 1 << (cpu % 8);
        }
        self.client
            .call::<rp::DomainPinVcpuFlags>(&remote::RemoteDomainPinVcpuFlagsArgs {
                dom: self.raw.clone(),
                vcpu,
                cpumap,
                flags: flags.bits(),
            })
            .await
    }

    /// `virDomainAttachDeviceFlags`: adds the device `xml` describes, to the running domain
    /// (LIVE), its definition (CONFIG) or both.
    pub async fn attach_device(&self, xml: &str, flags: DomainModificationImpact) -> Result<()> {
        self.client
            .call::<rp::DomainAttachDeviceFlags>(&remote::RemoteDomainAttachDeviceFlagsArgs {
                dom: self.raw.clone(),
                xml: xml.to_string(),
                flags: flags.bits(),
            })
            .await
    }

    /// `virDomainDetachDeviceFlags`: asks for the device `xml` describes to be removed. A
    /// live removal may need the guest's cooperation; it is done when
    /// [`DeviceRemovedEvent`](crate::events::DeviceRemovedEvent) arrives.
    pub async fn detach_device(&self, xml: &str, flags: DomainModificationImpact) -> Result<()> {
        self.client
            .call::<rp::DomainDetachDeviceFlags>(&remote::RemoteDomainDetachDeviceFlagsArgs {
                dom: self.raw.clone(),
                xml: xml.to_string(),
                flags: flags.bits(),
            })
            .await
    }

    /// `virDomainInterfaceAddresses` from `source`.
    pub async fn interface_addresses(
        &self,
        source: InterfaceAddressesSource,
    ) -> Result<Vec<InterfaceAddresses>> {
        // A negative source cannot be named; libvirt refuses it as it would any unknown one.
        let source = u32::try_from(source.raw()).unwrap_or(u32::MAX);
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
            .map(|i| {
                let addrs = i
                    .addrs
                    .into_iter()
                    .map(|a| IpAddress::new(IpAddressType::from_raw(a.r#type), a.addr, a.prefix))
                    .collect();
                InterfaceAddresses::new(i.name, i.hwaddr, addrs)
            })
            .collect())
    }

    /// `virDomainQemuAgentCommand`: sends one JSON command to the QEMU guest agent and returns
    /// its JSON reply. `timeout_secs` is libvirt's: a positive number of seconds, or
    /// [`Domain::AGENT_RESPONSE_TIMEOUT_BLOCK`], `_DEFAULT` or `_NOWAIT`.
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
///
/// ```no_run
/// # async fn demo(client: banlieue_libvirt::Client, xml: String) -> banlieue_libvirt::Result<()> {
/// use banlieue_libvirt::StoragePool;
/// use banlieue_libvirt::flags::StoragePoolCreateFlags;
///
/// let pool = match StoragePool::lookup_by_name(&client, "images").await? {
///     Some(pool) => pool,
///     None => StoragePool::define_xml(&client, &xml).await?,
/// };
/// if !pool.is_active().await? {
///     pool.create(StoragePoolCreateFlags::WITH_BUILD).await?;
/// }
/// for vol in pool.list_all_volumes().await? {
///     println!("{}", vol.name());
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct StoragePool {
    client: Client,
    raw: remote::RemoteNonnullStoragePool,
}

impl StoragePool {
    /// Wraps a reference the protocol returned.
    pub fn from_raw(client: &Client, raw: remote::RemoteNonnullStoragePool) -> StoragePool {
        StoragePool {
            client: client.clone(),
            raw,
        }
    }

    /// The pool's name.
    pub fn name(&self) -> &str {
        &self.raw.name
    }

    /// The pool's UUID.
    pub fn uuid(&self) -> [u8; 16] {
        self.raw.uuid
    }

    /// libvirt's reference, for calls through [`Client::call`].
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

    /// `virConnectListAllStoragePools`; empty flags for all pools.
    pub async fn list_all(
        client: &Client,
        flags: ConnectListAllStoragePoolsFlags,
    ) -> Result<Vec<StoragePool>> {
        let r = client
            .call::<rp::ConnectListAllStoragePools>(&remote::RemoteConnectListAllStoragePoolsArgs {
                need_results: 1,
                flags: flags.bits(),
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

    /// `virStoragePoolCreate`: starts a defined pool.
    pub async fn create(&self, flags: StoragePoolCreateFlags) -> Result<()> {
        self.client
            .call::<rp::StoragePoolCreate>(&remote::RemoteStoragePoolCreateArgs {
                pool: self.raw.clone(),
                flags: flags.bits(),
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
    pub async fn get_xml_desc(&self, flags: StorageXmlFlags) -> Result<String> {
        let r = self
            .client
            .call::<rp::StoragePoolGetXmlDesc>(&remote::RemoteStoragePoolGetXmlDescArgs {
                pool: self.raw.clone(),
                flags: flags.bits(),
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

    /// `virStoragePoolGetAutostart`: whether the daemon starts the pool when it starts.
    pub async fn get_autostart(&self) -> Result<bool> {
        let r = self
            .client
            .call::<rp::StoragePoolGetAutostart>(&remote::RemoteStoragePoolGetAutostartArgs {
                pool: self.raw.clone(),
            })
            .await?;
        Ok(r.autostart != 0)
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

open_enum! {
    /// `virStorageVolType`; `name()` is virsh's word for it.
    pub enum StorageVolType {
        /// A regular file.
        File = 0 => "file",
        /// A block device.
        Block = 1 => "block",
        /// A directory.
        Dir = 2 => "dir",
        /// A network volume (RBD, …).
        Network = 3 => "network",
        /// A network-accessible directory.
        Netdir = 4 => "netdir",
        /// A ploop volume.
        Ploop = 5 => "ploop",
    }
}

/// `virStorageVolInfo`. `#[non_exhaustive]`: returned by [`StorageVol::get_info`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct StorageVolInfo {
    /// What the volume is.
    pub kind: StorageVolType,
    /// Logical size in bytes.
    pub capacity: u64,
    /// Bytes allocated on the host.
    pub allocation: u64,
}

/// A storage volume (`virStorageVolPtr`).
///
/// ```no_run
/// # async fn demo(pool: banlieue_libvirt::StoragePool, xml: String) -> Result<(), Box<dyn std::error::Error>> {
/// use banlieue_libvirt::StorageVol;
/// use banlieue_libvirt::flags::StorageVolCreateFlags;
/// use banlieue_libvirt::stream::TransferOptions;
///
/// let vol = StorageVol::create_xml(&pool, &xml, StorageVolCreateFlags::empty()).await?;
/// let mut image = tokio::fs::File::open("disk.raw").await?;
/// vol.upload(&mut image, TransferOptions::new().sparse(true)).await?;
/// let mut head = Vec::new();
/// vol.download(&mut head, TransferOptions::new().length(512)).await?;
/// println!("{:?}", vol.get_info().await?);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct StorageVol {
    client: Client,
    raw: remote::RemoteNonnullStorageVol,
}

impl StorageVol {
    /// Wraps a reference the protocol returned.
    pub fn from_raw(client: &Client, raw: remote::RemoteNonnullStorageVol) -> StorageVol {
        StorageVol {
            client: client.clone(),
            raw,
        }
    }

    /// The volume's name.
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

    /// libvirt's reference, for calls through [`Client::call`] and [`crate::stream`].
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

    /// `virStorageVolCreateXML`.
    pub async fn create_xml(
        pool: &StoragePool,
        xml: &str,
        flags: StorageVolCreateFlags,
    ) -> Result<StorageVol> {
        let r = pool
            .client
            .call::<rp::StorageVolCreateXml>(&remote::RemoteStorageVolCreateXmlArgs {
                pool: pool.raw.clone(),
                xml: xml.to_string(),
                flags: flags.bits(),
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
            kind: StorageVolType::from_raw(i32::from(r.r#type)),
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

    /// `virStorageVolUpload`: writes what `source` yields into the volume, as `options` say
    /// (from which byte, how many, sparse, progress).
    pub async fn upload<R: AsyncRead + Unpin>(
        &self,
        source: &mut R,
        options: TransferOptions<'_>,
    ) -> Result<Transfer> {
        stream::upload(&self.client, &self.raw, source, options).await
    }

    /// `virStorageVolDownload` into `sink`, as `options` say. Sparse, holes cross the network
    /// as lengths and are written here as zeros.
    pub async fn download<W: AsyncWrite + Unpin>(
        &self,
        sink: &mut W,
        options: TransferOptions<'_>,
    ) -> Result<Transfer> {
        stream::download(&self.client, &self.raw, sink, options).await
    }

    /// [`StorageVol::download`] into a seekable sink that reads as zeros where it is skipped
    /// (a new or truncated file): sparse, holes become seeks rather than written zeros.
    pub async fn download_seeking<W: AsyncWrite + AsyncSeek + Unpin>(
        &self,
        sink: &mut W,
        options: TransferOptions<'_>,
    ) -> Result<Transfer> {
        stream::download_seeking(&self.client, &self.raw, sink, options).await
    }

    /// [`StorageVol::download`] into a file, which it truncates first. A thread of its own
    /// writes the file while the next packets arrive; sparse, holes become holes in the file.
    pub async fn download_to_file(
        &self,
        file: tokio::fs::File,
        options: TransferOptions<'_>,
    ) -> Result<Transfer> {
        stream::download_to_file(&self.client, &self.raw, file.into_std().await, options).await
    }

    /// Reads a small volume whole: `None` when its capacity passes `max` bytes. The download
    /// asks for exactly the capacity, so a server that sends more cannot grow the buffer past
    /// it.
    pub async fn read_small(&self, max: u64) -> Result<Option<Vec<u8>>> {
        let capacity = self.get_info().await?.capacity;
        if capacity > max {
            return Ok(None);
        }
        let mut bytes = Vec::with_capacity(usize::try_from(capacity).unwrap_or(0));
        if capacity > 0 {
            self.download(&mut bytes, TransferOptions::new().length(capacity))
                .await?;
        }
        Ok(Some(bytes))
    }
}

/// A virtual network (`virNetworkPtr`).
///
/// ```no_run
/// # async fn demo(client: banlieue_libvirt::Client) -> banlieue_libvirt::Result<()> {
/// use banlieue_libvirt::Network;
/// use banlieue_libvirt::flags::ConnectListAllNetworksFlags;
///
/// for net in Network::list_all(&client, ConnectListAllNetworksFlags::ACTIVE).await? {
///     println!("{} is active", net.name());
/// }
/// if let Some(net) = Network::lookup_by_name(&client, "default").await? {
///     println!("default network active: {}", net.is_active().await?);
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Network {
    client: Client,
    raw: remote::RemoteNonnullNetwork,
}

impl Network {
    /// Wraps a reference the protocol returned.
    pub fn from_raw(client: &Client, raw: remote::RemoteNonnullNetwork) -> Network {
        Network {
            client: client.clone(),
            raw,
        }
    }

    /// The network's name.
    pub fn name(&self) -> &str {
        &self.raw.name
    }

    /// The network's UUID.
    pub fn uuid(&self) -> [u8; 16] {
        self.raw.uuid
    }

    /// libvirt's reference, for calls through [`Client::call`].
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

    /// `virConnectListAllNetworks`; empty flags for all networks.
    pub async fn list_all(
        client: &Client,
        flags: ConnectListAllNetworksFlags,
    ) -> Result<Vec<Network>> {
        let r = client
            .call::<rp::ConnectListAllNetworks>(&remote::RemoteConnectListAllNetworksArgs {
                need_results: 1,
                flags: flags.bits(),
            })
            .await?;
        Ok(r.nets
            .into_iter()
            .map(|n| Network::from_raw(client, n))
            .collect())
    }

    /// `virNetworkDefineXML`: defines (or redefines) a persistent network.
    pub async fn define_xml(client: &Client, xml: &str) -> Result<Network> {
        let r = client
            .call::<rp::NetworkDefineXml>(&remote::RemoteNetworkDefineXmlArgs {
                xml: xml.to_string(),
            })
            .await?;
        Ok(Network::from_raw(client, r.net))
    }

    /// `virNetworkCreate`: starts a defined network.
    pub async fn create(&self) -> Result<()> {
        self.client
            .call::<rp::NetworkCreate>(&remote::RemoteNetworkCreateArgs {
                net: self.raw.clone(),
            })
            .await
    }

    /// `virNetworkDestroy`: stops a running network.
    pub async fn destroy(&self) -> Result<()> {
        self.client
            .call::<rp::NetworkDestroy>(&remote::RemoteNetworkDestroyArgs {
                net: self.raw.clone(),
            })
            .await
    }

    /// `virNetworkUndefine`: removes a network's persistent definition.
    pub async fn undefine(&self) -> Result<()> {
        self.client
            .call::<rp::NetworkUndefine>(&remote::RemoteNetworkUndefineArgs {
                net: self.raw.clone(),
            })
            .await
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

/// A network filter (`virNWFilterPtr`): a named set of firewall rules that a domain's
/// interface references with `<filterref filter='…'/>`, and that may reference other filters.
///
/// ```no_run
/// # async fn demo(client: banlieue_libvirt::Client) -> banlieue_libvirt::Result<()> {
/// use banlieue_libvirt::{NwFilter, uuid_string};
///
/// let rules = |port: u16| {
///     format!(
///         "<rule action='accept' direction='out'><tcp dstportstart='{port}'/></rule>\
///          <rule action='drop' direction='inout'><all/></rule>"
///     )
/// };
/// let xml = format!("<filter name='web-only' chain='root'>{}</filter>", rules(443));
/// let filter = NwFilter::define_xml(&client, &xml).await?;
/// // A replacement names the filter's UUID.
/// let uuid = uuid_string(&filter.uuid());
/// let xml = format!(
///     "<filter name='web-only' chain='root'><uuid>{uuid}</uuid>{}</filter>",
///     rules(8443)
/// );
/// NwFilter::define_xml(&client, &xml).await?;
/// println!("{}", filter.xml_desc().await?);
/// for f in NwFilter::list_all(&client).await? {
///     println!("{}", f.name());
/// }
/// filter.undefine().await?;
/// assert!(NwFilter::lookup_by_name(&client, "web-only").await?.is_none());
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct NwFilter {
    client: Client,
    raw: remote::RemoteNonnullNwfilter,
}

impl NwFilter {
    /// Wraps a reference the protocol returned.
    pub fn from_raw(client: &Client, raw: remote::RemoteNonnullNwfilter) -> NwFilter {
        NwFilter {
            client: client.clone(),
            raw,
        }
    }

    /// The filter's name.
    pub fn name(&self) -> &str {
        &self.raw.name
    }

    /// The filter's UUID.
    pub fn uuid(&self) -> [u8; 16] {
        self.raw.uuid
    }

    /// libvirt's reference, for calls through [`Client::call`].
    pub fn raw(&self) -> &remote::RemoteNonnullNwfilter {
        &self.raw
    }

    /// `virNWFilterLookupByName`; `None` when there is no such filter.
    pub async fn lookup_by_name(client: &Client, name: &str) -> Result<Option<NwFilter>> {
        let r = client
            .call::<rp::NwfilterLookupByName>(&remote::RemoteNwfilterLookupByNameArgs {
                name: name.to_string(),
            })
            .await;
        Ok(found(r)?.map(|r| NwFilter::from_raw(client, r.nwfilter)))
    }

    /// `virConnectListAllNWFilters`: every defined filter, those libvirt installs
    /// (`clean-traffic`, …) included.
    pub async fn list_all(client: &Client) -> Result<Vec<NwFilter>> {
        let r = client
            .call::<rp::ConnectListAllNwfilters>(&remote::RemoteConnectListAllNwfiltersArgs {
                need_results: 1,
                flags: 0,
            })
            .await?;
        Ok(r.filters
            .into_iter()
            .map(|f| NwFilter::from_raw(client, f))
            .collect())
    }

    /// `virNWFilterDefineXML`: defines a filter, or replaces the filter of the same name.
    ///
    /// A replacement must carry the filter's `<uuid>` (as [`NwFilter::xml_desc`] gives it):
    /// libvirt makes up a UUID for XML without one, and then refuses the name as taken by
    /// another filter (`OPERATION_FAILED`, "filter '…' already exists with uuid …"). A
    /// replaced filter is instantiated again on the interfaces of running domains that use it,
    /// directly or through other filters; when that fails (a `<filterref>` to a missing
    /// filter), the call fails and the old definition and its rules stay.
    pub async fn define_xml(client: &Client, xml: &str) -> Result<NwFilter> {
        let r = client
            .call::<rp::NwfilterDefineXml>(&remote::RemoteNwfilterDefineXmlArgs {
                xml: xml.to_string(),
            })
            .await?;
        Ok(NwFilter::from_raw(client, r.nwfilter))
    }

    /// `virNWFilterGetXMLDesc`: the filter's XML.
    pub async fn xml_desc(&self) -> Result<String> {
        let r = self
            .client
            .call::<rp::NwfilterGetXmlDesc>(&remote::RemoteNwfilterGetXmlDescArgs {
                nwfilter: self.raw.clone(),
                flags: 0,
            })
            .await?;
        Ok(r.xml)
    }

    /// `virNWFilterUndefine`: removes the filter's definition. Fails with
    /// `OPERATION_INVALID` ("nwfilter is in use") while an interface of a running domain uses
    /// it, directly or through other filters; a filter that only other filters reference can
    /// be undefined.
    pub async fn undefine(&self) -> Result<()> {
        self.client
            .call::<rp::NwfilterUndefine>(&remote::RemoteNwfilterUndefineArgs {
                nwfilter: self.raw.clone(),
            })
            .await
    }
}

/// `virNodeInfo`: what [`Client::node_info`] returns. `#[non_exhaustive]`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct NodeInfo {
    /// The CPU model (`x86_64`).
    pub model: String,
    /// Memory, in KiB.
    pub memory_kib: u64,
    /// Active logical CPUs.
    pub cpus: u32,
    /// Expected CPU frequency, in MHz (0 when unknown).
    pub mhz: u32,
    /// NUMA cells (1 for uniform memory access).
    pub numa_nodes: u32,
    /// Sockets per NUMA cell.
    pub sockets: u32,
    /// Cores per socket.
    pub cores: u32,
    /// Threads per core.
    pub threads: u32,
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

    /// `virConnectGetType`: the hypervisor driver's name (`QEMU`, `Test`, …).
    pub async fn hypervisor_type(&self) -> Result<String> {
        Ok(self.call::<rp::ConnectGetType>(&()).await?.r#type)
    }

    /// `virNodeGetInfo`: the host's memory and CPUs.
    pub async fn node_info(&self) -> Result<NodeInfo> {
        let r = self.call::<rp::NodeGetInfo>(&()).await?;
        // `model` is a NUL-padded C string of at most 32 bytes.
        let model: Vec<u8> = r
            .model
            .iter()
            .map(|&c| c as u8)
            .take_while(|&c| c != 0)
            .collect();
        let count = |n: i32| u32::try_from(n).unwrap_or(0);
        Ok(NodeInfo {
            model: String::from_utf8_lossy(&model).into_owned(),
            memory_kib: r.memory,
            cpus: count(r.cpus),
            mhz: count(r.mhz),
            numa_nodes: count(r.nodes),
            sockets: count(r.sockets),
            cores: count(r.cores),
            threads: count(r.threads),
        })
    }

    /// `virConnectGetHostname`.
    pub async fn hostname(&self) -> Result<String> {
        Ok(self.call::<rp::ConnectGetHostname>(&()).await?.hostname)
    }

    /// [`Domain::list_all`].
    pub async fn list_all_domains(&self, flags: ConnectListAllDomainsFlags) -> Result<Vec<Domain>> {
        Domain::list_all(self, flags).await
    }

    /// [`StoragePool::list_all`].
    pub async fn list_all_storage_pools(
        &self,
        flags: ConnectListAllStoragePoolsFlags,
    ) -> Result<Vec<StoragePool>> {
        StoragePool::list_all(self, flags).await
    }

    /// [`Network::list_all`].
    pub async fn list_all_networks(
        &self,
        flags: ConnectListAllNetworksFlags,
    ) -> Result<Vec<Network>> {
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
        assert_eq!(DomainState::Shutoff.name(), Some("shut off"));
        assert_eq!(DomainState::from_raw(5), DomainState::Shutoff);
        assert_eq!(format!("{:?}", DomainState::from_raw(42)), "Unknown(42)");
        assert_eq!(DomainState::from_raw(42).to_string(), "42");
    }
}

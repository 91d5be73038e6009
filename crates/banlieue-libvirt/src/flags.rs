//! Flag values the provider passes, from libvirt's public headers.

/// include/libvirt/libvirt-domain.h, virDomainUndefineFlagsValues.
pub const DOMAIN_UNDEFINE_MANAGED_SAVE: u32 = 1 << 0;
pub const DOMAIN_UNDEFINE_SNAPSHOTS_METADATA: u32 = 1 << 1;
pub const DOMAIN_UNDEFINE_NVRAM: u32 = 1 << 2;
pub const DOMAIN_UNDEFINE_KEEP_NVRAM: u32 = 1 << 3;
pub const DOMAIN_UNDEFINE_CHECKPOINTS_METADATA: u32 = 1 << 4;
pub const DOMAIN_UNDEFINE_TPM: u32 = 1 << 5;
pub const DOMAIN_UNDEFINE_KEEP_TPM: u32 = 1 << 6;

/// include/libvirt/libvirt-storage.h, virStorageVolUploadFlags.
pub const STORAGE_VOL_UPLOAD_SPARSE_STREAM: u32 = 1 << 0;
/// include/libvirt/libvirt-storage.h, virStorageVolDownloadFlags.
pub const STORAGE_VOL_DOWNLOAD_SPARSE_STREAM: u32 = 1 << 0;
/// include/libvirt/libvirt-storage.h, virStoragePoolCreateFlags.
pub const STORAGE_POOL_CREATE_WITH_BUILD: u32 = 1 << 0;

/// include/libvirt/libvirt-domain.h, virDomainEventID.
pub const DOMAIN_EVENT_ID_LIFECYCLE: i32 = 0;
pub const DOMAIN_EVENT_ID_AGENT_LIFECYCLE: i32 = 18;

/// include/libvirt/libvirt-domain.h, virConnectListAllDomainsFlags.
pub const CONNECT_LIST_DOMAINS_ACTIVE: u32 = 1 << 0;
pub const CONNECT_LIST_DOMAINS_INACTIVE: u32 = 1 << 1;

/// include/libvirt/libvirt-domain.h, virDomainInterfaceAddressesSource.
pub const DOMAIN_INTERFACE_ADDRESSES_SRC_LEASE: u32 = 0;
pub const DOMAIN_INTERFACE_ADDRESSES_SRC_AGENT: u32 = 1;
pub const DOMAIN_INTERFACE_ADDRESSES_SRC_ARP: u32 = 2;

/// include/libvirt/libvirt-domain.h, virDomainXMLFlags.
pub const DOMAIN_XML_SECURE: u32 = 1 << 0;
pub const DOMAIN_XML_INACTIVE: u32 = 1 << 1;
pub const DOMAIN_XML_UPDATE_CPU: u32 = 1 << 2;
pub const DOMAIN_XML_MIGRATABLE: u32 = 1 << 3;

/// include/libvirt/libvirt-qemu.h, virDomainQemuAgentCommandTimeoutValues: the `timeout`
/// of an agent command, when not a number of seconds.
pub const DOMAIN_AGENT_RESPONSE_TIMEOUT_BLOCK: i32 = -2;
pub const DOMAIN_AGENT_RESPONSE_TIMEOUT_DEFAULT: i32 = -1;
pub const DOMAIN_AGENT_RESPONSE_TIMEOUT_NOWAIT: i32 = 0;

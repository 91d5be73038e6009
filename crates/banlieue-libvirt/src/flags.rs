//! Typed flag sets for the calls of the handles ([`Domain`](crate::Domain), …), with
//! libvirt's values from its public headers (libvirt 11.3.0). All behave alike: combine with
//! `|`, pass `Type::empty()` for libvirt's default, test with `contains`, and use
//! `Type::from_bits_retain(n)` for a flag this version does not name (`bits()` is the word
//! sent). `Debug` prints the flag names: `DomainUndefineFlags(NVRAM | TPM)`.

flag_set! {
    /// `virDomainUndefineFlagsValues` (include/libvirt/libvirt-domain.h), for
    /// [`Domain::undefine_flags`](crate::Domain::undefine_flags).
    pub struct DomainUndefineFlags {
        /// Also remove any managed save image.
        const MANAGED_SAVE = 1 << 0;
        /// Also remove snapshot metadata.
        const SNAPSHOTS_METADATA = 1 << 1;
        /// Also remove the NVRAM file.
        const NVRAM = 1 << 2;
        /// Keep the NVRAM file.
        const KEEP_NVRAM = 1 << 3;
        /// Also remove checkpoint metadata.
        const CHECKPOINTS_METADATA = 1 << 4;
        /// Also remove the TPM state.
        const TPM = 1 << 5;
        /// Keep the TPM state.
        const KEEP_TPM = 1 << 6;
    }
}

flag_set! {
    /// `virDomainSaveRestoreFlags` (include/libvirt/libvirt-domain.h), for
    /// [`Domain::managed_save`](crate::Domain::managed_save).
    pub struct DomainSaveRestoreFlags {
        /// Avoid the file system cache when writing the image.
        const BYPASS_CACHE = 1 << 0;
        /// The domain runs once restored, whatever it did when saved.
        const RUNNING = 1 << 1;
        /// The domain is paused once restored.
        const PAUSED = 1 << 2;
        /// Reset the NVRAM from its template on restore.
        const RESET_NVRAM = 1 << 3;
    }
}

flag_set! {
    /// `virDomainSetTimeFlags` (include/libvirt/libvirt-domain.h), for
    /// [`Domain::set_time`](crate::Domain::set_time).
    pub struct DomainSetTimeFlags {
        /// Re-sync the guest's clock from the domain's RTC; the time given is ignored.
        const SYNC = 1 << 0;
    }
}

flag_set! {
    /// `virDomainXMLFlags` (include/libvirt/libvirt-domain.h), for
    /// [`Domain::get_xml_desc`](crate::Domain::get_xml_desc).
    pub struct DomainXmlFlags {
        /// Include security-sensitive information.
        const SECURE = 1 << 0;
        /// The persistent definition rather than the running one.
        const INACTIVE = 1 << 1;
        /// Update the guest CPU requirements from the host.
        const UPDATE_CPU = 1 << 2;
        /// XML suitable for migration.
        const MIGRATABLE = 1 << 3;
    }
}

flag_set! {
    /// `virConnectListAllDomainsFlags` (include/libvirt/libvirt-domain.h), for
    /// [`Domain::list_all`](crate::Domain::list_all). Flags come in groups; a group with no
    /// flag set does not filter.
    pub struct ConnectListAllDomainsFlags {
        /// Running or paused domains.
        const ACTIVE = 1 << 0;
        /// Domains that are not running.
        const INACTIVE = 1 << 1;
        /// Domains with a persistent definition.
        const PERSISTENT = 1 << 2;
        /// Domains without one.
        const TRANSIENT = 1 << 3;
        /// Domains in state running.
        const RUNNING = 1 << 4;
        /// Domains in state paused.
        const PAUSED = 1 << 5;
        /// Domains in state shut off.
        const SHUTOFF = 1 << 6;
        /// Domains in any other state.
        const OTHER = 1 << 7;
        /// Domains with a managed save image.
        const MANAGEDSAVE = 1 << 8;
        /// Domains without one.
        const NO_MANAGEDSAVE = 1 << 9;
        /// Domains started with the host.
        const AUTOSTART = 1 << 10;
        /// Domains not started with the host.
        const NO_AUTOSTART = 1 << 11;
        /// Domains with snapshots.
        const HAS_SNAPSHOT = 1 << 12;
        /// Domains without snapshots.
        const NO_SNAPSHOT = 1 << 13;
        /// Domains with checkpoints.
        const HAS_CHECKPOINT = 1 << 14;
        /// Domains without checkpoints.
        const NO_CHECKPOINT = 1 << 15;
    }
}

flag_set! {
    /// `virConnectListAllStoragePoolsFlags` (include/libvirt/libvirt-storage.h), for
    /// [`StoragePool::list_all`](crate::StoragePool::list_all). Note that for pools, unlike
    /// domains, `INACTIVE` is bit 0.
    pub struct ConnectListAllStoragePoolsFlags {
        /// Pools that are not running.
        const INACTIVE = 1 << 0;
        /// Running pools.
        const ACTIVE = 1 << 1;
        /// Pools with a persistent definition.
        const PERSISTENT = 1 << 2;
        /// Pools without one.
        const TRANSIENT = 1 << 3;
        /// Pools started with the host.
        const AUTOSTART = 1 << 4;
        /// Pools not started with the host.
        const NO_AUTOSTART = 1 << 5;
        /// Pools of type `dir`.
        const DIR = 1 << 6;
        /// Pools of type `fs`.
        const FS = 1 << 7;
        /// Pools of type `netfs`.
        const NETFS = 1 << 8;
        /// Pools of type `logical`.
        const LOGICAL = 1 << 9;
        /// Pools of type `disk`.
        const DISK = 1 << 10;
        /// Pools of type `iscsi`.
        const ISCSI = 1 << 11;
        /// Pools of type `scsi`.
        const SCSI = 1 << 12;
        /// Pools of type `mpath`.
        const MPATH = 1 << 13;
        /// Pools of type `rbd`.
        const RBD = 1 << 14;
        /// Pools of type `sheepdog`.
        const SHEEPDOG = 1 << 15;
        /// Pools of type `gluster`.
        const GLUSTER = 1 << 16;
        /// Pools of type `zfs`.
        const ZFS = 1 << 17;
        /// Pools of type `vstorage`.
        const VSTORAGE = 1 << 18;
        /// Pools of type `iscsi-direct`.
        const ISCSI_DIRECT = 1 << 19;
    }
}

flag_set! {
    /// `virConnectListAllNetworksFlags` (include/libvirt/libvirt-network.h), for
    /// [`Network::list_all`](crate::Network::list_all).
    pub struct ConnectListAllNetworksFlags {
        /// Networks that are not running.
        const INACTIVE = 1 << 0;
        /// Running networks.
        const ACTIVE = 1 << 1;
        /// Networks with a persistent definition.
        const PERSISTENT = 1 << 2;
        /// Networks without one.
        const TRANSIENT = 1 << 3;
        /// Networks started with the host.
        const AUTOSTART = 1 << 4;
        /// Networks not started with the host.
        const NO_AUTOSTART = 1 << 5;
    }
}

flag_set! {
    /// `virStoragePoolCreateFlags` (include/libvirt/libvirt-storage.h), for
    /// [`StoragePool::create`](crate::StoragePool::create).
    pub struct StoragePoolCreateFlags {
        /// Build the pool before starting it.
        const WITH_BUILD = 1 << 0;
        /// Build, overwriting what is there.
        const WITH_BUILD_OVERWRITE = 1 << 1;
        /// Build, failing if something is there.
        const WITH_BUILD_NO_OVERWRITE = 1 << 2;
    }
}

flag_set! {
    /// `virStorageXMLFlags` (include/libvirt/libvirt-storage.h), for
    /// [`StoragePool::get_xml_desc`](crate::StoragePool::get_xml_desc).
    pub struct StorageXmlFlags {
        /// The persistent definition rather than the running one.
        const INACTIVE = 1 << 0;
    }
}

flag_set! {
    /// `virStorageVolCreateFlags` (include/libvirt/libvirt-storage.h), for
    /// [`StorageVol::create_xml`](crate::StorageVol::create_xml).
    pub struct StorageVolCreateFlags {
        /// Preallocate only the image's metadata.
        const PREALLOC_METADATA = 1 << 0;
        /// A lightweight (btrfs reflink) copy.
        const REFLINK = 1 << 1;
        /// Validate the XML against libvirt's schema.
        const VALIDATE = 1 << 2;
    }
}

flag_set! {
    /// `virDomainModificationImpact` (include/libvirt/libvirt-domain.h): which of a domain's
    /// states a change applies to; empty (`CURRENT`) for the one it is in.
    pub struct DomainModificationImpact {
        /// The running domain.
        const LIVE = 1 << 0;
        /// The persistent definition.
        const CONFIG = 1 << 1;
    }
}

flag_set! {
    /// `virDomainStatsTypes` (include/libvirt/libvirt-domain.h): the statistics groups of
    /// [`Client::all_domain_stats`](crate::Client::all_domain_stats); empty for every group
    /// the driver has.
    pub struct DomainStatsTypes {
        /// `state.*`: state and reason.
        const STATE = 1 << 0;
        /// `cpu.*`: CPU time.
        const CPU_TOTAL = 1 << 1;
        /// `balloon.*`: memory balloon.
        const BALLOON = 1 << 2;
        /// `vcpu.*`: virtual CPUs.
        const VCPU = 1 << 3;
        /// `net.*`: network interfaces.
        const INTERFACE = 1 << 4;
        /// `block.*`: block devices.
        const BLOCK = 1 << 5;
        /// `perf.*`: perf events.
        const PERF = 1 << 6;
        /// `iothread.*`: I/O threads.
        const IOTHREAD = 1 << 7;
        /// `memory.*`: memory bandwidth.
        const MEMORY = 1 << 8;
        /// `dirtyrate.*`: memory dirty rate.
        const DIRTYRATE = 1 << 9;
        /// `vm.*`: hypervisor statistics.
        const VM = 1 << 10;
    }
}

flag_set! {
    /// `virConnectGetAllDomainStatsFlags` (include/libvirt/libvirt-domain.h), for
    /// [`Client::all_domain_stats`](crate::Client::all_domain_stats). The domain-selecting
    /// flags come in the groups of [`ConnectListAllDomainsFlags`].
    pub struct ConnectGetAllDomainStatsFlags {
        /// Running or paused domains.
        const ACTIVE = 1 << 0;
        /// Domains that are not running.
        const INACTIVE = 1 << 1;
        /// Domains with a persistent definition.
        const PERSISTENT = 1 << 2;
        /// Domains without one.
        const TRANSIENT = 1 << 3;
        /// Domains in state running.
        const RUNNING = 1 << 4;
        /// Domains in state paused.
        const PAUSED = 1 << 5;
        /// Domains in state shut off.
        const SHUTOFF = 1 << 6;
        /// Domains in any other state.
        const OTHER = 1 << 7;
        /// Skip statistics that would wait for a domain job.
        const NOWAIT = 1 << 29;
        /// Include the backing chain in block statistics.
        const BACKING = 1 << 30;
        /// Fail when a requested group is not supported.
        const ENFORCE_STATS = 1 << 31;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_libvirts() {
        let undefine = DomainUndefineFlags::NVRAM
            | DomainUndefineFlags::TPM
            | DomainUndefineFlags::MANAGED_SAVE;
        assert_eq!(undefine.bits(), 4 | 32 | 1);
        assert_eq!(DomainUndefineFlags::KEEP_TPM.bits(), 64);
        assert_eq!(DomainXmlFlags::INACTIVE.bits(), 2);
        assert_eq!(DomainSaveRestoreFlags::RESET_NVRAM.bits(), 8);
        assert_eq!(DomainSetTimeFlags::SYNC.bits(), 1);
        assert_eq!(ConnectListAllDomainsFlags::ACTIVE.bits(), 1);
        assert_eq!(ConnectListAllStoragePoolsFlags::ACTIVE.bits(), 2);
        assert_eq!(ConnectListAllNetworksFlags::ACTIVE.bits(), 2);
        assert_eq!(StorageVolCreateFlags::VALIDATE.bits(), 4);
        assert_eq!(DomainStatsTypes::VM.bits(), 1024);
        assert_eq!(
            ConnectGetAllDomainStatsFlags::ENFORCE_STATS.bits(),
            0x8000_0000
        );
        assert_eq!(
            format!("{undefine:?}"),
            "DomainUndefineFlags(MANAGED_SAVE | NVRAM | TPM)"
        );
    }
}

//! Storage pool and network events: lifecycle (defined, started, stopped, …), a pool's
//! refresh, and a network's metadata change.

use super::domain::MetadataType;
use super::event_kind;
use crate::proto::remote::{self, procedures as rp};

open_enum! {
    /// `virStoragePoolEventID`.
    pub enum StoragePoolEventId {
        /// `VIR_STORAGE_POOL_EVENT_ID_LIFECYCLE`: [`StoragePoolLifecycleEvent`].
        Lifecycle = 0 => "lifecycle",
        /// `VIR_STORAGE_POOL_EVENT_ID_REFRESH`: [`StoragePoolRefreshEvent`].
        Refresh = 1 => "refresh",
    }
}

open_enum! {
    /// `virStoragePoolEventLifecycleType`.
    pub enum StoragePoolEventType {
        /// Defined.
        Defined = 0 => "defined",
        /// Undefined.
        Undefined = 1 => "undefined",
        /// Started.
        Started = 2 => "started",
        /// Stopped.
        Stopped = 3 => "stopped",
        /// Built (`virStoragePoolBuild`).
        Created = 4 => "created",
        /// Deleted (`virStoragePoolDelete`).
        Deleted = 5 => "deleted",
    }
}

/// A storage pool's lifecycle changed (`VIR_STORAGE_POOL_EVENT_ID_LIFECYCLE`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct StoragePoolLifecycleEvent {
    /// The pool's name.
    pub pool: String,
    /// The pool's UUID.
    pub uuid: [u8; 16],
    /// What happened.
    pub event: StoragePoolEventType,
    /// libvirt's detail (0 so far).
    pub detail: i32,
}

event_kind!(
    StoragePoolLifecycleEvent,
    StoragePool,
    StoragePoolEventId::Lifecycle.raw(),
    rp::StoragePoolEventLifecycle,
    remote::RemoteStoragePoolEventLifecycleMsg,
    |m| {
        let event = StoragePoolLifecycleEvent {
            pool: m.pool.name,
            uuid: m.pool.uuid,
            event: StoragePoolEventType::from_raw(m.event),
            detail: m.detail,
        };
        (m.callback_id, event)
    }
);

/// A storage pool was refreshed (`VIR_STORAGE_POOL_EVENT_ID_REFRESH`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct StoragePoolRefreshEvent {
    /// The pool's name.
    pub pool: String,
    /// The pool's UUID.
    pub uuid: [u8; 16],
}

event_kind!(
    StoragePoolRefreshEvent,
    StoragePool,
    StoragePoolEventId::Refresh.raw(),
    rp::StoragePoolEventRefresh,
    remote::RemoteStoragePoolEventRefreshMsg,
    |m| {
        let event = StoragePoolRefreshEvent {
            pool: m.pool.name,
            uuid: m.pool.uuid,
        };
        (m.callback_id, event)
    }
);

open_enum! {
    /// `virNetworkEventID`.
    pub enum NetworkEventId {
        /// `VIR_NETWORK_EVENT_ID_LIFECYCLE`: [`NetworkLifecycleEvent`].
        Lifecycle = 0 => "lifecycle",
        /// `VIR_NETWORK_EVENT_ID_METADATA_CHANGE`: [`NetworkMetadataChangeEvent`].
        MetadataChange = 1 => "metadata-change",
    }
}

open_enum! {
    /// `virNetworkEventLifecycleType`.
    pub enum NetworkEventType {
        /// Defined.
        Defined = 0 => "defined",
        /// Undefined.
        Undefined = 1 => "undefined",
        /// Started.
        Started = 2 => "started",
        /// Stopped.
        Stopped = 3 => "stopped",
    }
}

/// A network's lifecycle changed (`VIR_NETWORK_EVENT_ID_LIFECYCLE`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct NetworkLifecycleEvent {
    /// The network's name.
    pub network: String,
    /// The network's UUID.
    pub uuid: [u8; 16],
    /// What happened.
    pub event: NetworkEventType,
    /// libvirt's detail (0 so far).
    pub detail: i32,
}

event_kind!(
    NetworkLifecycleEvent,
    Network,
    NetworkEventId::Lifecycle.raw(),
    rp::NetworkEventLifecycle,
    remote::RemoteNetworkEventLifecycleMsg,
    |m| {
        let event = NetworkLifecycleEvent {
            network: m.net.name,
            uuid: m.net.uuid,
            event: NetworkEventType::from_raw(m.event),
            detail: m.detail,
        };
        (m.callback_id, event)
    }
);

/// A network's title, description or metadata changed
/// (`VIR_NETWORK_EVENT_ID_METADATA_CHANGE`, libvirt 9.8).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct NetworkMetadataChangeEvent {
    /// The network's name.
    pub network: String,
    /// The network's UUID.
    pub uuid: [u8; 16],
    /// Which part.
    pub kind: MetadataType,
    /// For an element: its namespace URI.
    pub nsuri: Option<String>,
}

event_kind!(
    NetworkMetadataChangeEvent,
    Network,
    NetworkEventId::MetadataChange.raw(),
    rp::NetworkEventCallbackMetadataChange,
    remote::RemoteNetworkEventCallbackMetadataChangeMsg,
    |m| {
        let event = NetworkMetadataChangeEvent {
            network: m.net.name,
            uuid: m.net.uuid,
            kind: MetadataType::from_raw(m.r#type),
            nsuri: m.nsuri,
        };
        (m.callback_id, event)
    }
);

//! Every domain event the remote program sends, typed. Each has a [`super::EventKind`]
//! impl naming its `virDomainEventID` and the MESSAGE procedure (the `*_CALLBACK_*` form,
//! which carries the callback id) it arrives as; the message structs are generated from
//! `remote_protocol.x`, and the conversions here only name and type their fields.
//!
//! Every event names its domain by name and UUID. Integers libvirt defines as enums are open
//! enums (values a newer daemon adds stay readable as `Unknown`); typed-parameter payloads are
//! [`TypedParams`].

use super::event_kind;
use crate::params::TypedParams;
use crate::proto::remote::{self, procedures as rp};

open_enum! {
    /// `virDomainEventID`: which kind of domain event a callback is registered for.
    pub enum DomainEventId {
        /// `VIR_DOMAIN_EVENT_ID_LIFECYCLE`: [`DomainLifecycleEvent`].
        Lifecycle = 0 => "lifecycle",
        /// `VIR_DOMAIN_EVENT_ID_REBOOT`.
        Reboot = 1 => "reboot",
        /// `VIR_DOMAIN_EVENT_ID_RTC_CHANGE`.
        RtcChange = 2 => "rtc-change",
        /// `VIR_DOMAIN_EVENT_ID_WATCHDOG`.
        Watchdog = 3 => "watchdog",
        /// `VIR_DOMAIN_EVENT_ID_IO_ERROR`.
        IoError = 4 => "io-error",
        /// `VIR_DOMAIN_EVENT_ID_GRAPHICS`.
        Graphics = 5 => "graphics",
        /// `VIR_DOMAIN_EVENT_ID_IO_ERROR_REASON`.
        IoErrorReason = 6 => "io-error-reason",
        /// `VIR_DOMAIN_EVENT_ID_CONTROL_ERROR`.
        ControlError = 7 => "control-error",
        /// `VIR_DOMAIN_EVENT_ID_BLOCK_JOB`.
        BlockJob = 8 => "block-job",
        /// `VIR_DOMAIN_EVENT_ID_DISK_CHANGE`.
        DiskChange = 9 => "disk-change",
        /// `VIR_DOMAIN_EVENT_ID_TRAY_CHANGE`.
        TrayChange = 10 => "tray-change",
        /// `VIR_DOMAIN_EVENT_ID_PMWAKEUP`.
        PmWakeup = 11 => "pm-wakeup",
        /// `VIR_DOMAIN_EVENT_ID_PMSUSPEND`.
        PmSuspend = 12 => "pm-suspend",
        /// `VIR_DOMAIN_EVENT_ID_BALLOON_CHANGE`.
        BalloonChange = 13 => "balloon-change",
        /// `VIR_DOMAIN_EVENT_ID_PMSUSPEND_DISK`.
        PmSuspendDisk = 14 => "pm-suspend-disk",
        /// `VIR_DOMAIN_EVENT_ID_DEVICE_REMOVED`.
        DeviceRemoved = 15 => "device-removed",
        /// `VIR_DOMAIN_EVENT_ID_BLOCK_JOB_2`.
        BlockJob2 = 16 => "block-job-2",
        /// `VIR_DOMAIN_EVENT_ID_TUNABLE`.
        Tunable = 17 => "tunable",
        /// `VIR_DOMAIN_EVENT_ID_AGENT_LIFECYCLE`: [`AgentLifecycleEvent`].
        AgentLifecycle = 18 => "agent-lifecycle",
        /// `VIR_DOMAIN_EVENT_ID_DEVICE_ADDED`.
        DeviceAdded = 19 => "device-added",
        /// `VIR_DOMAIN_EVENT_ID_MIGRATION_ITERATION`.
        MigrationIteration = 20 => "migration-iteration",
        /// `VIR_DOMAIN_EVENT_ID_JOB_COMPLETED`.
        JobCompleted = 21 => "job-completed",
        /// `VIR_DOMAIN_EVENT_ID_DEVICE_REMOVAL_FAILED`.
        DeviceRemovalFailed = 22 => "device-removal-failed",
        /// `VIR_DOMAIN_EVENT_ID_METADATA_CHANGE`.
        MetadataChange = 23 => "metadata-change",
        /// `VIR_DOMAIN_EVENT_ID_BLOCK_THRESHOLD`.
        BlockThreshold = 24 => "block-threshold",
        /// `VIR_DOMAIN_EVENT_ID_MEMORY_FAILURE`.
        MemoryFailure = 25 => "memory-failure",
        /// `VIR_DOMAIN_EVENT_ID_MEMORY_DEVICE_SIZE_CHANGE`.
        MemoryDeviceSizeChange = 26 => "memory-device-size-change",
        /// `VIR_DOMAIN_EVENT_ID_NIC_MAC_CHANGE` (libvirt 11.2).
        NicMacChange = 27 => "nic-mac-change",
    }
}

open_enum! {
    /// `virDomainEventType`: what happened to a domain; `name()` is virsh's word.
    pub enum DomainEventType {
        /// Defined or redefined.
        Defined = 0 => "defined",
        /// Undefined.
        Undefined = 1 => "undefined",
        /// Started.
        Started = 2 => "started",
        /// Paused.
        Suspended = 3 => "suspended",
        /// Unpaused.
        Resumed = 4 => "resumed",
        /// Stopped (shut off, destroyed, crashed, migrated away, …).
        Stopped = 5 => "stopped",
        /// The guest is shutting down.
        Shutdown = 6 => "shutdown",
        /// Suspended by guest power management.
        PmSuspended = 7 => "pmsuspended",
        /// The guest crashed.
        Crashed = 8 => "crashed",
    }
}

/// One lifecycle event (`VIR_DOMAIN_EVENT_ID_LIFECYCLE`). `#[non_exhaustive]`: build one with
/// [`DomainLifecycleEvent::new`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DomainLifecycleEvent {
    /// The domain's name.
    pub domain: String,
    /// The domain's UUID.
    pub uuid: [u8; 16],
    /// What happened.
    pub event: DomainEventType,
    /// Why: a `virDomainEvent<Type>DetailType` value, whose meaning depends on `event`.
    pub detail: i32,
}

impl DomainLifecycleEvent {
    /// An event as the server would send it.
    pub fn new(
        domain: impl Into<String>,
        uuid: [u8; 16],
        event: DomainEventType,
        detail: i32,
    ) -> DomainLifecycleEvent {
        DomainLifecycleEvent {
            domain: domain.into(),
            uuid,
            event,
            detail,
        }
    }
}

open_enum! {
    /// `virConnectDomainEventAgentLifecycleState`.
    pub enum AgentLifecycleState {
        /// The agent is connected.
        Connected = 1 => "connected",
        /// The agent is disconnected.
        Disconnected = 2 => "disconnected",
    }
}

open_enum! {
    /// `virConnectDomainEventAgentLifecycleReason`.
    pub enum AgentLifecycleReason {
        /// `VIR_CONNECT_DOMAIN_EVENT_AGENT_LIFECYCLE_REASON_UNKNOWN`: libvirt gives no reason.
        Unspecified = 0 => "unknown",
        /// The domain started.
        DomainStarted = 1 => "domain started",
        /// The agent channel changed state.
        Channel = 2 => "channel event",
    }
}

/// The guest agent of a domain connected or disconnected
/// (`VIR_DOMAIN_EVENT_ID_AGENT_LIFECYCLE`). `#[non_exhaustive]`: build one with
/// [`AgentLifecycleEvent::new`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct AgentLifecycleEvent {
    /// The domain's name.
    pub domain: String,
    /// The domain's UUID.
    pub uuid: [u8; 16],
    /// Connected or disconnected.
    pub state: AgentLifecycleState,
    /// Why.
    pub reason: AgentLifecycleReason,
}

impl AgentLifecycleEvent {
    /// An event as the server would send it.
    pub fn new(
        domain: impl Into<String>,
        uuid: [u8; 16],
        state: AgentLifecycleState,
        reason: AgentLifecycleReason,
    ) -> AgentLifecycleEvent {
        AgentLifecycleEvent {
            domain: domain.into(),
            uuid,
            state,
            reason,
        }
    }

    /// The agent is now connected.
    pub fn connected(&self) -> bool {
        self.state == AgentLifecycleState::Connected
    }
}

event_kind!(
    DomainLifecycleEvent,
    Domain,
    DomainEventId::Lifecycle.raw(),
    rp::DomainEventCallbackLifecycle,
    remote::RemoteDomainEventCallbackLifecycleMsg,
    |m| {
        let event = DomainLifecycleEvent::new(
            m.msg.dom.name,
            m.msg.dom.uuid,
            DomainEventType::from_raw(m.msg.event),
            m.msg.detail,
        );
        (m.callback_id, event)
    }
);

event_kind!(
    AgentLifecycleEvent,
    Domain,
    DomainEventId::AgentLifecycle.raw(),
    rp::DomainEventCallbackAgentLifecycle,
    remote::RemoteDomainEventCallbackAgentLifecycleMsg,
    |m| {
        let event = AgentLifecycleEvent::new(
            m.dom.name,
            m.dom.uuid,
            AgentLifecycleState::from_raw(m.state),
            AgentLifecycleReason::from_raw(m.reason),
        );
        (m.callback_id, event)
    }
);

/// A struct for one domain event: the domain's name and UUID, then the event's own fields.
macro_rules! domain_event {
    (
        $(#[$meta:meta])*
        $name:ident {
            $($(#[$fmeta:meta])* $field:ident : $ty:ty,)*
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, PartialEq)]
        #[non_exhaustive]
        pub struct $name {
            /// The domain's name.
            pub domain: String,
            /// The domain's UUID.
            pub uuid: [u8; 16],
            $($(#[$fmeta])* pub $field: $ty,)*
        }
    };
}

domain_event! {
    /// The guest reset (`VIR_DOMAIN_EVENT_ID_REBOOT`).
    RebootEvent {}
}

event_kind!(
    RebootEvent,
    Domain,
    DomainEventId::Reboot.raw(),
    rp::DomainEventCallbackReboot,
    remote::RemoteDomainEventCallbackRebootMsg,
    |m| {
        let d = m.msg.dom;
        let event = RebootEvent {
            domain: d.name,
            uuid: d.uuid,
        };
        (m.callback_id, event)
    }
);

domain_event! {
    /// The guest changed its real-time clock (`VIR_DOMAIN_EVENT_ID_RTC_CHANGE`).
    RtcChangeEvent {
        /// The new offset from the host's UTC, in seconds.
        offset_seconds: i64,
    }
}

event_kind!(
    RtcChangeEvent,
    Domain,
    DomainEventId::RtcChange.raw(),
    rp::DomainEventCallbackRtcChange,
    remote::RemoteDomainEventCallbackRtcChangeMsg,
    |m| {
        let d = m.msg.dom;
        let event = RtcChangeEvent {
            domain: d.name,
            uuid: d.uuid,
            offset_seconds: m.msg.offset,
        };
        (m.callback_id, event)
    }
);

open_enum! {
    /// `virDomainEventWatchdogAction`.
    pub enum WatchdogAction {
        /// Ignored.
        None = 0 => "none",
        /// The guest's CPUs were paused.
        Pause = 1 => "pause",
        /// The guest was reset.
        Reset = 2 => "reset",
        /// The guest was powered off.
        Poweroff = 3 => "poweroff",
        /// The guest was asked to shut down.
        Shutdown = 4 => "shutdown",
        /// A debug message was logged.
        Debug = 5 => "debug",
        /// A non-maskable interrupt was injected.
        InjectNmi = 6 => "inject-nmi",
    }
}

domain_event! {
    /// The guest's watchdog fired (`VIR_DOMAIN_EVENT_ID_WATCHDOG`).
    WatchdogEvent {
        /// What the hypervisor did.
        action: WatchdogAction,
    }
}

event_kind!(
    WatchdogEvent,
    Domain,
    DomainEventId::Watchdog.raw(),
    rp::DomainEventCallbackWatchdog,
    remote::RemoteDomainEventCallbackWatchdogMsg,
    |m| {
        let d = m.msg.dom;
        let event = WatchdogEvent {
            domain: d.name,
            uuid: d.uuid,
            action: WatchdogAction::from_raw(m.msg.action),
        };
        (m.callback_id, event)
    }
);

open_enum! {
    /// `virDomainEventIOErrorAction`.
    pub enum IoErrorAction {
        /// Ignored.
        None = 0 => "none",
        /// The guest's CPUs were paused.
        Pause = 1 => "pause",
        /// The error was reported to the guest.
        Report = 2 => "report",
    }
}

domain_event! {
    /// A disk I/O error (`VIR_DOMAIN_EVENT_ID_IO_ERROR`).
    IoErrorEvent {
        /// The disk's source path on the host.
        src_path: String,
        /// The disk's device alias.
        dev_alias: String,
        /// What the hypervisor did.
        action: IoErrorAction,
    }
}

event_kind!(
    IoErrorEvent,
    Domain,
    DomainEventId::IoError.raw(),
    rp::DomainEventCallbackIoError,
    remote::RemoteDomainEventCallbackIoErrorMsg,
    |m| {
        let e = m.msg;
        let event = IoErrorEvent {
            domain: e.dom.name,
            uuid: e.dom.uuid,
            src_path: e.src_path,
            dev_alias: e.dev_alias,
            action: IoErrorAction::from_raw(e.action),
        };
        (m.callback_id, event)
    }
);

domain_event! {
    /// A disk I/O error with its cause (`VIR_DOMAIN_EVENT_ID_IO_ERROR_REASON`).
    IoErrorReasonEvent {
        /// The disk's source path on the host.
        src_path: String,
        /// The disk's device alias.
        dev_alias: String,
        /// What the hypervisor did.
        action: IoErrorAction,
        /// The cause, as the hypervisor names it (`enospc`, …).
        reason: String,
    }
}

event_kind!(
    IoErrorReasonEvent,
    Domain,
    DomainEventId::IoErrorReason.raw(),
    rp::DomainEventCallbackIoErrorReason,
    remote::RemoteDomainEventCallbackIoErrorReasonMsg,
    |m| {
        let e = m.msg;
        let event = IoErrorReasonEvent {
            domain: e.dom.name,
            uuid: e.dom.uuid,
            src_path: e.src_path,
            dev_alias: e.dev_alias,
            action: IoErrorAction::from_raw(e.action),
            reason: e.reason,
        };
        (m.callback_id, event)
    }
);

open_enum! {
    /// `virDomainEventGraphicsPhase`.
    pub enum GraphicsPhase {
        /// The socket connected.
        Connect = 0 => "connect",
        /// Authentication and set-up completed.
        Initialize = 1 => "initialize",
        /// The socket disconnected.
        Disconnect = 2 => "disconnect",
    }
}

open_enum! {
    /// `virDomainEventGraphicsAddressType`.
    pub enum GraphicsAddressFamily {
        /// IPv4.
        Ipv4 = 0 => "ipv4",
        /// IPv6.
        Ipv6 = 1 => "ipv6",
        /// A unix socket path.
        Unix = 2 => "unix",
    }
}

/// One end of a graphics connection (`virDomainEventGraphicsAddress`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct GraphicsAddress {
    /// The address family.
    pub family: GraphicsAddressFamily,
    /// The address (or socket path).
    pub node: String,
    /// The port (or empty).
    pub service: String,
}

impl From<remote::RemoteDomainEventGraphicsAddress> for GraphicsAddress {
    fn from(a: remote::RemoteDomainEventGraphicsAddress) -> GraphicsAddress {
        GraphicsAddress {
            family: GraphicsAddressFamily::from_raw(a.family),
            node: a.node,
            service: a.service,
        }
    }
}

domain_event! {
    /// A graphics (VNC, SPICE) client connected, authenticated or left
    /// (`VIR_DOMAIN_EVENT_ID_GRAPHICS`).
    GraphicsEvent {
        /// Which step.
        phase: GraphicsPhase,
        /// The server's end.
        local: GraphicsAddress,
        /// The client's end.
        remote: GraphicsAddress,
        /// The authentication scheme.
        auth_scheme: String,
        /// The client's identity as (type, name) pairs (`x509dname`, `saslUsername`).
        subject: Vec<(String, String)>,
    }
}

event_kind!(
    GraphicsEvent,
    Domain,
    DomainEventId::Graphics.raw(),
    rp::DomainEventCallbackGraphics,
    remote::RemoteDomainEventCallbackGraphicsMsg,
    |m| {
        let e = m.msg;
        let event = GraphicsEvent {
            domain: e.dom.name,
            uuid: e.dom.uuid,
            phase: GraphicsPhase::from_raw(e.phase),
            local: e.local.into(),
            remote: e.remote.into(),
            auth_scheme: e.auth_scheme,
            subject: e.subject.into_iter().map(|s| (s.r#type, s.name)).collect(),
        };
        (m.callback_id, event)
    }
);

domain_event! {
    /// The connection to the hypervisor's control channel failed
    /// (`VIR_DOMAIN_EVENT_ID_CONTROL_ERROR`).
    ControlErrorEvent {}
}

event_kind!(
    ControlErrorEvent,
    Domain,
    DomainEventId::ControlError.raw(),
    rp::DomainEventCallbackControlError,
    remote::RemoteDomainEventCallbackControlErrorMsg,
    |m| {
        let d = m.msg.dom;
        let event = ControlErrorEvent {
            domain: d.name,
            uuid: d.uuid,
        };
        (m.callback_id, event)
    }
);

open_enum! {
    /// `virDomainBlockJobType`.
    pub enum BlockJobType {
        /// `VIR_DOMAIN_BLOCK_JOB_TYPE_UNKNOWN`: libvirt does not say.
        Unspecified = 0 => "unknown",
        /// Pull (`virDomainBlockPull`).
        Pull = 1 => "pull",
        /// Copy (`virDomainBlockCopy`).
        Copy = 2 => "copy",
        /// Commit of a backing layer (`virDomainBlockCommit`).
        Commit = 3 => "commit",
        /// Commit of the active layer.
        ActiveCommit = 4 => "active-commit",
        /// Backup (`virDomainBackupBegin`).
        Backup = 5 => "backup",
    }
}

open_enum! {
    /// `virConnectDomainEventBlockJobStatus`.
    pub enum BlockJobStatus {
        /// Finished.
        Completed = 0 => "completed",
        /// Failed.
        Failed = 1 => "failed",
        /// Cancelled.
        Canceled = 2 => "canceled",
        /// Ready to pivot (copy and active commit).
        Ready = 3 => "ready",
    }
}

domain_event! {
    /// A block job changed state, naming the disk by its source path
    /// (`VIR_DOMAIN_EVENT_ID_BLOCK_JOB`).
    BlockJobEvent {
        /// The disk's source path on the host.
        path: String,
        /// The job's type.
        kind: BlockJobType,
        /// Its new status.
        status: BlockJobStatus,
    }
}

event_kind!(
    BlockJobEvent,
    Domain,
    DomainEventId::BlockJob.raw(),
    rp::DomainEventCallbackBlockJob,
    remote::RemoteDomainEventCallbackBlockJobMsg,
    |m| {
        let e = m.msg;
        let event = BlockJobEvent {
            domain: e.dom.name,
            uuid: e.dom.uuid,
            path: e.path,
            kind: BlockJobType::from_raw(e.r#type),
            status: BlockJobStatus::from_raw(e.status),
        };
        (m.callback_id, event)
    }
);

domain_event! {
    /// A block job changed state, naming the disk by its target (`vda`)
    /// (`VIR_DOMAIN_EVENT_ID_BLOCK_JOB_2`).
    BlockJob2Event {
        /// The disk's target name.
        disk: String,
        /// The job's type.
        kind: BlockJobType,
        /// Its new status.
        status: BlockJobStatus,
    }
}

event_kind!(
    BlockJob2Event,
    Domain,
    DomainEventId::BlockJob2.raw(),
    rp::DomainEventBlockJob2,
    remote::RemoteDomainEventBlockJob2Msg,
    |m| {
        let event = BlockJob2Event {
            domain: m.dom.name,
            uuid: m.dom.uuid,
            disk: m.dst,
            kind: BlockJobType::from_raw(m.r#type),
            status: BlockJobStatus::from_raw(m.status),
        };
        (m.callback_id, event)
    }
);

open_enum! {
    /// `virConnectDomainEventDiskChangeReason`.
    pub enum DiskChangeReason {
        /// The source was missing when the domain started and was dropped.
        MissingOnStart = 0 => "missing-on-start",
        /// The source went missing and the disk was dropped.
        DropMissingOnStart = 1 => "drop-missing-on-start",
    }
}

domain_event! {
    /// A disk's source changed (`VIR_DOMAIN_EVENT_ID_DISK_CHANGE`).
    DiskChangeEvent {
        /// The old source path, if there was one.
        old_src_path: Option<String>,
        /// The new source path, if there is one.
        new_src_path: Option<String>,
        /// The disk's device alias.
        dev_alias: String,
        /// Why.
        reason: DiskChangeReason,
    }
}

event_kind!(
    DiskChangeEvent,
    Domain,
    DomainEventId::DiskChange.raw(),
    rp::DomainEventCallbackDiskChange,
    remote::RemoteDomainEventCallbackDiskChangeMsg,
    |m| {
        let e = m.msg;
        let event = DiskChangeEvent {
            domain: e.dom.name,
            uuid: e.dom.uuid,
            old_src_path: e.old_src_path,
            new_src_path: e.new_src_path,
            dev_alias: e.dev_alias,
            reason: DiskChangeReason::from_raw(e.reason),
        };
        (m.callback_id, event)
    }
);

open_enum! {
    /// `virDomainEventTrayChangeReason`.
    pub enum TrayChangeReason {
        /// The tray opened.
        Open = 0 => "open",
        /// The tray closed.
        Close = 1 => "close",
    }
}

domain_event! {
    /// A removable drive's tray opened or closed (`VIR_DOMAIN_EVENT_ID_TRAY_CHANGE`).
    TrayChangeEvent {
        /// The drive's device alias.
        dev_alias: String,
        /// Opened or closed.
        reason: TrayChangeReason,
    }
}

event_kind!(
    TrayChangeEvent,
    Domain,
    DomainEventId::TrayChange.raw(),
    rp::DomainEventCallbackTrayChange,
    remote::RemoteDomainEventCallbackTrayChangeMsg,
    |m| {
        let e = m.msg;
        let event = TrayChangeEvent {
            domain: e.dom.name,
            uuid: e.dom.uuid,
            dev_alias: e.dev_alias,
            reason: TrayChangeReason::from_raw(e.reason),
        };
        (m.callback_id, event)
    }
);

domain_event! {
    /// The guest woke from a power-management suspend (`VIR_DOMAIN_EVENT_ID_PMWAKEUP`).
    PmWakeupEvent {
        /// libvirt's reason (always 0 so far).
        reason: i32,
    }
}

event_kind!(
    PmWakeupEvent,
    Domain,
    DomainEventId::PmWakeup.raw(),
    rp::DomainEventCallbackPmwakeup,
    remote::RemoteDomainEventCallbackPmwakeupMsg,
    |m| {
        let d = m.msg.dom;
        let event = PmWakeupEvent {
            domain: d.name,
            uuid: d.uuid,
            reason: m.reason,
        };
        (m.callback_id, event)
    }
);

domain_event! {
    /// The guest suspended to memory (`VIR_DOMAIN_EVENT_ID_PMSUSPEND`).
    PmSuspendEvent {
        /// libvirt's reason (always 0 so far).
        reason: i32,
    }
}

event_kind!(
    PmSuspendEvent,
    Domain,
    DomainEventId::PmSuspend.raw(),
    rp::DomainEventCallbackPmsuspend,
    remote::RemoteDomainEventCallbackPmsuspendMsg,
    |m| {
        let d = m.msg.dom;
        let event = PmSuspendEvent {
            domain: d.name,
            uuid: d.uuid,
            reason: m.reason,
        };
        (m.callback_id, event)
    }
);

domain_event! {
    /// The guest suspended to disk (`VIR_DOMAIN_EVENT_ID_PMSUSPEND_DISK`).
    PmSuspendDiskEvent {
        /// libvirt's reason (always 0 so far).
        reason: i32,
    }
}

event_kind!(
    PmSuspendDiskEvent,
    Domain,
    DomainEventId::PmSuspendDisk.raw(),
    rp::DomainEventCallbackPmsuspendDisk,
    remote::RemoteDomainEventCallbackPmsuspendDiskMsg,
    |m| {
        let d = m.msg.dom;
        let event = PmSuspendDiskEvent {
            domain: d.name,
            uuid: d.uuid,
            reason: m.reason,
        };
        (m.callback_id, event)
    }
);

domain_event! {
    /// The memory balloon changed size (`VIR_DOMAIN_EVENT_ID_BALLOON_CHANGE`).
    BalloonChangeEvent {
        /// Memory the guest now has, in KiB.
        actual_kib: u64,
    }
}

event_kind!(
    BalloonChangeEvent,
    Domain,
    DomainEventId::BalloonChange.raw(),
    rp::DomainEventCallbackBalloonChange,
    remote::RemoteDomainEventCallbackBalloonChangeMsg,
    |m| {
        let d = m.msg.dom;
        let event = BalloonChangeEvent {
            domain: d.name,
            uuid: d.uuid,
            actual_kib: m.msg.actual,
        };
        (m.callback_id, event)
    }
);

domain_event! {
    /// A device was removed from the running domain (`VIR_DOMAIN_EVENT_ID_DEVICE_REMOVED`).
    DeviceRemovedEvent {
        /// The device's alias.
        dev_alias: String,
    }
}

event_kind!(
    DeviceRemovedEvent,
    Domain,
    DomainEventId::DeviceRemoved.raw(),
    rp::DomainEventCallbackDeviceRemoved,
    remote::RemoteDomainEventCallbackDeviceRemovedMsg,
    |m| {
        let e = m.msg;
        let event = DeviceRemovedEvent {
            domain: e.dom.name,
            uuid: e.dom.uuid,
            dev_alias: e.dev_alias,
        };
        (m.callback_id, event)
    }
);

domain_event! {
    /// Live tunables changed, such as CPU pinning or scheduler shares
    /// (`VIR_DOMAIN_EVENT_ID_TUNABLE`).
    TunableEvent {
        /// The changed tunables, named as in libvirt's `VIR_DOMAIN_TUNABLE_*` macros
        /// (`cputune.vcpupin0`, `cputune.cpu_shares`, …).
        params: TypedParams,
    }
}

event_kind!(
    TunableEvent,
    Domain,
    DomainEventId::Tunable.raw(),
    rp::DomainEventCallbackTunable,
    remote::RemoteDomainEventCallbackTunableMsg,
    |m| {
        let event = TunableEvent {
            domain: m.dom.name,
            uuid: m.dom.uuid,
            params: TypedParams::from_raw(m.params),
        };
        (m.callback_id, event)
    }
);

domain_event! {
    /// A device was added to the running domain (`VIR_DOMAIN_EVENT_ID_DEVICE_ADDED`).
    DeviceAddedEvent {
        /// The device's alias.
        dev_alias: String,
    }
}

event_kind!(
    DeviceAddedEvent,
    Domain,
    DomainEventId::DeviceAdded.raw(),
    rp::DomainEventCallbackDeviceAdded,
    remote::RemoteDomainEventCallbackDeviceAddedMsg,
    |m| {
        let event = DeviceAddedEvent {
            domain: m.dom.name,
            uuid: m.dom.uuid,
            dev_alias: m.dev_alias,
        };
        (m.callback_id, event)
    }
);

domain_event! {
    /// A live migration started another pass over memory
    /// (`VIR_DOMAIN_EVENT_ID_MIGRATION_ITERATION`).
    MigrationIterationEvent {
        /// The pass, from 1.
        iteration: i32,
    }
}

event_kind!(
    MigrationIterationEvent,
    Domain,
    DomainEventId::MigrationIteration.raw(),
    rp::DomainEventCallbackMigrationIteration,
    remote::RemoteDomainEventCallbackMigrationIterationMsg,
    |m| {
        let event = MigrationIterationEvent {
            domain: m.dom.name,
            uuid: m.dom.uuid,
            iteration: m.iteration,
        };
        (m.callback_id, event)
    }
);

domain_event! {
    /// A domain job (migration, save, dump, …) completed (`VIR_DOMAIN_EVENT_ID_JOB_COMPLETED`).
    JobCompletedEvent {
        /// The job's final statistics, named as in libvirt's `VIR_DOMAIN_JOB_*` macros
        /// (`type`, `time_elapsed`, `memory_total`, …).
        params: TypedParams,
    }
}

event_kind!(
    JobCompletedEvent,
    Domain,
    DomainEventId::JobCompleted.raw(),
    rp::DomainEventCallbackJobCompleted,
    remote::RemoteDomainEventCallbackJobCompletedMsg,
    |m| {
        let event = JobCompletedEvent {
            domain: m.dom.name,
            uuid: m.dom.uuid,
            params: TypedParams::from_raw(m.params),
        };
        (m.callback_id, event)
    }
);

domain_event! {
    /// The guest refused to release a device being removed
    /// (`VIR_DOMAIN_EVENT_ID_DEVICE_REMOVAL_FAILED`).
    DeviceRemovalFailedEvent {
        /// The device's alias.
        dev_alias: String,
    }
}

event_kind!(
    DeviceRemovalFailedEvent,
    Domain,
    DomainEventId::DeviceRemovalFailed.raw(),
    rp::DomainEventCallbackDeviceRemovalFailed,
    remote::RemoteDomainEventCallbackDeviceRemovalFailedMsg,
    |m| {
        let event = DeviceRemovalFailedEvent {
            domain: m.dom.name,
            uuid: m.dom.uuid,
            dev_alias: m.dev_alias,
        };
        (m.callback_id, event)
    }
);

open_enum! {
    /// `virDomainMetadataType` (and `virNetworkMetadataType`, which has the same values).
    pub enum MetadataType {
        /// `<description>`.
        Description = 0 => "description",
        /// `<title>`.
        Title = 1 => "title",
        /// An element of `<metadata>`, named by its namespace.
        Element = 2 => "element",
    }
}

domain_event! {
    /// The domain's title, description or metadata changed
    /// (`VIR_DOMAIN_EVENT_ID_METADATA_CHANGE`).
    MetadataChangeEvent {
        /// Which part.
        kind: MetadataType,
        /// For an element: its namespace URI.
        nsuri: Option<String>,
    }
}

event_kind!(
    MetadataChangeEvent,
    Domain,
    DomainEventId::MetadataChange.raw(),
    rp::DomainEventCallbackMetadataChange,
    remote::RemoteDomainEventCallbackMetadataChangeMsg,
    |m| {
        let event = MetadataChangeEvent {
            domain: m.dom.name,
            uuid: m.dom.uuid,
            kind: MetadataType::from_raw(m.r#type),
            nsuri: m.nsuri,
        };
        (m.callback_id, event)
    }
);

domain_event! {
    /// A disk's write threshold was passed (`VIR_DOMAIN_EVENT_ID_BLOCK_THRESHOLD`).
    BlockThresholdEvent {
        /// The disk's target name (or `target[index]` for a backing layer).
        dev: String,
        /// The source path, if it has one.
        path: Option<String>,
        /// The threshold that was set, in bytes.
        threshold: u64,
        /// How far past it the write went, in bytes.
        excess: u64,
    }
}

event_kind!(
    BlockThresholdEvent,
    Domain,
    DomainEventId::BlockThreshold.raw(),
    rp::DomainEventBlockThreshold,
    remote::RemoteDomainEventBlockThresholdMsg,
    |m| {
        let event = BlockThresholdEvent {
            domain: m.dom.name,
            uuid: m.dom.uuid,
            dev: m.dev,
            path: m.path,
            threshold: m.threshold,
            excess: m.excess,
        };
        (m.callback_id, event)
    }
);

open_enum! {
    /// `virDomainEventMemoryFailureRecipientType`.
    pub enum MemoryFailureRecipient {
        /// The hypervisor.
        Hypervisor = 0 => "hypervisor",
        /// The guest.
        Guest = 1 => "guest",
    }
}

open_enum! {
    /// `virDomainEventMemoryFailureActionType`.
    pub enum MemoryFailureAction {
        /// Ignored.
        Ignore = 0 => "ignore",
        /// Injected into the guest.
        Inject = 1 => "inject",
        /// Fatal to the hypervisor.
        Fatal = 2 => "fatal",
        /// The guest was reset.
        Reset = 3 => "reset",
    }
}

flag_set! {
    /// `virDomainMemoryFailureFlags`.
    pub struct MemoryFailureFlags {
        /// The failure was in memory that must be acted on.
        const ACTION_REQUIRED = 1 << 0;
        /// The failure happened while handling another.
        const RECURSIVE = 1 << 1;
    }
}

domain_event! {
    /// A hardware memory error reached the guest's memory (`VIR_DOMAIN_EVENT_ID_MEMORY_FAILURE`).
    MemoryFailureEvent {
        /// Whose memory.
        recipient: MemoryFailureRecipient,
        /// What was done.
        action: MemoryFailureAction,
        /// Details.
        flags: MemoryFailureFlags,
    }
}

event_kind!(
    MemoryFailureEvent,
    Domain,
    DomainEventId::MemoryFailure.raw(),
    rp::DomainEventMemoryFailure,
    remote::RemoteDomainEventMemoryFailureMsg,
    |m| {
        let event = MemoryFailureEvent {
            domain: m.dom.name,
            uuid: m.dom.uuid,
            recipient: MemoryFailureRecipient::from_raw(m.recipient),
            action: MemoryFailureAction::from_raw(m.action),
            flags: MemoryFailureFlags::from_bits_retain(m.flags),
        };
        (m.callback_id, event)
    }
);

domain_event! {
    /// A memory device (virtio-mem) changed size
    /// (`VIR_DOMAIN_EVENT_ID_MEMORY_DEVICE_SIZE_CHANGE`).
    MemoryDeviceSizeChangeEvent {
        /// The device's alias.
        alias: String,
        /// Its new size, in KiB.
        size_kib: u64,
    }
}

event_kind!(
    MemoryDeviceSizeChangeEvent,
    Domain,
    DomainEventId::MemoryDeviceSizeChange.raw(),
    rp::DomainEventMemoryDeviceSizeChange,
    remote::RemoteDomainEventMemoryDeviceSizeChangeMsg,
    |m| {
        let event = MemoryDeviceSizeChangeEvent {
            domain: m.dom.name,
            uuid: m.dom.uuid,
            alias: m.alias,
            size_kib: m.size,
        };
        (m.callback_id, event)
    }
);

domain_event! {
    /// The guest changed a network interface's MAC address
    /// (`VIR_DOMAIN_EVENT_ID_NIC_MAC_CHANGE`, libvirt 11.2).
    NicMacChangeEvent {
        /// The interface's alias.
        alias: String,
        /// The address before.
        old_mac: String,
        /// The address now.
        new_mac: String,
    }
}

event_kind!(
    NicMacChangeEvent,
    Domain,
    DomainEventId::NicMacChange.raw(),
    rp::DomainEventNicMacChange,
    remote::RemoteDomainEventNicMacChangeMsg,
    |m| {
        let event = NicMacChangeEvent {
            domain: m.dom.name,
            uuid: m.dom.uuid,
            alias: m.alias,
            old_mac: m.old_mac,
            new_mac: m.new_mac,
        };
        (m.callback_id, event)
    }
);

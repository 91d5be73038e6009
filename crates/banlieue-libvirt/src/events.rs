//! Domain events as typed streams: lifecycle (`VIR_DOMAIN_EVENT_ID_LIFECYCLE`) and the guest
//! agent's connection state (`VIR_DOMAIN_EVENT_ID_AGENT_LIFECYCLE`), each registered with
//! CONNECT_DOMAIN_EVENT_CALLBACK_REGISTER_ANY. Events arrive as MESSAGE packets with serial 0;
//! the callback is deregistered when its stream is dropped.

use tokio::sync::mpsc;

use crate::client::Client;
use crate::error::Result;
use crate::packet::Packet;
use crate::proto::remote::{self, procedures as rp};
use crate::xdr::{Procedure, Xdr};

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

/// One kind of domain event: its event id, the procedure its messages arrive as, and how a
/// message becomes the typed event.
pub trait DomainEventKind: Sized + Send + 'static {
    /// The event id to register for.
    const EVENT_ID: DomainEventId;
    /// The MESSAGE procedure that carries it.
    const PROCEDURE: i32;
    /// The message body as sent.
    type Message: Xdr;
    /// The callback id the message answers, and the event it carries.
    fn from_message(message: Self::Message) -> (i32, Self);
}

impl DomainEventKind for DomainLifecycleEvent {
    const EVENT_ID: DomainEventId = DomainEventId::Lifecycle;
    const PROCEDURE: i32 = rp::DomainEventCallbackLifecycle::NUMBER;
    type Message = remote::RemoteDomainEventCallbackLifecycleMsg;

    fn from_message(m: Self::Message) -> (i32, Self) {
        let event = DomainLifecycleEvent::new(
            m.msg.dom.name,
            m.msg.dom.uuid,
            DomainEventType::from_raw(m.msg.event),
            m.msg.detail,
        );
        (m.callback_id, event)
    }
}

impl DomainEventKind for AgentLifecycleEvent {
    const EVENT_ID: DomainEventId = DomainEventId::AgentLifecycle;
    const PROCEDURE: i32 = rp::DomainEventCallbackAgentLifecycle::NUMBER;
    type Message = remote::RemoteDomainEventCallbackAgentLifecycleMsg;

    fn from_message(m: Self::Message) -> (i32, Self) {
        let event = AgentLifecycleEvent::new(
            m.dom.name,
            m.dom.uuid,
            AgentLifecycleState::from_raw(m.state),
            AgentLifecycleReason::from_raw(m.reason),
        );
        (m.callback_id, event)
    }
}

/// Events of kind `E` for every domain on the connection; also a `futures_core::Stream`.
/// Dropping it deregisters the callback.
///
/// ```no_run
/// # async fn demo(client: banlieue_libvirt::Client) -> banlieue_libvirt::Result<()> {
/// use banlieue_libvirt::events::{DomainEventType, DomainEvents};
///
/// let mut events = DomainEvents::subscribe(&client).await?;
/// while let Some(event) = events.next().await {
///     let event = event?;
///     if event.event == DomainEventType::Stopped {
///         println!("{} stopped (detail {})", event.domain, event.detail);
///     }
/// }
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct DomainEventStream<E> {
    client: Client,
    callback_id: i32,
    packets: mpsc::Receiver<Packet>,
    kind: std::marker::PhantomData<fn() -> E>,
}

/// Lifecycle events of every domain on the connection.
pub type DomainEvents = DomainEventStream<DomainLifecycleEvent>;

/// Guest-agent connection events of every domain on the connection.
pub type AgentLifecycleEvents = DomainEventStream<AgentLifecycleEvent>;

impl<E: DomainEventKind> DomainEventStream<E> {
    /// Registers for events of kind `E` on `client`'s connection. Subscribes before
    /// registering, so no event between the two is lost.
    pub async fn subscribe(client: &Client) -> Result<Self> {
        let packets = client.subscribe(E::PROCEDURE, 256);
        let ret = client
            .call::<rp::ConnectDomainEventCallbackRegisterAny>(
                &remote::RemoteConnectDomainEventCallbackRegisterAnyArgs {
                    event_id: E::EVENT_ID.raw(),
                    dom: None,
                },
            )
            .await?;
        Ok(DomainEventStream {
            client: client.clone(),
            callback_id: ret.callback_id,
            packets,
            kind: std::marker::PhantomData,
        })
    }

    /// The next event; `None` once the connection is gone.
    pub async fn next(&mut self) -> Option<Result<E>> {
        loop {
            let packet = self.packets.recv().await?;
            let message = match packet.body::<E::Message>() {
                Ok(m) => m,
                Err(e) => return Some(Err(e.into())),
            };
            let (callback_id, event) = E::from_message(message);
            // Another registration of the same event id on this connection.
            if callback_id == self.callback_id {
                return Some(Ok(event));
            }
        }
    }
}

impl<E: DomainEventKind> futures_core::Stream for DomainEventStream<E> {
    type Item = Result<E>;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        let fut = self.next();
        let mut fut = std::pin::pin!(fut);
        fut.as_mut().poll(cx)
    }
}

impl<E> Drop for DomainEventStream<E> {
    fn drop(&mut self) {
        let client = self.client.clone();
        let args = remote::RemoteConnectDomainEventCallbackDeregisterAnyArgs {
            callback_id: self.callback_id,
        };
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                let _ = client
                    .call::<rp::ConnectDomainEventCallbackDeregisterAny>(&args)
                    .await;
            });
        }
    }
}

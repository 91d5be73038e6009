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

/// One lifecycle event: `event` is `virDomainEventType` (0 defined, 2 started, 5 stopped, …)
/// and `detail` its reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DomainLifecycleEvent {
    pub domain: String,
    pub uuid: [u8; 16],
    pub event: i32,
    pub detail: i32,
}

impl DomainLifecycleEvent {
    /// libvirt's name for `event` (`virDomainEventType` without its prefix, lower case).
    pub fn event_name(&self) -> Option<&'static str> {
        Some(match self.event {
            0 => "defined",
            1 => "undefined",
            2 => "started",
            3 => "suspended",
            4 => "resumed",
            5 => "stopped",
            6 => "shutdown",
            7 => "pmsuspended",
            8 => "crashed",
            _ => return None,
        })
    }
}

/// The guest agent of a domain connected or disconnected: `virConnectDomainEventAgentLifecycleState`
/// and its reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentLifecycleEvent {
    pub domain: String,
    pub uuid: [u8; 16],
    /// 1 connected, 2 disconnected.
    pub state: i32,
    /// 0 unknown, 1 the domain started, 2 the channel's state changed.
    pub reason: i32,
}

impl AgentLifecycleEvent {
    /// `VIR_CONNECT_DOMAIN_EVENT_AGENT_LIFECYCLE_STATE_CONNECTED`.
    pub const CONNECTED: i32 = 1;
    /// `VIR_CONNECT_DOMAIN_EVENT_AGENT_LIFECYCLE_STATE_DISCONNECTED`.
    pub const DISCONNECTED: i32 = 2;

    /// The agent is now connected.
    pub fn connected(&self) -> bool {
        self.state == Self::CONNECTED
    }
}

/// One kind of domain event: its event id, the procedure its messages arrive as, and how a
/// message becomes the typed event.
pub trait DomainEventKind: Sized + Send + 'static {
    /// `virDomainEventID`.
    const EVENT_ID: i32;
    /// The MESSAGE procedure that carries it.
    const PROCEDURE: i32;
    /// The message body as sent.
    type Message: Xdr;
    /// The callback id the message answers, and the event it carries.
    fn from_message(message: Self::Message) -> (i32, Self);
}

impl DomainEventKind for DomainLifecycleEvent {
    const EVENT_ID: i32 = crate::flags::DOMAIN_EVENT_ID_LIFECYCLE;
    const PROCEDURE: i32 = rp::DomainEventCallbackLifecycle::NUMBER;
    type Message = remote::RemoteDomainEventCallbackLifecycleMsg;

    fn from_message(m: Self::Message) -> (i32, Self) {
        let event = DomainLifecycleEvent {
            domain: m.msg.dom.name,
            uuid: m.msg.dom.uuid,
            event: m.msg.event,
            detail: m.msg.detail,
        };
        (m.callback_id, event)
    }
}

impl DomainEventKind for AgentLifecycleEvent {
    const EVENT_ID: i32 = crate::flags::DOMAIN_EVENT_ID_AGENT_LIFECYCLE;
    const PROCEDURE: i32 = rp::DomainEventCallbackAgentLifecycle::NUMBER;
    type Message = remote::RemoteDomainEventCallbackAgentLifecycleMsg;

    fn from_message(m: Self::Message) -> (i32, Self) {
        let event = AgentLifecycleEvent {
            domain: m.dom.name,
            uuid: m.dom.uuid,
            state: m.state,
            reason: m.reason,
        };
        (m.callback_id, event)
    }
}

/// Events of kind `E` for every domain on the connection.
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
    /// Subscribes before registering, so no event between the two is lost.
    pub async fn subscribe(client: &Client) -> Result<Self> {
        let packets = client.subscribe(E::PROCEDURE, 256);
        let ret = client
            .call::<rp::ConnectDomainEventCallbackRegisterAny>(
                &remote::RemoteConnectDomainEventCallbackRegisterAnyArgs {
                    event_id: E::EVENT_ID,
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

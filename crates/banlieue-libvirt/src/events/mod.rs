//! Events as typed streams: every domain event the remote program sends, and the lifecycle
//! events of storage pools and networks.
//!
//! One [`EventStream`] is one registration (CONNECT_DOMAIN_EVENT_CALLBACK_REGISTER_ANY,
//! CONNECT_STORAGE_POOL_EVENT_REGISTER_ANY or CONNECT_NETWORK_EVENT_REGISTER_ANY) for one kind
//! of event on every object of the connection. Events arrive as MESSAGE packets with serial 0,
//! each naming the callback it answers; the stream keeps its own and drops the others. The
//! callback is deregistered when the stream is dropped.
//!
//! Each event type implements [`EventKind`], which names its event id, the procedure its
//! messages arrive as, and how the generated message becomes the typed event. The
//! `*_msg` structs themselves are generated from `remote_protocol.x`.

use tokio::sync::mpsc;

use crate::client::Client;
use crate::error::Result;
use crate::packet::Packet;
use crate::proto::remote::{self, procedures as rp};
use crate::xdr::Xdr;

mod domain;
mod objects;

pub use domain::*;
pub use objects::*;

/// Which register and deregister procedures a kind of event uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum EventFamily {
    /// Domain events (`virConnectDomainEventRegisterAny`).
    Domain,
    /// Storage pool events (`virConnectStoragePoolEventRegisterAny`).
    StoragePool,
    /// Network events (`virConnectNetworkEventRegisterAny`).
    Network,
}

/// One kind of event: its family and event id, the MESSAGE procedure that carries it, and how
/// a message becomes the typed event.
pub trait EventKind: Sized + Send + 'static {
    /// The register/deregister procedures to use.
    const FAMILY: EventFamily;
    /// The event id to register for (`virDomainEventID`, `virStoragePoolEventID`,
    /// `virNetworkEventID`).
    const EVENT_ID: i32;
    /// The MESSAGE procedure that carries it.
    const PROCEDURE: i32;
    /// The message body as sent.
    type Message: Xdr;
    /// The callback id the message answers, and the event it carries.
    fn from_message(message: Self::Message) -> (i32, Self);
}

/// Implements [`EventKind`] for an event type from its generated message.
macro_rules! event_kind {
    ($event:ty, $family:ident, $id:expr, $procedure:ty, $message:ty, |$m:ident| $body:expr) => {
        impl $crate::events::EventKind for $event {
            const FAMILY: $crate::events::EventFamily = $crate::events::EventFamily::$family;
            const EVENT_ID: i32 = $id;
            const PROCEDURE: i32 = <$procedure as $crate::xdr::Procedure>::NUMBER;
            type Message = $message;

            fn from_message($m: Self::Message) -> (i32, Self) {
                $body
            }
        }
    };
}
pub(crate) use event_kind;

/// Events of kind `E` for every object of its family on the connection; also a
/// `futures_core::Stream`. Dropping it deregisters the callback.
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
pub struct EventStream<E: EventKind> {
    client: Client,
    callback_id: i32,
    packets: mpsc::Receiver<Packet>,
    kind: std::marker::PhantomData<fn() -> E>,
}

/// A stream of one kind of domain event.
pub type DomainEventStream<E> = EventStream<E>;

/// Lifecycle events of every domain on the connection.
pub type DomainEvents = EventStream<DomainLifecycleEvent>;

/// Guest-agent connection events of every domain on the connection.
pub type AgentLifecycleEvents = EventStream<AgentLifecycleEvent>;

/// Lifecycle events of every storage pool on the connection.
pub type StoragePoolEvents = EventStream<StoragePoolLifecycleEvent>;

/// Lifecycle events of every network on the connection.
pub type NetworkEvents = EventStream<NetworkLifecycleEvent>;

impl<E: EventKind> EventStream<E> {
    /// Registers for events of kind `E` on `client`'s connection. Subscribes before
    /// registering, so no event between the two is lost.
    pub async fn subscribe(client: &Client) -> Result<Self> {
        let packets = client.subscribe(E::PROCEDURE, 256);
        let callback_id = register(client, E::FAMILY, E::EVENT_ID).await?;
        Ok(EventStream {
            client: client.clone(),
            callback_id,
            packets,
            kind: std::marker::PhantomData,
        })
    }

    /// The daemon's id for this registration.
    pub fn callback_id(&self) -> i32 {
        self.callback_id
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

async fn register(client: &Client, family: EventFamily, event_id: i32) -> Result<i32> {
    Ok(match family {
        EventFamily::Domain => {
            client
                .call::<rp::ConnectDomainEventCallbackRegisterAny>(
                    &remote::RemoteConnectDomainEventCallbackRegisterAnyArgs {
                        event_id,
                        dom: None,
                    },
                )
                .await?
                .callback_id
        }
        EventFamily::StoragePool => {
            client
                .call::<rp::ConnectStoragePoolEventRegisterAny>(
                    &remote::RemoteConnectStoragePoolEventRegisterAnyArgs {
                        event_id,
                        pool: None,
                    },
                )
                .await?
                .callback_id
        }
        EventFamily::Network => {
            client
                .call::<rp::ConnectNetworkEventRegisterAny>(
                    &remote::RemoteConnectNetworkEventRegisterAnyArgs {
                        event_id,
                        net: None,
                    },
                )
                .await?
                .callback_id
        }
    })
}

async fn deregister(client: Client, family: EventFamily, callback_id: i32) -> Result<()> {
    match family {
        EventFamily::Domain => {
            client
                .call::<rp::ConnectDomainEventCallbackDeregisterAny>(
                    &remote::RemoteConnectDomainEventCallbackDeregisterAnyArgs { callback_id },
                )
                .await
        }
        EventFamily::StoragePool => {
            client
                .call::<rp::ConnectStoragePoolEventDeregisterAny>(
                    &remote::RemoteConnectStoragePoolEventDeregisterAnyArgs { callback_id },
                )
                .await
        }
        EventFamily::Network => {
            client
                .call::<rp::ConnectNetworkEventDeregisterAny>(
                    &remote::RemoteConnectNetworkEventDeregisterAnyArgs { callback_id },
                )
                .await
        }
    }
}

impl<E: EventKind> futures_core::Stream for EventStream<E> {
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

impl<E: EventKind> Drop for EventStream<E> {
    fn drop(&mut self) {
        let client = self.client.clone();
        let callback_id = self.callback_id;
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                let _ = deregister(client, E::FAMILY, callback_id).await;
            });
        }
    }
}

#[cfg(test)]
mod tests;

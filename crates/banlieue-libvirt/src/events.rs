//! Domain lifecycle events (CONNECT_DOMAIN_EVENT_CALLBACK_REGISTER_ANY) as a typed stream.
//! Events arrive as MESSAGE packets with serial 0; the callback is deregistered on drop.

use tokio::sync::mpsc;

use crate::client::Client;
use crate::error::Result;
use crate::packet::Packet;
use crate::proto::remote::{self, procedures as rp};
use crate::xdr::Procedure;

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

/// Lifecycle events of every domain on the connection.
#[derive(Debug)]
pub struct DomainEvents {
    client: Client,
    callback_id: i32,
    packets: mpsc::Receiver<Packet>,
}

impl DomainEvents {
    /// Subscribes before registering, so no event between the two is lost.
    pub async fn subscribe(client: &Client) -> Result<DomainEvents> {
        let packets = client.subscribe(rp::DomainEventCallbackLifecycle::NUMBER, 256);
        let ret = client
            .call::<rp::ConnectDomainEventCallbackRegisterAny>(
                &remote::RemoteConnectDomainEventCallbackRegisterAnyArgs {
                    event_id: crate::flags::DOMAIN_EVENT_ID_LIFECYCLE,
                    dom: None,
                },
            )
            .await?;
        Ok(DomainEvents {
            client: client.clone(),
            callback_id: ret.callback_id,
            packets,
        })
    }

    /// The next event; `None` once the connection is gone.
    pub async fn next(&mut self) -> Option<Result<DomainLifecycleEvent>> {
        loop {
            let packet = self.packets.recv().await?;
            let msg = match packet.body::<remote::RemoteDomainEventCallbackLifecycleMsg>() {
                Ok(m) => m,
                Err(e) => return Some(Err(e.into())),
            };
            if msg.callback_id != self.callback_id {
                continue;
            }
            return Some(Ok(DomainLifecycleEvent {
                domain: msg.msg.dom.name,
                uuid: msg.msg.dom.uuid,
                event: msg.msg.event,
                detail: msg.msg.detail,
            }));
        }
    }
}

impl futures_core::Stream for DomainEvents {
    type Item = Result<DomainLifecycleEvent>;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        let fut = self.next();
        let mut fut = std::pin::pin!(fut);
        fut.as_mut().poll(cx)
    }
}

impl Drop for DomainEvents {
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

//! The provider's one libvirt connection, opened with the Provider's credentials on first use
//! and replaced when it dies; domain lifecycle events from it wake the reconciler.

use std::sync::Arc;
use std::time::Duration;

use banlieue_api::Provider;
use banlieue_api::conditions::reasons;
use banlieue_libvirt::Client;
use banlieue_libvirt::events::{AgentLifecycleEvents, DomainEvents};
use kube::Api;
use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::{Mutex, mpsc};

use crate::connection;
use crate::domain_xml::DomainType;
use crate::error::{Error, Result};

/// A live connection and what was learnt from the host when it was opened.
#[derive(Clone, Debug)]
pub struct Session {
    pub client: Client,
    pub domain_type: DomainType,
}

/// Opens and caches the connection to the Provider's host.
pub struct Host {
    kube: kube::Client,
    namespace: String,
    provider: String,
    domain_type_override: Option<DomainType>,
    call_timeout: Duration,
    session: Mutex<Option<Session>>,
    /// Set to 1 while a live session is held, 0 otherwise.
    connected: Gauge,
}

impl std::fmt::Debug for Host {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Host")
            .field("namespace", &self.namespace)
            .field("provider", &self.provider)
            .finish_non_exhaustive()
    }
}

impl Host {
    pub fn new(
        kube: kube::Client,
        namespace: &str,
        provider: &str,
        domain_type_override: Option<DomainType>,
        call_timeout: Duration,
        connected: Gauge,
    ) -> Host {
        Host {
            kube,
            namespace: namespace.to_owned(),
            provider: provider.to_owned(),
            domain_type_override,
            call_timeout,
            session: Mutex::new(None),
            connected,
        }
    }

    /// The live session, connecting (again) when there is none or it died. The Provider is
    /// read on each connect, so new credentials are used from the next connection on.
    pub async fn session(&self) -> Result<Session> {
        let mut slot = self.session.lock().await;
        if let Some(s) = slot.as_ref().filter(|s| s.client.is_alive()) {
            return Ok(s.clone());
        }
        *slot = None;
        self.connected.set(0);
        let providers: Api<Provider> = Api::namespaced(self.kube.clone(), &self.namespace);
        let provider = providers
            .get_opt(&self.provider)
            .await
            .map_err(Error::kube(format!("read Provider {}", self.provider)))?
            .ok_or_else(|| Error::Invalid {
                reason: reasons::PROVIDER_NOT_READY,
                message: format!(
                    "Provider {}/{} does not exist",
                    self.namespace, self.provider
                ),
            })?;
        let endpoint = &provider.spec.connection.endpoint;
        connection::check_endpoint(endpoint)?;
        let creds = connection::load(&self.kube, &provider).await?;
        let client = connection::connect(
            endpoint,
            &creds,
            connection::client_options(self.call_timeout),
        )
        .await?;
        let capabilities = client
            .capabilities()
            .await
            .map_err(Error::libvirt("read the host's capabilities"))?;
        let domain_type =
            crate::domain_type::choose_domain_type(&capabilities, self.domain_type_override);
        let session = Session {
            client,
            domain_type,
        };
        *slot = Some(session.clone());
        self.connected.set(1);
        tracing::info!(endpoint, domain_type = domain_type.as_str(), "connected");
        Ok(session)
    }

    /// Forgets the session after an error that says it is dead, so the next call reconnects.
    pub async fn forget(&self) {
        *self.session.lock().await = None;
        self.connected.set(0);
    }
}

/// Subscribes to domain lifecycle and guest-agent events on each new session and sends one
/// tick per event; reconnects after the connection dies. Ends when the receiver is dropped.
/// An agent connecting is what a booting guest's GuestReady waits on; an agent leaving is
/// what the machine reports.
pub async fn forward_events(host: Arc<Host>, ticks: mpsc::Sender<()>) {
    loop {
        match subscribe(&host).await {
            Ok((mut lifecycle, mut agent)) => {
                // A (re)subscription may have missed events: look at everything once.
                if !tick(&ticks) {
                    return;
                }
                loop {
                    let more = tokio::select! {
                        e = lifecycle.next() => e.map(|e| {
                            if let Ok(e) = e {
                                tracing::debug!(domain = %e.domain, event = %e.event, "domain event");
                            }
                        }),
                        e = agent.next() => e.map(|e| {
                            if let Ok(e) = e {
                                tracing::debug!(domain = %e.domain, connected = e.connected(), "agent event");
                            }
                        }),
                    };
                    if more.is_none() || !tick(&ticks) {
                        break;
                    }
                }
            }
            Err(e) => {
                tracing::debug!(error = %banlieue_api::conditions::error_message(&e), "domain events unavailable");
            }
        }
        if ticks.is_closed() {
            return;
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

async fn subscribe(host: &Host) -> Result<(DomainEvents, AgentLifecycleEvents)> {
    let session = host.session().await?;
    let lifecycle = DomainEvents::subscribe(&session.client)
        .await
        .map_err(Error::libvirt("subscribe to domain events"))?;
    let agent = AgentLifecycleEvents::subscribe(&session.client)
        .await
        .map_err(Error::libvirt("subscribe to guest agent events"))?;
    Ok((lifecycle, agent))
}

/// Queues one tick unless one is already waiting: a burst of events (a start emits several)
/// collapses into one pass. Returns false once nobody listens.
fn tick(ticks: &mpsc::Sender<()>) -> bool {
    !matches!(
        ticks.try_send(()),
        Err(mpsc::error::TrySendError::Closed(()))
    )
}

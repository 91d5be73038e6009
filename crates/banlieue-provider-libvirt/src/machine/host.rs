//! The provider's one libvirt connection, opened with the Provider's credentials on first use
//! and replaced when it dies (the kit's [`LazySession`]); domain lifecycle events from it wake
//! the reconciler (the kit's [`pump`]).

use std::sync::Arc;
use std::time::Duration;

use banlieue_api::Provider;
use banlieue_api::conditions::reasons;
use banlieue_libvirt::Client;
use banlieue_libvirt::events::{AgentLifecycleEvents, DomainEvents};
use banlieue_provider_kit::error::Core;
use banlieue_provider_kit::pump::{self, Feed};
use banlieue_provider_kit::session::{Connect, LazySession};
use kube::Api;
use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::mpsc;

use crate::connection;
use crate::domain_xml::DomainType;
use crate::error::{Error, Result};

/// A live connection and what was learnt from the host when it was opened.
#[derive(Clone, Debug)]
pub struct Session {
    pub client: Client,
    pub domain_type: DomainType,
}

/// The connection to the Provider's host, opened on first use; [`LazySession::forget`] it after
/// an error that says it is lost.
pub type Host = LazySession<HostConnector>;

/// How the Provider's host is connected to.
pub struct HostConnector {
    kube: kube::Client,
    namespace: String,
    provider: String,
    domain_type_override: Option<DomainType>,
    call_timeout: Duration,
    /// Set to 1 while a live session is held, 0 otherwise.
    connected: Gauge,
}

impl std::fmt::Debug for HostConnector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostConnector")
            .field("namespace", &self.namespace)
            .field("provider", &self.provider)
            .finish_non_exhaustive()
    }
}

impl HostConnector {
    pub fn new(
        kube: kube::Client,
        namespace: &str,
        provider: &str,
        domain_type_override: Option<DomainType>,
        call_timeout: Duration,
        connected: Gauge,
    ) -> HostConnector {
        HostConnector {
            kube,
            namespace: namespace.to_owned(),
            provider: provider.to_owned(),
            domain_type_override,
            call_timeout,
            connected,
        }
    }
}

impl Connect for HostConnector {
    type Connection = Session;
    type Error = Error;

    /// The Provider is read on each connect, so new credentials are used from the next
    /// connection on.
    async fn connect(&self) -> Result<Session> {
        let providers: Api<Provider> = Api::namespaced(self.kube.clone(), &self.namespace);
        let provider = providers
            .get_opt(&self.provider)
            .await
            .map_err(Error::kube(format!("read Provider {}", self.provider)))?
            .ok_or_else(|| {
                Error::Core(Core::Invalid {
                    reason: reasons::PROVIDER_NOT_READY,
                    message: format!(
                        "Provider {}/{} does not exist",
                        self.namespace, self.provider
                    ),
                })
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
        tracing::info!(endpoint, domain_type = domain_type.as_str(), "connected");
        Ok(Session {
            client,
            domain_type,
        })
    }

    /// A connection whose transport died is replaced on its next use.
    fn is_alive(&self, session: &Session) -> bool {
        session.client.is_alive()
    }

    fn held(&self, held: bool) {
        self.connected.set(i64::from(held));
    }
}

/// Subscribes to domain lifecycle and guest-agent events on each new session and wakes the
/// reconciler once per event; subscribes again (on the kit's backoff) after the connection
/// dies. Ends when the receiver is dropped. An agent connecting is what a booting guest's
/// GuestReady waits on; an agent leaving is what the machine reports.
pub async fn forward_events(host: Arc<Host>, ticks: mpsc::Sender<()>) {
    pump::run("domain events", ticks, |feed| {
        follow_events(host.clone(), feed)
    })
    .await
}

/// One subscription: returns when its streams end (the connection died) or it could not be
/// made.
async fn follow_events(host: Arc<Host>, feed: Feed) -> Result<()> {
    let (mut lifecycle, mut agent) = subscribe(&host).await?;
    feed.subscribed();
    // A (re)subscription may have missed events: look at everything once.
    feed.wake();
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
        if more.is_none() {
            return Ok(());
        }
        feed.wake();
    }
}

async fn subscribe(host: &Host) -> Result<(DomainEvents, AgentLifecycleEvents)> {
    let session = host.connection().await?;
    let lifecycle = DomainEvents::subscribe(&session.client)
        .await
        .map_err(Error::libvirt("subscribe to domain events"))?;
    let agent = AgentLifecycleEvents::subscribe(&session.client)
        .await
        .map_err(Error::libvirt("subscribe to guest agent events"))?;
    Ok((lifecycle, agent))
}

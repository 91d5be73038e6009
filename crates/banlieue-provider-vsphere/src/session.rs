//! The workload's one vSphere session for its machines: opened on first use with the
//! Provider's credentials (the kit's [`LazySession`]), kept alive, replaced when it fails.

use std::sync::Arc;
use std::time::Duration;

use banlieue_api::Provider;
use banlieue_provider_kit::session::{Connect, LazySession};
use banlieue_vsphere::{Client, KeepAlive};
use kube::Api;

use crate::connection;
use crate::error::{Error, Result};

/// How often an idle session is touched. vCenter ends sessions idle for 30 minutes by default.
pub const KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(300);

/// A lazily opened, kept-alive session to the Provider's vCenter.
#[derive(Debug)]
pub struct Session {
    login: LazySession<Login>,
}

/// How the Provider's vCenter is logged in to.
struct Login {
    kube: kube::Client,
    namespace: String,
    provider: String,
}

impl std::fmt::Debug for Login {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Login")
            .field("namespace", &self.namespace)
            .field("provider", &self.provider)
            .finish_non_exhaustive()
    }
}

/// A logged-in client and the task that keeps it alive, which ends once the session drops the
/// last handle.
#[derive(Clone, Debug)]
struct LoggedIn {
    client: Client,
    _keep_alive: Arc<KeepAlive>,
}

impl Connect for Login {
    type Connection = LoggedIn;
    type Error = Error;

    async fn connect(&self) -> Result<LoggedIn> {
        let providers: Api<Provider> = Api::namespaced(self.kube.clone(), &self.namespace);
        let provider = providers
            .get(&self.provider)
            .await
            .map_err(Error::kube(format!("read Provider {}", self.provider)))?;
        let creds = connection::load(&self.kube, &provider).await?;
        let client = connection::connect(&provider.spec.connection.endpoint, &creds).await?;
        let keep_alive = client.keep_alive(KEEP_ALIVE_INTERVAL);
        Ok(LoggedIn {
            client,
            _keep_alive: Arc::new(keep_alive),
        })
    }
}

impl Session {
    /// A session for Provider `namespace/provider`; nothing is opened yet.
    pub fn new(kube: kube::Client, namespace: &str, provider: &str) -> Session {
        Session {
            login: LazySession::new(Login {
                kube,
                namespace: namespace.to_owned(),
                provider: provider.to_owned(),
            }),
        }
    }

    /// The open session's client, logging in first when there is none.
    pub async fn client(&self) -> Result<Client> {
        // Only the client leaves: the keep-alive stays with the held session, so forgetting
        // the session stops it.
        Ok(self.login.connection().await?.client)
    }

    /// Drops the session, so the next use logs in again (after a transport failure, or when
    /// the credentials may have changed).
    pub async fn forget(&self) {
        self.login.forget().await;
    }
}

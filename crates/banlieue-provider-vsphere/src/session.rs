//! The workload's one vSphere session for its machines: opened on first use with the
//! Provider's credentials, kept alive, replaced when it fails.

use std::time::Duration;

use banlieue_api::Provider;
use banlieue_vsphere::{Client, KeepAlive};
use kube::Api;

use crate::connection;
use crate::error::{Error, Result};

/// How often an idle session is touched. vCenter ends sessions idle for 30 minutes by default.
pub const KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(300);

/// A lazily opened, kept-alive session to the Provider's vCenter.
pub struct Session {
    kube: kube::Client,
    namespace: String,
    provider: String,
    open: tokio::sync::Mutex<Option<Open>>,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("namespace", &self.namespace)
            .field("provider", &self.provider)
            .finish_non_exhaustive()
    }
}

#[derive(Debug)]
struct Open {
    client: Client,
    _keep_alive: KeepAlive,
}

impl Session {
    /// A session for Provider `namespace/provider`; nothing is opened yet.
    pub fn new(kube: kube::Client, namespace: &str, provider: &str) -> Session {
        Session {
            kube,
            namespace: namespace.to_owned(),
            provider: provider.to_owned(),
            open: tokio::sync::Mutex::new(None),
        }
    }

    /// The open session's client, logging in first when there is none.
    pub async fn client(&self) -> Result<Client> {
        let mut open = self.open.lock().await;
        if let Some(o) = open.as_ref() {
            return Ok(o.client.clone());
        }
        let providers: Api<Provider> = Api::namespaced(self.kube.clone(), &self.namespace);
        let provider = providers
            .get(&self.provider)
            .await
            .map_err(Error::kube(format!("read Provider {}", self.provider)))?;
        let creds = connection::load(&self.kube, &provider).await?;
        let client = connection::connect(&provider.spec.connection.endpoint, &creds).await?;
        let keep_alive = client.keep_alive(KEEP_ALIVE_INTERVAL);
        *open = Some(Open {
            client: client.clone(),
            _keep_alive: keep_alive,
        });
        Ok(client)
    }

    /// Drops the session, so the next use logs in again (after a transport failure, or when
    /// the credentials may have changed).
    pub async fn forget(&self) {
        self.open.lock().await.take();
    }
}

//! A connection that re-opens itself. [`Reconnecting`] keeps what it needs to connect; when
//! the connection it handed out is lost, the next [`Reconnecting::client`] opens a new one,
//! waiting between attempts with bounded, jittered exponential backoff. Lifecycle event
//! subscriptions made through it are registered again on every new connection, so a
//! subscriber's stream goes on across reconnects.
//!
//! Calls are not replayed: a call in flight when the connection drops fails with
//! [`Error::ConnectionLost`], because most libvirt calls are not idempotent (a replayed
//! `DOMAIN_CREATE` fails, a replayed volume create makes a second error). Callers that know a
//! call is safe to repeat use [`Reconnecting::call_retrying`].

use std::future::Future;
use std::hash::BuildHasher;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::mpsc;
use tracing::{debug, warn};

use crate::client::{Client, ClientOptions};
use crate::error::{Error, Result};
use crate::events::{DomainEvents, DomainLifecycleEvent};
use crate::tls::{CaBundle, Identity};
use crate::xdr::Procedure;

/// How long to wait between connection attempts: `initial × factor^attempt`, capped at `max`,
/// of which the upper half is random ("equal jitter"), so clients that lost the same daemon do
/// not come back in step. After `attempts` failures the reconnect gives up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// The wait after the first failure.
    pub initial: Duration,
    /// The longest wait.
    pub max: Duration,
    /// How much the wait grows per failure.
    pub factor: u32,
    /// Connection attempts per reconnect, at least 1.
    pub attempts: u32,
}

impl Default for Backoff {
    /// 100 ms, doubling to 5 s, 12 attempts: about 40 s before giving up, which covers a
    /// daemon restart with a capability probe (~8 s on two cores).
    fn default() -> Self {
        Backoff {
            initial: Duration::from_millis(100),
            max: Duration::from_secs(5),
            factor: 2,
            attempts: 12,
        }
    }
}

impl Backoff {
    /// The wait after failed attempt `attempt` (0-based), with `unit` in `[0, 1)` as the
    /// random part. Sans-io, so the rule is tested on its own.
    pub fn delay(&self, attempt: u32, unit: f64) -> Duration {
        let base = self
            .initial
            .checked_mul(self.factor.max(1).saturating_pow(attempt))
            .unwrap_or(self.max)
            .min(self.max);
        let half = base / 2;
        half + half.mul_f64(unit.clamp(0.0, 1.0))
    }
}

/// A random number in `[0, 1)` without a dependency: the standard library seeds each
/// `RandomState` from the OS.
fn jitter_unit() -> f64 {
    let bits = std::collections::hash_map::RandomState::new().hash_one(0u8) >> 11;
    bits as f64 / (1u64 << 53) as f64
}

/// What the function given to [`Reconnecting::with_connector`] returns: a boxed future of a
/// new connection.
pub type ConnectFuture = Pin<Box<dyn Future<Output = Result<Client>> + Send>>;
type Connector = Box<dyn Fn() -> ConnectFuture + Send + Sync>;

struct Inner {
    connect: Connector,
    backoff: Backoff,
    current: tokio::sync::Mutex<Option<Client>>,
    /// How many connections have been opened; 1 after the first.
    generation: AtomicU64,
}

/// A libvirt connection that is re-opened when lost. Cheap to clone; clones share the
/// connection.
///
/// ```no_run
/// # async fn demo(identity: banlieue_libvirt::Identity, ca: banlieue_libvirt::CaBundle) -> banlieue_libvirt::Result<()> {
/// use banlieue_libvirt::proto::remote::procedures as rp;
/// use banlieue_libvirt::{Backoff, ClientOptions, LifecycleUpdate, Reconnecting};
///
/// let conn = Reconnecting::connect(
///     "qemu+tls://kvm-7.example/system",
///     &identity,
///     &ca,
///     ClientOptions::default(),
///     Backoff::default(),
/// )
/// .await?;
/// let version = conn.call_retrying::<rp::ConnectGetLibVersion>(&()).await?.lib_ver;
/// println!("libvirt {}", banlieue_libvirt::version_string(version));
/// let mut watch = conn.lifecycle_events().await?;
/// while let Some(update) = watch.next().await {
///     match update? {
///         LifecycleUpdate::Event(e) => println!("{}: {}", e.domain, e.event),
///         LifecycleUpdate::Resubscribed { .. } => println!("reconnected; re-read state"),
///         _ => {}
///     }
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Reconnecting {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Reconnecting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reconnecting")
            .field("backoff", &self.inner.backoff)
            .field("generation", &self.generation())
            .finish_non_exhaustive()
    }
}

impl Reconnecting {
    /// Connects to `uri` as [`Client::connect_with`] does, now and on every reconnect. Fails
    /// when the first connection cannot be made within the backoff's attempts.
    pub async fn connect(
        uri: &str,
        identity: &Identity,
        ca: &CaBundle,
        opts: ClientOptions,
        backoff: Backoff,
    ) -> Result<Reconnecting> {
        // Refuse a bad URI or bad TLS material at once rather than retrying it.
        crate::uri::ConnectUri::parse(uri)?;
        crate::tls::client_config(identity, ca)?;
        let (uri, identity, ca) = (uri.to_string(), identity.clone(), ca.clone());
        Self::with_connector(
            move || {
                let (uri, identity, ca, opts) =
                    (uri.clone(), identity.clone(), ca.clone(), opts.clone());
                Box::pin(async move { Client::connect_with(&uri, &identity, &ca, opts).await })
            },
            backoff,
        )
        .await
    }

    /// Connects to `uri` as [`Client::connect_plain_with`] does (a unix socket or plain TCP),
    /// now and on every reconnect.
    pub async fn connect_plain(
        uri: &str,
        opts: ClientOptions,
        backoff: Backoff,
    ) -> Result<Reconnecting> {
        // Refuse a bad URI at once rather than retrying it.
        crate::uri::ConnectUri::parse(uri)?;
        let uri = uri.to_string();
        Self::with_connector(
            move || {
                let (uri, opts) = (uri.clone(), opts.clone());
                Box::pin(async move { Client::connect_plain_with(&uri, opts).await })
            },
            backoff,
        )
        .await
    }

    /// Reconnects with any way of opening a connection (a Unix socket, plain TCP in tests).
    pub async fn with_connector<F>(connect: F, backoff: Backoff) -> Result<Reconnecting>
    where
        F: Fn() -> ConnectFuture + Send + Sync + 'static,
    {
        let r = Reconnecting {
            inner: Arc::new(Inner {
                connect: Box::new(connect),
                backoff,
                current: tokio::sync::Mutex::new(None),
                generation: AtomicU64::new(0),
            }),
        };
        r.client().await?;
        Ok(r)
    }

    /// How many connections have been opened so far.
    pub fn generation(&self) -> u64 {
        self.inner.generation.load(Ordering::Acquire)
    }

    /// The live connection, opening a new one first if the last one was lost. Concurrent
    /// callers share one reconnect.
    pub async fn client(&self) -> Result<Client> {
        let mut current = self.inner.current.lock().await;
        if let Some(c) = current.as_ref().filter(|c| c.is_alive()) {
            return Ok(c.clone());
        }
        *current = None;
        let backoff = self.inner.backoff;
        let attempts = backoff.attempts.max(1);
        let mut attempt = 0;
        loop {
            match (self.inner.connect)().await {
                Ok(c) => {
                    let generation = self.inner.generation.fetch_add(1, Ordering::AcqRel) + 1;
                    debug!(generation, attempt, "libvirt connection opened");
                    *current = Some(c.clone());
                    return Ok(c);
                }
                Err(e) if !e.is_transient() => return Err(e),
                Err(e) if attempt + 1 >= attempts => {
                    return Err(Error::ReconnectGaveUp {
                        attempts,
                        last: Box::new(e),
                    });
                }
                Err(e) => {
                    let wait = backoff.delay(attempt, jitter_unit());
                    debug!(attempt, ?wait, error = %e, "libvirt connect failed; retrying");
                    tokio::time::sleep(wait).await;
                    attempt += 1;
                }
            }
        }
    }

    /// Calls `P` on the live connection (reconnecting first if it was lost). A call cut off
    /// by a lost connection is not repeated.
    pub async fn call<P: Procedure>(&self, args: &P::Args) -> Result<P::Ret> {
        self.client().await?.call::<P>(args).await
    }

    /// Calls `P`, and once more on a new connection if the connection was lost during the
    /// call. Only for calls that are safe to repeat (lookups, lists, gets).
    pub async fn call_retrying<P: Procedure>(&self, args: &P::Args) -> Result<P::Ret> {
        match self.call::<P>(args).await {
            Err(Error::ConnectionLost(_) | Error::Closed) => self.call::<P>(args).await,
            other => other,
        }
    }

    /// Lifecycle events of every domain, across reconnects. After each reconnect the stream
    /// yields [`LifecycleUpdate::Resubscribed`]: events of the gap are lost, so a consumer
    /// that keeps state re-reads it then. The stream ends with the error when a reconnect
    /// gives up; dropping it deregisters the callback.
    pub async fn lifecycle_events(&self) -> Result<LifecycleWatch> {
        let events = DomainEvents::subscribe(&self.client().await?).await?;
        let (tx, rx) = mpsc::channel(256);
        let task = tokio::spawn(watch_lifecycle(self.clone(), events, tx));
        Ok(LifecycleWatch { rx, task })
    }

    async fn resubscribe(&self) -> Result<DomainEvents> {
        // The fresh connection may itself drop before the register call: try a few times.
        let mut last = None;
        for _ in 0..3 {
            let client = self.client().await?;
            match DomainEvents::subscribe(&client).await {
                Ok(events) => return Ok(events),
                Err(e) if e.is_transient() => last = Some(e),
                Err(e) => return Err(e),
            }
        }
        Err(last.unwrap_or(Error::Closed))
    }
}

/// What a [`LifecycleWatch`] yields. `#[non_exhaustive]`: a `match` needs a wildcard arm.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum LifecycleUpdate {
    /// A lifecycle event.
    Event(DomainLifecycleEvent),
    /// The connection was lost and a new one carries the subscription from here on.
    Resubscribed {
        /// [`Reconnecting::generation`] at that point.
        generation: u64,
    },
}

/// Domain lifecycle events that survive reconnects; see [`Reconnecting::lifecycle_events`].
#[derive(Debug)]
pub struct LifecycleWatch {
    rx: mpsc::Receiver<Result<LifecycleUpdate>>,
    task: tokio::task::JoinHandle<()>,
}

impl LifecycleWatch {
    /// The next update; `None` after the stream ended.
    pub async fn next(&mut self) -> Option<Result<LifecycleUpdate>> {
        self.rx.recv().await
    }
}

impl futures_core::Stream for LifecycleWatch {
    type Item = Result<LifecycleUpdate>;

    fn poll_next(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        self.rx.poll_recv(cx)
    }
}

impl Drop for LifecycleWatch {
    fn drop(&mut self) {
        // The task also ends by itself once it sees the receiver gone; aborting drops its
        // `DomainEvents`, which deregisters the callback.
        self.task.abort();
    }
}

async fn watch_lifecycle(
    conn: Reconnecting,
    mut events: DomainEvents,
    tx: mpsc::Sender<Result<LifecycleUpdate>>,
) {
    loop {
        loop {
            tokio::select! {
                () = tx.closed() => return,
                next = events.next() => match next {
                    Some(Ok(e)) => {
                        if tx.send(Ok(LifecycleUpdate::Event(e))).await.is_err() {
                            return;
                        }
                    }
                    Some(Err(e)) => {
                        warn!(error = %e, "undecodable lifecycle event");
                        if tx.send(Err(e)).await.is_err() {
                            return;
                        }
                    }
                    None => break,
                },
            }
        }
        debug!("lifecycle subscription lost with its connection; resubscribing");
        let again = tokio::select! {
            () = tx.closed() => return,
            r = conn.resubscribe() => r,
        };
        match again {
            Ok(e) => {
                events = e;
                let update = LifecycleUpdate::Resubscribed {
                    generation: conn.generation(),
                };
                if tx.send(Ok(update)).await.is_err() {
                    return;
                }
            }
            Err(e) => {
                let _ = tx.send(Err(e)).await;
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_is_capped_and_jitters_within_the_upper_half() {
        let b = Backoff {
            initial: Duration::from_millis(100),
            max: Duration::from_secs(2),
            factor: 2,
            attempts: 10,
        };
        let low: Vec<_> = (0..7).map(|a| b.delay(a, 0.0).as_millis()).collect();
        let high: Vec<_> = (0..7).map(|a| b.delay(a, 1.0).as_millis()).collect();
        assert_eq!(low, vec![50, 100, 200, 400, 800, 1000, 1000]);
        assert_eq!(high, vec![100, 200, 400, 800, 1600, 2000, 2000]);
        assert_eq!(
            b.delay(1000, 0.5),
            Duration::from_millis(1500),
            "no overflow"
        );
        for _ in 0..100 {
            let u = jitter_unit();
            assert!((0.0..1.0).contains(&u), "{u}");
        }
    }
}

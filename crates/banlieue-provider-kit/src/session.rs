//! A backend's one connection, opened on first use and shared: [`LazySession`] around what a
//! backend says about connecting ([`Connect`]). A backend that learns from an error that the
//! connection is lost [`forgets`](LazySession::forget) it, and the next use connects again.

use std::future::Future;

use tokio::sync::Mutex;

/// How a backend opens its connection, and what it knows of one it holds.
pub trait Connect: Send + Sync {
    /// What every user of the session gets: a handle on the one connection.
    type Connection: Clone + Send + Sync;
    type Error: Send;

    /// Opens a connection, reading whatever settings and credentials are current.
    fn connect(&self) -> impl Future<Output = Result<Self::Connection, Self::Error>> + Send;

    /// Whether a held connection can still be used; one that cannot is replaced on its next
    /// use. A backend whose connections do not tell relies on [`LazySession::forget`] alone.
    fn is_alive(&self, _connection: &Self::Connection) -> bool {
        true
    }

    /// Told whether a connection is held, each time one is opened or dropped (a backend keeps a
    /// gauge of it). Called under the session's lock, so the last call is the truth.
    fn held(&self, _held: bool) {}
}

/// One lazily opened connection, shared by every user: the first use connects, concurrent first
/// uses wait for that one connect, and later uses get the held connection until it is
/// forgotten or no longer alive.
pub struct LazySession<C: Connect> {
    connector: C,
    held: Mutex<Option<C::Connection>>,
}

impl<C: Connect + std::fmt::Debug> std::fmt::Debug for LazySession<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LazySession")
            .field("connector", &self.connector)
            .finish_non_exhaustive()
    }
}

impl<C: Connect> LazySession<C> {
    /// A session that connects with `connector`; nothing is opened yet.
    pub fn new(connector: C) -> LazySession<C> {
        LazySession {
            connector,
            held: Mutex::new(None),
        }
    }

    /// The held connection, connecting first when there is none or it is no longer alive. A
    /// failed connect is returned and nothing is held: the next use tries again.
    pub async fn connection(&self) -> Result<C::Connection, C::Error> {
        let mut held = self.held.lock().await;
        if let Some(connection) = held.as_ref() {
            if self.connector.is_alive(connection) {
                return Ok(connection.clone());
            }
            *held = None;
            self.connector.held(false);
        }
        let connection = self.connector.connect().await?;
        *held = Some(connection.clone());
        self.connector.held(true);
        Ok(connection)
    }

    /// Drops the held connection after an error showed it lost (or its credentials may have
    /// changed), so the next use connects again. Users holding a handle keep it.
    pub async fn forget(&self) {
        if self.held.lock().await.take().is_some() {
            self.connector.held(false);
        }
    }

    /// What this session connects with.
    pub fn connector(&self) -> &C {
        &self.connector
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
    use std::time::Duration;

    use super::*;

    /// Numbers its connections from 1; its connect takes a while, so concurrent users overlap.
    #[derive(Debug, Default)]
    struct Counting {
        connects: AtomicU32,
        refuse: AtomicBool,
        dead: AtomicU32,
        held: AtomicBool,
    }

    impl Connect for Counting {
        type Connection = u32;
        type Error = &'static str;

        async fn connect(&self) -> Result<u32, &'static str> {
            tokio::time::sleep(Duration::from_millis(100)).await;
            if self.refuse.load(Ordering::SeqCst) {
                return Err("refused");
            }
            Ok(self.connects.fetch_add(1, Ordering::SeqCst) + 1)
        }

        fn is_alive(&self, connection: &u32) -> bool {
            *connection != self.dead.load(Ordering::SeqCst)
        }

        fn held(&self, held: bool) {
            self.held.store(held, Ordering::SeqCst);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn concurrent_first_users_share_one_connect() {
        let session = Arc::new(LazySession::new(Counting::default()));
        let users: Vec<_> = (0..8)
            .map(|_| {
                let session = session.clone();
                tokio::spawn(async move { session.connection().await })
            })
            .collect();
        for user in users {
            assert_eq!(user.await.unwrap(), Ok(1));
        }
        assert_eq!(session.connector().connects.load(Ordering::SeqCst), 1);
        assert!(session.connector().held.load(Ordering::SeqCst));
    }

    #[tokio::test(start_paused = true)]
    async fn a_forgotten_connection_is_replaced_on_next_use() {
        let session = LazySession::new(Counting::default());
        assert_eq!(session.connection().await, Ok(1));
        assert_eq!(session.connection().await, Ok(1), "held, not reopened");
        session.forget().await;
        assert!(!session.connector().held.load(Ordering::SeqCst));
        assert_eq!(session.connection().await, Ok(2));
        assert!(session.connector().held.load(Ordering::SeqCst));
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_no_longer_alive_is_replaced() {
        let session = LazySession::new(Counting::default());
        assert_eq!(session.connection().await, Ok(1));
        session.connector().dead.store(1, Ordering::SeqCst);
        assert_eq!(session.connection().await, Ok(2));
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_connect_holds_nothing_and_the_next_use_tries_again() {
        let session = LazySession::new(Counting::default());
        session.connector().refuse.store(true, Ordering::SeqCst);
        assert_eq!(session.connection().await, Err("refused"));
        assert!(!session.connector().held.load(Ordering::SeqCst));
        session.connector().refuse.store(false, Ordering::SeqCst);
        assert_eq!(session.connection().await, Ok(1));
    }
}

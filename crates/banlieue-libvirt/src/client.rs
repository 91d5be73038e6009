//! The async client: a thin tokio shell around [`crate::dispatch`]. One reader task routes
//! what arrives; senders write their own packets when the connection is free to write (see
//! `Outbox`), with a writer task that takes over when the socket would block; a keepalive
//! task pings a silent peer and declares it dead after `interval × count`.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use bytes::{Buf, Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio_util::codec::FramedRead;
use tracing::{debug, warn};

use crate::dispatch::{
    CallTable, Completion, Incoming, Keepalive, KeepaliveAction, classify, keepalive_packet,
};
use crate::error::{Error, RemoteError, Result};
use crate::packet::{Packet, PacketCodec, PacketError};
use crate::proto::net::{VirNetMessageHeader, VirNetMessageStatus, VirNetMessageType};
use crate::proto::remote::{self, procedures as rp};
use crate::tls::{CaBundle, Identity};
use crate::uri::{ConnectUri, Transport};
use crate::xdr::{Procedure, Xdr};

/// libvirt's feature number for the keepalive program (`VIR_DRV_FEATURE_PROGRAM_KEEPALIVE`,
/// src/libvirt_internal.h).
const FEATURE_PROGRAM_KEEPALIVE: i32 = 10;

/// Tunables of one connection.
#[derive(Debug, Clone)]
pub struct ClientOptions {
    /// Default deadline of a call; `None` waits as long as the connection lives.
    pub call_timeout: Option<Duration>,
    /// Deadline of the TCP connect, the TLS handshake and the server's confirmation byte
    /// together; `None` leaves it to the kernel (minutes for an unreachable host).
    pub connect_timeout: Option<Duration>,
    /// Ping after this much silence.
    pub keepalive_interval: Duration,
    /// Give the peer up after `interval × count` of silence.
    pub keepalive_count: u32,
    /// Packets queued for sending before senders wait (backpressure).
    pub send_queue: usize,
    /// Stream packets buffered per open stream before the reader waits.
    pub stream_buffer: usize,
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            call_timeout: Some(Duration::from_secs(120)),
            connect_timeout: Some(Duration::from_secs(30)),
            keepalive_interval: Duration::from_secs(5),
            keepalive_count: 5,
            send_queue: 64,
            stream_buffer: 16,
        }
    }
}

type Reply = Result<Packet>;

#[derive(Default)]
struct State {
    calls: CallTable<oneshot::Sender<Reply>>,
    streams: HashMap<u32, mpsc::Sender<Result<Packet>>>,
    /// Event subscribers by procedure number.
    events: HashMap<i32, Vec<mpsc::Sender<Packet>>>,
    dead: Option<String>,
    last_heard: Option<Instant>,
}

pub(crate) struct Shared {
    outbox: Outbox,
    /// Packets dropped as answering nothing or not meant for a client; see
    /// [`Client::ignored_packets`].
    ignored: AtomicU64,
    state: Mutex<State>,
    opts: ClientOptions,
    tasks: Mutex<Vec<JoinHandle<()>>>,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("opts", &self.opts)
            .finish_non_exhaustive()
    }
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave the table half-updated in a way that
        // matters more than losing the connection, so poisoning is ignored.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Ends the connection: every waiting call and stream fails with `ConnectionLost`.
    fn kill(&self, reason: String) {
        let (calls, streams) = {
            let mut st = self.lock();
            if st.dead.is_some() {
                return;
            }
            debug!(%reason, "libvirt connection lost");
            st.dead = Some(reason.clone());
            st.events.clear();
            (st.calls.drain(), std::mem::take(&mut st.streams))
        };
        // A sender waiting for room (an upload whose peer stopped reading) is woken to fail.
        self.outbox.close();
        for c in calls {
            let _ = c.send(Err(Error::ConnectionLost(reason.clone())));
        }
        for (_, s) in streams {
            let _ = s.try_send(Err(Error::ConnectionLost(reason.clone())));
        }
        for t in self
            .tasks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain(..)
        {
            t.abort();
        }
    }

    /// Counts a packet dropped by the reader. Only the first is a warning: a peer sending
    /// them in a loop must not flood the log.
    fn ignore(&self, packet: &Packet, what: &'static str) {
        let h = &packet.header;
        let before = self.ignored.fetch_add(1, Ordering::Relaxed);
        let (kind, program, procedure, serial) = (h.r#type, h.prog, h.r#proc, h.serial);
        if before == 0 {
            warn!(?kind, program, procedure, serial, "ignored {what}");
        } else {
            let ignored = before + 1;
            debug!(?kind, program, procedure, serial, ignored, "ignored {what}");
        }
    }

    fn dead_reason(&self) -> Option<String> {
        self.lock().dead.clone()
    }

    /// Queues `packet` once the send queue has room and writes it out if the connection is
    /// free to write; a large packet (stream data) is left to the writer task, so that the
    /// sender prepares its next one (reads the next chunk of a file) while this one goes out.
    /// Cancel-safe: a sender dropped while it waits for room has sent nothing.
    async fn send(&self, packet: &Packet) -> Result<()> {
        if let Offered::Closed = self.outbox.push_when_room(packet).await? {
            let reason = self.dead_reason().unwrap_or_else(|| "closed".into());
            return Err(Error::ConnectionLost(reason));
        }
        if packet.body.len() <= WRITE_IN_PLACE_MAX {
            self.flush();
        } else {
            self.outbox.wake_writer();
        }
        Ok(())
    }

    /// Queues `packet` whatever the queue holds, and writes it out if the connection is free
    /// to write: for keepalives and the close of a dropped client, tiny and rare, from places
    /// that cannot wait.
    fn send_now(&self, packet: &Packet) {
        if self.outbox.push(packet).is_ok() {
            self.flush();
        }
    }

    fn flush(&self) {
        if let Err(e) = self.outbox.pump() {
            self.kill(format!("write: {e}"));
        }
    }
}

/// Packets with bodies up to this size are written by their sender (calls, small stream
/// packets); larger ones by the writer task.
const WRITE_IN_PLACE_MAX: usize = 16 * 1024;

/// The sending side of a connection, shared by every sender.
///
/// A packet is encoded whole into the queue under a lock, with no await in between: it is
/// queued entirely or not at all, whatever becomes of the sender's future. Whoever then finds
/// the transport free writes the queue out: for calls the sender itself, in its own task, so
/// that a call reaches the socket without a hand-off to another task (stream data is left to
/// the writer task, see `Shared::send`). A sender that
/// finds the transport taken leaves its packet to the holder, which writes what was queued
/// meanwhile before it lets go. The transport is always polled with the writer task's waker:
/// when the socket would block, the writer task is what the socket wakes, and it writes the
/// rest.
///
/// Each packet is written by a write of its own, so that with TLS no record holds the end of
/// one packet and the start of the next. libvirtd reads one packet at a time and stops reading
/// a client whose stream queue or request limit is full; bytes of a next packet already
/// decrypted into its TLS library's buffer are then invisible to its event loop (it checks
/// SASL and SSH sessions for cached data, not TLS) and wait for more bytes to arrive: an
/// upload's end, written together with its last data, waited for the next keepalive.
struct Outbox {
    queue: Mutex<Queue>,
    wire: Mutex<Wire>,
    /// Wakes senders waiting for room in a full queue.
    room: tokio::sync::Notify,
}

struct Queue {
    /// Encoded packets, oldest first.
    packets: VecDeque<Bytes>,
    /// Senders wait while this many packets are queued.
    limit: usize,
    /// The connection is dead: nothing will take packets any more.
    closed: bool,
}

/// What became of a packet offered to a full queue.
enum Offered {
    Queued,
    /// The connection died first; the packet was not queued.
    Closed,
}

struct Wire {
    io: std::pin::Pin<Box<dyn AsyncWrite + Send>>,
    /// What the transport has not accepted yet of the packet being written.
    writing: Bytes,
    /// The writer task's waker, once it has run.
    writer: Option<Waker>,
}

impl Outbox {
    fn new(io: impl AsyncWrite + Send + 'static, limit: usize) -> Outbox {
        Outbox {
            queue: Mutex::new(Queue {
                packets: VecDeque::new(),
                limit: limit.max(1),
                closed: false,
            }),
            wire: Mutex::new(Wire {
                io: Box::pin(io),
                writing: Bytes::new(),
                writer: None,
            }),
            room: tokio::sync::Notify::new(),
        }
    }

    fn queue(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn encode(packet: &Packet) -> std::result::Result<Bytes, PacketError> {
        let mut frame = BytesMut::with_capacity(packet.encoded_len());
        packet.encode(&mut frame)?;
        Ok(frame.freeze())
    }

    /// Queues `packet` whole, however full the queue is (keepalives, the close of a dropped
    /// client: tiny and rare).
    fn push(&self, packet: &Packet) -> std::result::Result<(), PacketError> {
        let frame = Self::encode(packet)?;
        self.queue().packets.push_back(frame);
        Ok(())
    }

    /// Waits until the queue has room, then queues `packet` whole; or, once the connection
    /// is dead ([`Outbox::close`]), gives up. Cancel-safe: a sender dropped while it waits has
    /// queued nothing.
    async fn push_when_room(&self, packet: &Packet) -> std::result::Result<Offered, PacketError> {
        let frame = Self::encode(packet)?;
        loop {
            let room = self.room.notified();
            let mut room = std::pin::pin!(room);
            // Registered before the check, so that a packet taken (or the close) between the
            // check and the wait still wakes it.
            room.as_mut().enable();
            {
                let mut q = self.queue();
                if q.closed {
                    return Ok(Offered::Closed);
                }
                if q.packets.len() < q.limit {
                    q.packets.push_back(frame);
                    return Ok(Offered::Queued);
                }
            }
            room.await;
        }
    }

    /// Marks the queue dead and wakes every sender waiting for room, which then gives up:
    /// the writer that would have made room is gone with the connection.
    fn close(&self) {
        self.queue().closed = true;
        self.room.notify_waiters();
    }

    /// Has the writer task write what is queued. If the transport is held, its holder writes
    /// it before letting go.
    fn wake_writer(&self) {
        if let Ok(wire) = self.wire.try_lock()
            && let Some(writer) = &wire.writer
        {
            writer.wake_by_ref();
        }
    }

    /// Writes out what is queued, unless another sender holds the transport (it writes what
    /// we queued before letting go) or the socket would block (the writer task resumes when
    /// it can take more). Never waits.
    fn pump(&self) -> std::io::Result<()> {
        loop {
            let Ok(mut wire) = self.wire.try_lock() else {
                return Ok(());
            };
            let Wire {
                io,
                writing,
                writer,
            } = &mut *wire;
            // Before the writer task's first run: that run writes the queue.
            let Some(waker) = writer.as_ref() else {
                return Ok(());
            };
            match self.write_out(io.as_mut(), writing, &mut Context::from_waker(waker)) {
                Poll::Pending => return Ok(()),
                Poll::Ready(r) => r?,
            }
            drop(wire);
            // A sender whose try_lock failed while we wrote relies on us for its packet.
            if self.queue().packets.is_empty() {
                return Ok(());
            }
        }
    }

    /// Writes queued packets, one write each, until none is left, then flushes.
    fn write_out(
        &self,
        mut io: std::pin::Pin<&mut (dyn AsyncWrite + Send)>,
        writing: &mut Bytes,
        cx: &mut Context<'_>,
    ) -> Poll<std::io::Result<()>> {
        loop {
            if writing.is_empty() {
                let mut q = self.queue();
                let was_full = q.packets.len() >= q.limit;
                let Some(next) = q.packets.pop_front() else {
                    break;
                };
                *writing = next;
                drop(q);
                if was_full {
                    self.room.notify_waiters();
                }
            }
            let n = std::task::ready!(io.as_mut().poll_write(cx, writing))?;
            if n == 0 {
                return Poll::Ready(Err(std::io::ErrorKind::WriteZero.into()));
            }
            writing.advance(n);
        }
        io.poll_flush(cx)
    }
}

/// A connection to libvirtd. Cheap to clone; all clones share the connection, which closes
/// when the last clone is dropped.
///
/// ```no_run
/// # async fn demo() -> banlieue_libvirt::Result<()> {
/// use banlieue_libvirt::proto::remote::{self, procedures as rp};
/// use banlieue_libvirt::{CaBundle, Client, Identity};
///
/// let identity = Identity::from_files("clientcert.pem".as_ref(), "clientkey.pem".as_ref())?;
/// let ca = CaBundle::from_file("cacert.pem".as_ref())?;
/// let client = Client::connect("qemu+tls://kvm-7.example/system", &identity, &ca).await?;
/// // Any procedure, by its marker type, with typed arguments and reply:
/// let hostname = client.call::<rp::ConnectGetHostname>(&()).await?.hostname;
/// let dom = client
///     .call::<rp::DomainLookupByName>(&remote::RemoteDomainLookupByNameArgs { name: "web-01".into() })
///     .await;
/// if let Err(e) = &dom {
///     if e.is_not_found() { println!("no web-01 on {hostname}"); }
/// }
/// client.close().await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Client {
    shared: Arc<Shared>,
    _closer: Arc<Closer>,
}

/// Closes the connection (best effort CONNECT_CLOSE, then stop the tasks) when the last
/// client clone goes away.
#[derive(Debug)]
struct Closer(Arc<Shared>);

impl Drop for Closer {
    fn drop(&mut self) {
        let shared = self.0.clone();
        if shared.dead_reason().is_some() {
            return;
        }
        shared.send_now(&empty_call::<rp::ConnectClose>());
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                tokio::time::sleep(Duration::from_millis(200)).await;
                shared.kill("client dropped".into());
            });
        } else {
            shared.kill("client dropped".into());
        }
    }
}

fn header(
    program: u32,
    version: u32,
    procedure: i32,
    kind: VirNetMessageType,
    serial: u32,
    status: VirNetMessageStatus,
) -> VirNetMessageHeader {
    VirNetMessageHeader {
        prog: program,
        vers: version,
        r#proc: procedure,
        r#type: kind,
        serial,
        status,
    }
}

/// Hands `packet` to every subscriber, forgetting those whose receiver is gone. Returns how many
/// live subscribers were full (they miss this event; a slow reader never blocks the connection).
fn fan_out(subscribers: &mut Vec<mpsc::Sender<Packet>>, packet: &Packet) -> usize {
    subscribers.retain(|s| !s.is_closed());
    subscribers
        .iter()
        .filter(|s| s.try_send(packet.clone()).is_err())
        .count()
}

fn is_drop_close_reply(packet: &Packet) -> bool {
    packet.header.serial == 0
        && packet.header.prog == rp::ConnectClose::PROGRAM
        && packet.header.r#proc == rp::ConnectClose::NUMBER
}

fn empty_call<P: Procedure>() -> Packet {
    Packet {
        header: header(
            P::PROGRAM,
            P::VERSION,
            P::NUMBER,
            VirNetMessageType::CALL,
            0,
            VirNetMessageStatus::OK,
        ),
        fds: None,
        body: Bytes::new(),
    }
}

impl Client {
    /// Connects to `qemu+tls://host[:port]/system` (or `/session`, or `test+tls://…/default`)
    /// with mutual TLS, trusting only `ca`, and opens the connection. Only TLS URIs: a unix
    /// socket or plain TCP URI fails with [`Error::TransportMismatch`] (see
    /// [`Client::connect_plain`]), so code that holds TLS material never falls back to clear
    /// text.
    pub async fn connect(uri: &str, identity: &Identity, ca: &CaBundle) -> Result<Client> {
        Self::connect_with(uri, identity, ca, ClientOptions::default()).await
    }

    /// [`Client::connect`] with explicit tunables.
    pub async fn connect_with(
        uri: &str,
        identity: &Identity,
        ca: &CaBundle,
        opts: ClientOptions,
    ) -> Result<Client> {
        let uri = ConnectUri::parse(uri)?;
        if uri.transport != Transport::Tls {
            return Err(Error::TransportMismatch {
                scheme: uri.scheme(),
                reason: "does not use TLS: open it with Client::connect_plain",
            });
        }
        let config = crate::tls::client_config(identity, ca)?;
        let name = crate::tls::server_name(&uri.host)?;
        let address = uri.address();
        let tls = Self::open_tls(&uri, &address, config, name);
        let tls =
            match opts.connect_timeout {
                Some(after) => tokio::time::timeout(after, tls).await.map_err(|_| {
                    Error::ConnectTimeout {
                        address: address.clone(),
                        after,
                    }
                })??,
                None => tls.await?,
            };
        Self::handshake_with(tls, &uri.server_uri(), opts).await
    }

    /// Connects without TLS: to the local daemon's unix socket (`qemu:///system`,
    /// `qemu:///session`, `qemu+unix:///system?socket=PATH`) or over plain TCP
    /// (`qemu+tcp://host[:port]/system`, for test setups: nothing is encrypted or
    /// authenticated). A `+tls` URI fails with [`Error::TransportMismatch`]: it needs
    /// [`Client::connect`] and TLS material.
    pub async fn connect_plain(uri: &str) -> Result<Client> {
        Self::connect_plain_with(uri, ClientOptions::default()).await
    }

    /// [`Client::connect_plain`] with explicit tunables; `connect_timeout` bounds opening the
    /// socket.
    pub async fn connect_plain_with(uri: &str, opts: ClientOptions) -> Result<Client> {
        let uri = ConnectUri::parse(uri)?;
        let address = uri.address();
        let connect_error = |source| Error::Connect {
            address: address.clone(),
            source,
        };
        let deadline = |after| Error::ConnectTimeout {
            address: address.clone(),
            after,
        };
        let server_uri = uri.server_uri();
        match &uri.transport {
            Transport::Unix { socket } => {
                let open = tokio::net::UnixStream::connect(socket);
                let stream = match opts.connect_timeout {
                    Some(after) => tokio::time::timeout(after, open)
                        .await
                        .map_err(|_| deadline(after))?,
                    None => open.await,
                }
                .map_err(connect_error)?;
                Self::handshake_with(stream, &server_uri, opts).await
            }
            Transport::Tcp => {
                let open = tokio::net::TcpStream::connect(address.as_str());
                let stream = match opts.connect_timeout {
                    Some(after) => tokio::time::timeout(after, open)
                        .await
                        .map_err(|_| deadline(after))?,
                    None => open.await,
                }
                .map_err(connect_error)?;
                let _ = stream.set_nodelay(true);
                Self::handshake_with(stream, &server_uri, opts).await
            }
            _ => Err(Error::TransportMismatch {
                scheme: uri.scheme(),
                reason: "needs TLS material: open it with Client::connect",
            }),
        }
    }

    /// TCP, TLS, and libvirtd's confirmation that it accepted the client certificate.
    async fn open_tls(
        uri: &ConnectUri,
        address: &str,
        config: Arc<rustls::ClientConfig>,
        name: rustls::pki_types::ServerName<'static>,
    ) -> Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
        let tcp = tokio::net::TcpStream::connect(address)
            .await
            .map_err(|source| Error::Connect {
                address: address.to_string(),
                source,
            })?;
        let _ = tcp.set_nodelay(true);
        let mut tls = tokio_rustls::TlsConnector::from(config)
            .connect(name, tcp)
            .await
            .map_err(|source| crate::tls::handshake_error(&uri.host, source))?;
        // libvirtd sends one byte once it has accepted the client certificate and closes the
        // connection if it has not (with TLS 1.3 the client only learns that here).
        let mut confirmation = [0u8; 1];
        match tls.read(&mut confirmation).await {
            Ok(1) if confirmation[0] == 1 => {}
            Ok(1) => return Err(Error::BadConfirmation(confirmation[0])),
            Ok(_) => {
                return Err(Error::CertificateRefused {
                    detail: "the connection was closed".into(),
                });
            }
            Err(e) => {
                return Err(Error::CertificateRefused {
                    detail: e.to_string(),
                });
            }
        }
        Ok(tls)
    }

    /// Runs libvirt's open sequence over any byte stream (a Unix socket, a test pipe, or
    /// plain TCP for wire captures): AUTH_LIST, keepalive negotiation, CONNECT_OPEN.
    pub async fn handshake<IO>(io: IO, server_uri: &str) -> Result<Client>
    where
        IO: AsyncRead + AsyncWrite + Send + 'static,
    {
        Self::handshake_with(io, server_uri, ClientOptions::default()).await
    }

    /// [`Client::handshake`] with explicit tunables (`connect_timeout` does not apply: the
    /// transport is already open).
    pub async fn handshake_with<IO>(io: IO, server_uri: &str, opts: ClientOptions) -> Result<Client>
    where
        IO: AsyncRead + AsyncWrite + Send + 'static,
    {
        let client = Self::start(io, opts);
        let auth: remote::RemoteAuthListRet = client.call::<rp::AuthList>(&()).await?;
        let types: Vec<i32> = auth.types.iter().map(|t| t.0).collect();
        if !types.is_empty() && !types.contains(&remote::RemoteAuthType::NONE.0) {
            return Err(Error::AuthUnsupported(types));
        }
        let keepalive: remote::RemoteConnectSupportsFeatureRet = client
            .call::<rp::ConnectSupportsFeature>(&remote::RemoteConnectSupportsFeatureArgs {
                feature: FEATURE_PROGRAM_KEEPALIVE,
            })
            .await?;
        client
            .call::<rp::ConnectOpen>(&remote::RemoteConnectOpenArgs {
                name: Some(server_uri.to_string()),
                flags: 0,
            })
            .await?;
        if keepalive.supported != 0 {
            client.start_keepalive();
        }
        Ok(client)
    }

    fn start<IO>(io: IO, opts: ClientOptions) -> Client
    where
        IO: AsyncRead + AsyncWrite + Send + 'static,
    {
        let (read, write) = tokio::io::split(io);
        let shared = Arc::new(Shared {
            outbox: Outbox::new(write, opts.send_queue),
            ignored: AtomicU64::new(0),
            state: Mutex::new(State::default()),
            opts,
            tasks: Mutex::new(Vec::new()),
        });
        let reader = tokio::spawn(read_loop(
            Arc::downgrade(&shared),
            FramedRead::new(read, PacketCodec),
        ));
        let writer = tokio::spawn(write_loop(Arc::downgrade(&shared)));
        shared
            .tasks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend([reader, writer]);
        Client {
            shared: shared.clone(),
            _closer: Arc::new(Closer(shared)),
        }
    }

    fn start_keepalive(&self) {
        let weak = Arc::downgrade(&self.shared);
        let rule = Keepalive {
            interval: self.shared.opts.keepalive_interval,
            count: self.shared.opts.keepalive_count.max(1),
        };
        self.shared.lock().last_heard = Some(Instant::now());
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(rule.interval / 2);
            loop {
                tick.tick().await;
                let Some(shared) = weak.upgrade() else { return };
                let Some(last) = shared.lock().last_heard else {
                    continue;
                };
                match rule.decide(last, Instant::now()) {
                    KeepaliveAction::Nothing => {}
                    KeepaliveAction::SendPing => {
                        shared.send_now(&keepalive_packet(false));
                    }
                    KeepaliveAction::Dead => {
                        let silent = rule.interval * rule.count;
                        shared.kill(format!(
                            "no response from the server for {silent:?} (keepalive)"
                        ));
                        return;
                    }
                }
            }
        });
        self.shared
            .tasks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(task);
    }

    /// How many packets from the server this connection has dropped because they made no
    /// sense to a client: a reply whose serial (and program) matches no call in flight, a CALL
    /// (the server calling the client), a keepalive other than PING/PONG, or a packet of an
    /// unknown type. Each is logged (the first at warn level, the rest at debug) and otherwise
    /// ignored: the connection and the calls in flight carry on, so a confused or hostile
    /// server cannot end a connection others use by sending them. A count that grows means the
    /// peer is not a well-behaved libvirtd. Replies to calls the client gave up on (timed out,
    /// cancelled) and stream packets of an already closed stream are expected and not counted.
    pub fn ignored_packets(&self) -> u64 {
        self.shared.ignored.load(Ordering::Relaxed)
    }

    /// Whether the connection is still up.
    pub fn is_alive(&self) -> bool {
        self.shared.dead_reason().is_none()
    }

    /// Calls procedure `P` with the default timeout.
    pub async fn call<P: Procedure>(&self, args: &P::Args) -> Result<P::Ret> {
        self.call_timeout::<P>(args, self.shared.opts.call_timeout)
            .await
    }

    /// Calls procedure `P`, failing with [`Error::Timeout`] after `timeout`.
    pub async fn call_timeout<P: Procedure>(
        &self,
        args: &P::Args,
        timeout: Option<Duration>,
    ) -> Result<P::Ret> {
        let (reply, _) = self.raw_call::<P>(args, timeout, None).await?;
        reply.body::<P::Ret>().map_err(Error::from)
    }

    /// Sends a call of `P` and waits for its reply packet; returns it with the call's serial.
    /// With `stream`, stream packets of this serial are routed there from before the call is
    /// sent.
    pub(crate) async fn raw_call<P: Procedure>(
        &self,
        args: &P::Args,
        timeout: Option<Duration>,
        stream: Option<mpsc::Sender<Result<Packet>>>,
    ) -> Result<(Packet, u32)> {
        let body = args.to_bytes().map_err(Error::Encode)?.freeze();
        let (tx, rx) = oneshot::channel();
        let serial = {
            let mut st = self.shared.lock();
            if let Some(reason) = &st.dead {
                return Err(Error::ConnectionLost(reason.clone()));
            }
            let serial = st.calls.begin(P::PROGRAM, tx);
            if let Some(sender) = stream {
                st.streams.insert(serial, sender);
            }
            serial
        };
        let guard = AbandonOnDrop {
            shared: &self.shared,
            serial,
            armed: true,
        };
        let packet = Packet {
            header: header(
                P::PROGRAM,
                P::VERSION,
                P::NUMBER,
                VirNetMessageType::CALL,
                serial,
                VirNetMessageStatus::OK,
            ),
            fds: None,
            body,
        };
        let wait = async {
            if let Err(e) = self.shared.send(&packet).await {
                // Never sent, so no reply will come for a tombstone to wait for.
                let mut st = self.shared.lock();
                st.calls.complete(P::PROGRAM, serial);
                st.streams.remove(&serial);
                return Err(e);
            }
            rx.await.map_err(|_| Error::Closed)?
        };
        let reply = match timeout {
            Some(t) => tokio::time::timeout(t, wait)
                .await
                .map_err(|_| Error::Timeout {
                    procedure: P::NAME,
                    after: t,
                })?,
            None => wait.await,
        };
        let reply = match reply {
            Err(Error::Closed) => Err(Error::ConnectionLost(
                self.shared.dead_reason().unwrap_or_else(|| "closed".into()),
            )),
            other => other,
        }?;
        let mut guard = guard;
        guard.armed = false;
        if reply.header.status == VirNetMessageStatus::ERROR {
            self.shared.lock().streams.remove(&serial);
            let err: crate::proto::net::VirNetMessageError = reply.body()?;
            return Err(Error::from(RemoteError::from(err)));
        }
        Ok((reply, serial))
    }

    pub(crate) async fn send(&self, packet: Packet) -> Result<()> {
        if let Some(reason) = self.shared.dead_reason() {
            return Err(Error::ConnectionLost(reason));
        }
        self.shared.send(&packet).await
    }

    pub(crate) fn options(&self) -> &ClientOptions {
        &self.shared.opts
    }

    pub(crate) fn end_stream(&self, serial: u32) {
        self.shared.lock().streams.remove(&serial);
    }

    /// Receives the MESSAGE packets of procedure `number` (events) until the receiver is dropped.
    pub(crate) fn subscribe(&self, number: i32, buffer: usize) -> mpsc::Receiver<Packet> {
        let (tx, rx) = mpsc::channel(buffer);
        let mut state = self.shared.lock();
        let subscribers = state.events.entry(number).or_default();
        // Subscribers that come and go (a reconnecting caller) must not pile up.
        subscribers.retain(|s| !s.is_closed());
        subscribers.push(tx);
        rx
    }

    /// Sends CONNECT_CLOSE, waits for its reply, and ends the connection.
    pub async fn close(self) -> Result<()> {
        let result = self.call::<rp::ConnectClose>(&()).await;
        self.shared.kill("closed by the client".into());
        result
    }
}

/// Turns a call whose future is dropped (cancelled, timed out) into a tombstone, so that its
/// late reply is discarded rather than taken for a protocol error.
struct AbandonOnDrop<'a> {
    shared: &'a Shared,
    serial: u32,
    armed: bool,
}

impl Drop for AbandonOnDrop<'_> {
    fn drop(&mut self) {
        if self.armed {
            let mut st = self.shared.lock();
            st.calls.abandon(self.serial);
            st.streams.remove(&self.serial);
        }
    }
}

async fn read_loop<R: AsyncRead + Unpin>(
    shared: std::sync::Weak<Shared>,
    mut frames: FramedRead<R, PacketCodec>,
) {
    use futures_core::Stream;
    let reason = loop {
        let next = std::future::poll_fn(|cx| std::pin::Pin::new(&mut frames).poll_next(cx)).await;
        let Some(shared) = shared.upgrade() else {
            return;
        };
        let packet = match next {
            None => break "the server closed the connection".to_string(),
            Some(Err(e)) => break format!("read: {e}"),
            Some(Ok(p)) => p,
        };
        shared.lock().last_heard = Some(Instant::now());
        match classify(&packet) {
            Incoming::KeepalivePing => shared.send_now(&keepalive_packet(true)),
            Incoming::KeepalivePong => {}
            Incoming::Reply => {
                let completion = shared
                    .lock()
                    .calls
                    .complete(packet.header.prog, packet.header.serial);
                match completion {
                    Completion::Matched(slot) => {
                        let _ = slot.send(Ok(packet));
                    }
                    Completion::Late => debug!(
                        serial = packet.header.serial,
                        "discarded the reply of an abandoned call"
                    ),
                    // The reply to the CONNECT_CLOSE a dropped client sends with serial 0
                    // (`Closer`): expected, not a stray.
                    Completion::Unknown if is_drop_close_reply(&packet) => {}
                    Completion::Unknown => {
                        shared.ignore(&packet, "a reply that answers no call in flight");
                    }
                }
            }
            Incoming::Stream => {
                let sender = shared.lock().streams.get(&packet.header.serial).cloned();
                match sender {
                    // Waiting here is the backpressure of a slow stream consumer.
                    Some(s) => {
                        drop(shared);
                        let _ = s.send(Ok(packet)).await;
                    }
                    None => debug!(
                        serial = packet.header.serial,
                        "discarded a packet of a closed stream"
                    ),
                }
            }
            Incoming::Event => {
                let full = match shared.lock().events.get_mut(&packet.header.r#proc) {
                    Some(subscribers) => fan_out(subscribers, &packet),
                    None => 0,
                };
                if full > 0 {
                    warn!(
                        procedure = packet.header.r#proc,
                        full, "event subscribers are full; their copy of the event is dropped"
                    );
                }
            }
            Incoming::Unexpected => {
                shared.ignore(&packet, "a packet a client never receives");
            }
        }
    };
    if let Some(shared) = shared.upgrade() {
        shared.kill(reason);
    }
}

/// Writes when the socket takes more after it would have blocked: every write, by a sender or
/// by this task, polls the transport with this task's waker. Ends the connection on a write
/// error.
async fn write_loop(shared: std::sync::Weak<Shared>) {
    let failed = std::future::poll_fn(|cx| {
        let Some(shared) = shared.upgrade() else {
            return Poll::Ready(None);
        };
        let outbox = &shared.outbox;
        loop {
            {
                let mut t = outbox.wire.lock().unwrap_or_else(|p| p.into_inner());
                let Wire {
                    io,
                    writing,
                    writer,
                } = &mut *t;
                if !writer.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                    *writer = Some(cx.waker().clone());
                }
                match outbox.write_out(io.as_mut(), writing, cx) {
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(Err(e)) => return Poll::Ready(Some(e)),
                    Poll::Ready(Ok(())) => {}
                }
            }
            // As in `Outbox::pump`: what was queued while the transport was held is ours.
            if outbox.queue().packets.is_empty() {
                return Poll::Pending;
            }
        }
    })
    .await;
    if let (Some(e), Some(shared)) = (failed, shared.upgrade()) {
        shared.kill(format!("write: {e}"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fan_out_forgets_gone_subscribers_and_counts_full_ones() {
        let (live, mut live_rx) = mpsc::channel(4);
        let (gone, gone_rx) = mpsc::channel(4);
        let (full, _full_rx) = mpsc::channel(1);
        drop(gone_rx);
        let event = empty_call::<rp::ConnectClose>();
        full.try_send(event.clone()).unwrap();
        let mut subscribers = vec![live, gone, full];
        assert_eq!(
            fan_out(&mut subscribers, &event),
            1,
            "the full one misses it"
        );
        assert_eq!(subscribers.len(), 2, "the gone one is forgotten");
        assert!(live_rx.try_recv().is_ok());
        // Repeated events never grow the list back.
        for _ in 0..10 {
            fan_out(&mut subscribers, &event);
        }
        assert_eq!(subscribers.len(), 2);
    }

    /// A transport that records each write and never has anything to read.
    struct Recorder(Arc<Mutex<Vec<Vec<u8>>>>);

    impl AsyncRead for Recorder {
        fn poll_read(
            self: std::pin::Pin<&mut Self>,
            _: &mut Context<'_>,
            _: &mut tokio::io::ReadBuf<'_>,
        ) -> Poll<std::io::Result<()>> {
            Poll::Pending
        }
    }

    impl AsyncWrite for Recorder {
        fn poll_write(
            self: std::pin::Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<std::io::Result<usize>> {
            self.0.lock().unwrap().push(buf.to_vec());
            Poll::Ready(Ok(buf.len()))
        }

        fn poll_flush(
            self: std::pin::Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<std::io::Result<()>> {
            Poll::Ready(Ok(()))
        }

        fn poll_shutdown(
            self: std::pin::Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<std::io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    /// A sender waiting for room in a full queue (an upload whose peer stopped reading) fails
    /// with ConnectionLost when the connection dies, rather than waiting forever for a writer
    /// that is gone.
    #[tokio::test]
    async fn a_sender_waiting_for_room_fails_when_the_connection_dies() {
        // 16 bytes of pipe that nobody reads: the queue fills and the next send waits.
        let (ours, theirs) = tokio::io::duplex(16);
        let client = Client::start(ours, ClientOptions::default());
        tokio::task::yield_now().await;
        let data = Packet {
            header: header(
                rp::StorageVolUpload::PROGRAM,
                rp::StorageVolUpload::VERSION,
                rp::StorageVolUpload::NUMBER,
                VirNetMessageType::STREAM,
                1,
                VirNetMessageStatus::CONTINUE,
            ),
            fds: None,
            body: Bytes::from(vec![0u8; 64 * 1024]),
        };
        let uploader = tokio::spawn({
            let client = client.clone();
            async move {
                let mut sent = 0u32;
                loop {
                    if let Err(e) = client.send(data.clone()).await {
                        return (sent, e);
                    }
                    sent += 1;
                }
            }
        });
        // Until the queue is full and the uploader waits for room.
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(!uploader.is_finished(), "the uploader waits for room");
        drop(theirs);
        let (sent, error) = tokio::time::timeout(Duration::from_secs(5), uploader)
            .await
            .expect("the waiting sender is woken when the connection dies")
            .expect("the uploader task");
        assert!(sent > 0, "some packets were queued first");
        assert!(matches!(error, Error::ConnectionLost(_)), "{error:?}");
    }

    /// Packets queued together still go out one write each, so that no TLS record spans two
    /// of them (see `Outbox`).
    #[tokio::test]
    async fn queued_packets_are_written_one_write_each() {
        let writes = Arc::new(Mutex::new(Vec::new()));
        let client = Client::start(Recorder(writes.clone()), ClientOptions::default());
        tokio::task::yield_now().await;
        let packets: Vec<Packet> = (1..=3)
            .map(|serial| Packet {
                header: header(
                    rp::ConnectGetLibVersion::PROGRAM,
                    rp::ConnectGetLibVersion::VERSION,
                    rp::ConnectGetLibVersion::NUMBER,
                    VirNetMessageType::CALL,
                    serial,
                    VirNetMessageStatus::OK,
                ),
                fds: None,
                body: Bytes::from(vec![0u8; 4 * serial as usize]),
            })
            .collect();
        let outbox = &client.shared.outbox;
        for p in &packets {
            outbox.push(p).expect("queued");
        }
        outbox.pump().expect("written");
        let expected: Vec<Vec<u8>> = packets
            .iter()
            .map(|p| {
                let mut b = BytesMut::new();
                p.encode(&mut b).expect("encode");
                b.to_vec()
            })
            .collect();
        assert_eq!(*writes.lock().unwrap(), expected);
    }

    /// The next packet the client wrote; a frame left half written fails the test rather
    /// than hanging it.
    async fn next_frame<R: AsyncRead + Unpin>(frames: &mut FramedRead<R, PacketCodec>) -> Packet {
        use futures_core::Stream;
        let next = std::future::poll_fn(|cx| std::pin::Pin::new(&mut *frames).poll_next(cx));
        tokio::time::timeout(Duration::from_secs(5), next)
            .await
            .expect("the frame is written out")
            .expect("a frame")
            .expect("a whole packet")
    }

    /// A call dropped while its frame is half written still leaves the whole frame on the
    /// wire, then the next call's: frames are written whole or not at all, and the writer task
    /// finishes what a sender started.
    #[tokio::test]
    async fn a_call_cancelled_mid_frame_still_writes_the_whole_frame() {
        use tokio::io::AsyncWriteExt;
        // 16 bytes of pipe: any frame blocks after its first 16 bytes until the peer reads.
        let (ours, theirs) = tokio::io::duplex(16);
        let client = Client::start(ours, ClientOptions::default());
        // Let the writer task run once, so that the sender writes in its own task.
        tokio::task::yield_now().await;
        let name = "x".repeat(1000);
        let args = remote::RemoteDomainLookupByNameArgs { name: name.clone() };
        {
            let call = client.call::<rp::DomainLookupByName>(&args);
            let mut call = std::pin::pin!(call);
            let polled = std::future::poll_fn(|cx| Poll::Ready(call.as_mut().poll(cx))).await;
            assert!(polled.is_pending(), "the call waits for its reply");
        }
        let second = tokio::spawn({
            let client = client.clone();
            async move { client.call::<rp::ConnectGetLibVersion>(&()).await }
        });
        let (read, mut write) = tokio::io::split(theirs);
        let mut frames = FramedRead::new(read, PacketCodec);
        let first = next_frame(&mut frames).await;
        assert_eq!(first.header.r#proc, rp::DomainLookupByName::NUMBER);
        let sent: remote::RemoteDomainLookupByNameArgs = first.body().expect("whole arguments");
        assert_eq!(sent.name, name);
        let next = next_frame(&mut frames).await;
        assert_eq!(next.header.r#proc, rp::ConnectGetLibVersion::NUMBER);
        assert_ne!(next.header.serial, first.header.serial);

        // The cancelled call's late reply first (expected, not a stray), then the answer.
        let reply = |header: &VirNetMessageHeader, body: &dyn Fn(&mut BytesMut)| {
            let mut header = header.clone();
            header.r#type = VirNetMessageType::REPLY;
            let mut wire = BytesMut::new();
            let mut encoded = BytesMut::new();
            body(&mut encoded);
            Packet {
                header,
                fds: None,
                body: encoded.freeze(),
            }
            .encode(&mut wire)
            .expect("encode");
            wire
        };
        let late = reply(&first.header, &|b| {
            remote::RemoteDomainLookupByNameRet {
                dom: remote::RemoteNonnullDomain {
                    name: name.clone(),
                    uuid: [0; 16],
                    id: -1,
                },
            }
            .encode(b)
            .expect("encode")
        });
        let answer = reply(&next.header, &|b| {
            remote::RemoteConnectGetLibVersionRet {
                lib_ver: 11_003_000,
            }
            .encode(b)
            .expect("encode")
        });
        write.write_all(&late).await.expect("late reply sent");
        write.write_all(&answer).await.expect("reply sent");
        let answer = second.await.expect("joined").expect("answered");
        assert_eq!(answer.lib_ver, 11_003_000);
        assert_eq!(client.ignored_packets(), 0);
    }
}

//! Logs, metrics and health: tracing to stderr (human or JSON), and a small HTTP endpoint with
//! `/metrics` (Prometheus text), `/healthz` and `/readyz`.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use prometheus_client::registry::Registry;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::AbortHandle;
use tracing_subscriber::EnvFilter;

/// Log line format.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Human,
    /// One JSON object per line.
    Json,
}

/// Logging flags shared by every long-running subcommand.
#[derive(Clone, Debug, clap::Args)]
pub struct LogArgs {
    /// Log format.
    #[arg(long, value_enum, default_value_t = LogFormat::Human, env = "BANLIEUE_LOG_FORMAT", global = true)]
    pub log_format: LogFormat,
}

/// Installs the global tracing subscriber. `RUST_LOG` overrides the default `info` filter.
pub fn init_tracing(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env()
        // The client builder logs every failed request at ERROR, including the expected ones
        // while waiting for an API server to come up; callers get those errors anyway.
        .unwrap_or_else(|_| {
            EnvFilter::new(
                "info,kube_runtime=warn,kube_client=warn,kube_client::client::builder=off",
            )
        });
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    // A second call (tests, `dev up` hosting several roles) keeps the first subscriber.
    let _ = match format {
        LogFormat::Human => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}

/// Readiness shared between the workload and its `/readyz`.
#[derive(Clone, Debug, Default)]
pub struct Readiness(Arc<AtomicBool>);

impl Readiness {
    pub fn set(&self, ready: bool) {
        self.0.store(ready, Ordering::Relaxed);
    }

    pub fn is_ready(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

/// Requests larger than this are answered 431 and dropped: the endpoint is reachable by anything
/// in the pod network.
const MAX_REQUEST_HEAD: usize = 8 * 1024;

/// Bounds on what clients of the endpoint may hold. Anything in the pod network reaches it, and
/// the kubelet's probes must keep being answered whatever else is connected.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ServerLimits {
    /// How long a connection may take to send its request head and take the answer. A client
    /// that opens a socket and says nothing is closed after this.
    pub request_timeout: Duration,
    /// Connections served at once. A new connection beyond this closes the oldest one: refusing
    /// the new one instead would let a few hundred idle sockets starve every probe.
    pub max_connections: usize,
}

impl Default for ServerLimits {
    fn default() -> Self {
        Self {
            request_timeout: Duration::from_secs(10),
            max_connections: 256,
        }
    }
}

/// The first wait after a failed accept, and the longest: an accept that fails (out of file
/// descriptors, say) fails again at once, so retrying without a pause only burns a core.
const ACCEPT_BACKOFF_FIRST: Duration = Duration::from_millis(5);
const ACCEPT_BACKOFF_MAX: Duration = Duration::from_secs(1);

/// The pause after a failed accept, given the previous one (None after a success): doubling,
/// capped.
fn accept_backoff(previous: Option<Duration>) -> Duration {
    previous.map_or(ACCEPT_BACKOFF_FIRST, |d| (d * 2).min(ACCEPT_BACKOFF_MAX))
}

/// Serves `/metrics`, `/healthz` and `/readyz` on `listener` until the task is dropped, with
/// the default [`ServerLimits`].
pub async fn serve(listener: TcpListener, registry: Arc<Registry>, readiness: Readiness) {
    serve_with(listener, registry, readiness, ServerLimits::default()).await
}

/// Serves as [`serve`] does, within `limits`.
pub async fn serve_with(
    listener: TcpListener,
    registry: Arc<Registry>,
    readiness: Readiness,
    limits: ServerLimits,
) {
    let max_connections = limits.max_connections.max(1);
    // Oldest first. Dropping this (the task is dropped) does not stop the connections; each
    // ends by its own deadline.
    let mut connections: VecDeque<AbortHandle> = VecDeque::with_capacity(max_connections);
    let mut backoff = None;
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => {
                backoff = None;
                stream
            }
            Err(error) => {
                let pause = accept_backoff(backoff);
                backoff = Some(pause);
                tracing::warn!(%error, ?pause, "health endpoint cannot accept connections");
                // Out of descriptors most likely: the oldest connection is the one to give up.
                if let Some(oldest) = connections.pop_front() {
                    oldest.abort();
                }
                tokio::time::sleep(pause).await;
                continue;
            }
        };
        connections.retain(|c| !c.is_finished());
        while connections.len() >= max_connections {
            if let Some(oldest) = connections.pop_front() {
                oldest.abort();
            }
        }
        let registry = registry.clone();
        let readiness = readiness.clone();
        let task = tokio::spawn(async move {
            let exchange = answer(stream, &registry, &readiness);
            match tokio::time::timeout(limits.request_timeout, exchange).await {
                Ok(Ok(())) => {}
                Ok(Err(error)) => tracing::debug!(%error, "health endpoint connection failed"),
                Err(_) => tracing::debug!("health endpoint connection timed out"),
            }
        });
        connections.push_back(task.abort_handle());
    }
}

/// Binds `addr` and serves in the background; returns the bound address (port 0 picks one).
pub async fn spawn_server(
    addr: SocketAddr,
    registry: Arc<Registry>,
    readiness: Readiness,
) -> std::io::Result<SocketAddr> {
    spawn_server_with(addr, registry, readiness, ServerLimits::default()).await
}

/// Binds `addr` and serves within `limits` in the background; returns the bound address.
pub async fn spawn_server_with(
    addr: SocketAddr,
    registry: Arc<Registry>,
    readiness: Readiness,
    limits: ServerLimits,
) -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    tokio::spawn(serve_with(listener, registry, readiness, limits));
    Ok(bound)
}

async fn answer(
    mut stream: TcpStream,
    registry: &Registry,
    readiness: &Readiness,
) -> std::io::Result<()> {
    let mut head = Vec::with_capacity(512);
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        if head.len() > MAX_REQUEST_HEAD {
            return respond(&mut stream, "431 Request Header Fields Too Large", "").await;
        }
        let n = stream.read(&mut buf).await?;
        if n == 0 {
            return Ok(());
        }
        head.extend_from_slice(&buf[..n]);
    }
    let (status, body) = route(&head, registry, readiness);
    respond(&mut stream, status, &body).await
}

/// The response for a request head: pure, so a unit test covers every route.
fn route(head: &[u8], registry: &Registry, readiness: &Readiness) -> (&'static str, String) {
    let line = head.split(|&b| b == b'\r').next().unwrap_or_default();
    let mut parts = line.split(|&b| b == b' ');
    let (method, path) = (parts.next(), parts.next());
    if method != Some(b"GET") {
        return ("405 Method Not Allowed", String::new());
    }
    match path {
        Some(b"/healthz") => ("200 OK", "ok\n".into()),
        Some(b"/readyz") if readiness.is_ready() => ("200 OK", "ok\n".into()),
        Some(b"/readyz") => ("503 Service Unavailable", "not ready\n".into()),
        Some(b"/metrics") => {
            let mut text = String::new();
            match prometheus_client::encoding::text::encode(&mut text, registry) {
                Ok(()) => ("200 OK", text),
                Err(_) => ("500 Internal Server Error", String::new()),
            }
        }
        _ => ("404 Not Found", String::new()),
    }
}

async fn respond(stream: &mut TcpStream, status: &str, body: &str) -> std::io::Result<()> {
    let content_type = "text/plain; version=0.0.4; charset=utf-8";
    let head = format!(
        "HTTP/1.1 {status}\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(body.as_bytes()).await?;
    stream.shutdown().await
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::metrics::counter::Counter;

    #[test]
    fn routes() {
        let mut registry = Registry::default();
        let counter: Counter = Counter::default();
        registry.register("banlieue_test_things", "Things", counter.clone());
        counter.inc();
        let readiness = Readiness::default();
        let get = |path: &str| {
            route(
                format!("GET {path} HTTP/1.1\r\n\r\n").as_bytes(),
                &registry,
                &readiness,
            )
        };
        assert_eq!(get("/healthz").0, "200 OK");
        assert_eq!(get("/readyz").0, "503 Service Unavailable");
        readiness.set(true);
        assert_eq!(get("/readyz").0, "200 OK");
        let (status, body) = get("/metrics");
        assert_eq!(status, "200 OK");
        assert!(body.contains("banlieue_test_things_total 1"), "{body}");
        assert_eq!(get("/nope").0, "404 Not Found");
        assert_eq!(
            route(b"POST /healthz HTTP/1.1\r\n\r\n", &registry, &readiness).0,
            "405 Method Not Allowed"
        );
        assert_eq!(
            route(b"", &registry, &readiness).0,
            "405 Method Not Allowed"
        );
    }

    #[tokio::test]
    async fn oversized_request_heads_are_refused() {
        let addr = spawn_server(
            "127.0.0.1:0".parse().unwrap(),
            Arc::default(),
            Readiness::default(),
        )
        .await
        .unwrap();
        let mut stream = TcpStream::connect(addr).await.unwrap();
        let _ = stream.write_all(&vec![b'a'; 3 * MAX_REQUEST_HEAD]).await;
        let mut reply = Vec::new();
        let _ = stream.read_to_end(&mut reply).await;
        assert!(
            reply.starts_with(b"HTTP/1.1 431"),
            "{}",
            String::from_utf8_lossy(&reply)
        );
    }

    #[tokio::test]
    async fn serves_over_tcp() {
        let readiness = Readiness::default();
        readiness.set(true);
        let addr = spawn_server("127.0.0.1:0".parse().unwrap(), Arc::default(), readiness)
            .await
            .unwrap();
        let mut stream = TcpStream::connect(addr).await.unwrap();
        stream
            .write_all(b"GET /readyz HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .unwrap();
        let mut reply = String::new();
        stream.read_to_string(&mut reply).await.unwrap();
        assert!(reply.starts_with("HTTP/1.1 200 OK"), "{reply}");
        assert!(reply.ends_with("ok\n"));
    }

    #[test]
    fn failed_accepts_back_off_up_to_a_cap() {
        let mut pause = None;
        let mut seen = Vec::new();
        for _ in 0..20 {
            let next = accept_backoff(pause);
            seen.push(next);
            pause = Some(next);
        }
        assert_eq!(seen[0], ACCEPT_BACKOFF_FIRST);
        assert!(seen.windows(2).all(|w| w[1] >= w[0]), "{seen:?}");
        assert_eq!(*seen.last().unwrap(), ACCEPT_BACKOFF_MAX);
        assert_eq!(
            accept_backoff(None),
            ACCEPT_BACKOFF_FIRST,
            "a success resets it"
        );
    }

    async fn healthz(addr: SocketAddr) -> String {
        let exchange = async {
            let mut stream = TcpStream::connect(addr).await?;
            stream
                .write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
                .await?;
            let mut reply = String::new();
            stream.read_to_string(&mut reply).await?;
            std::io::Result::Ok(reply)
        };
        tokio::time::timeout(DEADLINE, exchange)
            .await
            .expect("/healthz answered before the deadline")
            .expect("/healthz exchange")
    }

    /// Waits until the server closes `stream` (EOF or reset), at most until the deadline.
    async fn closed_by_server(stream: &mut TcpStream) {
        let mut byte = [0u8; 1];
        match tokio::time::timeout(DEADLINE, stream.read(&mut byte)).await {
            Ok(Ok(0)) | Ok(Err(_)) => {}
            Ok(Ok(_)) => panic!("the server sent bytes to a client that asked nothing"),
            Err(_) => panic!("an idle connection stayed open past the deadline"),
        }
    }

    const DEADLINE: Duration = Duration::from_secs(60);

    #[tokio::test]
    async fn a_client_that_never_sends_its_request_is_closed() {
        let limits = ServerLimits {
            request_timeout: Duration::from_millis(200),
            ..ServerLimits::default()
        };
        let addr = spawn_server_with(
            "127.0.0.1:0".parse().unwrap(),
            Arc::default(),
            Readiness::default(),
            limits,
        )
        .await
        .unwrap();
        let mut idle = Vec::new();
        for _ in 0..8 {
            idle.push(TcpStream::connect(addr).await.unwrap());
        }
        // Half a request head, then silence: the slow-loris shape.
        idle[0]
            .write_all(b"GET /metrics HTTP/1.1\r\n")
            .await
            .unwrap();
        for stream in &mut idle {
            closed_by_server(stream).await;
        }
        assert!(healthz(addr).await.starts_with("HTTP/1.1 200 OK"));
    }

    /// Raises the soft descriptor limit to the hard one; returns the new soft limit.
    fn raise_nofile_limit() -> u64 {
        use rustix::process::{Resource, getrlimit, setrlimit};
        let mut limit = getrlimit(Resource::Nofile);
        if limit.current < limit.maximum {
            limit.current = limit.maximum;
            // Refused (an unprivileged hard limit below the request, say): keep what we have.
            let _ = setrlimit(Resource::Nofile, limit);
        }
        getrlimit(Resource::Nofile).current.unwrap_or(u64::MAX)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn ten_thousand_idle_sockets_neither_starve_healthz_nor_stay_open() {
        let limits = ServerLimits {
            request_timeout: Duration::from_secs(2),
            max_connections: 256,
        };
        // Each idle socket costs this process one descriptor (its server side is bounded by
        // max_connections); leave room for the server's share and the test harness.
        let budget = raise_nofile_limit().saturating_sub(limits.max_connections as u64 + 1024);
        let count = budget.min(10_000) as usize;
        assert!(count >= 2_000, "only {count} descriptors to spare");
        let addr = spawn_server_with(
            "127.0.0.1:0".parse().unwrap(),
            Arc::default(),
            Readiness::default(),
            limits,
        )
        .await
        .unwrap();

        let mut idle = Vec::with_capacity(count);
        for _ in 0..count {
            idle.push(TcpStream::connect(addr).await.unwrap());
        }
        // Every one of them connected and silent, far beyond the connection cap: the probe is
        // still answered.
        for _ in 0..3 {
            let reply = healthz(addr).await;
            assert!(reply.starts_with("HTTP/1.1 200 OK"), "{reply}");
        }
        // And every idle socket is closed by the server: evicted by newer ones, or timed out.
        for stream in &mut idle {
            closed_by_server(stream).await;
        }
        assert!(healthz(addr).await.starts_with("HTTP/1.1 200 OK"));
    }
}

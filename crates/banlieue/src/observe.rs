//! Logs, metrics and health: tracing to stderr (human or JSON), and a small HTTP endpoint with
//! `/metrics` (Prometheus text), `/healthz` and `/readyz`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use prometheus_client::registry::Registry;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
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

/// Serves `/metrics`, `/healthz` and `/readyz` on `listener` until the task is dropped.
pub async fn serve(listener: TcpListener, registry: Arc<Registry>, readiness: Readiness) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let registry = registry.clone();
        let readiness = readiness.clone();
        tokio::spawn(async move {
            if let Err(error) = answer(stream, &registry, &readiness).await {
                tracing::debug!(%error, "health endpoint connection failed");
            }
        });
    }
}

/// Binds `addr` and serves in the background; returns the bound address (port 0 picks one).
pub async fn spawn_server(
    addr: SocketAddr,
    registry: Arc<Registry>,
    readiness: Readiness,
) -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    tokio::spawn(serve(listener, registry, readiness));
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
}

//! Just enough HTTP client for a test to talk to its registry: one HTTP/1.1 request per
//! connection (hyper's connection API over a tokio socket, TLS by tokio-rustls trusting only
//! the registry's CA), a bounded body, a deadline. No pooling, redirects or retries: a test
//! wants to see exactly what the registry answered.

use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{AUTHORIZATION, HOST};
use http::{HeaderMap, HeaderValue, Method, Request, StatusCode};
use http_body_util::{BodyExt as _, Full, Limited};
use hyper_util::rt::TokioIo;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

use super::{Credentials, Error};

/// The most body a response may carry: tests push and fetch small blobs only.
pub const BODY_LIMIT: usize = 64 << 20;
/// How long one request may take, connection and body included.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// What the registry answered.
#[derive(Debug, Clone)]
pub struct HttpResponse {
    pub status: StatusCode,
    pub headers: HeaderMap,
    /// Empty for `HEAD`.
    pub body: Bytes,
}

impl HttpResponse {
    /// A header's value when it is present and printable.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

/// Connects to one registry on `127.0.0.1:port`.
#[derive(Clone)]
pub(crate) struct Client {
    port: u16,
    tls: Option<TlsConnector>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("port", &self.port)
            .field("tls", &self.tls.is_some())
            .finish()
    }
}

impl Client {
    /// Plain HTTP when `ca_der` is `None`; otherwise TLS trusting that CA alone.
    pub(crate) fn new(port: u16, ca_der: Option<&[u8]>) -> Result<Self, Error> {
        let tls = match ca_der {
            None => None,
            Some(der) => {
                let mut roots = rustls::RootCertStore::empty();
                roots.add(CertificateDer::from(der.to_vec()))?;
                // An explicit provider: another crate in the test binary may enable aws-lc-rs
                // too, and rustls then refuses to pick a process default.
                let provider = Arc::new(rustls::crypto::ring::default_provider());
                let config = rustls::ClientConfig::builder_with_provider(provider)
                    .with_safe_default_protocol_versions()?
                    .with_root_certificates(roots)
                    .with_no_client_auth();
                Some(TlsConnector::from(Arc::new(config)))
            }
        };
        Ok(Self { port, tls })
    }

    /// Sends `method path` (an origin-form path such as `/v2/`) with `headers`, as `auth` if
    /// given, and returns the answer whatever its status.
    pub(crate) async fn send(
        &self,
        method: Method,
        path: &str,
        headers: &[(&str, &str)],
        auth: Option<&Credentials>,
        body: Bytes,
    ) -> Result<HttpResponse, Error> {
        let what = || format!("{method} {path}");
        let mut builder = Request::builder()
            .method(method.clone())
            .uri(path)
            .header(HOST, format!("127.0.0.1:{}", self.port));
        for (name, value) in headers {
            builder = builder.header(*name, *value);
        }
        if let Some(credentials) = auth {
            builder = builder.header(AUTHORIZATION, credentials.basic_header()?);
        }
        let request = builder.body(Full::new(body)).map_err(|e| Error::Http {
            what: what(),
            source: Box::new(e),
        })?;
        let exchange = async {
            let tcp = TcpStream::connect((Ipv4Addr::LOCALHOST, self.port)).await?;
            match &self.tls {
                None => exchange(TokioIo::new(tcp), request).await,
                Some(connector) => {
                    let name = ServerName::IpAddress(Ipv4Addr::LOCALHOST.into());
                    let stream = connector.connect(name, tcp).await?;
                    exchange(TokioIo::new(stream), request).await
                }
            }
        };
        match tokio::time::timeout(REQUEST_TIMEOUT, exchange).await {
            Ok(Ok(response)) => Ok(response),
            Ok(Err(source)) => Err(Error::Http {
                what: what(),
                source,
            }),
            Err(_) => Err(Error::Http {
                what: what(),
                source: format!("no answer within {REQUEST_TIMEOUT:?}").into(),
            }),
        }
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

async fn exchange<S>(io: S, request: Request<Full<Bytes>>) -> Result<HttpResponse, BoxError>
where
    S: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let (mut sender, connection) = hyper::client::conn::http1::handshake(io).await?;
    // The connection task ends when the response is read and the sender dropped.
    let driver = tokio::spawn(connection);
    let result = async {
        let response = sender.send_request(request).await?;
        let (parts, body) = response.into_parts();
        let body = Limited::new(body, BODY_LIMIT).collect().await?.to_bytes();
        Ok::<_, BoxError>(HttpResponse {
            status: parts.status,
            headers: parts.headers,
            body,
        })
    }
    .await;
    drop(sender);
    driver.abort();
    result
}

impl Credentials {
    /// `Basic base64(user:password)`.
    pub(crate) fn basic_header(&self) -> Result<HeaderValue, Error> {
        use base64::Engine as _;
        let token = base64::engine::general_purpose::STANDARD
            .encode(format!("{}:{}", self.username, self.password));
        HeaderValue::from_str(&format!("Basic {token}")).map_err(|e| Error::Http {
            what: "encode credentials".to_owned(),
            source: Box::new(e),
        })
    }
}

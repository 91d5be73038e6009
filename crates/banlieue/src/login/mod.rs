//! `banlieue login`: an OIDC login for kubectl, as an exec credential plugin.
//!
//! kubectl runs it before a request; it prints a `client.authentication.k8s.io/v1`
//! ExecCredential holding an ID token. A cached token with a minute left is printed at once;
//! otherwise the cached refresh token is tried; otherwise the user logs in: the authorization
//! code flow with PKCE (S256), the issuer redirecting the browser to a one-shot listener on
//! `http://localhost:<port>/callback`. The URL to open is printed on stderr, which kubectl
//! shows. Tokens are cached per (issuer, client) in a 0600 file under
//! `~/.cache/banlieue/login/`.

mod flow;

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use clap::Args;
use rustls::pki_types::pem::PemObject as _;
use sha2::{Digest as _, Sha256};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpListener;

pub use flow::{Discovery, Tokens};

/// The most of an issuer's answer read (discovery documents and token responses are small).
const BODY_LIMIT: usize = 1 << 20;
/// How long one request to the issuer may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// `banlieue login` flags.
#[derive(Debug, Clone, Args)]
pub struct LoginArgs {
    /// The OIDC issuer URL (its `iss`), e.g. https://dex.example.org/dex.
    #[arg(long, value_name = "URL")]
    pub issuer: String,
    /// The client id registered at the issuer for kubectl logins (a public client).
    #[arg(long, value_name = "ID")]
    pub client_id: String,
    /// A PEM CA bundle trusted for the issuer besides the system roots.
    #[arg(long, value_name = "FILE")]
    pub ca_file: Option<PathBuf>,
    /// The scopes asked for; offline_access lets a later run refresh without a browser.
    #[arg(long, default_value = "openid email offline_access")]
    pub scopes: String,
    /// The local port of the callback listener (0: any free port).
    #[arg(long, default_value_t = 0)]
    pub port: u16,
    /// How long to wait for the browser to come back.
    #[arg(long, value_name = "SECONDS", default_value_t = 300)]
    pub timeout: u64,
    /// Where tokens are cached (default ~/.cache/banlieue/login).
    #[arg(long, value_name = "DIR")]
    pub cache_dir: Option<PathBuf>,
    /// Ignore the cache: always log in again.
    #[arg(long)]
    pub force: bool,
}

/// Why a login failed.
#[derive(Debug, thiserror::Error)]
pub enum LoginError {
    #[error("the issuer: {0}")]
    Issuer(String),
    #[error("the issuer refused the login: {0}")]
    Refused(String),
    #[error("the browser's callback: {0}")]
    Callback(String),
    #[error("no callback within {0:?}: was the URL opened?")]
    Timeout(Duration),
    #[error("{what}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("TLS: {0}")]
    Tls(String),
}

impl LoginError {
    fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> LoginError {
        let what = what.into();
        move |source| LoginError::Io { what, source }
    }
}

/// Runs the command: prints the ExecCredential on stdout.
pub fn run(args: &LoginArgs) -> Result<(), LoginError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(LoginError::io("start the runtime"))?;
    let tokens = runtime.block_on(login(args))?;
    let credential = flow::exec_credential(&tokens)?;
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "{credential}").map_err(LoginError::io("write the credential"))
}

/// A fresh ID token: from the cache, by refresh, or by a browser login.
pub async fn login(args: &LoginArgs) -> Result<Tokens, LoginError> {
    let cache = cache_file(args)?;
    let cached = if args.force { None } else { read_cache(&cache) };
    if let Some(tokens) = &cached
        && tokens.fresh_at(SystemTime::now())
    {
        return Ok(tokens.clone());
    }
    let issuer = Issuer::new(args)?;
    let discovery = issuer.discover().await?;
    if let Some(refresh) = cached.and_then(|t| t.refresh_token) {
        match issuer
            .token(&discovery, flow::refresh_form(&refresh, &args.client_id))
            .await
        {
            Ok(mut tokens) => {
                // An issuer may keep the refresh token and not send it again.
                tokens.refresh_token.get_or_insert(refresh);
                write_cache(&cache, &tokens)?;
                return Ok(tokens);
            }
            // An expired or revoked refresh token: log in again.
            Err(LoginError::Refused(why)) => eprintln!("refresh refused ({why}); logging in again"),
            Err(e) => return Err(e),
        }
    }
    let tokens = browser_login(args, &issuer, &discovery).await?;
    write_cache(&cache, &tokens)?;
    Ok(tokens)
}

async fn browser_login(
    args: &LoginArgs,
    issuer: &Issuer,
    discovery: &Discovery,
) -> Result<Tokens, LoginError> {
    let listener = TcpListener::bind(("127.0.0.1", args.port))
        .await
        .map_err(LoginError::io("listen for the callback"))?;
    let port = listener
        .local_addr()
        .map_err(LoginError::io("listen for the callback"))?
        .port();
    let mut verifier = [0u8; 32];
    let mut state = [0u8; 16];
    getrandom::fill(&mut verifier)
        .and_then(|()| getrandom::fill(&mut state))
        .map_err(|e| LoginError::Io {
            what: "draw random bytes".into(),
            source: std::io::Error::other(e.to_string()),
        })?;
    let attempt = flow::Attempt::new(verifier, state, port);
    let url = attempt.authorize_url(discovery, &args.client_id, &args.scopes)?;
    eprintln!(
        "Open this URL in a browser to log in at {}:\n\n  {url}\n",
        args.issuer
    );
    let timeout = Duration::from_secs(args.timeout);
    let code = tokio::time::timeout(timeout, await_callback(&listener, &attempt))
        .await
        .map_err(|_| LoginError::Timeout(timeout))??;
    issuer
        .token(discovery, attempt.token_form(&code, &args.client_id))
        .await
}

/// Serves the callback until a request carries this attempt's code (or the issuer's error);
/// anything else (a favicon, a stray request) is answered 404 and waited past.
async fn await_callback(
    listener: &TcpListener,
    attempt: &flow::Attempt,
) -> Result<String, LoginError> {
    loop {
        let (mut stream, _) = listener
            .accept()
            .await
            .map_err(LoginError::io("accept the callback"))?;
        let mut head = Vec::with_capacity(1024);
        let mut chunk = [0u8; 1024];
        while head.len() < flow::CALLBACK_HEAD_LIMIT && !head.windows(4).any(|w| w == b"\r\n\r\n") {
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => break,
                Ok(n) => head.extend_from_slice(&chunk[..n]),
            }
        }
        let head = String::from_utf8_lossy(&head);
        let outcome = attempt.code_from_callback(&head);
        let (status, text) = match &outcome {
            Ok(_) => ("200 OK", "Logged in. You may close this window.".to_owned()),
            Err(LoginError::Callback(_)) => ("404 Not Found", "Not a login callback.".to_owned()),
            Err(e) => ("400 Bad Request", format!("Login failed: {e}")),
        };
        let response = format!(
            "HTTP/1.1 {status}\r\ncontent-type: text/plain; charset=utf-8\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{text}",
            text.len()
        );
        let _ = stream.write_all(response.as_bytes()).await;
        let _ = stream.shutdown().await;
        match outcome {
            Err(LoginError::Callback(why)) => eprintln!("ignored a request: {why}"),
            other => return other,
        }
    }
}

/// The issuer's HTTP endpoints.
struct Issuer {
    url: String,
    http: reqwest::Client,
}

impl Issuer {
    fn new(args: &LoginArgs) -> Result<Issuer, LoginError> {
        let mut roots = rustls::RootCertStore::empty();
        // The system's roots, as a browser would trust; unreadable ones are skipped.
        for cert in rustls_native_certs::load_native_certs().certs {
            let _ = roots.add(cert);
        }
        if let Some(path) = &args.ca_file {
            let pem =
                std::fs::read(path).map_err(LoginError::io(format!("read {}", path.display())))?;
            let mut found = false;
            for cert in rustls::pki_types::CertificateDer::pem_slice_iter(&pem) {
                let cert = cert.map_err(|e| LoginError::Tls(format!("{}: {e}", path.display())))?;
                roots
                    .add(cert)
                    .map_err(|e| LoginError::Tls(format!("{}: {e}", path.display())))?;
                found = true;
            }
            if !found {
                return Err(LoginError::Tls(format!(
                    "{} holds no certificate",
                    path.display()
                )));
            }
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let tls = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| LoginError::Tls(e.to_string()))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        let http = reqwest::Client::builder()
            .use_preconfigured_tls(tls)
            .redirect(reqwest::redirect::Policy::none())
            .timeout(REQUEST_TIMEOUT)
            .build()
            .map_err(|e| LoginError::Tls(e.to_string()))?;
        Ok(Issuer {
            url: args.issuer.trim_end_matches('/').to_owned(),
            http,
        })
    }

    async fn discover(&self) -> Result<Discovery, LoginError> {
        let url = format!("{}/.well-known/openid-configuration", self.url);
        let response = self
            .http
            .get(&url)
            .send()
            .await
            .map_err(|e| request_error(&url, e))?;
        let status = response.status();
        let body = bounded_body(response, &url).await?;
        if !status.is_success() {
            return Err(LoginError::Issuer(format!("GET {url}: HTTP {status}")));
        }
        Discovery::parse(&self.url, &body)
    }

    async fn token(&self, discovery: &Discovery, form: String) -> Result<Tokens, LoginError> {
        let url = &discovery.token_endpoint;
        let response = self
            .http
            .post(url)
            .header("content-type", "application/x-www-form-urlencoded")
            .body(form)
            .send()
            .await
            .map_err(|e| request_error(url, e))?;
        let status = response.status().as_u16();
        let body = bounded_body(response, url).await?;
        Tokens::from_response(status, &body)
    }
}

fn request_error(url: &str, e: reqwest::Error) -> LoginError {
    let mut message = format!("{url}: {e}");
    let mut source = std::error::Error::source(&e);
    while let Some(s) = source {
        message.push_str(&format!(": {s}"));
        source = s.source();
    }
    LoginError::Issuer(message)
}

/// The body, refused past [`BODY_LIMIT`] rather than buffered whole.
async fn bounded_body(mut response: reqwest::Response, url: &str) -> Result<Vec<u8>, LoginError> {
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(|e| request_error(url, e))? {
        if body.len() + chunk.len() > BODY_LIMIT {
            return Err(LoginError::Issuer(format!(
                "{url}: answer larger than {BODY_LIMIT} bytes"
            )));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// `<dir>/<sha256(issuer, client)>.json`: one cache per issuer and client.
fn cache_file(args: &LoginArgs) -> Result<PathBuf, LoginError> {
    let dir = match &args.cache_dir {
        Some(dir) => dir.clone(),
        None => std::env::var_os("HOME")
            .map(|home| PathBuf::from(home).join(".cache/banlieue/login"))
            .ok_or_else(|| LoginError::Io {
                what: "find the cache directory".into(),
                source: std::io::Error::other("HOME is not set; pass --cache-dir"),
            })?,
    };
    let key = Sha256::digest(format!(
        "{}\n{}",
        args.issuer.trim_end_matches('/'),
        args.client_id
    ));
    let name: String = key.iter().take(16).map(|b| format!("{b:02x}")).collect();
    Ok(dir.join(format!("{name}.json")))
}

/// The cached tokens; a missing or unreadable cache is no cache.
fn read_cache(path: &Path) -> Option<Tokens> {
    let bytes = std::fs::read(path).ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// Writes the cache readable by its owner only, replacing it whole.
fn write_cache(path: &Path, tokens: &Tokens) -> Result<(), LoginError> {
    use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _};
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(LoginError::io(format!("create {}", dir.display())))?;
    let tmp = path.with_extension("json.tmp");
    let bytes = serde_json::to_vec(tokens).unwrap_or_default();
    let write = || -> std::io::Result<()> {
        // A leftover temporary file, or a link someone planted under its name, goes first: the
        // new one is created exclusively and never through a link, so the tokens land in a
        // file this process just made, readable by its owner only.
        match std::fs::remove_file(&tmp) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
            .open(&tmp)?;
        file.write_all(&bytes)?;
        file.sync_all()?;
        std::fs::rename(&tmp, path)
    };
    write().map_err(LoginError::io(format!("write {}", path.display())))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt as _;

    fn tokens() -> Tokens {
        serde_json::from_value(serde_json::json!({ "id_token": "secret-token" })).expect("tokens")
    }

    #[test]
    fn the_cache_is_written_through_no_link_and_only_its_owner_reads_it() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("cache").join("tokens.json");
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        // Someone else's file, and a link to it planted where the temporary file goes.
        let victim = dir.path().join("victim");
        std::fs::write(&victim, "untouched").unwrap();
        std::os::unix::fs::symlink(&victim, path.with_extension("json.tmp")).unwrap();
        // An earlier cache that others could read.
        std::fs::write(&path, "{}").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();

        write_cache(&path, &tokens()).expect("written");

        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "untouched");
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert!(
            std::fs::read_to_string(&path)
                .unwrap()
                .contains("secret-token")
        );
        assert!(!path.with_extension("json.tmp").exists());
    }
}

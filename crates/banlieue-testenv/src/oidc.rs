//! A real OIDC issuer on loopback: Dex (built from the Go module proxy by
//! `scripts/control-plane build-oidc`) with static users and passwords, HTTPS from a throwaway
//! CA, memory storage, and one public client (`banlieue`) that may use the password grant (what
//! tests log in with) and the authorization-code flow with PKCE on a `localhost` callback
//! (what `kubectl` users log in with).
//!
//! ```no_run
//! # async fn demo() -> Result<(), banlieue_testenv::oidc::Error> {
//! use banlieue_testenv::oidc::{Issuer, IssuerOptions};
//! if !Issuer::available()? {
//!     return Ok(()); // BANLIEUE_ALLOW_MISSING_PEERS=1 and no Dex: skipped loudly
//! }
//! let issuer = Issuer::start(IssuerOptions::new().user("alice@a.test", "alice-pw")).await?;
//! let tokens = issuer.password_login("alice@a.test", "alice-pw").await?;
//! println!("{} logged in as sub {}", issuer.url(), tokens.subject()?);
//! # Ok(()) }
//! ```

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use base64::Engine as _;
use bytes::Bytes;
use http::{Method, StatusCode};
use serde_json::Value;

use crate::control_plane::process::Processes;
use crate::libvirtd::ALLOW_MISSING_PEERS_ENV;
use crate::registry::{http as https, pki};

/// The client id of the one client every issuer knows, and the audience of its ID tokens.
pub const CLIENT_ID: &str = "banlieue";
/// The lowest bcrypt cost Dex accepts at login (it refuses cheaper hashes: a test would rather
/// have the cheapest, ~50 ms per check).
const BCRYPT_COST: u32 = 10;
/// How long Dex may take to answer its discovery document.
const READY_TIMEOUT: Duration = Duration::from_secs(30);
const POLL: Duration = Duration::from_millis(50);

/// What can go wrong with an issuer.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error("dex is not built at {}: run scripts/setup (or scripts/control-plane build-oidc)", .0.display())]
    DexMissing(PathBuf),
    #[error("run dex")]
    Process(#[from] crate::control_plane::Error),
    #[error("dex's TLS or HTTP")]
    Peer(#[from] crate::registry::Error),
    #[error("hash the password")]
    Bcrypt(#[from] bcrypt::BcryptError),
    #[error("failed to {what}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("dex did not serve its discovery document within {after:?}; its log:\n{log}")]
    NotReady { after: Duration, log: String },
    #[error("{what}: HTTP {status}: {body}")]
    Status {
        what: String,
        status: StatusCode,
        body: String,
    },
    #[error("malformed {what}: {reason}")]
    Malformed { what: &'static str, reason: String },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A user of the issuer's password database.
#[derive(Debug, Clone)]
struct User {
    email: String,
    password: String,
}

/// How [`Issuer::start`] configures Dex.
#[derive(Debug, Clone)]
pub struct IssuerOptions {
    users: Vec<User>,
    id_token_expiry: Duration,
}

impl Default for IssuerOptions {
    fn default() -> Self {
        IssuerOptions {
            users: Vec::new(),
            id_token_expiry: Duration::from_secs(600),
        }
    }
}

impl IssuerOptions {
    /// No users, ID tokens valid for ten minutes.
    pub fn new() -> Self {
        IssuerOptions::default()
    }

    /// Adds a user who logs in with `email` and `password`.
    pub fn user(mut self, email: impl Into<String>, password: impl Into<String>) -> Self {
        self.users.push(User {
            email: email.into(),
            password: password.into(),
        });
        self
    }

    /// How long an ID token is valid (Dex's `expiry.idTokens`).
    pub fn id_token_expiry(mut self, expiry: Duration) -> Self {
        self.id_token_expiry = expiry;
        self
    }
}

/// A running Dex; dropping it stops the process by PID and removes its directory.
#[derive(Debug)]
pub struct Issuer {
    // Declared first so it drops first: the process stops before its files go.
    processes: Processes,
    port: u16,
    pki: pki::Pki,
    client: https::Client,
}

/// What a login returned.
#[derive(Debug, Clone)]
pub struct Tokens {
    /// The ID token: what `kubectl` presents to the API server.
    pub id_token: String,
    /// The refresh token, when the issuer gave one.
    pub refresh_token: Option<String>,
}

impl Tokens {
    /// The ID token's claims, decoded but not verified (the API server verifies them).
    pub fn claims(&self) -> Result<Value> {
        let payload = self
            .id_token
            .split('.')
            .nth(1)
            .ok_or_else(|| Error::Malformed {
                what: "ID token",
                reason: "not three dot-separated parts".into(),
            })?;
        let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(payload)
            .map_err(|e| Error::Malformed {
                what: "ID token",
                reason: e.to_string(),
            })?;
        serde_json::from_slice(&bytes).map_err(|e| Error::Malformed {
            what: "ID token",
            reason: e.to_string(),
        })
    }

    /// The `sub` claim: who the issuer says logged in.
    pub fn subject(&self) -> Result<String> {
        self.claims()?
            .get("sub")
            .and_then(Value::as_str)
            .map(str::to_owned)
            .ok_or_else(|| Error::Malformed {
                what: "ID token",
                reason: "no sub claim".into(),
            })
    }
}

impl Issuer {
    /// Where `scripts/control-plane build-oidc` puts Dex.
    pub fn binary() -> PathBuf {
        crate::control_plane::bin_dir().join("dex")
    }

    /// Whether tests can log in at a real issuer: `Ok(true)` when Dex is built; `Ok(false)`
    /// (after a loud message) when it is not and `BANLIEUE_ALLOW_MISSING_PEERS=1`; otherwise
    /// the error [`Issuer::start`] would give.
    pub fn available() -> Result<bool> {
        let binary = Self::binary();
        if binary.is_file() {
            return Ok(true);
        }
        let missing = Error::DexMissing(binary);
        if std::env::var(ALLOW_MISSING_PEERS_ENV).as_deref() == Ok("1") {
            eprintln!("\n!!!!! SKIPPED: {missing} (and {ALLOW_MISSING_PEERS_ENV}=1) !!!!!\n");
            return Ok(false);
        }
        Err(missing)
    }

    /// Starts Dex and waits until it serves its discovery document.
    pub async fn start(options: IssuerOptions) -> Result<Issuer> {
        let binary = Self::binary();
        if !binary.is_file() {
            return Err(Error::DexMissing(binary));
        }
        let mut processes = Processes::new()?;
        let dir = processes.dir().to_owned();
        let pki = pki::generate(&dir.join("certs"), &dir.join("tls"))?;
        let port = crate::ports::free_loopback_port().map_err(|source| Error::Io {
            what: "pick a free port".into(),
            source,
        })?;
        let config = dir.join("dex.yaml");
        write(&config, &config_yaml(port, &pki, &options)?)?;
        processes.spawn(
            "dex",
            &binary,
            &["serve".to_owned(), config.to_string_lossy().into_owned()],
        )?;
        let client = https::Client::new(port, Some(&pki.ca_der))?;
        let mut issuer = Issuer {
            processes,
            port,
            pki,
            client,
        };
        let started = Instant::now();
        issuer.wait_ready().await?;
        eprintln!(
            "dex at {} ready after {:.2?}",
            issuer.url(),
            started.elapsed()
        );
        Ok(issuer)
    }

    async fn wait_ready(&mut self) -> Result<()> {
        let started = Instant::now();
        loop {
            self.processes.check_running()?;
            let path = "/dex/.well-known/openid-configuration";
            if let Ok(r) = self
                .client
                .send(Method::GET, path, &[], None, Bytes::new())
                .await
                && r.status == StatusCode::OK
            {
                return Ok(());
            }
            if started.elapsed() >= READY_TIMEOUT {
                return Err(Error::NotReady {
                    after: READY_TIMEOUT,
                    log: self.processes.log_tails(),
                });
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// The issuer URL, exactly as it appears in its tokens' `iss`.
    pub fn url(&self) -> String {
        format!("https://127.0.0.1:{}/dex", self.port)
    }

    /// The CA that signed the issuer's serving certificate (PEM), for whoever verifies it.
    pub fn ca_pem(&self) -> &str {
        &self.pki.ca_pem
    }

    /// The CA's file.
    pub fn ca_cert_path(&self) -> &Path {
        &self.pki.ca_cert
    }

    /// The PID of the Dex process.
    pub fn pids(&self) -> Vec<(&'static str, u32)> {
        self.processes.pids()
    }

    /// The issuer's state directory (configuration, certificates, `logs/dex.log`).
    pub fn state_dir(&self) -> &Path {
        self.processes.dir()
    }

    /// Logs `email` in with the password grant (`grant_type=password`), as the public client.
    pub async fn password_login(&self, email: &str, password: &str) -> Result<Tokens> {
        let body = form(&[
            ("grant_type", "password"),
            ("client_id", CLIENT_ID),
            ("username", email),
            ("password", password),
            ("scope", "openid email offline_access"),
        ]);
        let response = self
            .client
            .send(
                Method::POST,
                "/dex/token",
                &[("content-type", "application/x-www-form-urlencoded")],
                None,
                Bytes::from(body),
            )
            .await?;
        if response.status != StatusCode::OK {
            return Err(Error::Status {
                what: format!("log {email} in"),
                status: response.status,
                body: String::from_utf8_lossy(&response.body).into_owned(),
            });
        }
        let json: Value = serde_json::from_slice(&response.body).map_err(|e| Error::Malformed {
            what: "token response",
            reason: e.to_string(),
        })?;
        let id_token = json
            .get("id_token")
            .and_then(Value::as_str)
            .ok_or_else(|| Error::Malformed {
                what: "token response",
                reason: "no id_token".into(),
            })?
            .to_owned();
        let refresh_token = json
            .get("refresh_token")
            .and_then(Value::as_str)
            .map(str::to_owned);
        Ok(Tokens {
            id_token,
            refresh_token,
        })
    }

    /// What a browser does after a user opens `authorize_url` (this issuer's authorization
    /// endpoint) and types `email` and `password` into Dex's login form: follows the issuer's
    /// redirects, posts the form, and finally requests the client's `http://localhost:PORT`
    /// callback. Returns the callback's status and body.
    pub async fn browser_login(
        &self,
        authorize_url: &str,
        email: &str,
        password: &str,
    ) -> Result<(StatusCode, String)> {
        let prefix = format!("https://127.0.0.1:{}", self.port);
        let mut target = authorize_url
            .strip_prefix(&prefix)
            .ok_or_else(|| Error::Malformed {
                what: "authorize URL",
                reason: format!("{authorize_url} is not at {prefix}"),
            })?
            .to_owned();
        let mut posted = false;
        // The login is a handful of hops: /auth, /auth/local, /auth/local/login (form),
        // /approval, the callback.
        for _ in 0..10 {
            let form_body = form(&[("login", email), ("password", password)]);
            let response = if posted {
                self.client
                    .send(Method::GET, &target, &[], None, Bytes::new())
                    .await?
            } else {
                let page = self
                    .client
                    .send(Method::GET, &target, &[], None, Bytes::new())
                    .await?;
                if page.status == StatusCode::OK
                    && String::from_utf8_lossy(&page.body).contains("name=\"password\"")
                {
                    posted = true;
                    self.client
                        .send(
                            Method::POST,
                            &target,
                            &[("content-type", "application/x-www-form-urlencoded")],
                            None,
                            Bytes::from(form_body),
                        )
                        .await?
                } else {
                    page
                }
            };
            if !response.status.is_redirection() {
                return Err(Error::Status {
                    what: format!("follow the login at {target}"),
                    status: response.status,
                    body: String::from_utf8_lossy(&response.body)
                        .chars()
                        .take(2000)
                        .collect(),
                });
            }
            let location = response.header("location").unwrap_or_default().to_owned();
            if let Some(rest) = location.strip_prefix("http://localhost:") {
                // The client's callback: plain HTTP on loopback.
                let (port, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
                let port: u16 = port.parse().map_err(|_| Error::Malformed {
                    what: "callback URL",
                    reason: location.clone(),
                })?;
                let callback = https::Client::new(port, None)?
                    .send(Method::GET, path, &[], None, Bytes::new())
                    .await?;
                return Ok((
                    callback.status,
                    String::from_utf8_lossy(&callback.body).into_owned(),
                ));
            }
            target = match location.strip_prefix(&prefix) {
                Some(path) => path.to_owned(),
                None if location.starts_with('/') => location,
                None => {
                    return Err(Error::Malformed {
                        what: "redirect",
                        reason: location,
                    });
                }
            };
        }
        Err(Error::Malformed {
            what: "login",
            reason: "more than 10 redirects".into(),
        })
    }

    /// A `jwt` entry of an `apiserver.config.k8s.io/v1` AuthenticationConfiguration that
    /// accepts this issuer's ID tokens for [`CLIENT_ID`], with usernames `<prefix><sub>`.
    pub fn authentication_jwt(&self, username_prefix: &str) -> String {
        let ca: String = self
            .ca_pem()
            .lines()
            .map(|l| format!("      {l}\n"))
            .collect();
        format!(
            "- issuer:\n    url: {url}\n    audiences: [{CLIENT_ID}]\n    certificateAuthority: |\n{ca}\
             \x20 claimMappings:\n    username:\n      claim: sub\n      prefix: {prefix}\n",
            url = self.url(),
            prefix = serde_json::Value::from(username_prefix),
        )
    }
}

/// The AuthenticationConfiguration accepting each `(issuer, username prefix)`.
pub fn authentication_config(issuers: &[(&Issuer, &str)]) -> String {
    let mut out = String::from(
        "apiVersion: apiserver.config.k8s.io/v1\nkind: AuthenticationConfiguration\njwt:\n",
    );
    for (issuer, prefix) in issuers {
        out.push_str(&issuer.authentication_jwt(prefix));
    }
    out
}

/// Dex's configuration: HTTPS on loopback, memory storage, the users, one public client.
fn config_yaml(port: u16, pki: &pki::Pki, options: &IssuerOptions) -> Result<String> {
    let mut users = String::new();
    for (i, user) in options.users.iter().enumerate() {
        let hash = bcrypt::hash(&user.password, BCRYPT_COST)?;
        let name = user.email.split('@').next().unwrap_or(&user.email);
        // JSON strings are YAML strings, quoted and escaped.
        users.push_str(&format!(
            "- email: {email}\n  hash: {hash}\n  username: {name}\n  userID: {id}\n",
            email = Value::from(user.email.as_str()),
            hash = Value::from(hash),
            name = Value::from(name),
            id = Value::from(format!("user-{i}-{name}")),
        ));
    }
    let users = if users.is_empty() {
        "[]\n".to_owned()
    } else {
        format!("\n{users}")
    };
    Ok(format!(
        "issuer: https://127.0.0.1:{port}/dex
storage:
  type: memory
web:
  https: 127.0.0.1:{port}
  tlsCert: {cert}
  tlsKey: {key}
logger:
  level: info
expiry:
  idTokens: {expiry}s
oauth2:
  skipApprovalScreen: true
  passwordConnector: local
  responseTypes: [code]
enablePasswordDB: true
staticPasswords: {users}
staticClients:
- id: {CLIENT_ID}
  name: banlieue
  public: true
",
        cert = Value::from(pki.server_cert.to_string_lossy()),
        key = Value::from(pki.server_key.to_string_lossy()),
        expiry = options.id_token_expiry.as_secs().max(1),
    ))
}

/// `application/x-www-form-urlencoded`.
fn form(pairs: &[(&str, &str)]) -> String {
    fn encode(s: &str) -> String {
        s.bytes()
            .map(|b| match b {
                b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                    (b as char).to_string()
                }
                b' ' => "+".to_owned(),
                _ => format!("%{b:02X}"),
            })
            .collect()
    }
    pairs
        .iter()
        .map(|(k, v)| format!("{}={}", encode(k), encode(v)))
        .collect::<Vec<_>>()
        .join("&")
}

fn write(path: &Path, contents: &str) -> Result<()> {
    std::fs::write(path, contents).map_err(|source| Error::Io {
        what: format!("write {}", path.display()),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forms_are_percent_encoded() {
        assert_eq!(
            form(&[("username", "alice@a.test"), ("scope", "openid email")]),
            "username=alice%40a.test&scope=openid+email"
        );
    }
}

//! A real OCI registry on loopback: Debian's `docker-registry` (distribution 2.8) with
//! filesystem storage in a temp dir, optionally TLS from a throwaway CA and htpasswd basic
//! auth; fixtures pushed into it with the independent `skopeo`.
//!
//! ```no_run
//! # async fn demo() -> Result<(), banlieue_testenv::registry::Error> {
//! use banlieue_testenv::registry::{Layer, OciLayout, Registry, RegistryOptions};
//! if !Registry::available()? {
//!     return Ok(()); // BANLIEUE_ALLOW_MISSING_PEERS=1 and no registry: skipped loudly
//! }
//! let registry = Registry::start(RegistryOptions::secure()).await?;
//! let dir = tempfile::tempdir().map_err(|e| banlieue_testenv::registry::Error::io("tempdir", e))?;
//! let layout = OciLayout::builder()
//!     .config("application/vnd.banlieue.disk.config.v1+json", br#"{"format":"qcow2"}"#.to_vec())
//!     .layer(Layer::from_file("application/vnd.banlieue.disk.qcow2", "/path/to/disk.qcow2"))
//!     .write(dir.path())?;
//! let digest = registry.push_layout(&layout, "disks/debian", "12").await?;
//! let pull_from = registry.reference("disks/debian", "12"); // 127.0.0.1:PORT/disks/debian:12
//! # Ok(()) }
//! ```
//!
//! Whether skopeo pushes such artifacts faithfully was checked with skopeo 1.9.3: it copies a
//! manifest with a custom config media type, custom layer media types (`…qcow2`,
//! `…qcow2+gzip`, even over non-gzip bytes), `artifactType` and annotations byte for byte;
//! `--preserve-digests` makes it fail rather than rewrite, and [`Registry::push_layout`]
//! compares the digest it reports with the layout's anyway.

pub(crate) mod http;
mod layout;
pub(crate) mod pki;

use std::fs::{self, File, OpenOptions};
use std::os::unix::fs::FileExt as _;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use ::http::{Method, StatusCode};
use bytes::Bytes;
use sha2::{Digest as _, Sha256};

use crate::control_plane::process::Processes;
use crate::libvirtd::ALLOW_MISSING_PEERS_ENV;

pub use http::{BODY_LIMIT, HttpResponse};
pub use layout::{
    ANNOTATION_TITLE, BOOTC_LABEL, Blob, CONTAINERDISK_PATH, Descriptor, Layer, OCI_EMPTY,
    OCI_IMAGE_CONFIG, OCI_INDEX, OCI_LAYER_TAR, OCI_MANIFEST, OciLayout, OciLayoutBuilder,
    TarEntry, containerdisk_layer, tar_layer,
};

/// Where Debian's `docker-registry` package puts the registry.
pub const REGISTRY_BINARY: &str = "/usr/bin/docker-registry";
/// Where Debian's `skopeo` package puts skopeo.
pub const SKOPEO_BINARY: &str = "/usr/bin/skopeo";
/// Every manifest type a test pushes: distribution 2.8 answers 404 for an OCI manifest to a
/// request that does not accept OCI types.
pub const MANIFEST_ACCEPT: &str = "application/vnd.oci.image.manifest.v1+json, \
    application/vnd.oci.image.index.v1+json, \
    application/vnd.docker.distribution.manifest.v2+json, \
    application/vnd.docker.distribution.manifest.list.v2+json";

/// bcrypt's minimum cost: the registry checks the password on every request, and a test does
/// not need the hash to resist cracking (the default cost, 12, takes ~0.25 s per check).
const BCRYPT_COST: u32 = 4;
/// How long one `skopeo copy` may take (a disk of hundreds of MiB on a slow disk).
const SKOPEO_TIMEOUT: Duration = Duration::from_secs(600);
/// How often readiness is probed.
const POLL: Duration = Duration::from_millis(25);
/// Attempts at picking a free port, in case another process takes it between pick and bind.
const PORT_ATTEMPTS: usize = 3;
/// The name of the registry's log (and of its process, in errors).
const PROCESS_NAME: &str = "docker-registry";

/// Kills the registry and removes its directory when the test process dies without dropping
/// the instance; it reads `pid N` lines, `stopped` once the registry is gone, then end of file.
const JANITOR_SCRIPT: &str = r#"
trap '' INT TERM HUP
dir=$1
pids=()
while read -r word arg; do
    case $word in
    pid) pids+=("$arg") ;;
    stopped) pids=() ;;
    esac
done
for pid in "${pids[@]}"; do
    # Only a process whose command line names this directory (its config file) is ours.
    if grep -qF -- "$dir" "/proc/$pid/cmdline" 2>/dev/null; then kill -KILL "$pid" 2>/dev/null || true; fi
done
sleep 0.2
rm -rf -- "$dir"
"#;

/// What can go wrong starting, using or stopping a registry.
#[derive(thiserror::Error)]
pub enum Error {
    #[error("docker-registry is not installed at {REGISTRY_BINARY}: run scripts/setup registry")]
    RegistryMissing,
    #[error("skopeo is not installed at {SKOPEO_BINARY}: run scripts/setup registry")]
    SkopeoMissing,
    #[error("failed to {what}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("run the registry's process")]
    Process(#[from] crate::control_plane::Error),
    #[error("generate certificates")]
    Pki(#[from] rcgen::Error),
    #[error("hash the password")]
    Bcrypt(#[from] bcrypt::BcryptError),
    #[error("set up TLS")]
    Tls(#[from] rustls::Error),
    #[error("encode JSON")]
    Json(#[from] serde_json::Error),
    #[error(
        "docker-registry did not answer GET /v2/ with 200 or 401 within {after:?} ({last}); end of its log:\n{log_tail}"
    )]
    NotReady {
        after: Duration,
        last: String,
        log_tail: String,
    },
    #[error("{what}")]
    Http {
        what: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("{what}: HTTP {status}: {body}")]
    Status {
        what: String,
        status: StatusCode,
        body: String,
    },
    #[error("{what} failed ({status}):\n{stderr}")]
    Command {
        what: String,
        status: ExitStatus,
        stderr: String,
    },
    #[error("{what}: no answer within {after:?}")]
    CommandTimeout { what: String, after: Duration },
    #[error(
        "skopeo pushed {reference} as {pushed}, but the layout's manifest is {expected}: it rewrote the manifest"
    )]
    DigestChanged {
        reference: String,
        expected: String,
        pushed: String,
    },
    #[error("invalid {what} {value:?}: {reason}")]
    InvalidName {
        what: &'static str,
        value: String,
        reason: &'static str,
    },
    #[error("invalid digest {0:?}: want sha256:<64 lower-case hex digits>")]
    InvalidDigest(String),
    #[error("no blob {0} in the registry's storage")]
    NoBlob(String),
    #[error("the layout has no config: call config() or image_config()")]
    NoConfig,
    #[error("image_config() needs uncompressed tar layers, not {0}")]
    NotUncompressedTar(String),
    #[error("{} already holds an OCI layout", .0.display())]
    LayoutExists(PathBuf),
}

/// The message chain rather than the structure, as the control plane's error: tests report
/// errors with `expect`, which prints `Debug`, and the reader wants the log tail.
impl std::fmt::Debug for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut text = self.to_string();
        let mut source = std::error::Error::source(self);
        while let Some(cause) = source {
            text.push_str(": ");
            text.push_str(&cause.to_string());
            source = cause.source();
        }
        f.write_str(&text)
    }
}

impl Error {
    /// An I/O error while trying `what` (a verb phrase).
    pub fn io(what: impl Into<String>, source: std::io::Error) -> Self {
        Self::Io {
            what: what.into(),
            source,
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A user and password for the registry's basic auth.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credentials {
    pub username: String,
    pub password: String,
}

impl Credentials {
    pub fn new(username: impl Into<String>, password: impl Into<String>) -> Self {
        Self {
            username: username.into(),
            password: password.into(),
        }
    }
}

/// How to run the registry. The default is plain HTTP without auth.
#[derive(Debug, Clone)]
pub struct RegistryOptions {
    /// Serve HTTPS only, with a certificate for `127.0.0.1` and `localhost` from a fresh CA.
    /// Without it, plain HTTP only.
    pub tls: bool,
    /// Require basic auth (htpasswd, bcrypt) as this user.
    pub credentials: Option<Credentials>,
    /// How long the registry may take to answer `GET /v2/` (it takes ~50 ms).
    pub ready_timeout: Duration,
}

impl Default for RegistryOptions {
    fn default() -> Self {
        Self {
            tls: false,
            credentials: None,
            ready_timeout: Duration::from_secs(30),
        }
    }
}

impl RegistryOptions {
    /// TLS and basic auth as user `banlieue` with a fresh password: what a real registry
    /// looks like to a puller.
    pub fn secure() -> Self {
        Self::default()
            .with_tls()
            .with_credentials("banlieue", fresh_secret("password"))
    }

    pub fn with_tls(mut self) -> Self {
        self.tls = true;
        self
    }

    pub fn with_credentials(
        mut self,
        username: impl Into<String>,
        password: impl Into<String>,
    ) -> Self {
        self.credentials = Some(Credentials::new(username, password));
        self
    }
}

/// A running registry. Dropping it kills the process by PID, reaps it and removes its dir
/// (storage included); a janitor does the same if the test process dies first.
#[derive(Debug)]
pub struct Registry {
    // Declared first so it drops first, before nothing else needs the dir.
    processes: Processes,
    port: u16,
    pid: u32,
    credentials: Option<Credentials>,
    pki: Option<pki::Pki>,
    client: http::Client,
}

impl Registry {
    /// Whether tests can run against a real registry: `Ok(true)` when `docker-registry` and
    /// `skopeo` are installed; `Ok(false)` (after a loud message on stderr) when one is not and
    /// `BANLIEUE_ALLOW_MISSING_PEERS=1`; otherwise the error [`Registry::start`] would give.
    pub fn available() -> Result<bool> {
        let missing = if !Path::new(REGISTRY_BINARY).exists() {
            Error::RegistryMissing
        } else if !Path::new(SKOPEO_BINARY).exists() {
            Error::SkopeoMissing
        } else {
            return Ok(true);
        };
        if std::env::var(ALLOW_MISSING_PEERS_ENV).as_deref() == Ok("1") {
            eprintln!("\n!!!!! SKIPPED: {missing} (and {ALLOW_MISSING_PEERS_ENV}=1) !!!!!\n");
            return Ok(false);
        }
        Err(missing)
    }

    /// Starts a registry and waits until it answers `GET /v2/`.
    pub async fn start(options: RegistryOptions) -> Result<Self> {
        if !Path::new(REGISTRY_BINARY).exists() {
            return Err(Error::RegistryMissing);
        }
        let mut attempt = 1;
        loop {
            match Self::start_once(&options).await {
                Err(Error::NotReady { log_tail, .. })
                    if attempt < PORT_ATTEMPTS && log_tail.contains("address already in use") =>
                {
                    eprintln!("docker-registry: its port was taken before it bound it, retrying");
                    attempt += 1;
                }
                Err(Error::Process(e))
                    if attempt < PORT_ATTEMPTS
                        && format!("{e:?}").contains("address already in use") =>
                {
                    eprintln!("docker-registry: its port was taken before it bound it, retrying");
                    attempt += 1;
                }
                result => return result,
            }
        }
    }

    async fn start_once(options: &RegistryOptions) -> Result<Self> {
        let mut processes = Processes::with_janitor("banlieue-registry-", JANITOR_SCRIPT, &[])?;
        let dir = processes.dir().to_owned();
        let pki = if options.tls {
            Some(pki::generate(&dir.join("certs"), &dir.join("tls"))?)
        } else {
            None
        };
        let htpasswd = match &options.credentials {
            Some(credentials) => {
                let path = dir.join("htpasswd");
                let hash = bcrypt::hash(&credentials.password, BCRYPT_COST)?;
                write(&path, &format!("{}:{hash}\n", credentials.username))?;
                Some(path)
            }
            None => None,
        };
        let port =
            crate::ports::free_loopback_port().map_err(|e| Error::io("pick a free port", e))?;
        let config = dir.join("config.yml");
        write(
            &config,
            &config_yaml(
                &dir.join("storage"),
                port,
                pki.as_ref(),
                htpasswd.as_deref(),
            )?,
        )?;
        let pid = processes.spawn(
            PROCESS_NAME,
            Path::new(REGISTRY_BINARY),
            &["serve".to_owned(), config.to_string_lossy().into_owned()],
        )?;
        let client = http::Client::new(port, pki.as_ref().map(|p| p.ca_der.as_slice()))?;
        let mut registry = Self {
            processes,
            port,
            pid,
            credentials: options.credentials.clone(),
            pki,
            client,
        };
        let started = Instant::now();
        registry.wait_ready(options.ready_timeout).await?;
        eprintln!(
            "docker-registry on {} ready after {:.2?}",
            registry.host(),
            started.elapsed()
        );
        Ok(registry)
    }

    async fn wait_ready(&mut self, timeout: Duration) -> Result<()> {
        let started = Instant::now();
        loop {
            // An exited registry (a bad config, a taken port) fails at once, with its log.
            self.processes.check_running()?;
            let last = match self
                .client
                .send(Method::GET, "/v2/", &[], None, Bytes::new())
                .await
            {
                Ok(r) if r.status == StatusCode::OK || r.status == StatusCode::UNAUTHORIZED => {
                    return Ok(());
                }
                Ok(r) => format!("HTTP {}", r.status),
                Err(e) => format!("{e:?}"),
            };
            if started.elapsed() >= timeout {
                return Err(Error::NotReady {
                    after: timeout,
                    last,
                    log_tail: self.log_tail(),
                });
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// `127.0.0.1:PORT`, as image references and `docker://` transports name the registry.
    pub fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// `127.0.0.1:PORT/REPO:TAG`.
    pub fn reference(&self, repo: &str, tag: &str) -> String {
        format!("{}/{repo}:{tag}", self.host())
    }

    /// `https://127.0.0.1:PORT` or `http://127.0.0.1:PORT`.
    pub fn base_url(&self) -> String {
        let scheme = if self.pki.is_some() { "https" } else { "http" };
        format!("{scheme}://{}", self.host())
    }

    pub fn is_tls(&self) -> bool {
        self.pki.is_some()
    }

    /// The user and password basic auth wants, if the registry requires auth.
    pub fn credentials(&self) -> Option<&Credentials> {
        self.credentials.as_ref()
    }

    /// The CA that signed the serving certificate (PEM), with TLS.
    pub fn ca_cert_path(&self) -> Option<&Path> {
        self.pki.as_ref().map(|p| p.ca_cert.as_path())
    }

    /// The CA certificate as PEM text, with TLS.
    pub fn ca_pem(&self) -> Option<&str> {
        self.pki.as_ref().map(|p| p.ca_pem.as_str())
    }

    /// A directory holding only `ca.crt`, as skopeo's `--*-cert-dir` and containers'
    /// `certs.d/HOST:PORT/` take it, with TLS.
    pub fn cert_dir(&self) -> Option<&Path> {
        self.pki.as_ref().map(|p| p.cert_dir.as_path())
    }

    /// The instance's temp dir: config, PKI, htpasswd, storage and log.
    pub fn dir(&self) -> &Path {
        self.processes.dir()
    }

    /// The filesystem storage driver's root (`docker/registry/v2/…` below it).
    pub fn storage_dir(&self) -> PathBuf {
        self.dir().join("storage")
    }

    /// The registry's stdout and stderr (it logs every request).
    pub fn log_file(&self) -> PathBuf {
        self.dir().join("logs").join(format!("{PROCESS_NAME}.log"))
    }

    /// The PID of the registry process (setpriv execs it).
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Whether the registry process is still running.
    pub fn is_running(&mut self) -> bool {
        self.processes.check_running().is_ok()
    }

    /// Sends `method path` (origin-form, e.g. `/v2/_catalog`) with `headers`, as `auth` when
    /// given (`None`: anonymous), and returns the answer whatever its status. The body is
    /// limited to [`BODY_LIMIT`].
    pub async fn request(
        &self,
        method: Method,
        path: &str,
        headers: &[(&str, &str)],
        auth: Option<&Credentials>,
    ) -> Result<HttpResponse> {
        self.client
            .send(method, path, headers, auth, Bytes::new())
            .await
    }

    /// `GET path` with the registry's own credentials.
    pub async fn get(&self, path: &str) -> Result<HttpResponse> {
        self.request(Method::GET, path, &[], self.credentials())
            .await
    }

    /// The repositories `GET /v2/_catalog` lists.
    pub async fn catalog(&self) -> Result<Vec<String>> {
        let response = self.get("/v2/_catalog").await?;
        let body = expect_ok("GET /v2/_catalog", &response)?;
        #[derive(serde::Deserialize)]
        struct Catalog {
            #[serde(default)]
            repositories: Vec<String>,
        }
        Ok(serde_json::from_slice::<Catalog>(body)?.repositories)
    }

    /// The digest the registry reports for `repo:tag` (`Docker-Content-Digest` of a `HEAD`
    /// that accepts every manifest type, see [`MANIFEST_ACCEPT`]).
    pub async fn manifest_digest(&self, repo: &str, tag: &str) -> Result<String> {
        check_repo(repo)?;
        check_tag(tag)?;
        let path = format!("/v2/{repo}/manifests/{tag}");
        let response = self
            .request(
                Method::HEAD,
                &path,
                &[("accept", MANIFEST_ACCEPT)],
                self.credentials(),
            )
            .await?;
        expect_ok(&format!("HEAD {path}"), &response)?;
        response
            .header("docker-content-digest")
            .map(str::to_owned)
            .ok_or_else(|| Error::Status {
                what: format!("HEAD {path}: no Docker-Content-Digest"),
                status: response.status,
                body: String::new(),
            })
    }

    /// The bytes the registry serves for blob `digest` of `repo` (at most [`BODY_LIMIT`]).
    pub async fn blob(&self, repo: &str, digest: &str) -> Result<Bytes> {
        check_repo(repo)?;
        if layout::sha256_hex(digest).is_none() {
            return Err(Error::InvalidDigest(digest.to_owned()));
        }
        let path = format!("/v2/{repo}/blobs/{digest}");
        let response = self.get(&path).await?;
        expect_ok(&format!("GET {path}"), &response)?;
        Ok(response.body)
    }

    /// Where the filesystem storage keeps blob `digest`'s bytes.
    pub fn blob_data_path(&self, digest: &str) -> Result<PathBuf> {
        let hex =
            layout::sha256_hex(digest).ok_or_else(|| Error::InvalidDigest(digest.to_owned()))?;
        let prefix = hex.get(..2).unwrap_or_default();
        Ok(self
            .storage_dir()
            .join("docker/registry/v2/blobs/sha256")
            .join(prefix)
            .join(hex)
            .join("data"))
    }

    /// Overwrites the first bytes (up to 64) of stored blob `digest` with their complement,
    /// keeping its size: the registry then serves different bytes under the same digest and
    /// length, as a disk or network fault would, and a puller must notice.
    pub fn corrupt_blob(&self, digest: &str) -> Result<()> {
        let path = self.blob_data_path(digest)?;
        let what = || format!("corrupt {}", path.display());
        let file = match OpenOptions::new().read(true).write(true).open(&path) {
            Ok(file) => file,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(Error::NoBlob(digest.to_owned()));
            }
            Err(e) => return Err(Error::io(what(), e)),
        };
        let len = file.metadata().map_err(|e| Error::io(what(), e))?.len();
        let mut head = vec![0; usize::try_from(len.min(64)).unwrap_or(64)];
        file.read_exact_at(&mut head, 0)
            .map_err(|e| Error::io(what(), e))?;
        for byte in &mut head {
            *byte = !*byte;
        }
        file.write_all_at(&head, 0)
            .map_err(|e| Error::io(what(), e))?;
        file.sync_all().map_err(|e| Error::io(what(), e))
    }

    /// Pushes the image in `layout` to `repo:tag` with `skopeo copy --preserve-digests`,
    /// trusting the registry's CA and logging in with its credentials, and returns the
    /// manifest digest; fails if it is not the layout's (skopeo would have rewritten it).
    pub async fn push_layout(&self, layout: &OciLayout, repo: &str, tag: &str) -> Result<String> {
        check_repo(repo)?;
        check_tag(tag)?;
        if !Path::new(SKOPEO_BINARY).exists() {
            return Err(Error::SkopeoMissing);
        }
        let layout_dir = layout.dir().to_string_lossy().into_owned();
        if layout_dir.contains(':') {
            // `oci:PATH:REF` cannot carry a colon in PATH.
            return Err(Error::InvalidName {
                what: "layout dir",
                value: layout_dir,
                reason: "skopeo's oci: transport takes no ':' in the path",
            });
        }
        let source = format!("oci:{layout_dir}:{}", layout.ref_name());
        let reference = self.reference(repo, tag);
        let digest_file = tempfile::NamedTempFile::new_in(self.dir())
            .map_err(|e| Error::io("create skopeo's digest file", e))?;
        let mut args: Vec<String> = vec![
            // The system's signature policy is not what a test checks.
            "--insecure-policy".into(),
            "copy".into(),
            "--quiet".into(),
            "--preserve-digests".into(),
            "--digestfile".into(),
            digest_file.path().to_string_lossy().into_owned(),
        ];
        match self.cert_dir() {
            Some(dir) => args.push(format!("--dest-cert-dir={}", dir.display())),
            None => args.push("--dest-tls-verify=false".into()),
        }
        match self.credentials() {
            Some(c) => args.push(format!("--dest-creds={}:{}", c.username, c.password)),
            None => args.push("--dest-no-creds".into()),
        }
        args.push(source);
        args.push(format!("docker://{reference}"));
        self.skopeo(&format!("skopeo copy to {reference}"), &args)
            .await?;
        let pushed = fs::read_to_string(digest_file.path())
            .map_err(|e| Error::io("read skopeo's digest file", e))?
            .trim()
            .to_owned();
        if pushed != layout.manifest_digest() {
            return Err(Error::DigestChanged {
                reference,
                expected: layout.manifest_digest().to_owned(),
                pushed,
            });
        }
        Ok(pushed)
    }

    /// `skopeo inspect ARGS docker://HOST/REPO:TAG` with the registry's CA and credentials,
    /// e.g. `["--raw"]` or `["--config"]`; returns its stdout.
    pub async fn skopeo_inspect(&self, repo: &str, tag: &str, args: &[&str]) -> Result<Vec<u8>> {
        check_repo(repo)?;
        check_tag(tag)?;
        let reference = self.reference(repo, tag);
        let mut all: Vec<String> = vec!["inspect".into()];
        match self.cert_dir() {
            Some(dir) => all.push(format!("--cert-dir={}", dir.display())),
            None => all.push("--tls-verify=false".into()),
        }
        match self.credentials() {
            Some(c) => all.push(format!("--creds={}:{}", c.username, c.password)),
            None => all.push("--no-creds".into()),
        }
        all.extend(args.iter().map(|&a| a.to_owned()));
        all.push(format!("docker://{reference}"));
        self.skopeo(&format!("skopeo inspect {reference}"), &all)
            .await
    }

    async fn skopeo(&self, what: &str, args: &[String]) -> Result<Vec<u8>> {
        let mut command = tokio::process::Command::new(SKOPEO_BINARY);
        command
            .args(args)
            // No auth file of the machine's: the credentials are the ones given.
            .env("REGISTRY_AUTH_FILE", self.dir().join("auth.json"))
            .stdin(Stdio::null())
            .kill_on_drop(true);
        let output = tokio::time::timeout(SKOPEO_TIMEOUT, command.output())
            .await
            .map_err(|_| Error::CommandTimeout {
                what: what.to_owned(),
                after: SKOPEO_TIMEOUT,
            })?
            .map_err(|e| Error::io(format!("run {what}"), e))?;
        if !output.status.success() {
            return Err(Error::Command {
                what: what.to_owned(),
                status: output.status,
                stderr: String::from_utf8_lossy(&output.stderr).trim().to_owned(),
            });
        }
        Ok(output.stdout)
    }

    /// The end of the registry's log, for error messages.
    pub fn log_tail(&self) -> String {
        tail(&self.log_file())
    }
}

fn expect_ok<'a>(what: &str, response: &'a HttpResponse) -> Result<&'a [u8]> {
    if response.status == StatusCode::OK {
        Ok(&response.body)
    } else {
        Err(Error::Status {
            what: what.to_owned(),
            status: response.status,
            body: String::from_utf8_lossy(
                response
                    .body
                    .get(..4096.min(response.body.len()))
                    .unwrap_or_default(),
            )
            .into_owned(),
        })
    }
}

/// The registry's config: loopback only, storage in the instance's dir, no cache (so
/// [`Registry::corrupt_blob`] is seen at once), no background jobs.
fn config_yaml(
    storage: &Path,
    port: u16,
    pki: Option<&pki::Pki>,
    htpasswd: Option<&Path>,
) -> Result<String> {
    // JSON strings are YAML scalars: paths need no escaping rules of their own.
    let quote = |path: &Path| serde_json::to_string(&path.to_string_lossy());
    let mut yaml = format!(
        "version: 0.1\n\
         log:\n  level: info\n  formatter: text\n\
         storage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\n  \
         maintenance:\n    uploadpurging:\n      enabled: false\n\
         http:\n  addr: 127.0.0.1:{port}\n  secret: {}\n",
        quote(storage)?,
        fresh_secret("http"),
    );
    if let Some(pki) = pki {
        yaml.push_str(&format!(
            "  tls:\n    certificate: {}\n    key: {}\n",
            quote(&pki.server_cert)?,
            quote(&pki.server_key)?,
        ));
    }
    if let Some(path) = htpasswd {
        yaml.push_str(&format!(
            "auth:\n  htpasswd:\n    realm: banlieue-test-registry\n    path: {}\n",
            quote(path)?
        ));
    }
    Ok(yaml)
}

/// A hex string unlike any earlier one in this process or another: the registry's HTTP
/// secret and generated passwords are test values, not keys, so time, PID and a counter do.
fn fresh_secret(purpose: &str) -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let seed = format!(
        "{purpose} {nanos} {} {}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    );
    Sha256::digest(seed.as_bytes())
        .iter()
        .take(16)
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Repository names as the distribution spec allows them: path components of lower-case
/// letters and digits separated by `.`, `_`, `__` or `-`s.
pub(crate) fn check_repo(repo: &str) -> Result<()> {
    let invalid = |reason| Error::InvalidName {
        what: "repository",
        value: repo.to_owned(),
        reason,
    };
    if repo.is_empty() || repo.len() > 255 {
        return Err(invalid("want 1 to 255 characters"));
    }
    for component in repo.split('/') {
        let bytes = component.as_bytes();
        let alnum = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit();
        if !bytes.first().is_some_and(alnum) || !bytes.last().is_some_and(alnum) {
            return Err(invalid("components start and end with [a-z0-9]"));
        }
        if !bytes
            .iter()
            .all(|b| alnum(b) || matches!(b, b'.' | b'_' | b'-'))
        {
            return Err(invalid("components hold [a-z0-9._-] only"));
        }
    }
    Ok(())
}

/// Tags as the distribution spec allows them: `[A-Za-z0-9_][A-Za-z0-9._-]{0,127}`.
pub(crate) fn check_tag(tag: &str) -> Result<()> {
    let bytes = tag.as_bytes();
    let ok = bytes.len() <= 128
        && bytes
            .first()
            .is_some_and(|b| b.is_ascii_alphanumeric() || *b == b'_')
        && bytes
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(Error::InvalidName {
            what: "tag",
            value: tag.to_owned(),
            reason: "want [A-Za-z0-9_][A-Za-z0-9._-]{0,127}",
        })
    }
}

fn write(path: &Path, contents: &str) -> Result<()> {
    fs::write(path, contents).map_err(|e| Error::io(format!("write {}", path.display()), e))
}

/// The last few KiB of a log file, lossily decoded.
fn tail(path: &Path) -> String {
    const TAIL: u64 = 4096;
    let Ok(file) = File::open(path) else {
        return String::new();
    };
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    let start = len.saturating_sub(TAIL);
    let mut bytes = vec![0; usize::try_from(len - start).unwrap_or(0)];
    match file.read_exact_at(&mut bytes, start) {
        Ok(()) => String::from_utf8_lossy(&bytes).into_owned(),
        Err(e) => format!("({e})"),
    }
}

//! The network side of a build: resolving a reference to a manifest digest, and fetching the
//! manifest, config and layer blobs of that digest, each checked against its digest as it
//! streams to disk. A thin shell over `reqwest` speaking the distribution spec's pull
//! endpoints; [`crate::challenge`] decides, without I/O, how to answer a 401. Every body the
//! registry sends is read with a bound (manifest, config, token, error) while it streams, so a
//! hostile registry can neither exhaust memory nor write an unbounded message to status, and
//! every failure maps to one of the build reasons in [`crate::reason`].

use std::net::IpAddr;
use std::path::Path;
use std::time::Duration;

use base64::Engine as _;
use oci_client::Reference;
use reqwest::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE, HeaderValue, WWW_AUTHENTICATE};
use reqwest::{Method, Response, StatusCode};
use sha2::{Digest, Sha256};
use tokio::io::AsyncWriteExt;

use crate::challenge::{self, Challenge};
use crate::reason::{BuildError, Reason};

/// A manifest is JSON of a few KiB; anything larger is refused before parsing.
pub const MAX_MANIFEST_BYTES: usize = 4 << 20;
/// An image config (only its labels are read) is refused above this.
pub const MAX_CONFIG_BYTES: u64 = 1 << 20;

/// The manifest media types a build accepts (single-platform manifests only).
const MANIFEST_TYPES: &[&str] = &[
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
];
/// What a registry answers for an image index or manifest list.
const INDEX_TYPES: &[&str] = &[
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
];

/// How to reach one registry: its credentials, extra trust, and whether plain HTTP is allowed.
#[derive(Clone, Default)]
pub struct Access {
    /// Basic credentials from a docker config Secret, or anonymous.
    pub credentials: Option<(String, String)>,
    /// PEM CA bundle trusted besides the system roots.
    pub ca_pem: Option<Vec<u8>>,
    /// Plain HTTP; only ever used for a loopback registry.
    pub plain_http: bool,
    /// Hosts besides the registry's own that may serve its bearer tokens (HTTPS only).
    pub token_realm_hosts: Vec<String>,
}

impl std::fmt::Debug for Access {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Access")
            .field("credentials", &self.credentials.as_ref().map(|(u, _)| u))
            .field("ca_pem", &self.ca_pem.as_ref().map(Vec::len))
            .field("plain_http", &self.plain_http)
            .field("token_realm_hosts", &self.token_realm_hosts)
            .finish()
    }
}

/// Parses a VMImage's `url` into a reference: an OCI reference, optionally with an `oci://` or
/// `docker://` scheme in front.
pub fn parse_reference(url: &str) -> Result<Reference, BuildError> {
    let bare = url
        .strip_prefix("oci://")
        .or_else(|| url.strip_prefix("docker://"))
        .unwrap_or(url);
    bare.parse::<Reference>().map_err(|e| {
        BuildError::new(
            Reason::InvalidReference,
            format!("{url:?} is not an OCI reference: {e}"),
        )
    })
}

/// The same repository, pinned to `digest`.
pub fn pinned(reference: &Reference, digest: &str) -> Reference {
    Reference::with_digest(
        reference.registry().to_owned(),
        reference.repository().to_owned(),
        digest.to_owned(),
    )
}

/// The host of `registry` (`host[:port]`, `[v6]:port`), without port or brackets.
pub fn host_of(registry: &str) -> &str {
    let host = match registry.rsplit_once(':') {
        // `[::1]:5000`, `127.0.0.1:5000`, `localhost:5000`; a bare IPv6 literal has several ':'.
        Some((h, port)) if port.chars().all(|c| c.is_ascii_digit()) && !h.ends_with(':') => h,
        _ => registry,
    };
    host.trim_start_matches('[').trim_end_matches(']')
}

/// True when `registry` (`host[:port]`) names a loopback address.
pub fn is_loopback(registry: &str) -> bool {
    let host = host_of(registry);
    host == "localhost" || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// A client for one reference's registry, holding the authorization it earned.
pub struct Puller {
    http: reqwest::Client,
    /// The same, never following a redirect.
    token_http: reqwest::Client,
    /// `https://host:port` (or `http://` on loopback).
    base: String,
    registry: String,
    access: Access,
    /// The Authorization header a 401 taught, sent on every later request.
    authorization: tokio::sync::Mutex<Option<HeaderValue>>,
}

impl std::fmt::Debug for Puller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Puller")
            .field("base", &self.base)
            .field("access", &self.access)
            .finish_non_exhaustive()
    }
}

impl Puller {
    /// Checks the access against the reference (plain HTTP only on loopback) and builds the
    /// client.
    pub fn new(reference: &Reference, access: &Access) -> Result<Self, BuildError> {
        let registry = reference.resolve_registry().to_owned();
        if access.plain_http && !is_loopback(&registry) {
            return Err(BuildError::new(
                Reason::PlainHttpRefused,
                format!(
                    "plainHttp is allowed only for a loopback registry, not {registry}; give the \
                     registry's CA with caConfigMapName instead"
                ),
            ));
        }
        let no_client = |e: &(dyn std::error::Error + 'static)| {
            BuildError::new(
                Reason::RegistryUnreachable,
                format!(
                    "no HTTPS client for {registry}: {}",
                    crate::convert::error_chain(e)
                ),
            )
        };
        let extra_roots = match &access.ca_pem {
            Some(pem) => reqwest::Certificate::from_pem_bundle(pem).map_err(|e| no_client(&e))?,
            None => Vec::new(),
        };
        // reqwest is built without a crypto provider of its own: the workspace's ring provider
        // is the process default (a no-op when the binary installed it already).
        let _ = rustls::crypto::ring::default_provider().install_default();
        let builder = || {
            reqwest::Client::builder()
                .tls_certs_merge(extra_roots.clone())
                .connect_timeout(Duration::from_secs(15))
                .read_timeout(Duration::from_secs(60))
                .user_agent(concat!("banlieue-imagebuilder/", env!("CARGO_PKG_VERSION")))
        };
        // Registries redirect blob downloads to storage; reqwest drops the Authorization
        // header when a redirect leaves the host.
        let http = builder().build().map_err(|e| no_client(&e))?;
        // The token service gets the credentials: it was checked, where it redirects was not.
        let token_http = builder()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| no_client(&e))?;
        let scheme = if access.plain_http { "http" } else { "https" };
        Ok(Puller {
            http,
            token_http,
            base: format!("{scheme}://{registry}"),
            registry,
            access: access.clone(),
            authorization: tokio::sync::Mutex::new(None),
        })
    }

    /// The digest the reference resolves to now: a tag by a HEAD (or a GET where the registry
    /// gives no digest header); a digest by [`Puller::manifest`], so a digest nobody can show
    /// with these credentials is never taken for resolved.
    pub async fn resolve(&self, reference: &Reference) -> Result<String, BuildError> {
        if let Some(digest) = reference.digest() {
            self.manifest(reference).await?;
            return Ok(digest.to_owned());
        }
        let tag = reference.tag().unwrap_or("latest");
        let url = self.manifest_url(reference, tag);
        let response = self.send(Method::HEAD, &url, reference).await?;
        if let Some(digest) = response
            .headers()
            .get("docker-content-digest")
            .and_then(|v| v.to_str().ok())
            .filter(|d| d.starts_with("sha256:"))
        {
            return Ok(digest.to_owned());
        }
        let raw = self.manifest_bytes(reference, tag).await?;
        Ok(sha256_digest(&raw))
    }

    /// The manifest of `digest` (a pinned reference): its bytes, checked against the digest.
    /// Fetching it is also the proof that these credentials may read the image: an artifact
    /// built earlier is reused only after this succeeds.
    pub async fn manifest(&self, reference: &Reference) -> Result<Vec<u8>, BuildError> {
        let Some(expected) = reference.digest() else {
            return Err(BuildError::new(
                Reason::InvalidReference,
                format!("{reference} is not pinned to a digest"),
            ));
        };
        // An index is returned too: classify refuses it naming its platforms.
        let raw = self.manifest_bytes(reference, expected).await?;
        let actual = sha256_digest(&raw);
        if actual != expected {
            return Err(BuildError::new(
                Reason::DigestMismatch,
                format!("manifest of {reference} has digest {actual}"),
            ));
        }
        Ok(raw)
    }

    /// The manifest bytes at `tag_or_digest`, bounded, if the registry says they are a
    /// manifest or an index.
    async fn manifest_bytes(
        &self,
        reference: &Reference,
        tag_or_digest: &str,
    ) -> Result<Vec<u8>, BuildError> {
        let url = self.manifest_url(reference, tag_or_digest);
        let response = self.send(Method::GET, &url, reference).await?;
        let media_type = response
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(|v| v.split(';').next().unwrap_or(v).trim().to_owned())
            .unwrap_or_default();
        if !MANIFEST_TYPES.contains(&media_type.as_str())
            && !INDEX_TYPES.contains(&media_type.as_str())
        {
            return Err(BuildError::new(
                Reason::UnsupportedImage,
                format!(
                    "{reference}: the registry answered a manifest of type {:?}, not an OCI or \
                     Docker v2 image manifest",
                    truncate(&media_type, 100)
                ),
            ));
        }
        read_bounded(response, MAX_MANIFEST_BYTES, || {
            format!("manifest of {reference}")
        })
        .await
    }

    fn manifest_url(&self, reference: &Reference, tag_or_digest: &str) -> String {
        format!(
            "{}/v2/{}/manifests/{tag_or_digest}",
            self.base,
            reference.repository()
        )
    }

    /// Sends `method url` with the Accept header of manifests and the authorization learnt so
    /// far; on a 401, answers its challenge once and sends again. A non-success answer is an
    /// error whose body is read only up to [`challenge::MAX_ERROR_BYTES`].
    async fn send(
        &self,
        method: Method,
        url: &str,
        reference: &Reference,
    ) -> Result<Response, BuildError> {
        let mut answered = false;
        loop {
            let mut request = self
                .http
                .request(method.clone(), url)
                .header(ACCEPT, [MANIFEST_TYPES, INDEX_TYPES].concat().join(", "));
            if let Some(value) = self.authorization.lock().await.clone() {
                request = request.header(AUTHORIZATION, value);
            }
            let response = request.send().await.map_err(|e| unreachable(url, &e))?;
            if response.status() == StatusCode::UNAUTHORIZED && !answered {
                let challenge = challenge::parse(
                    response
                        .headers()
                        .get_all(WWW_AUTHENTICATE)
                        .iter()
                        .filter_map(|v| v.to_str().ok()),
                );
                if let Some(value) = self.answer(challenge, reference).await? {
                    *self.authorization.lock().await = Some(value);
                    answered = true;
                    continue;
                }
            }
            if response.status().is_success() {
                return Ok(response);
            }
            let status = response.status().as_u16();
            let body = read_prefix(response, challenge::MAX_ERROR_BYTES).await;
            return Err(challenge::error(&reference.to_string(), status, &body));
        }
    }

    /// The Authorization header that answers `challenge`, or `None` when there is nothing to
    /// answer with (the 401 then stands as Unauthorized).
    async fn answer(
        &self,
        challenge: Option<Challenge>,
        reference: &Reference,
    ) -> Result<Option<HeaderValue>, BuildError> {
        let basic = self.access.credentials.as_ref().map(|(user, password)| {
            let encoded =
                base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
            format!("Basic {encoded}")
        });
        let value = match challenge {
            None => None,
            Some(Challenge::Basic) => basic,
            Some(Challenge::Bearer { realm, service }) => {
                let url = challenge::check_realm(
                    &realm,
                    &self.registry,
                    self.access.plain_http,
                    &self.access.token_realm_hosts,
                )?;
                Some(format!(
                    "Bearer {}",
                    self.token(url, service, basic, reference).await?
                ))
            }
        };
        Ok(value.and_then(|v| HeaderValue::from_str(&v).ok()))
    }

    /// Asks the token service at `realm` for a pull token of the reference's repository.
    async fn token(
        &self,
        mut realm: reqwest::Url,
        service: Option<String>,
        basic: Option<String>,
        reference: &Reference,
    ) -> Result<String, BuildError> {
        realm.query_pairs_mut().append_pair(
            "scope",
            &format!("repository:{}:pull", reference.repository()),
        );
        if let Some(service) = &service {
            realm.query_pairs_mut().append_pair("service", service);
        }
        let what = format!(
            "token for {reference} from {}",
            realm.origin().ascii_serialization()
        );
        let mut request = self.token_http.get(realm.clone());
        if let Some(basic) = basic {
            request = request.header(AUTHORIZATION, basic);
        }
        let response = request.send().await.map_err(|e| unreachable(&what, &e))?;
        if response.status().is_redirection() {
            return Err(BuildError::new(
                Reason::TokenRealmRefused,
                format!("{what}: the token service answered a redirect, which is not followed"),
            ));
        }
        if !response.status().is_success() {
            let status = response.status().as_u16();
            let body = read_prefix(response, challenge::MAX_ERROR_BYTES).await;
            let mut e = challenge::error(&what, status, &body);
            if e.reason == Reason::ManifestNotFound {
                e.reason = Reason::Unauthorized;
            }
            return Err(e);
        }
        let body = read_bounded(response, challenge::MAX_TOKEN_BYTES, || what.clone()).await?;
        challenge::token(&body)
    }

    /// Streams the blob `digest` of `size` bytes into `path`, checking its length and digest as
    /// it goes; on any failure the file is removed. `progress` gets the bytes written so far.
    pub async fn blob_to_file(
        &self,
        reference: &Reference,
        digest: &str,
        size: u64,
        path: &Path,
        progress: &(dyn Fn(u64) + Sync),
    ) -> Result<(), BuildError> {
        let result = self
            .blob_to_file_inner(reference, digest, size, path, progress)
            .await;
        if result.is_err() {
            let _ = tokio::fs::remove_file(path).await;
        }
        result
    }

    async fn blob_to_file_inner(
        &self,
        reference: &Reference,
        digest: &str,
        size: u64,
        path: &Path,
        progress: &(dyn Fn(u64) + Sync),
    ) -> Result<(), BuildError> {
        let Some(expected_hex) = digest.strip_prefix("sha256:") else {
            return Err(BuildError::new(
                Reason::UnsupportedImage,
                format!("blob digest {digest:?} is not sha256"),
            ));
        };
        let url = format!("{}/v2/{}/blobs/{digest}", self.base, reference.repository());
        let mut response = self.send(Method::GET, &url, reference).await?;
        if response.content_length().is_some_and(|len| len != size) {
            return Err(BuildError::new(
                Reason::DigestMismatch,
                format!(
                    "blob {digest} is {} bytes long where its descriptor says {size}",
                    response.content_length().unwrap_or_default()
                ),
            ));
        }
        let mut file = tokio::fs::File::create(path).await.map_err(io_error)?;
        let mut hasher = Sha256::new();
        let mut written: u64 = 0;
        while let Some(chunk) = response
            .chunk()
            .await
            .map_err(|e| unreachable(&format!("blob {digest}"), &e))?
        {
            written += chunk.len() as u64;
            if written > size {
                return Err(BuildError::new(
                    Reason::DigestMismatch,
                    format!("blob {digest} is longer than the {size} bytes its descriptor says"),
                ));
            }
            hasher.update(&chunk);
            file.write_all(&chunk).await.map_err(io_error)?;
            progress(written);
        }
        file.flush().await.map_err(io_error)?;
        let actual = hex(&hasher.finalize());
        if written != size || actual != expected_hex {
            return Err(BuildError::new(
                Reason::DigestMismatch,
                format!("blob {digest}: received {written} bytes with digest sha256:{actual}"),
            ));
        }
        Ok(())
    }

    /// A small blob (an image config), in memory, bounded and checked.
    pub async fn small_blob(
        &self,
        reference: &Reference,
        digest: &str,
        size: u64,
        dir: &Path,
    ) -> Result<Vec<u8>, BuildError> {
        if size > MAX_CONFIG_BYTES {
            return Err(BuildError::new(
                Reason::TooLarge,
                format!("config blob {digest} is {size} bytes (at most {MAX_CONFIG_BYTES})"),
            ));
        }
        let path = dir.join("config.json");
        self.blob_to_file(reference, digest, size, &path, &|_| {})
            .await?;
        let bytes = tokio::fs::read(&path).await.map_err(io_error)?;
        let _ = tokio::fs::remove_file(&path).await;
        Ok(bytes)
    }
}

/// The whole body, refused as TooLarge as soon as it passes `max` bytes (by its declared
/// length first, then as it streams).
async fn read_bounded(
    mut response: Response,
    max: usize,
    what: impl Fn() -> String,
) -> Result<Vec<u8>, BuildError> {
    let too_large = |len: u64| {
        BuildError::new(
            Reason::TooLarge,
            format!("{} is {len} bytes or more (at most {max})", what()),
        )
    };
    if let Some(len) = response.content_length().filter(|len| *len > max as u64) {
        return Err(too_large(len));
    }
    let mut body = Vec::new();
    while let Some(chunk) = response
        .chunk()
        .await
        .map_err(|e| unreachable(&what(), &e))?
    {
        if body.len() + chunk.len() > max {
            return Err(too_large((body.len() + chunk.len()) as u64));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// At most `max` bytes of the body; the rest is never read. Read failures end the prefix.
async fn read_prefix(mut response: Response, max: usize) -> Vec<u8> {
    let mut body = Vec::new();
    while body.len() < max {
        match response.chunk().await {
            Ok(Some(chunk)) => {
                let room = max - body.len();
                body.extend_from_slice(&chunk[..chunk.len().min(room)]);
            }
            _ => break,
        }
    }
    body
}

fn unreachable(what: &str, e: &reqwest::Error) -> BuildError {
    BuildError::new(
        Reason::RegistryUnreachable,
        format!("{what}: {}", crate::convert::error_chain(e)),
    )
}

fn truncate(text: &str, max_chars: usize) -> String {
    text.chars().take(max_chars).collect()
}

/// `sha256:<hex>` of `bytes`.
pub fn sha256_digest(bytes: &[u8]) -> String {
    format!("sha256:{}", hex(&Sha256::digest(bytes)))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn io_error(e: std::io::Error) -> BuildError {
    BuildError::from_io("writing a blob", e)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_take_an_optional_scheme() {
        let r = parse_reference("oci://127.0.0.1:5000/guest/debian:12").expect("parses");
        assert_eq!(r.registry(), "127.0.0.1:5000");
        assert_eq!(r.repository(), "guest/debian");
        assert_eq!(r.tag(), Some("12"));
        let d = parse_reference("docker://127.0.0.1:5000/a@sha256:0000000000000000000000000000000000000000000000000000000000000000")
            .expect("parses");
        assert!(d.digest().is_some());
        let e = parse_reference("oci://UPPER/Case:x").expect_err("invalid");
        assert_eq!(e.reason, Reason::InvalidReference);
    }

    #[test]
    fn plain_http_only_on_loopback() {
        for host in [
            "127.0.0.1:5000",
            "localhost:5000",
            "[::1]:5000",
            "127.1.2.3",
        ] {
            assert!(is_loopback(host), "{host}");
        }
        for host in [
            "10.0.0.1:5000",
            "registry.example:5000",
            "example",
            "[fe80::1]:80",
        ] {
            assert!(!is_loopback(host), "{host}");
        }
        let remote = parse_reference("oci://10.0.0.1:5000/a:b").expect("parses");
        let access = Access {
            plain_http: true,
            ..Access::default()
        };
        let refused = Puller::new(&remote, &access).expect_err("refused");
        assert_eq!(refused.reason, Reason::PlainHttpRefused);
    }

    #[test]
    fn pinning_keeps_the_repository() {
        let r = parse_reference("oci://127.0.0.1:5000/guest/debian:12").expect("parses");
        let digest = sha256_digest(b"x");
        let p = pinned(&r, &digest);
        assert_eq!(p.digest(), Some(digest.as_str()));
        assert_eq!(p.repository(), "guest/debian");
    }
}

//! The network side of a build: resolving a reference to a manifest digest, and fetching the
//! manifest, config and layer blobs of that digest, each checked against its digest as it
//! streams to disk. A thin shell over the `oci-client` crate; every failure maps to one of the
//! build reasons in [`crate::reason`].

use std::net::IpAddr;
use std::path::Path;

use futures::StreamExt;
use oci_client::client::{Certificate, CertificateEncoding, ClientConfig, ClientProtocol};
use oci_client::errors::{OciDistributionError, OciErrorCode};
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};
use sha2::{Digest, Sha256};
use tokio::io::AsyncWriteExt;

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

/// How to reach one registry: its credentials, extra trust, and whether plain HTTP is allowed.
#[derive(Clone, Default)]
pub struct Access {
    /// Basic credentials from a docker config Secret, or anonymous.
    pub credentials: Option<(String, String)>,
    /// PEM CA bundle trusted besides the system roots.
    pub ca_pem: Option<Vec<u8>>,
    /// Plain HTTP; only ever used for a loopback registry.
    pub plain_http: bool,
}

impl std::fmt::Debug for Access {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Access")
            .field("credentials", &self.credentials.as_ref().map(|(u, _)| u))
            .field("ca_pem", &self.ca_pem.as_ref().map(Vec::len))
            .field("plain_http", &self.plain_http)
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

/// True when `registry` (`host[:port]`) names a loopback address.
pub fn is_loopback(registry: &str) -> bool {
    let host = match registry.rsplit_once(':') {
        // `[::1]:5000`, `127.0.0.1:5000`, `localhost:5000`; a bare IPv6 literal has several ':'.
        Some((h, port)) if port.chars().all(|c| c.is_ascii_digit()) && !h.ends_with(':') => h,
        _ => registry,
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host == "localhost" || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// A client for one reference's registry.
pub struct Puller {
    client: Client,
    auth: RegistryAuth,
}

impl std::fmt::Debug for Puller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // RegistryAuth's own Debug hides the password.
        f.debug_struct("Puller").field("auth", &self.auth).finish()
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
        let config = ClientConfig {
            protocol: if access.plain_http {
                ClientProtocol::Http
            } else {
                ClientProtocol::Https
            },
            extra_root_certificates: access
                .ca_pem
                .iter()
                .map(|pem| Certificate {
                    encoding: CertificateEncoding::Pem,
                    data: pem.clone(),
                })
                .collect(),
            // A manifest list is refused by name rather than resolved for the builder's own
            // platform: the disk runs on the hypervisor, not where the builder happens to run.
            platform_resolver: None,
            connect_timeout: Some(std::time::Duration::from_secs(15)),
            read_timeout: Some(std::time::Duration::from_secs(60)),
            user_agent: concat!("banlieue-imagebuilder/", env!("CARGO_PKG_VERSION")),
            ..ClientConfig::default()
        };
        let auth = match &access.credentials {
            Some((user, password)) => RegistryAuth::Basic(user.clone(), password.clone()),
            None => RegistryAuth::Anonymous,
        };
        // Client::new panics where this fails (for one, a system with no CA certificates).
        let client = Client::try_from(config).map_err(|e| {
            BuildError::new(
                Reason::RegistryUnreachable,
                format!(
                    "no HTTPS client for {registry}: {}",
                    crate::convert::error_chain(&e)
                ),
            )
        })?;
        Ok(Puller { client, auth })
    }

    /// The digest the reference resolves to now (a HEAD, or a GET where the registry gives no
    /// digest header).
    pub async fn resolve(&self, reference: &Reference) -> Result<String, BuildError> {
        if let Some(digest) = reference.digest() {
            return Ok(digest.to_owned());
        }
        let (raw, _) = self.manifest_bytes(reference).await?;
        Ok(sha256_digest(&raw))
    }

    /// The manifest of `digest` (a pinned reference): its bytes, checked against the digest.
    pub async fn manifest(&self, reference: &Reference) -> Result<Vec<u8>, BuildError> {
        let Some(expected) = reference.digest() else {
            return Err(BuildError::new(
                Reason::InvalidReference,
                format!("{reference} is not pinned to a digest"),
            ));
        };
        let (raw, _) = self.manifest_bytes(reference).await?;
        let actual = sha256_digest(&raw);
        if actual != expected {
            return Err(BuildError::new(
                Reason::DigestMismatch,
                format!("manifest of {reference} has digest {actual}"),
            ));
        }
        Ok(raw)
    }

    async fn manifest_bytes(&self, reference: &Reference) -> Result<(Vec<u8>, String), BuildError> {
        let (raw, digest) = self
            .client
            .pull_manifest_raw(reference, &self.auth, MANIFEST_TYPES)
            .await
            .map_err(|e| from_oci(reference, e))?;
        if raw.len() > MAX_MANIFEST_BYTES {
            return Err(BuildError::new(
                Reason::TooLarge,
                format!(
                    "manifest of {reference} is {} bytes (at most {MAX_MANIFEST_BYTES})",
                    raw.len()
                ),
            ));
        }
        Ok((raw.to_vec(), digest))
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
        self.client
            .store_auth_if_needed(reference.resolve_registry(), &self.auth)
            .await;
        let sized = self
            .client
            .pull_blob_stream(reference, digest)
            .await
            .map_err(|e| from_oci(reference, e))?;
        let mut stream = sized.stream;
        let mut file = tokio::fs::File::create(path).await.map_err(io_error)?;
        let mut hasher = Sha256::new();
        let mut written: u64 = 0;
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| {
                // The client's own verifying stream reports a wrong digest as an I/O error.
                if e.to_string().to_ascii_lowercase().contains("digest") {
                    BuildError::new(Reason::DigestMismatch, format!("blob {digest}: {e}"))
                } else {
                    BuildError::new(Reason::RegistryUnreachable, format!("blob {digest}: {e}"))
                }
            })?;
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

/// One reason per client failure: what a user can act on.
fn from_oci(reference: &Reference, e: OciDistributionError) -> BuildError {
    use OciDistributionError as E;
    let reason = match &e {
        E::AuthenticationFailure(_) | E::UnauthorizedError { .. } => Reason::Unauthorized,
        E::ImageManifestNotFoundError(_) => Reason::ManifestNotFound,
        E::ImageIndexParsingNoPlatformResolverError => Reason::UnsupportedImage,
        E::UnsupportedMediaTypeError(_)
        | E::ManifestParsingError(_)
        | E::VersionedParsingError(_)
        | E::UnsupportedSchemaVersionError(_)
        | E::IncompatibleLayerMediaTypeError(_) => Reason::UnsupportedImage,
        E::DigestError(_) => Reason::DigestMismatch,
        E::RegistryError { envelope, .. } => {
            let codes: Vec<&OciErrorCode> = envelope.errors.iter().map(|e| &e.code).collect();
            if codes
                .iter()
                .any(|c| matches!(c, OciErrorCode::Unauthorized | OciErrorCode::Denied))
            {
                Reason::Unauthorized
            } else if codes.iter().any(|c| {
                matches!(
                    c,
                    OciErrorCode::ManifestUnknown
                        | OciErrorCode::NameUnknown
                        | OciErrorCode::BlobUnknown
                )
            }) {
                Reason::ManifestNotFound
            } else {
                Reason::RegistryUnreachable
            }
        }
        E::ServerError { code, .. } if *code == 401 || *code == 403 => Reason::Unauthorized,
        E::ServerError { code, .. } if *code == 404 => Reason::ManifestNotFound,
        _ => Reason::RegistryUnreachable,
    };
    BuildError::new(reason, format!("{reference}: {e}"))
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

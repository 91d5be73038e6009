//! The parts of OCI (and Docker schema 2) manifests and image configs that banlieue reads.
//!
//! Unknown fields are ignored, as the OCI specification asks of consumers. Parsing is bounded:
//! manifests and configs over [`MAX_MANIFEST_BYTES`] are refused before parsing.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// The largest manifest or image config accepted: 4 MiB, the limit registries apply.
pub const MAX_MANIFEST_BYTES: usize = 4 << 20;

/// OCI image manifest.
pub const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
/// OCI image index (a list of per-platform manifests).
pub const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
/// Docker schema 2 manifest.
pub const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
/// Docker manifest list.
pub const DOCKER_MANIFEST_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";
/// OCI image config: the config of a container image.
pub const OCI_IMAGE_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
/// Docker image config.
pub const DOCKER_IMAGE_CONFIG: &str = "application/vnd.docker.container.image.v1+json";
/// The OCI empty descriptor's media type, the config of artifacts with no config.
pub const OCI_EMPTY: &str = "application/vnd.oci.empty.v1+json";

/// A content descriptor: what a blob is, its digest and its size.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Descriptor {
    /// The blob's media type.
    pub media_type: String,
    /// `algorithm:hex`, e.g. `sha256:…`.
    pub digest: String,
    /// The blob's size in bytes.
    pub size: u64,
    /// Free-form annotations.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    /// In an index: the platform this manifest is for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub platform: Option<Platform>,
    /// In an index: the artifact type of the manifest it points to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub artifact_type: Option<String>,
}

impl Descriptor {
    /// Whether the digest is `sha256:` + 64 or `sha512:` + 128 lower-case hex digits, the two
    /// algorithms OCI registers. Anything else would end up in a URL and a file name.
    pub fn has_valid_digest(&self) -> bool {
        let Some((algorithm, hex)) = self.digest.split_once(':') else {
            return false;
        };
        let len = match algorithm {
            "sha256" => 64,
            "sha512" => 128,
            _ => return false,
        };
        hex.len() == len && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    }
}

/// A platform in an image index.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Platform {
    /// CPU architecture, e.g. `amd64`.
    pub architecture: String,
    /// Operating system, e.g. `linux`.
    pub os: String,
    /// CPU variant, e.g. `v8`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub variant: Option<String>,
}

/// An image manifest, or an index; which one is told by [`Manifest::is_index`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Manifest {
    /// 2 for every manifest banlieue reads.
    #[serde(default)]
    pub schema_version: Option<u32>,
    /// The manifest's own media type (optional in OCI, required by Docker).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub media_type: Option<String>,
    /// OCI 1.1: what kind of artifact this is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub artifact_type: Option<String>,
    /// The config blob (absent in an index).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<Descriptor>,
    /// The layers, in order (absent in an index).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub layers: Vec<Descriptor>,
    /// In an index: the per-platform manifests.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub manifests: Vec<Descriptor>,
    /// Free-form annotations.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

impl Manifest {
    /// Whether this is an OCI index or a Docker manifest list rather than one image.
    pub fn is_index(&self) -> bool {
        matches!(
            self.media_type.as_deref(),
            Some(OCI_INDEX | DOCKER_MANIFEST_LIST)
        ) || !self.manifests.is_empty()
    }

    /// The config descriptor, when it is an OCI or Docker image config: the one blob
    /// [`crate::classify::classify`] needs to see (for bootc labels) before deciding.
    pub fn image_config(&self) -> Option<&Descriptor> {
        self.config
            .as_ref()
            .filter(|c| is_image_config(&c.media_type) && self.artifact_type.is_none())
    }
}

/// Whether `media_type` is a container image config.
pub fn is_image_config(media_type: &str) -> bool {
    media_type == OCI_IMAGE_CONFIG || media_type == DOCKER_IMAGE_CONFIG
}

/// An image config: only the labels are read.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct ImageConfig {
    /// The runtime config, where labels live.
    #[serde(default)]
    pub config: Option<ContainerConfig>,
}

/// The `config` object of an image config.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct ContainerConfig {
    /// `config.Labels`; `null` in many images.
    #[serde(rename = "Labels", default)]
    pub labels: Option<BTreeMap<String, String>>,
}

impl ImageConfig {
    /// The label `key`, if set.
    pub fn label(&self, key: &str) -> Option<&str> {
        self.config
            .as_ref()
            .and_then(|c| c.labels.as_ref())
            .and_then(|l| l.get(key))
            .map(String::as_str)
    }
}

fn bounded<'a, T: Deserialize<'a>>(bytes: &'a [u8], what: &'static str) -> Result<T> {
    if bytes.len() > MAX_MANIFEST_BYTES {
        return Err(Error::TooLarge {
            what,
            limit: MAX_MANIFEST_BYTES as u64,
        });
    }
    serde_json::from_slice(bytes).map_err(|source| Error::Json { what, source })
}

/// Parses a manifest or index; refuses more than [`MAX_MANIFEST_BYTES`].
pub fn parse_manifest(bytes: &[u8]) -> Result<Manifest> {
    bounded(bytes, "manifest")
}

/// Parses an image config; refuses more than [`MAX_MANIFEST_BYTES`].
pub fn parse_image_config(bytes: &[u8]) -> Result<ImageConfig> {
    bounded(bytes, "image config")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_docker_manifest_and_ignores_unknown_fields() {
        let m = parse_manifest(
            br#"{"schemaVersion":2,"mediaType":"application/vnd.docker.distribution.manifest.v2+json",
            "config":{"mediaType":"application/vnd.docker.container.image.v1+json","size":7,
            "digest":"sha256:0000000000000000000000000000000000000000000000000000000000000000"},
            "layers":[{"mediaType":"application/vnd.docker.image.rootfs.diff.tar.gzip","size":9,
            "digest":"sha256:1111111111111111111111111111111111111111111111111111111111111111",
            "urls":["x"]}],"somethingNew":true}"#,
        )
        .unwrap();
        assert!(!m.is_index());
        assert!(m.image_config().is_some());
        assert_eq!(m.layers.len(), 1);
        assert!(m.layers.iter().all(Descriptor::has_valid_digest));
    }

    #[test]
    fn refuses_oversized_and_malformed_manifests() {
        let big = vec![b' '; MAX_MANIFEST_BYTES + 1];
        assert!(matches!(
            parse_manifest(&big),
            Err(Error::TooLarge {
                what: "manifest",
                ..
            })
        ));
        assert!(matches!(
            parse_manifest(b"{\"layers\": 3}"),
            Err(Error::Json { .. })
        ));
    }

    #[test]
    fn reads_labels_even_when_null() {
        let c = parse_image_config(br#"{"config":{"Labels":null}}"#).unwrap();
        assert_eq!(c.label("containers.bootc"), None);
        let c = parse_image_config(br#"{"config":{"Labels":{"containers.bootc":"1"}}}"#).unwrap();
        assert_eq!(c.label("containers.bootc"), Some("1"));
        assert_eq!(parse_image_config(b"{}").unwrap(), ImageConfig::default());
    }

    #[test]
    fn digest_validation() {
        let mut d = Descriptor {
            media_type: String::new(),
            digest: format!("sha256:{}", "a".repeat(64)),
            size: 0,
            annotations: BTreeMap::new(),
            platform: None,
            artifact_type: None,
        };
        assert!(d.has_valid_digest());
        for bad in [
            format!("sha256:{}", "A".repeat(64)),
            format!("sha256:{}", "a".repeat(63)),
            format!("md5:{}", "a".repeat(32)),
            "sha256:../../etc".to_owned(),
            String::new(),
        ] {
            d.digest = bad;
            assert!(!d.has_valid_digest(), "{}", d.digest);
        }
    }
}

//! OCI image layout directories written by hand (`oci-layout`, `index.json`,
//! `blobs/sha256/…`), so fixtures do not depend on the code under test to build them: an
//! artifact with a custom config and layer media types, a container image, a containerDisk.
//!
//! Files given as layers are hard-linked into the layout (copied when the layout is on
//! another file system) and hashed as a stream: a disk of hundreds of MiB is never read into
//! memory. A hard link shares the file's bytes, so the source must not change afterwards.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::{self, Read as _, Write as _};
use std::path::{Path, PathBuf};

use serde::Serialize;
use sha2::{Digest as _, Sha256};

use super::Error;

/// An OCI image manifest.
pub const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
/// An OCI image index.
pub const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
/// A container image's configuration (rootfs, labels).
pub const OCI_IMAGE_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
/// An uncompressed tar layer.
pub const OCI_LAYER_TAR: &str = "application/vnd.oci.image.layer.v1.tar";
/// The empty descriptor's media type (its content is `{}`), for artifacts without a config.
pub const OCI_EMPTY: &str = "application/vnd.oci.empty.v1+json";
/// The layer annotation tools use for a file name (`oras` sets it on every file it pushes).
pub const ANNOTATION_TITLE: &str = "org.opencontainers.image.title";
/// Where KubeVirt's containerDisk looks for the disk inside the image.
pub const CONTAINERDISK_PATH: &str = "disk/disk.img";
/// The label bootc-capable images carry in their config.
pub const BOOTC_LABEL: &str = "containers.bootc";
/// The owner KubeVirt recommends for a containerDisk's file (qemu in its launcher image).
const CONTAINERDISK_OWNER: u64 = 107;
/// The index annotation naming an image in a layout; `oci:DIR:NAME` selects it.
const REF_NAME: &str = "org.opencontainers.image.ref.name";

/// A blob's content: bytes in memory (small things), or a file on disk (disks).
#[derive(Debug, Clone)]
pub enum Blob {
    Bytes(Vec<u8>),
    /// Hard-linked or copied into the layout, never read whole into memory.
    File(PathBuf),
}

/// A layer to put into a manifest.
#[derive(Debug, Clone)]
pub struct Layer {
    pub media_type: String,
    pub blob: Blob,
    pub annotations: BTreeMap<String, String>,
}

impl Layer {
    pub fn from_bytes(media_type: impl Into<String>, bytes: impl Into<Vec<u8>>) -> Self {
        Self {
            media_type: media_type.into(),
            blob: Blob::Bytes(bytes.into()),
            annotations: BTreeMap::new(),
        }
    }

    pub fn from_file(media_type: impl Into<String>, path: impl Into<PathBuf>) -> Self {
        Self {
            media_type: media_type.into(),
            blob: Blob::File(path.into()),
            annotations: BTreeMap::new(),
        }
    }

    pub fn annotation(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.annotations.insert(key.into(), value.into());
        self
    }
}

/// A content descriptor as it appears in the manifest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Descriptor {
    pub media_type: String,
    /// `sha256:<64 hex digits>`.
    pub digest: String,
    pub size: u64,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

#[derive(Debug, Clone)]
enum ConfigSpec {
    Raw { media_type: String, bytes: Vec<u8> },
    Image { labels: BTreeMap<String, String> },
}

/// Collects one image (config, layers, annotations) and writes it as a layout directory.
#[derive(Debug, Clone)]
pub struct OciLayoutBuilder {
    config: Option<ConfigSpec>,
    layers: Vec<Layer>,
    annotations: BTreeMap<String, String>,
    artifact_type: Option<String>,
    ref_name: String,
}

/// An OCI image layout directory holding one image manifest, and what was computed for it.
#[derive(Debug, Clone)]
pub struct OciLayout {
    dir: PathBuf,
    ref_name: String,
    manifest: Descriptor,
    manifest_bytes: Vec<u8>,
    config: Descriptor,
    layers: Vec<Descriptor>,
}

impl OciLayout {
    /// An empty builder; the image is named `latest` in the layout unless
    /// [`OciLayoutBuilder::ref_name`] says otherwise.
    pub fn builder() -> OciLayoutBuilder {
        OciLayoutBuilder {
            config: None,
            layers: Vec::new(),
            annotations: BTreeMap::new(),
            artifact_type: None,
            ref_name: "latest".to_owned(),
        }
    }

    /// The layout directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The name the image has in the layout (`oci:DIR:NAME`).
    pub fn ref_name(&self) -> &str {
        &self.ref_name
    }

    /// `sha256:…` of the manifest bytes: what a registry must report after a faithful push.
    pub fn manifest_digest(&self) -> &str {
        &self.manifest.digest
    }

    /// The manifest's descriptor as `index.json` lists it.
    pub fn manifest(&self) -> &Descriptor {
        &self.manifest
    }

    /// The manifest exactly as written.
    pub fn manifest_bytes(&self) -> &[u8] {
        &self.manifest_bytes
    }

    pub fn config(&self) -> &Descriptor {
        &self.config
    }

    /// The layers, in manifest order.
    pub fn layers(&self) -> &[Descriptor] {
        &self.layers
    }

    /// Where a blob lives in the layout, when `digest` is well formed.
    pub fn blob_path(&self, digest: &str) -> Option<PathBuf> {
        sha256_hex(digest).map(|hex| self.dir.join("blobs/sha256").join(hex))
    }
}

impl OciLayoutBuilder {
    /// The config blob as given, with any media type (an artifact's custom one, or
    /// [`OCI_EMPTY`] with `b"{}"`).
    pub fn config(mut self, media_type: impl Into<String>, bytes: impl Into<Vec<u8>>) -> Self {
        self.config = Some(ConfigSpec::Raw {
            media_type: media_type.into(),
            bytes: bytes.into(),
        });
        self
    }

    /// A container image config ([`OCI_IMAGE_CONFIG`], linux/amd64) with `labels`, whose
    /// `rootfs.diff_ids` are the layers' digests: every layer must then be an uncompressed
    /// tar ([`OCI_LAYER_TAR`]), where the two are the same.
    pub fn image_config<K, V>(mut self, labels: impl IntoIterator<Item = (K, V)>) -> Self
    where
        K: Into<String>,
        V: Into<String>,
    {
        self.config = Some(ConfigSpec::Image {
            labels: labels
                .into_iter()
                .map(|(k, v)| (k.into(), v.into()))
                .collect(),
        });
        self
    }

    pub fn layer(mut self, layer: Layer) -> Self {
        self.layers.push(layer);
        self
    }

    /// A manifest annotation.
    pub fn annotation(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.annotations.insert(key.into(), value.into());
        self
    }

    /// The manifest's `artifactType` (OCI 1.1).
    pub fn artifact_type(mut self, artifact_type: impl Into<String>) -> Self {
        self.artifact_type = Some(artifact_type.into());
        self
    }

    /// The image's name in the layout (default `latest`).
    pub fn ref_name(mut self, name: impl Into<String>) -> Self {
        self.ref_name = name.into();
        self
    }

    /// Writes the layout into `dir` (created if missing; it must hold no layout yet).
    pub fn write(self, dir: &Path) -> Result<OciLayout, Error> {
        super::check_tag(&self.ref_name)?;
        let blobs = dir.join("blobs/sha256");
        fs::create_dir_all(&blobs).map_err(|source| Error::io("create the layout", source))?;
        if dir.join("index.json").exists() {
            return Err(Error::LayoutExists(dir.to_owned()));
        }
        let mut layers = Vec::with_capacity(self.layers.len());
        for layer in &self.layers {
            let (digest, size) = match &layer.blob {
                Blob::Bytes(bytes) => put_bytes(&blobs, bytes)?,
                Blob::File(path) => put_file(&blobs, path)?,
            };
            layers.push(Descriptor {
                media_type: layer.media_type.clone(),
                digest,
                size,
                annotations: layer.annotations.clone(),
            });
        }
        let (config_media_type, config_bytes) = match self.config {
            None => return Err(Error::NoConfig),
            Some(ConfigSpec::Raw { media_type, bytes }) => (media_type, bytes),
            Some(ConfigSpec::Image { labels }) => {
                (OCI_IMAGE_CONFIG.to_owned(), image_config(&labels, &layers)?)
            }
        };
        let (digest, size) = put_bytes(&blobs, &config_bytes)?;
        let config = Descriptor {
            media_type: config_media_type,
            digest,
            size,
            annotations: BTreeMap::new(),
        };
        let manifest_bytes = serde_json::to_vec(&Manifest {
            schema_version: 2,
            media_type: OCI_MANIFEST,
            artifact_type: self.artifact_type.as_deref(),
            config: &config,
            layers: &layers,
            annotations: &self.annotations,
        })?;
        let (digest, size) = put_bytes(&blobs, &manifest_bytes)?;
        let manifest = Descriptor {
            media_type: OCI_MANIFEST.to_owned(),
            digest,
            size,
            annotations: BTreeMap::from([(REF_NAME.to_owned(), self.ref_name.clone())]),
        };
        let index = serde_json::json!({
            "schemaVersion": 2,
            "mediaType": OCI_INDEX,
            "manifests": [&manifest],
        });
        write_file(&dir.join("index.json"), &serde_json::to_vec(&index)?)?;
        write_file(
            &dir.join("oci-layout"),
            br#"{"imageLayoutVersion":"1.0.0"}"#,
        )?;
        Ok(OciLayout {
            dir: dir.to_owned(),
            ref_name: self.ref_name,
            manifest: Descriptor {
                annotations: BTreeMap::new(),
                ..manifest
            },
            manifest_bytes,
            config,
            layers,
        })
    }
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Manifest<'a> {
    schema_version: u32,
    media_type: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    artifact_type: Option<&'a str>,
    config: &'a Descriptor,
    layers: &'a [Descriptor],
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    annotations: &'a BTreeMap<String, String>,
}

fn image_config(
    labels: &BTreeMap<String, String>,
    layers: &[Descriptor],
) -> Result<Vec<u8>, Error> {
    if let Some(layer) = layers.iter().find(|l| l.media_type != OCI_LAYER_TAR) {
        return Err(Error::NotUncompressedTar(layer.media_type.clone()));
    }
    let diff_ids: Vec<&str> = layers.iter().map(|l| l.digest.as_str()).collect();
    let config = serde_json::json!({
        "architecture": "amd64",
        "os": "linux",
        "config": { "Labels": labels },
        "rootfs": { "type": "layers", "diff_ids": diff_ids },
    });
    Ok(serde_json::to_vec(&config)?)
}

/// Writes `bytes` as a blob and returns its digest and size.
fn put_bytes(blobs: &Path, bytes: &[u8]) -> Result<(String, u64), Error> {
    let hex = hex(&Sha256::digest(bytes));
    let path = blobs.join(&hex);
    if !path.exists() {
        write_file(&path, bytes)?;
    }
    Ok((format!("sha256:{hex}"), bytes.len() as u64))
}

/// Hashes `source` as a stream, then hard-links it into the layout (copies it across file
/// systems), and returns its digest and size.
fn put_file(blobs: &Path, source: &Path) -> Result<(String, u64), Error> {
    let what = || format!("read {}", source.display());
    let mut file = File::open(source).map_err(|e| Error::io(what(), e))?;
    let mut hasher = Sha256::new();
    let mut buffer = vec![0; 1 << 20];
    let mut size = 0u64;
    loop {
        let n = file.read(&mut buffer).map_err(|e| Error::io(what(), e))?;
        if n == 0 {
            break;
        }
        hasher.update(buffer.get(..n).unwrap_or_default());
        size += n as u64;
    }
    let hex = hex(&hasher.finalize());
    let path = blobs.join(&hex);
    if !path.exists() && fs::hard_link(source, &path).is_err() {
        fs::copy(source, &path)
            .map_err(|e| Error::io(format!("copy {} into the layout", source.display()), e))?;
    }
    Ok((format!("sha256:{hex}"), size))
}

fn write_file(path: &Path, bytes: &[u8]) -> Result<(), Error> {
    fs::write(path, bytes).map_err(|e| Error::io(format!("write {}", path.display()), e))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The hex part of a well-formed `sha256:<64 lower-case hex digits>` digest.
pub(crate) fn sha256_hex(digest: &str) -> Option<&str> {
    let hex = digest.strip_prefix("sha256:")?;
    (hex.len() == 64 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))).then_some(hex)
}

/// An entry of a tar layer.
#[derive(Debug, Clone)]
pub enum TarEntry {
    /// A directory (`path` without a trailing slash).
    Dir { path: String, mode: u32 },
    /// A regular file; a [`Blob::File`] is streamed into the tar.
    File { path: String, mode: u32, blob: Blob },
}

/// Writes an uncompressed tar of `entries` (owned by root, mtime 0, so the same entries give
/// the same bytes) to `out` and returns it as an [`OCI_LAYER_TAR`] layer.
pub fn tar_layer(out: &Path, entries: &[TarEntry]) -> Result<Layer, Error> {
    write_tar(out, entries, 0)?;
    Ok(Layer::from_file(OCI_LAYER_TAR, out))
}

/// The layer of a KubeVirt containerDisk: `disk/` and `disk/disk.img` (the file at `disk`,
/// streamed, owned by 107:107 as KubeVirt recommends), written as a tar to `out`.
pub fn containerdisk_layer(disk: &Path, out: &Path) -> Result<Layer, Error> {
    let entries = [
        TarEntry::Dir {
            path: "disk".to_owned(),
            mode: 0o555,
        },
        TarEntry::File {
            path: CONTAINERDISK_PATH.to_owned(),
            mode: 0o440,
            blob: Blob::File(disk.to_owned()),
        },
    ];
    write_tar(out, &entries, CONTAINERDISK_OWNER)?;
    Ok(Layer::from_file(OCI_LAYER_TAR, out))
}

fn write_tar(out: &Path, entries: &[TarEntry], file_owner: u64) -> Result<(), Error> {
    let what = || format!("write the tar {}", out.display());
    let file = File::create(out).map_err(|e| Error::io(what(), e))?;
    let mut builder = tar::Builder::new(io::BufWriter::new(file));
    for entry in entries {
        let mut header = tar::Header::new_ustar();
        header.set_mtime(0);
        header.set_uid(0);
        header.set_gid(0);
        match entry {
            TarEntry::Dir { path, mode } => {
                header.set_entry_type(tar::EntryType::Directory);
                header.set_mode(*mode);
                header.set_size(0);
                builder
                    .append_data(&mut header, format!("{path}/"), io::empty())
                    .map_err(|e| Error::io(what(), e))?;
            }
            TarEntry::File { path, mode, blob } => {
                header.set_entry_type(tar::EntryType::Regular);
                header.set_mode(*mode);
                header.set_uid(file_owner);
                header.set_gid(file_owner);
                match blob {
                    Blob::Bytes(bytes) => {
                        header.set_size(bytes.len() as u64);
                        builder
                            .append_data(&mut header, path, bytes.as_slice())
                            .map_err(|e| Error::io(what(), e))?;
                    }
                    Blob::File(source) => {
                        let read = || format!("read {}", source.display());
                        let file = File::open(source).map_err(|e| Error::io(read(), e))?;
                        let len = file.metadata().map_err(|e| Error::io(read(), e))?.len();
                        header.set_size(len);
                        // take(): a file that grows while being copied would corrupt the tar.
                        builder
                            .append_data(&mut header, path, file.take(len))
                            .map_err(|e| Error::io(what(), e))?;
                    }
                }
            }
        }
    }
    let mut writer = builder.into_inner().map_err(|e| Error::io(what(), e))?;
    writer.flush().map_err(|e| Error::io(what(), e))?;
    Ok(())
}

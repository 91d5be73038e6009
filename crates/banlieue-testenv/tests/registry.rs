//! The registry test peer, filled with the independent skopeo and read back over HTTP.

use std::io::Read as _;
use std::os::unix::fs::MetadataExt as _;
use std::path::Path;

use anyhow::{Context as _, Result, ensure};
use banlieue_testenv::registry::{
    ANNOTATION_TITLE, BOOTC_LABEL, CONTAINERDISK_PATH, Credentials, Layer, OCI_LAYER_TAR,
    OciLayout, Registry, RegistryOptions, TarEntry, containerdisk_layer, tar_layer,
};
use http::{Method, StatusCode};
use sha2::{Digest as _, Sha256};

const DISK_CONFIG: &str = "application/vnd.banlieue.disk.config.v1+json";
const DISK_QCOW2: &str = "application/vnd.banlieue.disk.qcow2";
const DISK_ARTIFACT: &str = "application/vnd.banlieue.disk.v1";

async fn start(options: RegistryOptions) -> Result<Option<Registry>> {
    if !Registry::available()? {
        return Ok(None);
    }
    Ok(Some(Registry::start(options).await?))
}

fn sha256(bytes: &[u8]) -> String {
    let hex: String = Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("sha256:{hex}")
}

/// A few KiB that start like a qcow2 image and differ in every run of the same test.
fn write_disk(path: &Path, seed: u8) -> Result<Vec<u8>> {
    let mut bytes = b"QFI\xfb\0\0\0\x03".to_vec();
    bytes.extend((0..8192u32).map(|i| (i % 251) as u8 ^ seed));
    std::fs::write(path, &bytes)?;
    Ok(bytes)
}

/// The file at `wanted` in a tar, if any.
fn file_in_tar(tar: &[u8], wanted: &str) -> Result<Option<(Vec<u8>, u64)>> {
    let mut archive = tar::Archive::new(tar);
    for entry in archive.entries()? {
        let mut entry = entry?;
        if entry.path()?.to_string_lossy() == wanted {
            let uid = entry.header().uid()?;
            let mut bytes = Vec::new();
            entry.read_to_end(&mut bytes)?;
            return Ok(Some((bytes, uid)));
        }
    }
    Ok(None)
}

#[tokio::test]
async fn tls_and_auth_registry_holds_artifacts_containerdisks_and_bootc_images() -> Result<()> {
    let Some(registry) = start(RegistryOptions::secure()).await? else {
        return Ok(());
    };
    ensure!(registry.is_tls() && registry.base_url().starts_with("https://127.0.0.1:"));
    ensure!(registry.host() == format!("127.0.0.1:{}", registry.port()));
    ensure!(registry.reference("a/b", "t") == format!("{}/a/b:t", registry.host()));
    let ca = registry.ca_cert_path().context("a TLS registry has a CA")?;
    ensure!(std::fs::read_to_string(ca)? == registry.ca_pem().context("CA PEM")?);
    ensure!(ca.parent() == registry.cert_dir() && ca.starts_with(registry.dir()));
    let credentials = registry.credentials().context("credentials")?.clone();
    let work = tempfile::tempdir()?;

    // (a) An artifact: custom config and layer media types, annotations, artifactType.
    let disk = work.path().join("disk.qcow2");
    write_disk(&disk, 1)?;
    let artifact = OciLayout::builder()
        .config(
            DISK_CONFIG,
            br#"{"format":"qcow2","virtualSize":1073741824}"#.to_vec(),
        )
        .layer(Layer::from_file(DISK_QCOW2, &disk).annotation(ANNOTATION_TITLE, "disk.qcow2"))
        .layer(Layer::from_bytes(
            format!("{DISK_QCOW2}+gzip"),
            b"\x1f\x8b not really gzip".to_vec(),
        ))
        .annotation("org.opencontainers.image.version", "12")
        .artifact_type(DISK_ARTIFACT)
        .ref_name("12")
        .write(&work.path().join("artifact"))?;
    // The disk is linked into the layout, not copied (same file system here).
    let blob = artifact
        .blob_path(&artifact.layers()[0].digest)
        .context("blob path")?;
    ensure!(std::fs::metadata(&blob)?.ino() == std::fs::metadata(&disk)?.ino());
    let digest = registry
        .push_layout(&artifact, "disks/debian", "12")
        .await?;
    ensure!(digest == artifact.manifest_digest());
    ensure!(registry.manifest_digest("disks/debian", "12").await? == digest);
    let raw = registry
        .skopeo_inspect("disks/debian", "12", &["--raw"])
        .await?;
    ensure!(
        raw == artifact.manifest_bytes(),
        "the registry serves another manifest"
    );
    ensure!(sha256(&raw) == digest);
    let manifest: serde_json::Value = serde_json::from_slice(&raw)?;
    ensure!(manifest["artifactType"] == DISK_ARTIFACT);
    ensure!(manifest["config"]["mediaType"] == DISK_CONFIG);
    ensure!(manifest["layers"][1]["mediaType"] == format!("{DISK_QCOW2}+gzip"));

    // (b) A KubeVirt containerDisk: a container image whose tar layer holds disk/disk.img.
    let disk_bytes = write_disk(&disk, 2)?;
    let layer = containerdisk_layer(&disk, &work.path().join("containerdisk.tar"))?;
    let containerdisk = OciLayout::builder()
        .image_config([("org.opencontainers.image.title", "debian")])
        .layer(layer)
        .write(&work.path().join("containerdisk"))?;
    let digest = registry
        .push_layout(&containerdisk, "containerdisks/debian", "latest")
        .await?;
    ensure!(
        registry
            .manifest_digest("containerdisks/debian", "latest")
            .await?
            == digest
    );
    let tar = registry
        .blob("containerdisks/debian", &containerdisk.layers()[0].digest)
        .await?;
    let (in_image, uid) =
        file_in_tar(&tar, CONTAINERDISK_PATH)?.context("disk/disk.img in the layer")?;
    ensure!(in_image == disk_bytes && uid == 107);

    // (c) A bootc-like image: the label in the config, as skopeo reads it.
    let rootfs = tar_layer(
        &work.path().join("rootfs.tar"),
        &[
            TarEntry::Dir {
                path: "usr".into(),
                mode: 0o755,
            },
            TarEntry::File {
                path: "usr/lib/os-release".into(),
                mode: 0o644,
                blob: banlieue_testenv::registry::Blob::Bytes(b"ID=debian\n".to_vec()),
            },
        ],
    )?;
    ensure!(rootfs.media_type == OCI_LAYER_TAR);
    let bootc = OciLayout::builder()
        .image_config([(BOOTC_LABEL, "1")])
        .layer(rootfs)
        .write(&work.path().join("bootc"))?;
    registry
        .push_layout(&bootc, "bootc/debian", "stable")
        .await?;
    let config: serde_json::Value = serde_json::from_slice(
        &registry
            .skopeo_inspect("bootc/debian", "stable", &["--config"])
            .await?,
    )?;
    ensure!(
        config["config"]["Labels"][BOOTC_LABEL] == "1",
        "config: {config}"
    );
    ensure!(config["rootfs"]["diff_ids"][0] == bootc.layers()[0].digest.as_str());

    let mut catalog = registry.catalog().await?;
    catalog.sort();
    ensure!(
        catalog == ["bootc/debian", "containerdisks/debian", "disks/debian"],
        "catalog: {catalog:?}"
    );

    // Auth: anonymous and a wrong password are refused, for the API root and a manifest.
    let wrong = Credentials::new(&credentials.username, "not-the-password");
    let manifest_path = "/v2/disks/debian/manifests/12";
    for (auth, want) in [
        (None, StatusCode::UNAUTHORIZED),
        (Some(&wrong), StatusCode::UNAUTHORIZED),
        (Some(&credentials), StatusCode::OK),
    ] {
        for path in ["/v2/", "/v2/_catalog", manifest_path] {
            let response = registry
                .request(
                    Method::GET,
                    path,
                    &[("accept", banlieue_testenv::registry::MANIFEST_ACCEPT)],
                    auth,
                )
                .await?;
            ensure!(
                response.status == want,
                "GET {path} as {:?}: {} (want {want})",
                auth.map(|c| &c.username),
                response.status
            );
        }
    }
    Ok(())
}

#[tokio::test]
async fn a_corrupted_blob_is_served_under_its_digest() -> Result<()> {
    let Some(registry) = start(RegistryOptions::secure()).await? else {
        return Ok(());
    };
    let work = tempfile::tempdir()?;
    let disk = work.path().join("disk.qcow2");
    let bytes = write_disk(&disk, 3)?;
    let layout = OciLayout::builder()
        .config(DISK_CONFIG, b"{}".to_vec())
        .layer(Layer::from_file(DISK_QCOW2, &disk))
        .write(&work.path().join("layout"))?;
    registry.push_layout(&layout, "disks/corrupt", "v1").await?;
    let digest = layout.layers()[0].digest.clone();
    ensure!(digest == sha256(&bytes));
    ensure!(registry.blob("disks/corrupt", &digest).await? == bytes);

    registry.corrupt_blob(&digest)?;
    let served = registry.blob("disks/corrupt", &digest).await?;
    ensure!(served.len() == bytes.len() && served != bytes);
    ensure!(sha256(&served) != digest);
    let head = registry
        .request(
            Method::HEAD,
            &format!("/v2/disks/corrupt/blobs/{digest}"),
            &[],
            registry.credentials(),
        )
        .await?;
    ensure!(head.status == StatusCode::OK);
    ensure!(head.header("docker-content-digest") == Some(digest.as_str()));
    // The source file is untouched: the registry stores its own copy.
    ensure!(std::fs::read(&disk)? == bytes);
    ensure!(registry.corrupt_blob(&sha256(b"never pushed")).is_err());
    Ok(())
}

#[tokio::test]
async fn plain_http_registry_without_auth_and_its_end() -> Result<()> {
    let Some(registry) = start(RegistryOptions::default()).await? else {
        return Ok(());
    };
    ensure!(!registry.is_tls() && registry.ca_pem().is_none() && registry.credentials().is_none());
    ensure!(registry.base_url().starts_with("http://127.0.0.1:"));
    let work = tempfile::tempdir()?;
    let layout = OciLayout::builder()
        .config(banlieue_testenv::registry::OCI_EMPTY, b"{}".to_vec())
        .layer(Layer::from_bytes(DISK_QCOW2, b"QFI\xfb tiny".to_vec()))
        .artifact_type(DISK_ARTIFACT)
        .write(work.path())?;
    let digest = registry.push_layout(&layout, "plain", "latest").await?;
    let anonymous = registry.request(Method::GET, "/v2/", &[], None).await?;
    ensure!(anonymous.status == StatusCode::OK);
    ensure!(registry.manifest_digest("plain", "latest").await? == digest);
    let log = std::fs::read_to_string(registry.log_file())?;
    ensure!(log.contains("/v2/plain/manifests/latest"), "log:\n{log}");

    let pid = registry.pid();
    let dir = registry.dir().to_owned();
    drop(registry);
    ensure!(
        !Path::new(&format!("/proc/{pid}")).exists(),
        "pid {pid} survived"
    );
    ensure!(!dir.exists(), "{} survived", dir.display());
    Ok(())
}

#[tokio::test]
async fn bad_names_are_refused_before_anything_runs() -> Result<()> {
    let Some(registry) = start(RegistryOptions::default()).await? else {
        return Ok(());
    };
    for (repo, tag) in [
        ("Upper", "t"),
        ("a//b", "t"),
        ("../x", "t"),
        ("a", ".t"),
        ("a", "t/u"),
    ] {
        ensure!(
            registry.manifest_digest(repo, tag).await.is_err(),
            "{repo}:{tag} accepted"
        );
    }
    ensure!(registry.corrupt_blob("sha256:../../x").is_err());
    Ok(())
}

//! The image builder against a real registry and a real API server, each role as the identity it
//! runs as: the reconciler in process as `banlieue-system/banlieue-imagebuilder`, each build as
//! the `banlieue imagebuild run` child process a build Job's pod runs, with a token of
//! `banlieue-imagebuild/banlieue-build`, under the RBAC `banlieue bootstrap` applies. The test
//! plays the node: it runs the Job's own arguments (there is no kubelet here; tests/deployed.rs
//! has one), pointing `--artifacts` at a directory of its own.
//!
//! Fixtures are pushed by skopeo (an independent client) into Debian's docker-registry with
//! TLS and basic auth; the oracle for every artifact is `qemu-img convert -O raw`.

use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use banlieue::bootstrap;
use banlieue_api::{ArtifactPhase, BuildArtifact, VMImage};
use banlieue_imagebuilder::classify::{ARTIFACT_TYPE, Compression, DiskFormat, media_type};
use banlieue_imagebuilder::decide;
use banlieue_imagebuilder::reconcile::{self, ReconcilerConfig};
use banlieue_testenv::control_plane::ControlPlane;
use banlieue_testenv::poll;
use banlieue_testenv::registry::{
    Layer, OciLayout, Registry, RegistryOptions, containerdisk_layer,
};
use base64::Engine as _;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;

const NS: &str = "banlieue-system";
const BUILD_NS: &str = "banlieue-imagebuild";
const PULL_SECRET: &str = "registry-pull";
const CA_MAP: &str = "registry-ca";
/// The disks are small: 48 MiB virtual with a few MiB of data, so the suite stays quick.
const DISK_BYTES: u64 = 48 << 20;

type Result<T = ()> = std::result::Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// The tests share banlieue-system and its Secret: one at a time, each with its reconciler.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

struct Env {
    _turn: tokio::sync::MutexGuard<'static, ()>,
    admin: Client,
    registry: Registry,
    dir: tempfile::TempDir,
    artifacts: PathBuf,
    build_kubeconfig: PathBuf,
    reconciler: tokio::task::JoinHandle<()>,
}

impl Drop for Env {
    fn drop(&mut self) {
        self.reconciler.abort();
    }
}

/// A control plane with bootstrap applied, a TLS + auth registry, its CA and pull Secret in
/// the build namespace (where registry access lives, out of the providers' reach), and the
/// reconciler running as its ServiceAccount.
async fn env(refresh: Duration) -> Result<Option<Env>> {
    if !Registry::available()? {
        return Ok(None);
    }
    let turn = ONE_AT_A_TIME.lock().await;
    let cp = ControlPlane::shared().await?;
    let admin = cp.client()?;
    // Admin plays the administrator running `banlieue bootstrap`.
    let objects = bootstrap::bootstrap_objects()?;
    bootstrap::apply_all(&admin, &objects, |_| {}).await?;
    let registry = Registry::start(RegistryOptions::secure()).await?;
    let credentials = registry.credentials().ok_or("credentials")?;
    let auth = base64::engine::general_purpose::STANDARD
        .encode(format!("{}:{}", credentials.username, credentials.password));
    let docker_config = json!({"auths": {registry.host(): {"auth": auth}}}).to_string();
    // A fresh registry per test binary run: the Secret and ConfigMap are replaced.
    let secrets: Api<Secret> = Api::namespaced(admin.clone(), BUILD_NS);
    let _ = secrets.delete(PULL_SECRET, &DeleteParams::default()).await;
    secrets
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": PULL_SECRET},
                "type": "kubernetes.io/dockerconfigjson",
                "stringData": {".dockerconfigjson": docker_config},
            }))?,
        )
        .await?;
    let maps: Api<ConfigMap> = Api::namespaced(admin.clone(), BUILD_NS);
    let _ = maps.delete(CA_MAP, &DeleteParams::default()).await;
    maps.create(
        &PostParams::default(),
        &serde_json::from_value(json!({
            "metadata": {"name": CA_MAP},
            "data": {"ca.crt": registry.ca_pem().ok_or("ca")?},
        }))?,
    )
    .await?;
    let dir = tempfile::tempdir()?;
    let artifacts = dir.path().join("artifacts");
    std::fs::create_dir_all(&artifacts)?;
    let build_kubeconfig = dir.path().join("build.kubeconfig");
    cp.write_service_account_kubeconfig(BUILD_NS, "banlieue-build", &build_kubeconfig)
        .await?;
    let as_builder = cp
        .client_as_service_account(NS, "banlieue-imagebuilder")
        .await?;
    // The site's allow-list (`--allowed-registries`): the test registry alone.
    let config = ReconcilerConfig {
        namespaces: vec![NS.to_owned()],
        refresh,
        retry: Duration::from_secs(1),
        retry_max: Duration::from_secs(4),
        allowed_registries: vec![registry.host()],
        ..ReconcilerConfig::default()
    };
    let reconciler = tokio::spawn(async move {
        if let Err(e) = reconcile::run(as_builder, config, std::future::pending()).await {
            eprintln!("reconciler: {e}");
        }
    });
    Ok(Some(Env {
        _turn: turn,
        admin,
        registry,
        dir,
        artifacts,
        build_kubeconfig,
        reconciler,
    }))
}

impl Env {
    /// Pushes `disk` as a disk artifact (one layer of `format`, `compression`) to `repo:tag`;
    /// returns the layout written under `dir` and the manifest digest.
    async fn push_disk(
        &self,
        dir: &Path,
        disk: &Path,
        (format, compression): (DiskFormat, Compression),
        (repo, tag): (&str, &str),
    ) -> Result<(OciLayout, String)> {
        let layout = OciLayout::builder()
            .config(ARTIFACT_TYPE, b"{}".to_vec())
            .layer(Layer::from_file(media_type(format, compression), disk))
            .write(dir)?;
        let digest = self.registry.push_layout(&layout, repo, tag).await?;
        Ok((layout, digest))
    }

    fn images(&self) -> Api<VMImage> {
        Api::namespaced(self.admin.clone(), NS)
    }

    /// Creates a VMImage (as admin, the administrator publishing an image) naming `url`.
    async fn image(&self, name: &str, url: &str, with_credentials: bool) -> Result {
        let mut source = json!({"providerClass": "libvirt", "kind": "Url", "url": url});
        if with_credentials {
            source["pullSecretName"] = json!(PULL_SECRET);
            source["caConfigMapName"] = json!(CA_MAP);
        }
        self.create_image(&self.admin, name, source).await
    }

    /// Creates a VMImage as `writer` naming `url`, with only the CA ConfigMap `ca`.
    async fn image_as(&self, writer: &Client, name: &str, url: &str, ca: Option<&str>) -> Result {
        let mut source = json!({"providerClass": "libvirt", "kind": "Url", "url": url});
        if let Some(ca) = ca {
            source["caConfigMapName"] = json!(ca);
        }
        self.create_image(writer, name, source).await
    }

    /// Replaces VMImage `name` with one of the single `source`, created by `writer`.
    async fn create_image(&self, writer: &Client, name: &str, source: serde_json::Value) -> Result {
        let _ = self.images().delete(name, &DeleteParams::default()).await;
        poll::until(
            &format!("old VMImage {name} gone"),
            Duration::from_secs(30),
            || async { Ok(self.images().get_opt(name).await?.is_none().then_some(())) },
        )
        .await?;
        let image: VMImage = serde_json::from_value(json!({
            "apiVersion": "banlieue.io/v1alpha1", "kind": "VMImage",
            "metadata": {"name": name, "namespace": NS},
            "spec": {"installMode": "Immediate", "sources": [source]},
        }))?;
        Api::<VMImage>::namespaced(writer.clone(), NS)
            .create(&PostParams::default(), &image)
            .await?;
        Ok(())
    }

    async fn artifact(&self, name: &str) -> Result<Option<BuildArtifact>> {
        Ok(self
            .images()
            .get(name)
            .await?
            .status
            .and_then(|s| s.build_artifact))
    }

    /// Waits until the VMImage's artifact satisfies `done`.
    async fn artifact_until(
        &self,
        name: &str,
        what: &str,
        done: impl Fn(&BuildArtifact) -> bool,
    ) -> Result<BuildArtifact> {
        let done = &done;
        Ok(poll::until(what, Duration::from_secs(60), || async move {
            Ok(self.artifact(name).await?.filter(|a| done(a)))
        })
        .await?)
    }

    /// The build Job the reconciler made for `name` at `digest`.
    async fn job(&self, name: &str, digest: &str) -> Result<Job> {
        let jobs: Api<Job> = Api::namespaced(self.admin.clone(), BUILD_NS);
        let job_name = decide::job_name(NS, name, digest);
        Ok(poll::until(
            &format!("build Job {job_name}"),
            Duration::from_secs(60),
            || async { Ok(jobs.get_opt(&job_name).await?) },
        )
        .await?)
    }

    /// Runs the Job's container arguments as its pod would, as banlieue-build, with
    /// `--artifacts` on the test's directory. Returns (success, stdout + stderr).
    fn run_job(&self, job: &Job) -> Result<(bool, String)> {
        let (ok, out, _) = self.run_job_in(job, &self.artifacts)?;
        Ok((ok, out))
    }

    /// [`Env::run_job`] onto `artifacts`; also returns the build's wall time and peak RSS (KiB).
    fn run_job_in(&self, job: &Job, artifacts: &Path) -> Result<(bool, String, Measured)> {
        let container = job
            .spec
            .as_ref()
            .and_then(|s| s.template.spec.as_ref())
            .map(|p| p.containers[0].clone())
            .ok_or("container")?;
        let mut args = container.args.unwrap_or_default();
        let at = args
            .iter()
            .position(|a| a == "--artifacts")
            .ok_or("--artifacts")?;
        args[at + 1] = artifacts.display().to_string();
        let mut command = Command::new(env!("CARGO_BIN_EXE_banlieue"));
        command
            .args(&args)
            .env("KUBECONFIG", &self.build_kubeconfig);
        let (out, measured) = measure(command)?;
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        Ok((out.status.success(), text, measured))
    }

    /// Builds what the reconciler asks for `name` and returns the Ready artifact.
    async fn build(&self, name: &str, digest: &str) -> Result<BuildArtifact> {
        let job = self.job(name, digest).await?;
        let (ok, out) = self.run_job(&job)?;
        assert!(ok, "build of {name} failed: {out}");
        self.artifact_until(name, "Ready artifact", |a| {
            a.phase == ArtifactPhase::Ready && a.manifest_digest.as_deref() == Some(digest)
        })
        .await
    }
}

/// A finished process's wall time and peak RSS.
#[derive(Clone, Copy, Debug)]
struct Measured {
    wall: Duration,
    peak_rss_kib: u64,
}

/// Runs `command` to completion, sampling its VmHWM from /proc while it runs.
fn measure(mut command: Command) -> Result<(std::process::Output, Measured)> {
    let started = std::time::Instant::now();
    let child = command
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()?;
    let status_path = format!("/proc/{}/status", child.id());
    let sampling = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let sampler = {
        let sampling = sampling.clone();
        std::thread::spawn(move || {
            let mut peak = 0;
            while sampling.load(std::sync::atomic::Ordering::Relaxed) {
                let hwm = std::fs::read_to_string(&status_path)
                    .ok()
                    .and_then(|text| {
                        text.lines()
                            .find_map(|l| l.strip_prefix("VmHWM:"))
                            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
                    })
                    .unwrap_or(0);
                peak = peak.max(hwm);
                std::thread::sleep(Duration::from_millis(10));
            }
            peak
        })
    };
    let out = child.wait_with_output()?;
    let wall = started.elapsed();
    sampling.store(false, std::sync::atomic::Ordering::Relaxed);
    let peak_rss_kib = sampler.join().map_err(|_| "sampler")?;
    Ok((out, Measured { wall, peak_rss_kib }))
}

/// A raw disk with scattered data and long holes, and its qcow2 (compressed) made by qemu-img.
fn disks(dir: &Path, seed: u8) -> Result<(PathBuf, PathBuf)> {
    use std::os::unix::fs::FileExt as _;
    let raw = dir.join(format!("disk-{seed}.raw"));
    let file = std::fs::File::create(&raw)?;
    file.set_len(DISK_BYTES)?;
    let mut x = u32::from(seed).wrapping_mul(2_654_435_761) | 1;
    for i in 0..40u64 {
        let block: Vec<u8> = (0..(64 << 10))
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                x as u8
            })
            .collect();
        file.write_all_at(&block, i * (1 << 20) + 4096 * u64::from(seed))?;
    }
    let qcow2 = dir.join(format!("disk-{seed}.qcow2"));
    let status = Command::new("qemu-img")
        .args(["convert", "-q", "-c", "-f", "raw", "-O", "qcow2"])
        .arg(&raw)
        .arg(&qcow2)
        .status()?;
    assert!(status.success(), "qemu-img convert");
    Ok((raw, qcow2))
}

/// What `qemu-img convert -O raw` makes of `image`.
fn oracle(image: &Path, out: &Path) -> Result<Vec<u8>> {
    let status = Command::new("qemu-img")
        .args(["convert", "-q", "-O", "raw"])
        .arg(image)
        .arg(out)
        .status()?;
    assert!(status.success(), "qemu-img convert -O raw");
    Ok(std::fs::read(out)?)
}

fn assert_artifact(env: &Env, artifact: &BuildArtifact, expected: &[u8]) -> Result {
    let path = env.artifacts.join(artifact.path.as_deref().ok_or("path")?);
    let bytes = std::fs::read(&path)?;
    assert!(
        bytes == expected,
        "{} differs from qemu-img's",
        path.display()
    );
    assert_eq!(artifact.size_bytes, Some(expected.len() as i64));
    let sha = banlieue_imagebuilder::pull::sha256_digest(&bytes);
    assert_eq!(Some(&sha[7..]), artifact.sha256.as_deref());
    // Holes stay holes: the data is 40 × 64 KiB.
    let allocated = std::fs::metadata(&path)?.blocks() * 512;
    assert!(
        allocated < 8 << 20,
        "{} allocates {allocated} bytes",
        path.display()
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_shape_builds_to_what_qemu_img_makes_and_bootc_is_refused() -> Result {
    let Some(env) = env(Duration::from_secs(600)).await? else {
        return Ok(());
    };
    let work = env.dir.path();
    let (_, qcow2) = disks(work, 1)?;
    let expected = oracle(&qcow2, &work.join("oracle.raw"))?;

    // An OCI artifact whose layer is a qcow2 disk.
    let (_, artifact_digest) = env
        .push_disk(
            &work.join("artifact"),
            &qcow2,
            (DiskFormat::Qcow2, Compression::None),
            ("disks/qcow2", "v1"),
        )
        .await?;
    // The same disk, raw and gzip-compressed.
    let gz = work.join("disk.raw.gz");
    let status = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "gzip -c {} > {}",
            work.join("oracle.raw").display(),
            gz.display()
        ))
        .status()?;
    assert!(status.success());
    let (_, gzip_digest) = env
        .push_disk(
            &work.join("gzip"),
            &gz,
            (DiskFormat::Raw, Compression::Gzip),
            ("disks/rawgz", "v1"),
        )
        .await?;
    // A KubeVirt containerDisk: the qcow2 under /disk/ in a container image.
    let layer = containerdisk_layer(&qcow2, &work.join("containerdisk.tar"))?;
    let layout = OciLayout::builder()
        .image_config([("org.example", "disk")])
        .layer(layer)
        .write(&work.join("containerdisk"))?;
    let cd_digest = env
        .registry
        .push_layout(&layout, "disks/containerdisk", "v1")
        .await?;

    for (name, repo, digest) in [
        ("shape-artifact", "disks/qcow2", &artifact_digest),
        ("shape-gzip", "disks/rawgz", &gzip_digest),
        ("shape-containerdisk", "disks/containerdisk", &cd_digest),
    ] {
        env.image(
            name,
            &format!("oci://{}", env.registry.reference(repo, "v1")),
            true,
        )
        .await?;
        let artifact = env.build(name, digest).await?;
        assert_artifact(&env, &artifact, &expected)?;
        assert_eq!(artifact.path, Some(decide::artifact_path(digest)));
    }

    // A second VMImage naming the same content builds nothing: it finds the first's artifact.
    env.image(
        "shape-artifact-again",
        &format!("oci://{}", env.registry.reference("disks/qcow2", "v1")),
        true,
    )
    .await?;
    let job = env.job("shape-artifact-again", &artifact_digest).await?;
    let (ok, out) = env.run_job(&job)?;
    assert!(ok && out.contains("reused"), "{out}");

    // A tenant who knows that digest (it is in every status) but has no credentials for the
    // private repository gets nothing: the reference does not resolve without showing the
    // manifest, so no Job is made.
    let bob = ControlPlane::shared()
        .await?
        .tenant_writing(NS, "bob", "vmimages")
        .await?;
    let borrowed = format!(
        "oci://{}/disks/qcow2@{artifact_digest}",
        env.registry.host()
    );
    env.image_as(&bob, "borrowed", &borrowed, Some(CA_MAP))
        .await?;
    let refused = env
        .artifact_until("borrowed", "Unauthorized", |a| {
            a.phase == ArtifactPhase::Failed
        })
        .await?;
    assert_eq!(
        refused.reason.as_deref(),
        Some("Unauthorized"),
        "{refused:?}"
    );
    assert_eq!(refused.path, None, "{refused:?}");
    let jobs: Api<Job> = Api::namespaced(env.admin.clone(), BUILD_NS);
    let made = jobs
        .list(&ListParams::default().labels("banlieue.io/vmimage=borrowed"))
        .await?;
    assert!(made.items.is_empty(), "a Job for a digest nobody showed");
    // Nothing of the owner's is lost: alice's image still has its artifact, where it was, and
    // a fresh image of hers, with her credentials, still resolves and builds.
    let kept = env.artifact("shape-artifact").await?;
    assert!(
        kept.as_ref()
            .is_some_and(|a| a.phase == ArtifactPhase::Ready
                && a.path == Some(decide::artifact_path(&artifact_digest))),
        "{kept:?}"
    );
    env.image(
        "fresh-after-borrowed",
        &format!("oci://{}", env.registry.reference("disks/qcow2", "v1")),
        true,
    )
    .await?;
    let fresh = env.build("fresh-after-borrowed", &artifact_digest).await?;
    assert_eq!(fresh.path, Some(decide::artifact_path(&artifact_digest)));
    // A Job made while the image could pull (here: the Job of the second image, after its
    // pull Secret is taken away) does not reuse the artifact either.
    env.image_as(&env.admin, "shape-artifact-again", &borrowed, Some(CA_MAP))
        .await?;
    let job = env.job("shape-artifact-again", &artifact_digest).await?;
    let (ok, out) = env.run_job(&job)?;
    assert!(!ok && !out.contains("reused"), "{out}");
    assert!(out.contains("Unauthorized"), "{out}");

    // A bootable container image needs an installer: refused with its reason.
    let layer = containerdisk_layer(&qcow2, &work.join("bootc.tar"))?;
    let layout = OciLayout::builder()
        .image_config([("containers.bootc", "1")])
        .layer(layer)
        .write(&work.join("bootc"))?;
    let bootc = env
        .registry
        .push_layout(&layout, "disks/bootc", "v1")
        .await?;
    env.image(
        "shape-bootc",
        &format!("oci://{}", env.registry.reference("disks/bootc", "v1")),
        true,
    )
    .await?;
    let job = env.job("shape-bootc", &bootc).await?;
    let (ok, out) = env.run_job(&job)?;
    assert!(!ok, "a bootc image built: {out}");
    let failed = env
        .artifact_until("shape-bootc", "Failed artifact", |a| {
            a.phase == ArtifactPhase::Failed
        })
        .await?;
    assert_eq!(failed.reason.as_deref(), Some("UnsupportedImage"));
    assert!(
        failed
            .message
            .as_deref()
            .is_some_and(|m| m.contains("installer")),
        "{failed:?}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_say_why_and_leave_no_artifact() -> Result {
    let Some(env) = env(Duration::from_secs(600)).await? else {
        return Ok(());
    };
    let work = env.dir.path();
    let (_, qcow2) = disks(work, 2)?;
    let (layout, digest) = env
        .push_disk(
            &work.join("artifact"),
            &qcow2,
            (DiskFormat::Qcow2, Compression::None),
            ("disks/fail", "v1"),
        )
        .await?;
    let url = format!("oci://{}", env.registry.reference("disks/fail", "v1"));

    // The reconciler watches only its namespaces: an image elsewhere, made first, is never
    // resolved (checked below, once the one in NS has been reconciled twice).
    let elsewhere = ControlPlane::shared().await?.fresh_namespace().await?;
    let outside: Api<VMImage> = Api::namespaced(env.admin.clone(), &elsewhere);
    outside
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "banlieue.io/v1alpha1", "kind": "VMImage",
                "metadata": {"name": "outside", "namespace": elsewhere},
                "spec": {"installMode": "Immediate", "sources": [
                    {"providerClass": "libvirt", "kind": "Url", "url": url}]},
            }))?,
        )
        .await?;

    // No credentials: the registry refuses to resolve the tag; no Job is made.
    env.image("fail-anonymous", &url, false).await?;
    let failed = env
        .artifact_until("fail-anonymous", "Failed artifact", |a| {
            a.phase == ArtifactPhase::Failed
        })
        .await?;
    // Without the CA the TLS handshake fails first; with the CA but no credentials, 401.
    assert_eq!(
        failed.reason.as_deref(),
        Some("RegistryUnreachable"),
        "{failed:?}"
    );
    let ca_only = json!({"spec": {"sources": [{"providerClass": "libvirt", "kind": "Url",
        "url": url, "caConfigMapName": CA_MAP}]}});
    env.images()
        .patch(
            "fail-anonymous",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&ca_only),
        )
        .await?;
    env.artifact_until("fail-anonymous", "Unauthorized", |a| {
        a.reason.as_deref() == Some("Unauthorized")
    })
    .await?;
    let jobs: Api<Job> = Api::namespaced(env.admin.clone(), BUILD_NS);
    let made = jobs
        .list(&ListParams::default().labels("banlieue.io/vmimage=fail-anonymous"))
        .await?;
    assert!(made.items.is_empty(), "a Job for an unresolved reference");
    let outside = outside.get("outside").await?;
    assert!(
        outside.status.and_then(|s| s.build_artifact).is_none(),
        "an image outside the reconciler's namespaces was resolved"
    );

    // A registry off the site's allow-list: refused before it is contacted, and no Job.
    env.image(
        "fail-not-allowed",
        "oci://registry.not-listed.invalid/disks/fail:v1",
        true,
    )
    .await?;
    let refused = env
        .artifact_until("fail-not-allowed", "RegistryNotAllowed", |a| {
            a.reason.as_deref() == Some("RegistryNotAllowed")
        })
        .await?;
    assert!(
        refused
            .message
            .as_deref()
            .is_some_and(|m| m.contains(&format!(
                "registry registry.not-listed.invalid is not one the image builder may pull from \
             (--allowed-registries: {})",
                env.registry.host()
            ))),
        "{refused:?}"
    );
    let made = jobs
        .list(&ListParams::default().labels("banlieue.io/vmimage=fail-not-allowed"))
        .await?;
    assert!(made.items.is_empty(), "a Job for a registry off the list");

    // A tag that does not exist.
    env.image(
        "fail-missing",
        &format!("oci://{}", env.registry.reference("disks/fail", "nope")),
        true,
    )
    .await?;
    env.artifact_until("fail-missing", "ManifestNotFound", |a| {
        a.reason.as_deref() == Some("ManifestNotFound")
    })
    .await?;

    // A corrupted blob: DigestMismatch, and nothing on the volume but what a rerun replaces.
    let layer = layout.layers()[0].digest.clone();
    env.registry.corrupt_blob(&layer)?;
    env.image("fail-corrupt", &url, true).await?;
    let job = env.job("fail-corrupt", &digest).await?;
    // A killed earlier attempt's leftover is replaced, never taken for the artifact.
    let artifact_path = env.artifacts.join(decide::artifact_path(&digest));
    std::fs::write(artifact_path.with_extension("raw.tmp"), b"half a disk")?;
    let (ok, out) = env.run_job(&job)?;
    assert!(!ok, "a corrupt blob built: {out}");
    let failed = env
        .artifact_until("fail-corrupt", "Failed artifact", |a| {
            a.phase == ArtifactPhase::Failed
        })
        .await?;
    assert_eq!(
        failed.reason.as_deref(),
        Some("DigestMismatch"),
        "{failed:?}"
    );
    assert!(!artifact_path.exists());
    let record = banlieue_imagebuilder::artifact::record_path(&artifact_path);
    assert!(!record.exists());

    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_moved_tag_is_a_new_build_and_the_old_artifact_stays() -> Result {
    let Some(env) = env(Duration::from_secs(2)).await? else {
        return Ok(());
    };
    let work = env.dir.path();
    let push = |seed: u8| {
        let env = &env;
        async move {
            let (_, qcow2) = disks(work, seed)?;
            let (_, digest) = env
                .push_disk(
                    &work.join(format!("layout-{seed}")),
                    &qcow2,
                    (DiskFormat::Qcow2, Compression::None),
                    ("disks/moving", "latest"),
                )
                .await?;
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>(digest)
        }
    };
    let first = push(3).await?;
    env.image(
        "moving",
        &format!("oci://{}", env.registry.reference("disks/moving", "latest")),
        true,
    )
    .await?;
    let built = env.build("moving", &first).await?;
    let old_path = env.artifacts.join(built.path.as_deref().ok_or("path")?);

    let second = push(4).await?;
    assert_ne!(first, second);
    // Resolved again within the refresh period: a new digest, a new Job, a new artifact.
    let rebuilt = env.build("moving", &second).await?;
    assert_ne!(rebuilt.sha256, built.sha256);
    assert!(old_path.exists(), "the old artifact was removed");
    let image = env.images().get("moving").await?;
    assert_eq!(image.name_any(), "moving");
    Ok(())
}

/// The build benchmark (not run by default; nothing is asserted on time): `banlieue imagebuild
/// run` against `skopeo copy` + `qemu-img convert -O raw` of the same 1 GiB-of-data qcow2 from
/// the same TLS registry, in one run, with each side's peak RSS and the artifact's allocation.
///
/// ```text
/// cargo test --profile image -p banlieue --test imagebuild bench -- --ignored --nocapture
/// ```
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark: run with --profile image -- --ignored --nocapture"]
async fn bench_build_against_skopeo_and_qemu_img() -> Result {
    const ROUNDS: usize = 3;
    let Some(env) = env(Duration::from_secs(600)).await? else {
        return Ok(());
    };
    let work = env.dir.path();
    // 2 GiB virtual, 1 GiB of incompressible data in 1 MiB runs, 1 GiB of holes between.
    let raw = work.join("bench.raw");
    {
        use std::os::unix::fs::FileExt as _;
        let file = std::fs::File::create(&raw)?;
        file.set_len(2 << 30)?;
        let mut state: u64 = 0x2545_f491_4f6c_dd1d;
        let mut block = vec![0u8; 1 << 20];
        for i in 0..1024u64 {
            for chunk in block.chunks_mut(8) {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                chunk.copy_from_slice(&state.to_le_bytes()[..chunk.len()]);
            }
            file.write_all_at(&block, i * (2 << 20))?;
        }
    }
    let qcow2 = work.join("bench.qcow2");
    let status = Command::new("qemu-img")
        .args(["convert", "-q", "-f", "raw", "-O", "qcow2"])
        .arg(&raw)
        .arg(&qcow2)
        .status()?;
    assert!(status.success());
    std::fs::remove_file(&raw)?;
    let qcow2_bytes = std::fs::metadata(&qcow2)?.len();
    let (layout, digest) = env
        .push_disk(
            &work.join("bench-layout"),
            &qcow2,
            (DiskFormat::Qcow2, Compression::None),
            ("bench/disk", "v1"),
        )
        .await?;
    let layer = layout.layers()[0].digest.clone();
    env.image(
        "bench",
        &format!("oci://{}", env.registry.reference("bench/disk", "v1")),
        true,
    )
    .await?;
    let job = env.job("bench", &digest).await?;
    let credentials = env.registry.credentials().ok_or("credentials")?;
    let creds = format!("{}:{}", credentials.username, credentials.password);
    let cert_dir = env.registry.cert_dir().ok_or("cert dir")?.to_owned();

    let (mut ours, mut peer) = (Vec::new(), Vec::new());
    let (mut ours_rss, mut skopeo_rss, mut qemu_rss) = (0, 0, 0);
    let mut allocation = (0, 0, 0);
    for round in 0..ROUNDS {
        let artifacts = work.join(format!("bench-artifacts-{round}"));
        std::fs::create_dir_all(&artifacts)?;
        let (ok, out, m) = env.run_job_in(&job, &artifacts)?;
        assert!(ok, "{out}");
        ours.push(m.wall);
        ours_rss = ours_rss.max(m.peak_rss_kib);
        let built = artifacts.join(decide::artifact_path(&digest));
        let meta = std::fs::metadata(&built)?;
        let ours_allocated = meta.blocks() * 512;

        let copy = work.join(format!("bench-skopeo-{round}"));
        let mut skopeo = Command::new("skopeo");
        skopeo
            .arg("--insecure-policy")
            .arg("copy")
            .arg("--src-cert-dir")
            .arg(&cert_dir)
            .args(["--src-creds", &creds])
            .arg(format!(
                "docker://{}",
                env.registry.reference("bench/disk", "v1")
            ))
            .arg(format!("oci:{}:v1", copy.display()));
        let (out, s) = measure(skopeo)?;
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let blob = copy.join("blobs/sha256").join(&layer[7..]);
        let converted = work.join(format!("bench-qemu-{round}.raw"));
        let mut qemu = Command::new("qemu-img");
        qemu.args(["convert", "-f", "qcow2", "-O", "raw"])
            .arg(&blob)
            .arg(&converted);
        let (out, q) = measure(qemu)?;
        assert!(out.status.success());
        peer.push(s.wall + q.wall);
        skopeo_rss = skopeo_rss.max(s.peak_rss_kib);
        qemu_rss = qemu_rss.max(q.peak_rss_kib);
        allocation = (
            meta.len(),
            ours_allocated,
            std::fs::metadata(&converted)?.blocks() * 512,
        );
        assert!(std::fs::read(&built)? == std::fs::read(&converted)?);
        std::fs::remove_dir_all(&artifacts)?;
        std::fs::remove_dir_all(&copy)?;
        std::fs::remove_file(&converted)?;
    }
    ours.sort();
    peer.sort();
    let (o, p) = (ours[ROUNDS / 2], peer[ROUNDS / 2]);
    let mib = |n: u64| n as f64 / f64::from(1 << 20);
    let rate = |t: Duration| mib(qcow2_bytes) / t.as_secs_f64();
    println!(
        "qcow2 of {:.0} MiB (2 GiB virtual), median of {ROUNDS}: imagebuild run {:.2} s ({:.0} MiB/s), \
         skopeo copy + qemu-img convert {:.2} s ({:.0} MiB/s), ratio {:.2}x; peak RSS imagebuild \
         {:.1} MiB, skopeo {:.1} MiB, qemu-img {:.1} MiB; artifact {:.0} MiB apparent, {:.0} MiB \
         allocated (qemu-img's {:.0} MiB)",
        mib(qcow2_bytes),
        o.as_secs_f64(),
        rate(o),
        p.as_secs_f64(),
        rate(p),
        p.as_secs_f64() / o.as_secs_f64(),
        ours_rss as f64 / 1024.0,
        skopeo_rss as f64 / 1024.0,
        qemu_rss as f64 / 1024.0,
        mib(allocation.0),
        mib(allocation.1),
        mib(allocation.2),
    );
    Ok(())
}

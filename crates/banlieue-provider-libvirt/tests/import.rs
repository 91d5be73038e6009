//! VMImage import against a real kube-apiserver (with the Job controller, no kubelet) and a
//! real libvirtd over TLS. The control plane runs no pods, so the tests check the Job objects
//! and run the import directly, as the Job would: in process, and as a child process where it
//! must be killed or inspected through /proc. The provider and the importer run as the
//! ServiceAccounts the operator gives them, under the shipped RBAC (ADR-0063).

mod common;

use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use banlieue_api::{
    ArtifactPhase, BuildArtifact, ImageSource, ImageSourceKind, ImportJobSettings, InstallMode,
    KeySelector, LocalObjectReference, Provider, ProviderClass, ProviderClassSpec,
    ProviderConnection, ProviderImageStatus, ProviderSpec, VMImage, VMImageSpec, ValueOrSource,
    ZoneImageStatus, ZonePhase,
};
use banlieue_provider_libvirt::image::decide;
use banlieue_provider_libvirt::image::jobs::{ImageReconciler, ImageReconcilerConfig};
use banlieue_provider_libvirt::image::marker;
use banlieue_provider_libvirt::image::{
    ImportArgs, ImportOutcome, run_image_reconciler, run_import,
};
use banlieue_testenv::control_plane::{ControlPlane, wait_for};
use banlieue_testenv::libvirtd::{Libvirtd, LibvirtdOptions};
use common::{import_account, import_identity, libvirt_class_rules, provider_identity};
use k8s_openapi::ByteString;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, Secret, ServiceAccount};
use k8s_openapi::api::rbac::v1::PolicyRule;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::json;
use sha2::{Digest, Sha256};

const MIB: u64 = 1 << 20;
const IMAGE: &str = "kairos-ubuntu-2404";
const PROVIDER: &str = "edge-7";

struct Cluster {
    cp: &'static ControlPlane,
    /// Admin: the test plays the administrator (ProviderClass, Providers, credentials,
    /// VMImages), the operator (the Providers' failure domains), the image builder (the build
    /// artifact) and observes the Jobs. The provider and the importer have their own clients.
    client: kube::Client,
    /// The Provider's and the VMImages' namespace.
    ns: String,
    /// The ProviderClass's build namespace.
    build_ns: String,
    /// Named after `ns`: each test has its own build namespace, so its own class.
    class: ProviderClass,
}

/// A cluster whose class has the libvirt class's additionalRules
/// (examples/09-providerclass-libvirt.yaml).
async fn cluster() -> Cluster {
    cluster_with_rules(libvirt_class_rules().expect("the libvirt class's rules")).await
}

async fn cluster_with_rules(additional_rules: Vec<PolicyRule>) -> Cluster {
    let cp = ControlPlane::shared().await.expect("control plane");
    let client = cp.client().expect("client");
    let ns = cp.fresh_namespace().await.expect("namespace");
    let build_ns = cp.fresh_namespace().await.expect("build namespace");
    let classes: Api<ProviderClass> = Api::all(client.clone());
    let pc = ProviderClass::new(
        &format!("libvirt-{ns}"),
        ProviderClassSpec {
            image: "banlieue:test".into(),
            command: vec!["/usr/bin/banlieue".into()],
            args: vec![],
            machine_kind: Default::default(),
            additional_rules,
            import: ImportJobSettings {
                namespace: Some(build_ns.clone()),
                // The import Jobs run as the Provider's own account, the default.
                service_account_name: None,
                artifacts_claim_name: None,
            },
            pod: Default::default(),
        },
    );
    let class = classes
        .create(&PostParams::default(), &pc)
        .await
        .expect("providerclass");
    Cluster {
        cp,
        client,
        ns,
        build_ns,
        class,
    }
}

impl Cluster {
    /// A Provider whose status already advertises `pools` (the operator is not running here),
    /// and the client of its workload's ServiceAccount, with the grants the operator gives it.
    async fn provider(&self, endpoint: &str, pools: &[(&str, &str)]) -> kube::Client {
        self.provider_named(PROVIDER, endpoint, pools).await
    }

    async fn provider_named(
        &self,
        name: &str,
        endpoint: &str,
        pools: &[(&str, &str)],
    ) -> kube::Client {
        let providers: Api<Provider> = Api::namespaced(self.client.clone(), &self.ns);
        let p = Provider::new(
            name,
            ProviderSpec {
                provider_class_ref: LocalObjectReference::new(self.class.name_any()),
                connection: ProviderConnection {
                    endpoint: endpoint.into(),
                    credentials_ref: LocalObjectReference::new("libvirt-creds"),
                    ca_bundle: ValueOrSource {
                        config_map_ref: Some(KeySelector {
                            name: "libvirt-ca".into(),
                            key: "ca.crt".into(),
                        }),
                        ..ValueOrSource::default()
                    },
                },
                capabilities: Default::default(),
                attestation: None,
            },
        );
        providers
            .create(&PostParams::default(), &p)
            .await
            .expect("provider");
        let classes: Vec<_> = pools
            .iter()
            .map(|(name, pool)| json!({"name": name, "target": {"pool": pool}}))
            .collect();
        let status = json!({"status": {"failureDomains": [
            {"name": "127.0.0.1", "storageClasses": classes}
        ]}});
        let p = providers
            .patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
            .await
            .expect("provider status");
        provider_identity(self.cp, &p, &self.class)
            .await
            .expect("the provider's identity")
    }

    /// The client of the import Jobs' ServiceAccount (the Provider's own, in the build namespace),
    /// with the grants the operator gives it; after [`Cluster::provider`].
    async fn importer(&self) -> kube::Client {
        import_identity(self.cp, &self.read_provider().await, &self.class)
            .await
            .expect("the import identity")
    }

    /// [`PROVIDER`] as the API server has it.
    async fn read_provider(&self) -> Provider {
        Api::<Provider>::namespaced(self.client.clone(), &self.ns)
            .get(PROVIDER)
            .await
            .expect("provider")
    }

    /// The Secret and CA ConfigMap of a Provider pointing at `d`.
    async fn credentials(&self, d: &Libvirtd) {
        let read = |p: PathBuf| std::fs::read(p).expect("pki file");
        let secrets: Api<Secret> = Api::namespaced(self.client.clone(), &self.ns);
        let secret = Secret {
            metadata: kube::api::ObjectMeta {
                name: Some("libvirt-creds".into()),
                ..Default::default()
            },
            data: Some(
                [
                    ("tls.crt".to_owned(), ByteString(read(d.client_cert_path()))),
                    ("tls.key".to_owned(), ByteString(read(d.client_key_path()))),
                ]
                .into(),
            ),
            ..Default::default()
        };
        secrets
            .create(&PostParams::default(), &secret)
            .await
            .expect("secret");
        let maps: Api<ConfigMap> = Api::namespaced(self.client.clone(), &self.ns);
        let ca = String::from_utf8(read(d.ca_cert_path())).expect("ca pem");
        let map = ConfigMap {
            metadata: kube::api::ObjectMeta {
                name: Some("libvirt-ca".into()),
                ..Default::default()
            },
            data: Some([("ca.crt".to_owned(), ca)].into()),
            ..Default::default()
        };
        maps.create(&PostParams::default(), &map)
            .await
            .expect("configmap");
    }

    async fn image(&self, name: &str, source: ImageSource) -> VMImage {
        let images: Api<VMImage> = Api::namespaced(self.client.clone(), &self.ns);
        let image = VMImage::new(
            name,
            VMImageSpec {
                install_mode: InstallMode::Immediate,
                revision: None,
                disk_size: None,
                sources: vec![source],
            },
        );
        images
            .create(&PostParams::default(), &image)
            .await
            .expect("vmimage")
    }

    fn url_source(&self) -> ImageSource {
        ImageSource {
            provider_class: self.class.name_any(),
            kind: ImageSourceKind::Url,
            url: Some("oci://registry.invalid/kairos:2404".into()),
            volume: None,
            template: None,
            pull_secret_name: None,
            ca_config_map_name: None,
            plain_http: false,
            token_realm_hosts: Vec::new(),
        }
    }

    async fn get_image(&self, name: &str) -> VMImage {
        Api::<VMImage>::namespaced(self.client.clone(), &self.ns)
            .get(name)
            .await
            .expect("get vmimage")
    }

    /// The image reconciler of [`PROVIDER`], run as `provider`, its workload's client.
    fn reconciler(&self, provider: &kube::Client) -> ImageReconciler {
        ImageReconciler::new(
            provider.clone(),
            ImageReconcilerConfig::new(PROVIDER, &self.ns),
        )
    }

    async fn jobs(&self) -> Vec<Job> {
        Api::<Job>::namespaced(self.client.clone(), &self.build_ns)
            .list(&ListParams::default().labels(&format!("banlieue.io/vmimage={IMAGE}")))
            .await
            .expect("list jobs")
            .items
    }
}

/// A libvirtd with a started `dir` pool named `pool`; returns the pool's directory.
async fn libvirtd_with_pool(pool: &str) -> Option<(Libvirtd, PathBuf)> {
    if !Libvirtd::available().expect("libvirtd") {
        return None;
    }
    let d = Libvirtd::start(LibvirtdOptions::default())
        .await
        .expect("libvirtd");
    let dir = d.create_pool_dir(pool).expect("pool dir");
    let target = dir.display().to_string();
    d.virsh(["pool-define-as", pool, "dir", "--target", &target])
        .await
        .expect("pool-define-as");
    d.virsh(["pool-start", pool]).await.expect("pool-start");
    Some((d, dir))
}

/// Writes a file of `layout` (data or hole, MiB each) with deterministic pseudo-random data;
/// returns its SHA-256.
fn write_source(path: &Path, layout: &[(bool, u64)]) -> String {
    let mut file = std::fs::File::create(path).expect("create source");
    let mut hasher = Sha256::new();
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut buf = vec![0u8; MIB as usize];
    let zeros = vec![0u8; MIB as usize];
    let mut len = 0;
    for &(data, mib) in layout {
        for _ in 0..mib {
            if data {
                for chunk in buf.chunks_mut(8) {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    chunk.copy_from_slice(&state.to_le_bytes());
                }
                file.write_all(&buf).expect("write source");
                hasher.update(&buf);
            } else {
                file.seek(SeekFrom::Current(MIB as i64)).expect("seek");
                hasher.update(&zeros);
            }
            len += MIB;
        }
    }
    file.set_len(len).expect("set_len");
    hex(&hasher.finalize())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn sha256_file(path: &Path) -> String {
    let mut file = std::fs::File::open(path).expect("open");
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; MIB as usize];
    loop {
        let n = file.read(&mut buf).expect("read");
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    hex(&hasher.finalize())
}

/// The volume's bytes as the independent `virsh` client downloads them, hashed.
async fn downloaded_sha256(d: &Libvirtd, pool: &str, volume: &str) -> String {
    let out = d.dir().join(format!("{volume}.download"));
    let path = out.display().to_string();
    d.virsh(["vol-download", "--pool", pool, volume, &path])
        .await
        .expect("vol-download");
    let sum = sha256_file(&out);
    std::fs::remove_file(&out).expect("remove download");
    sum
}

async fn volume_exists(d: &Libvirtd, pool: &str, volume: &str) -> bool {
    d.virsh(["vol-list", pool])
        .await
        .expect("vol-list")
        .lines()
        .any(|l| l.split_whitespace().next() == Some(volume))
}

/// A Job as the test pins it: every field the provider sets, nothing the API server or the
/// Job controller adds, namespaces replaced by placeholders.
fn pinned(job: &Job, c: &Cluster) -> serde_json::Value {
    let spec = job.spec.as_ref().expect("job spec");
    let pod = spec.template.spec.as_ref().expect("pod spec");
    let ours = |labels: Option<&std::collections::BTreeMap<String, String>>| {
        labels
            .into_iter()
            .flatten()
            .filter(|(k, _)| k.starts_with("banlieue.io/") || k.starts_with("app.kubernetes.io/"))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect::<std::collections::BTreeMap<_, _>>()
    };
    // The name ends in a hash of the namespaces, which are fresh in each run.
    let name = job.metadata.name.as_deref().unwrap_or_default();
    let (prefix, hash) = name.rsplit_once('-').unwrap_or((name, ""));
    assert!(
        hash.len() == 10 && hash.bytes().all(|b| b.is_ascii_hexdigit()),
        "{name}"
    );
    let text = serde_json::to_string(&json!({
        "name": format!("{prefix}-[hash]"),
        "namespace": job.metadata.namespace,
        "labels": job.metadata.labels,
        "backoffLimit": spec.backoff_limit,
        "activeDeadlineSeconds": spec.active_deadline_seconds,
        "securityContext": pod.security_context,
        "podLabels": ours(spec.template.metadata.as_ref().and_then(|m| m.labels.as_ref())),
        "restartPolicy": pod.restart_policy,
        // The test's build namespace has no artifacts claim the provider could read: placed as
        // for ReadWriteOnce, with the other pods on the volume.
        "affinity": pod.affinity,
        // The Provider's own import account, whose name ends in a hash of its namespace.
        "serviceAccountName": pod.service_account_name.as_deref().map(|a| {
            let own = banlieue_operator::workloads::import_account_name(&c.ns, PROVIDER);
            if a == own {
                "[the provider's own import account]".to_owned()
            } else {
                a.to_owned()
            }
        }),
        "containers": pod.containers.iter().map(|c| json!({
            "name": c.name,
            "image": c.image,
            "command": c.command,
            "args": c.args,
            "resources": c.resources,
            "securityContext": c.security_context,
            "volumeMounts": c.volume_mounts,
        })).collect::<Vec<_>>(),
        "volumes": pod.volumes,
    }))
    .expect("json");
    // The revision hashes the source, whose class is named after the fresh namespace, and the
    // volume's id hashes that namespace too: `<image>-<revision>-<id>.raw`.
    let args = pod.containers[0].args.clone().unwrap_or_default();
    let arg = |name: &str| {
        args.iter()
            .skip_while(|a| *a != name)
            .nth(1)
            .cloned()
            .unwrap_or_else(|| panic!("{name}"))
    };
    let revision = arg("--revision");
    let volume = arg("--volume");
    let id = volume
        .strip_suffix(".raw")
        .and_then(|v| v.rsplit_once('-'))
        .map(|(_, id)| id.to_owned())
        .expect("a volume id");
    let text = text
        .replace(&format!("-{id}.raw"), "-[id].raw")
        .replace(revision.as_str(), "[revision]")
        .replace(&c.build_ns, "[build-namespace]")
        .replace(&c.ns, "[provider-namespace]");
    serde_json::from_str(&text).expect("json")
}

#[tokio::test]
async fn url_image_waits_for_its_build_then_gets_one_adopted_job_per_pool() {
    let c = cluster().await;
    let edge = c
        .provider(
            "qemu+tls://127.0.0.1:1/system",
            &[
                ("gold", "nvme-pool"),
                ("standard", "default"),
                ("fast", "nvme-pool"),
            ],
        )
        .await;
    c.image(IMAGE, c.url_source()).await;
    // Another provider's entry, which this provider must never touch (written as admin, as
    // that other provider would).
    let other = ProviderImageStatus {
        provider: "someone-else".into(),
        zones: vec![ZoneImageStatus {
            pool: "p".into(),
            phase: ZonePhase::Importing,
            volume: Some("x.raw".into()),
            message: None,
        }],
    };
    let images: Api<VMImage> = Api::namespaced(c.client.clone(), &c.ns);
    images
        .patch_status(
            IMAGE,
            &PatchParams::default(),
            &Patch::Merge(&json!({"status": {"perProvider": [other]}})),
        )
        .await
        .expect("other provider's status");

    let reconciler = c.reconciler(&edge);
    let image = c.get_image(IMAGE).await;
    let zones = reconciler
        .reconcile(&image)
        .await
        .expect("reconcile")
        .expect("ours");
    assert_eq!(
        zones
            .iter()
            .map(|z| (z.pool.as_str(), z.phase))
            .collect::<Vec<_>>(),
        vec![
            ("nvme-pool", ZonePhase::BuildPending),
            ("default", ZonePhase::BuildPending)
        ]
    );
    assert!(
        c.jobs().await.is_empty(),
        "no Job before the artifact is Ready"
    );

    images
        .patch_status(
            IMAGE,
            &PatchParams::default(),
            &Patch::Merge(&json!({"status": {"buildArtifact": BuildArtifact {
                kind: "cloudImage".into(),
                claim_name: None,
                path: Some("kairos-ubuntu-2404.raw".into()),
                size_bytes: None,
                sha256: None,
                phase: ArtifactPhase::Ready,
                ..Default::default()
            }}})),
        )
        .await
        .expect("artifact ready");
    // The import ServiceAccount the operator made is deleted by hand: the provider, which may
    // read ServiceAccounts in the build namespace, names it rather than leave Jobs Pending.
    let (_, account) = import_account(&c.read_provider().await, &c.class).expect("import account");
    Api::<ServiceAccount>::namespaced(c.client.clone(), &c.build_ns)
        .delete(&account, &Default::default())
        .await
        .expect("delete the import ServiceAccount");
    let image = c.get_image(IMAGE).await;
    let zones = reconciler
        .reconcile(&image)
        .await
        .expect("reconcile")
        .expect("ours");
    let volume = decide::url_volume_name(&image);
    for zone in &zones {
        assert_eq!(zone.phase, ZonePhase::Importing);
        assert_eq!(zone.volume.as_deref(), Some(volume.as_str()));
        // The importer's ServiceAccount does not exist in the build namespace.
        let message = zone.message.as_deref().unwrap_or_default();
        assert!(
            message.contains(&format!("ServiceAccount {account} not found")),
            "{message}"
        );
    }
    let mut jobs = c.jobs().await;
    jobs.sort_by_key(|j| j.name_any());
    let pinned_jobs: Vec<_> = jobs.iter().map(|j| pinned(j, &c)).collect();
    insta::assert_snapshot!(
        "import_jobs_two_pools",
        serde_json::to_string_pretty(&pinned_jobs).expect("json")
    );
    let uids: Vec<_> = jobs.iter().map(|j| j.uid()).collect();

    // A second reconcile adopts: same Jobs, none added.
    reconciler.reconcile(&image).await.expect("reconcile again");
    let mut again = c.jobs().await;
    again.sort_by_key(|j| j.name_any());
    assert_eq!(again.iter().map(|j| j.uid()).collect::<Vec<_>>(), uids);

    let status = c.get_image(IMAGE).await.status.expect("status");
    assert_eq!(status.per_provider.len(), 2);
    assert_eq!(
        status.per_provider[0], other,
        "another provider's entry was changed"
    );
    assert_eq!(status.per_provider[1].provider, PROVIDER);
    assert_eq!(status.per_provider[1].zones, zones);
    assert_eq!(status.revision, Some(decide::revision(&image)));
    assert_eq!(status.phase, Some(banlieue_api::ImagePhase::Importing));
}

#[tokio::test]
async fn a_403_on_jobs_fails_the_zones_with_the_additional_rules_hint() {
    // A class without additionalRules: the operator binds no class role, so the provider has
    // no grant on jobs.
    let c = cluster_with_rules(vec![]).await;
    let client = c
        .provider("qemu+tls://127.0.0.1:1/system", &[("gold", "nvme-pool")])
        .await;
    c.image(IMAGE, c.url_source()).await;
    Api::<VMImage>::namespaced(c.client.clone(), &c.ns)
        .patch_status(
            IMAGE,
            &PatchParams::default(),
            &Patch::Merge(&json!({"status": {"buildArtifact": {
                "kind": "cloudImage", "path": "k.raw", "phase": "Ready"
            }}})),
        )
        .await
        .expect("artifact ready");
    let reconciler = c.reconciler(&client);
    let zones = wait_for(
        "a reconcile as the provider",
        Duration::from_secs(30),
        || async {
            Ok(reconciler
                .reconcile(&c.get_image(IMAGE).await)
                .await
                .ok()
                .flatten())
        },
    )
    .await
    .expect("reconcile as the provider");
    assert_eq!(zones.len(), 1);
    assert_eq!(zones[0].phase, ZonePhase::Failed);
    let message = zones[0].message.as_deref().unwrap_or_default();
    assert!(message.contains("403 on jobs"), "{message}");
    assert!(message.contains("additionalRules"), "{message}");
    assert!(
        message.contains("examples/09-providerclass-libvirt.yaml"),
        "{message}"
    );
    assert!(c.jobs().await.is_empty());
    let status = c.get_image(IMAGE).await.status.expect("status");
    assert_eq!(status.per_provider[0].zones, zones);
    assert_eq!(status.phase, Some(banlieue_api::ImagePhase::Failed));
}

#[tokio::test]
async fn the_reconciler_loop_creates_the_jobs_and_stops_on_shutdown() {
    let c = cluster().await;
    let edge = c
        .provider(
            "qemu+tls://127.0.0.1:1/system",
            &[("gold", "nvme-pool"), ("standard", "default")],
        )
        .await;
    c.image(IMAGE, c.url_source()).await;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(run_image_reconciler(
        edge,
        ImageReconcilerConfig::new(PROVIDER, &c.ns),
        async move {
            let _ = stopped.await;
        },
    ));
    let pending = wait_for("BuildPending zones", Duration::from_secs(60), || async {
        let status = c.get_image(IMAGE).await.status.unwrap_or_default();
        Ok(status
            .per_provider
            .into_iter()
            .find(|p| p.provider == PROVIDER)
            .filter(|p| p.zones.len() == 2))
    })
    .await
    .expect("zones");
    assert!(
        pending
            .zones
            .iter()
            .all(|z| z.phase == ZonePhase::BuildPending)
    );
    assert!(c.jobs().await.is_empty());

    // The artifact becoming Ready is a VMImage change: the loop reacts without a resync.
    Api::<VMImage>::namespaced(c.client.clone(), &c.ns)
        .patch_status(
            IMAGE,
            &PatchParams::default(),
            &Patch::Merge(&json!({"status": {"buildArtifact": {
                "kind": "cloudImage", "path": "k.raw", "phase": "Ready"
            }}})),
        )
        .await
        .expect("artifact ready");
    wait_for("two import Jobs", Duration::from_secs(60), || async {
        Ok((c.jobs().await.len() == 2).then_some(()))
    })
    .await
    .expect("jobs");
    wait_for("Importing zones", Duration::from_secs(60), || async {
        let status = c.get_image(IMAGE).await.status.unwrap_or_default();
        Ok((status.phase == Some(banlieue_api::ImagePhase::Importing)).then_some(()))
    })
    .await
    .expect("importing");
    stop.send(()).expect("stop");
    tokio::time::timeout(Duration::from_secs(30), running)
        .await
        .expect("the loop stops on shutdown")
        .expect("join")
        .expect("the loop ends cleanly");
    assert_eq!(c.jobs().await.len(), 2, "never more than one Job per pool");
}

#[tokio::test]
async fn two_providers_writing_one_image_at_once_keep_both_entries() {
    let c = cluster().await;
    let edge_7 = c
        .provider("qemu+tls://127.0.0.1:1/system", &[("gold", "a")])
        .await;
    let edge_8 = c
        .provider_named("edge-8", "qemu+tls://127.0.0.1:2/system", &[("gold", "b")])
        .await;
    c.image(IMAGE, c.url_source()).await;
    let first = c.reconciler(&edge_7);
    let second = ImageReconciler::new(edge_8, ImageReconcilerConfig::new("edge-8", &c.ns));
    // Interleaved read-modify-writes of one status: without the resourceVersion
    // compare-and-swap, a lost update would drop one provider's entry.
    for round in 0..5 {
        let image = c.get_image(IMAGE).await;
        let (a, b) = tokio::join!(first.reconcile(&image), second.reconcile(&image));
        a.expect("first provider");
        b.expect("second provider");
        let status = c.get_image(IMAGE).await.status.expect("status");
        let mut providers: Vec<_> = status
            .per_provider
            .iter()
            .map(|p| (p.provider.as_str(), p.zones[0].pool.as_str()))
            .collect();
        providers.sort();
        assert_eq!(
            providers,
            vec![("edge-7", "a"), ("edge-8", "b")],
            "round {round}"
        );
    }
}

/// A BackingFile is Ready only when it names a volume the Provider declared and that volume is
/// in the pool; a machine's own disk or seed never, whatever the declaration says. The hostile
/// rows are VMImages written by bob, who may write VMImages in the namespace and nothing else.
#[tokio::test]
async fn backing_file_is_ready_only_when_declared_and_in_the_pool() {
    let Some((d, _dir)) = libvirtd_with_pool("images").await else {
        return;
    };
    d.virsh([
        "vol-create-as",
        "images",
        "base.qcow2",
        "1M",
        "--format",
        "qcow2",
    ])
    .await
    .expect("vol-create-as");
    let c = cluster().await;
    c.credentials(&d).await;
    let edge = c.provider(&d.tls_uri(), &[("standard", "images")]).await;
    // The administrator declares the image volumes; `*` would not admit a machine's volumes.
    let declared = json!({"spec": {"capabilities": {
        "backingFileVolumes": ["base.qcow2", "missing.qcow2", "*"]}}});
    Api::<Provider>::namespaced(c.client.clone(), &c.ns)
        .patch(PROVIDER, &PatchParams::default(), &Patch::Merge(&declared))
        .await
        .expect("declare the volumes");
    let backing = |volume: &str| ImageSource {
        provider_class: c.class.name_any(),
        kind: ImageSourceKind::BackingFile,
        url: None,
        volume: Some(volume.into()),
        template: None,
        pull_secret_name: None,
        ca_config_map_name: None,
        plain_http: false,
        token_realm_hosts: Vec::new(),
    };
    c.image("present", backing("base.qcow2")).await;
    c.image("absent", backing("missing.qcow2")).await;
    let reconciler = c.reconciler(&edge);

    let zones = reconciler
        .reconcile(&c.get_image("present").await)
        .await
        .expect("reconcile")
        .expect("ours");
    assert_eq!(zones.len(), 1);
    assert_eq!(
        (zones[0].phase, zones[0].message.as_deref()),
        (ZonePhase::Ready, None)
    );
    let status = c.get_image("present").await.status.expect("status");
    assert_eq!(status.phase, Some(banlieue_api::ImagePhase::Ready));

    let zones = reconciler
        .reconcile(&c.get_image("absent").await)
        .await
        .expect("reconcile")
        .expect("ours");
    assert_eq!(zones[0].phase, ZonePhase::Failed);
    let message = zones[0].message.as_deref().unwrap_or_default();
    assert!(
        message.contains("volume missing.qcow2 is not in pool images"),
        "{message}"
    );
    let status = c.get_image("absent").await.status.expect("status");
    assert_ne!(status.phase, Some(banlieue_api::ImagePhase::Ready));
    assert!(c.jobs().await.is_empty(), "a BackingFile never gets a Job");

    // bob's images naming a victim machine's seed and OS disk: present in the pool, matched by
    // the declared `*`, and refused.
    let victim = format!("{}-victim", c.ns);
    let bob =
        c.cp.tenant_writing(&c.ns, "bob", "vmimages")
            .await
            .expect("bob");
    let as_bob: Api<VMImage> = Api::namespaced(bob, &c.ns);
    for (name, volume) in [
        ("seed", format!("{victim}-cidata.iso")),
        ("osdisk", format!("{victim}-os.qcow2")),
    ] {
        d.virsh(["vol-create-as", "images", &volume, "1M", "--format", "raw"])
            .await
            .expect("the victim's volume");
        let mut image = VMImage::new(
            name,
            VMImageSpec {
                install_mode: InstallMode::Immediate,
                revision: None,
                disk_size: None,
                sources: vec![backing(&volume)],
            },
        );
        image.metadata.namespace = Some(c.ns.clone());
        as_bob
            .create(&PostParams::default(), &image)
            .await
            .expect("bob's image");
        let zones = reconciler
            .reconcile(&c.get_image(name).await)
            .await
            .expect("reconcile")
            .expect("ours");
        assert_eq!(zones[0].phase, ZonePhase::Failed, "{name}");
        let message = zones[0].message.as_deref().unwrap_or_default();
        assert!(
            message.contains(&format!("volume {volume} is a machine's own disk or seed")),
            "{name}: {message}"
        );
    }

    // Without the declaration, a volume that is there is refused too.
    let undeclared = json!({"spec": {"capabilities": {"backingFileVolumes": ["missing.qcow2"]}}});
    Api::<Provider>::namespaced(c.client.clone(), &c.ns)
        .patch(
            PROVIDER,
            &PatchParams::default(),
            &Patch::Merge(&undeclared),
        )
        .await
        .expect("narrow the declaration");
    let zones = reconciler
        .reconcile(&c.get_image("present").await)
        .await
        .expect("reconcile")
        .expect("ours");
    assert_eq!(zones[0].phase, ZonePhase::Failed);
    let message = zones[0].message.as_deref().unwrap_or_default();
    assert!(
        message.contains("volume base.qcow2 is not declared for BackingFile sources on Provider"),
        "{message}"
    );
}

/// 256 MiB: data, hole, data, hole (the trailing hole only in the file's length).
const LAYOUT: &[(bool, u64)] = &[(true, 64), (false, 64), (true, 64), (false, 64)];

#[tokio::test]
async fn sparse_import_uploads_identical_bytes_and_a_rerun_is_a_no_op() {
    let Some((d, _dir)) = libvirtd_with_pool("images").await else {
        return;
    };
    let c = cluster().await;
    c.credentials(&d).await;
    c.provider(&d.tls_uri(), &[("standard", "images")]).await;
    c.image(IMAGE, c.url_source()).await;
    let importer = c.importer().await;
    let source = d.dir().join("source.raw");
    let sum = write_source(&source, LAYOUT);
    assert!(
        std::fs::metadata(&source).expect("source").blocks() * 512 < 256 * MIB,
        "the source must be sparse for this test"
    );
    let mut args = ImportArgs::new(IMAGE, PROVIDER, &c.ns, "images", &source);
    args.artifacts_root = d.dir().to_owned();
    let outcome = run_import(importer.clone(), args.clone())
        .await
        .expect("import");
    let ImportOutcome::Imported {
        volume,
        marker,
        transfer,
        ..
    } = outcome
    else {
        panic!("first import must upload: {outcome:?}");
    };
    assert_eq!(marker.sha256, sum);
    assert_eq!(marker.size_bytes, 256 * MIB);
    assert_eq!(transfer.data + transfer.holes, 256 * MIB);
    // Zero runs are found per stream packet, so a few KiB at packet edges go as data.
    assert!(
        transfer.holes > 120 * MIB,
        "holes travelled as data: {transfer:?}"
    );
    assert_eq!(downloaded_sha256(&d, "images", &volume).await, sum);

    let again = run_import(importer, args).await.expect("rerun");
    assert!(
        matches!(&again, ImportOutcome::AlreadyComplete { volume: v, .. } if *v == volume),
        "{again:?}"
    );
}

#[tokio::test]
async fn killed_import_is_redone_and_its_key_never_in_argv_or_environ() {
    let Some((d, dir)) = libvirtd_with_pool("images").await else {
        return;
    };
    let c = cluster().await;
    c.credentials(&d).await;
    c.provider(&d.tls_uri(), &[("standard", "images")]).await;
    let image = c.image(IMAGE, c.url_source()).await;
    let volume = decide::url_volume_name(&image);
    let source = d.dir().join("source.raw");
    let sum = write_source(&source, LAYOUT);
    // The importer runs as the import Jobs' ServiceAccount, like the Job's pod.
    let importer = c.importer().await;
    // Once the upload has written some data, the importer is frozen so that it cannot finish
    // before it is killed.
    let file = dir.join(&volume);
    let (mut child, pid) = import_child_mid_upload(&c, &d, &source, &file).await;
    signal(pid, "STOP");

    let key = std::fs::read_to_string(d.client_key_path()).expect("key");
    let key_body: String = key.lines().filter(|l| !l.starts_with("-----")).collect();
    for what in ["cmdline", "environ"] {
        let bytes = std::fs::read(format!("/proc/{pid}/{what}")).expect("read /proc");
        let text = String::from_utf8_lossy(&bytes);
        assert!(!text.contains("PRIVATE KEY"), "a key in /proc/{pid}/{what}");
        for line in key
            .lines()
            .filter(|l| l.len() > 16 && !l.starts_with("-----"))
        {
            assert!(!text.contains(line), "key material in /proc/{pid}/{what}");
        }
    }
    assert!(!key_body.is_empty());

    // libvirtd 11.3 deadlocks when a client's connection ends while stream data it already
    // received still waits for the volume file: `daemonStreamEvent` holds the client's lock
    // when the failed write closes the client, whose close hook takes that lock again. A frozen
    // importer sends nothing more, so once the file stops growing nothing is queued, and the
    // kill below is the pod's death, not that upstream race.
    let allocated = wait_until_written(&file).await;
    assert!(
        allocated < 128 * MIB,
        "killed too late: {allocated} bytes written"
    );
    signal(pid, "KILL");
    child.wait().await.expect("reap the import");

    assert!(
        volume_exists(&d, "images", &volume).await,
        "the half-written volume is left"
    );
    let record = marker::marker_volume_name(&volume);
    assert!(
        !volume_exists(&d, "images", &record).await,
        "a killed import must never leave a completion record"
    );

    // The Job's one retry: the half-written volume is not taken for complete.
    retry_imports_whole(&c, &d, importer, &source, &volume, &sum).await;
}

/// Chaos: libvirtd restarts in the middle of an upload. The importer (a child process, as the
/// Job's pod) is frozen mid-upload, the daemon stopped, the importer let go: it fails on the
/// lost connection and leaves no completion record. With the daemon started again on its old
/// state, the Job's retry imports the same bytes, and a rerun finds them complete.
#[tokio::test]
async fn an_import_across_a_libvirtd_restart_is_redone_whole() {
    let Some((mut d, dir)) = libvirtd_with_pool("images").await else {
        return;
    };
    let c = cluster().await;
    c.credentials(&d).await;
    c.provider(&d.tls_uri(), &[("standard", "images")]).await;
    let image = c.image(IMAGE, c.url_source()).await;
    let volume = decide::url_volume_name(&image);
    let source = d.dir().join("source.raw");
    let sum = write_source(&source, LAYOUT);
    let importer = c.importer().await;
    let (mut child, pid) = import_child_mid_upload(&c, &d, &source, &dir.join(&volume)).await;
    signal(pid, "STOP");
    d.stop();
    signal(pid, "CONT");
    let status = tokio::time::timeout(Duration::from_secs(120), child.wait())
        .await
        .expect("the import ends once its daemon is gone")
        .expect("reap the import");
    assert!(
        !status.success(),
        "an import whose daemon went away succeeded"
    );

    d.start_again().await.expect("libvirtd starts again");
    let record = marker::marker_volume_name(&volume);
    assert!(
        !volume_exists(&d, "images", &record).await,
        "an interrupted import must never leave a completion record"
    );
    retry_imports_whole(&c, &d, importer, &source, &volume, &sum).await;
}

/// The Job's retry after an interrupted import of `source`: it imports again (the half-written
/// volume is not taken for complete) the bytes whose SHA-256 is `sum`, and a rerun finds them
/// complete.
async fn retry_imports_whole(
    c: &Cluster,
    d: &Libvirtd,
    importer: kube::Client,
    source: &Path,
    volume: &str,
    sum: &str,
) {
    let mut args = ImportArgs::new(IMAGE, PROVIDER, &c.ns, "images", source);
    args.artifacts_root = d.dir().to_owned();
    let outcome = run_import(importer.clone(), args.clone())
        .await
        .expect("retry");
    assert!(
        matches!(outcome, ImportOutcome::Imported { .. }),
        "{outcome:?}"
    );
    assert_eq!(downloaded_sha256(d, "images", volume).await, sum);
    let again = run_import(importer, args).await.expect("rerun");
    assert!(
        matches!(again, ImportOutcome::AlreadyComplete { .. }),
        "{again:?}"
    );
}

/// Runs the import of `source` as a child process (the Job's pod) as the import Jobs'
/// ServiceAccount, and returns once it has written data into `volume_file`: the child and its
/// PID.
async fn import_child_mid_upload(
    c: &Cluster,
    d: &Libvirtd,
    source: &Path,
    volume_file: &Path,
) -> (tokio::process::Child, u32) {
    let (account_ns, account) =
        import_account(&c.read_provider().await, &c.class).expect("import account");
    let kubeconfig = d.dir().join("import.kubeconfig");
    c.cp.write_service_account_kubeconfig(&account_ns, &account, &kubeconfig)
        .await
        .expect("the import account's kubeconfig");
    let child = tokio::process::Command::new(import_example())
        .args(["--kubeconfig".as_ref(), kubeconfig.as_os_str()])
        .args([
            "--vmimage",
            IMAGE,
            "--provider",
            PROVIDER,
            "--provider-namespace",
        ])
        .arg(&c.ns)
        .args(["--pool", "images", "--source"])
        .arg(source)
        .arg("--artifacts-root")
        .arg(d.dir())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn the import example");
    let pid = child.id().expect("pid");
    wait_for("the upload to start", Duration::from_secs(60), || {
        let file = volume_file.to_owned();
        async move {
            Ok(std::fs::metadata(&file)
                .ok()
                .filter(|m| m.blocks() > 0)
                .map(|_| ()))
        }
    })
    .await
    .expect("upload started");
    (child, pid)
}

/// Waits until libvirtd has written out what a frozen importer sent: `file`'s allocation
/// unchanged over a second. Returns the bytes allocated.
async fn wait_until_written(file: &Path) -> u64 {
    let allocated = || std::fs::metadata(file).expect("volume file").blocks() * 512;
    let mut last = allocated();
    for _ in 0..60 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let now = allocated();
        if now == last {
            return now;
        }
        last = now;
    }
    panic!(
        "{} still grows after 60 s with its importer frozen",
        file.display()
    );
}

/// Sends a signal to one process we started, by its PID.
fn signal(pid: u32, name: &str) {
    let status = std::process::Command::new("kill")
        .args([format!("-{name}"), pid.to_string()])
        .status()
        .expect("kill");
    assert!(status.success(), "kill -{name} {pid}");
}

/// `examples/import.rs`, which `cargo test` builds next to the test binaries.
fn import_example() -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    let path = exe
        .parent()
        .and_then(Path::parent)
        .expect("target dir")
        .join("examples/import");
    assert!(
        path.is_file(),
        "{} is missing: cargo build -p banlieue-provider-libvirt --example import",
        path.display()
    );
    path
}

/// The error of an import that must be refused before it reaches the host.
async fn refused(importer: &kube::Client, args: ImportArgs) -> String {
    let e = run_import(importer.clone(), args)
        .await
        .expect_err("the import must be refused");
    banlieue_api::conditions::error_message(&e)
}

#[tokio::test]
async fn the_import_reads_only_a_regular_file_inside_its_root_for_the_jobs_revision() {
    let c = cluster().await;
    c.provider("qemu+tls://127.0.0.1:1/system", &[("standard", "images")])
        .await;
    let image = c.image(IMAGE, c.url_source()).await;
    let importer = c.importer().await;
    let revision = decide::revision(&image);
    let volume = decide::url_volume_name(&image);
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().join("artifacts");
    std::fs::create_dir(&root).expect("root");
    std::fs::write(root.join("a.raw"), vec![1u8; 4096]).expect("artifact");
    std::fs::write(dir.path().join("outside.raw"), vec![2u8; 4096]).expect("outside");
    std::os::unix::fs::symlink(root.join("a.raw"), root.join("link.raw")).expect("symlink");
    std::os::unix::fs::symlink(dir.path(), root.join("up")).expect("dir symlink");
    let args = |source: PathBuf| {
        let mut a = ImportArgs::new(IMAGE, PROVIDER, &c.ns, "images", source);
        a.artifacts_root = root.clone();
        a.volume = Some(volume.clone());
        a.revision = Some(revision.clone());
        a
    };

    // A symbolic link, even to a file inside the root, is not opened.
    let message = refused(&importer, args(root.join("link.raw"))).await;
    assert!(message.contains("it is a symbolic link"), "{message}");
    // Paths that lead out of the root, by `..` or through a linked directory.
    for source in [root.join("../outside.raw"), root.join("up/outside.raw")] {
        let message = refused(&importer, args(source)).await;
        assert!(
            message.contains("outside the artifacts directory"),
            "{message}"
        );
    }
    // Not a regular file.
    let message = refused(&importer, args(root.clone())).await;
    assert!(
        message.contains("not a non-empty regular file"),
        "{message}"
    );

    // A Job made for another revision or volume writes nothing.
    let mut stale = args(root.join("a.raw"));
    stale.revision = Some("r0000000000".into());
    let message = refused(&importer, stale).await;
    assert!(
        message.contains(&format!(
            "the import was made for revision r0000000000 but vmimage {IMAGE} now says {revision}"
        )),
        "{message}"
    );
    let mut other = args(root.join("a.raw"));
    other.volume = Some("other.raw".into());
    let message = refused(&importer, other).await;
    assert!(message.contains("made for volume other.raw"), "{message}");

    // The good path gets past every check, to the Provider's credentials (absent here).
    let message = refused(&importer, args(root.join("a.raw"))).await;
    assert!(
        !message.contains("refused") && !message.contains("made for"),
        "{message}"
    );
}

#[tokio::test]
async fn a_complete_volume_is_never_replaced_by_another_artifact() {
    let Some((d, _dir)) = libvirtd_with_pool("images").await else {
        return;
    };
    let c = cluster().await;
    c.credentials(&d).await;
    c.provider(&d.tls_uri(), &[("standard", "images")]).await;
    c.image(IMAGE, c.url_source()).await;
    let source = d.dir().join("source.raw");
    let sum = write_source(&source, &[(true, 4)]);
    let importer = c.importer().await;
    let mut args = ImportArgs::new(IMAGE, PROVIDER, &c.ns, "images", &source);
    args.artifacts_root = d.dir().to_owned();
    let ImportOutcome::Imported { volume, .. } = run_import(importer.clone(), args.clone())
        .await
        .expect("import")
    else {
        panic!("the first import uploads");
    };
    let record = marker::marker_volume_name(&volume);

    // The same revision rebuilt: same size, other bytes. Machines may back onto the volume,
    // so it stays as it is and the import fails, saying why.
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .open(&source)
        .expect("open source");
    file.write_all(b"rebuilt").expect("rewrite");
    drop(file);
    let e = run_import(importer.clone(), args.clone())
        .await
        .expect_err("another artifact under a complete volume");
    let message = banlieue_api::conditions::error_message(&e);
    assert!(
        message.contains(&format!("volume {volume} is complete with SHA-256 {sum}"))
            && message.contains("needs a new revision"),
        "{message}"
    );
    // Another size: not taken for a half-written volume either.
    write_source(&source, &[(true, 5)]);
    let e = run_import(importer, args)
        .await
        .expect_err("another size under a complete volume");
    let message = banlieue_api::conditions::error_message(&e);
    assert!(
        message.contains(&format!(
            "volume {volume} is complete with {} bytes",
            4 * MIB
        )),
        "{message}"
    );
    assert!(volume_exists(&d, "images", &record).await);
    assert_eq!(downloaded_sha256(&d, "images", &volume).await, sum);
}

//! The import benchmark (not run by default; nothing is asserted on time): the import command
//! against `virsh vol-upload` of the same 1 GiB file, on the same TLS endpoint, in one run,
//! with the importer's peak RSS (VmHWM) sampled from /proc while it runs.
//!
//! ```text
//! cargo build --release -p banlieue-provider-libvirt --example import
//! cargo test --release -p banlieue-provider-libvirt --test import_bench -- --ignored --nocapture
//! ```

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use banlieue_api::{
    ImageSource, ImageSourceKind, ImportJobSettings, InstallMode, KeySelector,
    LocalObjectReference, Provider, ProviderClass, ProviderClassSpec, ProviderConnection,
    ProviderSpec, VMImage, VMImageSpec, ValueOrSource,
};
use banlieue_provider_libvirt::image::decide;
use banlieue_provider_libvirt::image::marker;
use banlieue_testenv::control_plane::ControlPlane;
use banlieue_testenv::libvirtd::{Libvirtd, LibvirtdOptions};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::json;

const GIB: u64 = 1 << 30;
const ROUNDS: usize = 3;

#[tokio::test]
#[ignore = "benchmark: run with --release -- --ignored --nocapture"]
async fn import_against_virsh_vol_upload() {
    let d = Libvirtd::start(LibvirtdOptions::default())
        .await
        .expect("libvirtd");
    let dir = d.create_pool_dir("bench").expect("pool dir");
    let target = dir.display().to_string();
    d.virsh(["pool-define-as", "bench", "dir", "--target", &target])
        .await
        .expect("pool");
    d.virsh(["pool-start", "bench"]).await.expect("pool-start");
    let cp = ControlPlane::shared().await.expect("control plane");
    let client = cp.client().expect("client");
    let ns = cp.fresh_namespace().await.expect("namespace");
    let class = format!("libvirt-{ns}");
    setup_objects(&client, &ns, &class, &d).await;

    let source = d.dir().join("bench.raw");
    write_random(&source, GIB);
    let image = Api::<VMImage>::namespaced(client.clone(), &ns)
        .get("bench")
        .await
        .expect("image");
    let volume = decide::url_volume_name(&image);
    let kubeconfig = cp.kubeconfig("admin").expect("local control plane");
    let example = import_example();

    let mut virsh_times = Vec::new();
    let mut import_times = Vec::new();
    let mut peak_rss_kib = 0;
    for round in 0..ROUNDS {
        d.virsh([
            "vol-create-as",
            "bench",
            "virsh.raw",
            "1G",
            "--format",
            "raw",
        ])
        .await
        .expect("vol-create-as");
        let started = Instant::now();
        d.virsh([
            "vol-upload",
            "--pool",
            "bench",
            "virsh.raw",
            &source.display().to_string(),
        ])
        .await
        .expect("vol-upload");
        virsh_times.push(started.elapsed());
        d.virsh(["vol-delete", "--pool", "bench", "virsh.raw"])
            .await
            .expect("vol-delete");

        let started = Instant::now();
        let mut child = std::process::Command::new(&example)
            .args(["--kubeconfig".as_ref(), kubeconfig.as_os_str()])
            .args(["--vmimage", "bench", "--provider", "bench"])
            .args(["--provider-namespace", &ns, "--pool", "bench", "--source"])
            .arg(&source)
            .env("RUST_LOG", "warn")
            .spawn()
            .expect("spawn import");
        let status_path = format!("/proc/{}/status", child.id());
        let status = loop {
            if let Some(kib) = vm_hwm_kib(&status_path) {
                peak_rss_kib = peak_rss_kib.max(kib);
            }
            if let Some(status) = child.try_wait().expect("wait") {
                break status;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        import_times.push(started.elapsed());
        assert!(status.success(), "import failed");
        for name in [marker::marker_volume_name(&volume), volume.clone()] {
            d.virsh(["vol-delete", "--pool", "bench", &name])
                .await
                .expect("vol-delete");
        }
        println!(
            "round {round}: virsh vol-upload {:.3} s, import {:.3} s",
            virsh_times[round].as_secs_f64(),
            import_times[round].as_secs_f64()
        );
    }
    let median = |v: &mut Vec<Duration>| {
        v.sort();
        v[v.len() / 2]
    };
    let virsh = median(&mut virsh_times);
    let import = median(&mut import_times);
    let mib_s = |t: Duration| GIB as f64 / (1 << 20) as f64 / t.as_secs_f64();
    println!(
        "1 GiB, median of {ROUNDS}: virsh vol-upload {:.3} s ({:.0} MiB/s), import {:.3} s \
         ({:.0} MiB/s), throughput ratio import/virsh {:.2}x, importer peak RSS (VmHWM) {:.1} MiB",
        virsh.as_secs_f64(),
        mib_s(virsh),
        import.as_secs_f64(),
        mib_s(import),
        virsh.as_secs_f64() / import.as_secs_f64(),
        peak_rss_kib as f64 / 1024.0
    );
}

fn vm_hwm_kib(status_path: &str) -> Option<u64> {
    std::fs::read_to_string(status_path)
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

fn write_random(path: &Path, len: u64) {
    let mut file = std::io::BufWriter::new(std::fs::File::create(path).expect("create"));
    let mut state: u64 = 0x2545_f491_4f6c_dd1d;
    let mut buf = vec![0u8; 1 << 20];
    for _ in 0..len / buf.len() as u64 {
        for chunk in buf.chunks_mut(8) {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            chunk.copy_from_slice(&state.to_le_bytes());
        }
        file.write_all(&buf).expect("write");
    }
    file.flush().expect("flush");
}

async fn setup_objects(client: &kube::Client, ns: &str, class: &str, d: &Libvirtd) {
    let read = |p: PathBuf| std::fs::read(p).expect("pki");
    let pp = PostParams::default();
    Api::<ProviderClass>::all(client.clone())
        .create(
            &pp,
            &ProviderClass::new(
                class,
                ProviderClassSpec {
                    image: "banlieue:bench".into(),
                    command: vec![],
                    args: vec![],
                    machine_kind: Default::default(),
                    additional_rules: vec![],
                    import: ImportJobSettings::default(),
                    pod: Default::default(),
                },
            ),
        )
        .await
        .expect("class");
    let secret = Secret {
        metadata: kube::api::ObjectMeta {
            name: Some("creds".into()),
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
    Api::<Secret>::namespaced(client.clone(), ns)
        .create(&pp, &secret)
        .await
        .expect("secret");
    let map = ConfigMap {
        metadata: kube::api::ObjectMeta {
            name: Some("ca".into()),
            ..Default::default()
        },
        data: Some(
            [(
                "ca.crt".to_owned(),
                String::from_utf8(read(d.ca_cert_path())).expect("pem"),
            )]
            .into(),
        ),
        ..Default::default()
    };
    Api::<ConfigMap>::namespaced(client.clone(), ns)
        .create(&pp, &map)
        .await
        .expect("ca");
    let providers: Api<Provider> = Api::namespaced(client.clone(), ns);
    let provider = Provider::new(
        "bench",
        ProviderSpec {
            provider_class_ref: LocalObjectReference::new(class),
            connection: ProviderConnection {
                endpoint: d.tls_uri(),
                credentials_ref: LocalObjectReference::new("creds"),
                ca_bundle: ValueOrSource {
                    config_map_ref: Some(KeySelector {
                        name: "ca".into(),
                        key: "ca.crt".into(),
                    }),
                    ..ValueOrSource::default()
                },
            },
            capabilities: Default::default(),
            attestation: None,
        },
    );
    providers.create(&pp, &provider).await.expect("provider");
    providers
        .patch_status(
            "bench",
            &PatchParams::default(),
            &Patch::Merge(&json!({"status": {"failureDomains": [
                {"name": "127.0.0.1", "storageClasses": [
                    {"name": "standard", "target": {"pool": "bench"}}
                ]}
            ]}})),
        )
        .await
        .expect("provider status");
    let image = VMImage::new(
        "bench",
        VMImageSpec {
            install_mode: InstallMode::Immediate,
            revision: Some("bench".into()),
            disk_size: None,
            sources: vec![ImageSource {
                provider_class: class.into(),
                kind: ImageSourceKind::Url,
                url: Some("oci://registry.invalid/bench:1".into()),
                volume: None,
                template: None,
                pull_secret_name: None,
                ca_config_map_name: None,
                plain_http: false,
                token_realm_hosts: Vec::new(),
            }],
        },
    );
    Api::<VMImage>::namespaced(client.clone(), ns)
        .create(&pp, &image)
        .await
        .expect("image");
}

fn import_example() -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    let path = exe
        .parent()
        .and_then(Path::parent)
        .expect("target dir")
        .join("examples/import");
    assert!(
        path.is_file(),
        "{} is missing: cargo build --release -p banlieue-provider-libvirt --example import",
        path.display()
    );
    path
}

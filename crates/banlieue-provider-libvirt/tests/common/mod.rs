//! Shared by the tests against the real control plane and a real libvirtd: CRDs from the
//! types, a host with a dir pool and an isolated network, and Provider objects made from the
//! daemon's PKI files.
#![allow(dead_code)] // Each test binary uses its own subset.

use std::future::Future;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use banlieue_api::{
    LocalObjectReference, NetworkClassMapping, NetworkTarget, Provider, ProviderCapabilities,
    ProviderClass, ProviderClassSpec, ProviderConnection, ProviderSpec, StorageClassMapping,
    StorageTarget, ValueOrSource,
};
use banlieue_testenv::control_plane::ControlPlane;
use banlieue_testenv::libvirtd::{Libvirtd, LibvirtdOptions};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, Patch, PatchParams, PostParams};
use tokio::sync::OnceCell;

pub const FIELD_MANAGER: &str = "banlieue-provider-tests";

/// The shared control plane with the CRDs applied from `banlieue_api::crds()`.
pub async fn control_plane() -> &'static ControlPlane {
    static READY: OnceCell<&'static ControlPlane> = OnceCell::const_new();
    READY
        .get_or_init(|| async {
            let cp = ControlPlane::shared()
                .await
                .expect("start the control plane");
            install_crds(&cp.client().expect("admin client"))
                .await
                .expect("install CRDs");
            cp
        })
        .await
}

async fn install_crds(client: &kube::Client) -> Result<()> {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let params = PatchParams::apply(FIELD_MANAGER).force();
    for crd in banlieue_api::crds() {
        let name = crd.metadata.name.clone().context("CRDs are named")?;
        crds.patch(&name, &params, &Patch::Apply(&crd)).await?;
        eventually(&format!("CRD {name} Established"), 30, || {
            let crds = crds.clone();
            let name = name.clone();
            async move {
                let crd = crds.get(&name).await?;
                Ok(crd
                    .status
                    .and_then(|s| s.conditions)
                    .unwrap_or_default()
                    .iter()
                    .any(|c| c.type_ == "Established" && c.status == "True")
                    .then_some(()))
            }
        })
        .await?;
    }
    Ok(())
}

/// Polls `probe` every 200 ms until it yields a value; fails after `secs` with the last error.
pub async fn eventually<T, F, Fut>(what: &str, secs: u64, mut probe: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Option<T>>>,
{
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        let last = probe().await;
        match last {
            Ok(Some(v)) => return Ok(v),
            _ if Instant::now() < deadline => tokio::time::sleep(Duration::from_millis(200)).await,
            Ok(None) => bail!("timed out after {secs} s waiting for {what}"),
            Err(e) => bail!("timed out after {secs} s waiting for {what}; last error: {e:#}"),
        }
    }
}

/// Waits up to `secs` until `api` lists no object.
pub async fn none_left<K>(api: &kube::Api<K>, what: &str, secs: u64) -> Result<()>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    eventually(what, secs, || async {
        Ok(api
            .list(&Default::default())
            .await?
            .items
            .is_empty()
            .then_some(()))
    })
    .await
}

fn unique(prefix: &str) -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    format!(
        "{prefix}{}x{}",
        std::process::id() % 10_000,
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// Destroys the isolated network's bridge when the test ends, before the daemon stops:
/// libvirtd leaves a started network's bridge on the host when it exits.
pub struct NetworkGuard {
    uri: String,
    name: String,
}

impl Drop for NetworkGuard {
    fn drop(&mut self) {
        let _ = std::process::Command::new("virsh")
            .args(["-c", &self.uri, "net-destroy", &self.name])
            .output();
    }
}

/// A real libvirtd with a started dir pool and a started isolated network (a bridge with no
/// address, no DHCP and no DNS: nothing listens anywhere).
pub struct Host {
    // Declared first so it drops first, while the daemon still runs.
    network_guard: NetworkGuard,
    pub libvirtd: Libvirtd,
    pub pool: String,
    pub pool_dir: PathBuf,
    pub network: String,
}

impl Host {
    pub async fn start() -> Result<Host> {
        let libvirtd = Libvirtd::start(LibvirtdOptions::default()).await?;
        let pool = "banlieue-pool".to_owned();
        let pool_dir = libvirtd.create_pool_dir(&pool)?;
        libvirtd
            .virsh([
                "pool-define-as",
                &pool,
                "dir",
                "--target",
                &pool_dir.display().to_string(),
            ])
            .await?;
        libvirtd.virsh(["pool-start", &pool]).await?;
        let network = unique("bnl");
        let xml_path = libvirtd.dir().join(format!("{network}.xml"));
        std::fs::write(
            &xml_path,
            format!(
                "<network><name>{network}</name><bridge name='{network}' stp='off'/>\
                 <dns enable='no'/></network>"
            ),
        )?;
        libvirtd
            .virsh(["net-define", &xml_path.display().to_string()])
            .await?;
        libvirtd.virsh(["net-start", &network]).await?;
        Ok(Host {
            network_guard: NetworkGuard {
                uri: libvirtd.virsh_uri(),
                name: network.clone(),
            },
            libvirtd,
            pool,
            pool_dir,
            network,
        })
    }

    /// A raw volume of `bytes` zero bytes in the pool (a stand-in image: QEMU runs on it
    /// although nothing boots).
    pub async fn create_raw_volume(&self, name: &str, bytes: u64) -> Result<()> {
        self.libvirtd
            .virsh([
                "vol-create-as",
                &self.pool,
                name,
                &bytes.to_string(),
                "--format",
                "raw",
            ])
            .await?;
        Ok(())
    }

    pub async fn client(&self) -> Result<banlieue_libvirt::Client> {
        let identity = banlieue_libvirt::Identity::from_files(
            &self.libvirtd.client_cert_path(),
            &self.libvirtd.client_key_path(),
        )?;
        let ca = banlieue_libvirt::CaBundle::from_file(&self.libvirtd.ca_cert_path())?;
        Ok(banlieue_libvirt::Client::connect(&self.libvirtd.tls_uri(), &identity, &ca).await?)
    }

    /// The declaration a good Provider makes for this host.
    pub fn capabilities(&self) -> ProviderCapabilities {
        ProviderCapabilities {
            storage_classes: vec![StorageClassMapping {
                name: "standard".into(),
                target: StorageTarget {
                    pool: self.pool.clone(),
                },
            }],
            network_classes: vec![NetworkClassMapping {
                name: "isolated".into(),
                target: NetworkTarget {
                    network: self.network.clone(),
                },
            }],
            features: vec!["vtpm".into()],
        }
    }
}

/// A ProviderClass with a unique name (it is cluster-scoped and tests run in parallel).
pub async fn provider_class(kube: &kube::Client) -> Result<ProviderClass> {
    let class = ProviderClass::new(
        &unique("libvirt-"),
        ProviderClassSpec {
            image: "banlieue:test".into(),
            command: vec!["/usr/bin/banlieue".into()],
            args: vec![],
            machine_kind: Default::default(),
            additional_rules: vec![k8s_openapi::api::rbac::v1::PolicyRule {
                api_groups: Some(vec!["batch".into()]),
                resources: Some(vec!["jobs".into()]),
                verbs: vec!["create".into(), "get".into(), "list".into(), "watch".into()],
                ..Default::default()
            }],
            import: Default::default(),
            pod: Default::default(),
        },
    );
    Ok(Api::<ProviderClass>::all(kube.clone())
        .create(&PostParams::default(), &class)
        .await?)
}

/// The credentials Secret (`tls.crt`, `tls.key`) and CA ConfigMap (`ca.crt`) the guide's step
/// 2 creates, from the daemon's PKI files.
pub async fn credentials(kube: &kube::Client, ns: &str, host: &Host) -> Result<()> {
    let cert = std::fs::read(host.libvirtd.client_cert_path())?;
    let key = std::fs::read(host.libvirtd.client_key_path())?;
    let ca = std::fs::read_to_string(host.libvirtd.ca_cert_path())?;
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some("libvirt-creds".into()),
            ..Default::default()
        },
        data: Some(
            [
                ("tls.crt".to_owned(), ByteString(cert)),
                ("tls.key".to_owned(), ByteString(key)),
            ]
            .into(),
        ),
        type_: Some("kubernetes.io/tls".into()),
        ..Default::default()
    };
    Api::<Secret>::namespaced(kube.clone(), ns)
        .create(&PostParams::default(), &secret)
        .await?;
    let map = ConfigMap {
        metadata: ObjectMeta {
            name: Some("libvirt-ca".into()),
            ..Default::default()
        },
        data: Some([("ca.crt".to_owned(), ca)].into()),
        ..Default::default()
    };
    Api::<ConfigMap>::namespaced(kube.clone(), ns)
        .create(&PostParams::default(), &map)
        .await?;
    Ok(())
}

/// A Provider in `ns` for `endpoint`, using the objects [`credentials`] made.
pub fn provider(
    name: &str,
    class: &str,
    endpoint: &str,
    capabilities: ProviderCapabilities,
) -> Provider {
    Provider::new(
        name,
        ProviderSpec {
            provider_class_ref: LocalObjectReference::new(class),
            connection: ProviderConnection {
                endpoint: endpoint.to_owned(),
                credentials_ref: LocalObjectReference::new("libvirt-creds"),
                ca_bundle: ValueOrSource {
                    config_map_ref: Some(banlieue_api::KeySelector {
                        name: "libvirt-ca".into(),
                        key: "ca.crt".into(),
                    }),
                    ..Default::default()
                },
            },
            capabilities,
            attestation: None,
        },
    )
}

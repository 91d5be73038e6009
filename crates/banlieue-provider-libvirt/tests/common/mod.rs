//! Shared by the tests against the real control plane and a real libvirtd: CRDs from the
//! types, a host with a dir pool and an isolated network, Provider objects made from the
//! daemon's PKI files, and each role's production identity under the shipped RBAC (ADR-0063).
#![allow(dead_code)] // Each test binary uses its own subset.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use banlieue_api::{
    LibvirtMachine, LocalObjectReference, NetworkClassMapping, NetworkTarget, Provider,
    ProviderCapabilities, ProviderClass, ProviderClassSpec, ProviderConnection, ProviderSpec,
    StorageClassMapping, StorageTarget, ValueOrSource,
};
use banlieue_operator::workloads::{self, Workloads};
use banlieue_testenv::control_plane::ControlPlane;
use banlieue_testenv::libvirtd::{Libvirtd, LibvirtdOptions};
use banlieue_testenv::poll;
use k8s_openapi::ByteString;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, Secret, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::{Resource, ResourceExt};
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
    Ok(banlieue_testenv::control_plane::apply_crds(client, banlieue_api::crds()).await?)
}

/// Waits up to `secs` until `api` lists no object.
pub async fn none_left<K>(api: &kube::Api<K>, what: &str, secs: u64) -> Result<()>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    poll::until(what, Duration::from_secs(secs), || async {
        Ok(api
            .list(&Default::default())
            .await?
            .items
            .is_empty()
            .then_some(()))
    })
    .await?;
    Ok(())
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
            // The image volumes the tests make (or name to find them missing).
            backing_file_volumes: ["base.raw", "installer.iso", "missing.raw", "guest.qcow2"]
                .map(String::from)
                .to_vec(),
            memory_overcommit_percent: None,
            vsphere: None,
            resume_reserve: None,
            save_storage: None,
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

pub use banlieue_testenv::repo_path;

/// The controller's namespace and ServiceAccount, as deploy/ names them.
pub const CONTROLLER_NS: &str = "banlieue-system";
pub const CONTROLLER_SA: &str = "banlieue-controller";

/// Applies what `banlieue bootstrap` applies for access control, once per test binary:
/// deploy/namespace.yaml and every ClusterRole and binding of deploy/rbac/. Admin here is the
/// administrator installing banlieue, nothing the product does.
pub async fn shipped_rbac(cp: &ControlPlane) -> Result<()> {
    static APPLIED: OnceCell<()> = OnceCell::const_new();
    APPLIED
        .get_or_try_init(|| async {
            cp.apply_yaml(repo_path("deploy/namespace.yaml")).await?;
            for file in std::fs::read_dir(repo_path("deploy/rbac"))? {
                cp.apply_yaml(file?.path()).await?;
            }
            anyhow::Ok(())
        })
        .await?;
    Ok(())
}

/// The controller's identity (ADR-0063): the shipped RBAC, the controller's ServiceAccount,
/// and `ns` enabled for Providers the way an administrator does it (docs/security.md). Admin
/// here is the administrator installing banlieue. Returns the controller's own client, once the
/// authorizer has its grants.
pub async fn controller_identity(cp: &ControlPlane, ns: &str) -> Result<kube::Client> {
    shipped_rbac(cp).await?;
    let admin = cp.client()?;
    let accounts: Api<ServiceAccount> = Api::namespaced(admin.clone(), CONTROLLER_NS);
    if accounts.get_opt(CONTROLLER_SA).await?.is_none() {
        let sa = ServiceAccount {
            metadata: ObjectMeta {
                name: Some(CONTROLLER_SA.into()),
                ..Default::default()
            },
            ..Default::default()
        };
        match accounts.create(&PostParams::default(), &sa).await {
            // Another test of this binary created it meanwhile.
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            created => {
                created?;
            }
        }
    }
    let enable: RoleBinding = serde_json::from_value(serde_json::json!({
        "metadata": { "name": "banlieue-controller-workloads", "namespace": ns },
        "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                     "name": "banlieue-controller-workloads" },
        "subjects": [{ "kind": "ServiceAccount", "name": CONTROLLER_SA, "namespace": CONTROLLER_NS }]
    }))?;
    Api::<RoleBinding>::namespaced(admin, ns)
        .create(&PostParams::default(), &enable)
        .await?;
    let controller = cp
        .client_as_service_account(CONTROLLER_NS, CONTROLLER_SA)
        .await?;
    // The authorizer learns of new bindings through its informer: wait until it has.
    let deployments: Api<Deployment> = Api::namespaced(controller.clone(), ns);
    poll::until(
        "the controller's grants in the namespace",
        Duration::from_secs(30),
        || async { Ok(deployments.list(&Default::default()).await.ok().map(|_| ())) },
    )
    .await?;
    Ok(controller)
}

/// The additionalRules of the shipped libvirt ProviderClass
/// (examples/09-providerclass-libvirt.yaml): what every libvirt provider needs in the build
/// namespace.
pub fn libvirt_class_rules() -> Result<Vec<PolicyRule>> {
    let text = std::fs::read_to_string(repo_path("examples/09-providerclass-libvirt.yaml"))?;
    let class: ProviderClass = serde_saphyr::from_str(&text)?;
    Ok(class.spec.additional_rules)
}

/// The identity the operator gives `provider`'s workload in production (ADR-0012, ADR-0063):
/// the ServiceAccount, its own-Provider Role and the bindings that
/// [`workloads::build`] makes, bound to the ClusterRoles shipped in deploy/rbac/. Returns a
/// client authenticated as that ServiceAccount, once the authorizer has its grants.
/// `provider` and `class` must have been read back from the API server (they need their uids).
///
/// The operator's objects are applied as admin only because the test plays the operator's
/// part (tests/operator.rs runs the operator itself, as the controller's ServiceAccount); they
/// are exactly what it applies, less the Deployment: the test runs the workload in process.
pub async fn provider_identity(
    cp: &ControlPlane,
    provider: &Provider,
    class: &ProviderClass,
) -> Result<kube::Client> {
    shipped_rbac(cp).await?;
    let admin = cp.client()?;
    let w = workloads::build(
        provider,
        class,
        &banlieue_provider_libvirt::backend::descriptor().workload,
        &[],
    )
    .context("the Provider and class were read back")?;
    // Like the operator, the class's role is bound only for a class with additionalRules.
    let class_rules = !class.spec.additional_rules.is_empty();
    if class_rules {
        class_role(&admin, class).await?;
    }
    apply_operator_objects(&admin, class, &w, class_rules).await?;

    let ns = provider.namespace().context("a namespaced Provider")?;
    let name = provider.name_any();
    let client = cp
        .client_as_service_account(&ns, &workloads::workload_name(&name))
        .await?;
    let build_ns = w
        .class_binding
        .metadata
        .namespace
        .clone()
        .unwrap_or_default();
    let own: Api<Provider> = Api::namespaced(client.clone(), &ns);
    let machines: Api<LibvirtMachine> = Api::namespaced(client.clone(), &ns);
    let classes: Api<ProviderClass> = Api::all(client.clone());
    let jobs: Api<Job> = Api::namespaced(client.clone(), &build_ns);
    let one = ListParams::default().limit(1);
    // The authorizer learns of new bindings through its informer: wait until it has them all.
    poll::until("the provider's grants", Duration::from_secs(30), || async {
        let granted = own.get(&name).await.is_ok()
            && machines.list(&one).await.is_ok()
            && classes.list(&one).await.is_ok()
            && (!class_rules || jobs.list(&one).await.is_ok());
        Ok(granted.then_some(()))
    })
    .await?;
    Ok(client)
}

/// What the operator does when `provider`'s machines name the user-data Secrets `names`: its
/// Role grants them by name (the test creates the machines as the controller would, without
/// the operator running).
pub async fn grant_user_data(
    cp: &ControlPlane,
    provider: &Provider,
    class: &ProviderClass,
    names: &[&str],
) -> Result<()> {
    let names: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
    let w = workloads::build(
        provider,
        class,
        &banlieue_provider_libvirt::backend::descriptor().workload,
        &names,
    )
    .context("the Provider and class were read back")?;
    let role = &w.own_provider_role;
    let ns = role.metadata.namespace.clone().unwrap_or_default();
    apply(
        workloads::FIELD_MANAGER,
        Api::<Role>::namespaced(cp.client()?, &ns),
        role,
    )
    .await?;
    Ok(())
}

/// The identity of the import Jobs of `provider`'s class (ADR-0063): the class's import
/// ServiceAccount (the Provider's own in the build namespace unless the class names one),
/// which [`provider_identity`] created with the operator's RoleBinding to the shipped
/// ClusterRole `banlieue-import` in the Provider's namespace. Returns a client authenticated
/// as that account, once the authorizer has its grants.
pub async fn import_identity(
    cp: &ControlPlane,
    provider: &Provider,
    class: &ProviderClass,
) -> Result<kube::Client> {
    let (namespace, account) = import_account(provider, class)?;
    let client = cp.client_as_service_account(&namespace, &account).await?;
    let ns = provider.namespace().context("a namespaced Provider")?;
    let providers: Api<Provider> = Api::namespaced(client.clone(), &ns);
    poll::until(
        "the import account's grants",
        Duration::from_secs(30),
        || async { Ok(providers.get(&provider.name_any()).await.ok().map(|_| ())) },
    )
    .await?;
    Ok(client)
}

/// The namespace and name of the import ServiceAccount of `provider`'s class.
pub fn import_account(provider: &Provider, class: &ProviderClass) -> Result<(String, String)> {
    let w = workloads::build(
        provider,
        class,
        &banlieue_provider_libvirt::backend::descriptor().workload,
        &[],
    )
    .context("the Provider and class were read back")?;
    let meta = w.import_service_account.metadata;
    Ok((
        meta.namespace.context("a namespaced account")?,
        meta.name.context("a named account")?,
    ))
}

/// The ClusterRole `banlieue-provider-class-<class>` an administrator creates for each
/// ProviderClass with additionalRules (ADR-0063), holding the shipped libvirt class role's rules
/// (deploy/rbac/provider-class-libvirt-clusterrole.yaml). The class `libvirt` has the shipped
/// role itself; the tests' other classes are named uniquely, since each test has its own build
/// namespace, and get a copy under their own name, owned by the class so that it goes with it.
/// Fails, like the operator, when the role does not cover the class's additionalRules.
async fn class_role(admin: &kube::Client, class: &ProviderClass) -> Result<()> {
    let text = std::fs::read_to_string(repo_path(
        "deploy/rbac/provider-class-libvirt-clusterrole.yaml",
    ))?;
    let mut role: ClusterRole = serde_saphyr::from_str(&text)?;
    let uncovered = workloads::uncovered(
        &class.spec.additional_rules,
        role.rules.as_deref().unwrap_or_default(),
    );
    if !uncovered.is_empty() {
        bail!(
            "the shipped libvirt class role does not grant {uncovered:?} of ProviderClass {}",
            class.name_any()
        );
    }
    let name = workloads::class_role_name(&class.name_any());
    if role.metadata.name.as_deref() == Some(name.as_str()) {
        return Ok(());
    }
    role.metadata.name = Some(name);
    role.metadata.owner_references = class.controller_owner_ref(&()).map(|r| vec![r]);
    apply(FIELD_MANAGER, Api::all(admin.clone()), &role).await
}

/// Applies the operator's objects for one Provider as it does (operator::apply_workloads):
/// accounts and grants, under its field managers, less the Deployment.
async fn apply_operator_objects(
    admin: &kube::Client,
    class: &ProviderClass,
    w: &Workloads,
    class_binding: bool,
) -> Result<()> {
    use workloads::FIELD_MANAGER as OPERATOR;
    fn ns(meta: &ObjectMeta) -> String {
        meta.namespace.clone().unwrap_or_default()
    }
    let accounts = |meta: &ObjectMeta| Api::<ServiceAccount>::namespaced(admin.clone(), &ns(meta));
    let roles = |meta: &ObjectMeta| Api::<Role>::namespaced(admin.clone(), &ns(meta));
    let bindings = |meta: &ObjectMeta| Api::<RoleBinding>::namespaced(admin.clone(), &ns(meta));
    let sa = &w.service_account;
    apply(OPERATOR, accounts(&sa.metadata), sa).await?;
    for role in [&w.own_provider_role, &w.import_role] {
        apply(OPERATOR, roles(&role.metadata), role).await?;
    }
    for binding in [
        &w.own_provider_binding,
        &w.base_binding,
        &w.import_binding,
        &w.import_role_binding,
    ] {
        apply(OPERATOR, bindings(&binding.metadata), binding).await?;
    }
    let import = &w.import_service_account;
    let per_class = format!("{OPERATOR}/{}", class.name_any());
    apply(&per_class, accounts(&import.metadata), import).await?;
    // The operator's read-modify-write of the shared binding: tests of one binary make
    // grants side by side, so a write may lose the race (409) and read again.
    let crbs = Api::<ClusterRoleBinding>::all(admin.clone());
    loop {
        let mut shared = crbs.get(workloads::PROVIDERS_CLUSTER_BINDING).await?;
        let current = shared.subjects.clone().unwrap_or_default();
        let Some(subjects) = workloads::cluster_subjects(&current, &w.cluster_subject, true) else {
            break;
        };
        shared.subjects = Some(subjects);
        match crbs
            .replace(
                workloads::PROVIDERS_CLUSTER_BINDING,
                &PostParams::default(),
                &shared,
            )
            .await
        {
            Err(kube::Error::Api(s)) if s.code == 409 => continue,
            written => {
                written?;
                break;
            }
        }
    }
    if class_binding {
        let binding = &w.class_binding;
        apply(OPERATOR, bindings(&binding.metadata), binding).await?;
    }
    Ok(())
}

/// Server-side applies `object` under the field manager `manager`.
async fn apply<K>(manager: &str, api: Api<K>, object: &K) -> Result<()>
where
    K: Resource<DynamicType = ()>
        + Clone
        + serde::Serialize
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let name = object.meta().name.clone().context("a named object")?;
    api.patch(
        &name,
        &PatchParams::apply(manager).force(),
        &Patch::Apply(object),
    )
    .await?;
    Ok(())
}

/// The ProviderClass `libvirt` as the guide applies it (examples/09-providerclass-libvirt.yaml),
/// read back. Admin: the administrator's part.
pub async fn libvirt_class(cp: &ControlPlane) -> Result<ProviderClass> {
    cp.apply_yaml(repo_path("examples/09-providerclass-libvirt.yaml"))
        .await?;
    Ok(Api::<ProviderClass>::all(cp.client()?)
        .get("libvirt")
        .await?)
}

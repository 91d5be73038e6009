//! The vSphere provider against a real API server and a real vcsim (govmomi's simulator, its
//! inventory in docs/vsphere-client.md), run as its Provider's ServiceAccount under the
//! shipped RBAC: banlieue-provider-base and banlieue-provider-class-vsphere bound in the
//! Provider's namespace, plus the per-Provider Role the operator makes (ADR-0063, ADR-0069).

use std::time::Duration;

use anyhow::{Context as _, Result};
use banlieue_api::access::ClaimAccess;
use banlieue_api::conditions::{self, reasons, types};
use banlieue_api::vsphere::{
    EXTRA_CONFIG_MACHINE_UID, FINALIZER_VM_PROTECTION, GUESTINFO_ACCESS, GUESTINFO_ACCESS_STATE,
    GUESTINFO_SSH_HOST_KEYS,
};
use banlieue_api::{
    KeySelector, LocalObjectReference, Provider, ProviderCapabilities, ProviderConnection,
    ProviderSpec, Standby, StorageClassMapping, StorageTarget, VSphereCapabilities,
    VSphereDatacenter, VSphereMachine, VSphereMachineSpec, ValueOrSource,
};
use banlieue_provider_vsphere::machine::{ProviderConfig, run_provider};
use banlieue_provider_vsphere::provider_status::{StatusConfig, run_status};
use banlieue_testenv::control_plane::ControlPlane;
use banlieue_testenv::poll;
use banlieue_testenv::ssh_keys::ed25519_public_key;
use banlieue_testenv::vcsim::{Vcsim, VcsimOptions};
use banlieue_vsphere::{
    Client, CloneSpec, Credentials, ManagedObjectRef, PowerState, PropertyValue, ReconfigSpec,
};
use base64::Engine as _;
use k8s_openapi::api::core::v1::{ConfigMap, Secret, ServiceAccount};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;
use tokio::sync::OnceCell;
use tokio::task::JoinHandle;

const PROVIDER: &str = "vc";
const TASK_DEADLINE: Duration = Duration::from_secs(30);

use banlieue_testenv::repo_path;

/// The shared control plane with the CRDs from the types and the shipped RBAC, as
/// `banlieue bootstrap` applies it.
async fn control_plane() -> &'static ControlPlane {
    static READY: OnceCell<&'static ControlPlane> = OnceCell::const_new();
    READY
        .get_or_init(|| async {
            let cp = ControlPlane::shared().await.expect("control plane");
            let admin = cp.client().expect("admin");
            banlieue_testenv::control_plane::apply_crds(&admin, banlieue_api::crds())
                .await
                .expect("install the CRDs");
            cp.apply_yaml(repo_path("deploy/namespace.yaml"))
                .await
                .expect("namespace");
            for file in std::fs::read_dir(repo_path("deploy/rbac")).expect("deploy/rbac") {
                cp.apply_yaml(file.expect("entry").path())
                    .await
                    .expect("shipped RBAC");
            }
            cp
        })
        .await
}

/// vcsim, a fresh namespace with a Provider for it, and the provider's identity. The
/// workload's loops run as that identity once started, and stop when this is dropped.
struct Env {
    vcsim: Vcsim,
    ns: String,
    admin: kube::Client,
    provider_client: kube::Client,
    tasks: Vec<JoinHandle<()>>,
}

impl Drop for Env {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

async fn setup(declared: VSphereCapabilities, password: Option<&str>) -> Option<Env> {
    if !Vcsim::available().expect("vcsim") {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "vcsim is not built: scripts/control-plane build-vcsim"
        );
        eprintln!("SKIPPED: vcsim is not built (scripts/control-plane build-vcsim)");
        return None;
    }
    let vcsim = Vcsim::start(VcsimOptions::new()).await.expect("vcsim");
    make_template(&vcsim, TEMPLATE).await;
    let cp = control_plane().await;
    let admin = cp.client().expect("admin");
    let ns = cp.fresh_namespace().await.expect("namespace");
    let password = password.unwrap_or(vcsim.password()).to_owned();
    let secret: Secret = serde_json::from_value(json!({
        "metadata": { "name": "vc-creds" },
        "stringData": { "username": vcsim.username(), "password": password },
    }))
    .expect("secret");
    Api::<Secret>::namespaced(admin.clone(), &ns)
        .create(&PostParams::default(), &secret)
        .await
        .expect("create the credentials");
    let ca: ConfigMap = serde_json::from_value(json!({
        "metadata": { "name": "vc-ca" },
        "data": { "ca.crt": vcsim.ca_pem() },
    }))
    .expect("configmap");
    Api::<ConfigMap>::namespaced(admin.clone(), &ns)
        .create(&PostParams::default(), &ca)
        .await
        .expect("create the CA");
    let provider = Provider::new(
        PROVIDER,
        ProviderSpec {
            provider_class_ref: LocalObjectReference::new("vsphere"),
            connection: ProviderConnection {
                endpoint: vcsim.url().to_owned(),
                credentials_ref: LocalObjectReference::new("vc-creds"),
                ca_bundle: ValueOrSource {
                    config_map_ref: Some(KeySelector {
                        name: "vc-ca".into(),
                        key: "ca.crt".into(),
                    }),
                    ..Default::default()
                },
            },
            capabilities: ProviderCapabilities {
                storage_classes: vec![StorageClassMapping {
                    name: "standard".into(),
                    target: StorageTarget {
                        pool: "LocalDS_0".into(),
                    },
                }],
                vsphere: Some(declared),
                ..Default::default()
            },
            attestation: None,
        },
    );
    Api::<Provider>::namespaced(admin.clone(), &ns)
        .create(&PostParams::default(), &provider)
        .await
        .expect("create the Provider");
    let provider_client = identity(cp, &admin, &ns).await.expect("provider identity");
    Some(Env {
        vcsim,
        ns,
        admin,
        provider_client,
        tasks: Vec::new(),
    })
}

/// What the operator makes for a Provider's workload, bound to the shipped roles: the
/// ServiceAccount, the Role on its own Provider and connection, banlieue-provider-base and
/// banlieue-provider-class-vsphere in the Provider's namespace. Admin plays the operator.
async fn identity(cp: &ControlPlane, admin: &kube::Client, ns: &str) -> Result<kube::Client> {
    let account = format!("banlieue-provider-{PROVIDER}");
    let sa: ServiceAccount = serde_json::from_value(json!({ "metadata": { "name": account } }))?;
    Api::<ServiceAccount>::namespaced(admin.clone(), ns)
        .create(&PostParams::default(), &sa)
        .await?;
    let role: Role = serde_json::from_value(json!({
        "metadata": { "name": account },
        "rules": [
            { "apiGroups": ["banlieue.io"], "resources": ["providers"],
              "verbs": ["get", "list", "watch"], "resourceNames": [PROVIDER] },
            { "apiGroups": ["banlieue.io"], "resources": ["providers/status"],
              "verbs": ["patch"], "resourceNames": [PROVIDER] },
            // Its connection's Secret and ConfigMap, by name (no machine here names
            // user-data by reference).
            { "apiGroups": [""], "resources": ["secrets"], "verbs": ["get"],
              "resourceNames": ["vc-creds"] },
            { "apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"],
              "resourceNames": ["vc-ca"] },
        ],
    }))?;
    Api::<Role>::namespaced(admin.clone(), ns)
        .create(&PostParams::default(), &role)
        .await?;
    let bindings = Api::<RoleBinding>::namespaced(admin.clone(), ns);
    for (name, kind, role) in [
        (account.clone(), "Role", account.clone()),
        (
            format!("{account}-base"),
            "ClusterRole",
            "banlieue-provider-base".to_owned(),
        ),
        (
            format!("{account}-class"),
            "ClusterRole",
            "banlieue-provider-class-vsphere".to_owned(),
        ),
    ] {
        let binding: RoleBinding = serde_json::from_value(json!({
            "metadata": { "name": name },
            "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": role },
            "subjects": [{ "kind": "ServiceAccount", "name": account, "namespace": ns }],
        }))?;
        bindings.create(&PostParams::default(), &binding).await?;
    }
    let client = cp.client_as_service_account(ns, &account).await?;
    let own: Api<Provider> = Api::namespaced(client.clone(), ns);
    let machines: Api<VSphereMachine> = Api::namespaced(client.clone(), ns);
    let one = kube::api::ListParams::default().limit(1);
    poll::until("the provider's grants", Duration::from_secs(30), || async {
        Ok((own.get(PROVIDER).await.is_ok() && machines.list(&one).await.is_ok()).then_some(()))
    })
    .await?;
    Ok(client)
}

impl Env {
    fn start_status(&mut self) {
        let mut cfg = StatusConfig::new(PROVIDER, &self.ns);
        cfg.probe_interval = Duration::from_secs(1);
        let client = self.provider_client.clone();
        self.tasks.push(tokio::spawn(async move {
            run_status(client, cfg, std::future::pending())
                .await
                .expect("status loop");
        }));
    }

    fn start_images(&mut self) {
        let cfg = banlieue_provider_vsphere::image_status::ImageConfig::new(PROVIDER, &self.ns);
        let client = self.provider_client.clone();
        self.tasks.push(tokio::spawn(async move {
            banlieue_provider_vsphere::image_status::run_images(
                client,
                cfg,
                std::future::pending(),
            )
            .await
            .expect("image loop");
        }));
    }

    fn start_machines(&mut self) {
        let mut cfg = ProviderConfig::new(PROVIDER, &self.ns);
        cfg.task_timeout = TASK_DEADLINE;
        cfg.resync = Duration::from_secs(5);
        let client = self.provider_client.clone();
        self.tasks.push(tokio::spawn(async move {
            run_provider(client, cfg, std::future::pending())
                .await
                .expect("machine loop");
        }));
    }

    async fn vsphere(&self) -> Client {
        Client::connect(
            self.vcsim.url(),
            self.vcsim.ca_pem(),
            Credentials::new(self.vcsim.username(), self.vcsim.password()),
        )
        .await
        .expect("log in to vcsim")
    }

    fn machines(&self) -> Api<VSphereMachine> {
        Api::namespaced(self.admin.clone(), &self.ns)
    }

    async fn create_machine(&self, name: &str, user_data: Option<&str>) -> VSphereMachine {
        self.create_machine_with(name, user_data, false).await
    }

    async fn create_machine_with(
        &self,
        name: &str,
        user_data: Option<&str>,
        secure_boot: bool,
    ) -> VSphereMachine {
        self.create_machine_spec(name, |spec| {
            spec.user_data = user_data.map(str::to_owned);
            spec.secure_boot = secure_boot;
        })
        .await
    }

    /// A machine of the usual spec, changed by `edit`.
    async fn create_machine_spec(
        &self,
        name: &str,
        edit: impl FnOnce(&mut VSphereMachineSpec),
    ) -> VSphereMachine {
        let mut machine = VSphereMachine::new(
            name,
            VSphereMachineSpec {
                provider_ref: LocalObjectReference::new(PROVIDER),
                datacenter: "DC0".into(),
                cluster: "DC0_C1".into(),
                template: TEMPLATE.into(),
                folder: None,
                datastore: Some("LocalDS_0".into()),
                cpu: 2,
                memory: Quantity("1Gi".into()),
                user_data: None,
                user_data_secret_ref: None,
                tpm_enabled: false,
                secure_boot: false,
                standby: None,
                access: None,
                handover: None,
            },
        );
        edit(&mut machine.spec);
        self.machines()
            .create(&PostParams::default(), &machine)
            .await
            .expect("create the machine")
    }

    /// Waits until the machine's status satisfies `check`.
    async fn machine_until(
        &self,
        name: &str,
        what: &str,
        check: impl Fn(&VSphereMachine) -> bool,
    ) -> VSphereMachine {
        let api = self.machines();
        poll::until(what, Duration::from_secs(40), || async {
            let m = api.get(name).await?;
            Ok(check(&m).then_some(m))
        })
        .await
        .unwrap_or_else(|e| panic!("{e}"))
    }

    fn vm_name(&self, machine: &str) -> String {
        format!("{}-{machine}", self.ns)
    }

    /// `tenant` writes `name`, a copy of web-01 placed as `place` says, which the provider
    /// refuses as `PlacementNotDeclared` having cloned nothing; the answer is the refusal's
    /// message, and the machine is deleted.
    async fn placement_refused(
        &self,
        tenant: &kube::Client,
        name: &str,
        place: impl FnOnce(&mut VSphereMachineSpec),
    ) -> String {
        let mut machine = self.machines().get("web-01").await.expect("get");
        machine.metadata = kube::api::ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        };
        machine.status = None;
        machine.spec.user_data = None;
        place(&mut machine.spec);
        Api::<VSphereMachine>::namespaced(tenant.clone(), &self.ns)
            .create(&PostParams::default(), &machine)
            .await
            .expect("the tenant's machine");
        let refused = self
            .machine_until(name, "the machine refused", |m| {
                condition(m, types::READY).is_some_and(|c| {
                    c.reason == banlieue_api::vsphere::reasons::PLACEMENT_NOT_DECLARED
                })
            })
            .await;
        let message = condition(&refused, types::READY)
            .map(|c| c.message.clone())
            .unwrap_or_default();
        let vc = self.vsphere().await;
        assert_eq!(
            vc.vm_by_name(&self.vm_name(name)).await.expect("find"),
            None,
            "{name} was cloned"
        );
        let _ = vc.logout().await;
        self.machines()
            .delete(name, &Default::default())
            .await
            .expect("delete");
        message
    }
}

fn condition<'a>(m: &'a VSphereMachine, type_: &str) -> Option<&'a conditions::Condition> {
    m.status
        .as_ref()
        .and_then(|s| conditions::find(&s.contract.conditions, type_))
}

/// The VM folder every Provider here declares. vcsim has no such folder, so no machine here
/// is placed in it.
const SANDBOXES: &str = "banlieue/sandboxes";

/// The template every clone here starts from, and a VM beside it that is no template.
const TEMPLATE: &str = "DC0/vm/DC0_C0_RP0_VM0";
const NOT_A_TEMPLATE: &str = "DC0/vm/DC0_C1_RP0_VM0";

/// Makes the VM at `path` a template, as an administrator does: powered off, then marked.
async fn make_template(vcsim: &Vcsim, path: &str) {
    let client = Client::connect(
        vcsim.url(),
        vcsim.ca_pem(),
        Credentials::new(vcsim.username(), vcsim.password()),
    )
    .await
    .expect("log in to vcsim");
    let vm = client
        .find_by_inventory_path(path)
        .await
        .expect("find")
        .expect("the VM to make a template");
    wait(&client, client.power_off_vm(&vm).await.expect("power off")).await;
    client
        .mark_as_template(&vm)
        .await
        .expect("mark as template");
    assert!(client.is_template(&vm).await.expect("config.template"));
    let _ = client.logout().await;
}

async fn wait(client: &Client, task: ManagedObjectRef) -> Option<ManagedObjectRef> {
    tokio::time::timeout(TASK_DEADLINE, client.wait_task(&task))
        .await
        .expect("task within its deadline")
        .expect("task succeeded")
}

/// Sets `key` in the VM's extraConfig as a guest (or vcsim's guest stand-in) would.
async fn set_extra_config(client: &Client, vm: &ManagedObjectRef, key: &str, value: &str) {
    let spec = ReconfigSpec {
        extra_config: vec![(key.to_owned(), value.to_owned())],
        ..ReconfigSpec::default()
    };
    wait(
        client,
        client.reconfigure_vm(vm, &spec).await.expect("reconfigure"),
    )
    .await;
}

fn declared(datacenters: &[(&str, &[&str])]) -> VSphereCapabilities {
    VSphereCapabilities {
        datacenters: datacenters
            .iter()
            .map(|(dc, clusters)| VSphereDatacenter {
                name: (*dc).to_owned(),
                clusters: clusters.iter().map(|c| (*c).to_owned()).collect(),
            })
            .collect(),
        // vcsim's VMs are all in DC0/vm; `setup` makes DC0_C0_RP0_VM0 the one template.
        template_folders: vec!["DC0/vm".into()],
        vm_folders: vec![SANDBOXES.into()],
    }
}

async fn provider_ready(
    env: &Env,
    what: &str,
    check: impl Fn(&conditions::Condition) -> bool,
) -> Provider {
    let api: Api<Provider> = Api::namespaced(env.admin.clone(), &env.ns);
    poll::until(what, Duration::from_secs(30), || async {
        let p = api.get(PROVIDER).await?;
        let ok = p
            .status
            .as_ref()
            .and_then(|s| conditions::find(&s.conditions, types::READY))
            .is_some_and(&check);
        Ok(ok.then_some(p))
    })
    .await
    .unwrap_or_else(|e| panic!("{e}"))
}

#[tokio::test]
async fn failure_domains_are_the_declared_clusters_that_exist() {
    let Some(mut env) = setup(
        declared(&[
            ("DC0", &["DC0_C0", "DC0_C1", "DC0_C9"]),
            ("DC1", &["DC1_C0"]),
        ]),
        None,
    )
    .await
    else {
        return;
    };
    env.start_status();
    let provider = provider_ready(&env, "Ready=False CapabilitiesIncomplete", |c| {
        c.reason == "CapabilitiesIncomplete"
    })
    .await;
    let status = provider.status.expect("status");
    let ready = conditions::find(&status.conditions, types::READY).expect("Ready");
    assert_eq!(ready.status, "False");
    assert!(
        ready
            .message
            .contains("cluster \"DC0_C9\" in datacenter \"DC0\""),
        "{}",
        ready.message
    );
    let names: Vec<_> = status
        .failure_domains
        .iter()
        .map(|d| d.name.as_str())
        .collect();
    assert_eq!(names, ["DC0/DC0_C0", "DC0/DC0_C1", "DC1/DC1_C0"]);
    // LocalDS_0 is in every datacenter: the storage class is offered everywhere.
    assert!(
        status
            .failure_domains
            .iter()
            .all(|d| d.storage_classes.iter().any(|c| c.name == "standard"))
    );

    // Declaring only what exists makes the Provider Ready.
    let api: Api<Provider> = Api::namespaced(env.admin.clone(), &env.ns);
    api.patch(
        PROVIDER,
        &PatchParams::default(),
        &Patch::Merge(json!({ "spec": { "capabilities": { "vsphere": {
            "datacenters": [{ "name": "DC0", "clusters": ["DC0_C1"] }] } } } })),
    )
    .await
    .expect("narrow the declaration");
    let provider = provider_ready(&env, "Ready=True Connected", |c| {
        c.status == "True" && c.reason == "Connected"
    })
    .await;
    let names: Vec<_> = provider
        .status
        .expect("status")
        .failure_domains
        .into_iter()
        .map(|d| d.name)
        .collect();
    assert_eq!(names, ["DC0/DC0_C1"]);
}

#[tokio::test]
async fn wrong_credentials_are_connect_failed_and_a_missing_key_credentials_unavailable() {
    let Some(mut env) = setup(declared(&[("DC0", &["DC0_C0"])]), Some("not-the-password")).await
    else {
        return;
    };
    env.start_status();
    let provider = provider_ready(&env, "Ready=False ConnectFailed", |c| {
        c.status == "False" && c.reason == "ConnectFailed"
    })
    .await;
    let status = provider.status.expect("status");
    let ready = conditions::find(&status.conditions, types::READY).expect("Ready");
    assert!(ready.message.contains("InvalidLogin"), "{}", ready.message);
    assert!(
        !ready.message.contains("not-the-password"),
        "{}",
        ready.message
    );
    assert!(
        status.failure_domains.is_empty(),
        "never reached: no failure domain"
    );

    // A Secret without its password key is the Secret's problem, named as such.
    let secrets: Api<Secret> = Api::namespaced(env.admin.clone(), &env.ns);
    secrets
        .patch(
            "vc-creds",
            &PatchParams::default(),
            &Patch::Merge(json!({ "data": { "password": null } })),
        )
        .await
        .expect("drop the password");
    let provider = provider_ready(&env, "Ready=False CredentialsUnavailable", |c| {
        c.reason == "CredentialsUnavailable"
    })
    .await;
    let ready = conditions::find(&provider.status.expect("status").conditions, types::READY)
        .cloned()
        .expect("Ready");
    assert!(
        ready
            .message
            .contains("Secret \"vc-creds\" has no key \"password\""),
        "{}",
        ready.message
    );
}

#[tokio::test]
async fn a_machine_is_cloned_into_its_cluster_reports_its_guest_and_is_destroyed() {
    let Some(mut env) = setup(declared(&[("DC0", &["DC0_C1"])]), None).await else {
        return;
    };
    env.start_machines();
    let user_data = "#cloud-config\nhostname: web-01\n";
    let created = env.create_machine("web-01", Some(user_data)).await;
    let machine = env
        .machine_until("web-01", "the machine Ready", |m| {
            m.status.as_ref().is_some_and(|s| s.contract.ready)
        })
        .await;
    let status = machine.status.clone().expect("status");
    assert!(
        machine
            .finalizers()
            .iter()
            .any(|f| f == FINALIZER_VM_PROTECTION)
    );
    assert!(status.contract.initialization.provisioned);
    let vm_ref = ManagedObjectRef::new("VirtualMachine", status.vm_mo_ref.clone().expect("moref"));

    // The VM, as vCenter sees it: in DC0_C1's root pool, powered on, sized, with its guestinfo.
    let vc = env.vsphere().await;
    let path = format!("DC0/vm/{}", env.vm_name("web-01"));
    assert_eq!(
        vc.find_by_inventory_path(&path).await.expect("find"),
        Some(vm_ref.clone())
    );
    let info = vc.vm_info(&vm_ref).await.expect("vm info");
    assert_eq!(info.power_state, PowerState::PoweredOn);

    // bob, who may write VSphereMachines in the namespace and nothing else, names a VM that is
    // no template: refused, and nothing cloned.
    let bob = control_plane()
        .await
        .tenant_writing(&env.ns, "bob", "vspheremachines")
        .await
        .expect("bob");
    let mut stolen = env.machines().get("web-01").await.expect("get");
    stolen.metadata = kube::api::ObjectMeta {
        name: Some("stolen".into()),
        ..Default::default()
    };
    stolen.status = None;
    stolen.spec.template = NOT_A_TEMPLATE.into();
    stolen.spec.user_data = None;
    Api::<VSphereMachine>::namespaced(bob.clone(), &env.ns)
        .create(&PostParams::default(), &stolen)
        .await
        .expect("bob's machine");
    let refused = env
        .machine_until("stolen", "the machine refused", |m| {
            m.status.as_ref().is_some_and(|s| {
                conditions::find(&s.contract.conditions, types::READY)
                    .is_some_and(|c| c.reason == banlieue_api::vsphere::reasons::TEMPLATE_REFUSED)
            })
        })
        .await;
    let ready = conditions::find(
        &refused.status.expect("status").contract.conditions,
        types::READY,
    )
    .cloned()
    .expect("Ready");
    assert!(
        ready.message.contains(NOT_A_TEMPLATE) && ready.message.contains("not a template"),
        "{}",
        ready.message
    );
    let stolen_path = format!("DC0/vm/{}", env.vm_name("stolen"));
    assert_eq!(
        vc.find_by_inventory_path(&stolen_path).await.expect("find"),
        None
    );
    env.machines()
        .delete("stolen", &Default::default())
        .await
        .expect("delete");
    // bob names a cluster vCenter has but the Provider did not declare (DC0_C0, beside the
    // declared DC0_C1): refused naming the fields, and nothing cloned.
    let message = env
        .placement_refused(&bob, "elsewhere", |spec| spec.cluster = "DC0_C0".into())
        .await;
    assert!(
        message.contains("spec.cluster DC0_C0 are not a cluster the Provider declares")
            && message.contains("DC0/DC0_C1"),
        "{message}"
    );
    // A datastore no storage class of the Provider targets (vcsim has none such: refused
    // rather than not found, so vCenter was not asked).
    let message = env
        .placement_refused(&bob, "other-datastore", |spec| {
            spec.datastore = Some("TenantDS".into());
        })
        .await;
    assert!(
        message.starts_with("spec.datastore TenantDS is not a datastore the Provider declares")
            && message.contains("LocalDS_0"),
        "{message}"
    );
    // A folder beside the declared one, sharing its name as a prefix.
    let evil = format!("{SANDBOXES}-evil");
    let message = env
        .placement_refused(&bob, "other-folder", |spec| {
            spec.folder = Some(evil.clone())
        })
        .await;
    assert!(
        message.starts_with(&format!("spec.folder {evil} is not a VM folder"))
            && message.contains(SANDBOXES),
        "{message}"
    );
    let b64 = base64::engine::general_purpose::STANDARD;
    assert_eq!(
        info.extra_config.get("guestinfo.userdata"),
        Some(&b64.encode(user_data))
    );
    assert_eq!(
        info.extra_config
            .get("guestinfo.userdata.encoding")
            .map(String::as_str),
        Some("base64")
    );
    let metadata = b64
        .decode(
            info.extra_config
                .get("guestinfo.metadata")
                .expect("metadata"),
        )
        .expect("base64");
    let uid = created.uid().expect("uid");
    assert_eq!(
        String::from_utf8(metadata).expect("text"),
        format!(
            "instance-id: {uid}\nlocal-hostname: {}\n",
            env.vm_name("web-01")
        )
    );
    assert_eq!(info.extra_config.get(EXTRA_CONFIG_MACHINE_UID), Some(&uid));
    let placed = vc
        .retrieve_one(
            &vm_ref,
            &[
                "resourcePool",
                "config.hardware.numCPU",
                "config.hardware.memoryMB",
                "config.instanceUuid",
                "config.firmware",
            ],
        )
        .await
        .expect("placement");
    let dc = vc
        .datacenters()
        .await
        .expect("datacenters")
        .into_iter()
        .find(|d| d.name == "DC0")
        .expect("DC0");
    let cluster = vc
        .clusters(&dc.moref)
        .await
        .expect("clusters")
        .into_iter()
        .find(|c| c.name == "DC0_C1")
        .expect("DC0_C1");
    assert_eq!(
        placed.get("resourcePool").and_then(PropertyValue::as_moref),
        Some(&cluster.resource_pool)
    );
    assert_eq!(
        placed.get("config.hardware.numCPU"),
        Some(&PropertyValue::Int(2))
    );
    assert_eq!(
        placed.get("config.hardware.memoryMB"),
        Some(&PropertyValue::Int(1024))
    );
    let uuid = placed
        .get("config.instanceUuid")
        .and_then(PropertyValue::text)
        .expect("instance UUID");
    assert_eq!(
        status.contract.provider_id,
        Some(format!("vsphere://{uuid}"))
    );
    assert_eq!(status.instance_uuid.as_deref(), Some(uuid));
    // Not asked for Secure Boot: the clone keeps the firmware it was cloned with.
    assert_eq!(
        placed.get("config.firmware").and_then(PropertyValue::text),
        Some("bios")
    );
    // Asked for it: set to EFI with Secure Boot on before its first power-on.
    let secure = env.create_machine_with("secure-01", None, true).await;
    env.machine_until("secure-01", "the secure-boot machine Ready", |m| {
        m.status.as_ref().is_some_and(|s| s.contract.ready)
    })
    .await;
    let secure_vm = vc
        .find_by_inventory_path(&format!("DC0/vm/{}", env.vm_name("secure-01")))
        .await
        .expect("find")
        .expect("the secure-boot machine's VM");
    let boot = vc
        .retrieve_one(
            &secure_vm,
            &[
                "config.firmware",
                "config.bootOptions",
                "runtime.powerState",
            ],
        )
        .await
        .expect("boot settings");
    assert_eq!(
        boot.get("config.firmware").and_then(PropertyValue::text),
        Some("efi")
    );
    let efi_secure_boot = match boot.get("config.bootOptions") {
        Some(PropertyValue::Other(options)) => options
            .child_text("efiSecureBootEnabled")
            .map(str::to_owned),
        other => panic!("config.bootOptions is {other:?}"),
    };
    assert_eq!(efi_secure_boot.as_deref(), Some("true"));
    env.machines()
        .delete(&secure.name_any(), &DeleteParams::default())
        .await
        .expect("delete the secure-boot machine");
    // No phase yet: the guest has said nothing.
    let guest = condition(&machine, types::GUEST_READY).expect("GuestReady");
    assert_eq!(
        (guest.status.as_str(), guest.reason.as_str()),
        ("Unknown", "GuestPhaseAbsent")
    );

    // VMware Tools reports an address (vcsim's stand-in for a guest).
    set_extra_config(&vc, &vm_ref, "SET.guest.ipAddress", "192.0.2.44").await;
    env.machine_until("web-01", "the guest's address", |m| {
        m.status.as_ref().is_some_and(|s| {
            s.contract
                .addresses
                .iter()
                .any(|a| a.address == "192.0.2.44" && a.type_ == "InternalIP")
        })
    })
    .await;

    // The guest-phase layer writes its phase through guestinfo.
    set_extra_config(&vc, &vm_ref, "guestinfo.banlieue.phase", "configuring").await;
    let m = env
        .machine_until("web-01", "GuestReady=False GuestPhasePending", |m| {
            condition(m, types::GUEST_READY).is_some_and(|c| c.reason == "GuestPhasePending")
        })
        .await;
    assert_eq!(
        condition(&m, types::GUEST_READY)
            .expect("GuestReady")
            .status,
        "False"
    );
    assert_eq!(
        m.status
            .as_ref()
            .and_then(|s| s.contract.guest_phase.as_deref()),
        Some("configuring")
    );
    set_extra_config(&vc, &vm_ref, "guestinfo.banlieue.phase", "ready").await;
    let m = env
        .machine_until("web-01", "GuestReady=True", |m| {
            condition(m, types::GUEST_READY).is_some_and(|c| c.status == "True")
        })
        .await;
    assert_eq!(
        condition(&m, types::GUEST_READY)
            .expect("GuestReady")
            .reason,
        "GuestPhaseReady"
    );
    // vcsim has no virtual TPM: nothing to publish.
    assert!(
        m.status
            .as_ref()
            .is_some_and(|s| s.contract.tpm_endorsement_certificates.is_empty())
    );

    // Deletion blocks until the VM is gone from vCenter, then the machine goes.
    env.machines()
        .delete("web-01", &DeleteParams::default())
        .await
        .expect("delete");
    let api = env.machines();
    poll::until("the machine gone", Duration::from_secs(40), || async {
        Ok(api.get_opt("web-01").await?.is_none().then_some(()))
    })
    .await
    .expect("deleted");
    assert_eq!(vc.find_by_inventory_path(&path).await.expect("find"), None);
    assert_eq!(
        vc.vm_by_name(&env.vm_name("web-01"))
            .await
            .expect("by name"),
        None
    );
    let gone = vc.vm_info(&vm_ref).await.expect_err("destroyed");
    assert_eq!(
        gone.fault().map(|f| f.kind.as_str()),
        Some("ManagedObjectNotFound")
    );
}

/// Sets the machine's `spec.standby` with the JSON merge patch the controller sends (ADR-0073).
/// Only the controller may write it (deploy/admission/reserved-metadata.yaml); admin stands in
/// for it here. Returns the machine's new generation.
async fn ask_standby(env: &Env, name: &str, standby: &str) -> i64 {
    let patched = env
        .machines()
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": { "standby": standby } })),
        )
        .await
        .expect("patch spec.standby");
    patched.metadata.generation.expect("generation")
}

/// The provider's word on the machine's standby, once it is for `generation` or later (what the
/// controller trusts).
fn standby_reported(m: &VSphereMachine, generation: i64) -> Option<Standby> {
    let status = m.status.as_ref()?;
    (status.contract.observed_generation >= Some(generation))
        .then_some(status.contract.standby)
        .flatten()
}

#[tokio::test]
async fn a_saved_machine_is_suspended_resumed_when_running_and_destroyed_while_suspended() {
    let Some(mut env) = setup(declared(&[("DC0", &["DC0_C1"])]), None).await else {
        return;
    };
    env.start_machines();
    env.create_machine("warm", None).await;
    let machine = env
        .machine_until("warm", "the machine Ready", |m| {
            m.status.as_ref().is_some_and(|s| s.contract.ready)
        })
        .await;
    // Never asked to save: no standby in its status.
    assert_eq!(
        machine.status.as_ref().expect("status").contract.standby,
        None
    );
    assert!(condition(&machine, types::SAVED).is_none());
    let vm_ref = ManagedObjectRef::new(
        "VirtualMachine",
        machine.status.expect("status").vm_mo_ref.expect("moref"),
    );
    let vc = env.vsphere().await;
    set_extra_config(&vc, &vm_ref, "SET.guest.ipAddress", "192.0.2.45").await;
    set_extra_config(&vc, &vm_ref, "guestinfo.banlieue.phase", "ready").await;
    let before = env
        .machine_until("warm", "GuestReady=True with an address", |m| {
            condition(m, types::GUEST_READY).is_some_and(|c| c.status == "True")
                && m.status.as_ref().is_some_and(|s| {
                    s.contract
                        .addresses
                        .iter()
                        .any(|a| a.address == "192.0.2.45")
                })
        })
        .await;
    let addresses = before.status.expect("status").contract.addresses;

    // Saved: the VM is suspended, and the machine stays ready with its guest as recorded.
    let generation = ask_standby(&env, "warm", "Saved").await;
    let saved = env
        .machine_until("warm", "standby: Saved", |m| {
            standby_reported(m, generation) == Some(Standby::Saved)
        })
        .await;
    assert_eq!(
        vc.vm_info(&vm_ref).await.expect("vm info").power_state,
        PowerState::Suspended
    );
    let status = saved.status.clone().expect("status");
    assert!(status.contract.ready);
    assert_eq!(status.contract.addresses, addresses);
    let suspended = condition(&saved, types::SAVED).expect("Saved");
    assert_eq!(
        (suspended.status.as_str(), suspended.reason.as_str()),
        ("True", reasons::VM_SUSPENDED)
    );
    let ready = condition(&saved, types::READY).expect("Ready");
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("True", reasons::VM_SUSPENDED)
    );
    assert_eq!(
        condition(&saved, types::GUEST_READY)
            .expect("GuestReady")
            .status,
        "True"
    );
    // It stays suspended: a later look (the resync is 5 s here) leaves it so.
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert_eq!(
        vc.vm_info(&vm_ref).await.expect("vm info").power_state,
        PowerState::Suspended
    );

    // Running: powered on, which resumes it; its addresses read again.
    let generation = ask_standby(&env, "warm", "Running").await;
    let resumed = env
        .machine_until("warm", "standby: Running", |m| {
            standby_reported(m, generation) == Some(Standby::Running)
        })
        .await;
    assert_eq!(
        vc.vm_info(&vm_ref).await.expect("vm info").power_state,
        PowerState::PoweredOn
    );
    let status = resumed.status.clone().expect("status");
    assert!(status.contract.ready);
    assert_eq!(status.contract.addresses, addresses);
    let not_suspended = condition(&resumed, types::SAVED).expect("Saved");
    assert_eq!(
        (not_suspended.status.as_str(), not_suspended.reason.as_str()),
        ("False", reasons::VM_NOT_SUSPENDED)
    );
    let ready = condition(&resumed, types::READY).expect("Ready");
    assert_eq!(ready.reason, banlieue_api::vsphere::reasons::POWERED_ON);

    // Saved again, then deleted while suspended: the VM is destroyed with the machine.
    let generation = ask_standby(&env, "warm", "Saved").await;
    env.machine_until("warm", "standby: Saved again", |m| {
        standby_reported(m, generation) == Some(Standby::Saved)
    })
    .await;
    env.machines()
        .delete("warm", &DeleteParams::default())
        .await
        .expect("delete");
    let api = env.machines();
    poll::until("the machine gone", Duration::from_secs(40), || async {
        Ok(api.get_opt("warm").await?.is_none().then_some(()))
    })
    .await
    .expect("deleted");
    assert_eq!(
        vc.vm_by_name(&env.vm_name("warm")).await.expect("by name"),
        None
    );
    let gone = vc.vm_info(&vm_ref).await.expect_err("destroyed");
    assert_eq!(
        gone.fault().map(|f| f.kind.as_str()),
        Some("ManagedObjectNotFound")
    );
}

/// Clones the model VM as `name` into DC0_C1, as an earlier reconcile would have.
async fn preclone(
    vc: &Client,
    name: &str,
    extra_config: Vec<(String, String)>,
) -> ManagedObjectRef {
    let dc = vc
        .datacenters()
        .await
        .expect("datacenters")
        .into_iter()
        .find(|d| d.name == "DC0")
        .expect("DC0");
    let cluster = vc
        .clusters(&dc.moref)
        .await
        .expect("clusters")
        .into_iter()
        .find(|c| c.name == "DC0_C1")
        .expect("DC0_C1");
    let template = vc
        .find_by_inventory_path(TEMPLATE)
        .await
        .expect("find")
        .expect("template");
    let spec = CloneSpec {
        name: name.to_owned(),
        folder: dc.vm_folder,
        pool: cluster.resource_pool,
        host: None,
        datastore: None,
        power_on: false,
        extra_config,
    };
    wait(vc, vc.clone_vm(&template, &spec).await.expect("clone"))
        .await
        .expect("the clone's VM")
}

#[tokio::test]
async fn a_vm_cloned_before_a_crash_is_adopted_and_a_foreign_one_is_left_alone() {
    let Some(mut env) = setup(declared(&[("DC0", &["DC0_C1"])]), None).await else {
        return;
    };
    // The provider crashed after its clone and before writing the status: the VM exists with
    // the machine's uid, the machine has no status.
    let machine = env.create_machine("adopted", None).await;
    let uid = machine.uid().context("uid").expect("uid");
    let vc = env.vsphere().await;
    let earlier = preclone(
        &vc,
        &env.vm_name("adopted"),
        vec![(EXTRA_CONFIG_MACHINE_UID.to_owned(), uid)],
    )
    .await;
    // Someone else's VM under another machine's name.
    env.create_machine("squatted", None).await;
    let foreign = preclone(&vc, &env.vm_name("squatted"), Vec::new()).await;

    env.start_machines();
    let m = env
        .machine_until("adopted", "the adopted machine Ready", |m| {
            m.status.as_ref().is_some_and(|s| s.contract.ready)
        })
        .await;
    assert_eq!(
        m.status.as_ref().and_then(|s| s.vm_mo_ref.as_deref()),
        Some(earlier.value.as_str()),
        "the VM cloned before the crash is the machine's, not a second clone"
    );
    // Exactly one VM of the name (vm_by_name refuses an ambiguous name).
    assert_eq!(
        vc.vm_by_name(&env.vm_name("adopted"))
            .await
            .expect("one VM"),
        Some(earlier)
    );

    let m = env
        .machine_until("squatted", "VMNameTaken", |m| {
            condition(m, types::READY).is_some_and(|c| c.reason == "VMNameTaken")
        })
        .await;
    assert!(
        m.status
            .as_ref()
            .is_some_and(|s| !s.contract.ready && s.vm_mo_ref.is_none())
    );
    // Deleting the machine leaves the foreign VM as it was.
    env.machines()
        .delete("squatted", &DeleteParams::default())
        .await
        .expect("delete");
    let api = env.machines();
    poll::until(
        "the squatting machine gone",
        Duration::from_secs(40),
        || async { Ok(api.get_opt("squatted").await?.is_none().then_some(())) },
    )
    .await
    .expect("deleted");
    let info = vc
        .vm_info(&foreign)
        .await
        .expect("the foreign VM is still there");
    assert_eq!(info.power_state, PowerState::PoweredOff);
}

/// A VMImage with a Template source for `class`, created by the administrator.
async fn create_template_image(env: &Env, name: &str, class: &str, template: &str) {
    create_template_image_as(&env.admin, env, name, class, template).await
}

/// A VMImage with a Template source for `class`, created by `writer`.
async fn create_template_image_as(
    writer: &kube::Client,
    env: &Env,
    name: &str,
    class: &str,
    template: &str,
) {
    let images: Api<banlieue_api::VMImage> = Api::namespaced(writer.clone(), &env.ns);
    let image: banlieue_api::VMImage = serde_json::from_value(json!({
        "apiVersion": "banlieue.io/v1alpha1", "kind": "VMImage",
        "metadata": {"name": name},
        "spec": {"installMode": "Immediate",
                 "sources": [{"providerClass": class, "kind": "Template", "template": template}]}
    }))
    .expect("a valid VMImage");
    images
        .create(&Default::default(), &image)
        .await
        .expect("create the VMImage");
}

#[tokio::test]
async fn a_template_image_is_ready_where_vcenter_has_the_template_and_names_a_missing_one() {
    let Some(mut env) = setup(declared(&[("DC0", &["DC0_C0", "DC0_C1"])]), None).await else {
        return;
    };
    env.start_status();
    provider_ready(&env, "Ready=True", |c| c.status == "True").await;
    env.start_images();
    create_template_image(&env, "present", "vsphere", TEMPLATE).await;
    create_template_image(&env, "missing", "vsphere", "DC0/vm/no-such-template").await;
    create_template_image(&env, "other-class", "libvirt", TEMPLATE).await;
    let images: Api<banlieue_api::VMImage> = Api::namespaced(env.admin.clone(), &env.ns);
    let zones_of = |image: &banlieue_api::VMImage| {
        image
            .status
            .as_ref()
            .and_then(|s| s.per_provider.iter().find(|p| p.provider == PROVIDER))
            .map(|p| p.zones.clone())
    };
    let present = poll::until(
        "the present template's zone",
        Duration::from_secs(30),
        || async {
            let image = images.get("present").await?;
            Ok(zones_of(&image).is_some().then_some(image))
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    let zones = zones_of(&present).expect("zones");
    assert_eq!(zones.len(), 1, "one datastore: {zones:?}");
    assert_eq!(zones[0].pool, "LocalDS_0");
    assert_eq!(zones[0].phase, banlieue_api::ZonePhase::Ready);
    assert_eq!(zones[0].volume.as_deref(), Some(TEMPLATE));
    let status = present.status.expect("status");
    assert_eq!(status.phase, Some(banlieue_api::ImagePhase::Ready));
    assert_eq!(
        status.revision,
        Some(banlieue_api::image::revision(
            &images.get("present").await.expect("get")
        ))
    );

    let missing = poll::until(
        "the missing template's zone",
        Duration::from_secs(30),
        || async {
            let image = images.get("missing").await?;
            Ok(zones_of(&image).map(|zones| zones[0].clone()))
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(missing.phase, banlieue_api::ZonePhase::Failed);
    assert!(
        missing
            .message
            .as_deref()
            .unwrap_or("")
            .contains("DC0/vm/no-such-template"),
        "{missing:?}"
    );
    // bob, who may write VMImages in the namespace and nothing else, names a VM that is no
    // template, and a template path outside the declared folders: each zone Failed, saying why.
    let bob = control_plane()
        .await
        .tenant_writing(&env.ns, "bob", "vmimages")
        .await
        .expect("bob");
    create_template_image_as(&bob, &env, "plain-vm", "vsphere", NOT_A_TEMPLATE).await;
    create_template_image_as(&bob, &env, "elsewhere", "vsphere", "DC0/host/DC0_C0").await;
    for (name, why) in [
        ("plain-vm", "is a VM, not a template"),
        (
            "elsewhere",
            "is not in a template folder the Provider declares",
        ),
    ] {
        let zone = poll::until(
            &format!("the {name} zone"),
            Duration::from_secs(30),
            || async {
                let image = images.get(name).await?;
                Ok(zones_of(&image).map(|zones| zones[0].clone()))
            },
        )
        .await
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(zone.phase, banlieue_api::ZonePhase::Failed, "{name}");
        assert!(zone.volume.is_none(), "{name}");
        assert!(
            zone.message.as_deref().unwrap_or("").contains(why),
            "{name}: {zone:?}"
        );
    }

    // Another class's source is not this provider's: it writes nothing there.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let other = images.get("other-class").await.expect("get");
    assert!(zones_of(&other).is_none(), "{:?}", other.status);
}

#[tokio::test]
async fn a_claims_keys_go_to_guestinfo_once_the_guest_is_ready_and_its_answer_is_recorded() {
    let Some(mut env) = setup(declared(&[("DC0", &["DC0_C1"])]), None).await else {
        return;
    };
    env.start_machines();
    let access = ClaimAccess {
        ssh_authorized_keys: vec![format!("{} alice@laptop", ed25519_public_key(1, ""))],
        user: Some("alice".into()),
    };
    // Admin stands in for the controller, which alone writes a machine's spec (ADR-0075).
    let keys = access.clone();
    env.create_machine_spec("keyed", move |spec| spec.access = Some(keys))
        .await;
    let machine = env
        .machine_until("keyed", "the machine Ready", |m| {
            m.status.as_ref().is_some_and(|s| s.contract.ready)
        })
        .await;
    let vm_ref = ManagedObjectRef::new(
        "VirtualMachine",
        machine
            .status
            .clone()
            .expect("status")
            .vm_mo_ref
            .expect("moref"),
    );
    let vc = env.vsphere().await;
    // Until the guest says ready, nothing is written and the claim waits.
    let pending = condition(&machine, types::ACCESS_READY).expect("AccessReady");
    assert_eq!(
        (pending.status.as_str(), pending.reason.as_str()),
        ("False", reasons::ACCESS_PENDING),
        "{}",
        pending.message
    );
    let info = vc.vm_info(&vm_ref).await.expect("vm info");
    assert_eq!(info.extra_config.get(GUESTINFO_ACCESS), None);

    // The guest's layer says ready (as vmware-rpctool info-set would).
    set_extra_config(&vc, &vm_ref, "guestinfo.banlieue.phase", "ready").await;
    let written = poll::until(
        "the request in guestinfo",
        Duration::from_secs(40),
        || async {
            let info = vc.vm_info(&vm_ref).await?;
            Ok(info.extra_config.get(GUESTINFO_ACCESS).cloned())
        },
    )
    .await
    .expect("written");
    let request = base64::engine::general_purpose::STANDARD
        .decode(&written)
        .expect("base64");
    assert_eq!(
        String::from_utf8(request.clone()).expect("text"),
        format!(
            "banlieue-access 1\nuser alice\nkey {} alice@laptop\nend\n",
            ed25519_public_key(1, "")
        )
    );
    let digest: String = <sha2::Sha256 as sha2::Digest>::digest(&request)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();

    // An answer about other bytes is not taken. The host keys the guest publishes after it
    // show that a reconcile has read that answer: once they are recorded, the keys must still
    // be pending.
    set_extra_config(
        &vc,
        &vm_ref,
        GUESTINFO_ACCESS_STATE,
        &format!("installed alice {}", "0".repeat(64)),
    )
    .await;
    let host_keys = format!("{} root@keyed\n", ed25519_public_key(9, ""));
    set_extra_config(
        &vc,
        &vm_ref,
        GUESTINFO_SSH_HOST_KEYS,
        &base64::engine::general_purpose::STANDARD.encode(&host_keys),
    )
    .await;
    let still = env
        .machine_until("keyed", "the host keys recorded", |m| {
            m.status
                .as_ref()
                .is_some_and(|s| !s.contract.ssh_host_keys.is_empty())
        })
        .await;
    assert_eq!(
        condition(&still, types::ACCESS_READY).map(|c| c.reason.as_str()),
        Some(reasons::ACCESS_PENDING),
        "an answer about other bytes was taken"
    );

    set_extra_config(
        &vc,
        &vm_ref,
        GUESTINFO_ACCESS_STATE,
        &format!("installed alice {digest}"),
    )
    .await;
    let installed = env
        .machine_until("keyed", "AccessReady=True", |m| {
            condition(m, types::ACCESS_READY).is_some_and(|c| c.status == "True")
        })
        .await;
    assert_eq!(
        condition(&installed, types::ACCESS_READY).map(|c| c.reason.as_str()),
        Some(reasons::ACCESS_INSTALLED)
    );
    let status = installed.status.expect("status");
    assert_eq!(status.contract.login_user.as_deref(), Some("alice"));
    assert_eq!(
        status.contract.ssh_host_keys,
        vec![ed25519_public_key(9, "")]
    );
}

//! Test support: CRDs, the controller's RBAC, fixtures shaped for the backend under test, a
//! fake provider that plays its machine contract, and the controller run in process or as a
//! child process.
#![allow(dead_code)]

pub mod backend;
pub mod child;
pub mod fake_provider;
pub mod history;
pub mod memory_backend;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use banlieue_api::conditions::{self, status, types};
use banlieue_api::{VMClass, VMImage, VirtualMachine, VirtualMachineClaim, VirtualMachinePool};
use banlieue_controller::{ControllerConfig, Metrics};
use banlieue_testenv::control_plane::{ControlPlane, wait_for};
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use prometheus_client::registry::Registry;
use serde_json::json;
use tokio::sync::{OnceCell, oneshot};

pub use backend::{MachineView, backend};

pub type TestResult<T = ()> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// The service account the controller runs as in tests.
pub const CONTROLLER_SA: &str = "banlieue-controller";
/// The ClusterRole of the controller. deploy/rbac/controller-clusterrole.yaml when it exists,
/// else an equivalent one created here.
pub const CONTROLLER_ROLE: &str = "banlieue-controller";
/// The controller's rights on the test-only MemoryMachines, granted beside its own role.
pub const MEMORY_CONTROLLER_ROLE: &str = "banlieue-controller-memorymachines";
pub const PROVIDER: &str = "host-1";
/// A ProviderClass no test registers: a Provider of it has no machine builder.
pub const UNREGISTERED_PROVIDER_CLASS: &str = "unregistered";
pub const CLASS: &str = "small";
pub const IMAGE: &str = "img";
pub const STORAGE_CLASS: &str = "standard";
pub const NETWORK_CLASS: &str = "prod";

/// Any one wait for the controller. A wait returns as soon as it is met; the bound only decides
/// when a failure is reported. The suite runs beside guests booting under TCG, which keep both
/// cores busy: a controller's first pass once took more than 60 s there.
pub const DEADLINE: Duration = Duration::from_secs(120);

/// Where one pool member was placed ([`Harness::placements`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placed {
    pub name: String,
    pub provider: Option<String>,
    pub claimed: bool,
    pub deleting: bool,
}

/// A namespace with everything a pool needs, served by the controller under test.
pub struct Harness {
    pub cp: &'static ControlPlane,
    pub admin: Client,
    pub namespace: String,
}

impl Harness {
    pub async fn new() -> TestResult<Self> {
        // An unknown backend fails here, before a control plane is started for nothing.
        let _ = backend();
        Self::on(ControlPlane::shared().await?).await
    }

    /// A harness on `cp` (e.g. a control plane with a node, shared with other systems).
    pub async fn on(cp: &'static ControlPlane) -> TestResult<Self> {
        let _ = backend();
        let admin = cp.client()?;
        install_crds_once(&admin).await?;
        install_role_once(&admin, cp).await?;
        install_claim_protection_once(cp).await?;
        let namespace = cp.fresh_namespace().await?;
        let harness = Self {
            cp,
            admin,
            namespace,
        };
        harness.grant_controller().await?;
        harness.fixtures().await?;
        Ok(harness)
    }

    pub fn api<K>(&self) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
    {
        Api::namespaced(self.admin.clone(), &self.namespace)
    }

    async fn grant_controller(&self) -> TestResult {
        let accounts: Api<ServiceAccount> = self.api();
        let account: ServiceAccount = serde_json::from_value(json!({
            "metadata": {"name": CONTROLLER_SA}
        }))?;
        accounts.create(&PostParams::default(), &account).await?;
        self.bind_controller_roles(CONTROLLER_SA).await
    }

    /// Binds the controller's ClusterRole (and, for the test-only kind, its rights on
    /// MemoryMachines) to the service account `account` of this namespace. A
    /// ClusterRoleBinding because ProviderClasses are cluster-scoped; the controller still
    /// serves only this namespace.
    pub async fn bind_controller_roles(&self, account: &str) -> TestResult {
        let mut roles = vec![CONTROLLER_ROLE];
        if backend().is_memory() {
            roles.push(MEMORY_CONTROLLER_ROLE);
        }
        let bindings: Api<ClusterRoleBinding> = Api::all(self.admin.clone());
        for role in roles {
            let binding: ClusterRoleBinding = serde_json::from_value(json!({
                "metadata": {"name": format!("{role}-{account}-{}", self.namespace),
                             "labels": {"banlieue.io/test": "true"}},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
                "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": self.namespace}]
            }))?;
            bindings.create(&PostParams::default(), &binding).await?;
        }
        Ok(())
    }

    /// A client with exactly the controller's RBAC.
    pub async fn controller_client(&self) -> TestResult<Client> {
        Ok(self
            .cp
            .client_as_service_account(&self.namespace, CONTROLLER_SA)
            .await?)
    }

    /// Provider (Ready, one failure domain), ProviderClass, VMClass and a Ready VMImage.
    async fn fixtures(&self) -> TestResult {
        self.apply_provider(PROVIDER, backend().provider_class, &[])
            .await?;
        self.apply_class(CLASS, false).await?;
        self.apply_image(IMAGE, "r1", true).await?;
        Ok(())
    }

    /// A Provider of `class`, shaped for the backend under test, Ready with its one failure
    /// domain ([`backend::Backend::failure_domain`]) offering the harness's storage and
    /// network classes and `features`.
    pub async fn apply_provider(&self, name: &str, class: &str, features: &[&str]) -> TestResult {
        let providers: Api<banlieue_api::Provider> = self.api();
        let params = PatchParams::apply("banlieue-test").force();
        let backend = backend();
        let storage_classes =
            json!([{"name": STORAGE_CLASS, "target": {"pool": backend.storage_target}}]);
        let network_classes =
            json!([{"name": NETWORK_CLASS, "target": {"network": backend.network_target}}]);
        let provider = json!({
            "apiVersion": "banlieue.io/v1alpha1", "kind": "Provider",
            "metadata": {"name": name},
            "spec": backend.provider_spec(class, json!({
                "storageClasses": storage_classes,
                "networkClasses": network_classes,
                "features": features,
            })),
        });
        providers
            .patch(name, &params, &Patch::Apply(&provider))
            .await?;
        let status = json!({"status": {
            "conditions": [ready_condition()],
            "failureDomains": [{
                "name": backend.failure_domain(name),
                "storageClasses": storage_classes,
                "networkClasses": network_classes,
                "features": features,
            }]
        }});
        providers
            .patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
            .await?;
        Ok(())
    }

    /// Publishes a Provider's Ready condition as its workload does: True when it reaches its
    /// host, False (`ConnectFailed`) when it cannot, from now.
    pub async fn set_provider_ready(&self, provider: &str, ready: bool) -> TestResult {
        let providers: Api<banlieue_api::Provider> = self.api();
        let now = k8s_openapi::jiff::Timestamp::now().to_string();
        let condition = if ready {
            json!({"type": "Ready", "status": "True", "reason": "Connected", "message": "",
                   "lastTransitionTime": now})
        } else {
            json!({"type": "Ready", "status": "False", "reason": "ConnectFailed",
                   "message": "dial 127.0.0.1:16514: connection refused", "lastTransitionTime": now})
        };
        let patch = json!({"status": {"conditions": [condition]}});
        providers
            .patch_status(provider, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        Ok(())
    }

    /// The pool's members with the Provider each was placed on (`None` before scheduling) and
    /// whether its deletion was requested.
    pub async fn placements(&self, pool: &str) -> Result<Vec<Placed>, kube::Error> {
        let selector = format!("{}={pool}", banlieue_api::names::LABEL_POOL);
        let members = self
            .api::<VirtualMachine>()
            .list(&ListParams::default().labels(&selector))
            .await?
            .items;
        Ok(members
            .iter()
            .map(|vm| Placed {
                name: vm.name_any(),
                provider: vm
                    .status
                    .as_ref()
                    .and_then(|s| s.provider_ref.as_ref())
                    .map(|p| p.name.clone()),
                claimed: vm.labels().contains_key(banlieue_api::names::LABEL_CLAIM),
                deleting: vm.metadata.deletion_timestamp.is_some(),
            })
            .collect())
    }

    /// Publishes the host size of a Provider's failure domain, as its workload does after
    /// NODE_GET_INFO.
    pub async fn set_capacity(&self, provider: &str, memory_bytes: u64) -> TestResult {
        let providers: Api<banlieue_api::Provider> = self.api();
        let mut current = providers.get_status(provider).await?;
        let status = current.status.get_or_insert_with(Default::default);
        for domain in &mut status.failure_domains {
            domain.capacity = Some(banlieue_api::DomainCapacity {
                memory_bytes,
                cpus: 4,
            });
        }
        let patch = json!({"status": {"failureDomains": status.failure_domains}});
        providers
            .patch_status(provider, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        Ok(())
    }

    pub async fn apply_class(&self, name: &str, tpm: bool) -> TestResult {
        let classes: Api<VMClass> = self.api();
        let class = json!({
            "apiVersion": "banlieue.io/v1alpha1", "kind": "VMClass",
            "metadata": {"name": name},
            "spec": {"cpu": 2, "memory": "2Gi", "firmware": "efi", "tpmEnabled": tpm, "diskSize": "20Gi"}
        });
        classes
            .patch(
                name,
                &PatchParams::apply("banlieue-test").force(),
                &Patch::Apply(&class),
            )
            .await?;
        Ok(())
    }

    /// An Immediate image with revision `revision`, Ready on the provider's pool or not.
    pub async fn apply_image(&self, name: &str, revision: &str, ready: bool) -> TestResult {
        self.apply_image_on(name, revision, ready, &[PROVIDER])
            .await
    }

    /// [`apply_image`](Self::apply_image) on each of `providers`' pools.
    pub async fn apply_image_on(
        &self,
        name: &str,
        revision: &str,
        ready: bool,
        providers: &[&str],
    ) -> TestResult {
        let images: Api<VMImage> = self.api();
        let backend = backend();
        let image = json!({
            "apiVersion": "banlieue.io/v1alpha1", "kind": "VMImage",
            "metadata": {"name": name},
            "spec": {"installMode": "Immediate", "sources": [backend.image_source()]}
        });
        images
            .patch(
                name,
                &PatchParams::apply("banlieue-test").force(),
                &Patch::Apply(&image),
            )
            .await?;
        let phase = if ready { "Ready" } else { "Importing" };
        let status = json!({"status": {
            "phase": phase,
            "revision": revision,
            "perProvider": providers.iter().map(|p| json!(
                {"provider": p, "zones": [{"pool": backend.storage_target, "phase": phase,
                                           "volume": backend.image_volume}]}
            )).collect::<Vec<_>>()
        }});
        images
            .patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
            .await?;
        Ok(())
    }

    /// A pool like examples/19-virtualmachinepool.yaml.
    pub async fn create_pool(
        &self,
        name: &str,
        replicas: i32,
        readiness: &str,
        extra: serde_json::Value,
    ) -> TestResult<VirtualMachinePool> {
        let mut spec = json!({
            "replicas": replicas,
            "readiness": readiness,
            "updateStrategy": {"type": "Replace", "maxSurge": 1},
            "template": {
                "metadata": {"labels": {"app": "sandbox"}},
                "spec": {"classRef": {"name": CLASS}, "imageRef": {"name": IMAGE},
                         "storageClassName": STORAGE_CLASS, "networkClassName": NETWORK_CLASS}
            }
        });
        if let (Some(spec), Some(extra)) = (spec.as_object_mut(), extra.as_object()) {
            for (k, v) in extra {
                spec.insert(k.clone(), v.clone());
            }
        }
        let pool: VirtualMachinePool = serde_json::from_value(json!({
            "apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachinePool",
            "metadata": {"name": name}, "spec": spec
        }))?;
        Ok(self
            .api::<VirtualMachinePool>()
            .create(&PostParams::default(), &pool)
            .await?)
    }

    /// A claim like examples/20-virtualmachineclaim.yaml, created by the administrator (the
    /// controller cannot create claims).
    pub async fn create_claim(
        &self,
        name: &str,
        pool: &str,
        ttl: i64,
    ) -> TestResult<VirtualMachineClaim> {
        let claim: VirtualMachineClaim = serde_json::from_value(json!({
            "apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachineClaim",
            "metadata": {"name": name},
            "spec": {"poolRef": {"name": pool},
                     "subject": {"issuer": "https://issuer.example.com", "id": format!("subject-{name}")},
                     "ttlSeconds": ttl}
        }))?;
        Ok(self
            .api::<VirtualMachineClaim>()
            .create(&PostParams::default(), &claim)
            .await?)
    }

    /// A warm InfrastructureReady pool `pool` of `replicas`, and claim `claim` (TTL one hour)
    /// bound from it; returns the name of the claim's member.
    pub async fn bound_claim(&self, pool: &str, replicas: i32, claim: &str) -> TestResult<String> {
        self.create_pool(pool, replicas, "InfrastructureReady", json!({}))
            .await?;
        self.wait_available(pool, replicas).await?;
        self.create_claim(claim, pool, 3600).await?;
        let bound = self.wait_claim(claim, "Bound", is_bound).await?;
        Ok(member_name(&bound).ok_or("the Bound claim names no member")?)
    }

    /// Waits until the claim satisfies `ok`.
    pub async fn wait_claim(
        &self,
        name: &str,
        what: &str,
        ok: impl Fn(&VirtualMachineClaim) -> bool,
    ) -> TestResult<VirtualMachineClaim> {
        let claims: Api<VirtualMachineClaim> = self.api();
        let ok = &ok;
        Ok(wait_for(what, DEADLINE, || {
            let claims = claims.clone();
            async move { Ok(claims.get_opt(name).await?.filter(|c| ok(c))) }
        })
        .await?)
    }

    /// Waits until the pool has `n` available members.
    pub async fn wait_available(&self, pool: &str, n: i32) -> TestResult<VirtualMachinePool> {
        let pools: Api<VirtualMachinePool> = self.api();
        Ok(wait_for(
            &format!("pool {pool} to have {n} available"),
            DEADLINE,
            || {
                let pools = pools.clone();
                async move {
                    Ok(pools.get_opt(pool).await?.filter(|p| {
                        p.status
                            .as_ref()
                            .is_some_and(|s| s.available_replicas == n && s.replicas == n)
                    }))
                }
            },
        )
        .await?)
    }

    /// Waits until the pool's status satisfies `ok`.
    pub async fn wait_pool(
        &self,
        pool: &str,
        what: &str,
        ok: impl Fn(&banlieue_api::VirtualMachinePoolStatus) -> bool,
    ) -> TestResult<VirtualMachinePool> {
        let pools: Api<VirtualMachinePool> = self.api();
        let ok = &ok;
        Ok(wait_for(&format!("pool {pool}: {what}"), DEADLINE, || {
            let pools = pools.clone();
            async move {
                Ok(pools
                    .get_opt(pool)
                    .await?
                    .filter(|p| p.status.as_ref().is_some_and(ok)))
            }
        })
        .await?)
    }

    /// Creates a standalone VirtualMachine.
    pub async fn create_vm(&self, name: &str, class: &str) -> TestResult<VirtualMachine> {
        self.create_vm_of(name, class, IMAGE).await
    }

    /// [`create_vm`](Self::create_vm) of the image `image`.
    pub async fn create_vm_of(
        &self,
        name: &str,
        class: &str,
        image: &str,
    ) -> TestResult<VirtualMachine> {
        let vm: VirtualMachine = serde_json::from_value(json!({
            "apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachine",
            "metadata": {"name": name},
            "spec": {"classRef": {"name": class}, "imageRef": {"name": image},
                     "storageClassName": STORAGE_CLASS, "networkClassName": NETWORK_CLASS,
                     "userData": "#cloud-config\n"}
        }))?;
        Ok(self
            .api::<VirtualMachine>()
            .create(&PostParams::default(), &vm)
            .await?)
    }

    /// Waits until the VirtualMachine satisfies `ok`.
    pub async fn wait_vm(
        &self,
        name: &str,
        what: &str,
        ok: impl Fn(&VirtualMachine) -> bool,
    ) -> TestResult<VirtualMachine> {
        let vms: Api<VirtualMachine> = self.api();
        let ok = &ok;
        let waited = wait_for(what, DEADLINE, || {
            let vms = vms.clone();
            async move { Ok(vms.get_opt(name).await?.filter(|v| ok(v))) }
        })
        .await;
        match waited {
            Ok(vm) => Ok(vm),
            // Say what the VirtualMachine showed instead, so a timeout tells a slow controller
            // from a wrong condition.
            Err(timeout) => {
                let seen = match vms.get_opt(name).await {
                    Ok(Some(vm)) => format!(
                        "{:?}",
                        vm.status
                            .map(|s| s
                                .conditions
                                .into_iter()
                                .map(|c| format!(
                                    "{}={} {}: {}",
                                    c.type_, c.status, c.reason, c.message
                                ))
                                .collect::<Vec<_>>())
                            .unwrap_or_default()
                    ),
                    Ok(None) => "no such VirtualMachine".to_owned(),
                    Err(e) => format!("unreadable: {e}"),
                };
                Err(format!("{timeout}; {name} last showed {seen}").into())
            }
        }
    }

    /// The machines of the kind under test in this namespace, as stored.
    pub fn machine_api(&self) -> Api<DynamicObject> {
        Api::namespaced_with(self.admin.clone(), &self.namespace, &backend().resource())
    }

    /// The machine `name`, if it exists.
    pub async fn machine_opt(&self, name: &str) -> Result<Option<MachineView>, kube::Error> {
        match self.machine_api().get_opt(name).await? {
            Some(object) => Ok(Some(
                MachineView::read(&object).map_err(kube::Error::SerdeError)?,
            )),
            None => Ok(None),
        }
    }

    /// The machine `name`.
    pub async fn machine(&self, name: &str) -> TestResult<MachineView> {
        Ok(self
            .machine_opt(name)
            .await?
            .ok_or_else(|| format!("no {} {name}", backend().resource().kind))?)
    }

    /// Every machine in this namespace.
    pub async fn machines(&self) -> Result<Vec<MachineView>, kube::Error> {
        self.machine_api()
            .list(&ListParams::default())
            .await?
            .items
            .iter()
            .map(|object| MachineView::read(object).map_err(kube::Error::SerdeError))
            .collect()
    }

    /// Creates a machine of the kind under test with `metadata` and `spec`, as the controller
    /// or a user could have.
    pub async fn create_machine(
        &self,
        metadata: serde_json::Value,
        spec: serde_json::Value,
    ) -> TestResult<MachineView> {
        let resource = backend().resource();
        let machine: DynamicObject = serde_json::from_value(json!({
            "apiVersion": resource.api_version, "kind": resource.kind,
            "metadata": metadata, "spec": spec
        }))?;
        let created = self
            .machine_api()
            .create(&PostParams::default(), &machine)
            .await?;
        Ok(MachineView::read(&created)?)
    }

    pub async fn members(&self, pool: &str) -> TestResult<Vec<VirtualMachine>> {
        let vms: Api<VirtualMachine> = self.api();
        let selector = format!("{}={pool}", banlieue_api::names::LABEL_POOL);
        Ok(vms
            .list(&kube::api::ListParams::default().labels(&selector))
            .await?
            .items)
    }

    /// Runs the controller in process, as its service account, serving this namespace.
    pub async fn start_controller(&self) -> TestResult<RunningController> {
        self.start_controller_with(test_config(&self.namespace))
            .await
    }

    pub async fn start_controller_with(
        &self,
        config: ControllerConfig,
    ) -> TestResult<RunningController> {
        let client = self.controller_client().await?;
        let mut registry = Registry::default();
        let metrics = Metrics::register(&mut registry);
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(banlieue_controller::run(
            client,
            config,
            metrics.clone(),
            async move {
                let _ = stopped.await;
            },
        ));
        Ok(RunningController {
            stop: Some(stop),
            task,
            metrics,
            registry: Arc::new(registry),
        })
    }

    /// The shipped leader election Role and RoleBinding
    /// (deploy/rbac/controller-leader-election-*.yaml), moved from `banlieue-system` into this
    /// namespace, where the controller under test runs and keeps its Lease; returns once the
    /// authorizer applies them.
    pub async fn grant_leader_election(&self) -> TestResult {
        for file in [
            "controller-leader-election-role.yaml",
            "controller-leader-election-rolebinding.yaml",
        ] {
            let shipped = banlieue_testenv::repo_path("deploy/rbac").join(file);
            let text = std::fs::read_to_string(&shipped)?;
            let moved = std::env::temp_dir().join(format!("{}-{file}", self.namespace));
            std::fs::write(&moved, text.replace("banlieue-system", &self.namespace))?;
            self.cp.apply_yaml(&moved).await?;
        }
        self.wait_lease_access(true).await
    }

    /// Deletes the leader election RoleBinding; returns once the authorizer refuses the
    /// controller its Lease.
    pub async fn revoke_leader_election(&self) -> TestResult {
        self.api::<k8s_openapi::api::rbac::v1::RoleBinding>()
            .delete(
                "banlieue-controller-leader-election",
                &kube::api::DeleteParams::default(),
            )
            .await?;
        self.wait_lease_access(false).await
    }

    async fn wait_lease_access(&self, want: bool) -> TestResult {
        let user = format!("system:serviceaccount:{}:{CONTROLLER_SA}", self.namespace);
        let request = banlieue_testenv::access::Request {
            verb: "update",
            group: "coordination.k8s.io",
            resource: "leases",
            name: Some(banlieue_controller::LEASE_NAME),
            namespace: Some(&self.namespace),
        };
        let admin = &self.admin;
        wait_for("the leader election grant to apply", DEADLINE, || {
            let request = &request;
            let user = &user;
            async move {
                let allowed =
                    banlieue_testenv::access::service_account_may(admin, user, request).await?;
                Ok((allowed == want).then_some(()))
            }
        })
        .await?;
        Ok(())
    }

    /// The controller's Lease in this namespace, if any.
    pub async fn lease(&self) -> TestResult<Option<k8s_openapi::api::coordination::v1::LeaseSpec>> {
        Ok(self
            .api::<k8s_openapi::api::coordination::v1::Lease>()
            .get_opt(banlieue_controller::LEASE_NAME)
            .await?
            .map(|l| l.spec.unwrap_or_default()))
    }

    /// Who holds the controller's Lease in this namespace, if anyone.
    pub async fn lease_holder(&self) -> TestResult<Option<String>> {
        Ok(self
            .lease()
            .await?
            .and_then(|s| s.holder_identity)
            .filter(|h| !h.is_empty()))
    }

    /// Writes a kubeconfig holding a token of the controller's service account, for a
    /// controller run as a child process.
    pub async fn controller_kubeconfig(&self, dir: &Path) -> TestResult<PathBuf> {
        let path = dir.join(format!("{}.kubeconfig", self.namespace));
        self.cp
            .write_service_account_kubeconfig(&self.namespace, CONTROLLER_SA, &path)
            .await?;
        Ok(path)
    }
}

/// A controller running in this process.
pub struct RunningController {
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<banlieue_controller::Result<()>>,
    pub metrics: Metrics,
    pub registry: Arc<Registry>,
}

impl RunningController {
    /// The metrics as the controller's `/metrics` serves them.
    pub fn encoded_metrics(&self) -> TestResult<String> {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.registry)?;
        Ok(text)
    }

    /// Whether the controller is still serving (it has not returned, with or without error).
    pub fn is_running(&self) -> bool {
        !self.task.is_finished()
    }

    pub async fn stop(mut self) -> TestResult {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        (&mut self.task).await??;
        Ok(())
    }
}

impl Drop for RunningController {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Waits until `ok` holds of in-process state (the controller's metrics, a fake's counters).
pub async fn wait_until(what: &str, ok: impl Fn() -> bool) -> TestResult {
    wait_for(what, DEADLINE, || {
        let done = ok();
        async move { Ok(done.then_some(())) }
    })
    .await?;
    Ok(())
}

/// Short grace periods so tests are quick.
pub fn test_config(namespace: &str) -> ControllerConfig {
    ControllerConfig {
        namespace: Some(namespace.to_owned()),
        readiness_signal_grace: Duration::from_secs(2),
        provider_lost_after: Duration::from_secs(3),
        resync: Duration::from_secs(5),
        machine_backends: backend().machine_backends(),
        ..ControllerConfig::default()
    }
}

pub fn ready_condition() -> serde_json::Value {
    json!({"type": "Ready", "status": "True", "reason": "Connected", "message": "",
           "lastTransitionTime": "2026-01-01T00:00:00Z"})
}

pub fn phase(claim: &VirtualMachineClaim) -> Option<banlieue_api::ClaimPhase> {
    claim.status.as_ref().and_then(|s| s.phase)
}

pub fn bound_condition(claim: &VirtualMachineClaim) -> Option<conditions::Condition> {
    claim
        .status
        .as_ref()
        .and_then(|s| conditions::find(&s.conditions, types::BOUND).cloned())
}

pub fn is_bound(claim: &VirtualMachineClaim) -> bool {
    phase(claim) == Some(banlieue_api::ClaimPhase::Bound)
        && bound_condition(claim).is_some_and(|c| c.status == status::TRUE)
}

/// Waits until the API server no longer has `name`.
pub async fn gone<K>(api: &Api<K>, name: &str, what: &str) -> TestResult
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    Ok(wait_for(what, DEADLINE, || {
        let api = api.clone();
        async move { Ok(api.get_opt(name).await?.is_none().then_some(())) }
    })
    .await?)
}

pub fn member_name(claim: &VirtualMachineClaim) -> Option<String> {
    claim
        .status
        .as_ref()
        .and_then(|s| s.virtual_machine_ref.as_ref())
        .map(|r| r.name.clone())
}

async fn install_crds_once(admin: &Client) -> TestResult {
    static DONE: OnceCell<()> = OnceCell::const_new();
    DONE.get_or_try_init(|| async {
        let mut crds = banlieue_api::crds();
        if backend().is_memory() {
            crds.push(memory_backend::crd());
        }
        banlieue_testenv::control_plane::apply_crds(admin, crds).await?;
        let params = PatchParams::apply("banlieue-test").force();
        let classes: Api<banlieue_api::ProviderClass> = Api::all(admin.clone());
        let backend = backend();
        let class = json!({
            "apiVersion": "banlieue.io/v1alpha1", "kind": "ProviderClass",
            "metadata": {"name": backend.provider_class},
            "spec": {"image": "banlieue:test", "machineKind": backend.kind}
        });
        classes
            .patch(backend.provider_class, &params, &Patch::Apply(&class))
            .await?;
        Ok::<(), Box<dyn std::error::Error + Send + Sync>>(())
    })
    .await?;
    Ok(())
}

/// The controller's ClusterRole: the repository's when it exists, else the equivalent rules.
/// The shipped claim-protection policy, as a cluster runs it: claims are created holding the
/// controller's finalizer (the controller adds it to the first few, made before the admission
/// plugin has the policy). A cluster that does not serve its API (before Kubernetes v1.36)
/// runs without it, as `banlieue bootstrap` leaves it out there: the controller adds the
/// finalizer to every claim, which the claim tests then prove.
async fn install_claim_protection_once(cp: &ControlPlane) -> TestResult {
    static DONE: OnceCell<()> = OnceCell::const_new();
    DONE.get_or_try_init(|| async {
        let served =
            banlieue_testenv::manifests::serves_mutating_admission_policies(&cp.client()?).await?;
        if served {
            let shipped = banlieue_testenv::repo_path("deploy/claim-protection.yaml");
            cp.apply_yaml(&shipped).await?;
        } else {
            eprintln!("MutatingAdmissionPolicy v1 is not served: claims without the policy");
        }
        Ok::<(), Box<dyn std::error::Error + Send + Sync>>(())
    })
    .await?;
    Ok(())
}

async fn install_role_once(admin: &Client, cp: &ControlPlane) -> TestResult {
    static DONE: OnceCell<()> = OnceCell::const_new();
    DONE.get_or_try_init(|| async {
        if backend().is_memory() {
            let role: ClusterRole =
                serde_json::from_value(memory_backend::controller_rules(MEMORY_CONTROLLER_ROLE))?;
            Api::<ClusterRole>::all(admin.clone())
                .patch(
                    MEMORY_CONTROLLER_ROLE,
                    &PatchParams::apply("banlieue-test").force(),
                    &Patch::Apply(&role),
                )
                .await?;
        }
        let shipped = banlieue_testenv::repo_path("deploy/rbac/controller-clusterrole.yaml");
        if shipped.is_file() {
            cp.apply_yaml(&shipped).await?;
            return Ok::<(), Box<dyn std::error::Error + Send + Sync>>(());
        }
        let roles: Api<ClusterRole> = Api::all(admin.clone());
        let role: ClusterRole = serde_json::from_value(controller_rules())?;
        roles
            .patch(
                CONTROLLER_ROLE,
                &PatchParams::apply("banlieue-test").force(),
                &Patch::Apply(&role),
            )
            .await?;
        Ok(())
    })
    .await?;
    Ok(())
}

/// What the controller needs, and nothing more. Claims: read, patch, status and finalizers,
/// and delete (an expired claim is deleted); never create, never update. Machines: those of
/// the kind under test.
pub fn controller_rules() -> serde_json::Value {
    let machines = backend().resource().plural;
    json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": CONTROLLER_ROLE},
        "rules": [
            {"apiGroups": ["banlieue.io"], "resources": ["virtualmachineclaims"],
             "verbs": ["get", "list", "watch", "patch", "delete"]},
            {"apiGroups": ["banlieue.io"], "resources": ["virtualmachineclaims/status", "virtualmachineclaims/finalizers"],
             "verbs": ["patch"]},
            {"apiGroups": ["banlieue.io"], "resources": ["virtualmachines", machines],
             "verbs": ["get", "list", "watch", "create", "patch", "delete"]},
            {"apiGroups": ["banlieue.io"], "resources": ["virtualmachines/status", "virtualmachinepools/status"],
             "verbs": ["get", "patch"]},
            {"apiGroups": ["banlieue.io"], "resources": ["virtualmachines/finalizers", "virtualmachinepools/finalizers"],
             "verbs": ["update", "patch"]},
            {"apiGroups": ["banlieue.io"], "resources": ["virtualmachinepools"],
             "verbs": ["get", "list", "watch", "patch"]},
            {"apiGroups": ["banlieue.io"], "resources": ["providers", "providerclasses", "vmimages", "vmclasses"],
             "verbs": ["get", "list", "watch"]},
            {"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch"]},
        ]
    })
}

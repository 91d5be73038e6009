//! The Provider operator and the workload's status loop against a real control plane and a
//! real libvirtd, each running as its own ServiceAccount under the shipped RBAC (ADR-0063):
//! readiness, the narrowed failure domain, every failure reason of the guide, the per-Provider
//! workload (ADR-0012) with drift repair, and deletion waiting for machines.

mod common;

use std::time::Duration;

use anyhow::Result;
use banlieue_api::backend::{BackendWorkload, ClassRoleScope};
use banlieue_api::conditions::{self, Condition};
use banlieue_api::{Provider, ProviderClass};
use banlieue_operator::{OperatorConfig, run_operator, workloads};
use banlieue_provider_libvirt::provider_status::{StatusConfig, run_status};
use banlieue_testenv::control_plane::ControlPlane;
use banlieue_testenv::poll;
use common::{Host, control_plane, controller_identity, credentials, provider, provider_class};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Secret, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRoleBinding, Role, RoleBinding};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, PostParams};
use tokio::sync::oneshot;

/// Runs the operator for `ns`, as the controller's ServiceAccount, until the returned sender
/// is dropped, with the workloads of the backends the binary ships.
fn start_operator(controller: &kube::Client, ns: &str) -> oneshot::Sender<()> {
    start_operator_with(
        controller,
        ns,
        vec![
            banlieue_provider_libvirt::backend::descriptor().workload,
            banlieue_api::vsphere::workload(),
        ],
    )
}

/// [`start_operator`] with the workloads of `backends`.
fn start_operator_with(
    controller: &kube::Client,
    ns: &str,
    backends: Vec<BackendWorkload>,
) -> oneshot::Sender<()> {
    let (tx, rx) = oneshot::channel::<()>();
    let cfg = OperatorConfig {
        resync: Duration::from_secs(3),
        deletion_poll: Duration::from_secs(1),
        namespace: Some(ns.to_owned()),
        backends,
    };
    let kube = controller.clone();
    tokio::spawn(async move {
        let _ = run_operator(kube, cfg, async move {
            let _ = rx.await;
        })
        .await;
    });
    tx
}

/// Runs the status loop of `provider`'s workload as the ServiceAccount the operator made for
/// it, once that account exists, until the returned sender is dropped.
async fn start_workload(
    cp: &ControlPlane,
    ns: &str,
    provider: &str,
) -> Result<oneshot::Sender<()>> {
    let wl = workloads::workload_name(provider);
    let accounts: Api<ServiceAccount> = Api::namespaced(cp.client()?, ns);
    poll::until(
        "the workload's ServiceAccount",
        Duration::from_secs(30),
        || async { Ok(accounts.get_opt(&wl).await?) },
    )
    .await?;
    let client = cp.client_as_service_account(ns, &wl).await?;
    let (tx, rx) = oneshot::channel::<()>();
    let mut cfg = StatusConfig::new(provider, ns);
    cfg.probe_interval = Duration::from_secs(3);
    cfg.call_timeout = Duration::from_secs(10);
    tokio::spawn(async move {
        let _ = run_status(client, cfg, async move {
            let _ = rx.await;
        })
        .await;
    });
    Ok(tx)
}

/// A ProviderClass with a unique name and no additionalRules, so no class role is needed.
async fn plain_class(kube: &kube::Client) -> Result<ProviderClass> {
    let class = provider_class(kube).await?;
    Ok(Api::<ProviderClass>::all(kube.clone())
        .patch(
            &class.name_any(),
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(serde_json::json!({ "spec": { "additionalRules": [] } })),
        )
        .await?)
}

/// Waits until the Provider's Ready condition satisfies `check`, and returns the Provider.
async fn wait_ready(
    api: &Api<Provider>,
    name: &str,
    what: &str,
    check: impl Fn(&Condition) -> bool,
) -> Result<Provider> {
    Ok(poll::until(what, Duration::from_secs(60), || async {
        let p = api.get(name).await?;
        let ok = p
            .status
            .as_ref()
            .and_then(|s| conditions::find(&s.conditions, "Ready"))
            .is_some_and(&check);
        Ok(ok.then_some(p))
    })
    .await?)
}

fn ready_of(p: &Provider) -> Condition {
    p.status
        .as_ref()
        .and_then(|s| conditions::find(&s.conditions, "Ready"))
        .cloned()
        .expect("a Ready condition")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn good_provider_is_ready_with_one_failure_domain_and_owns_its_workload() -> Result<()> {
    let cp = control_plane().await;
    let kube = cp.client()?;
    let ns = cp.fresh_namespace().await?;
    let host = Host::start().await?;
    credentials(&kube, &ns, &host).await?;
    let class = plain_class(&kube).await?;
    let controller = controller_identity(cp, &ns).await?;
    let _operator = start_operator(&controller, &ns);
    let api: Api<Provider> = Api::namespaced(kube.clone(), &ns);
    api.create(
        &PostParams::default(),
        &provider(
            "edge-7",
            &class.name_any(),
            &host.libvirtd.tls_uri(),
            host.capabilities(),
        ),
    )
    .await?;
    let _workload = start_workload(cp, &ns, "edge-7").await?;

    let p = wait_ready(&api, "edge-7", "Provider Ready", |c| c.status == "True").await?;
    assert_eq!(ready_of(&p).reason, "Connected");
    let status = p.status.clone().unwrap();
    assert_eq!(status.failure_domains.len(), 1);
    let fd = &status.failure_domains[0];
    let hostname = host.libvirtd.virsh(["hostname"]).await?;
    assert_eq!(fd.name, hostname.trim());
    assert_eq!(fd.storage_classes, host.capabilities().storage_classes);
    assert_eq!(fd.network_classes, host.capabilities().network_classes);
    assert_eq!(fd.features, vec!["vtpm".to_owned()]);
    // The host's size as libvirt reports it, read independently with virsh.
    let nodeinfo = host.libvirtd.virsh(["nodeinfo"]).await?;
    let field = |name: &str| -> u64 {
        nodeinfo
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
            .unwrap_or_else(|| panic!("{name} in {nodeinfo}"))
    };
    let capacity = fd
        .capacity
        .clone()
        .expect("the provider publishes the host's capacity");
    assert_eq!(capacity.memory_bytes, field("Memory size:") * 1024);
    assert_eq!(u64::from(capacity.cpus), field("CPU(s):"));

    // The transition was recorded as an Event on the Provider.
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(kube.clone(), &ns);
    poll::until(
        "a Connected event on the Provider",
        Duration::from_secs(30),
        || async {
            let list = events.list(&Default::default()).await?;
            Ok(list
                .items
                .iter()
                .any(|e| {
                    e.reason.as_deref() == Some("Connected")
                        && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("edge-7")
                })
                .then_some(()))
        },
    )
    .await?;

    // ADR-0012: the workload, owned by the Provider.
    let uid = p.uid().unwrap();
    let wl = workloads::workload_name("edge-7");
    let owned_by_provider =
        |refs: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference]| {
            refs.iter()
                .any(|r| r.kind == "Provider" && r.uid == uid && r.controller == Some(true))
        };
    let deployments: Api<Deployment> = Api::namespaced(kube.clone(), &ns);
    let deployment = poll::until("Deployment", Duration::from_secs(30), || async {
        Ok(deployments.get_opt(&wl).await?)
    })
    .await?;
    assert!(owned_by_provider(deployment.owner_references()));
    let pod = deployment.spec.template.spec.clone().unwrap();
    assert_eq!(pod.service_account_name.as_deref(), Some(wl.as_str()));
    let args = pod.containers[0].args.clone().unwrap();
    assert_eq!(
        args[args.len() - 7..],
        [
            "provider",
            "libvirt",
            "run",
            "--provider",
            "edge-7",
            "--namespace",
            ns.as_str()
        ]
    );
    assert_eq!(pod.containers[0].image.as_deref(), Some("banlieue:test"));

    let sa = Api::<ServiceAccount>::namespaced(kube.clone(), &ns)
        .get(&wl)
        .await?;
    assert!(owned_by_provider(sa.owner_references()));
    // Its only own Role names its Provider; everything else binds the shipped roles.
    let roles: Api<Role> = Api::namespaced(kube.clone(), &ns);
    let role = roles.get(&wl).await?;
    assert!(owned_by_provider(role.owner_references()));
    assert_eq!(
        role.rules.clone().unwrap(),
        workloads::own_provider_rules(&p, &[])
    );
    let bindings = Api::<RoleBinding>::namespaced(kube.clone(), &ns);
    let mut bound = Vec::new();
    for b in bindings.list(&Default::default()).await?.items {
        if owned_by_provider(b.owner_references()) {
            bound.push(b.role_ref.name.clone());
        }
    }
    bound.sort();
    assert_eq!(
        bound,
        [
            "banlieue-import".to_owned(),
            workloads::import_role_name("edge-7"),
            "banlieue-provider-base".to_owned(),
            wl.clone()
        ]
    );
    let crbs: Api<ClusterRoleBinding> = Api::all(kube.clone());
    let is_ours = |s: &k8s_openapi::api::rbac::v1::Subject| {
        s.name == wl && s.namespace.as_deref() == Some(ns.as_str())
    };
    let joined = || async {
        let shared = crbs.get(workloads::PROVIDERS_CLUSTER_BINDING).await?;
        assert_eq!(shared.role_ref.name, workloads::PROVIDER_CLUSTER_ROLE);
        anyhow::Ok(shared.subjects.unwrap_or_default().iter().any(is_ours))
    };
    assert!(
        joined().await?,
        "the workload's account is not a subject of {}",
        workloads::PROVIDERS_CLUSTER_BINDING
    );
    // The import Jobs' account is the Provider's own, in the build namespace: no other
    // Provider's import pods hold its namespace's reads.
    let build_accounts = Api::<ServiceAccount>::namespaced(kube.clone(), "banlieue-imagebuild");
    let own_import = workloads::import_account_name(&ns, "edge-7");
    poll::until(
        "the Provider's import ServiceAccount",
        Duration::from_secs(30),
        || async { Ok(build_accounts.get_opt(&own_import).await?) },
    )
    .await?;
    let import_binding = bindings
        .get(&workloads::import_binding_name("edge-7"))
        .await?;
    assert_eq!(
        import_binding
            .subjects
            .unwrap_or_default()
            .iter()
            .map(|s| (s.name.as_str(), s.namespace.as_deref()))
            .collect::<Vec<_>>(),
        [(own_import.as_str(), Some("banlieue-imagebuild"))]
    );

    // The workload's account really holds its grants, and no more.
    let as_provider = cp.client_as_service_account(&ns, &wl).await?;
    Api::<banlieue_api::LibvirtMachine>::namespaced(as_provider.clone(), &ns)
        .list(&Default::default())
        .await?;
    Api::<banlieue_api::VMImage>::namespaced(as_provider.clone(), &ns)
        .list(&Default::default())
        .await?;
    // The shared cluster binding's one right.
    Api::<ProviderClass>::all(as_provider.clone())
        .get(&class.name_any())
        .await?;
    let refused = Api::<Secret>::namespaced(as_provider.clone(), &ns)
        .list(&Default::default())
        .await
        .expect_err("a provider never lists Secrets");
    assert!(
        matches!(refused, kube::Error::Api(ref s) if s.code == 403),
        "{refused}"
    );
    let refused = Api::<Provider>::namespaced(as_provider.clone(), &ns)
        .list(&Default::default())
        .await
        .expect_err("a provider reads only its own Provider");
    assert!(
        matches!(refused, kube::Error::Api(ref s) if s.code == 403),
        "{refused}"
    );
    secrets_by_name(&kube, &as_provider, &ns).await?;

    // Drift: objects deleted by hand come back.
    deployments.delete(&wl, &DeleteParams::default()).await?;
    roles.delete(&wl, &DeleteParams::default()).await?;
    // An edit of the shared binding that drops this account (what an administrator's
    // `kubectl apply` of a subjects list would do).
    let mut shared = crbs.get(workloads::PROVIDERS_CLUSTER_BINDING).await?;
    shared.subjects = Some(
        shared
            .subjects
            .unwrap_or_default()
            .into_iter()
            .filter(|s| !is_ours(s))
            .collect(),
    );
    crbs.replace(
        workloads::PROVIDERS_CLUSTER_BINDING,
        &PostParams::default(),
        &shared,
    )
    .await?;
    let old_uid = deployment.uid();
    poll::until("Deployment re-created", Duration::from_secs(60), || async {
        Ok(deployments
            .get_opt(&wl)
            .await?
            .filter(|d| d.uid() != old_uid)
            .map(|_| ()))
    })
    .await?;
    poll::until("Role re-created", Duration::from_secs(60), || async {
        Ok(roles.get_opt(&wl).await?)
    })
    .await?;
    poll::until(
        "the account back in the shared binding",
        Duration::from_secs(60),
        || async { Ok(joined().await?.then_some(())) },
    )
    .await?;

    // Deleting the Provider removes its account and its import account through the
    // finalizer.
    api.delete("edge-7", &DeleteParams::default()).await?;
    poll::until(
        "Provider gone and its accounts out",
        Duration::from_secs(60),
        || async {
            let gone = api.get_opt("edge-7").await?.is_none()
                && !joined().await?
                && build_accounts.get_opt(&own_import).await?.is_none();
            Ok(gone.then_some(()))
        },
    )
    .await?;
    Api::<ProviderClass>::all(kube)
        .delete(&class.name_any(), &DeleteParams::default())
        .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn absent_pool_and_network_are_named_and_dropped() -> Result<()> {
    let cp = control_plane().await;
    let kube = cp.client()?;
    let ns = cp.fresh_namespace().await?;
    let host = Host::start().await?;
    credentials(&kube, &ns, &host).await?;
    let class = plain_class(&kube).await?;
    let controller = controller_identity(cp, &ns).await?;
    let _operator = start_operator(&controller, &ns);
    let mut caps = host.capabilities();
    caps.storage_classes
        .push(banlieue_api::StorageClassMapping {
            name: "gold".into(),
            target: banlieue_api::StorageTarget {
                pool: "nvme-pool".into(),
            },
        });
    caps.network_classes
        .push(banlieue_api::NetworkClassMapping {
            name: "prod".into(),
            target: banlieue_api::NetworkTarget {
                network: "br-prod".into(),
            },
        });
    let api: Api<Provider> = Api::namespaced(kube.clone(), &ns);
    api.create(
        &PostParams::default(),
        &provider("edge-8", &class.name_any(), &host.libvirtd.tls_uri(), caps),
    )
    .await?;
    let _workload = start_workload(cp, &ns, "edge-8").await?;
    let p = wait_ready(&api, "edge-8", "CapabilitiesIncomplete", |c| {
        c.reason == "CapabilitiesIncomplete"
    })
    .await?;
    let ready = ready_of(&p);
    assert_eq!(ready.status, "False");
    assert!(ready.message.contains("\"nvme-pool\""), "{}", ready.message);
    assert!(ready.message.contains("\"br-prod\""), "{}", ready.message);
    assert!(!ready.message.contains(&host.pool), "{}", ready.message);
    let fds = p.status.unwrap().failure_domains;
    assert_eq!(fds.len(), 1);
    assert_eq!(fds[0].storage_classes, host.capabilities().storage_classes);
    assert_eq!(fds[0].network_classes, host.capabilities().network_classes);
    cleanup(&kube, &api, "edge-8", &class).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_carry_the_guides_reasons() -> Result<()> {
    let cp = control_plane().await;
    let kube = cp.client()?;
    let ns = cp.fresh_namespace().await?;
    let host = Host::start().await?;
    credentials(&kube, &ns, &host).await?;
    let class = plain_class(&kube).await?;
    let controller = controller_identity(cp, &ns).await?;
    let _operator = start_operator(&controller, &ns);
    let api: Api<Provider> = Api::namespaced(kube.clone(), &ns);
    let uri = host.libvirtd.tls_uri();

    // qemu+ssh: rejected at reconcile with the guide's exact message.
    let ssh = uri.replace("qemu+tls", "qemu+ssh");
    api.create(
        &PostParams::default(),
        &provider("ssh", &class.name_any(), &ssh, host.capabilities()),
    )
    .await?;
    let _ssh_workload = start_workload(cp, &ns, "ssh").await?;
    let p = wait_ready(&api, "ssh", "UnsupportedScheme", |c| {
        c.reason == "UnsupportedScheme"
    })
    .await?;
    assert_eq!(ready_of(&p).message, "scheme \"qemu+ssh\" is not supported");
    assert!(p.status.unwrap().failure_domains.is_empty());

    // A Secret without tls.key.
    let secrets: Api<Secret> = Api::namespaced(kube.clone(), &ns);
    let mut partial = secrets.get("libvirt-creds").await?;
    partial.metadata = k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
        name: Some("no-key".into()),
        ..Default::default()
    };
    partial.data.as_mut().unwrap().remove("tls.key");
    // An Opaque Secret: the API server itself refuses a kubernetes.io/tls one without the key.
    partial.type_ = Some("Opaque".into());
    secrets.create(&PostParams::default(), &partial).await?;
    let mut p = provider("nokey", &class.name_any(), &uri, host.capabilities());
    p.spec.connection.credentials_ref.name = "no-key".into();
    api.create(&PostParams::default(), &p).await?;
    let _nokey_workload = start_workload(cp, &ns, "nokey").await?;
    let p = wait_ready(&api, "nokey", "CredentialsUnavailable", |c| {
        c.reason == "CredentialsUnavailable"
    })
    .await?;
    assert!(
        ready_of(&p).message.contains("tls.key"),
        "{}",
        ready_of(&p).message
    );

    // A CA ConfigMap that does not exist.
    let mut p = provider("noca", &class.name_any(), &uri, host.capabilities());
    p.spec
        .connection
        .ca_bundle
        .config_map_ref
        .as_mut()
        .unwrap()
        .name = "absent-ca".into();
    api.create(&PostParams::default(), &p).await?;
    let _noca_workload = start_workload(cp, &ns, "noca").await?;
    let p = wait_ready(&api, "noca", "CredentialsUnavailable (CA)", |c| {
        c.reason == "CredentialsUnavailable"
    })
    .await?;
    assert!(
        ready_of(&p).message.contains("absent-ca"),
        "{}",
        ready_of(&p).message
    );

    // A CA that did not sign the server's certificate (the client certificate itself).
    let mut p = provider("wrongca", &class.name_any(), &uri, host.capabilities());
    p.spec.connection.ca_bundle = banlieue_api::ValueOrSource {
        inline: Some(std::fs::read_to_string(host.libvirtd.client_cert_path())?),
        ..Default::default()
    };
    api.create(&PostParams::default(), &p).await?;
    let _wrongca_workload = start_workload(cp, &ns, "wrongca").await?;
    let p = wait_ready(&api, "wrongca", "ConnectFailed", |c| {
        c.reason == "ConnectFailed"
    })
    .await?;
    let message = ready_of(&p).message;
    assert!(
        message.contains("TLS handshake"),
        "the underlying error is kept: {message}"
    );
    assert!(p.status.unwrap().failure_domains.is_empty());

    for name in ["ssh", "nokey", "noca", "wrongca"] {
        api.delete(name, &DeleteParams::default()).await?;
    }
    Api::<ProviderClass>::all(kube)
        .delete(&class.name_any(), &DeleteParams::default())
        .await?;
    Ok(())
}

async fn cleanup(
    kube: &kube::Client,
    api: &Api<Provider>,
    name: &str,
    class: &ProviderClass,
) -> Result<()> {
    api.delete(name, &DeleteParams::default()).await?;
    poll::until("Provider gone", Duration::from_secs(60), || async {
        Ok(api.get_opt(name).await?.is_none().then_some(()))
    })
    .await?;
    Api::<ProviderClass>::all(kube.clone())
        .delete(&class.name_any(), &DeleteParams::default())
        .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_class_whose_role_is_missing_runs_nothing_and_says_why() -> Result<()> {
    let cp = control_plane().await;
    let kube = cp.client()?;
    let ns = cp.fresh_namespace().await?;
    // additionalRules (jobs) but no ClusterRole banlieue-provider-class-<class> granting them.
    let class = provider_class(&kube).await?;
    let controller = controller_identity(cp, &ns).await?;
    let _operator = start_operator(&controller, &ns);
    let api: Api<Provider> = Api::namespaced(kube.clone(), &ns);
    let caps = banlieue_api::ProviderCapabilities::default();
    api.create(
        &PostParams::default(),
        &provider(
            "edge-9",
            &class.name_any(),
            "qemu+tls://127.0.0.1:1/system",
            caps,
        ),
    )
    .await?;
    let p = wait_ready(&api, "edge-9", "ProviderClassRoleMissing", |c| {
        c.reason == "ProviderClassRoleMissing"
    })
    .await?;
    let role = workloads::class_role_name(&class.name_any());
    assert!(
        ready_of(&p).message.contains(&role),
        "{}",
        ready_of(&p).message
    );
    let deployments: Api<Deployment> = Api::namespaced(kube.clone(), &ns);
    assert!(
        deployments
            .get_opt(&workloads::workload_name("edge-9"))
            .await?
            .is_none()
    );

    // A role that exists but does not cover the rules: named, verb by verb.
    let partial: k8s_openapi::api::rbac::v1::ClusterRole =
        serde_json::from_value(serde_json::json!({
            "metadata": { "name": role },
            "rules": [{ "apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["get"] }]
        }))?;
    let cluster_roles = Api::<k8s_openapi::api::rbac::v1::ClusterRole>::all(kube.clone());
    cluster_roles
        .create(&PostParams::default(), &partial)
        .await?;
    let p = wait_ready(&api, "edge-9", "the missing verbs", |c| {
        c.message.contains("create batch/jobs")
    })
    .await?;
    assert!(!ready_of(&p).message.contains("get batch/jobs"));

    // Covered, but the shipped grant lets the operator bind only the libvirt class's role:
    // it says so rather than asking for `escalate`.
    cluster_roles
        .patch(
            &role,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(serde_json::json!({ "rules": [{
                "apiGroups": ["batch"], "resources": ["jobs"],
                "verbs": ["create", "get", "list", "watch"] }] })),
        )
        .await?;
    let p = wait_ready(&api, "edge-9", "bind refused", |c| {
        c.message.contains("may not bind")
    })
    .await?;
    assert_eq!(ready_of(&p).reason, "ProviderClassRoleMissing");
    cluster_roles
        .delete(&role, &DeleteParams::default())
        .await?;
    cleanup(&kube, &api, "edge-9", &class).await
}

/// A class may name any kind (ADR-0071); one no provider of this build runs gets no workload,
/// and the Provider says which kind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_class_of_a_kind_no_provider_runs_runs_nothing_and_says_why() -> Result<()> {
    let cp = control_plane().await;
    let kube = cp.client()?;
    let ns = cp.fresh_namespace().await?;
    let class = plain_class(&kube).await?;
    let class = Api::<ProviderClass>::all(kube.clone())
        .patch(
            &class.name_any(),
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(serde_json::json!({"spec": {"machineKind": "MemoryMachine"}})),
        )
        .await?;
    let controller = controller_identity(cp, &ns).await?;
    let _operator = start_operator(&controller, &ns);
    let api: Api<Provider> = Api::namespaced(kube.clone(), &ns);
    let caps = banlieue_api::ProviderCapabilities::default();
    api.create(
        &PostParams::default(),
        &provider("edge-10", &class.name_any(), "memory://127.0.0.1", caps),
    )
    .await?;
    let p = wait_ready(&api, "edge-10", "UnsupportedMachineKind", |c| {
        c.reason == banlieue_provider_kit::reasons::UNSUPPORTED_MACHINE_KIND
    })
    .await?;
    assert!(
        ready_of(&p)
            .message
            .contains("realises MemoryMachine machines"),
        "{}",
        ready_of(&p).message
    );
    let deployments: Api<Deployment> = Api::namespaced(kube.clone(), &ns);
    assert!(
        deployments
            .get_opt(&workloads::workload_name("edge-10"))
            .await?
            .is_none()
    );
    cleanup(&kube, &api, "edge-10", &class).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_provider_waits_for_its_machines() -> Result<()> {
    let cp = control_plane().await;
    let kube = cp.client()?;
    let ns = cp.fresh_namespace().await?;
    let class = plain_class(&kube).await?;
    let controller = controller_identity(cp, &ns).await?;
    let _operator = start_operator(&controller, &ns);
    let api: Api<Provider> = Api::namespaced(kube.clone(), &ns);
    let caps = banlieue_api::ProviderCapabilities::default();
    api.create(
        &PostParams::default(),
        &provider(
            "edge-10",
            &class.name_any(),
            "qemu+tls://127.0.0.1:1/system",
            caps,
        ),
    )
    .await?;
    poll::until(
        "the operator's finalizer",
        Duration::from_secs(30),
        || async {
            Ok(api
                .get("edge-10")
                .await?
                .finalizers()
                .iter()
                .any(|f| f == "banlieue.io/provider-workloads")
                .then_some(()))
        },
    )
    .await?;
    // A machine on this Provider, as the controller would create it.
    let machines: Api<banlieue_api::LibvirtMachine> = Api::namespaced(kube.clone(), &ns);
    let machine: banlieue_api::LibvirtMachine = serde_json::from_value(serde_json::json!({
        "apiVersion": "banlieue.io/v1alpha1", "kind": "LibvirtMachine",
        "metadata": { "name": "m-1" },
        "spec": { "providerRef": { "name": "edge-10" }, "pool": "default", "network": "default",
                  "disk": { "backingVolume": "base.qcow2", "size": "10Gi" }, "cpu": 1, "memory": "1Gi" }
    }))?;
    machines.create(&PostParams::default(), &machine).await?;
    // The workload exists before the Provider is deleted (a Provider deleted first never gets
    // one, and then there is nothing to keep).
    let deployments: Api<Deployment> = Api::namespaced(kube.clone(), &ns);
    poll::until(
        "the Provider's workload Deployment",
        Duration::from_secs(30),
        || async {
            Ok(deployments
                .get_opt(&workloads::workload_name("edge-10"))
                .await?
                .map(|_| ()))
        },
    )
    .await?;

    api.delete("edge-10", &DeleteParams::default()).await?;
    let p = wait_ready(&api, "edge-10", "MachinesRemain", |c| {
        c.reason == "MachinesRemain"
    })
    .await?;
    assert!(ready_of(&p).message.contains("1 LibvirtMachine(s)"));
    assert!(ready_of(&p).message.contains("m-1"));
    // Its workload is still there to tear the machines down.
    assert!(
        deployments
            .get_opt(&workloads::workload_name("edge-10"))
            .await?
            .is_some()
    );

    machines.delete("m-1", &DeleteParams::default()).await?;
    poll::until(
        "Provider gone once its machines are",
        Duration::from_secs(60),
        || async { Ok(api.get_opt("edge-10").await?.is_none().then_some(())) },
    )
    .await?;
    Api::<ProviderClass>::all(kube)
        .delete(&class.name_any(), &DeleteParams::default())
        .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vsphere_provider_runs_its_provider_beside_its_class_role_and_waits_for_its_machines()
-> Result<()> {
    let cp = control_plane().await;
    let kube = cp.client()?;
    let ns = cp.fresh_namespace().await?;
    let controller = controller_identity(cp, &ns).await?;
    // The shipped class, whose role (deploy/rbac/provider-class-vsphere-clusterrole.yaml) the
    // controller may bind: it has no additionalRules, its role holds its machine rights.
    let class: ProviderClass = serde_json::from_value(serde_json::json!({
        "apiVersion": "banlieue.io/v1alpha1", "kind": "ProviderClass",
        "metadata": { "name": "vsphere" },
        "spec": { "image": "banlieue:test", "machineKind": "VSphereMachine" }
    }))?;
    let classes = Api::<ProviderClass>::all(kube.clone());
    classes
        .patch(
            "vsphere",
            &kube::api::PatchParams::apply("test").force(),
            &kube::api::Patch::Apply(&class),
        )
        .await?;
    let _operator = start_operator(&controller, &ns);
    let api: Api<Provider> = Api::namespaced(kube.clone(), &ns);
    api.create(
        &PostParams::default(),
        &provider(
            "vc-1",
            "vsphere",
            "https://127.0.0.1:1/sdk",
            banlieue_api::ProviderCapabilities::default(),
        ),
    )
    .await?;
    let deployments: Api<Deployment> = Api::namespaced(kube.clone(), &ns);
    let wl = workloads::workload_name("vc-1");
    let deployment = poll::until("the vSphere workload", Duration::from_secs(30), || async {
        Ok(deployments.get_opt(&wl).await?)
    })
    .await?;
    let args = container_args(deployment);
    assert_eq!(
        args,
        [
            "provider",
            "vsphere",
            "run",
            "--provider",
            "vc-1",
            "--namespace",
            ns.as_str()
        ]
    );
    // Applied before the Deployment, in the Provider's namespace, owned by the Provider.
    let binding = Api::<RoleBinding>::namespaced(kube.clone(), &ns)
        .get(&format!("{wl}-class"))
        .await?;
    assert_eq!(binding.role_ref.name, "banlieue-provider-class-vsphere");
    assert_eq!(
        binding.owner_references().first().map(|o| o.kind.as_str()),
        Some("Provider")
    );

    // Deletion waits for the Provider's VSphereMachines, as the controller would create them.
    let machines: Api<banlieue_api::VSphereMachine> = Api::namespaced(kube.clone(), &ns);
    let machine: banlieue_api::VSphereMachine = serde_json::from_value(serde_json::json!({
        "apiVersion": "banlieue.io/v1alpha1", "kind": "VSphereMachine",
        "metadata": { "name": "vm-1" },
        "spec": { "providerRef": { "name": "vc-1" }, "datacenter": "DC0", "cluster": "DC0_C0",
                  "template": "DC0/vm/t", "cpu": 1, "memory": "1Gi" }
    }))?;
    machines.create(&PostParams::default(), &machine).await?;
    deletion_waits_for_its_machine(&api, "vc-1", &machines, "vm-1", "VSphereMachine").await?;
    classes.delete("vsphere", &DeleteParams::default()).await?;
    Ok(())
}

/// The arguments of the first container of `deployment`.
fn container_args(deployment: Deployment) -> Vec<String> {
    deployment
        .spec
        .template
        .spec
        .and_then(|pod| pod.containers.into_iter().next())
        .and_then(|container| container.args)
        .unwrap_or_default()
}

/// Deletes `provider`, which has one machine, `machine` of `kind`: its Ready condition says the
/// deletion waits for that machine, and the Provider goes once the machine does.
async fn deletion_waits_for_its_machine<K>(
    api: &Api<Provider>,
    provider: &str,
    machines: &Api<K>,
    machine: &str,
    kind: &str,
) -> Result<()>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    api.delete(provider, &DeleteParams::default()).await?;
    let p = wait_ready(api, provider, "MachinesRemain", |c| {
        c.reason == "MachinesRemain"
    })
    .await?;
    assert!(
        ready_of(&p).message.contains(&format!("1 {kind}(s)")),
        "{}",
        ready_of(&p).message
    );
    machines.delete(machine, &DeleteParams::default()).await?;
    poll::until(
        "Provider gone once its machines are",
        Duration::from_secs(60),
        || async { Ok(api.get_opt(provider).await?.is_none().then_some(())) },
    )
    .await?;
    Ok(())
}

/// A test-only machine kind, as a third backend's descriptor would give the operator: its CRD
/// in a group of its own and its workload, whose class role (bound beside the Provider) holds
/// the provider's rights on its machines.
mod third_kind {
    use super::*;

    pub const GROUP: &str = "test.banlieue.io";
    pub const PLURAL: &str = "memorymachines";
    pub const CLASS: &str = "memory";

    pub fn workload() -> BackendWorkload {
        let rule = |resources: &[&str], verbs: &[&str]| k8s_openapi::api::rbac::v1::PolicyRule {
            api_groups: Some(vec![GROUP.to_owned()]),
            resources: Some(resources.iter().map(|r| (*r).to_owned()).collect()),
            verbs: verbs.iter().map(|v| (*v).to_owned()).collect(),
            ..Default::default()
        };
        BackendWorkload {
            kind: banlieue_api::MachineKind::new("MemoryMachine").expect("a kind name"),
            subcommand: "memory",
            class_role: ClassRoleScope::ProviderNamespace,
            class_role_rules: vec![
                rule(&[PLURAL], &["get", "list", "watch", "patch"]),
                rule(
                    &["memorymachines/status", "memorymachines/finalizers"],
                    &["patch"],
                ),
            ],
            machines: kube::api::ApiResource {
                group: GROUP.into(),
                version: "v1alpha1".into(),
                api_version: format!("{GROUP}/v1alpha1"),
                kind: "MemoryMachine".into(),
                plural: PLURAL.into(),
            },
        }
    }

    /// What an administrator adding the backend installs: its CRD, its class and the class's
    /// role, and the controller's right to bind that role and to list the machines its
    /// Providers' deletion waits for.
    pub async fn install(kube: &kube::Client) -> Result<()> {
        let apply = kube::api::PatchParams::apply("test").force();
        let crd: k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition =
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": format!("{PLURAL}.{GROUP}")},
                "spec": {"group": GROUP, "scope": "Namespaced",
                         "names": {"kind": "MemoryMachine", "plural": PLURAL,
                                   "singular": "memorymachine", "listKind": "MemoryMachineList"},
                         "versions": [{"name": "v1alpha1", "served": true, "storage": true,
                                       "subresources": {"status": {}},
                                       "schema": {"openAPIV3Schema": {"type": "object",
                                           "x-kubernetes-preserve-unknown-fields": true}}}]}
            }))?;
        banlieue_testenv::control_plane::apply_crds(kube, vec![crd]).await?;
        let role_name = workloads::class_role_name(CLASS);
        let class_role: k8s_openapi::api::rbac::v1::ClusterRole =
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": role_name},
                "rules": workload().class_role_rules,
            }))?;
        let admin_grant: k8s_openapi::api::rbac::v1::ClusterRole =
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "banlieue-controller-memory"},
                "rules": [
                    {"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["clusterroles"],
                     "verbs": ["bind"], "resourceNames": [role_name]},
                    {"apiGroups": [GROUP], "resources": [PLURAL], "verbs": ["list"]},
                ],
            }))?;
        let roles = Api::<k8s_openapi::api::rbac::v1::ClusterRole>::all(kube.clone());
        for role in [&class_role, &admin_grant] {
            roles
                .patch(&role.name_any(), &apply, &kube::api::Patch::Apply(role))
                .await?;
        }
        let binding: ClusterRoleBinding = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "banlieue-controller-memory"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                        "name": "banlieue-controller-memory"},
            "subjects": [{"kind": "ServiceAccount", "name": common::CONTROLLER_SA,
                          "namespace": common::CONTROLLER_NS}],
        }))?;
        Api::<ClusterRoleBinding>::all(kube.clone())
            .patch(
                "banlieue-controller-memory",
                &apply,
                &kube::api::Patch::Apply(&binding),
            )
            .await?;
        let class: ProviderClass = serde_json::from_value(serde_json::json!({
            "apiVersion": "banlieue.io/v1alpha1", "kind": "ProviderClass",
            "metadata": {"name": CLASS},
            "spec": {"image": "banlieue:test", "machineKind": "MemoryMachine"}
        }))?;
        Api::<ProviderClass>::all(kube.clone())
            .patch(CLASS, &apply, &kube::api::Patch::Apply(&class))
            .await?;
        Ok(())
    }
}

/// The operator names no backend: a kind it is given beside the shipped ones runs its own
/// provider (`provider memory run`), with its class role bound where its workload says, and a
/// Provider of that kind is deleted only once its machines are.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_third_kind_in_the_operators_list_runs_its_own_provider() -> Result<()> {
    let cp = control_plane().await;
    let kube = cp.client()?;
    let ns = cp.fresh_namespace().await?;
    let controller = controller_identity(cp, &ns).await?;
    third_kind::install(&kube).await?;
    let _operator = start_operator_with(
        &controller,
        &ns,
        vec![
            banlieue_provider_libvirt::backend::descriptor().workload,
            third_kind::workload(),
        ],
    );
    let api: Api<Provider> = Api::namespaced(kube.clone(), &ns);
    api.create(
        &PostParams::default(),
        &provider(
            "mem-1",
            third_kind::CLASS,
            "memory://127.0.0.1",
            banlieue_api::ProviderCapabilities::default(),
        ),
    )
    .await?;
    let deployments: Api<Deployment> = Api::namespaced(kube.clone(), &ns);
    let wl = workloads::workload_name("mem-1");
    let deployment = poll::until(
        "the third kind's workload",
        Duration::from_secs(60),
        || async { Ok(deployments.get_opt(&wl).await?) },
    )
    .await?;
    let args = container_args(deployment);
    assert_eq!(
        args,
        [
            "provider",
            "memory",
            "run",
            "--provider",
            "mem-1",
            "--namespace",
            ns.as_str()
        ]
    );
    let binding = Api::<RoleBinding>::namespaced(kube.clone(), &ns)
        .get(&format!("{wl}-class"))
        .await?;
    assert_eq!(
        binding.role_ref.name,
        workloads::class_role_name(third_kind::CLASS)
    );

    let machines = Api::<kube::api::DynamicObject>::namespaced_with(
        kube.clone(),
        &ns,
        &third_kind::workload().machines,
    );
    let mut machine =
        kube::api::DynamicObject::new("mm-1", &third_kind::workload().machines).within(&ns);
    machine.data = serde_json::json!({"spec": {"providerRef": {"name": "mem-1"}}});
    machines.create(&PostParams::default(), &machine).await?;
    deletion_waits_for_its_machine(&api, "mem-1", &machines, "mm-1", "MemoryMachine").await
}

/// Provider `x-y` in namespace `<n>` and Provider `y` in namespace `<n>-x` once shared the
/// name of their ClusterRoleBinding (`banlieue-provider-<n>-x-y`): the operator force-applied
/// one over the other, and deleting either Provider deleted the binding of both. Now both
/// accounts are subjects of the one shared binding, each joins and leaves alone, and the
/// controller, which changes that binding, cannot delete or create any ClusterRoleBinding.
#[tokio::test]
async fn providers_whose_namespace_and_name_read_alike_keep_their_own_grants() -> Result<()> {
    let cp = control_plane().await;
    let kube = cp.client()?;
    let first = cp.fresh_namespace().await?;
    let second = format!("{first}-x");
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(kube.clone());
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(serde_json::json!({
                "metadata": { "name": second, "labels": { "banlieue.io/test": "true" } }
            }))?,
        )
        .await?;
    let class = plain_class(&kube).await?;
    let crbs: Api<ClusterRoleBinding> = Api::all(kube.clone());

    let mut operators = Vec::new();
    let mut controller = None;
    for (ns, name) in [(&first, "x-y"), (&second, "y")] {
        let identity = controller_identity(cp, ns).await?;
        operators.push(start_operator(&identity, ns));
        controller = Some(identity);
        Api::<Provider>::namespaced(kube.clone(), ns)
            .create(
                &PostParams::default(),
                &provider(
                    name,
                    &class.name_any(),
                    "qemu+tls://127.0.0.1:1/system",
                    Default::default(),
                ),
            )
            .await?;
    }
    let account = |ns: &str, name: &str| (workloads::workload_name(name), ns.to_owned());
    let ours = account(&first, "x-y");
    let theirs = account(&second, "y");
    let members = || async {
        let shared = crbs.get(workloads::PROVIDERS_CLUSTER_BINDING).await?;
        assert_eq!(shared.role_ref.name, workloads::PROVIDER_CLUSTER_ROLE);
        anyhow::Ok(
            shared
                .subjects
                .unwrap_or_default()
                .into_iter()
                .map(|s| (s.name, s.namespace.unwrap_or_default()))
                .collect::<Vec<_>>(),
        )
    };
    poll::until(
        "both accounts in the shared binding",
        Duration::from_secs(60),
        || async {
            let now = members().await?;
            Ok((now.contains(&ours) && now.contains(&theirs)).then_some(()))
        },
    )
    .await?;

    // The controller's rights end at that one binding.
    let controller = controller.expect("an identity");
    let as_controller: Api<ClusterRoleBinding> = Api::all(controller);
    let refused = as_controller
        .delete("banlieue-controller", &DeleteParams::default())
        .await
        .expect_err("the controller deleted another ClusterRoleBinding");
    assert!(
        matches!(&refused, kube::Error::Api(s) if s.code == 403),
        "{refused}"
    );
    let mut copy = crbs.get(workloads::PROVIDERS_CLUSTER_BINDING).await?;
    copy.metadata = kube::api::ObjectMeta {
        name: Some(format!("banlieue-test-{first}")),
        ..Default::default()
    };
    let refused = as_controller
        .create(&PostParams::default(), &copy)
        .await
        .expect_err("the controller created a ClusterRoleBinding");
    assert!(
        matches!(&refused, kube::Error::Api(s) if s.code == 403),
        "{refused}"
    );

    // Deleting `y` removes its account and nothing of `x-y`'s.
    let second_providers: Api<Provider> = Api::namespaced(kube.clone(), &second);
    second_providers
        .delete("y", &DeleteParams::default())
        .await?;
    poll::until("Provider y gone", Duration::from_secs(60), || async {
        Ok(second_providers.get_opt("y").await?.is_none().then_some(()))
    })
    .await?;
    let now = members().await?;
    assert!(!now.contains(&theirs) && now.contains(&ours), "{now:?}");

    let first_providers: Api<Provider> = Api::namespaced(kube.clone(), &first);
    first_providers
        .delete("x-y", &DeleteParams::default())
        .await?;
    poll::until("Provider x-y gone", Duration::from_secs(60), || async {
        Ok(first_providers
            .get_opt("x-y")
            .await?
            .is_none()
            .then_some(()))
    })
    .await?;
    assert!(!members().await?.contains(&ours));
    drop(operators);
    namespaces.delete(&second, &DeleteParams::default()).await?;
    Api::<ProviderClass>::all(kube)
        .delete(&class.name_any(), &DeleteParams::default())
        .await?;
    Ok(())
}

/// A provider's workload reads, by name, its connection's Secret and the user-data Secrets its
/// machines name, once the operator has seen them; no other Secret of its namespace, another
/// Provider's credentials included, even one a machine of its names. Acts as the workload's
/// own ServiceAccount (`as_provider`); `admin` plays the administrator and the controller.
async fn secrets_by_name(admin: &kube::Client, as_provider: &kube::Client, ns: &str) -> Result<()> {
    let secrets_admin = Api::<Secret>::namespaced(admin.clone(), ns);
    let secrets = Api::<Secret>::namespaced(as_provider.clone(), ns);
    let secret = |name: &str| -> Secret {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name},
            "stringData": {"user-data": "#cloud-config\n", "tls.key": "not a key"}
        }))
        .expect("a Secret")
    };
    for name in ["cloud-init", "core-creds"] {
        secrets_admin
            .create(&PostParams::default(), &secret(name))
            .await?;
    }
    secrets.get("libvirt-creds").await?;
    let forbidden = |e: kube::Error| matches!(e, kube::Error::Api(ref s) if s.code == 403);
    // Another Provider of the namespace connects with core-creds.
    let core: Provider = serde_json::from_value(serde_json::json!({
        "apiVersion": "banlieue.io/v1alpha1", "kind": "Provider",
        "metadata": {"name": "core"},
        "spec": {"providerClassRef": {"name": "absent-class"},
                 "connection": {"endpoint": "qemu+tls://127.0.0.1:1/system",
                                "credentialsRef": {"name": "core-creds"},
                                "caBundle": {"inline": "pem"}}}
    }))?;
    Api::<Provider>::namespaced(admin.clone(), ns)
        .create(&PostParams::default(), &core)
        .await?;
    for name in ["cloud-init", "core-creds"] {
        let refused = secrets.get(name).await.expect_err(name);
        assert!(forbidden(refused), "{name}");
    }
    // Machines of this Provider name both as user-data, as the controller would write them
    // from a VirtualMachine (neither opted in: the provider refuses them before the host).
    let machines: Api<banlieue_api::LibvirtMachine> = Api::namespaced(admin.clone(), ns);
    for (machine, secret) in [
        ("m-user-data", "cloud-init"),
        ("m-credentials", "core-creds"),
    ] {
        let m: banlieue_api::LibvirtMachine = serde_json::from_value(serde_json::json!({
            "apiVersion": "banlieue.io/v1alpha1", "kind": "LibvirtMachine",
            "metadata": { "name": machine },
            "spec": { "providerRef": { "name": "edge-7" }, "pool": "default",
                      "network": "default", "disk": { "backingVolume": "base.qcow2",
                      "size": "10Gi" }, "cpu": 1, "memory": "1Gi",
                      "userDataSecretRef": { "name": secret, "key": "user-data" } }
        }))?;
        machines.create(&PostParams::default(), &m).await?;
    }
    poll::until(
        "the machine's user-data Secret granted",
        Duration::from_secs(30),
        || async { Ok(secrets.get("cloud-init").await.ok().map(|_| ())) },
    )
    .await?;
    let refused = secrets
        .get("core-creds")
        .await
        .expect_err("another Provider's credentials");
    assert!(forbidden(refused));
    for machine in ["m-user-data", "m-credentials"] {
        machines.delete(machine, &DeleteParams::default()).await?;
    }
    common::none_left(&machines, "the machines gone", 60).await?;
    Api::<Provider>::namespaced(admin.clone(), ns)
        .delete("core", &DeleteParams::default())
        .await?;
    Ok(())
}

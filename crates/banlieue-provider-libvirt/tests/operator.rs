//! The Provider reconcile against a real control plane and a real libvirtd: readiness, the
//! narrowed failure domain, every failure reason of the guide, and the per-Provider workload
//! (ADR-0012) with drift repair.

mod common;

use std::time::Duration;

use anyhow::Result;
use banlieue_api::conditions::{self, Condition};
use banlieue_api::{Provider, ProviderClass};
use banlieue_provider_libvirt::operator::{OperatorConfig, run_operator, workloads};
use common::{Host, control_plane, credentials, eventually, provider, provider_class};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Secret, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use kube::api::{Api, DeleteParams, PostParams};
use kube::{Resource, ResourceExt};
use tokio::sync::oneshot;

/// Runs the operator for `ns` until the returned sender is dropped.
fn start_operator(kube: &kube::Client, ns: &str) -> oneshot::Sender<()> {
    let (tx, rx) = oneshot::channel::<()>();
    let cfg = OperatorConfig {
        probe_interval: Duration::from_secs(3),
        call_timeout: Duration::from_secs(10),
        namespace: Some(ns.to_owned()),
    };
    let kube = kube.clone();
    tokio::spawn(async move {
        let _ = run_operator(kube, cfg, async move {
            let _ = rx.await;
        })
        .await;
    });
    tx
}

/// Waits until the Provider's Ready condition satisfies `check`, and returns the Provider.
async fn wait_ready(
    api: &Api<Provider>,
    name: &str,
    what: &str,
    check: impl Fn(&Condition) -> bool,
) -> Result<Provider> {
    eventually(what, 60, || async {
        let p = api.get(name).await?;
        let ok = p
            .status
            .as_ref()
            .and_then(|s| conditions::find(&s.conditions, "Ready"))
            .is_some_and(&check);
        Ok(ok.then_some(p))
    })
    .await
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
    let class = provider_class(&kube).await?;
    let _operator = start_operator(&kube, &ns);
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

    // The transition was recorded as an Event on the Provider.
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(kube.clone(), &ns);
    eventually("a Connected event on the Provider", 30, || async {
        let list = events.list(&Default::default()).await?;
        Ok(list
            .items
            .iter()
            .any(|e| {
                e.reason.as_deref() == Some("Connected")
                    && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("edge-7")
            })
            .then_some(()))
    })
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
    let deployment = eventually("Deployment", 30, || async {
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
    let roles: Api<Role> = Api::namespaced(kube.clone(), &ns);
    let role = roles.get(&wl).await?;
    assert!(owned_by_provider(role.owner_references()));
    let rules = role.rules.clone().unwrap();
    let grants = |group: &str, resource: &str, verb: &str| {
        rules.iter().any(|r| {
            r.api_groups
                .as_ref()
                .is_some_and(|g| g.iter().any(|g| g == group))
                && r.resources
                    .as_ref()
                    .is_some_and(|x| x.iter().any(|x| x == resource))
                && r.verbs.iter().any(|v| v == verb)
        })
    };
    assert!(grants("banlieue.io", "libvirtmachines", "watch"));
    assert!(grants(
        "banlieue.io",
        "libvirtmachines/finalizers",
        "update"
    ));
    assert!(grants("banlieue.io", "providers/status", "patch"));
    assert!(grants("", "secrets", "get"));
    assert!(
        grants("batch", "jobs", "create"),
        "additionalRules: {rules:?}"
    );
    let rb = Api::<RoleBinding>::namespaced(kube.clone(), &ns)
        .get(&wl)
        .await?;
    assert!(owned_by_provider(rb.owner_references()));
    assert_eq!(rb.role_ref.name, wl);

    let crb_name = workloads::cluster_role_binding_name(&ns, "edge-7");
    let crbs: Api<ClusterRoleBinding> = Api::all(kube.clone());
    let crb = crbs.get(&crb_name).await?;
    // Cluster-scoped: no owner reference to a namespaced owner (the GC would delete it).
    assert!(crb.owner_references().is_empty());
    let subject = &crb.subjects.clone().unwrap()[0];
    assert_eq!(
        (subject.name.as_str(), subject.namespace.as_deref()),
        (wl.as_str(), Some(ns.as_str()))
    );
    let cr = Api::<ClusterRole>::all(kube.clone())
        .get(&crb.role_ref.name)
        .await?;
    assert!(
        cr.owner_references()
            .iter()
            .any(|r| r.kind == "ProviderClass" && Some(&r.uid) == class.meta().uid.as_ref())
    );
    let cr_rules = cr.rules.unwrap();
    assert!(cr_rules.iter().any(|r| {
        r.resources
            .as_ref()
            .is_some_and(|x| x.contains(&"vmimages".to_owned()))
    }));
    assert!(cr_rules.iter().any(|r| {
        r.resources
            .as_ref()
            .is_some_and(|x| x.contains(&"jobs".to_owned()))
    }));

    // The service account really holds the grants.
    let as_provider = cp.client_as_service_account(&ns, &wl).await?;
    Api::<banlieue_api::LibvirtMachine>::namespaced(as_provider.clone(), &ns)
        .list(&Default::default())
        .await?;
    Api::<banlieue_api::VMImage>::all(as_provider)
        .list(&Default::default())
        .await?;

    // Drift: objects deleted by hand come back.
    deployments.delete(&wl, &DeleteParams::default()).await?;
    roles.delete(&wl, &DeleteParams::default()).await?;
    crbs.delete(&crb_name, &DeleteParams::default()).await?;
    let old_uid = deployment.uid();
    eventually("Deployment re-created", 60, || async {
        Ok(deployments
            .get_opt(&wl)
            .await?
            .filter(|d| d.uid() != old_uid)
            .map(|_| ()))
    })
    .await?;
    eventually("Role re-created", 60, || async {
        Ok(roles.get_opt(&wl).await?)
    })
    .await?;
    eventually("ClusterRoleBinding re-created", 60, || async {
        Ok(crbs.get_opt(&crb_name).await?)
    })
    .await?;

    // Deleting the Provider removes the cluster-scoped binding through the finalizer.
    api.delete("edge-7", &DeleteParams::default()).await?;
    eventually("Provider and its ClusterRoleBinding gone", 60, || async {
        let gone =
            api.get_opt("edge-7").await?.is_none() && crbs.get_opt(&crb_name).await?.is_none();
        Ok(gone.then_some(()))
    })
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
    let class = provider_class(&kube).await?;
    let _operator = start_operator(&kube, &ns);
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
    let class = provider_class(&kube).await?;
    let _operator = start_operator(&kube, &ns);
    let api: Api<Provider> = Api::namespaced(kube.clone(), &ns);
    let uri = host.libvirtd.tls_uri();

    // qemu+ssh: rejected at reconcile with the guide's exact message.
    let ssh = uri.replace("qemu+tls", "qemu+ssh");
    api.create(
        &PostParams::default(),
        &provider("ssh", &class.name_any(), &ssh, host.capabilities()),
    )
    .await?;
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
    eventually("Provider gone", 60, || async {
        Ok(api.get_opt(name).await?.is_none().then_some(()))
    })
    .await?;
    Api::<ProviderClass>::all(kube.clone())
        .delete(&class.name_any(), &DeleteParams::default())
        .await?;
    Ok(())
}

//! What only shows on a cluster of more than one node, here two real kubelets (each with its
//! own containerd) on one control plane and its kube-scheduler: the build and import Jobs on
//! a ReadWriteOnce artifacts volume follow each other onto the node that holds it, and the
//! roles that place them read the claim's access modes under the RBAC banlieue ships.

use std::collections::BTreeSet;
use std::net::Ipv4Addr;
use std::time::Duration;

use banlieue_api::artifacts::{LABEL_ARTIFACTS_CLAIM, Sharing};
use banlieue_api::{
    LocalObjectReference, Provider, ProviderClass, ProviderConnection, ProviderSpec, ValueOrSource,
    names,
};
use banlieue_imagebuilder::decide::{BuildSettings, build_job};
use banlieue_operator::workloads;
use banlieue_provider_libvirt::image::decide::{Artifact, ImportRequest, import_job};
use banlieue_testenv::control_plane::{ControlPlane, wait_for};
use banlieue_testenv::node::{Node, PAUSE_IMAGE};
use banlieue_testenv::repo_path;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{
    Namespace, PersistentVolume, PersistentVolumeClaim, Pod, ServiceAccount,
};
use kube::api::{Api, ListParams, ObjectMeta, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;

type Result<T = (), E = Box<dyn std::error::Error + Send + Sync>> = std::result::Result<T, E>;

const BUILD_NS: &str = names::DEFAULT_BUILD_NAMESPACE;
const SYSTEM_NS: &str = "banlieue-system";
/// The shipped claim, ReadWriteOnce.
const ONE_NODE_CLAIM: &str = "banlieue-artifacts";
/// A ReadWriteMany claim beside it.
const SHARED_CLAIM: &str = "shared-artifacts";
const STORAGE_CLASS: &str = "two-nodes-hostpath";

#[tokio::test]
async fn jobs_on_a_read_write_once_artifacts_volume_run_on_the_node_that_holds_it() -> Result {
    let cp = ControlPlane::start_with_node().await?;
    let second = Node::start_another(&cp, Ipv4Addr::new(127, 0, 0, 2)).await?;
    let admin = cp.client()?;
    let first = cp.node().ok_or("a first node")?.name().to_owned();
    let nodes = BTreeSet::from([first, second.name().to_owned()]);

    for ns in [SYSTEM_NS, BUILD_NS] {
        create_namespace(&admin, ns).await?;
    }
    let volumes_dir = tempfile::tempdir()?;
    claim(&admin, ONE_NODE_CLAIM, "ReadWriteOnce", volumes_dir.path()).await?;
    claim(&admin, SHARED_CLAIM, "ReadWriteMany", volumes_dir.path()).await?;

    // The roles read the claim's access modes as themselves, under the shipped RBAC: only a
    // read that succeeds can tell the shared claim apart (an unread claim counts as one node).
    let imagebuilder = imagebuilder_identity(&cp).await?;
    let provider = provider_identity(&cp).await?;
    for (role, client) in [("imagebuilder", &imagebuilder), ("provider", &provider)] {
        let read = |claim| banlieue_runtime::artifacts::sharing(client, BUILD_NS, claim);
        assert_eq!(read(SHARED_CLAIM).await, Sharing::AnyNode, "{role}");
        assert_eq!(read(ONE_NODE_CLAIM).await, Sharing::OneNode, "{role}");
    }
    let sharing =
        banlieue_runtime::artifacts::sharing(&imagebuilder, BUILD_NS, ONE_NODE_CLAIM).await;

    // The build Job first: nothing else runs on the volume, so it goes where the scheduler
    // likes. Each Job's pod runs the pause program instead of banlieue: what is under test is
    // the pod's placement, and a pod that keeps running keeps holding the volume.
    let jobs: Api<Job> = Api::namespaced(admin.clone(), BUILD_NS);
    let settings = BuildSettings {
        namespace: BUILD_NS.into(),
        artifacts_claim: ONE_NODE_CLAIM.into(),
        service_account: "default".into(),
        ..BuildSettings::default()
    };
    let digest = format!("sha256:{}", "1".repeat(64));
    let build = build_job(
        &settings,
        SYSTEM_NS,
        "debian",
        &digest,
        "127.0.0.1:5000/debian@sha256:1",
        sharing,
    );
    jobs.create(&PostParams::default(), &pausing(build)).await?;
    let holder = wait_placed(&admin, 1, &[]).await?;
    let holder = holder.into_iter().next().ok_or("the build pod")?;
    eprintln!("the build pod runs on {holder}");

    // Imports into four pools while it runs: each follows it to its node.
    let class = shipped_libvirt_class()?;
    let import_provider = provider_object();
    let artifact = Artifact {
        path: "debian.raw".into(),
        sha256: Some("ab".repeat(32)),
        size_bytes: Some(1 << 30),
    };
    let pools = ["p1", "p2", "p3", "p4"];
    for pool in pools {
        let job = import_job(
            &import_request(&artifact, pool),
            &import_provider,
            &class,
            sharing,
        );
        jobs.create(&PostParams::default(), &pausing(job)).await?;
    }
    let placed = wait_placed(&admin, 1 + pools.len(), &[]).await?;
    assert_eq!(
        placed,
        BTreeSet::from([holder.clone()]),
        "every import pod on the build pod's node"
    );

    // The control: the same imports for a ReadWriteMany claim are not held, and the scheduler
    // (which spreads pods by what each node already runs) puts at least one on the other node.
    // Without the placement above, the imports would have spread the same way.
    let shared = banlieue_runtime::artifacts::sharing(&imagebuilder, BUILD_NS, SHARED_CLAIM).await;
    for pool in ["s1", "s2", "s3", "s4"] {
        let job = import_job(
            &import_request(&artifact, pool),
            &import_provider,
            &shared_class(&class),
            shared,
        );
        let template = job.spec.as_ref().map(|s| &s.template);
        assert_eq!(
            template
                .and_then(|t| t.spec.as_ref())
                .and_then(|s| s.affinity.as_ref()),
            None,
            "no affinity on a ReadWriteMany claim"
        );
        jobs.create(&PostParams::default(), &pausing(job)).await?;
    }
    let spread = wait_placed(&admin, 4, &[(LABEL_ARTIFACTS_CLAIM, SHARED_CLAIM)]).await?;
    let other = nodes
        .iter()
        .find(|n| **n != holder)
        .ok_or("a second node")?;
    assert!(
        spread.contains(other),
        "the shared claim's imports all landed on {holder} too ({spread:?}): the scheduler \
         would not have spread them, so the placement above proved nothing"
    );
    drop(second);
    Ok(())
}

/// The Job with its container running the pause program (the node's sandbox image), as the
/// same user, security context, volumes, labels and affinity.
fn pausing(mut job: Job) -> Job {
    if let Some(pod) = job.spec.as_mut().and_then(|s| s.template.spec.as_mut()) {
        for container in &mut pod.containers {
            container.image = Some(PAUSE_IMAGE.into());
            container.image_pull_policy = Some("Never".into());
            container.command = None;
            container.args = None;
        }
    }
    job
}

/// Waits until `count` pods of the build namespace carrying `labels` (all with `[]`) are
/// running, and returns the nodes they run on.
async fn wait_placed(
    admin: &Client,
    count: usize,
    labels: &[(&str, &str)],
) -> Result<BTreeSet<String>> {
    let pods: Api<Pod> = Api::namespaced(admin.clone(), BUILD_NS);
    let selector = labels
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",");
    let what = format!("{count} running pods ({selector})");
    let placed = wait_for(&what, Duration::from_secs(120), || {
        let (pods, selector) = (pods.clone(), selector.clone());
        async move {
            let list = pods.list(&ListParams::default().labels(&selector)).await?;
            let running: Vec<String> = list
                .items
                .iter()
                .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
                .filter_map(|p| p.spec.as_ref().and_then(|s| s.node_name.clone()))
                .collect();
            Ok((running.len() >= count).then_some(running))
        }
    })
    .await?;
    Ok(placed.into_iter().collect())
}

async fn create_namespace(admin: &Client, name: &str) -> Result {
    let namespaces: Api<Namespace> = Api::all(admin.clone());
    let ns = Namespace {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..ObjectMeta::default()
        },
        ..Namespace::default()
    };
    namespaces.create(&PostParams::default(), &ns).await?;
    // The Job controller cannot make a pod before the namespace's default account exists.
    let accounts: Api<ServiceAccount> = Api::namespaced(admin.clone(), name);
    wait_for(
        "the default ServiceAccount",
        Duration::from_secs(60),
        || {
            let accounts = accounts.clone();
            async move { Ok(accounts.get_opt("default").await?.map(|_| ())) }
        },
    )
    .await?;
    Ok(())
}

/// A hostPath volume and a bound claim `name` with `mode` in the build namespace. Both nodes
/// are this machine, so either can mount it: only the placement decides where pods go.
async fn claim(admin: &Client, name: &str, mode: &str, dir: &std::path::Path) -> Result {
    let path = dir.join(name);
    std::fs::create_dir(&path)?;
    let volumes: Api<PersistentVolume> = Api::all(admin.clone());
    let volume: PersistentVolume = serde_json::from_value(json!({
        "metadata": {"name": format!("two-nodes-{name}")},
        "spec": {
            "capacity": {"storage": "1Gi"},
            "accessModes": [mode],
            "storageClassName": STORAGE_CLASS,
            "hostPath": {"path": path, "type": "Directory"},
            "claimRef": {"namespace": BUILD_NS, "name": name},
        },
    }))?;
    volumes.create(&PostParams::default(), &volume).await?;
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(admin.clone(), BUILD_NS);
    let claim: PersistentVolumeClaim = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "accessModes": [mode],
            "storageClassName": STORAGE_CLASS,
            "resources": {"requests": {"storage": "1Gi"}},
        },
    }))?;
    claims.create(&PostParams::default(), &claim).await?;
    wait_for("the claim to bind", Duration::from_secs(60), || {
        let claims = claims.clone();
        async move {
            let c = claims.get(name).await?;
            let phase = c.status.and_then(|s| s.phase);
            Ok((phase.as_deref() == Some("Bound")).then_some(()))
        }
    })
    .await?;
    Ok(())
}

/// The imagebuilder's ServiceAccount with the shipped `deploy/rbac/imagebuilder-rolebindings.yaml`.
async fn imagebuilder_identity(cp: &ControlPlane) -> Result<Client> {
    service_account(&cp.client()?, SYSTEM_NS, "banlieue-imagebuilder").await?;
    service_account(&cp.client()?, BUILD_NS, "banlieue-build").await?;
    cp.apply_yaml(&repo_path("deploy/rbac/imagebuilder-rolebindings.yaml"))
        .await?;
    Ok(cp
        .client_as_service_account(SYSTEM_NS, "banlieue-imagebuilder")
        .await?)
}

/// A libvirt provider's ServiceAccount with the shipped class role
/// (`deploy/rbac/provider-class-libvirt-clusterrole.yaml`) bound in the build namespace by
/// the binding the operator makes for it.
async fn provider_identity(cp: &ControlPlane) -> Result<Client> {
    let admin = cp.client()?;
    cp.apply_yaml(&repo_path(
        "deploy/rbac/provider-class-libvirt-clusterrole.yaml",
    ))
    .await?;
    let provider = provider_object();
    let mut class = shipped_libvirt_class()?;
    class.metadata.uid = Some("4c1f0000-0000-0000-0000-00000000c1a5".into());
    let mut built = workloads::build(
        &provider,
        &class,
        &banlieue_provider_libvirt::backend::descriptor().workload,
        &[],
    )
    .ok_or("workloads")?;
    // Neither the Provider nor the class exists here: without owners, the garbage collector
    // leaves the objects alone.
    built.class_binding.metadata.owner_references = None;
    built.import_service_account.metadata.owner_references = None;
    let account = built.service_account.name_any();
    service_account(&admin, SYSTEM_NS, &account).await?;
    let bindings: Api<k8s_openapi::api::rbac::v1::RoleBinding> =
        Api::namespaced(admin.clone(), BUILD_NS);
    bindings
        .create(&PostParams::default(), &built.class_binding)
        .await?;
    // The account its import Jobs run as, which the operator makes in the build namespace.
    let import_accounts: Api<ServiceAccount> = Api::namespaced(admin.clone(), BUILD_NS);
    import_accounts
        .create(&PostParams::default(), &built.import_service_account)
        .await?;
    Ok(cp.client_as_service_account(SYSTEM_NS, &account).await?)
}

async fn service_account(admin: &Client, namespace: &str, name: &str) -> Result {
    let accounts: Api<ServiceAccount> = Api::namespaced(admin.clone(), namespace);
    let account = ServiceAccount {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..ObjectMeta::default()
        },
        ..ServiceAccount::default()
    };
    accounts.create(&PostParams::default(), &account).await?;
    Ok(())
}

/// examples/09-providerclass-libvirt.yaml, the class the guide applies.
fn shipped_libvirt_class() -> Result<ProviderClass> {
    let text = std::fs::read_to_string(repo_path("examples/09-providerclass-libvirt.yaml"))?;
    Ok(serde_saphyr::from_str(&text)?)
}

/// The class with its import Jobs on the ReadWriteMany claim.
fn shared_class(class: &ProviderClass) -> ProviderClass {
    let mut shared = class.clone();
    shared.spec.import.artifacts_claim_name = Some(SHARED_CLAIM.into());
    shared
}

/// A libvirt Provider as the operator sees it: named, namespaced, with a uid.
fn provider_object() -> Provider {
    let mut provider = Provider::new(
        "edge-7",
        ProviderSpec {
            provider_class_ref: LocalObjectReference::new("libvirt"),
            connection: ProviderConnection {
                endpoint: "qemu+tls://127.0.0.1/system".into(),
                credentials_ref: LocalObjectReference::new("creds"),
                ca_bundle: ValueOrSource::default(),
            },
            capabilities: Default::default(),
            attestation: None,
        },
    );
    provider.metadata.namespace = Some(SYSTEM_NS.into());
    provider.metadata.uid = Some("4c1f0000-0000-0000-0000-000000000007".into());
    provider
}

fn import_request<'a>(artifact: &'a Artifact, pool: &'a str) -> ImportRequest<'a> {
    ImportRequest {
        image: "debian",
        image_namespace: SYSTEM_NS,
        revision: "r1",
        volume: "debian-r1.raw",
        pool,
        artifact,
    }
}

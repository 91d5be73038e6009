//! A real node beside the test control plane: it becomes Ready, runs pods from locally built
//! images, serves their logs through the API, lets them call the API server in-cluster under
//! their own ServiceAccount (RBAC enforced), mounts hostPath persistent volumes, and keeps Pod
//! Security's `restricted` standard although it makes every pod hostNetwork.

use std::path::Path;
use std::time::{Duration, Instant};

use banlieue_testenv::control_plane::{ControlPlane, wait_for};
use banlieue_testenv::node::{self, NETWORK_POLICY_NAME, NODE_NAME};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Namespace, Node, PersistentVolume, PersistentVolumeClaim, Pod};
use kube::api::{Api, DeleteParams, ListParams, LogParams, PostParams};
use kube::{Client, ResourceExt as _};
use serde_json::json;
use tokio::sync::OnceCell;

const DEADLINE: Duration = Duration::from_secs(60);
/// dash, sleep, cat, curl and their libraries: enough for a shell script that calls the API.
const TOOLS_IMAGE: &str = "banlieue.local/test-tools:1";

async fn cluster() -> &'static ControlPlane {
    ControlPlane::shared_with_node()
        .await
        .expect("control plane with a node")
}

/// The tools image, built from the host's own binaries and imported once per test binary.
async fn tools_image(cp: &ControlPlane) -> &'static str {
    static IMPORTED: OnceCell<()> = OnceCell::const_new();
    IMPORTED
        .get_or_init(|| async {
            let dir = tempfile::tempdir().expect("temp dir");
            let archive = dir.path().join("tools.tar");
            let files = ["/bin/sh", "/bin/sleep", "/bin/cat", "/usr/bin/curl"].map(Path::new);
            node::build_image(TOOLS_IMAGE, &files, &["/bin/sh", "-c"], &archive)
                .await
                .expect("build the tools image");
            cp.node()
                .expect("a node")
                .import_image(&archive)
                .await
                .expect("import the tools image");
        })
        .await;
    TOOLS_IMAGE
}

/// A fresh namespace whose `default` ServiceAccount exists (a Pod is refused until then).
async fn namespace(cp: &ControlPlane) -> String {
    cp.fresh_namespace_for_pods().await.expect("namespace")
}

async fn delete_namespace(client: &Client, ns: &str) {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces
        .delete(ns, &DeleteParams::default())
        .await
        .expect("delete the namespace");
}

async fn wait_pod_ready(pods: &Api<Pod>, name: &str) -> Pod {
    wait_for(&format!("pod {name} to be Ready"), DEADLINE, || {
        let pods = pods.clone();
        let name = name.to_owned();
        async move { Ok(pods.get_opt(&name).await?.filter(node::pod_is_ready)) }
    })
    .await
    .expect("pod Ready")
}

async fn wait_logs_contain(pods: &Api<Pod>, name: &str, wanted: &[String]) -> String {
    let waited = wait_for(
        &format!("the logs of {name} to show {wanted:?}"),
        DEADLINE,
        || {
            let pods = pods.clone();
            let name = name.to_owned();
            async move {
                let logs = pods.logs(&name, &LogParams::default()).await?;
                Ok(wanted
                    .iter()
                    .all(|line| logs.contains(line.as_str()))
                    .then_some(logs))
            }
        },
    )
    .await;
    match waited {
        Ok(logs) => logs,
        Err(error) => {
            let logs = pods.logs(name, &LogParams::default()).await;
            panic!("{error:?}\nthe logs: {logs:?}")
        }
    }
}

fn rss_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kib: f64 = status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|value| value.parse().ok())
        .unwrap_or(0.0);
    kib / 1024.0
}

#[tokio::test]
async fn the_node_registers_and_becomes_ready() {
    let cp = cluster().await;
    let node = cp.node().expect("a node");
    let nodes: Api<Node> = Api::all(cp.client().expect("client"));
    let object = nodes.get(NODE_NAME).await.expect("node localhost");
    assert!(
        node::is_ready(&object),
        "node not Ready: {:?}",
        object.status
    );
    let info = object
        .status
        .and_then(|status| status.node_info)
        .expect("node info");
    assert_eq!(info.kubelet_version, "v1.37.2");
    assert_eq!(info.container_runtime_version, "containerd://2.2.9");
    // Only loopback: the kubelet's own endpoint is the one the API server was told about.
    let rss: Vec<String> = node
        .pids()
        .into_iter()
        .filter(|(name, _)| *name != "janitor")
        .map(|(name, pid)| format!("{name} {:.0} MiB", rss_mib(pid)))
        .collect();
    eprintln!(
        "node: up after {:.2} s, kubelet start to Ready {:.2} s; RSS: {}",
        node.up_after().as_secs_f64(),
        node.kubelet_ready_after().as_secs_f64(),
        rss.join(", ")
    );
}

#[tokio::test]
async fn a_pod_from_a_local_image_runs_and_its_logs_come_back() {
    let cp = cluster().await;
    let image = tools_image(cp).await;
    let ns = namespace(cp).await;
    let client = cp.client().expect("client");
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    // As a user writes it: no hostNetwork, no API address; the test cluster's policy adds them.
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "hello"},
        "spec": {
            "containers": [{
                "name": "hello",
                "image": image,
                "imagePullPolicy": "Never",
                "args": ["echo hello from the test node; echo api at $KUBERNETES_SERVICE_HOST; exec sleep 3600"],
                "ports": [{"containerPort": 0xbee}],
                // Never probed (the delay outlives the test); its host is what is checked.
                "livenessProbe": {
                    "httpGet": {"path": "/healthz", "port": 0xbee},
                    "initialDelaySeconds": 3600,
                },
            }],
            "initContainers": [{
                "name": "init",
                "image": image,
                "imagePullPolicy": "Never",
                "args": ["true"],
            }],
            "terminationGracePeriodSeconds": 0,
        }
    }))
    .expect("pod");
    let created_at = Instant::now();
    let created = pods
        .create(&PostParams::default(), &pod)
        .await
        .expect("create the pod");
    let spec = created.spec.expect("spec");
    assert_eq!(
        spec.host_network,
        Some(true),
        "mutated by {NETWORK_POLICY_NAME}"
    );
    // Defaulted after the mutation, as for a Pod that asked for hostNetwork itself.
    let container = &spec.containers[0];
    let port = &container.ports.as_ref().expect("ports")[0];
    assert_eq!(port.host_port, Some(0xbee));
    let probe = container
        .liveness_probe
        .as_ref()
        .and_then(|p| p.http_get.as_ref());
    assert_eq!(probe.and_then(|get| get.host.as_deref()), Some("127.0.0.1"));
    let api_port = cp.apiserver_port().expect("a local API server").to_string();
    let init = &spec.init_containers.as_ref().expect("init containers")[0];
    for env in [container.env.as_ref(), init.env.as_ref()] {
        let env: Vec<(&str, Option<&str>)> = env
            .expect("env")
            .iter()
            .map(|var| (var.name.as_str(), var.value.as_deref()))
            .collect();
        assert_eq!(
            env,
            [
                ("KUBERNETES_SERVICE_HOST", Some("127.0.0.1")),
                ("KUBERNETES_SERVICE_PORT", Some(api_port.as_str())),
            ]
        );
    }
    let ready = wait_pod_ready(&pods, "hello").await;
    eprintln!(
        "pod: create to Ready {:.2} s",
        created_at.elapsed().as_secs_f64()
    );
    assert_eq!(
        ready.spec.and_then(|spec| spec.node_name).as_deref(),
        Some(NODE_NAME)
    );
    wait_logs_contain(
        &pods,
        "hello",
        &["hello from the test node".into(), "api at 127.0.0.1".into()],
    )
    .await;
    delete_namespace(&client, &ns).await;
}

#[tokio::test]
async fn a_deployment_calls_the_api_server_as_its_service_account_and_rbac_holds() {
    let cp = cluster().await;
    let image = tools_image(cp).await;
    let ns = namespace(cp).await;
    let client = cp.client().expect("client");
    let manifest = tempfile::Builder::new()
        .suffix(".yaml")
        .tempfile()
        .expect("temp file");
    std::fs::write(manifest.path(), rbac_manifest(&ns, image)).expect("write the manifest");
    cp.apply_yaml_in(manifest.path(), &ns)
        .await
        .expect("apply the deployment");
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    wait_for("the deployment to be available", DEADLINE, || {
        let deployments = deployments.clone();
        async move {
            let deployment = deployments.get("reader").await?;
            Ok((deployment.status.and_then(|s| s.available_replicas) == Some(1)).then_some(()))
        }
    })
    .await
    .expect("deployment available");
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let listed = pods
        .list(&ListParams::default().labels("app=reader"))
        .await
        .expect("list pods");
    let pod = listed.items.first().expect("a reader pod").name_any();
    let logs = wait_logs_contain(
        &pods,
        &pod,
        &[
            format!("\"username\": \"system:serviceaccount:{ns}:reader\""),
            // Its Role grants configmaps, and nothing grants secrets.
            "configmaps 200".into(),
            "secrets 403".into(),
        ],
    )
    .await;
    assert!(!logs.contains("configmaps 403"), "{logs}");
    delete_namespace(&client, &ns).await;
}

fn rbac_manifest(ns: &str, image: &str) -> String {
    // The script asks who it is (SelfSubjectReview), then tries an allowed and a denied list.
    let script = r#"
sa=/var/run/secrets/kubernetes.io/serviceaccount
token=$(cat $sa/token)
ns=$(cat $sa/namespace)
api=https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT
call() { curl -sS --cacert $sa/ca.crt -H "Authorization: Bearer $token" "$@"; }
call -X POST -H 'Content-Type: application/json' \
  -d '{"apiVersion":"authentication.k8s.io/v1","kind":"SelfSubjectReview"}' \
  $api/apis/authentication.k8s.io/v1/selfsubjectreviews
echo
for resource in configmaps secrets; do
  echo "$resource $(call -o /dev/null -w '%{http_code}' $api/api/v1/namespaces/$ns/$resource)"
done
exec sleep 3600
"#;
    let script = serde_json::Value::from(script).to_string();
    format!(
        r#"apiVersion: v1
kind: ServiceAccount
metadata: {{name: reader, namespace: {ns}}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {{name: configmap-reader, namespace: {ns}}}
rules:
- apiGroups: [""]
  resources: [configmaps]
  verbs: [get, list]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: reader, namespace: {ns}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: configmap-reader}}
subjects:
- {{kind: ServiceAccount, name: reader, namespace: {ns}}}
---
apiVersion: apps/v1
kind: Deployment
metadata: {{name: reader, namespace: {ns}}}
spec:
  replicas: 1
  selector: {{matchLabels: {{app: reader}}}}
  template:
    metadata: {{labels: {{app: reader}}}}
    spec:
      serviceAccountName: reader
      terminationGracePeriodSeconds: 0
      containers:
      - name: reader
        image: {image}
        imagePullPolicy: Never
        args: [{script}]
"#
    )
}

#[tokio::test]
async fn a_job_writes_through_a_hostpath_persistent_volume_claim() {
    let cp = cluster().await;
    let image = tools_image(cp).await;
    let ns = namespace(cp).await;
    let client = cp.client().expect("client");
    let host_dir = tempfile::tempdir().expect("host dir");
    let data = host_dir.path().join("data");
    // The volume first: a claim applied together with it waits for the binder's resync.
    let volumes: Api<PersistentVolume> = Api::all(client.clone());
    let class = format!("{ns}-hostpath");
    let volume: PersistentVolume = serde_json::from_value(json!({
        "metadata": {"name": ns},
        "spec": {
            "capacity": {"storage": "1Mi"},
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": class,
            "persistentVolumeReclaimPolicy": "Retain",
            "hostPath": {"path": data, "type": "DirectoryOrCreate"},
        }
    }))
    .expect("volume");
    volumes
        .create(&PostParams::default(), &volume)
        .await
        .expect("create the volume");
    wait_for("the volume to be Available", DEADLINE, || {
        let volumes = volumes.clone();
        let name = ns.clone();
        async move {
            let volume = volumes.get(&name).await?;
            let phase = volume.status.and_then(|status| status.phase);
            Ok((phase.as_deref() == Some("Available")).then_some(()))
        }
    })
    .await
    .expect("volume available");
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &ns);
    let claim: PersistentVolumeClaim = serde_json::from_value(json!({
        "metadata": {"name": "data"},
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": class,
            "resources": {"requests": {"storage": "1Mi"}},
        }
    }))
    .expect("claim");
    claims
        .create(&PostParams::default(), &claim)
        .await
        .expect("create the claim");
    let jobs: Api<Job> = Api::namespaced(client.clone(), &ns);
    let job: Job = serde_json::from_value(json!({
        "metadata": {"name": "writer"},
        "spec": {
            "backoffLimit": 0,
            "template": {"spec": {
                "restartPolicy": "Never",
                "containers": [{
                    "name": "writer",
                    "image": image,
                    "imagePullPolicy": "Never",
                    "args": ["echo written by the job > /data/out"],
                    "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                }],
                "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}],
            }},
        }
    }))
    .expect("job");
    jobs.create(&PostParams::default(), &job)
        .await
        .expect("create the job");
    wait_for("the job to complete", DEADLINE, || {
        let jobs = jobs.clone();
        async move {
            let status = jobs.get("writer").await?.status.unwrap_or_default();
            assert_eq!(status.failed.unwrap_or(0), 0, "the job failed: {status:?}");
            Ok((status.succeeded == Some(1)).then_some(()))
        }
    })
    .await
    .expect("job complete");
    let written = std::fs::read_to_string(data.join("out")).expect("the file the job wrote");
    assert_eq!(written, "written by the job\n");
    delete_namespace(&client, &ns).await;
    volumes
        .delete(&ns, &DeleteParams::default())
        .await
        .expect("delete the volume");
}

#[tokio::test]
async fn ten_pods_created_at_once_all_become_ready() {
    let cp = cluster().await;
    let ns = namespace(cp).await;
    let client = cp.client().expect("client");
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let started = Instant::now();
    for index in 0..10 {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": format!("pause-{index}")},
            "spec": {"containers": [{
                "name": "pause",
                "image": node::PAUSE_IMAGE,
                "imagePullPolicy": "Never",
            }]},
        }))
        .expect("pod");
        pods.create(&PostParams::default(), &pod)
            .await
            .expect("create a pod");
    }
    wait_for("ten pods to be Ready", DEADLINE, || {
        let pods = pods.clone();
        async move {
            let listed = pods.list(&ListParams::default()).await?;
            Ok((listed
                .items
                .iter()
                .filter(|pod| node::pod_is_ready(pod))
                .count()
                == 10)
                .then_some(()))
        }
    })
    .await
    .expect("ten pods Ready");
    eprintln!(
        "pods: ten created at once, all Ready after {:.2} s",
        started.elapsed().as_secs_f64()
    );
    delete_namespace(&client, &ns).await;
}

/// In a `restricted` namespace (banlieue's own are), a pod that asks for nothing the standard
/// forbids runs although the node makes it hostNetwork (its runtime class is exempt here), and
/// a privileged one is still refused by Pod Security, as on a production cluster.
#[tokio::test]
async fn pod_security_restricted_holds_beside_the_test_nodes_host_network() {
    let cp = cluster().await;
    let image = tools_image(cp).await;
    let ns = namespace(cp).await;
    let client = cp.client().expect("client");
    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces
        .patch(
            &ns,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"metadata": {"labels": {
                "pod-security.kubernetes.io/enforce": "restricted"}}})),
        )
        .await
        .expect("label the namespace");
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let pod = |name: &str, security: serde_json::Value| -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {
                "securityContext": {"runAsNonRoot": true, "runAsUser": 65532,
                    "seccompProfile": {"type": "RuntimeDefault"}},
                "containers": [{"name": "c", "image": image, "imagePullPolicy": "Never",
                    "args": ["exec sleep 3600"], "securityContext": security}],
                "terminationGracePeriodSeconds": 0,
            }
        }))
        .expect("pod")
    };
    let restricted = json!({"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}});
    let created = pods
        .create(&PostParams::default(), &pod("restricted", restricted))
        .await
        .expect("a restricted pod is admitted");
    let spec = created.spec.expect("spec");
    assert_eq!(spec.host_network, Some(true));
    assert_eq!(
        spec.runtime_class_name.as_deref(),
        Some("banlieue-test-node")
    );
    wait_pod_ready(&pods, "restricted").await;

    for (name, security, violation) in [
        (
            "privileged",
            json!({"privileged": true, "capabilities": {"drop": ["ALL"]}}),
            "privileged",
        ),
        (
            "escalating",
            json!({"capabilities": {"drop": ["ALL"]}}),
            "allowPrivilegeEscalation",
        ),
    ] {
        let refused = pods
            .create(&PostParams::default(), &pod(name, security))
            .await
            .expect_err("refused by Pod Security");
        let message = refused.to_string();
        assert!(
            message.contains("violates PodSecurity \"restricted") && message.contains(violation),
            "{name}: {message}"
        );
    }
    delete_namespace(&client, &ns).await;
}

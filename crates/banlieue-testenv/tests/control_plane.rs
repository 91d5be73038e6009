//! The control plane is real (schemas, admission, RBAC, controllers, optimistic concurrency
//! and finalizers behave as in a cluster) and the harness leaves nothing behind.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::net::{Ipv4Addr, TcpListener};
use std::path::Path;
use std::time::Duration;

use banlieue_testenv::control_plane::{self, ControlPlane, Error, wait_for};
use k8s_openapi::api::core::v1::{ConfigMap, Secret, ServiceAccount};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::Client;
use kube::api::{Api, DeleteParams, DynamicObject, ObjectMeta, Patch, PatchParams, PostParams};

const DEADLINE: Duration = Duration::from_secs(60);

fn yaml_file(text: &str) -> tempfile::NamedTempFile {
    let mut file = tempfile::Builder::new()
        .suffix(".yaml")
        .tempfile()
        .expect("temp file");
    file.write_all(text.as_bytes()).expect("write YAML");
    file
}

/// The API status of a failed call, or a panic naming what came back instead.
fn api_status<T: std::fmt::Debug>(result: Result<T, impl Into<Error>>) -> kube::core::Status {
    match result.map_err(Into::into) {
        Err(Error::Kube(kube::Error::Api(status))) => *status,
        other => panic!("expected an API error status, got {other:?}"),
    }
}

fn config_map(name: &str) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..ObjectMeta::default()
        },
        data: Some(BTreeMap::from([("k".to_owned(), "v".to_owned())])),
        ..ConfigMap::default()
    }
}

const WIDGET_CRD: &str = r#"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.testenv.banlieue.io
spec:
  group: testenv.banlieue.io
  scope: Namespaced
  names: {plural: widgets, singular: widget, kind: Widget}
  versions:
  - name: v1alpha1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            required: [size]
            properties:
              size: {type: integer, minimum: 1, maximum: 10}
"#;

#[tokio::test]
async fn a_crd_applies_and_its_schema_rejects_a_bad_object() {
    let cp = ControlPlane::shared().await.expect("control plane");
    let ns = cp.fresh_namespace().await.expect("namespace");
    let crd = yaml_file(WIDGET_CRD);
    let applied = cp.apply_yaml(crd.path()).await.expect("apply the CRD");
    assert_eq!(applied.len(), 1);

    let good = yaml_file(
        "apiVersion: testenv.banlieue.io/v1alpha1\nkind: Widget\nmetadata: {name: good}\nspec: {size: 3}\n---\n",
    );
    let applied = cp
        .apply_yaml_in(good.path(), &ns)
        .await
        .expect("a valid widget");
    assert_eq!(applied[0].metadata.namespace.as_deref(), Some(ns.as_str()));

    let bad = yaml_file(
        "apiVersion: testenv.banlieue.io/v1alpha1\nkind: Widget\nmetadata: {name: bad}\nspec: {size: 99}\n",
    );
    let status = api_status(cp.apply_yaml_in(bad.path(), &ns).await);
    assert_eq!(status.code, 422, "{status:?}");
    assert!(
        status.message.contains("spec.size")
            && status
                .message
                .contains("should be less than or equal to 10"),
        "the server's schema message, got: {}",
        status.message
    );
}

#[tokio::test]
async fn a_validating_admission_policy_with_params_denies_alice_and_allows_the_admin() {
    let cp = ControlPlane::shared().await.expect("control plane");
    let ns = cp.fresh_namespace().await.expect("namespace");
    // Cluster-scoped objects carry the namespace's name, so parallel tests never share them.
    let manifests = yaml_file(&format!(
        r#"
apiVersion: v1
kind: ConfigMap
metadata: {{name: policy-params, namespace: {ns}}}
data: {{deniedUser: alice}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {{name: configmap-writer, namespace: {ns}}}
rules:
- {{apiGroups: [""], resources: [configmaps], verbs: [create]}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: alice-writes-configmaps, namespace: {ns}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: configmap-writer}}
subjects:
- {{apiGroup: rbac.authorization.k8s.io, kind: User, name: alice}}
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata: {{name: deny-listed-users-{ns}}}
spec:
  failurePolicy: Fail
  paramKind: {{apiVersion: v1, kind: ConfigMap}}
  matchConstraints:
    resourceRules:
    - {{apiGroups: [""], apiVersions: [v1], operations: [CREATE], resources: [configmaps]}}
  validations:
  - expression: "request.userInfo.username != params.data.deniedUser"
    messageExpression: "'user ' + request.userInfo.username + ' is on the deny list of policy deny-listed-users'"
    reason: Forbidden
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata: {{name: deny-listed-users-{ns}}}
spec:
  policyName: deny-listed-users-{ns}
  validationActions: [Deny]
  paramRef: {{name: policy-params, namespace: {ns}, parameterNotFoundAction: Deny}}
  matchResources:
    namespaceSelector:
      matchLabels: {{kubernetes.io/metadata.name: {ns}}}
"#
    ));
    cp.apply_yaml(manifests.path())
        .await
        .expect("apply the policy");

    let alice: Api<ConfigMap> = Api::namespaced(cp.client_as("alice").await.expect("alice"), &ns);
    let expected = "user alice is on the deny list of policy deny-listed-users";
    // RBAC and the policy reach the apiserver's caches asynchronously: dry runs pass through
    // the same authorization and admission without writing anything.
    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    wait_for("the policy to deny alice", DEADLINE, || {
        let alice = alice.clone();
        let dry_run = dry_run.clone();
        async move {
            match alice.create(&dry_run, &config_map("probe")).await {
                Err(kube::Error::Api(status)) if status.message.contains(expected) => Ok(Some(())),
                _ => Ok(None),
            }
        }
    })
    .await
    .expect("the policy takes effect");

    let status = api_status(
        alice
            .create(&PostParams::default(), &config_map("by-alice"))
            .await,
    );
    assert_eq!(status.code, 403, "{status:?}");
    assert!(
        status.message.contains("ValidatingAdmissionPolicy") && status.message.contains(expected),
        "the policy's denial, got: {}",
        status.message
    );

    let admin: Api<ConfigMap> = Api::namespaced(cp.client().expect("admin"), &ns);
    admin
        .create(&PostParams::default(), &config_map("by-admin"))
        .await
        .expect("the admin is not on the deny list");

    let client = cp.client().expect("admin");
    for (resource, kind) in [
        (
            "validatingadmissionpolicybindings",
            "ValidatingAdmissionPolicyBinding",
        ),
        ("validatingadmissionpolicies", "ValidatingAdmissionPolicy"),
    ] {
        let resource = kube::api::ApiResource {
            group: "admissionregistration.k8s.io".into(),
            version: "v1".into(),
            api_version: "admissionregistration.k8s.io/v1".into(),
            kind: kind.into(),
            plural: resource.into(),
        };
        let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
        api.delete(&format!("deny-listed-users-{ns}"), &DeleteParams::default())
            .await
            .expect("clean up the cluster-scoped policy");
    }
}

#[tokio::test]
async fn deleting_an_owner_garbage_collects_its_dependents() {
    let cp = ControlPlane::shared().await.expect("control plane");
    let ns = cp.fresh_namespace().await.expect("namespace");
    let api: Api<ConfigMap> = Api::namespaced(cp.client().expect("admin"), &ns);
    let owner = api
        .create(&PostParams::default(), &config_map("owner"))
        .await
        .expect("owner");
    let mut dependent = config_map("dependent");
    dependent.metadata.owner_references = Some(vec![OwnerReference {
        api_version: "v1".into(),
        kind: "ConfigMap".into(),
        name: "owner".into(),
        uid: owner.metadata.uid.clone().expect("uid"),
        ..OwnerReference::default()
    }]);
    api.create(&PostParams::default(), &dependent)
        .await
        .expect("dependent");

    api.delete("owner", &DeleteParams::background())
        .await
        .expect("delete the owner");
    wait_for(
        "the garbage collector to delete the dependent",
        DEADLINE,
        || {
            let api = api.clone();
            async move { Ok(api.get_opt("dependent").await?.is_none().then_some(())) }
        },
    )
    .await
    .expect("kube-controller-manager's garbage collector runs");
}

#[tokio::test]
async fn an_update_with_a_stale_resource_version_conflicts() {
    let cp = ControlPlane::shared().await.expect("control plane");
    let ns = cp.fresh_namespace().await.expect("namespace");
    let api: Api<ConfigMap> = Api::namespaced(cp.client().expect("admin"), &ns);
    let stale = api
        .create(&PostParams::default(), &config_map("contended"))
        .await
        .expect("create");
    let mut fresh = stale.clone();
    fresh.data = Some(BTreeMap::from([("k".to_owned(), "first".to_owned())]));
    api.replace("contended", &PostParams::default(), &fresh)
        .await
        .expect("the first writer wins");

    let mut late = stale;
    late.data = Some(BTreeMap::from([("k".to_owned(), "second".to_owned())]));
    let status = api_status(
        api.replace("contended", &PostParams::default(), &late)
            .await,
    );
    assert_eq!(status.code, 409, "{status:?}");
    assert_eq!(status.reason, "Conflict");
}

#[tokio::test]
async fn a_finalizer_blocks_deletion_until_removed() {
    let cp = ControlPlane::shared().await.expect("control plane");
    let ns = cp.fresh_namespace().await.expect("namespace");
    let api: Api<ConfigMap> = Api::namespaced(cp.client().expect("admin"), &ns);
    let mut guarded = config_map("guarded");
    guarded.metadata.finalizers = Some(vec!["banlieue.io/test-protection".into()]);
    api.create(&PostParams::default(), &guarded)
        .await
        .expect("create");

    api.delete("guarded", &DeleteParams::default())
        .await
        .expect("delete is accepted");
    let still_there = api.get("guarded").await.expect("held by its finalizer");
    assert!(still_there.metadata.deletion_timestamp.is_some());

    // The resourceVersion makes the removal conditional on nothing else having changed.
    let remove = serde_json::json!({"metadata": {
        "finalizers": null,
        "resourceVersion": still_there.metadata.resource_version,
    }});
    api.patch("guarded", &PatchParams::default(), &Patch::Merge(&remove))
        .await
        .expect("remove the finalizer");
    wait_for("the object to go", DEADLINE, || {
        let api = api.clone();
        async move { Ok(api.get_opt("guarded").await?.is_none().then_some(())) }
    })
    .await
    .expect("deleted once the finalizer is gone");
}

#[tokio::test]
async fn a_service_account_gets_what_its_role_grants_and_403_beyond() {
    let cp = ControlPlane::shared().await.expect("control plane");
    let ns = cp.fresh_namespace().await.expect("namespace");
    let manifests = yaml_file(
        r#"
apiVersion: v1
kind: ServiceAccount
metadata: {name: reader}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: readable}
data: {k: v}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: configmap-reader}
rules:
- {apiGroups: [""], resources: [configmaps], verbs: [get, list]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: reader-reads-configmaps}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: configmap-reader}
subjects:
- {kind: ServiceAccount, name: reader}
"#,
    );
    let applied = cp
        .apply_yaml_in(manifests.path(), &ns)
        .await
        .expect("apply");
    assert_eq!(applied.len(), 4);
    let subjects = applied[3].data["subjects"].clone();
    assert_eq!(subjects[0]["namespace"], serde_json::Value::Null);

    let reader: Client = cp
        .client_as_service_account(&ns, "reader")
        .await
        .expect("a token for the service account");
    let config_maps: Api<ConfigMap> = Api::namespaced(reader.clone(), &ns);
    // The RoleBinding reaches the authorizer's cache asynchronously.
    wait_for("the Role to apply", DEADLINE, || {
        let config_maps = config_maps.clone();
        async move { Ok(config_maps.get("readable").await.ok().map(|_| ())) }
    })
    .await
    .expect("the Role grants get");
    let listed = config_maps.list(&Default::default()).await.expect("list");
    assert!(
        listed
            .items
            .iter()
            .any(|cm| cm.metadata.name.as_deref() == Some("readable"))
    );

    let status = api_status(
        config_maps
            .create(&PostParams::default(), &config_map("not-granted"))
            .await,
    );
    assert_eq!(status.code, 403, "{status:?}");
    assert!(
        status
            .message
            .contains(&format!("system:serviceaccount:{ns}:reader")),
        "{}",
        status.message
    );
    let secrets: Api<Secret> = Api::namespaced(reader.clone(), &ns);
    assert_eq!(
        api_status(secrets.list(&Default::default()).await).code,
        403
    );
    let accounts: Api<ServiceAccount> = Api::namespaced(reader, &ns);
    assert_eq!(api_status(accounts.get("reader").await).code, 403);
}

/// A child process reads its kubeconfig once and nothing renews the token in it, so the token
/// must outlive the longest run (agent-sandbox's controller lost its hour's token an hour into
/// the side-by-side benchmark).
#[tokio::test]
async fn a_service_account_kubeconfig_holds_a_token_for_a_day() {
    use base64::Engine as _;
    let cp = ControlPlane::shared().await.expect("control plane");
    let ns = cp.fresh_namespace().await.expect("namespace");
    let accounts: Api<ServiceAccount> = Api::namespaced(cp.client().expect("admin"), &ns);
    let account = ServiceAccount {
        metadata: ObjectMeta {
            name: Some("child".to_owned()),
            ..Default::default()
        },
        ..Default::default()
    };
    accounts
        .create(&PostParams::default(), &account)
        .await
        .expect("service account");
    let dir = tempfile::tempdir().expect("temporary directory");
    let path = dir.path().join("kubeconfig");
    cp.write_service_account_kubeconfig(&ns, "child", &path)
        .await
        .expect("kubeconfig");

    let kubeconfig: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&path).expect("read")).expect("JSON");
    let token = kubeconfig["users"][0]["user"]["token"]
        .as_str()
        .expect("a token in the kubeconfig");
    let payload = token.split('.').nth(1).expect("a JWT");
    let claims: serde_json::Value = serde_json::from_slice(
        &base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(payload)
            .expect("base64url"),
    )
    .expect("JSON claims");
    let lifetime = claims["exp"].as_i64().expect("exp") - claims["iat"].as_i64().expect("iat");
    assert_eq!(
        lifetime,
        control_plane::SERVICE_ACCOUNT_TOKEN_SECONDS,
        "{claims}"
    );
    // Longer than any run: the side-by-side benchmark takes two hours, `dev up` a working day.
    assert!(lifetime >= 12 * 3600, "a token for {lifetime} s");

    // The token is the service account's: authenticated, and refused what it was not granted.
    let options = kube::config::KubeConfigOptions::default();
    let config = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::read_from(&path).expect("kubeconfig"),
        &options,
    )
    .await
    .expect("config");
    let child = Client::try_from(config).expect("client");
    let status = api_status(
        Api::<ConfigMap>::namespaced(child, &ns)
            .list(&Default::default())
            .await,
    );
    assert_eq!(status.code, 403, "{status:?}");
    assert!(
        (status.message).contains(&format!("system:serviceaccount:{ns}:child")),
        "{}",
        status.message
    );
}

fn process_exists(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

#[tokio::test]
async fn dropping_an_owned_control_plane_leaves_no_process_port_or_directory() {
    if std::env::var_os(control_plane::EXTERNAL_KUBECONFIG_ENV).is_some() {
        eprintln!("skipped: this test is about the local control plane");
        return;
    }
    let cp = ControlPlane::start().await.expect("an owned control plane");
    let pids = cp.pids();
    let ports = cp.ports();
    let dir = cp.state_dir().expect("a local state dir").to_owned();
    let names: Vec<_> = pids.iter().map(|(name, _)| *name).collect();
    assert_eq!(
        names,
        [
            "etcd",
            "kube-apiserver",
            "kube-controller-manager",
            "janitor"
        ]
    );
    assert!(pids.iter().all(|(_, pid)| process_exists(*pid)));
    assert_eq!(ports.len(), 3);
    for port in &ports {
        assert!(
            TcpListener::bind((Ipv4Addr::LOCALHOST, *port)).is_err(),
            "port {port} is in use while running"
        );
    }
    // Each identity is a real client certificate the apiserver authenticates.
    for user in control_plane::USERS {
        let kubeconfig = cp.kubeconfig(user).expect("a kubeconfig per identity");
        assert!(kubeconfig.starts_with(&dir));
        let client = cp.client_as(user).await.expect("client");
        let api: Api<ConfigMap> = Api::namespaced(client, "kube-system");
        let status = api_status(api.list(&Default::default()).await);
        assert!(
            status
                .message
                .contains(&format!("User \"{user}\" cannot list")),
            "{}",
            status.message
        );
    }

    drop(cp);

    for (name, pid) in &pids {
        assert!(
            !process_exists(*pid),
            "{name} (pid {pid}) survived the drop"
        );
    }
    for port in &ports {
        TcpListener::bind((Ipv4Addr::LOCALHOST, *port))
            .unwrap_or_else(|e| panic!("port {port} still taken after the drop: {e}"));
    }
    assert!(!dir.exists(), "{} survived the drop", dir.display());
}

#[tokio::test]
async fn fresh_namespaces_are_labelled_and_unknown_identities_refused() {
    let cp = ControlPlane::shared().await.expect("control plane");
    let ns = cp.fresh_namespace().await.expect("namespace");
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> =
        Api::all(cp.client().expect("admin"));
    let labels = namespaces.get(&ns).await.expect("get").metadata.labels;
    assert_eq!(
        labels
            .unwrap_or_default()
            .get(control_plane::TEST_NAMESPACE_LABEL)
            .map(String::as_str),
        Some("true")
    );
    assert!(matches!(
        cp.client_as("mallory").await,
        Err(Error::UnknownIdentity(name)) if name == "mallory"
    ));
}

//! deploy/rbac/ against the real API server: the controller's ServiceAccount, bound as shipped,
//! cannot mint or rewrite a claim but can do its job; the provider's base Role is what it says.

mod common;

use banlieue_testenv::access;
use common::{apply_file, claim, claims, control_plane, create, refusal};
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding, RoleRef, Subject};
use kube::Client;
use kube::api::{Api, DynamicObject, ObjectMeta, Patch, PatchParams, PostParams};
use serde_json::json;

const CONTROLLER: &str = "system:serviceaccount:banlieue-system:banlieue-controller";

async fn install_controller(client: &Client) {
    apply_file(client, "deploy/namespace.yaml", None).await;
    apply_file(client, "deploy/controller.yaml", None).await;
    apply_file(client, "deploy/rbac/controller-clusterrole.yaml", None).await;
    apply_file(
        client,
        "deploy/rbac/controller-clusterrolebinding.yaml",
        None,
    )
    .await;
    for file in [
        "deploy/rbac/controller-leader-election-role.yaml",
        "deploy/rbac/controller-leader-election-rolebinding.yaml",
        "deploy/rbac/controller-workloads-clusterrole.yaml",
        "deploy/rbac/controller-workloads-rolebindings.yaml",
        "deploy/rbac/provider-base-clusterrole.yaml",
        "deploy/rbac/provider-cluster-clusterrole.yaml",
        "deploy/rbac/provider-class-libvirt-clusterrole.yaml",
        "deploy/rbac/import-clusterrole.yaml",
    ] {
        apply_file(client, file, None).await;
    }
    // The authorizer learns of a new binding through its informer; wait until it has.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !allowed(
        client,
        CONTROLLER,
        "get",
        "banlieue.io",
        "virtualmachineclaims",
        "default",
    )
    .await
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the controller's ClusterRoleBinding never took effect"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let lease = access::Request {
        verb: "update",
        group: "coordination.k8s.io",
        resource: "leases",
        name: Some("banlieue-controller"),
        namespace: Some("banlieue-system"),
    };
    while !access::service_account_may(client, CONTROLLER, &lease)
        .await
        .expect("SubjectAccessReview")
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the controller's leader election RoleBinding never took effect"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

/// Whether the ServiceAccount `user` may `verb` `resource` (or `resource/subresource`) in
/// `namespace`.
async fn allowed(
    client: &Client,
    user: &str,
    verb: &str,
    group: &str,
    resource: &str,
    namespace: &str,
) -> bool {
    let request = access::Request {
        verb,
        group,
        resource,
        name: None,
        namespace: Some(namespace),
    };
    access::service_account_may(client, user, &request)
        .await
        .expect("SubjectAccessReview")
}

#[tokio::test]
async fn the_controller_cannot_create_or_update_a_claim_but_can_bind_it() {
    let cp = control_plane().await;
    let admin = cp.client().expect("admin");
    install_controller(&admin).await;
    let ns = cp.fresh_namespace().await.expect("namespace");
    create(
        &claims(&admin, &ns),
        claim("sandbox-for-alice", "https://issuer.example.com", "alice"),
    )
    .await
    .expect("the user's claim");

    let controller = cp
        .client_as_service_account("banlieue-system", "banlieue-controller")
        .await
        .expect("the controller's token");
    let api = claims(&controller, &ns);

    // Minting a claim would attribute a sandbox to a subject: refused.
    let (code, message) =
        refusal(create(&api, claim("forged", "https://issuer.example.com", "bob")).await);
    assert_eq!(code, 403, "{message}");
    assert!(
        message.contains("cannot create resource \"virtualmachineclaims\""),
        "{message}"
    );

    // Rewriting one wholesale (PUT): refused, even unchanged.
    let current = api
        .get("sandbox-for-alice")
        .await
        .expect("the controller reads claims");
    let (code, message) = refusal(
        api.replace("sandbox-for-alice", &PostParams::default(), &current)
            .await,
    );
    assert_eq!(code, 403, "{message}");
    assert!(
        message.contains("cannot update resource \"virtualmachineclaims\""),
        "{message}"
    );

    // What binding needs: the finalizer (a patch) and the status.
    let patched = api
        .patch(
            "sandbox-for-alice",
            &PatchParams::default(),
            &Patch::Merge(json!({ "metadata": { "finalizers": [banlieue_api::names::FINALIZER_CLAIM_PROTECTION] } })),
        )
        .await
        .expect("the controller adds its finalizer");
    assert_eq!(
        patched.metadata.finalizers.as_deref(),
        Some(&[banlieue_api::names::FINALIZER_CLAIM_PROTECTION.to_owned()][..])
    );
    let bound = api
        .patch_status(
            "sandbox-for-alice",
            &PatchParams::default(),
            &Patch::Merge(json!({ "status": {
                "phase": "Bound",
                "virtualMachineRef": { "name": "sandbox-pool-9dmtx" },
                "boundAt": "2026-09-20T14:02:11Z",
                "expiresAt": "2026-09-20T14:17:11Z"
            } })),
        )
        .await
        .expect("the controller writes the status");
    assert_eq!(bound.data["status"]["phase"], "Bound");
    // The status subresource cannot carry a spec change in with it.
    assert_eq!(bound.data["spec"]["subject"]["id"], "alice");

    // Release: the finalizer comes off, and an expired claim is deleted.
    api.patch(
        "sandbox-for-alice",
        &PatchParams::default(),
        &Patch::Merge(json!({ "metadata": { "finalizers": null } })),
    )
    .await
    .expect("the controller removes its finalizer");
    api.delete("sandbox-for-alice", &Default::default())
        .await
        .expect("the controller deletes an expired claim");
}

#[tokio::test]
async fn the_controller_role_grants_what_it_needs_and_nothing_more() {
    let cp = control_plane().await;
    let admin = cp.client().expect("admin");
    install_controller(&admin).await;
    // A namespace no administrator enabled for Providers.
    let ns = "some-namespace";
    let b = "banlieue.io";
    let rbac = "rbac.authorization.k8s.io";
    let expect = [
        // Claims: read, patch, status, finalizers, delete; never create or update.
        ("get", b, "virtualmachineclaims", true),
        ("watch", b, "virtualmachineclaims", true),
        ("patch", b, "virtualmachineclaims", true),
        ("delete", b, "virtualmachineclaims", true),
        ("create", b, "virtualmachineclaims", false),
        ("update", b, "virtualmachineclaims", false),
        ("deletecollection", b, "virtualmachineclaims", false),
        ("patch", b, "virtualmachineclaims/status", true),
        ("update", b, "virtualmachineclaims/finalizers", true),
        // Pools: read and status only; replicas belong to the user (or an HPA).
        ("list", b, "virtualmachinepools", true),
        ("patch", b, "virtualmachinepools/status", true),
        ("patch", b, "virtualmachinepools", false),
        ("create", b, "virtualmachinepools", false),
        ("update", b, "virtualmachinepools/scale", false),
        // Members.
        ("create", b, "virtualmachines", true),
        ("delete", b, "virtualmachines", true),
        ("patch", b, "virtualmachines/status", true),
        // Machines: the controller writes the spec, the provider the status.
        ("create", b, "libvirtmachines", true),
        ("delete", b, "libvirtmachines", true),
        ("get", b, "libvirtmachines/status", true),
        ("patch", b, "libvirtmachines/status", false),
        ("update", b, "libvirtmachines", false),
        // Scheduling inputs are read-only; Providers take the operator's finalizer and, while
        // the workload cannot, its Ready condition.
        ("watch", b, "providers", true),
        ("watch", b, "vmimages", true),
        ("watch", b, "vmclasses", true),
        ("get", b, "providerclasses", true),
        ("patch", b, "providers/status", true),
        ("patch", b, "providers", true),
        ("update", b, "providers", false),
        ("patch", b, "vmimages/status", false),
        ("create", b, "providerclasses", false),
        // Events.
        ("create", "", "events", true),
        ("patch", "events.k8s.io", "events", true),
        // Workloads: watched everywhere, written only where enabled (not here).
        ("watch", "apps", "deployments", true),
        ("create", "apps", "deployments", false),
        ("create", "", "serviceaccounts", false),
        ("create", rbac, "roles", false),
        ("create", rbac, "rolebindings", false),
        // One shared ClusterRoleBinding, changed by name: no other is its to create or delete.
        ("create", rbac, "clusterrolebindings", false),
        ("delete", rbac, "clusterrolebindings", false),
        ("update", rbac, "clusterrolebindings", false),
        // Never unrestricted RBAC power.
        ("escalate", rbac, "roles", false),
        ("escalate", rbac, "clusterroles", false),
        ("bind", rbac, "clusterroles", false),
        ("bind", rbac, "roles", false),
        ("create", rbac, "clusterroles", false),
        // Nothing it does not need.
        ("get", "", "secrets", false),
        ("list", "", "secrets", false),
        ("get", "", "configmaps", false),
        ("create", "", "pods", false),
        ("create", "batch", "jobs", false),
        ("create", b, "vmimages", false),
        ("impersonate", "", "users", false),
        ("create", "", "serviceaccounts/token", false),
    ];
    let mut wrong = Vec::new();
    for (verb, group, resource, want) in expect {
        if allowed(&admin, CONTROLLER, verb, group, resource, ns).await != want {
            wrong.push(format!(
                "{verb} {group}/{resource}: expected {}",
                if want { "allowed" } else { "denied" }
            ));
        }
    }
    // Leader election (ADR-0067): its own Lease, in its own namespace, by name; `create`
    // cannot be narrowed by name, so it covers any Lease of that namespace, and no other. In
    // the namespaces enabled for Providers (banlieue-system is) it may also get and update any
    // Lease, so that it can grant each provider its own by name without `escalate`: it could
    // pause a provider, whose Deployment it writes anyway.
    let coordination = "coordination.k8s.io";
    for (verb, lease, namespace, want) in [
        ("get", Some("banlieue-controller"), "banlieue-system", true),
        (
            "update",
            Some("banlieue-controller"),
            "banlieue-system",
            true,
        ),
        ("create", None, "banlieue-system", true),
        ("update", Some("kube-scheduler"), "banlieue-system", true),
        ("get", Some("banlieue-controller"), ns, false),
        ("update", Some("banlieue-controller"), "kube-system", false),
        ("create", None, ns, false),
        ("create", None, "kube-system", false),
        (
            "delete",
            Some("banlieue-controller"),
            "banlieue-system",
            false,
        ),
        (
            "patch",
            Some("banlieue-controller"),
            "banlieue-system",
            false,
        ),
        ("list", None, "banlieue-system", false),
        ("watch", None, "banlieue-system", false),
    ] {
        let request = access::Request {
            verb,
            group: coordination,
            resource: "leases",
            name: lease,
            namespace: Some(namespace),
        };
        let answer = access::service_account_may(&admin, CONTROLLER, &request)
            .await
            .expect("SubjectAccessReview");
        if answer != want {
            wrong.push(format!(
                "{verb} leases {lease:?} in {namespace}: expected {}",
                if want { "allowed" } else { "denied" }
            ));
        }
    }
    // `bind` only on the fixed roles of ADR-0063, and only in enabled namespaces.
    for (role, namespace, want) in [
        ("banlieue-provider-base", "banlieue-system", true),
        (
            "banlieue-provider-class-libvirt",
            "banlieue-imagebuild",
            true,
        ),
        ("banlieue-import", "banlieue-system", true),
        ("banlieue-provider-base", ns, false),
        ("cluster-admin", "banlieue-system", false),
        ("admin", "banlieue-system", false),
        ("banlieue-controller", "banlieue-system", false),
    ] {
        if allowed_named(
            &admin,
            CONTROLLER,
            "bind",
            rbac,
            "clusterroles",
            role,
            namespace,
        )
        .await
            != want
        {
            wrong.push(format!(
                "bind clusterroles/{role} in {namespace}: expected {}",
                if want { "allowed" } else { "denied" }
            ));
        }
    }
    assert!(
        wrong.is_empty(),
        "the controller's ClusterRole is off:\n{}",
        wrong.join("\n")
    );
}

/// Whether the ServiceAccount `user` may `verb` the object `name` of `resource` in `namespace`.
async fn allowed_named(
    client: &Client,
    user: &str,
    verb: &str,
    group: &str,
    resource: &str,
    name: &str,
    namespace: &str,
) -> bool {
    let request = access::Request {
        verb,
        group,
        resource,
        name: Some(name),
        namespace: Some(namespace),
    };
    access::service_account_may(client, user, &request)
        .await
        .expect("SubjectAccessReview")
}

#[tokio::test]
async fn the_controller_grants_providers_only_the_fixed_roles_and_only_where_enabled() {
    let cp = control_plane().await;
    let admin = cp.client().expect("admin");
    install_controller(&admin).await;
    let ns = cp.fresh_namespace().await.expect("namespace");
    let controller = cp
        .client_as_service_account("banlieue-system", "banlieue-controller")
        .await
        .expect("the controller's token");
    let account = || ServiceAccount {
        metadata: ObjectMeta {
            name: Some("banlieue-provider-edge".into()),
            ..ObjectMeta::default()
        },
        ..ServiceAccount::default()
    };

    // Not enabled: nothing can be written there.
    let (code, message) = refusal(
        Api::<ServiceAccount>::namespaced(controller.clone(), &ns)
            .create(&PostParams::default(), &account())
            .await,
    );
    assert_eq!(code, 403, "{message}");

    // The administrator enables the namespace (docs/security.md).
    let enable: RoleBinding = serde_json::from_value(json!({
        "metadata": { "name": "banlieue-controller-workloads", "namespace": ns },
        "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                     "name": "banlieue-controller-workloads" },
        "subjects": [{ "kind": "ServiceAccount", "name": "banlieue-controller",
                       "namespace": "banlieue-system" }]
    }))
    .unwrap();
    Api::<RoleBinding>::namespaced(admin.clone(), &ns)
        .create(&PostParams::default(), &enable)
        .await
        .expect("enable the namespace");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !allowed(&admin, CONTROLLER, "create", "", "serviceaccounts", &ns).await {
        assert!(
            std::time::Instant::now() < deadline,
            "enabling never took effect"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    Api::<ServiceAccount>::namespaced(controller.clone(), &ns)
        .create(&PostParams::default(), &account())
        .await
        .expect("the controller creates the provider's ServiceAccount");

    // A Role with rules it does not hold (listing Secrets; it may only get them, to grant a
    // provider its own by name): refused, there is no `escalate`.
    let secrets_role: Role = serde_json::from_value(json!({
        "metadata": { "name": "banlieue-provider-edge", "namespace": ns },
        "rules": [{ "apiGroups": [""], "resources": ["secrets"], "verbs": ["list"] }]
    }))
    .unwrap();
    let (code, message) = refusal(
        Api::<Role>::namespaced(controller.clone(), &ns)
            .create(&PostParams::default(), &secrets_role)
            .await,
    );
    assert_eq!(code, 403, "{message}");
    assert!(message.contains("not currently held"), "{message}");

    // Binding cluster-admin: refused.
    let mut to_admin = provider_binding(&ns);
    to_admin.metadata.name = Some("to-admin".into());
    to_admin.role_ref.kind = "ClusterRole".into();
    to_admin.role_ref.name = "cluster-admin".into();
    let (code, message) = refusal(
        Api::<RoleBinding>::namespaced(controller.clone(), &ns)
            .create(&PostParams::default(), &to_admin)
            .await,
    );
    assert_eq!(code, 403, "{message}");

    // Binding the fixed base role: what the operator does.
    let mut base = provider_binding(&ns);
    base.role_ref.kind = "ClusterRole".into();
    base.role_ref.name = "banlieue-provider-base".into();
    Api::<RoleBinding>::namespaced(controller.clone(), &ns)
        .create(&PostParams::default(), &base)
        .await
        .expect("the controller binds banlieue-provider-base (bind by name)");
    let user = format!("system:serviceaccount:{ns}:banlieue-provider-edge");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !allowed(
        &admin,
        &user,
        "watch",
        "banlieue.io",
        "libvirtmachines",
        &ns,
    )
    .await
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the binding never took effect"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let provider = cp
        .client_as_service_account(&ns, "banlieue-provider-edge")
        .await
        .expect("the provider's token");
    Api::<banlieue_api::LibvirtMachine>::namespaced(provider, &ns)
        .list(&Default::default())
        .await
        .expect("the base role reaches the provider: it may list LibvirtMachines");
}

fn provider_binding(ns: &str) -> RoleBinding {
    RoleBinding {
        metadata: ObjectMeta {
            name: Some("banlieue-provider-edge".into()),
            namespace: Some(ns.to_owned()),
            ..ObjectMeta::default()
        },
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: "Role".into(),
            name: "banlieue-provider-edge".into(),
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".into(),
            name: "banlieue-provider-edge".into(),
            namespace: Some(ns.to_owned()),
            ..Subject::default()
        }]),
    }
}

#[tokio::test]
async fn the_provider_base_role_realises_machines_and_reads_no_secret() {
    let cp = control_plane().await;
    let admin = cp.client().expect("admin");
    let ns = cp.fresh_namespace().await.expect("namespace");
    apply_file(&admin, "deploy/rbac/provider-base-clusterrole.yaml", None).await;
    Api::<ServiceAccount>::namespaced(admin.clone(), &ns)
        .create(
            &PostParams::default(),
            &ServiceAccount {
                metadata: ObjectMeta {
                    name: Some("banlieue-provider-edge".into()),
                    ..ObjectMeta::default()
                },
                ..ServiceAccount::default()
            },
        )
        .await
        .expect("ServiceAccount");
    let mut binding = provider_binding(&ns);
    binding.role_ref.kind = "ClusterRole".into();
    binding.role_ref.name = "banlieue-provider-base".into();
    Api::<RoleBinding>::namespaced(admin.clone(), &ns)
        .create(&PostParams::default(), &binding)
        .await
        .expect("RoleBinding");
    let user = format!("system:serviceaccount:{ns}:banlieue-provider-edge");
    let b = "banlieue.io";
    // The authorizer learns of a new RoleBinding through its informer: wait until the first
    // grant is visible, so the matrix below checks the role, not the cache's lag.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !allowed(&admin, &user, "watch", b, "libvirtmachines", &ns).await {
        assert!(
            std::time::Instant::now() < deadline,
            "the provider's RoleBinding never took effect"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let expect = [
        // Its own Provider comes from a per-Provider Role naming it, not from here.
        ("get", b, "providers", false),
        ("patch", b, "providers/status", false),
        ("watch", b, "libvirtmachines", true),
        ("patch", b, "libvirtmachines", true),
        ("patch", b, "libvirtmachines/status", true),
        ("update", b, "libvirtmachines/finalizers", true),
        ("create", b, "libvirtmachines", false),
        ("delete", b, "libvirtmachines", false),
        // No Secret or ConfigMap: those it reads come by name from its own Role.
        ("get", "", "secrets", false),
        ("list", "", "secrets", false),
        ("watch", "", "secrets", false),
        ("get", "", "configmaps", false),
        ("watch", "", "configmaps", false),
        ("create", "", "secrets", false),
        ("create", "", "events", true),
        ("list", b, "vmimages", true),
        ("patch", b, "vmimages/status", true),
        ("patch", b, "vmimages", false),
        // It never reads what users ask for: the LibvirtMachine is the whole contract.
        ("get", b, "virtualmachines", false),
        ("get", b, "virtualmachineclaims", false),
        // Import Jobs come only from the class's role, in the build namespace.
        ("create", "batch", "jobs", false),
    ];
    let mut wrong = Vec::new();
    for (verb, group, resource, want) in expect {
        if allowed(&admin, &user, verb, group, resource, &ns).await != want {
            wrong.push(format!(
                "{verb} {group}/{resource}: expected {}",
                if want { "allowed" } else { "denied" }
            ));
        }
    }
    // And outside its namespace, nothing.
    if allowed(&admin, &user, "get", "", "secrets", "kube-system").await {
        wrong.push("get secrets in kube-system: expected denied".into());
    }
    assert!(
        wrong.is_empty(),
        "the provider's base role is off:\n{}",
        wrong.join("\n")
    );

    // A real call, as the provider: its machines' status, but not a new machine.
    let provider = cp
        .client_as_service_account(&ns, "banlieue-provider-edge")
        .await
        .expect("the provider's token");
    let resource = kube::api::ApiResource::erase::<banlieue_api::LibvirtMachine>(&());
    let machines: Api<DynamicObject> = Api::namespaced_with(provider, &ns, &resource);
    machines
        .list(&Default::default())
        .await
        .expect("list LibvirtMachines");
    let machine = json!({
        "apiVersion": "banlieue.io/v1alpha1", "kind": "LibvirtMachine",
        "metadata": { "name": "m" },
        "spec": { "providerRef": { "name": "edge" }, "pool": "default", "network": "default",
                  "disk": { "backingVolume": "base.qcow2", "size": "10Gi" }, "cpu": 1, "memory": "1Gi" }
    });
    let (code, _) = refusal(create(&machines, machine).await);
    assert_eq!(code, 403);
}

#[tokio::test]
async fn the_controller_deployment_runs_banlieue_controller_as_the_bound_service_account() {
    let cp = control_plane().await;
    let admin = cp.client().expect("admin");
    install_controller(&admin).await;
    let deployments: Api<k8s_openapi::api::apps::v1::Deployment> =
        Api::namespaced(admin.clone(), "banlieue-system");
    let deployment = deployments
        .get("banlieue-controller")
        .await
        .expect("the controller Deployment");
    let pod = deployment.spec.template.spec.expect("a pod template");
    // The ServiceAccount the ClusterRoleBinding names, so the ClusterRole is what it runs with.
    assert_eq!(
        pod.service_account_name.as_deref(),
        Some("banlieue-controller")
    );
    let binding: Api<k8s_openapi::api::rbac::v1::ClusterRoleBinding> = Api::all(admin);
    let binding = binding
        .get("banlieue-controller")
        .await
        .expect("the binding");
    let subject = &binding.subjects.expect("subjects")[0];
    assert_eq!(
        (
            subject.kind.as_str(),
            subject.name.as_str(),
            subject.namespace.as_deref()
        ),
        (
            "ServiceAccount",
            "banlieue-controller",
            Some("banlieue-system")
        )
    );
    assert_eq!(pod.containers.len(), 1);
    assert_eq!(
        pod.containers[0].args.as_deref(),
        Some(&["controller".to_owned()][..])
    );
    // Two replicas, one acting (ADR-0067): each names itself on the Lease by its pod name and
    // finds the Lease in its pod's namespace.
    assert_eq!(deployment.spec.replicas, Some(2));
    let strategy = deployment.spec.strategy.as_ref().expect("a strategy");
    assert_eq!(strategy.type_.as_deref(), Some("RollingUpdate"));
    let field_of = |name: &str| {
        pod.containers[0]
            .env
            .iter()
            .flatten()
            .find(|e| e.name == name)
            .and_then(|e| e.value_from.as_ref())
            .and_then(|v| v.field_ref.as_ref())
            .map(|f| f.field_path.clone())
    };
    assert_eq!(field_of("POD_NAME").as_deref(), Some("metadata.name"));
    assert_eq!(
        field_of("POD_NAMESPACE").as_deref(),
        Some("metadata.namespace")
    );
}

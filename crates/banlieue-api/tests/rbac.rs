//! deploy/rbac/ against the real API server: the controller's ServiceAccount, bound as shipped,
//! cannot mint or rewrite a claim but can do its job; the provider's base Role is what it says.

mod common;

use common::{apply_file, claim, claims, control_plane, create, refusal};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
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
}

/// Whether `user` may `verb` on `group`/`resource`(/`subresource`) in `namespace`, as RBAC
/// decides it.
async fn allowed(
    client: &Client,
    user: &str,
    verb: &str,
    group: &str,
    resource: &str,
    namespace: &str,
) -> bool {
    let (resource, subresource) = match resource.split_once('/') {
        Some((r, s)) => (r, Some(s.to_owned())),
        None => (resource, None),
    };
    let review = SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(user.to_owned()),
            groups: Some(vec![
                "system:serviceaccounts".into(),
                "system:serviceaccounts:banlieue-system".into(),
                "system:authenticated".into(),
            ]),
            resource_attributes: Some(ResourceAttributes {
                group: Some(group.to_owned()),
                resource: Some(resource.to_owned()),
                subresource,
                verb: Some(verb.to_owned()),
                namespace: Some(namespace.to_owned()),
                ..ResourceAttributes::default()
            }),
            ..SubjectAccessReviewSpec::default()
        },
        ..SubjectAccessReview::default()
    };
    let answer = Api::<SubjectAccessReview>::all(client.clone())
        .create(&PostParams::default(), &review)
        .await
        .expect("SubjectAccessReview");
    answer.status.is_some_and(|s| s.allowed)
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
    let ns = "some-namespace";
    let b = "banlieue.io";
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
        // Scheduling inputs are read-only, except the Provider status the operator publishes.
        ("watch", b, "providers", true),
        ("watch", b, "vmimages", true),
        ("watch", b, "vmclasses", true),
        ("get", b, "providerclasses", true),
        ("patch", b, "providers/status", true),
        ("patch", b, "providers", false),
        ("patch", b, "vmimages/status", false),
        ("create", b, "providerclasses", false),
        // Events.
        ("create", "", "events", true),
        ("patch", "events.k8s.io", "events", true),
        // Per-Provider workloads (ADR-0012).
        ("create", "apps", "deployments", true),
        ("create", "", "serviceaccounts", true),
        ("create", "rbac.authorization.k8s.io", "roles", true),
        (
            "create",
            "rbac.authorization.k8s.io",
            "clusterrolebindings",
            true,
        ),
        ("escalate", "rbac.authorization.k8s.io", "roles", true),
        ("bind", "rbac.authorization.k8s.io", "clusterroles", true),
        // Nothing it does not need.
        ("get", "", "secrets", false),
        ("get", "", "configmaps", false),
        ("create", "", "pods", false),
        ("create", "batch", "jobs", false),
        ("create", b, "vmimages", false),
        ("impersonate", "", "users", false),
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
    assert!(
        wrong.is_empty(),
        "the controller's ClusterRole is off:\n{}",
        wrong.join("\n")
    );
}

#[tokio::test]
async fn the_controller_can_grant_a_provider_its_role() {
    let cp = control_plane().await;
    let admin = cp.client().expect("admin");
    install_controller(&admin).await;
    let ns = cp.fresh_namespace().await.expect("namespace");
    let controller = cp
        .client_as_service_account("banlieue-system", "banlieue-controller")
        .await
        .expect("the controller's token");

    // The base rules, plus a ProviderClass's additionalRules, as the operator renders them:
    // rules the controller does not itself hold (Secrets, Jobs).
    let mut role: Role = serde_json::from_value(
        common::documents(&common::repo_path("deploy/rbac/provider-base-role.yaml")).remove(0),
    )
    .expect("the base Role");
    role.metadata = ObjectMeta {
        name: Some("banlieue-provider-edge".into()),
        namespace: Some(ns.clone()),
        ..ObjectMeta::default()
    };
    let class: banlieue_api::ProviderClass = serde_json::from_value(
        common::documents(&common::repo_path("examples/09-providerclass-libvirt.yaml")).remove(0),
    )
    .expect("the example ProviderClass");
    role.rules
        .get_or_insert_with(Vec::new)
        .extend(class.spec.additional_rules);
    Api::<ServiceAccount>::namespaced(controller.clone(), &ns)
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
        .expect("the controller creates the provider's ServiceAccount");
    Api::<Role>::namespaced(controller.clone(), &ns)
        .create(&PostParams::default(), &role)
        .await
        .expect("the controller creates a Role with rules it does not hold (escalate)");
    Api::<RoleBinding>::namespaced(controller.clone(), &ns)
        .create(&PostParams::default(), &provider_binding(&ns))
        .await
        .expect("the controller binds it (bind)");

    let provider = cp
        .client_as_service_account(&ns, "banlieue-provider-edge")
        .await
        .expect("the provider's token");
    let jobs: Api<k8s_openapi::api::batch::v1::Job> = Api::namespaced(provider, &ns);
    jobs.list(&Default::default())
        .await
        .expect("additionalRules reach the provider: it may list Jobs");
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
async fn the_provider_base_role_reads_its_provider_and_realises_machines_only() {
    let cp = control_plane().await;
    let admin = cp.client().expect("admin");
    let ns = cp.fresh_namespace().await.expect("namespace");
    apply_file(&admin, "deploy/rbac/provider-base-role.yaml", Some(&ns)).await;
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
    binding.role_ref.name = "banlieue-provider-base".into();
    Api::<RoleBinding>::namespaced(admin.clone(), &ns)
        .create(&PostParams::default(), &binding)
        .await
        .expect("RoleBinding");
    let user = format!("system:serviceaccount:{ns}:banlieue-provider-edge");
    let b = "banlieue.io";
    // The authorizer learns of a new RoleBinding through its informer: wait until the first
    // grant is visible, so the matrix below checks the Role, not the cache's lag.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !allowed(&admin, &user, "get", b, "providers", &ns).await {
        assert!(
            std::time::Instant::now() < deadline,
            "the provider's RoleBinding never took effect"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let expect = [
        ("get", b, "providers", true),
        ("patch", b, "providers/status", true),
        ("patch", b, "providers", false),
        ("watch", b, "libvirtmachines", true),
        ("patch", b, "libvirtmachines", true),
        ("patch", b, "libvirtmachines/status", true),
        ("update", b, "libvirtmachines/finalizers", true),
        ("create", b, "libvirtmachines", false),
        ("delete", b, "libvirtmachines", false),
        ("get", "", "secrets", true),
        ("watch", "", "configmaps", true),
        ("create", "", "secrets", false),
        ("create", "", "events", true),
        ("list", b, "vmimages", true),
        ("patch", b, "vmimages/status", true),
        ("patch", b, "vmimages", false),
        // It never reads what users ask for: the LibvirtMachine is the whole contract.
        ("get", b, "virtualmachines", false),
        ("get", b, "virtualmachineclaims", false),
        // Import Jobs come only from the ProviderClass's additionalRules.
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
        "the provider's base Role is off:\n{}",
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
}

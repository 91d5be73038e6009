//! deploy/admission/ against the real API server, with real user identities (client
//! certificates for alice, bob and broker).
//!
//! The policy binding is cluster-wide, exactly as shipped, so every step runs in order in one
//! test: before the policy, with the policy and no ConfigMap, with the shipped ConfigMap, with
//! a broker listed, and with the ConfigMap deleted again.

mod common;

use std::time::Duration;

use banlieue_testenv::control_plane::wait_for;
use common::{apply_file, claim, claims, control_plane, create, forbidden, refusal, try_claim};
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use kube::api::{Api, DeleteParams, DynamicObject, ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Client, Error};
use serde_json::{Value, json};

const ISSUER: &str = "https://issuer.example.com";
const POLICY_CONFIGMAP: &str = "banlieue-claim-subject-policy";
const SYSTEM: &str = "banlieue-system";
/// Policies and their parameters reach the admission plugin through informers: a change is in
/// force within a second or two.
const TAKES_EFFECT: Duration = Duration::from_secs(30);

/// Lets alice, bob and broker create and change claims in `namespace`: RBAC decides who may
/// create a claim at all; the policy decides whom it may name.
async fn grant_claims(client: &Client, namespace: &str) {
    let meta = |name: &str| ObjectMeta {
        name: Some(name.to_owned()),
        namespace: Some(namespace.to_owned()),
        ..ObjectMeta::default()
    };
    let role = Role {
        metadata: meta("claimers"),
        rules: Some(vec![PolicyRule {
            api_groups: Some(vec!["banlieue.io".into()]),
            resources: Some(vec!["virtualmachineclaims".into()]),
            verbs: ["create", "get", "list", "patch", "update", "delete"]
                .map(String::from)
                .to_vec(),
            ..PolicyRule::default()
        }]),
    };
    let binding = RoleBinding {
        metadata: meta("claimers"),
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: "Role".into(),
            name: "claimers".into(),
        },
        subjects: Some(
            ["alice", "bob", "broker"]
                .map(|user| Subject {
                    api_group: Some("rbac.authorization.k8s.io".into()),
                    kind: "User".into(),
                    name: user.into(),
                    ..Subject::default()
                })
                .to_vec(),
        ),
    };
    Api::<Role>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &role)
        .await
        .expect("create the Role");
    Api::<RoleBinding>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &binding)
        .await
        .expect("create the RoleBinding");
}

/// A dry-run create of a claim of `(issuer, id)` on `pool`.
async fn try_claim_on(
    api: &Api<DynamicObject>,
    pool: &str,
    issuer: &str,
    id: &str,
) -> Result<DynamicObject, Error> {
    let mut object = claim("probe", issuer, id);
    object["spec"]["poolRef"]["name"] = json!(pool);
    common::dry_run_create(api, object).await
}

/// deploy/admission/pool-claimants.yaml, with the subject policy's ConfigMap of step 4 (its
/// broker listed): a pool listing subjects, a pool listing a group, a pool listing neither.
async fn claimants(
    cp: &banlieue_testenv::control_plane::ControlPlane,
    admin: &Client,
    ns: &str,
    alice: &Api<DynamicObject>,
    bob: &Api<DynamicObject>,
    broker: &Api<DynamicObject>,
) {
    const SA_ISSUER: &str = "https://robots.example";
    let pools = common::api_for(
        admin,
        &json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachinePool"}),
        Some(ns),
    )
    .await;
    let pool = |name: &str, claimants: Value| {
        let mut object = machine_object("VirtualMachinePool", name, None);
        if !claimants.is_null() {
            object["spec"]["claimants"] = claimants;
        }
        object
    };
    for object in [
        pool(
            "alice-only",
            json!({"subjects": [{"issuer": ISSUER, "id": "alice"}]}),
        ),
        pool(
            "robots",
            json!({"groups": [format!("system:serviceaccounts:{ns}")]}),
        ),
        pool("open", Value::Null),
    ] {
        create(&pools, object).await.expect("a pool");
    }
    // ServiceAccounts of the namespace log in at an issuer of their own here, so one may claim
    // for itself, and the group of the namespace's ServiceAccounts is what `robots` lists.
    put_policy_configmap(
        admin,
        json!({
            "issuers": format!("{ISSUER}\n{SA_ISSUER}=system:serviceaccount:{ns}"),
            "brokers": "broker"
        }),
    )
    .await;
    apply_file(admin, "deploy/admission/pool-claimants.yaml", None).await;
    wait_for("the claimants policy in force", TAKES_EFFECT, || async {
        Ok(try_claim_on(bob, "alice-only", ISSUER, "bob")
            .await
            .is_err()
            .then_some(()))
    })
    .await
    .expect("the claimants policy takes effect");

    let message = forbidden(try_claim_on(bob, "alice-only", ISSUER, "bob").await);
    assert!(
        message.contains(&format!(
            "pool alice-only lists who may claim from it (spec.claimants), and neither subject \
             bob at {ISSUER} nor a group of bob is among them"
        )),
        "{message}"
    );
    try_claim_on(alice, "alice-only", ISSUER, "alice")
        .await
        .expect("a listed subject claims");
    try_claim_on(broker, "alice-only", ISSUER, "alice")
        .await
        .expect("a broker claims for a listed subject");
    forbidden(try_claim_on(broker, "alice-only", ISSUER, "bob").await);
    try_claim_on(bob, "open", ISSUER, "bob")
        .await
        .expect("a pool that lists no claimants is the namespace's");
    try_claim_on(bob, "no-such-pool", ISSUER, "bob")
        .await
        .expect("a claim on a missing pool waits with PoolNotFound");

    let builder = service_account_claimant(cp, admin, ns, "builder").await;
    wait_for("the robots' issuer to be read", TAKES_EFFECT, || async {
        Ok(try_claim_on(&builder, "robots", SA_ISSUER, "builder")
            .await
            .ok()
            .map(|_| ()))
    })
    .await
    .expect("a member of a listed group claims for itself");
    forbidden(try_claim_on(alice, "robots", ISSUER, "alice").await);
    // A broker's groups are its own: listing the broker's group lets no one else in through it.
    let message = forbidden(try_claim_on(broker, "robots", ISSUER, "alice").await);
    assert!(message.contains("nor a group of broker"), "{message}");
}

/// The claims API of ServiceAccount `name` in `namespace`, which RBAC lets create claims.
async fn service_account_claimant(
    cp: &banlieue_testenv::control_plane::ControlPlane,
    admin: &Client,
    namespace: &str,
    name: &str,
) -> Api<DynamicObject> {
    let sa: k8s_openapi::api::core::v1::ServiceAccount =
        serde_json::from_value(json!({ "metadata": { "name": name } })).expect("sa");
    Api::namespaced(admin.clone(), namespace)
        .create(&PostParams::default(), &sa)
        .await
        .expect("the ServiceAccount");
    let binding: RoleBinding = serde_json::from_value(json!({
        "metadata": { "name": format!("claimers-{name}") },
        "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "claimers" },
        "subjects": [{ "kind": "ServiceAccount", "name": name, "namespace": namespace }]
    }))
    .expect("binding");
    Api::<RoleBinding>::namespaced(admin.clone(), namespace)
        .create(&PostParams::default(), &binding)
        .await
        .expect("the ServiceAccount's RoleBinding");
    let client = cp
        .client_as_service_account(namespace, name)
        .await
        .expect("the ServiceAccount's client");
    claims(&client, namespace)
}

/// Waits until `(issuer, id)` created through `api` is allowed (`true`) or refused (`false`).
async fn wait_until(api: &Api<DynamicObject>, issuer: &str, id: &str, allowed: bool, what: &str) {
    wait_for(what, TAKES_EFFECT, || async {
        let outcome = try_claim(api, issuer, id).await;
        Ok((outcome.is_ok() == allowed).then_some(()))
    })
    .await
    .unwrap_or_else(|e| panic!("{e:?}"));
}

/// The denial of a missing ConfigMap. The API server answers 422 here (the binding cannot be
/// configured), not the 403 of a failed validation, but the request is refused all the same.
fn denied_for_missing_params(result: Result<DynamicObject, Error>) {
    let (code, message) = refusal(result);
    assert_eq!(code, 422, "{message}");
    assert!(
        message.contains("denied request") && message.contains("no params found"),
        "{message}"
    );
}

async fn put_policy_configmap(client: &Client, data: Value) {
    let configmap = json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": { "name": POLICY_CONFIGMAP, "namespace": SYSTEM },
        "data": data
    });
    Api::<ConfigMap>::namespaced(client.clone(), SYSTEM)
        .patch(
            POLICY_CONFIGMAP,
            &PatchParams::apply(common::FIELD_MANAGER).force(),
            &Patch::Apply(&configmap),
        )
        .await
        .expect("apply the policy ConfigMap");
}

#[tokio::test]
async fn the_subject_policy_ties_a_claim_to_its_creator() {
    let cp = control_plane().await;
    let admin = cp.client().expect("admin");
    let ns = cp.fresh_namespace().await.expect("namespace");
    grant_claims(&admin, &ns).await;
    let alice = claims(&cp.client_as("alice").await.expect("alice"), &ns);
    let bob = claims(&cp.client_as("bob").await.expect("bob"), &ns);
    let broker = claims(&cp.client_as("broker").await.expect("broker"), &ns);

    // 1. Without deploy/admission nothing checks the subject: RBAC alone lets alice hand a
    //    sandbox to bob's name. This is why applying deploy/admission is mandatory.
    try_claim(&alice, ISSUER, "bob")
        .await
        .expect("unchecked before deploy/admission is applied");
    try_claim(&alice, "https://unknown.example", "anyone")
        .await
        .expect("any issuer goes before deploy/admission is applied");

    // 2. The policy and its binding, but no ConfigMap yet: every claim is denied, even one
    //    naming its own creator (parameterNotFoundAction: Deny).
    apply_file(&admin, "deploy/namespace.yaml", None).await;
    apply_file(
        &admin,
        "deploy/admission/virtualmachineclaim-subject-authorization.yaml",
        None,
    )
    .await;
    wait_until(
        &alice,
        ISSUER,
        "alice",
        false,
        "the policy to deny without its ConfigMap",
    )
    .await;
    for (api, id) in [(&alice, "alice"), (&bob, "bob"), (&broker, "someone")] {
        denied_for_missing_params(try_claim(api, ISSUER, id).await);
    }

    // 3. The shipped ConfigMap: its placeholder issuer, and no brokers.
    apply_file(&admin, "deploy/admission/claim-subject-policy.yaml", None).await;
    wait_until(
        &alice,
        ISSUER,
        "alice",
        true,
        "the shipped ConfigMap to be read",
    )
    .await;
    let created = create(&alice, claim("mine", ISSUER, "alice"))
        .await
        .expect("alice naming herself is allowed");
    assert_eq!(created.data["spec"]["subject"]["id"], "alice");

    let message = forbidden(try_claim(&alice, ISSUER, "bob").await);
    assert!(
        message.contains(
            "spec.subject.id is bob but you are authenticated as alice. A claim records who a \
             sandbox VM was handed to, so it may only name its own creator (or be created by a \
             listed broker)."
        ),
        "{message}"
    );
    let message = forbidden(try_claim(&bob, ISSUER, "alice-uuid").await);
    assert!(
        message.contains("spec.subject.id is alice-uuid but you are authenticated as bob."),
        "{message}"
    );
    // Brokers are empty by default: the broker identity is just another user.
    let message = forbidden(try_claim(&broker, ISSUER, "alice").await);
    assert!(
        message.contains("you are authenticated as broker"),
        "{message}"
    );
    // An issuer the site does not list.
    let message = forbidden(try_claim(&alice, "https://evil.example", "alice").await);
    assert!(
        message.contains(
            "spec.subject.issuer https://evil.example is not an issuer this site accepts"
        ),
        "{message}"
    );

    // A claim is its subject's alone: bob may neither relabel alice's claim nor release it.
    let message = forbidden(
        try_patch(
            &bob,
            "mine",
            json!({ "metadata": { "labels": { "reviewed-by": "bob" } } }),
        )
        .await,
    );
    assert!(
        message.contains(&format!(
            "VirtualMachineClaim mine is the sandbox of alice at {ISSUER}: only its subject, a \
             listed broker or an administrator may change it, and you are bob"
        )),
        "{message}"
    );
    let (code, message) = refusal(bob.delete("mine", &DeleteParams::default()).await);
    assert_eq!(code, 403, "{message}");
    assert!(
        message.contains("may delete it, and you are bob"),
        "{message}"
    );
    // Its subject may label it, but not touch banlieue's finalizer.
    try_patch(
        &alice,
        "mine",
        json!({ "metadata": { "labels": { "purpose": "ci" } } }),
    )
    .await
    .expect("the subject labels their own claim");
    let message = forbidden(
        try_patch(
            &alice,
            "mine",
            json!({ "metadata": { "finalizers": ["banlieue.io/claim-protection"] } }),
        )
        .await,
    );
    assert!(
        message.contains(
            "finalizer banlieue.io/claim-protection is written only by banlieue's controller: alice"
        ),
        "{message}"
    );
    // A ServiceAccount is the cluster's identity, not a user of an issuer listed without a
    // prefix: it may not claim under that issuer as its own username.
    let robot = service_account_claimant(cp, &admin, &ns, "robot").await;
    let robot_name = format!("system:serviceaccount:{ns}:robot");
    let message = forbidden(try_claim(&robot, ISSUER, &robot_name).await);
    assert!(
        message.contains(&format!(
            "but you ({robot_name}) were authenticated by no issuer this site lists"
        )),
        "{message}"
    );
    // ...and the spec stays as it was created.
    let (code, message) = refusal(
        bob.patch(
            "mine",
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": { "subject": { "id": "bob" } } })),
        )
        .await,
    );
    assert!(code == 422 || code == 403, "{code}: {message}");
    assert!(message.contains("spec is immutable"), "{message}");

    // 4. A site's ConfigMap, written loosely: commas and newlines, blanks and a comment.
    put_policy_configmap(
        &admin,
        json!({
            "issuers": "# our two issuers\n https://issuer.example.com ,https://login.example.org \n\n",
            "brokers": "\n  broker  \n"
        }),
    )
    .await;
    wait_until(
        &broker,
        ISSUER,
        "0c3b7f2e-1d4a-4b6c-9e8f-5a2d1c0b9e7f",
        true,
        "the broker to be listed",
    )
    .await;
    for id in ["alice", "bob", "0c3b7f2e-1d4a-4b6c-9e8f-5a2d1c0b9e7f"] {
        try_claim(&broker, ISSUER, id)
            .await
            .unwrap_or_else(|e| panic!("the broker may name {id}: {e}"));
    }
    // spec.handover is the subject's challenge to its VM (ADR-0077): alice writes hers, and
    // not even a listed broker, who may otherwise change her claim, may write it.
    let challenge = |credential: &str, binding: &str| json!({ "spec": { "handover": { "credential": credential, "binding": binding.repeat(64) } } });
    try_patch(&alice, "mine", challenge("AAAA", "0"))
        .await
        .expect("the subject writes her challenge");
    try_patch(
        &broker,
        "mine",
        json!({ "metadata": { "labels": { "brokered": "yes" } } }),
    )
    .await
    .expect("a broker changes a claim");
    let message = forbidden(try_patch(&broker, "mine", challenge("BBBB", "1")).await);
    assert!(
        message.contains(&format!(
            "spec.handover of VirtualMachineClaim mine is the challenge of its subject, alice at \
             {ISSUER}, to its VM: only that subject may write it, and you are broker"
        )),
        "{message}"
    );
    let message =
        forbidden(try_patch(&broker, "mine", json!({ "spec": { "handover": null } })).await);
    assert!(
        message.contains("only that subject may write it"),
        "{message}"
    );
    // Her challenge stands; the rest of her spec stays as created.
    let (code, message) = refusal(
        alice
            .patch(
                "mine",
                &PatchParams::default(),
                &Patch::Merge(json!({ "spec": { "ttlSeconds": 7200 } })),
            )
            .await,
    );
    assert!(code == 422 || code == 403, "{code}: {message}");
    assert!(
        message.contains("spec is immutable but for spec.handover"),
        "{message}"
    );
    try_claim(&alice, "https://login.example.org", "alice")
        .await
        .expect("the second, comma-separated issuer is accepted");
    // Still no issuer outside the list, even for a broker: brokering is about who, not where.
    let message = forbidden(try_claim(&broker, "https://evil.example", "alice").await);
    assert!(
        message.contains("is not an issuer this site accepts"),
        "{message}"
    );
    // A comment line is not an issuer.
    forbidden(try_claim(&alice, "# our two issuers", "alice").await);
    // Listing a broker changes nothing for others.
    forbidden(try_claim(&alice, ISSUER, "bob").await);

    claimants(cp, &admin, &ns, &alice, &bob, &broker).await;

    // The listed broker may release a sandbox it did not make; the subject releases its own,
    // and an administrator any.
    create(&alice, claim("brokered", ISSUER, "alice"))
        .await
        .expect("alice's second claim");
    create(&alice, claim("own", ISSUER, "alice"))
        .await
        .expect("alice's third claim");
    broker
        .delete("brokered", &DeleteParams::default())
        .await
        .expect("a broker releases any claim");
    alice
        .delete("own", &DeleteParams::default())
        .await
        .expect("the subject releases their own claim");
    claims(&admin, &ns)
        .delete("mine", &DeleteParams::default())
        .await
        .expect("an administrator releases any claim");

    // A prefix ends at its separator: `ali` is `ali:`, which alice's username does not carry,
    // so alice is still the unprefixed issuer's user and may not pass for `ce` at `ali`.
    put_policy_configmap(
        &admin,
        json!({
            "issuers": format!("{ISSUER}\nhttps://prefixed.example=ali"),
            "brokers": "",
            "administrators": "bob"
        }),
    )
    .await;
    // A username listed in `administrators` may release anyone's claim (which is also how
    // this waits for the new ConfigMap to be read).
    create(&alice, claim("for-the-admin", ISSUER, "alice"))
        .await
        .expect("alice's claim");
    wait_for(
        "bob to be read as an administrator",
        TAKES_EFFECT,
        || async {
            Ok(bob
                .delete("for-the-admin", &DeleteParams::default())
                .await
                .ok()
                .map(|_| ()))
        },
    )
    .await
    .expect("bob, listed in administrators, releases alice's claim");
    let message = forbidden(try_claim(&alice, "https://prefixed.example", "ce").await);
    assert!(
        message.contains(&format!("but you (alice) were authenticated by {ISSUER}")),
        "{message}"
    );

    // 5. The ConfigMap deleted: back to denying everything.
    Api::<ConfigMap>::namespaced(admin.clone(), SYSTEM)
        .delete(POLICY_CONFIGMAP, &DeleteParams::default())
        .await
        .expect("delete the ConfigMap");
    wait_until(
        &broker,
        ISSUER,
        "alice",
        false,
        "the policy to deny after the ConfigMap is gone",
    )
    .await;
    for (api, id) in [(&alice, "alice"), (&broker, "alice")] {
        denied_for_missing_params(try_claim(api, ISSUER, id).await);
    }
}

/// Lets alice and bob write VirtualMachines, pools and LibvirtMachines in `namespace`, and
/// alice alone read the Secret `readable` (and no other).
async fn grant_machines(client: &Client, namespace: &str, readable: &str) {
    let meta = |name: &str| ObjectMeta {
        name: Some(name.to_owned()),
        namespace: Some(namespace.to_owned()),
        ..ObjectMeta::default()
    };
    let bind = |name: &str, users: &[&str]| RoleBinding {
        metadata: meta(name),
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: "Role".into(),
            name: name.into(),
        },
        subjects: Some(
            users
                .iter()
                .map(|user| Subject {
                    api_group: Some("rbac.authorization.k8s.io".into()),
                    kind: "User".into(),
                    name: (*user).into(),
                    ..Subject::default()
                })
                .collect(),
        ),
    };
    let writers = Role {
        metadata: meta("machine-writers"),
        rules: Some(vec![PolicyRule {
            api_groups: Some(vec!["banlieue.io".into()]),
            resources: Some(
                [
                    "virtualmachines",
                    "virtualmachinepools",
                    "libvirtmachines",
                    "vspheremachines",
                ]
                .map(String::from)
                .to_vec(),
            ),
            verbs: ["create", "get", "list", "patch", "update"]
                .map(String::from)
                .to_vec(),
            ..PolicyRule::default()
        }]),
    };
    let reader = Role {
        metadata: meta("user-data-reader"),
        rules: Some(vec![PolicyRule {
            api_groups: Some(vec!["".into()]),
            resources: Some(vec!["secrets".into()]),
            resource_names: Some(vec![readable.into()]),
            verbs: vec!["get".into()],
            ..PolicyRule::default()
        }]),
    };
    let roles = Api::<Role>::namespaced(client.clone(), namespace);
    let bindings = Api::<RoleBinding>::namespaced(client.clone(), namespace);
    for (role, users) in [(writers, &["alice", "bob"][..]), (reader, &["alice"][..])] {
        let name = role.metadata.name.clone().expect("named");
        roles
            .create(&PostParams::default(), &role)
            .await
            .expect("create the Role");
        bindings
            .create(&PostParams::default(), &bind(&name, users))
            .await
            .expect("create the RoleBinding");
    }
}

fn vm_spec(secret: Option<&str>) -> Value {
    let mut spec = json!({
        "classRef": { "name": "small" },
        "imageRef": { "name": "ubuntu-2404" },
        "storageClassName": "standard",
        "networkClassName": "prod"
    });
    if let Some(name) = secret {
        spec["userDataSecretRef"] = json!({ "name": name, "key": "user-data" });
    }
    spec
}

/// A VirtualMachine, VirtualMachinePool, LibvirtMachine or VSphereMachine naming `secret` as
/// user-data.
fn machine_object(kind: &str, name: &str, secret: Option<&str>) -> Value {
    let spec = match kind {
        "VirtualMachine" => vm_spec(secret),
        "VirtualMachinePool" => json!({
            "replicas": 0,
            "updateStrategy": { "type": "Replace", "maxSurge": 1 },
            "template": { "spec": vm_spec(secret) }
        }),
        _ => {
            let mut spec = if kind == "VSphereMachine" {
                json!({
                    "providerRef": { "name": "vcenter" },
                    "datacenter": "DC0",
                    "cluster": "DC0_C0",
                    "template": "/DC0/vm/ubuntu-2404",
                    "cpu": 1,
                    "memory": "256Mi"
                })
            } else {
                json!({
                    "providerRef": { "name": "edge" },
                    "pool": "default",
                    "network": "default",
                    "disk": { "backingVolume": "base.raw", "size": "1Gi" },
                    "cpu": 1,
                    "memory": "256Mi"
                })
            };
            if let Some(name) = secret {
                spec["userDataSecretRef"] = json!({ "name": name, "key": "user-data" });
            }
            spec
        }
    };
    json!({
        "apiVersion": "banlieue.io/v1alpha1",
        "kind": kind,
        "metadata": { "name": name },
        "spec": spec
    })
}

async fn api_of(client: &Client, kind: &str, namespace: &str) -> Api<DynamicObject> {
    common::api_for(client, &machine_object(kind, "x", None), Some(namespace)).await
}

/// A dry-run create of `kind` naming `secret`.
async fn try_machine(
    api: &Api<DynamicObject>,
    kind: &str,
    secret: Option<&str>,
) -> Result<DynamicObject, Error> {
    common::dry_run_create(api, machine_object(kind, "probe", secret)).await
}

#[tokio::test]
async fn only_a_writer_who_may_read_a_secret_names_it_as_user_data() {
    const KINDS: [&str; 4] = [
        "VirtualMachine",
        "VirtualMachinePool",
        "LibvirtMachine",
        "VSphereMachine",
    ];
    let cp = control_plane().await;
    let admin = cp.client().expect("admin");
    let ns = cp.fresh_namespace().await.expect("namespace");
    grant_machines(&admin, &ns, "cloud-init").await;
    let alice_client = cp.client_as("alice").await.expect("alice");
    let bob_client = cp.client_as("bob").await.expect("bob");

    // Before the policy RBAC alone decides, and it does not look at the reference: bob, who
    // may read no Secret, names the provider's credentials.
    let bob_vms = api_of(&bob_client, "VirtualMachine", &ns).await;
    try_machine(&bob_vms, "VirtualMachine", Some("libvirt-creds"))
        .await
        .expect("unchecked before deploy/admission is applied");

    apply_file(
        &admin,
        "deploy/admission/user-data-secret-authorization.yaml",
        None,
    )
    .await;
    wait_for("the user-data policy in force", TAKES_EFFECT, || async {
        let outcome = try_machine(&bob_vms, "VirtualMachine", Some("libvirt-creds")).await;
        Ok(outcome.is_err().then_some(()))
    })
    .await
    .expect("the policy takes effect");

    for kind in KINDS {
        let alice = api_of(&alice_client, kind, &ns).await;
        let bob = api_of(&bob_client, kind, &ns).await;
        // Only the controller creates machines (reserved-metadata.yaml, which another test of
        // this binary may apply at any moment): on machine kinds the writer changes the
        // reference of a machine the administrator made, which no VirtualMachine owns.
        let try_machine = async |api: &Api<DynamicObject>, kind: &str, secret: Option<&str>| {
            if kind.ends_with("Machine") && kind != "VirtualMachine" {
                let reference = secret.map(|name| json!({ "name": name, "key": "user-data" }));
                let params = PatchParams {
                    dry_run: true,
                    ..PatchParams::default()
                };
                api.patch(
                    "direct",
                    &params,
                    &Patch::Merge(json!({ "spec": { "userDataSecretRef": reference } })),
                )
                .await
            } else {
                try_machine(api, kind, secret).await
            }
        };
        if kind != "VirtualMachine" && kind.ends_with("Machine") {
            create(
                &api_of(&admin, kind, &ns).await,
                machine_object(kind, "direct", Some("other")),
            )
            .await
            .unwrap_or_else(|e| panic!("{kind}: the administrator's machine: {e}"));
        }
        // A Secret the writer may read, and no Secret at all, pass.
        try_machine(&alice, kind, Some("cloud-init"))
            .await
            .unwrap_or_else(|e| panic!("{kind}: alice may name what she may read: {e}"));
        try_machine(&bob, kind, None)
            .await
            .unwrap_or_else(|e| panic!("{kind}: no reference, nothing to check: {e}"));
        // Any other is refused, naming the Secret and the writer.
        let message = forbidden(try_machine(&alice, kind, Some("libvirt-creds")).await);
        assert!(
            message.contains(&format!(
                "userDataSecretRef names Secret libvirt-creds in namespace {ns}, which alice may \
                 not get"
            )),
            "{kind}: {message}"
        );
        let message = forbidden(try_machine(&bob, kind, Some("cloud-init")).await);
        assert!(
            message.contains("which bob may not get"),
            "{kind}: {message}"
        );
    }

    // UPDATE: an unchanged reference is not checked again, a changed one is.
    let admin_vms = api_of(&admin, "VirtualMachine", &ns).await;
    create(
        &admin_vms,
        machine_object("VirtualMachine", "web", Some("libvirt-creds")),
    )
    .await
    .expect("the admin may name any Secret");
    bob_vms
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({ "metadata": { "labels": { "team": "b" } } })),
        )
        .await
        .expect("a metadata change keeps the reference");
    let message = forbidden(
        bob_vms
            .patch(
                "web",
                &PatchParams::default(),
                &Patch::Merge(json!({ "spec": { "userDataSecretRef": { "name": "other" } } })),
            )
            .await,
    );
    assert!(message.contains("Secret other"), "{message}");
}

/// A VirtualMachine as the controller makes a pool's member: the pool label and a controller
/// reference to the pool; a bound one carries the claim label and `bound-at` instead.
fn member(name: &str, pool: &DynamicObject, bound: bool) -> Value {
    let mut object = machine_object("VirtualMachine", name, None);
    let pool_name = pool.metadata.name.clone().expect("pool name");
    object["metadata"]["ownerReferences"] = json!([{
        "apiVersion": "banlieue.io/v1alpha1",
        "kind": "VirtualMachinePool",
        "name": pool_name,
        "uid": pool.metadata.uid.clone().expect("pool uid"),
        "controller": true,
        "blockOwnerDeletion": true
    }]);
    object["metadata"]["labels"] = if bound {
        json!({ "banlieue.io/claim": "victims-claim", "team": "a" })
    } else {
        json!({ "banlieue.io/pool": pool_name, "team": "a" })
    };
    if bound {
        object["metadata"]["annotations"] =
            json!({ "banlieue.io/bound-at": "2026-01-01T00:00:00Z" });
    }
    object
}

async fn try_patch(
    api: &Api<DynamicObject>,
    name: &str,
    patch: Value,
) -> Result<DynamicObject, Error> {
    api.patch(name, &PatchParams::default(), &Patch::Merge(patch))
        .await
}

/// A merge patch of `name` that the API server refuses with a 403 saying `says`.
async fn patch_refused(api: &Api<DynamicObject>, name: &str, patch: Value, says: &str) {
    let message = forbidden(try_patch(api, name, patch.clone()).await);
    assert!(message.contains(says), "{name} {patch}: {message}");
}

/// The controller's ServiceAccount, allowed to write machines in `namespace`: the one identity
/// the reserved-metadata policy lets through.
async fn controller_client(
    cp: &banlieue_testenv::control_plane::ControlPlane,
    namespace: &str,
) -> Client {
    let admin = cp.client().expect("admin");
    let apply = PatchParams::apply(common::FIELD_MANAGER).force();
    Api::<k8s_openapi::api::core::v1::Namespace>::all(admin.clone())
        .patch(
            SYSTEM,
            &apply,
            &Patch::Apply(json!({
                "apiVersion": "v1", "kind": "Namespace", "metadata": { "name": SYSTEM }
            })),
        )
        .await
        .expect("the system namespace");
    Api::<k8s_openapi::api::core::v1::ServiceAccount>::namespaced(admin.clone(), SYSTEM)
        .patch(
            "banlieue-controller",
            &apply,
            &Patch::Apply(json!({
                "apiVersion": "v1", "kind": "ServiceAccount",
                "metadata": { "name": "banlieue-controller", "namespace": SYSTEM }
            })),
        )
        .await
        .expect("the controller's ServiceAccount");
    Api::<RoleBinding>::namespaced(admin, namespace)
        .create(
            &PostParams::default(),
            &RoleBinding {
                metadata: ObjectMeta {
                    name: Some("controller-writes-machines".into()),
                    namespace: Some(namespace.into()),
                    ..ObjectMeta::default()
                },
                role_ref: RoleRef {
                    api_group: Some("rbac.authorization.k8s.io".into()),
                    kind: "Role".into(),
                    name: "machine-writers".into(),
                },
                subjects: Some(vec![Subject {
                    kind: "ServiceAccount".into(),
                    name: "banlieue-controller".into(),
                    namespace: Some(SYSTEM.into()),
                    ..Subject::default()
                }]),
            },
        )
        .await
        .expect("bind the controller's ServiceAccount");
    cp.client_as_service_account(SYSTEM, "banlieue-controller")
        .await
        .expect("the controller's client")
}

#[tokio::test]
async fn only_the_controller_writes_what_makes_a_member_or_a_claims_vm() {
    let cp = control_plane().await;
    let admin = cp.client().expect("admin");
    let ns = cp.fresh_namespace().await.expect("namespace");
    grant_machines(&admin, &ns, "cloud-init").await;
    let mallory = cp.client_as("bob").await.expect("bob");
    let mallory_vms = api_of(&mallory, "VirtualMachine", &ns).await;
    let mallory_machines = api_of(&mallory, "LibvirtMachine", &ns).await;

    // The controller's objects, made before the policy: a pool, an unclaimed and a bound member.
    let admin_pools = api_of(&admin, "VirtualMachinePool", &ns).await;
    let pool = create(
        &admin_pools,
        machine_object("VirtualMachinePool", "victims-pool", None),
    )
    .await
    .expect("the pool");
    let admin_vms = api_of(&admin, "VirtualMachine", &ns).await;
    create(&admin_vms, member("warm", &pool, false))
        .await
        .expect("a member");
    let bound = create(&admin_vms, member("bound", &pool, true))
        .await
        .expect("a bound member");
    let admin_machines = api_of(&admin, "LibvirtMachine", &ns).await;
    create(
        &admin_machines,
        machine_object("LibvirtMachine", "victims-machine", None),
    )
    .await
    .expect("a claimed VM's machine");
    let mut owned = machine_object("LibvirtMachine", "bound-machine", None);
    owned["metadata"]["ownerReferences"] = json!([{
        "apiVersion": "banlieue.io/v1alpha1",
        "kind": "VirtualMachine",
        "name": "bound",
        "uid": bound.metadata.uid.clone().expect("uid"),
        "controller": true,
        "blockOwnerDeletion": true
    }]);
    owned["metadata"]["finalizers"] = json!(["banlieue.io/domain-protection"]);
    create(&admin_machines, owned)
        .await
        .expect("the bound member's machine");

    // Without the policy RBAC alone decides: a writer of VirtualMachines plants a member.
    let planted = || member("planted", &pool, false);
    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let plant = |object: Value| {
        let api = mallory_vms.clone();
        let params = dry_run.clone();
        async move {
            let object: DynamicObject = serde_json::from_value(object).expect("object");
            api.create(&params, &object).await
        }
    };
    plant(planted())
        .await
        .expect("unchecked before deploy/admission is applied");

    apply_file(&admin, "deploy/admission/reserved-metadata.yaml", None).await;
    wait_for(
        "the reserved-metadata policy in force",
        TAKES_EFFECT,
        || async { Ok(plant(planted()).await.is_err().then_some(())) },
    )
    .await
    .expect("the policy takes effect");

    // Planting: the pool label, or the pool's controller reference alone, is refused.
    let message = forbidden(plant(planted()).await);
    assert!(
        message.contains("label banlieue.io/pool is written only by banlieue's controller: bob"),
        "{message}"
    );
    let mut owned_only = planted();
    owned_only["metadata"]["labels"] = json!({ "team": "b" });
    let message = forbidden(plant(owned_only).await);
    assert!(
        message.contains("ownerReferences to banlieue objects"),
        "{message}"
    );
    // A VirtualMachine of one's own, with labels of one's own, is still fine.
    let mut own = machine_object("VirtualMachine", "mine", None);
    own["metadata"]["labels"] = json!({ "team": "b" });
    plant(own).await.expect("a user's own VirtualMachine");

    // Relabelling a member, stretching a bound member's TTL, freeing it from its claim.
    let rows = [
        (
            "warm",
            json!({ "metadata": { "labels": { "banlieue.io/pool": "elsewhere" } } }),
            "label banlieue.io/pool",
        ),
        (
            "warm",
            json!({ "metadata": { "labels": { "banlieue.io/pool": null } } }),
            "label banlieue.io/pool",
        ),
        (
            "bound",
            json!({ "metadata": { "annotations": { "banlieue.io/bound-at": "2099-01-01T00:00:00Z" } } }),
            "annotation banlieue.io/bound-at",
        ),
        (
            "bound",
            json!({ "metadata": { "labels": { "banlieue.io/claim": null } } }),
            "label banlieue.io/claim",
        ),
        (
            "bound",
            json!({ "metadata": { "ownerReferences": [] } }),
            "ownerReferences to banlieue objects",
        ),
    ];
    for (name, patch, key) in rows {
        let message = forbidden(try_patch(&mallory_vms, name, patch.clone()).await);
        assert!(
            message.contains(key) && message.contains("bob"),
            "{name} {patch}: {message}"
        );
    }
    // What is not banlieue's stays the users': a label of their own on a member.
    try_patch(
        &mallory_vms,
        "warm",
        json!({ "metadata": { "labels": { "team": "b" } } }),
    )
    .await
    .expect("a label of the user's own");

    // The machine kinds: a planted failure domain or a reference to a VirtualMachine.
    let mut machine = machine_object("LibvirtMachine", "planted-machine", None);
    machine["metadata"]["annotations"] = json!({ "banlieue.io/failure-domain": "host-a" });
    let object: DynamicObject = serde_json::from_value(machine).expect("object");
    let message = forbidden(mallory_machines.create(&dry_run, &object).await);
    assert!(
        message.contains("annotation banlieue.io/failure-domain"),
        "{message}"
    );

    // Saving another user's running VM (ADR-0073), or making a machine of one's own that
    // asks for it.
    let message = forbidden(
        try_patch(
            &mallory_machines,
            "victims-machine",
            json!({ "spec": { "standby": "Saved" } }),
        )
        .await,
    );
    assert!(
        message.contains(
            "spec.standby of a LibvirtMachine is written only by banlieue's controller: bob"
        ),
        "{message}"
    );
    let mut saved = machine_object("LibvirtMachine", "saved-machine", None);
    saved["spec"]["standby"] = json!("Saved");
    let object: DynamicObject = serde_json::from_value(saved).expect("object");
    let message = forbidden(mallory_machines.create(&dry_run, &object).await);
    assert!(message.contains("spec.standby"), "{message}");
    // Other fields of a machine stay RBAC's to decide.
    try_patch(
        &mallory_machines,
        "victims-machine",
        json!({ "metadata": { "labels": { "team": "b" } } }),
    )
    .await
    .expect("a label of the user's own on a machine");

    // A member's spec is what its guest is built from at placement: rewriting a warm member's
    // image or user-data, or a bound one's, would choose the OS a victim's claim binds.
    for (name, says) in [
        ("warm", "is a member of a pool"),
        ("bound", "is bound to claim victims-claim"),
    ] {
        let message = forbidden(
            try_patch(
                &mallory_vms,
                name,
                json!({ "spec": { "userData": "#cloud-config\nruncmd: [evil]\n" } }),
            )
            .await,
        );
        assert!(
            message.contains(&format!(
                "spec of VirtualMachine {name} is written only by banlieue's controller: it {says}, so bob may not change it"
            )),
            "{message}"
        );
    }
    // The machine a VirtualMachine owns: its network, its finalizer.
    patch_refused(
        &mallory_machines,
        "bound-machine",
        json!({ "spec": { "network": "management-lan" } }),
        "spec of LibvirtMachine bound-machine is written only by banlieue's controller: it \
         belongs to a VirtualMachine",
    )
    .await;
    patch_refused(
        &mallory_machines,
        "bound-machine",
        json!({ "metadata": { "finalizers": null } }),
        "finalizer banlieue.io/domain-protection is written only by banlieue: bob",
    )
    .await;
    patch_refused(
        &mallory_vms,
        "warm",
        json!({ "metadata": { "finalizers": ["banlieue.io/machine-protection"] } }),
        "finalizer banlieue.io/machine-protection",
    )
    .await;
    // A machine written directly, with nothing forged, is still not the controller's.
    let object: DynamicObject =
        serde_json::from_value(machine_object("LibvirtMachine", "direct", None)).expect("object");
    let message = forbidden(mallory_machines.create(&dry_run, &object).await);
    assert!(
        message.contains("a LibvirtMachine is made only by banlieue's controller"),
        "{message}"
    );
    // A VirtualMachine of one's own keeps a spec of one's own.
    let mut own = machine_object("VirtualMachine", "own", None);
    own["metadata"]["labels"] = json!({ "team": "b" });
    create(&mallory_vms, own)
        .await
        .expect("bob's own VirtualMachine");
    try_patch(
        &mallory_vms,
        "own",
        json!({ "spec": { "userData": "#cloud-config\n" } }),
    )
    .await
    .expect("bob changes his own VirtualMachine's spec");

    // The controller's own ServiceAccount writes all of it.
    let controller_client = controller_client(cp, &ns).await;
    try_patch(
        &api_of(&controller_client, "LibvirtMachine", &ns).await,
        "victims-machine",
        json!({ "spec": { "standby": "Saved" } }),
    )
    .await
    .expect("the controller asks a machine to save");
    let controller = api_of(&controller_client, "VirtualMachine", &ns).await;
    try_patch(
        &controller,
        "warm",
        json!({ "metadata": { "labels": { "banlieue.io/pool": null, "banlieue.io/claim": "c" } } }),
    )
    .await
    .expect("the controller binds a member");
    try_patch(
        &controller,
        "bound",
        json!({ "spec": { "userData": "#cloud-config\n" } }),
    )
    .await
    .expect("the controller writes a member's spec");
    let object: DynamicObject = serde_json::from_value(planted()).expect("object");
    controller
        .create(&dry_run, &object)
        .await
        .expect("the controller makes members");
}

/// A VMImage whose one Url source pulls with `secret`.
fn image_object(name: &str, secret: Option<&str>) -> Value {
    let mut source = json!({
        "providerClass": "libvirt",
        "kind": "Url",
        "url": "oci://registry.example/images/ubuntu:24.04"
    });
    if let Some(secret) = secret {
        source["pullSecretName"] = json!(secret);
    }
    json!({
        "apiVersion": "banlieue.io/v1alpha1",
        "kind": "VMImage",
        "metadata": { "name": name },
        "spec": { "installMode": "Immediate", "sources": [source] }
    })
}

/// A dry-run create of a VMImage pulling with `secret`.
async fn try_image(api: &Api<DynamicObject>, secret: Option<&str>) -> Result<DynamicObject, Error> {
    common::dry_run_create(api, image_object("probe", secret)).await
}

/// Where registry credentials live: the build namespace, beside the Jobs that pull with them.
const BUILD_NS: &str = "banlieue-imagebuild";

/// The image builder pulls with the Secret a VMImage names, in the build namespace: only a
/// writer who may read those credentials there may name them. alice and bob may both write
/// VMImages; only alice may read `registry-alice`, and nobody but the administrator
/// `registry-ops`. A provider of the VMImage's namespace, which may read that namespace's
/// Secrets, cannot read either.
#[tokio::test]
async fn only_a_writer_who_may_read_a_pull_secret_names_it() {
    let cp = control_plane().await;
    let admin = cp.client().expect("admin");
    let ns = cp.fresh_namespace().await.expect("namespace");
    let namespace: k8s_openapi::api::core::v1::Namespace =
        serde_json::from_value(json!({ "metadata": { "name": BUILD_NS } })).expect("namespace");
    match Api::all(admin.clone())
        .create(&PostParams::default(), &namespace)
        .await
    {
        Ok(_) => {}
        Err(Error::Api(status)) if status.code == 409 => {}
        Err(e) => panic!("the build namespace: {e}"),
    }
    let reader_name = format!("registry-alice-reader-{ns}");
    let alice_client = cp
        .tenant_writing(&ns, "alice", "vmimages")
        .await
        .expect("alice");
    let bob_client = cp
        .tenant_writing(&ns, "bob", "vmimages")
        .await
        .expect("bob");
    let reader: Role = serde_json::from_value(json!({
        "metadata": { "name": reader_name },
        "rules": [{ "apiGroups": [""], "resources": ["secrets"],
                    "resourceNames": ["registry-alice"], "verbs": ["get"] }]
    }))
    .expect("role");
    Api::<Role>::namespaced(admin.clone(), BUILD_NS)
        .create(&PostParams::default(), &reader)
        .await
        .expect("the reader Role");
    let binding: RoleBinding = serde_json::from_value(json!({
        "metadata": { "name": reader_name },
        "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                     "name": reader_name },
        "subjects": [{ "apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "alice" }]
    }))
    .expect("binding");
    Api::<RoleBinding>::namespaced(admin.clone(), BUILD_NS)
        .create(&PostParams::default(), &binding)
        .await
        .expect("the reader RoleBinding");
    let shape = image_object("x", None);
    let alice = common::api_for(&alice_client, &shape, Some(ns.as_str())).await;
    let bob = common::api_for(&bob_client, &shape, Some(ns.as_str())).await;
    let admin_images = common::api_for(&admin, &shape, Some(ns.as_str())).await;

    // Before the policy RBAC alone decides, and it does not look at the reference.
    try_image(&bob, Some("registry-ops"))
        .await
        .expect("unchecked before deploy/admission is applied");

    apply_file(
        &admin,
        "deploy/admission/pull-secret-authorization.yaml",
        None,
    )
    .await;
    wait_for("the pull-secret policy in force", TAKES_EFFECT, || async {
        Ok(try_image(&bob, Some("registry-ops"))
            .await
            .is_err()
            .then_some(()))
    })
    .await
    .expect("the policy takes effect");

    try_image(&alice, Some("registry-alice"))
        .await
        .expect("alice may name what she may read");
    try_image(&bob, None)
        .await
        .expect("no credentials, nothing to check");
    let message = forbidden(try_image(&alice, Some("registry-ops")).await);
    assert!(
        message.contains(&format!(
            "pullSecretName names Secret registry-ops in namespace {BUILD_NS}, which alice may \
             not get"
        )),
        "{message}"
    );
    let message = forbidden(try_image(&bob, Some("registry-alice")).await);
    assert!(message.contains("which bob may not get"), "{message}");

    // UPDATE: credentials the image already named are not checked again; new ones are.
    create(&admin_images, image_object("ubuntu", Some("registry-ops")))
        .await
        .expect("the administrator may name any Secret");
    bob.patch(
        "ubuntu",
        &PatchParams::default(),
        &Patch::Merge(json!({ "metadata": { "labels": { "team": "b" } } })),
    )
    .await
    .expect("a metadata change keeps the credentials");
    let mut changed = image_object("ubuntu", Some("registry-alice"));
    changed["metadata"] = json!({ "name": "ubuntu" });
    let message = forbidden(
        bob.patch(
            "ubuntu",
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": changed["spec"] })),
        )
        .await,
    );
    assert!(message.contains("Secret registry-alice"), "{message}");
    // Re-pointing a source that keeps its credentials is a new use of them: the team's
    // registry-ops pulls from a repository bob chose.
    let mut repointed = image_object("ubuntu", Some("registry-ops"));
    repointed["spec"]["sources"][0]["url"] = json!("oci://registry.example/bobs/anything:1");
    patch_refused(
        &bob,
        "ubuntu",
        json!({ "spec": repointed["spec"] }),
        &format!("pullSecretName names Secret registry-ops in namespace {BUILD_NS}, which bob may not get"),
    )
    .await;
    // So is a second source borrowing them.
    let mut added = image_object("ubuntu", Some("registry-ops"));
    let mut second = added["spec"]["sources"][0].clone();
    second["providerClass"] = json!("vsphere");
    second["url"] = json!("oci://registry.example/bobs/other:1");
    added["spec"]["sources"]
        .as_array_mut()
        .expect("sources")
        .push(second);
    patch_refused(
        &bob,
        "ubuntu",
        json!({ "spec": added["spec"] }),
        "Secret registry-ops",
    )
    .await;
    // alice may read registry-alice: re-pointing a source that names it is hers to do.
    let mut alices = image_object("ubuntu", Some("registry-alice"));
    alices["spec"]["sources"][0]["url"] = json!("oci://registry.example/alice/other:1");
    alice
        .patch(
            "ubuntu",
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": alices["spec"] })),
        )
        .await
        .expect("credentials their writer may read");
    Api::<DynamicObject>::delete(&admin_images, "ubuntu", &DeleteParams::default())
        .await
        .expect("delete");

    // A provider of the VMImage's namespace, as the operator grants it (the shipped
    // banlieue-provider-base, bound there), reads no Secret there but by its own Role's names
    // (none of them a registry's), and never the registry credentials in the build namespace.
    apply_file(&admin, "deploy/rbac/provider-base-clusterrole.yaml", None).await;
    let account = "banlieue-provider-edge";
    let sa: k8s_openapi::api::core::v1::ServiceAccount =
        serde_json::from_value(json!({ "metadata": { "name": account } })).expect("sa");
    Api::namespaced(admin.clone(), &ns)
        .create(&PostParams::default(), &sa)
        .await
        .expect("the provider's account");
    let base: RoleBinding = serde_json::from_value(json!({
        "metadata": { "name": account },
        "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                     "name": "banlieue-provider-base" },
        "subjects": [{ "kind": "ServiceAccount", "name": account, "namespace": ns.clone() }]
    }))
    .expect("binding");
    Api::<RoleBinding>::namespaced(admin.clone(), &ns)
        .create(&PostParams::default(), &base)
        .await
        .expect("the provider's base RoleBinding");
    let secret = |name: &str| -> k8s_openapi::api::core::v1::Secret {
        serde_json::from_value(json!({
            "metadata": { "name": name },
            "type": "kubernetes.io/dockerconfigjson",
            "stringData": { ".dockerconfigjson": "{\"auths\":{}}" }
        }))
        .expect("secret")
    };
    for namespace in [ns.as_str(), BUILD_NS] {
        match Api::namespaced(admin.clone(), namespace)
            .create(&PostParams::default(), &secret("registry-ops"))
            .await
        {
            Ok(_) => {}
            Err(Error::Api(status)) if status.code == 409 => {}
            Err(e) => panic!("the Secret in {namespace}: {e}"),
        }
    }
    let provider = cp
        .client_as_service_account(&ns, account)
        .await
        .expect("the provider's client");
    let read = |namespace: &str| {
        Api::<k8s_openapi::api::core::v1::Secret>::namespaced(provider.clone(), namespace)
    };
    let images = common::api_for(&provider, &shape, Some(ns.as_str())).await;
    wait_for("the provider's grant in force", TAKES_EFFECT, || async {
        Ok(images.list(&Default::default()).await.is_ok().then_some(()))
    })
    .await
    .expect("the provider's base grant");
    for namespace in [ns.as_str(), BUILD_NS] {
        match read(namespace).get("registry-ops").await {
            Err(Error::Api(status)) if status.code == 403 => {}
            other => panic!("a provider read registry credentials in {namespace}: {other:?}"),
        }
    }
}

/// Two providers share a namespace, each holding the machine rights of its role: only the
/// one a machine names may write its status or its finalizers. Tried as the other provider's
/// own ServiceAccount.
#[tokio::test]
async fn only_the_machines_provider_writes_it() {
    let cp = control_plane().await;
    let admin = cp.client().expect("admin");
    let ns = cp.fresh_namespace().await.expect("namespace");
    let accounts = ["banlieue-provider-edge-a", "banlieue-provider-edge-b"];
    for account in accounts {
        let sa: k8s_openapi::api::core::v1::ServiceAccount =
            serde_json::from_value(json!({ "metadata": { "name": account } })).expect("sa");
        Api::namespaced(admin.clone(), &ns)
            .create(&PostParams::default(), &sa)
            .await
            .expect("the account");
    }
    let role: Role = serde_json::from_value(json!({
        "metadata": { "name": "machine-rights" },
        "rules": [{ "apiGroups": ["banlieue.io"],
                    "resources": ["libvirtmachines", "libvirtmachines/status",
                                  "libvirtmachines/finalizers"],
                    "verbs": ["get", "list", "watch", "patch"] }]
    }))
    .expect("role");
    Api::<Role>::namespaced(admin.clone(), &ns)
        .create(&PostParams::default(), &role)
        .await
        .expect("the Role");
    let binding: RoleBinding = serde_json::from_value(json!({
        "metadata": { "name": "machine-rights" },
        "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                     "name": "machine-rights" },
        "subjects": accounts.map(|a| json!({ "kind": "ServiceAccount", "name": a,
                                             "namespace": ns.clone() }))
    }))
    .expect("binding");
    Api::<RoleBinding>::namespaced(admin.clone(), &ns)
        .create(&PostParams::default(), &binding)
        .await
        .expect("the RoleBinding");
    let shape = machine_object("LibvirtMachine", "x", None);
    let admin_machines = common::api_for(&admin, &shape, Some(ns.as_str())).await;
    let mut machine = machine_object("LibvirtMachine", "web", None);
    machine["spec"]["providerRef"]["name"] = json!("edge-a");
    create(&admin_machines, machine)
        .await
        .expect("the controller's machine, naming edge-a");
    let as_account = |account: &'static str| {
        let ns = ns.clone();
        let shape = shape.clone();
        async move {
            let client = cp
                .client_as_service_account(&ns, account)
                .await
                .expect("token");
            common::api_for(&client, &shape, Some(ns.as_str())).await
        }
    };
    let ours = as_account(accounts[0]).await;
    let theirs = as_account(accounts[1]).await;
    let status = json!({ "status": { "addresses": [{ "type": "InternalIP",
                                                      "address": "10.0.0.9" }] } });
    let finalizer = json!({ "metadata": { "finalizers": ["banlieue.io/held"] } });
    // Before the policy RBAC alone decides: edge-b may write edge-a's machine.
    wait_for("edge-b's grant", TAKES_EFFECT, || async {
        Ok(theirs
            .patch_status("web", &PatchParams::default(), &Patch::Merge(&status))
            .await
            .ok()
            .map(|_| ()))
    })
    .await
    .expect("unchecked before deploy/admission is applied");

    apply_file(
        &admin,
        "deploy/admission/machine-provider-writes.yaml",
        None,
    )
    .await;
    wait_for(
        "the machine-writes policy in force",
        TAKES_EFFECT,
        || async {
            let outcome = theirs
                .patch_status("web", &PatchParams::default(), &Patch::Merge(&status))
                .await;
            Ok(outcome.is_err().then_some(()))
        },
    )
    .await
    .expect("the policy takes effect");

    let message = forbidden(
        theirs
            .patch_status("web", &PatchParams::default(), &Patch::Merge(&status))
            .await,
    );
    assert!(
        message.contains(&format!(
            "system:serviceaccount:{ns}:banlieue-provider-edge-b may not write libvirtmachines/status web: it names Provider edge-a"
        )),
        "{message}"
    );
    let message = forbidden(
        theirs
            .patch("web", &PatchParams::default(), &Patch::Merge(&finalizer))
            .await,
    );
    assert!(
        message.contains("may not write libvirtmachines web"),
        "{message}"
    );
    // Moving the machine to itself first is the same write.
    let message = forbidden(
        theirs
            .patch(
                "web",
                &PatchParams::default(),
                &Patch::Merge(json!({ "spec": { "providerRef": { "name": "edge-b" } } })),
            )
            .await,
    );
    assert!(message.contains("it names Provider edge-a"), "{message}");
    // The machine's own provider writes as before.
    ours.patch_status("web", &PatchParams::default(), &Patch::Merge(&status))
        .await
        .expect("edge-a writes its machine's status");
    ours.patch("web", &PatchParams::default(), &Patch::Merge(&finalizer))
        .await
        .expect("edge-a holds its machine");
    ours.patch(
        "web",
        &PatchParams::default(),
        &Patch::Merge(json!({ "metadata": { "finalizers": null } })),
    )
    .await
    .expect("edge-a lets go");
}

/// A namespace's user whose role grants `*/status` (common in namespace-admin roles) may not
/// write what the controller acts on: a member's status (copied onto its claim for the
/// subject) or a pool's. The controller and administrators still may.
#[tokio::test]
async fn only_the_controller_writes_member_and_pool_status() {
    let cp = control_plane().await;
    let admin = cp.client().expect("admin");
    let ns = cp.fresh_namespace().await.expect("namespace");
    let role: Role = serde_json::from_value(json!({
        "metadata": { "name": "status-writers" },
        "rules": [{ "apiGroups": ["banlieue.io"],
                    "resources": ["virtualmachines/status", "virtualmachinepools/status",
                                  "virtualmachineclaims/status"],
                    "verbs": ["get", "patch", "update"] }]
    }))
    .expect("role");
    Api::<Role>::namespaced(admin.clone(), &ns)
        .create(&PostParams::default(), &role)
        .await
        .expect("the Role");
    let binding: RoleBinding = serde_json::from_value(json!({
        "metadata": { "name": "status-writers" },
        "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                     "name": "status-writers" },
        "subjects": [{ "apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "bob" }]
    }))
    .expect("binding");
    Api::<RoleBinding>::namespaced(admin.clone(), &ns)
        .create(&PostParams::default(), &binding)
        .await
        .expect("the RoleBinding");
    let bob = cp.client_as("bob").await.expect("bob");
    let vm = machine_object("VirtualMachine", "member", None);
    create(&api_of(&admin, "VirtualMachine", &ns).await, vm)
        .await
        .expect("a VirtualMachine");
    let pool = machine_object("VirtualMachinePool", "pool", None);
    create(&api_of(&admin, "VirtualMachinePool", &ns).await, pool)
        .await
        .expect("a pool");
    let forged =
        json!({ "status": { "addresses": [{ "type": "InternalIP", "address": "10.9.9.9" }] } });
    let pool_status = json!({ "status": { "readyReplicas": 3 } });
    let write = |client: Client, kind: &'static str, name: &'static str, patch: Value| {
        let ns = ns.clone();
        async move {
            api_of(&client, kind, &ns)
                .await
                .patch_status(name, &PatchParams::default(), &Patch::Merge(patch))
                .await
        }
    };
    // Before the policy, RBAC alone decides.
    write(bob.clone(), "VirtualMachine", "member", forged.clone())
        .await
        .expect("unchecked before deploy/admission is applied");

    apply_file(&admin, "deploy/admission/status-writers.yaml", None).await;
    wait_for("the status policy in force", TAKES_EFFECT, || async {
        Ok(
            write(bob.clone(), "VirtualMachine", "member", forged.clone())
                .await
                .is_err()
                .then_some(()),
        )
    })
    .await
    .expect("the policy takes effect");
    for (kind, name, patch) in [
        ("VirtualMachine", "member", forged.clone()),
        ("VirtualMachinePool", "pool", pool_status.clone()),
    ] {
        let message = forbidden(write(bob.clone(), kind, name, patch).await);
        assert!(
            message.contains(&format!(
                "status of {kind} {name} is written only by banlieue's controller: bob may not write it"
            )),
            "{message}"
        );
    }
    write(admin.clone(), "VirtualMachinePool", "pool", pool_status)
        .await
        .expect("an administrator writes any status");
    let controller = controller_client(cp, &ns).await;
    let status_role: RoleBinding = serde_json::from_value(json!({
        "metadata": { "name": "controller-status" },
        "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                     "name": "status-writers" },
        "subjects": [{ "kind": "ServiceAccount", "name": "banlieue-controller",
                       "namespace": SYSTEM }]
    }))
    .expect("binding");
    Api::<RoleBinding>::namespaced(admin.clone(), &ns)
        .create(&PostParams::default(), &status_role)
        .await
        .expect("the controller's status RoleBinding");
    wait_for(
        "the controller writes a member's status",
        TAKES_EFFECT,
        || async {
            Ok(write(
                controller.clone(),
                "VirtualMachine",
                "member",
                forged.clone(),
            )
            .await
            .ok()
            .map(|_| ()))
        },
    )
    .await
    .expect("the controller writes a member's status");
}

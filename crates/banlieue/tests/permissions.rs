//! The effective permissions of every banlieue identity, as the real API server's authorizer
//! answers them after `banlieue bootstrap` and the operator's grants for the guide's Provider,
//! compared with the committed table in docs/security.md: any widening is a reviewed diff.
//!
//! The administrator (admin) applies bootstrap, the ProviderClasses and the Providers (libvirt
//! and vSphere), as the guides do; the operator runs as the controller's ServiceAccount and
//! makes the grants itself.
//!
//! The table answers the questions it asks. So that a widening no row asks about is seen too,
//! each identity also asks the API server for all its rules (SelfSubjectRulesReview, as that
//! identity) in each namespace, pinned with insta: a new rule is a reviewed snapshot diff.

use std::time::Duration;

use banlieue::bootstrap;
use banlieue_operator::{OperatorConfig, run_operator};
use banlieue_testenv::access;
use banlieue_testenv::control_plane::ControlPlane;
use kube::Client;

const PROVIDER: &str = "libvirt-edge-host-7";
const SYSTEM: &str = "banlieue-system";
const BUILD: &str = "banlieue-imagebuild";
/// Any namespace an administrator did not enable.
const OTHER: &str = "default";

const IDENTITIES: [(&str, &str); 6] = [
    (
        "controller",
        "system:serviceaccount:banlieue-system:banlieue-controller",
    ),
    (
        "provider",
        "system:serviceaccount:banlieue-system:banlieue-provider-libvirt-edge-host-7",
    ),
    // The guide's Provider's own import account (`workloads::import_account_name`).
    (
        "import",
        "system:serviceaccount:banlieue-imagebuild:banlieue-import-banlieue-system-libvirt-edge-host-7-729e95a3",
    ),
    (
        "imagebuilder",
        "system:serviceaccount:banlieue-system:banlieue-imagebuilder",
    ),
    (
        "build",
        "system:serviceaccount:banlieue-imagebuild:banlieue-build",
    ),
    (
        "vsphere provider",
        "system:serviceaccount:banlieue-system:banlieue-provider-vcenter-lab",
    ),
];

/// One question to the authorizer: verb, group, resource (with `/subresource`), object name,
/// and whether the resource is cluster-scoped.
struct Ask(
    &'static str,
    &'static str,
    &'static str,
    Option<&'static str>,
    bool,
);

const B: &str = "banlieue.io";
const RBAC: &str = "rbac.authorization.k8s.io";
const COORDINATION: &str = "coordination.k8s.io";

const ASKS: &[Ask] = &[
    Ask("get", "", "secrets", None, false),
    // The guide's libvirt Provider's credentials, and the vSphere one's: each provider reads
    // its own by name, not the other's.
    Ask("get", "", "secrets", Some("libvirt-edge-creds"), false),
    Ask("get", "", "secrets", Some("vcenter-lab-creds"), false),
    Ask("get", "", "configmaps", Some("libvirt-edge-ca"), false),
    Ask("list", "", "secrets", None, false),
    Ask("watch", "", "secrets", None, false),
    Ask("get", "", "configmaps", None, false),
    Ask("list", "", "configmaps", None, false),
    Ask("get", "", "persistentvolumeclaims", None, false),
    Ask("create", "", "pods", None, false),
    Ask("create", "", "pods/exec", None, false),
    Ask("create", "", "serviceaccounts", None, false),
    Ask("create", "", "serviceaccounts/token", None, false),
    Ask("create", "apps", "deployments", None, false),
    Ask("create", "batch", "jobs", None, false),
    Ask("delete", "batch", "jobs", None, false),
    Ask("create", RBAC, "roles", None, false),
    Ask("escalate", RBAC, "roles", None, false),
    Ask("create", RBAC, "rolebindings", None, false),
    Ask(
        "bind",
        RBAC,
        "clusterroles",
        Some("banlieue-provider-base"),
        false,
    ),
    Ask("bind", RBAC, "clusterroles", Some("cluster-admin"), false),
    Ask("bind", RBAC, "clusterroles", Some("cluster-admin"), true),
    Ask(
        "bind",
        RBAC,
        "clusterroles",
        Some("banlieue-provider-cluster"),
        true,
    ),
    Ask("escalate", RBAC, "clusterroles", None, true),
    Ask("create", RBAC, "clusterroles", None, true),
    Ask("create", RBAC, "clusterrolebindings", None, true),
    Ask("delete", RBAC, "clusterrolebindings", None, true),
    Ask(
        "update",
        RBAC,
        "clusterrolebindings",
        Some("banlieue-providers"),
        true,
    ),
    Ask(
        "update",
        RBAC,
        "clusterrolebindings",
        Some("banlieue-controller"),
        true,
    ),
    Ask(
        "update",
        COORDINATION,
        "leases",
        Some("banlieue-controller"),
        false,
    ),
    Ask(
        "update",
        COORDINATION,
        "leases",
        Some("another-lease"),
        false,
    ),
    // Each provider's own Lease: only that provider (and the controller, which grants it).
    Ask(
        "update",
        COORDINATION,
        "leases",
        Some("banlieue-provider-libvirt-edge-host-7"),
        false,
    ),
    Ask(
        "update",
        COORDINATION,
        "leases",
        Some("banlieue-provider-vcenter-lab"),
        false,
    ),
    Ask("create", COORDINATION, "leases", None, false),
    Ask("create", B, "virtualmachineclaims", None, false),
    Ask("update", B, "virtualmachineclaims", None, false),
    Ask("patch", B, "virtualmachineclaims", None, false),
    Ask("patch", B, "virtualmachineclaims/status", None, false),
    Ask("patch", B, "virtualmachinepools", None, false),
    Ask("create", B, "virtualmachines", None, false),
    Ask("create", B, "libvirtmachines", None, false),
    Ask("patch", B, "libvirtmachines", None, false),
    Ask("patch", B, "libvirtmachines/status", None, false),
    Ask("patch", B, "vspheremachines", None, false),
    Ask("patch", B, "vspheremachines/status", None, false),
    Ask("get", B, "providers", Some(PROVIDER), false),
    Ask("get", B, "providers", Some("another-host"), false),
    Ask("list", B, "providers", None, false),
    Ask("patch", B, "providers", None, false),
    Ask("patch", B, "providers/status", Some(PROVIDER), false),
    Ask("patch", B, "providers/status", Some("another-host"), false),
    Ask("get", B, "vmimages", None, false),
    Ask("patch", B, "vmimages/status", None, false),
    Ask("list", B, "providerclasses", None, true),
    Ask("create", B, "providerclasses", None, true),
    Ask("get", "", "nodes", None, true),
    Ask("impersonate", "", "users", None, true),
];

async fn allowed(client: &Client, user: &str, ask: &Ask, namespace: Option<&str>) -> bool {
    let Ask(verb, group, resource, name, _) = *ask;
    let request = access::Request {
        verb,
        group,
        resource,
        name,
        namespace,
    };
    access::service_account_may(client, user, &request)
        .await
        .expect("SubjectAccessReview")
}

/// Where `user` may do `ask`: `all`, a list of `system` (the Providers' namespace), `build`,
/// `other`, or `yes`/`—` for cluster-scoped resources.
async fn cell(client: &Client, user: &str, ask: &Ask) -> String {
    if ask.4 {
        return if allowed(client, user, ask, None).await {
            "yes".into()
        } else {
            "—".into()
        };
    }
    let mut places = Vec::new();
    for (label, ns) in [("system", SYSTEM), ("build", BUILD), ("other", OTHER)] {
        if allowed(client, user, ask, Some(ns)).await {
            places.push(label);
        }
    }
    match places.len() {
        0 => "—".into(),
        3 => "all".into(),
        _ => places.join(", "),
    }
}

async fn table(client: &Client) -> String {
    let mut out = String::from("| verb | resource |");
    let mut rule = String::from("|---|---|");
    for (label, _) in IDENTITIES {
        out.push_str(&format!(" {label} |"));
        rule.push_str("---|");
    }
    out.push('\n');
    out.push_str(&rule);
    out.push('\n');
    for ask in ASKS {
        let Ask(verb, group, resource, name, _) = ask;
        let mut shown = if group.is_empty() {
            (*resource).to_owned()
        } else {
            format!("{resource}.{group}")
        };
        if let Some(name) = name {
            shown.push_str(&format!(" `{name}`"));
        }
        if ask.4 {
            shown.push_str(" (cluster)");
        }
        let mut row = format!("| {verb} | {shown} |");
        for (_, user) in IDENTITIES {
            row.push_str(&format!(" {} |", cell(client, user, ask).await));
        }
        out.push_str(&row);
        out.push('\n');
    }
    out
}

/// The committed table, between the markers in docs/security.md.
fn committed() -> String {
    let path = banlieue_testenv::repo_path("docs/security.md");
    let text = std::fs::read_to_string(path).expect("docs/security.md");
    let begin = "<!-- permissions:begin -->\n";
    let start = text.find(begin).expect("the begin marker") + begin.len();
    let end = text
        .find("<!-- permissions:end -->")
        .expect("the end marker");
    text[start..end].to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_identity_holds_exactly_the_documented_permissions() {
    let cp = ControlPlane::shared().await.expect("control plane");
    let admin = cp.client().expect("admin");
    let objects = bootstrap::bootstrap_objects().expect("bootstrap objects");
    bootstrap::apply_all(&admin, &objects, |_| {})
        .await
        .expect("bootstrap");
    for example in [
        "examples/09-providerclass-libvirt.yaml",
        "examples/02-provider-libvirt-edge.yaml",
        "examples/09-providerclass-vsphere.yaml",
        "examples/04-provider-vsphere.yaml",
    ] {
        let (_, text) = bootstrap::EXAMPLES
            .iter()
            .find(|(name, _)| *name == example)
            .expect("an embedded example");
        let objects = bootstrap::objects_of(&[(example, text)]).expect("example objects");
        bootstrap::apply_all(&admin, &objects, |_| {})
            .await
            .expect("apply the example");
    }

    let controller = cp
        .client_as_service_account(SYSTEM, "banlieue-controller")
        .await
        .expect("the controller's token");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let operator = tokio::spawn(run_operator(
        controller,
        OperatorConfig {
            namespace: Some(SYSTEM.into()),
            backends: banlieue::backends::workloads(),
            ..OperatorConfig::default()
        },
        async move {
            let _ = stopped.await;
        },
    ));

    // The operator's grants are in place once the authorizer lets each identity do the one
    // thing only they give it.
    let (_, provider) = IDENTITIES[1];
    let (_, import) = IDENTITIES[2];
    assert_eq!(
        import,
        format!(
            "system:serviceaccount:{BUILD}:{}",
            banlieue_operator::workloads::import_account_name(SYSTEM, PROVIDER)
        ),
        "the import identity is not the guide's Provider's own import account"
    );
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    for (user, ask, ns) in [
        (provider, Ask("create", "batch", "jobs", None, false), BUILD),
        (
            provider,
            Ask("get", B, "providers", Some(PROVIDER), false),
            SYSTEM,
        ),
        (
            provider,
            Ask("watch", B, "libvirtmachines", None, false),
            SYSTEM,
        ),
        (
            provider,
            Ask("list", B, "providerclasses", None, true),
            SYSTEM,
        ),
        (
            import,
            Ask("get", "", "secrets", Some("libvirt-edge-creds"), false),
            SYSTEM,
        ),
        (
            IDENTITIES[5].1,
            Ask("watch", B, "vspheremachines", None, false),
            SYSTEM,
        ),
        // Bootstrap's own RoleBinding, which the authorizer learns of like the others.
        (
            IDENTITIES[0].1,
            Ask(
                "update",
                COORDINATION,
                "leases",
                Some("banlieue-controller"),
                false,
            ),
            SYSTEM,
        ),
    ] {
        let ns = (!ask.4).then_some(ns);
        while !allowed(&admin, user, &ask, ns).await {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the operator's grants never took effect ({} {})",
                ask.0,
                ask.2
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    let actual = table(&admin).await;
    let mut rules = Vec::new();
    for (label, user) in IDENTITIES {
        let client = client_of(cp, user).await;
        rules.push((label, effective_rules(&client).await));
    }
    workloads_are_pinned(cp, &admin).await;
    let _ = stop.send(());
    let _ = operator.await;
    assert!(
        actual == committed(),
        "the permissions differ from docs/security.md; if the change is intended, replace the \
         table there with:\n\n{actual}"
    );
    for (label, rules) in rules {
        insta::assert_snapshot!(format!("rules_{}", label.replace(' ', "_")), rules);
    }
}

/// A client with the token of `user`, a `system:serviceaccount:<namespace>:<name>`.
async fn client_of(cp: &ControlPlane, user: &str) -> Client {
    let mut parts = user.split(':').skip(2);
    let (ns, name) = (parts.next().expect("ns"), parts.next().expect("name"));
    cp.client_as_service_account(ns, name)
        .await
        .expect("the identity's token")
}

/// Every rule the API server says `client`'s identity holds in each namespace the table looks
/// at, one line per rule, sorted: `verbs | groups | resources | names`. The self-review rules
/// every authenticated user holds are left out: they are Kubernetes', not banlieue's.
async fn effective_rules(client: &Client) -> String {
    use k8s_openapi::api::authorization::v1::{SelfSubjectRulesReview, SelfSubjectRulesReviewSpec};
    let reviews: kube::Api<SelfSubjectRulesReview> = kube::Api::all(client.clone());
    let mut out = String::new();
    for (label, ns) in [("system", SYSTEM), ("build", BUILD), ("other", OTHER)] {
        let review = SelfSubjectRulesReview {
            spec: SelfSubjectRulesReviewSpec {
                namespace: Some(ns.to_owned()),
            },
            ..Default::default()
        };
        let answer = reviews
            .create(&Default::default(), &review)
            .await
            .expect("SelfSubjectRulesReview");
        let status = answer.status.expect("a status");
        let join = |xs: &[String]| {
            let mut xs = xs.to_vec();
            xs.sort();
            xs.join(",")
        };
        let mut lines: Vec<String> = status
            .resource_rules
            .iter()
            .filter(|r| {
                !r.api_groups
                    .as_deref()
                    .unwrap_or_default()
                    .iter()
                    .all(|g| g == "authorization.k8s.io" || g == "authentication.k8s.io")
                    || r.api_groups.as_deref().unwrap_or_default().is_empty()
            })
            .map(|r| {
                format!(
                    "{} | {} | {} | {}",
                    join(&r.verbs),
                    join(r.api_groups.as_deref().unwrap_or_default()),
                    join(r.resources.as_deref().unwrap_or_default()),
                    join(r.resource_names.as_deref().unwrap_or_default()),
                )
            })
            .collect();
        lines.sort();
        lines.dedup();
        out.push_str(&format!("# {label} ({ns})\n"));
        for line in lines {
            out.push_str(&line);
            out.push('\n');
        }
    }
    out
}

/// `deploy/admission/workload-pins.yaml` and the `restricted` Pod Security labels bootstrap puts
/// on its namespaces: each identity that may create Jobs or Deployments, as itself, may create
/// what banlieue makes and is refused a privileged, hostPath, host-network, foreign-image or
/// foreign-account variant of it, with a message naming what was refused; a privileged pod is
/// refused in the build namespace even to the administrator.
async fn workloads_are_pinned(cp: &ControlPlane, admin: &Client) {
    use k8s_openapi::api::apps::v1::Deployment;
    use k8s_openapi::api::batch::v1::Job;
    use k8s_openapi::api::core::v1::Pod;
    use kube::api::{Api, PostParams};
    use serde_json::{Value, json};

    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    // A privileged pod in a banlieue namespace is refused by Pod Security, whoever asks.
    let pods: Api<Pod> = Api::namespaced(admin.clone(), BUILD);
    let pod = |security: Value| -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "pod-security-probe"},
            "spec": {"containers": [{"name": "c", "image": bootstrap::DEFAULT_IMAGE,
                "securityContext": security}]}
        }))
        .expect("a Pod")
    };
    let refused = pods
        .create(&dry_run, &pod(json!({"privileged": true})))
        .await
        .expect_err("a privileged pod in the build namespace");
    assert!(
        refused
            .to_string()
            .contains("violates PodSecurity \"restricted"),
        "{refused}"
    );
    let restricted = pod(
        json!({"allowPrivilegeEscalation": false, "runAsNonRoot": true,
        "runAsUser": 65532, "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"}}),
    );
    pods.create(&dry_run, &restricted)
        .await
        .expect("a restricted pod in the build namespace");

    for file in ["workload-images.yaml", "workload-pins.yaml"] {
        let text =
            std::fs::read_to_string(banlieue_testenv::repo_path("deploy/admission").join(file))
                .expect("the policy file");
        let objects = bootstrap::objects_of(&[(file, text.as_str())]).expect("policy objects");
        bootstrap::apply_all(admin, &objects, |_| {})
            .await
            .expect("apply the policy");
    }

    // What each identity makes: the operator's Deployment for the guide's Provider, the image
    // builder's build Job, and the same Job as a provider's import (its own account).
    let provider_account = format!("banlieue-provider-{PROVIDER}");
    let deployment = Api::<Deployment>::namespaced(admin.clone(), SYSTEM)
        .get(&provider_account)
        .await
        .expect("the operator's Deployment");
    let mut deployment = serde_json::to_value(deployment).expect("json");
    deployment["metadata"] = json!({"name": "pinned-probe"});
    deployment["status"] = Value::Null;
    let settings = banlieue_imagebuilder::decide::BuildSettings::default();
    let mut build = serde_json::to_value(banlieue_imagebuilder::decide::build_job(
        &settings,
        SYSTEM,
        "probe",
        &format!("sha256:{}", "0".repeat(64)),
        "127.0.0.1:5000/probe@sha256:0",
        banlieue_api::artifacts::Sharing::OneNode,
    ))
    .expect("json");
    build["metadata"]["name"] = json!("pinned-probe");
    use banlieue_operator::workloads::import_account_name;
    let mut import = build.clone();
    import["spec"]["template"]["spec"]["serviceAccountName"] =
        json!(import_account_name(SYSTEM, PROVIDER));

    /// What is changed, how (on the pod template's spec), and what the refusal says.
    type Variant = (&'static str, fn(&mut Value), &'static str);
    let variants: [Variant; 7] = [
        (
            "privileged",
            |p| {
                // The API server itself refuses privileged without escalation.
                p["containers"][0]["securityContext"]["privileged"] = json!(true);
                p["containers"][0]["securityContext"]["allowPrivilegeEscalation"] = json!(true);
            },
            "unprivileged, non-root containers",
        ),
        (
            "added capability",
            |p| p["containers"][0]["securityContext"]["capabilities"]["add"] = json!(["SYS_ADMIN"]),
            "without added",
        ),
        (
            "hostPath",
            |p| {
                let root = json!({"name": "root", "hostPath": {"path": "/"}});
                match p["volumes"].as_array_mut() {
                    Some(volumes) => volumes.push(root),
                    None => p["volumes"] = json!([root]),
                }
            },
            "may not mount a hostPath volume (root)",
        ),
        (
            "hostNetwork",
            |p| p["hostNetwork"] = json!(true),
            "host network",
        ),
        (
            "runtime class",
            |p| p["runtimeClassName"] = json!("banlieue-test-node"),
            "may not choose a runtime class",
        ),
        (
            "foreign image",
            |p| p["containers"][0]["image"] = json!("attacker.example/root:1"),
            "not attacker.example/root:1",
        ),
        (
            "foreign account",
            |p| p["serviceAccountName"] = json!("banlieue-controller"),
            "running as ServiceAccount banlieue-controller",
        ),
    ];
    let controller = IDENTITIES[0].1;
    let provider = IDENTITIES[1].1;
    let imagebuilder = IDENTITIES[3].1;
    for (user, namespace, object) in [
        (controller, SYSTEM, &deployment),
        (imagebuilder, BUILD, &build),
        (provider, BUILD, &import),
    ] {
        let name = user.rsplit(':').next().unwrap_or(user);
        let client = client_of(cp, user).await;
        let create = |object: &Value| {
            let client = client.clone();
            let object = object.clone();
            let dry_run = dry_run.clone();
            async move {
                if object["kind"] == "Deployment" {
                    let d: Deployment = serde_json::from_value(object).expect("a Deployment");
                    Api::<Deployment>::namespaced(client, namespace)
                        .create(&dry_run, &d)
                        .await
                        .map(|_| ())
                } else {
                    let j: Job = serde_json::from_value(object).expect("a Job");
                    Api::<Job>::namespaced(client, namespace)
                        .create(&dry_run, &j)
                        .await
                        .map(|_| ())
                }
            }
        };
        // The policy and its ConfigMap reach the admission plugin through informers.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        let mut privileged = object.clone();
        (variants[0].1)(&mut privileged["spec"]["template"]["spec"]);
        while !create(&privileged)
            .await
            .is_err_and(|e| e.to_string().contains("banlieue-workload-pins"))
        {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the workload policy never took effect"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        create(object)
            .await
            .unwrap_or_else(|e| panic!("{name} refused what banlieue makes: {e}"));
        for (what, change, says) in &variants {
            let mut variant = object.clone();
            change(&mut variant["spec"]["template"]["spec"]);
            let refused = create(&variant)
                .await
                .expect_err(&format!("{name} created a {what} workload"));
            let message = refused.to_string();
            assert!(
                message.contains("banlieue-workload-pins") && message.contains(says),
                "{name}, {what}: {message}"
            );
        }
        if user != provider {
            continue;
        }
        // A provider imports as its own account only: not as another Provider's, not even
        // one whose name extends its own.
        for other in [
            import_account_name(SYSTEM, "vcenter-lab"),
            import_account_name(SYSTEM, &format!("{PROVIDER}-2")),
            import_account_name(OTHER, PROVIDER),
        ] {
            let mut variant = object.clone();
            variant["spec"]["template"]["spec"]["serviceAccountName"] = json!(other);
            let refused = create(&variant)
                .await
                .expect_err(&format!("{name} started a Job as {other}"));
            assert!(
                refused.to_string().contains(&format!(
                    "may not start a workload running as ServiceAccount {other}"
                )),
                "{refused}"
            );
        }
    }

    // Pinned by what is created, not only by who creates it: bob, whom a Role lets create
    // Deployments in the system namespace (as a delegate of a compromised controller would
    // be), may not start another image, or a hostPath pod, as a provider's account; a
    // Deployment of his own account is not banlieue's to judge.
    let role: k8s_openapi::api::rbac::v1::Role = serde_json::from_value(json!({
        "metadata": {"name": "delegate-deployments"},
        "rules": [
            {"apiGroups": ["apps"], "resources": ["deployments", "replicasets"], "verbs": ["create"]},
            {"apiGroups": ["batch"], "resources": ["cronjobs"], "verbs": ["create"]},
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["create"]},
            {"apiGroups": [""], "resources": ["pods/ephemeralcontainers"], "verbs": ["patch"]}
        ]
    }))
    .expect("a Role");
    let binding: k8s_openapi::api::rbac::v1::RoleBinding = serde_json::from_value(json!({
        "metadata": {"name": "delegate-deployments"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                    "name": "delegate-deployments"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "bob"}]
    }))
    .expect("a RoleBinding");
    Api::<k8s_openapi::api::rbac::v1::Role>::namespaced(admin.clone(), SYSTEM)
        .create(&PostParams::default(), &role)
        .await
        .expect("the delegate's Role");
    Api::<k8s_openapi::api::rbac::v1::RoleBinding>::namespaced(admin.clone(), SYSTEM)
        .create(&PostParams::default(), &binding)
        .await
        .expect("the delegate's RoleBinding");
    let bob = Api::<Deployment>::namespaced(cp.client_as("bob").await.expect("bob"), SYSTEM);
    let as_bob = |change: fn(&mut Value)| {
        let mut variant = deployment.clone();
        change(&mut variant["spec"]["template"]["spec"]);
        let d: Deployment = serde_json::from_value(variant).expect("a Deployment");
        let bob = bob.clone();
        let dry_run = dry_run.clone();
        async move { bob.create(&dry_run, &d).await.map(|_| ()) }
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let foreign = |p: &mut Value| p["containers"][0]["image"] = json!("attacker.example/root:1");
    let refused = loop {
        match as_bob(foreign).await {
            Err(e) if !e.to_string().contains("cannot create resource") => break e,
            other => {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "bob's grant never took effect, or his Deployment was let through: {other:?}"
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    };
    assert!(
        refused.to_string().contains(&format!(
            "a workload running as {provider_account}, started by bob, may run only the images \
             listed"
        )),
        "{refused}"
    );
    let refused = as_bob(|p| p["volumes"] = json!([{"name": "root", "hostPath": {"path": "/"}}]))
        .await
        .expect_err("bob started a hostPath pod as a provider's account");
    assert!(
        refused
            .to_string()
            .contains("may not mount a hostPath volume (root)"),
        "{refused}"
    );
    as_bob(|p| {
        p["serviceAccountName"] = json!("default");
        p["containers"][0]["image"] = json!("registry.example/bobs-own:1");
    })
    .await
    .expect("a Deployment of bob's own account is left to RBAC");

    // Nor through a kind banlieue does not use: a ReplicaSet or a CronJob of the same pod
    // template, and a bare Pod of it even with banlieue's own image.
    let template = deployment["spec"]["template"].clone();
    let mut foreign_template = template.clone();
    foreign(&mut foreign_template["spec"]);
    let replica_set: k8s_openapi::api::apps::v1::ReplicaSet = serde_json::from_value(json!({
        "metadata": {"name": "pinned-probe"},
        "spec": {"selector": deployment["spec"]["selector"], "template": foreign_template}
    }))
    .expect("a ReplicaSet");
    let refused = Api::<k8s_openapi::api::apps::v1::ReplicaSet>::namespaced(
        cp.client_as("bob").await.expect("bob"),
        SYSTEM,
    )
    .create(&dry_run, &replica_set)
    .await
    .expect_err("bob started a foreign image as a provider's account through a ReplicaSet");
    assert!(
        refused.to_string().contains("banlieue-workload-pins")
            && refused
                .to_string()
                .contains("may run only the images listed"),
        "{refused}"
    );
    let mut job_template = foreign_template.clone();
    job_template["spec"]["restartPolicy"] = json!("Never");
    let cron_job: k8s_openapi::api::batch::v1::CronJob = serde_json::from_value(json!({
        "metadata": {"name": "pinned-probe"},
        "spec": {"schedule": "* * * * *", "jobTemplate": {"spec": {"template": job_template}}}
    }))
    .expect("a CronJob");
    let refused = Api::<k8s_openapi::api::batch::v1::CronJob>::namespaced(
        cp.client_as("bob").await.expect("bob"),
        SYSTEM,
    )
    .create(&dry_run, &cron_job)
    .await
    .expect_err("bob started a foreign image as a provider's account through a CronJob");
    assert!(
        refused
            .to_string()
            .contains("may run only the images listed"),
        "{refused}"
    );
    let bare = |spec: &Value| -> Pod {
        serde_json::from_value(json!({"metadata": {"name": "pinned-probe"}, "spec": spec}))
            .expect("a Pod")
    };
    let bobs_pods = Api::<Pod>::namespaced(cp.client_as("bob").await.expect("bob"), SYSTEM);
    // banlieue-pod-pins is a policy of its own, which reaches the admission plugin through
    // its own informer: bob's first tries may come before it.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let refused = loop {
        match bobs_pods.create(&dry_run, &bare(&template["spec"])).await {
            Err(e) => break e,
            Ok(_) => {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "bob started a bare Pod as a provider's account"
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    };
    assert!(
        refused.to_string().contains(&format!(
            "bob may not create a bare Pod running as ServiceAccount {provider_account}"
        )),
        "{refused}"
    );
    let mut own = template["spec"].clone();
    own["serviceAccountName"] = json!("default");
    bobs_pods
        .create(&dry_run, &bare(&own))
        .await
        .expect("a bare Pod of bob's own account is left to RBAC and Pod Security");

    // Nor by a debug container in a pod running as one: the administrator's pod (no node
    // runs it here; admission is what is tested) refuses bob's ephemeral container.
    Api::<Pod>::namespaced(admin.clone(), SYSTEM)
        .create(&PostParams::default(), &bare(&template["spec"]))
        .await
        .expect("the administrator's pod as a provider's account");
    let debug = json!({"spec": {"ephemeralContainers": [{
        "name": "debug", "image": "attacker.example/root:1",
        "securityContext": {"allowPrivilegeEscalation": false, "runAsNonRoot": true,
            "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"}}}]}});
    let refused = bobs_pods
        .patch_subresource(
            "ephemeralcontainers",
            "pinned-probe",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Strategic(&debug),
        )
        .await
        .expect_err("bob added a debug container to a pod running as a provider's account");
    assert!(
        refused.to_string().contains(&format!(
            "bob may not add an ephemeral container to a pod running as {provider_account}"
        )),
        "{refused}"
    );
    Api::<Pod>::namespaced(admin.clone(), SYSTEM)
        .delete("pinned-probe", &Default::default())
        .await
        .expect("delete the administrator's pod");
}

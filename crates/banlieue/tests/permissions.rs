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
use banlieue_provider_kit::operator::{OperatorConfig, run_operator};
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
    (
        "import",
        "system:serviceaccount:banlieue-imagebuild:banlieue-import",
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
    Ask("list", "", "secrets", None, false),
    Ask("watch", "", "secrets", None, false),
    Ask("get", "", "configmaps", None, false),
    Ask("list", "", "configmaps", None, false),
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
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/security.md");
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
        (import, Ask("get", "", "secrets", None, false), SYSTEM),
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
        let mut parts = user.split(':').skip(2);
        let (ns, name) = (parts.next().expect("ns"), parts.next().expect("name"));
        let client = cp
            .client_as_service_account(ns, name)
            .await
            .expect("the identity's token");
        rules.push((label, effective_rules(&client).await));
    }
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

//! The per-Provider workload (ADR-0012) as desired objects: pure builders, applied by the
//! operator with server-side apply.
//!
//! Every grant is a binding to a fixed ClusterRole shipped in `deploy/rbac/` (ADR-0063), or a
//! Role holding only rules the operator itself holds, so creating them needs neither
//! `escalate` nor `bind` on arbitrary roles. The one cluster-wide grant is not a binding per
//! Provider: the operator may write no ClusterRoleBinding but the fixed one `bootstrap`
//! creates, and only its subjects ([`cluster_subjects`]).
//!
//! | object | namespace | grants |
//! |---|---|---|
//! | Role + RoleBinding `banlieue-provider-<p>` | Provider's | its own Provider object and Lease, its connection's Secret and ConfigMap, its machines' user-data Secrets (resourceNames) |
//! | Role + RoleBinding `banlieue-import:<p>` | Provider's | its connection's Secret and ConfigMap to its import ServiceAccount (resourceNames) |
//! | RoleBinding `banlieue-provider-<p>-base` | Provider's | ClusterRole `banlieue-provider-base` |
//! | its ServiceAccount among the subjects of ClusterRoleBinding `banlieue-providers` | — | ClusterRole `banlieue-provider-cluster` |
//! | RoleBinding `banlieue-provider-<ns>-<p>-<hash>` | build (libvirt) | ClusterRole `banlieue-provider-class-<class>` |
//! | RoleBinding `banlieue-provider-<p>-class` | Provider's (vSphere) | ClusterRole `banlieue-provider-class-<class>` |
//! | RoleBinding `banlieue-import-<p>` | Provider's | ClusterRole `banlieue-import` to its import ServiceAccount |
//! | ServiceAccount `banlieue-import-<ns>-<p>-<hash>` | build (libvirt) | the import Jobs' account, unless the class names a shared one |
//!
//! What differs between the classes' workloads (the provider they run, where and when the
//! class's ClusterRole is bound) is the class's backend's [`BackendWorkload`], from the
//! binary's list of backend descriptors: nothing here names a backend.

use std::collections::BTreeMap;

use banlieue_api::names::{self, LABEL_MANAGED_BY, LABEL_PROVIDER};
use banlieue_api::{Provider, ProviderClass};
use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec, DeploymentStrategy};
use k8s_openapi::api::core::v1::{
    Container, EnvVar, HTTPGetAction, PodSpec, PodTemplateSpec, Probe, ResourceRequirements,
    ServiceAccount,
};
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::{Resource, ResourceExt};

use banlieue_api::backend::{BackendWorkload, ClassRoleScope};
pub use banlieue_provider_kit::import_settings::ImportSettings;
pub use banlieue_provider_kit::workload_names::{
    class_role_name, import_account_name, import_binding_name, import_role_name, outside_name,
    workload_name,
};

/// The field manager of everything the operator applies.
pub const FIELD_MANAGER: &str = "banlieue-operator";
/// Value of `app.kubernetes.io/managed-by` on the workloads.
pub const MANAGED_BY: &str = "banlieue-operator";
/// Label naming the Provider's namespace on its objects outside it (its RoleBinding in the
/// build namespace), which cannot say it any other way.
pub const LABEL_PROVIDER_NAMESPACE: &str = "banlieue.io/provider-namespace";

/// The shipped ClusterRole every provider workload holds in its Provider's namespace.
pub const PROVIDER_BASE_ROLE: &str = "banlieue-provider-base";
/// The shipped ClusterRole every provider workload holds cluster-wide (reading ProviderClasses).
pub const PROVIDER_CLUSTER_ROLE: &str = "banlieue-provider-cluster";
/// The shipped ClusterRoleBinding (deploy/rbac/) granting [`PROVIDER_CLUSTER_ROLE`] to every
/// Provider's ServiceAccount: the only ClusterRoleBinding the operator may change.
pub const PROVIDERS_CLUSTER_BINDING: &str = "banlieue-providers";
/// The shipped ClusterRole of an import Job's pod, held in the Provider's namespace.
pub const IMPORT_ROLE: &str = "banlieue-import";

/// The port of the provider's /metrics, /healthz and /readyz inside its pod: not the
/// controller's 8080, so the two never collide on one host network (`pod.hostNetwork`, or a
/// cluster without a pod network).
pub const METRICS_PORT: i32 = 8081;

/// Everything applied for one Provider.
#[derive(Clone, Debug)]
pub struct Workloads {
    pub service_account: ServiceAccount,
    /// Its own Provider object, by name.
    pub own_provider_role: Role,
    pub own_provider_binding: RoleBinding,
    /// `banlieue-provider-base` in the Provider's namespace.
    pub base_binding: RoleBinding,
    /// `banlieue-import` in the Provider's namespace, for its import ServiceAccount.
    pub import_binding: RoleBinding,
    /// The import account's own Role in the Provider's namespace ([`import_rules`]) and its
    /// binding.
    pub import_role: Role,
    pub import_role_binding: RoleBinding,
    pub deployment: Deployment,
    /// The import Jobs' ServiceAccount in the build namespace: the Provider's own (removed
    /// through its finalizer), or the one the class names, shared by the class's Providers and
    /// owned by the ProviderClass.
    pub import_service_account: ServiceAccount,
    /// The workload's ServiceAccount as a subject of [`PROVIDERS_CLUSTER_BINDING`]: added
    /// while the Provider exists, removed through its finalizer.
    pub cluster_subject: Subject,
    /// The class's role, where [`BackendWorkload::class_role`] says. In the build namespace
    /// (another namespace than the Provider's) it is removed through the finalizer too; in the
    /// Provider's it is owned by the Provider.
    pub class_binding: RoleBinding,
    /// Whether `class_binding` is applied: always for [`ClassRoleScope::ProviderNamespace`],
    /// only for a class with `additionalRules` otherwise.
    pub binds_class_role: bool,
}

/// The ServiceAccount `provider`'s workload runs as.
pub fn provider_subject(provider: &Provider) -> Subject {
    service_account_subject(
        &workload_name(&provider.name_any()),
        &provider.namespace().unwrap_or_default(),
    )
}

/// The subjects [`PROVIDERS_CLUSTER_BINDING`] should have once `subject` is in it (`member`)
/// or out of it, or `None` when `current` already is that. The binding's other subjects are
/// other Providers' and are kept as they are; the list is RBAC's atomic one, so the operator
/// writes it whole, guarded by the binding's resourceVersion.
pub fn cluster_subjects(
    current: &[Subject],
    subject: &Subject,
    member: bool,
) -> Option<Vec<Subject>> {
    let same = |s: &Subject| {
        s.kind == subject.kind && s.name == subject.name && s.namespace == subject.namespace
    };
    match (current.iter().any(same), member) {
        (true, true) | (false, false) => None,
        (false, true) => Some(current.iter().cloned().chain([subject.clone()]).collect()),
        (true, false) => Some(current.iter().filter(|s| !same(s)).cloned().collect()),
    }
}

fn rule(groups: &[&str], resources: &[&str], verbs: &[&str], names: &[&str]) -> PolicyRule {
    let strings = |xs: &[&str]| xs.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
    PolicyRule {
        api_groups: Some(strings(groups)),
        resources: Some(strings(resources)),
        verbs: strings(verbs),
        resource_names: (!names.is_empty()).then(|| strings(names)),
        ..PolicyRule::default()
    }
}

/// The Secrets and ConfigMaps a Provider's connection names: its credentials Secret and, when
/// its CA bundle is not inline, the ConfigMap or Secret holding it. Each sorted, no repeats.
pub fn connection_objects(provider: &Provider) -> (Vec<String>, Vec<String>) {
    let connection = &provider.spec.connection;
    let mut secrets = vec![connection.credentials_ref.name.clone()];
    secrets.extend(
        connection
            .ca_bundle
            .secret_ref
            .iter()
            .map(|s| s.name.clone()),
    );
    let config_maps = connection
        .ca_bundle
        .config_map_ref
        .iter()
        .map(|c| c.name.clone())
        .collect();
    (sorted_names(secrets), sorted_names(config_maps))
}

/// `names` without empty or repeated entries, sorted, so that a Role built from them is the
/// same whatever order its sources were read in (and its apply changes nothing).
fn sorted_names(mut names: Vec<String>) -> Vec<String> {
    names.retain(|n| !n.is_empty());
    names.sort();
    names.dedup();
    names
}

/// `get` on `secrets` and `config_maps`, each by name; no rule for an empty list, since a rule
/// without resourceNames would grant every object of the kind.
pub fn read_by_name_rules(secrets: &[String], config_maps: &[String]) -> Vec<PolicyRule> {
    let mut rules = Vec::new();
    for (resource, names) in [("secrets", secrets), ("configmaps", config_maps)] {
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        if !names.is_empty() {
            rules.push(rule(&[""], &[resource], &["get"], &names));
        }
    }
    rules
}

/// The per-Provider Role: its own Provider, read and status, by name (watching by name works
/// because the workload's watches select `metadata.name`), its own Lease, named after its
/// workload account, which it holds while it acts so that two pods never act for one host
/// (`create` on Leases, which cannot be limited by name, is in `banlieue-provider-base`), and,
/// by name, the Secrets and ConfigMaps its connection names ([`connection_objects`]) and the
/// user-data Secrets its machines name (`user_data`): no other Secret of the namespace, another
/// Provider's credentials included.
pub fn own_provider_rules(provider: &Provider, user_data: &[String]) -> Vec<PolicyRule> {
    let name = provider.name_any();
    let (mut secrets, config_maps) = connection_objects(provider);
    secrets.extend(user_data.iter().cloned());
    let mut rules = own_lease_and_provider_rules(&name);
    rules.extend(read_by_name_rules(&sorted_names(secrets), &config_maps));
    rules
}

/// The per-Provider Role of its import Jobs' account: the Secrets and ConfigMaps its
/// connection names, by name; what else an import reads comes from `banlieue-import`.
pub fn import_rules(provider: &Provider) -> Vec<PolicyRule> {
    let (secrets, config_maps) = connection_objects(provider);
    read_by_name_rules(&secrets, &config_maps)
}

/// The Lease and Provider half of [`own_provider_rules`].
pub fn own_lease_and_provider_rules(provider: &str) -> Vec<PolicyRule> {
    vec![
        rule(
            &["coordination.k8s.io"],
            &["leases"],
            &["get", "update"],
            &[&workload_name(provider)],
        ),
        rule(
            &[names::GROUP],
            &["providers"],
            &["get", "list", "watch"],
            &[provider],
        ),
        rule(
            &[names::GROUP],
            &["providers/status"],
            &["patch"],
            &[provider],
        ),
    ]
}

fn controller_ref<K: Resource<DynamicType = ()>>(owner: &K) -> Option<OwnerReference> {
    owner.controller_owner_ref(&())
}

fn labels(provider: &str) -> BTreeMap<String, String> {
    [
        (LABEL_PROVIDER.to_owned(), provider.to_owned()),
        (LABEL_MANAGED_BY.to_owned(), MANAGED_BY.to_owned()),
    ]
    .into()
}

fn binding(meta: ObjectMeta, kind: &str, role: &str, subject: Subject) -> RoleBinding {
    RoleBinding {
        metadata: meta,
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: kind.into(),
            name: role.into(),
        },
        subjects: Some(vec![subject]),
    }
}

fn service_account_subject(name: &str, namespace: &str) -> Subject {
    Subject {
        kind: "ServiceAccount".into(),
        name: name.to_owned(),
        namespace: Some(namespace.to_owned()),
        api_group: None,
    }
}

fn default_resources() -> ResourceRequirements {
    ResourceRequirements {
        requests: Some(
            [
                ("cpu".to_owned(), Quantity("50m".into())),
                ("memory".to_owned(), Quantity("64Mi".into())),
            ]
            .into(),
        ),
        limits: Some([("memory".to_owned(), Quantity("256Mi".into()))].into()),
        ..ResourceRequirements::default()
    }
}

fn http_probe(path: &str) -> Probe {
    Probe {
        http_get: Some(HTTPGetAction {
            path: Some(path.into()),
            port: IntOrString::Int(METRICS_PORT),
            ..HTTPGetAction::default()
        }),
        period_seconds: Some(10),
        ..Probe::default()
    }
}

/// The Deployment that runs `provider <subcommand> run` for Provider `name` of namespace `ns`,
/// as the class says (image, command, args, pod settings), under the workload's account.
fn deployment(
    metadata: ObjectMeta,
    name: &str,
    ns: &str,
    class: &ProviderClass,
    subcommand: &str,
) -> Deployment {
    let mut args = class.spec.args.clone();
    args.extend(
        [
            "provider",
            subcommand,
            "run",
            "--provider",
            name,
            "--namespace",
            ns,
        ]
        .iter()
        .map(|s| (*s).to_owned()),
    );
    let pod_settings = &class.spec.pod;
    Deployment {
        metadata,
        spec: DeploymentSpec {
            replicas: Some(1),
            // One writer per host: a rolling update must not run two providers at once.
            strategy: Some(DeploymentStrategy {
                type_: Some("Recreate".into()),
                rolling_update: None,
            }),
            selector: LabelSelector {
                match_labels: Some([(LABEL_PROVIDER.to_owned(), name.to_owned())].into()),
                match_expressions: None,
            },
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels(name)),
                    ..ObjectMeta::default()
                }),
                spec: Some(PodSpec {
                    service_account_name: Some(workload_name(name)),
                    automount_service_account_token: Some(true),
                    // The same as the controller's (deploy/controller.yaml).
                    security_context: Some(banlieue_api::pods::restricted_pod(None)),
                    node_selector: (!pod_settings.node_selector.is_empty())
                        .then(|| pod_settings.node_selector.clone()),
                    tolerations: (!pod_settings.tolerations.is_empty())
                        .then(|| pod_settings.tolerations.clone()),
                    image_pull_secrets: (!pod_settings.image_pull_secrets.is_empty())
                        .then(|| pod_settings.image_pull_secrets.clone()),
                    host_network: pod_settings.host_network.then_some(true),
                    containers: vec![Container {
                        name: "provider".into(),
                        image: Some(class.spec.image.clone()),
                        command: (!class.spec.command.is_empty())
                            .then(|| class.spec.command.clone()),
                        args: Some(args),
                        env: Some(
                            std::iter::once(EnvVar {
                                name: "BANLIEUE_METRICS_ADDRESS".into(),
                                value: Some(format!("0.0.0.0:{METRICS_PORT}")),
                                value_from: None,
                            })
                            .chain(pod_settings.env.iter().cloned())
                            .collect(),
                        ),
                        resources: Some(
                            pod_settings
                                .resources
                                .clone()
                                .unwrap_or_else(default_resources),
                        ),
                        security_context: Some(banlieue_api::pods::restricted_container()),
                        liveness_probe: Some(http_probe("/healthz")),
                        readiness_probe: Some(http_probe("/readyz")),
                        ..Container::default()
                    }],
                    ..PodSpec::default()
                }),
            },
            ..DeploymentSpec::default()
        },
        status: None,
    }
}

/// Builds the workload of `provider`, run by `class`, whose machines name the user-data
/// Secrets `user_data`. `None` when the Provider has no name, namespace or uid yet (it was not
/// read from the API server).
pub fn build(
    provider: &Provider,
    class: &ProviderClass,
    backend: &BackendWorkload,
    user_data: &[String],
) -> Option<Workloads> {
    let name = provider.metadata.name.clone()?;
    let ns = provider.metadata.namespace.clone()?;
    provider.metadata.uid.as_ref()?;
    let class_name = class.metadata.name.clone()?;
    let owner = controller_ref(provider)?;
    // Several classes may share one import account: each is an owner, none the controller,
    // so the account goes only with the last of them.
    let class_owner = OwnerReference {
        controller: None,
        block_owner_deletion: None,
        ..controller_ref(class)?
    };
    let import = ImportSettings::of(class);
    let wl = workload_name(&name);
    let meta = |object: String| ObjectMeta {
        name: Some(object),
        namespace: Some(ns.clone()),
        labels: Some(labels(&name)),
        owner_references: Some(vec![owner.clone()]),
        ..ObjectMeta::default()
    };
    let mut outside_labels = labels(&name);
    outside_labels.insert(LABEL_PROVIDER_NAMESPACE.to_owned(), ns.clone());
    let workload_subject = service_account_subject(&wl, &ns);

    let service_account = ServiceAccount {
        metadata: meta(wl.clone()),
        // The workload's token is mounted by the pod spec below; nothing else needs it.
        automount_service_account_token: Some(false),
        ..ServiceAccount::default()
    };
    let own_provider_role = Role {
        metadata: meta(wl.clone()),
        rules: Some(own_provider_rules(provider, user_data)),
    };
    let own_provider_binding = binding(meta(wl.clone()), "Role", &wl, workload_subject.clone());
    let base_binding = binding(
        meta(names::shorten(&format!("{wl}-base"))),
        "ClusterRole",
        PROVIDER_BASE_ROLE,
        workload_subject.clone(),
    );
    let import_account = import.account_for(&ns, &name);
    let import_binding = binding(
        meta(import_binding_name(&name)),
        "ClusterRole",
        IMPORT_ROLE,
        service_account_subject(&import_account, &import.namespace),
    );
    let import_role_name = import_role_name(&name);
    let import_role = Role {
        metadata: meta(import_role_name.clone()),
        rules: Some(import_rules(provider)),
    };
    let import_role_binding = binding(
        meta(import_role_name.clone()),
        "Role",
        &import_role_name,
        service_account_subject(&import_account, &import.namespace),
    );
    let import_service_account = ServiceAccount {
        metadata: match &import.service_account {
            // The class's own account, shared by its Providers and owned by the class.
            Some(_) => ObjectMeta {
                name: Some(import_account.clone()),
                namespace: Some(import.namespace.clone()),
                labels: Some(
                    [
                        ("banlieue.io/provider-class".to_owned(), class_name.clone()),
                        (LABEL_MANAGED_BY.to_owned(), MANAGED_BY.to_owned()),
                    ]
                    .into(),
                ),
                owner_references: Some(vec![class_owner]),
                ..ObjectMeta::default()
            },
            // The Provider's own: outside its namespace, removed through its finalizer.
            None => ObjectMeta {
                name: Some(import_account.clone()),
                namespace: Some(import.namespace.clone()),
                labels: Some(outside_labels.clone()),
                ..ObjectMeta::default()
            },
        },
        ..ServiceAccount::default()
    };

    let deployment = deployment(meta(wl.clone()), &name, &ns, class, backend.subcommand);

    let cluster_subject = provider_subject(provider);
    let (class_binding_meta, binds_class_role) = match backend.class_role {
        ClassRoleScope::BuildNamespace => (
            ObjectMeta {
                name: Some(outside_name(&ns, &name)),
                namespace: Some(import.namespace.clone()),
                labels: Some(outside_labels),
                ..ObjectMeta::default()
            },
            !class.spec.additional_rules.is_empty(),
        ),
        ClassRoleScope::ProviderNamespace => (meta(names::shorten(&format!("{wl}-class"))), true),
    };
    let class_binding = binding(
        class_binding_meta,
        "ClusterRole",
        &class_role_name(&class_name),
        workload_subject,
    );
    Some(Workloads {
        service_account,
        own_provider_role,
        own_provider_binding,
        base_binding,
        import_binding,
        import_role,
        import_role_binding,
        deployment,
        import_service_account,
        cluster_subject,
        class_binding,
        binds_class_role,
    })
}

/// The `(group, resource, verb)` triples of `wanted` that no rule of `held` grants, as
/// `verb group/resource` strings. Rules restricted by resourceNames or naming non-resource URLs
/// grant nothing here: the class's rules are meant for whole resources.
pub fn uncovered(wanted: &[PolicyRule], held: &[PolicyRule]) -> Vec<String> {
    let grants = |group: &str, resource: &str, verb: &str| {
        held.iter().any(|r| {
            let any = |xs: &Option<Vec<String>>, x: &str| {
                xs.as_ref()
                    .is_some_and(|xs| xs.iter().any(|v| v == x || v == "*"))
            };
            r.resource_names.as_ref().is_none_or(|n| n.is_empty())
                && any(&r.api_groups, group)
                && any(&r.resources, resource)
                && r.verbs.iter().any(|v| v == verb || v == "*")
        })
    };
    let mut missing = Vec::new();
    for r in wanted {
        for group in r.api_groups.iter().flatten() {
            for resource in r.resources.iter().flatten() {
                for verb in &r.verbs {
                    if !grants(group, resource, verb) {
                        let shown = if group.is_empty() {
                            resource.clone()
                        } else {
                            format!("{group}/{resource}")
                        };
                        missing.push(format!("{verb} {shown}"));
                    }
                }
            }
        }
    }
    missing
}

#[cfg(test)]
mod tests {
    use super::*;

    use banlieue_api::MachineKind;

    /// The workload of `kind` among the in-tree backends, as the binary's list gives it.
    fn backend_workload(kind: &MachineKind) -> Option<BackendWorkload> {
        [
            banlieue_api::machine::libvirt_workload(),
            banlieue_api::vsphere::workload(),
        ]
        .into_iter()
        .find(|backend| backend.kind == *kind)
    }

    /// The workloads of `provider`, with its class's backend.
    fn build(provider: &Provider, class: &ProviderClass) -> Option<Workloads> {
        super::build(
            provider,
            class,
            &backend_workload(&class.spec.machine_kind)?,
            &["cloud-init".to_owned()],
        )
    }
    use banlieue_api::{
        LocalObjectReference, ProviderClassSpec, ProviderConnection, ProviderSpec, ValueOrSource,
    };
    use k8s_openapi::api::rbac::v1::ClusterRole;

    fn provider() -> Provider {
        let mut p = Provider::new(
            "edge-7",
            ProviderSpec {
                provider_class_ref: LocalObjectReference::new("libvirt"),
                connection: ProviderConnection {
                    endpoint: "qemu+tls://kvm-7/system".into(),
                    credentials_ref: LocalObjectReference::new("creds"),
                    ca_bundle: ValueOrSource::default(),
                },
                capabilities: Default::default(),
                attestation: None,
            },
        );
        p.metadata.namespace = Some("banlieue-system".into());
        p.metadata.uid = Some("uid-1".into());
        p
    }

    fn class() -> ProviderClass {
        let mut c = ProviderClass::new(
            "libvirt",
            ProviderClassSpec {
                image: "banlieue:dev".into(),
                command: vec!["/banlieue".into()],
                args: vec!["--log=json".into()],
                machine_kind: Default::default(),
                additional_rules: vec![rule(&["batch"], &["jobs"], &["create", "get"], &[])],
                import: Default::default(),
                pod: Default::default(),
            },
        );
        c.metadata.uid = Some("uid-c".into());
        c
    }

    fn shipped_cluster_role(file: &str) -> ClusterRole {
        let path = format!("{}/../../deploy/rbac/{file}", env!("CARGO_MANIFEST_DIR"));
        let text = std::fs::read_to_string(path).unwrap();
        serde_saphyr::from_str(&text).unwrap()
    }

    #[test]
    fn outside_names_of_providers_in_different_namespaces_never_collide() {
        let a = outside_name("a-b", "c");
        let b = outside_name("a", "b-c");
        assert_ne!(a, b);
        assert!(a.starts_with("banlieue-provider-a-b-c-"), "{a}");
        assert_eq!(a, outside_name("a-b", "c"), "stable");
        let long = outside_name(&"n".repeat(63), &"p".repeat(63));
        assert!(long.len() <= names::MAX_NAME_LEN, "{long}");
        assert_ne!(long, outside_name(&"n".repeat(63), &"p".repeat(62)));
    }

    #[test]
    fn a_provider_joins_and_leaves_the_shared_binding_without_touching_the_others() {
        let sa = |name: &str, ns: &str| service_account_subject(name, ns);
        let ours = sa("banlieue-provider-edge-7", "a");
        let others = vec![
            sa("banlieue-provider-edge-7", "b"),
            sa("banlieue-provider-x", "a"),
        ];
        let joined = cluster_subjects(&others, &ours, true).unwrap();
        assert_eq!(joined[..2], others[..]);
        assert_eq!(joined[2], ours);
        assert_eq!(cluster_subjects(&joined, &ours, true), None, "already in");
        assert_eq!(cluster_subjects(&joined, &ours, false).unwrap(), others);
        assert_eq!(cluster_subjects(&others, &ours, false), None, "already out");
        // A User of the same name is not the ServiceAccount.
        let user = Subject {
            kind: "User".into(),
            ..ours.clone()
        };
        assert_eq!(cluster_subjects(&[user], &ours, false), None);
    }

    #[test]
    fn deployment_runs_this_provider_hardened() {
        let w = build(&provider(), &class()).unwrap();
        let spec = w.deployment.spec.template.spec.unwrap();
        assert_eq!(
            spec.service_account_name.as_deref(),
            Some("banlieue-provider-edge-7")
        );
        let pod_security = spec.security_context.unwrap();
        assert_eq!(pod_security.run_as_user, Some(65532));
        assert_eq!(pod_security.run_as_non_root, Some(true));
        assert_eq!(
            pod_security.seccomp_profile.unwrap().type_,
            "RuntimeDefault"
        );
        let c = &spec.containers[0];
        assert_eq!(c.image.as_deref(), Some("banlieue:dev"));
        assert_eq!(c.command.as_deref(), Some(&["/banlieue".to_owned()][..]));
        assert_eq!(
            c.args.clone().unwrap(),
            [
                "--log=json",
                "provider",
                "libvirt",
                "run",
                "--provider",
                "edge-7",
                "--namespace",
                "banlieue-system"
            ]
        );
        let security = c.security_context.clone().unwrap();
        assert_eq!(security.allow_privilege_escalation, Some(false));
        assert_eq!(security.read_only_root_filesystem, Some(true));
        assert_eq!(
            security.capabilities.unwrap().drop,
            Some(vec!["ALL".to_owned()])
        );
        assert!(c.resources.as_ref().unwrap().limits.is_some());
        assert!(c.readiness_probe.is_some() && c.liveness_probe.is_some());
        assert!(spec.host_network.is_none());
    }

    #[test]
    fn class_pod_settings_reach_the_deployment() {
        let mut class = class();
        class.spec.pod.node_selector = [("kvm".to_owned(), "true".to_owned())].into();
        class.spec.pod.host_network = true;
        class.spec.pod.env = vec![EnvVar {
            name: "BANLIEUE_LIBVIRT_DOMAIN_TYPE".into(),
            value: Some("qemu".into()),
            value_from: None,
        }];
        class.spec.pod.image_pull_secrets =
            vec![k8s_openapi::api::core::v1::LocalObjectReference {
                name: "registry".into(),
            }];
        let w = build(&provider(), &class).unwrap();
        let spec = w.deployment.spec.template.spec.unwrap();
        assert_eq!(spec.host_network, Some(true));
        assert_eq!(spec.node_selector.unwrap()["kvm"], "true");
        assert_eq!(spec.image_pull_secrets.unwrap()[0].name, "registry");
        let env = spec.containers[0].env.clone().unwrap();
        assert!(env.iter().any(|e| e.name == "BANLIEUE_LIBVIRT_DOMAIN_TYPE"));
    }

    #[test]
    fn every_grant_is_a_binding_to_a_shipped_role_or_its_own_provider() {
        let w = build(&provider(), &class()).unwrap();
        assert_eq!(
            w.own_provider_role.rules.unwrap(),
            own_provider_rules(&provider(), &["cloud-init".to_owned()])
        );
        assert_eq!(w.base_binding.role_ref.name, PROVIDER_BASE_ROLE);
        assert_eq!(w.import_binding.role_ref.name, IMPORT_ROLE);
        assert_eq!(
            (
                w.cluster_subject.name.as_str(),
                w.cluster_subject.namespace.as_deref()
            ),
            ("banlieue-provider-edge-7", Some("banlieue-system"))
        );
        assert_eq!(
            w.class_binding.role_ref.name,
            "banlieue-provider-class-libvirt"
        );
        // The class's role is granted in the build namespace, never cluster-wide.
        assert_eq!(
            w.class_binding.metadata.namespace.as_deref(),
            Some("banlieue-imagebuild")
        );
        // The import Jobs' account is the Provider's own, in the build namespace; never
        // `default`, never another Provider's.
        let own = import_account_name("banlieue-system", "edge-7");
        assert_eq!(
            w.import_service_account.metadata.name.as_deref(),
            Some(own.as_str())
        );
        let subject = &w.import_binding.subjects.unwrap()[0];
        assert_eq!(
            (subject.name.as_str(), subject.namespace.as_deref()),
            (own.as_str(), Some("banlieue-imagebuild"))
        );
        for shipped in [
            "provider-base-clusterrole.yaml",
            "provider-cluster-clusterrole.yaml",
            "import-clusterrole.yaml",
            "provider-class-libvirt-clusterrole.yaml",
        ] {
            let role = shipped_cluster_role(shipped);
            assert!(role.metadata.name.is_some(), "{shipped}");
        }
    }

    /// Whose Secrets and ConfigMaps `rules` let read, as `resource name` strings; a rule on
    /// either kind without names reads as `resource *`.
    fn readable(rules: &[PolicyRule]) -> Vec<String> {
        let mut out = Vec::new();
        for r in rules {
            for resource in r.resources.iter().flatten() {
                if resource != "secrets" && resource != "configmaps" {
                    continue;
                }
                match r.resource_names.as_deref() {
                    Some(names) if !names.is_empty() => {
                        out.extend(names.iter().map(|n| format!("{resource} {n}")));
                    }
                    _ => out.push(format!("{resource} *")),
                }
            }
        }
        out.sort();
        out
    }

    #[test]
    fn a_provider_reads_only_its_connections_and_its_machines_secrets_by_name() {
        let mut p = provider();
        p.spec.connection.ca_bundle.config_map_ref = Some(banlieue_api::common::KeySelector {
            name: "edge-ca".into(),
            key: "ca.crt".into(),
        });
        let w = super::build(
            &p,
            &class(),
            &banlieue_api::machine::libvirt_workload(),
            &["cloud-init".to_owned(), "creds".to_owned()],
        )
        .unwrap();
        assert_eq!(
            readable(&w.own_provider_role.rules.unwrap()),
            ["configmaps edge-ca", "secrets cloud-init", "secrets creds"]
        );
        // Its import Jobs read its connection, not its machines' user-data.
        assert_eq!(
            readable(&w.import_role.rules.unwrap()),
            ["configmaps edge-ca", "secrets creds"]
        );
        assert_eq!(w.import_role_binding.role_ref.kind, "Role");
        assert_eq!(
            w.import_role_binding.role_ref.name,
            w.import_role.metadata.name.clone().unwrap()
        );
        assert_eq!(
            w.import_role_binding.subjects.unwrap(),
            w.import_binding.subjects.unwrap()
        );
        // A CA inline and no machine: its credentials alone, never a rule without names.
        let w = super::build(
            &provider(),
            &class(),
            &banlieue_api::machine::libvirt_workload(),
            &[],
        )
        .unwrap();
        assert_eq!(
            readable(&w.own_provider_role.rules.unwrap()),
            ["secrets creds"]
        );
        // The shipped roles the workload and its imports are bound to read no Secret or
        // ConfigMap: every read is one of these names.
        for shipped in ["provider-base-clusterrole.yaml", "import-clusterrole.yaml"] {
            let role = shipped_cluster_role(shipped);
            assert_eq!(
                readable(&role.rules.unwrap_or_default()),
                Vec::<String>::new(),
                "{shipped}"
            );
        }
    }

    #[test]
    fn objects_outside_the_providers_namespace_never_point_at_it() {
        let w = build(&provider(), &class()).unwrap();
        assert!(w.class_binding.metadata.owner_references.is_none());
        // The Provider's own import account is removed through its finalizer, by its labels.
        assert!(w.import_service_account.metadata.owner_references.is_none());
        let labels = w.import_service_account.metadata.labels.unwrap();
        assert_eq!(
            labels.get(LABEL_PROVIDER_NAMESPACE).map(String::as_str),
            Some("banlieue-system")
        );
        // A class that names its account shares it among its Providers and owns it.
        let mut shared = class();
        shared.spec.import.service_account_name = Some("banlieue-import".into());
        let w = build(&provider(), &shared).unwrap();
        let owner = &w.import_service_account.metadata.owner_references.unwrap()[0];
        assert_eq!(owner.kind, "ProviderClass");
        let owner = &w.base_binding.metadata.owner_references.unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.uid.as_str()),
            ("Provider", "uid-1")
        );
    }

    #[test]
    fn the_shipped_libvirt_class_role_covers_the_example_class() {
        let text = std::fs::read_to_string(format!(
            "{}/../../examples/09-providerclass-libvirt.yaml",
            env!("CARGO_MANIFEST_DIR")
        ))
        .unwrap();
        let class: ProviderClass = serde_saphyr::from_str(&text).unwrap();
        let role = shipped_cluster_role("provider-class-libvirt-clusterrole.yaml");
        assert_eq!(
            role.metadata.name.as_deref(),
            Some(class_role_name(&class.metadata.name.clone().unwrap()).as_str())
        );
        assert_eq!(
            uncovered(&class.spec.additional_rules, &role.rules.unwrap()),
            Vec::<String>::new()
        );
    }

    #[test]
    fn uncovered_names_each_missing_verb() {
        let wanted = vec![rule(&["batch"], &["jobs"], &["create", "delete"], &[])];
        let held = vec![
            rule(&["batch"], &["jobs"], &["create"], &[]),
            // A grant restricted to one name does not cover the resource.
            rule(&["batch"], &["jobs"], &["delete"], &["one"]),
        ];
        assert_eq!(uncovered(&wanted, &held), vec!["delete batch/jobs"]);
        let star = vec![rule(&["batch"], &["*"], &["*"], &[])];
        assert!(uncovered(&wanted, &star).is_empty());
        assert_eq!(
            uncovered(&[rule(&[""], &["pods"], &["get"], &[])], &[]),
            vec!["get pods"]
        );
    }

    fn vsphere_class() -> ProviderClass {
        let text = std::fs::read_to_string(format!(
            "{}/../../examples/09-providerclass-vsphere.yaml",
            env!("CARGO_MANIFEST_DIR")
        ))
        .unwrap();
        let mut class: ProviderClass = serde_saphyr::from_str(&text).unwrap();
        class.metadata.uid = Some("uid-v".into());
        class
    }

    #[test]
    fn each_machine_kind_runs_its_provider() {
        assert_eq!(
            backend_workload(&MachineKind::LIBVIRT_MACHINE)
                .expect("built in")
                .subcommand,
            "libvirt"
        );
        let vsphere = backend_workload(&MachineKind::VSPHERE_MACHINE).expect("built in");
        assert_eq!(vsphere.subcommand, "vsphere");
        assert_eq!(vsphere.class_role, ClassRoleScope::ProviderNamespace);
        assert_eq!(vsphere.machines.plural, "vspheremachines");
        assert_eq!(
            backend_workload(&MachineKind::LIBVIRT_MACHINE)
                .expect("built in")
                .machines
                .plural,
            "libvirtmachines"
        );
    }

    #[test]
    fn a_vsphere_provider_runs_the_vsphere_provider_with_its_class_role_beside_it() {
        let mut provider = provider();
        provider.spec.provider_class_ref = LocalObjectReference::new("vsphere");
        let class = vsphere_class();
        assert_eq!(class.spec.machine_kind, MachineKind::VSPHERE_MACHINE);
        assert!(class.spec.additional_rules.is_empty());
        let w = build(&provider, &class).unwrap();
        let spec = w.deployment.spec.template.spec.unwrap();
        assert_eq!(
            spec.containers[0].args.clone().unwrap(),
            [
                "provider",
                "vsphere",
                "run",
                "--provider",
                "edge-7",
                "--namespace",
                "banlieue-system"
            ]
        );
        // Bound without additionalRules: the role holds its machine rights.
        assert!(w.binds_class_role);
        let binding = &w.class_binding;
        assert_eq!(binding.role_ref.name, "banlieue-provider-class-vsphere");
        assert_eq!(
            binding.metadata.namespace.as_deref(),
            Some("banlieue-system")
        );
        assert_eq!(
            binding.metadata.name.as_deref(),
            Some("banlieue-provider-edge-7-class")
        );
        // In the Provider's namespace it goes with the Provider, like its other grants.
        let owner = &binding.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.uid.as_str()),
            ("Provider", "uid-1")
        );
        let subject = &binding.subjects.as_ref().unwrap()[0];
        assert_eq!(
            (subject.name.as_str(), subject.namespace.as_deref()),
            ("banlieue-provider-edge-7", Some("banlieue-system"))
        );
        // The shipped role is the one bound, and it grants the machines the provider realises.
        let role = shipped_cluster_role("provider-class-vsphere-clusterrole.yaml");
        assert_eq!(
            role.metadata.name.as_deref(),
            Some(binding.role_ref.name.as_str())
        );
        let wanted = vec![
            rule(
                &["banlieue.io"],
                &["vspheremachines"],
                &["get", "list", "watch", "patch"],
                &[],
            ),
            rule(
                &["banlieue.io"],
                &["vspheremachines/status", "vspheremachines/finalizers"],
                &["patch"],
                &[],
            ),
        ];
        // What the operator checks the role for before binding it.
        assert_eq!(
            backend_workload(&MachineKind::VSPHERE_MACHINE)
                .expect("built in")
                .class_role_rules,
            wanted
        );
        assert_eq!(
            uncovered(&wanted, &role.rules.unwrap()),
            Vec::<String>::new()
        );
    }

    #[test]
    fn a_libvirt_class_without_rules_binds_no_class_role() {
        let mut class = class();
        assert!(build(&provider(), &class).unwrap().binds_class_role);
        class.spec.additional_rules.clear();
        assert!(!build(&provider(), &class).unwrap().binds_class_role);
    }

    #[test]
    fn the_operator_may_bind_every_shipped_role_it_binds() {
        let text = std::fs::read_to_string(format!(
            "{}/../../deploy/rbac/controller-workloads-clusterrole.yaml",
            env!("CARGO_MANIFEST_DIR")
        ))
        .unwrap();
        let role: ClusterRole = serde_saphyr::from_str(&text).unwrap();
        let bindable: Vec<String> = role
            .rules
            .unwrap()
            .into_iter()
            .filter(|r| r.verbs.iter().any(|v| v == "bind"))
            .flat_map(|r| r.resource_names.unwrap_or_default())
            .collect();
        for name in [
            PROVIDER_BASE_ROLE.to_owned(),
            IMPORT_ROLE.to_owned(),
            class_role_name("libvirt"),
            class_role_name("vsphere"),
        ] {
            assert!(
                bindable.contains(&name),
                "{name} not bindable: {bindable:?}"
            );
        }
    }
}

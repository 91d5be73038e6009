//! The per-Provider workload (ADR-0012) as desired objects: pure builders, applied by the
//! operator with server-side apply.

use std::collections::BTreeMap;

use banlieue_api::names::{self, LABEL_MANAGED_BY, LABEL_PROVIDER};
use banlieue_api::{Provider, ProviderClass};
use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec};
use k8s_openapi::api::core::v1::{Container, PodSpec, PodTemplateSpec, ServiceAccount};
use k8s_openapi::api::rbac::v1::{
    ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding, RoleRef, Subject,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use kube::Resource;

/// The field manager of everything the operator applies.
pub const FIELD_MANAGER: &str = "banlieue-operator";
/// Value of `app.kubernetes.io/managed-by` on the workloads.
pub const MANAGED_BY: &str = "banlieue-operator";
/// Label naming the Provider's namespace on its cluster-scoped ClusterRoleBinding, which has
/// no namespace of its own to say it.
pub const LABEL_PROVIDER_NAMESPACE: &str = "banlieue.io/provider-namespace";

/// Everything applied for one Provider.
#[derive(Clone, Debug)]
pub struct Workloads {
    pub service_account: ServiceAccount,
    pub role: Role,
    pub role_binding: RoleBinding,
    pub deployment: Deployment,
    /// Owned by the ProviderClass: shared by every Provider of the class.
    pub cluster_role: ClusterRole,
    /// Cluster-scoped, so it cannot be owned by the namespaced Provider; removed through the
    /// Provider's finalizer instead.
    pub cluster_role_binding: ClusterRoleBinding,
}

/// The name of the Provider's namespaced objects: `banlieue-provider-<name>`.
pub fn workload_name(provider: &str) -> String {
    names::shorten(&format!("banlieue-provider-{provider}"))
}

/// The ClusterRole of a ProviderClass.
pub fn cluster_role_name(class: &str) -> String {
    names::shorten(&format!("banlieue-provider-{class}"))
}

/// The ClusterRoleBinding of a Provider: namespace and name, since it is cluster-wide.
pub fn cluster_role_binding_name(namespace: &str, provider: &str) -> String {
    names::shorten(&format!("banlieue-provider-{namespace}-{provider}"))
}

fn rule(groups: &[&str], resources: &[&str], verbs: &[&str]) -> PolicyRule {
    PolicyRule {
        api_groups: Some(groups.iter().map(|s| (*s).to_owned()).collect()),
        resources: Some(resources.iter().map(|s| (*s).to_owned()).collect()),
        verbs: verbs.iter().map(|s| (*s).to_owned()).collect(),
        ..PolicyRule::default()
    }
}

/// What every provider workload may do in its own namespace.
pub fn base_rules() -> Vec<PolicyRule> {
    vec![
        rule(&[names::GROUP], &["providers"], &["get", "list", "watch"]),
        rule(&[names::GROUP], &["providers/status"], &["patch"]),
        rule(
            &[names::GROUP],
            &["libvirtmachines"],
            &["get", "list", "watch", "patch"],
        ),
        rule(
            &[names::GROUP],
            &["libvirtmachines/status", "libvirtmachines/finalizers"],
            &["patch", "update"],
        ),
        rule(&[""], &["secrets", "configmaps"], &["get", "list", "watch"]),
        rule(&["", "events.k8s.io"], &["events"], &["create", "patch"]),
        rule(&[names::GROUP], &["vmimages"], &["get", "list", "watch"]),
        rule(&[names::GROUP], &["vmimages/status"], &["patch"]),
    ]
}

/// What every provider of a class may do cluster-wide: read images and report imports.
pub fn cluster_base_rules() -> Vec<PolicyRule> {
    vec![
        rule(&[names::GROUP], &["vmimages"], &["get", "list", "watch"]),
        rule(&[names::GROUP], &["vmimages/status"], &["patch"]),
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

/// Builds the workload of `provider`, run by `class`. `None` when the Provider has no name,
/// namespace or uid yet (it was not read from the API server).
pub fn build(provider: &Provider, class: &ProviderClass) -> Option<Workloads> {
    let name = provider.metadata.name.clone()?;
    let ns = provider.metadata.namespace.clone()?;
    provider.metadata.uid.as_ref()?;
    let class_name = class.metadata.name.clone()?;
    let owner = controller_ref(provider)?;
    let class_owner = controller_ref(class)?;
    let wl = workload_name(&name);
    let meta = |name: String| ObjectMeta {
        name: Some(name),
        namespace: Some(ns.clone()),
        labels: Some(labels(&provider_name(provider))),
        owner_references: Some(vec![owner.clone()]),
        ..ObjectMeta::default()
    };
    let subject = Subject {
        kind: "ServiceAccount".into(),
        name: wl.clone(),
        namespace: Some(ns.clone()),
        api_group: None,
    };

    let service_account = ServiceAccount {
        metadata: meta(wl.clone()),
        ..ServiceAccount::default()
    };
    let mut rules = base_rules();
    rules.extend(class.spec.additional_rules.iter().cloned());
    let role = Role {
        metadata: meta(wl.clone()),
        rules: Some(rules),
    };
    let role_binding = RoleBinding {
        metadata: meta(wl.clone()),
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: "Role".into(),
            name: wl.clone(),
        },
        subjects: Some(vec![subject.clone()]),
    };

    let mut args = class.spec.args.clone();
    args.extend(
        [
            "provider",
            "libvirt",
            "run",
            "--provider",
            &name,
            "--namespace",
            &ns,
        ]
        .iter()
        .map(|s| (*s).to_owned()),
    );
    let pod_labels = labels(&name);
    let deployment = Deployment {
        metadata: meta(wl.clone()),
        spec: DeploymentSpec {
            replicas: Some(1),
            // One writer per host: a rolling update must not run two providers at once.
            strategy: Some(k8s_openapi::api::apps::v1::DeploymentStrategy {
                type_: Some("Recreate".into()),
                rolling_update: None,
            }),
            selector: LabelSelector {
                match_labels: Some([(LABEL_PROVIDER.to_owned(), name.clone())].into()),
                match_expressions: None,
            },
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(pod_labels),
                    ..ObjectMeta::default()
                }),
                spec: Some(PodSpec {
                    service_account_name: Some(wl.clone()),
                    containers: vec![Container {
                        name: "provider".into(),
                        image: Some(class.spec.image.clone()),
                        command: (!class.spec.command.is_empty())
                            .then(|| class.spec.command.clone()),
                        args: Some(args),
                        ..Container::default()
                    }],
                    ..PodSpec::default()
                }),
            },
            ..DeploymentSpec::default()
        },
        status: None,
    };

    let cr_name = cluster_role_name(&class_name);
    let mut cluster_rules = cluster_base_rules();
    cluster_rules.extend(class.spec.additional_rules.iter().cloned());
    let cluster_role = ClusterRole {
        metadata: ObjectMeta {
            name: Some(cr_name.clone()),
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
        rules: Some(cluster_rules),
        aggregation_rule: None,
    };
    let mut crb_labels = labels(&name);
    crb_labels.insert(LABEL_PROVIDER_NAMESPACE.to_owned(), ns.clone());
    let cluster_role_binding = ClusterRoleBinding {
        metadata: ObjectMeta {
            name: Some(cluster_role_binding_name(&ns, &name)),
            labels: Some(crb_labels),
            ..ObjectMeta::default()
        },
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: "ClusterRole".into(),
            name: cr_name,
        },
        subjects: Some(vec![subject]),
    };
    Some(Workloads {
        service_account,
        role,
        role_binding,
        deployment,
        cluster_role,
        cluster_role_binding,
    })
}

fn provider_name(p: &Provider) -> String {
    p.metadata.name.clone().unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use banlieue_api::{
        LocalObjectReference, ProviderClassSpec, ProviderConnection, ProviderSpec, ValueOrSource,
    };

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
                additional_rules: vec![rule(&["batch"], &["jobs"], &["create", "get"])],
                import: Default::default(),
            },
        );
        c.metadata.uid = Some("uid-c".into());
        c
    }

    #[test]
    fn base_rules_are_the_reviewed_role() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../deploy/rbac/provider-base-role.yaml"
        );
        let text = std::fs::read_to_string(path).unwrap();
        let role: Role = serde_saphyr::from_str(&text).unwrap();
        assert_eq!(role.rules.unwrap(), base_rules());
    }

    #[test]
    fn deployment_runs_this_provider() {
        let w = build(&provider(), &class()).unwrap();
        let spec = w.deployment.spec.template.spec.unwrap();
        assert_eq!(
            spec.service_account_name.as_deref(),
            Some("banlieue-provider-edge-7")
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
    }

    #[test]
    fn role_is_base_plus_additional_rules_and_owned_by_the_provider() {
        let w = build(&provider(), &class()).unwrap();
        let rules = w.role.rules.unwrap();
        assert_eq!(rules.len(), base_rules().len() + 1);
        assert_eq!(
            rules.last().unwrap().resources.as_deref(),
            Some(&["jobs".to_owned()][..])
        );
        let owner = &w.role.metadata.owner_references.unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.uid.as_str()),
            ("Provider", "uid-1")
        );
        assert_eq!(owner.controller, Some(true));
    }

    #[test]
    fn cluster_objects_never_point_at_the_namespaced_provider() {
        let w = build(&provider(), &class()).unwrap();
        assert!(w.cluster_role_binding.metadata.owner_references.is_none());
        assert_eq!(
            w.cluster_role_binding.role_ref.name,
            "banlieue-provider-libvirt"
        );
        let owner = &w.cluster_role.metadata.owner_references.unwrap()[0];
        assert_eq!(owner.kind, "ProviderClass");
        let rules = w.cluster_role.rules.unwrap();
        assert!(
            rules
                .iter()
                .any(|r| r.resources.as_deref() == Some(&["vmimages".to_owned()][..]))
        );
        assert!(
            rules
                .iter()
                .any(|r| r.resources.as_deref() == Some(&["jobs".to_owned()][..]))
        );
    }
}

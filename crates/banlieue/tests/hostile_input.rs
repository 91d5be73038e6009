//! Hostile input against the whole system: a real control plane and a real libvirtd, the
//! controller and the good Provider's workload running in this process as their
//! ServiceAccounts under the shipped RBAC (wired exactly as `banlieue dev up` wires them), a
//! warm pool on that Provider. Each row of the table is named after the attack it stops and
//! asserts its outcome: the API server's refusal, the Ready reason a hostile Provider reports,
//! or the reason a machine is refused. After every row a fresh claim still binds and the good
//! Provider is still Ready: nothing is lost and nothing is poisoned.
//!
//! The check runs after each row rather than once after the table: with two warm members a
//! bind takes well under a second, and a row that broke the system is then named by the
//! check that follows it.
//!
//! Hostile libvirt hosts are tokio tasks on 127.0.0.1 with their own throwaway CA; they finish
//! a TLS handshake and then misbehave.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use banlieue_api::names::{self, SYSTEM_NAMESPACE};
use banlieue_api::{
    LibvirtMachine, Provider, VMClass, VMImage, VirtualMachine, VirtualMachineClaim,
    VirtualMachinePool, ZonePhase,
};
use banlieue_dev::{self as dev, objects};
use banlieue_provider_libvirt::domain_xml::DomainType;
use banlieue_testenv::control_plane::ControlPlane;
use banlieue_testenv::libvirtd::{Libvirtd, LibvirtdOptions};
use banlieue_testenv::poll;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, ListParams, ObjectMeta, PostParams,
};
use kube::{Client, ResourceExt};
use prometheus_client::registry::Registry;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// How long any one wait of the test may take: a TCG guest on a busy 2-core machine.
const DEADLINE: Duration = Duration::from_secs(180);
/// Warm members: one can be handed out while the one bound by the previous check refills.
const REPLICAS: i32 = 2;
/// The CA ConfigMap of the hostile hosts, beside the good Provider's.
const HOSTILE_CA: &str = "hostile-ca";
/// May create pools and VirtualMachines, and nothing else: not get Secrets.
const POOL_AUTHOR: &str = "bob";
/// May create VMImages too (the test control plane knows a fixed set of users): the image
/// rows use only that grant.
const IMAGE_AUTHOR: &str = POOL_AUTHOR;

// ---------------------------------------------------------------------------------------------
// The table.

/// What an attacker writes.
enum Input {
    /// An object created by `user`.
    Create { user: &'static str, object: Value },
    /// A Provider in the system namespace with this endpoint and CA ConfigMap, its workload
    /// run in this process as the ServiceAccount the operator made for it.
    Provider {
        endpoint: String,
        ca_configmap: &'static str,
    },
    /// A VMImage created by `user` whose one BackingFile source, for the good Provider's
    /// class, names `volume`.
    BackingFile { user: &'static str, volume: String },
    /// A pool of one member, created by the administrator, whose template names `class` (made
    /// first when given) and may carry a `userDataSecretRef`.
    Pool {
        class: Option<Value>,
        user_data_secret: Option<(&'static str, &'static str)>,
    },
    /// A request made with the token of one of banlieue's own ServiceAccounts in the system
    /// namespace: what that component could do were it compromised.
    AsAccount { account: String, request: Request },
    /// A write by `user` to an object of the good pool or of alice (dry runs: a write that
    /// got through leaves nothing behind for the rows after it).
    Write { user: &'static str, write: Write },
    /// A Provider `name` in namespace `namespace` (made and enabled for the controller, as an
    /// administrator enables one), whose `<namespace>-<name>` reads like the good Provider's
    /// `banlieue-system-local`; created, then deleted.
    LookAlikeProvider {
        namespace: &'static str,
        name: &'static str,
    },
}

/// What a compromised banlieue identity asks the API server for. Creates are dry runs: a
/// refusal is decided before anything would be stored, and an acceptance leaves nothing behind.
enum Request {
    /// Creates `object`, in its `metadata.namespace` (cluster-scoped when it has none).
    Create(Value),
    /// Creates a copy of the operator's Deployment for the good Provider, its pod spec changed.
    CopyOfProviderDeployment(fn(&mut Value)),
    /// Reads the object `object` names.
    Get(Value),
    /// Deletes the object `object` names.
    Delete(Value),
    /// Writes addresses into the status of one of the good pool's LibvirtMachines.
    PatchAGoodMachinesStatus,
}

/// What a user of the namespace writes to objects that are not theirs.
enum Write {
    /// Merge-patches an unclaimed member of the good pool.
    PatchAWarmMember(Value),
    /// Merge-patches the LibvirtMachine of an unclaimed member of the good pool.
    PatchAWarmMembersMachine(Value),
    /// Creates a LibvirtMachine shaped like a good member's, with no VirtualMachine owning it.
    CreateAMachine,
    /// Deletes a claim of alice's.
    DeleteAlicesClaim,
    /// Merge-patches a claim of alice's.
    PatchAlicesClaim(Value),
    /// Merge-patches the status of a claim of alice's.
    PatchAlicesClaimStatus(Value),
}

/// What the system does with it.
enum Outcome {
    /// The API server refuses the write with this HTTP code and these words.
    Refused { code: u16, says: &'static str },
    /// The Provider's Ready condition: its status and reason; the message holds `says` and
    /// never `never`.
    ProviderReady {
        status: &'static str,
        reason: &'static str,
        says: &'static str,
        never: Option<&'static str>,
    },
    /// The good Provider fails the image's zone with these words.
    ZoneFailed { says: &'static str },
    /// The member's LibvirtMachine is refused with Ready=False, this reason and these words;
    /// no domain is defined for it.
    MachineRefused {
        reason: &'static str,
        says: &'static str,
    },
    /// The good Provider's account stays in the shared ClusterRoleBinding, and its build
    /// namespace RoleBinding stays, through the look-alike's life and deletion.
    KeepsItsGrants,
}

struct Row {
    attack: &'static str,
    input: Input,
    outcome: Outcome,
}

fn claim(name: &str, subject: &str, issuer: &str, ttl_seconds: i64) -> Value {
    json!({
        "apiVersion": "banlieue.io/v1alpha1",
        "kind": "VirtualMachineClaim",
        "metadata": {"name": name, "namespace": SYSTEM_NAMESPACE},
        "spec": {
            "poolRef": {"name": objects::POOL},
            "subject": {"issuer": issuer, "id": subject},
            "ttlSeconds": ttl_seconds,
        },
    })
}

fn alices_claim(name: &str) -> Value {
    claim(name, objects::CLAIMANT, objects::ISSUER, 600)
}

/// The good pool, renamed and reshaped by `edit`.
fn pool(name: &str, edit: impl FnOnce(&mut Value)) -> Value {
    let mut pool = serde_json::to_value(objects::pool()).expect("pool as JSON");
    pool["metadata"]["name"] = json!(name);
    pool["spec"]["replicas"] = json!(1);
    edit(&mut pool);
    pool
}

/// A VirtualMachine named `name`, shaped like the good pool's members.
fn machine(name: &str) -> Value {
    let template = pool("template", |_| {})["spec"]["template"].clone();
    json!({
        "apiVersion": "banlieue.io/v1alpha1",
        "kind": "VirtualMachine",
        "metadata": {"name": name, "namespace": SYSTEM_NAMESPACE},
        "spec": template["spec"],
    })
}

/// A VirtualMachine a pool author writes to pass for a member, shaped by `forge`.
fn planted(forge: impl FnOnce(&mut Value)) -> Value {
    let mut vm = machine("planted");
    vm["spec"]["userData"] = json!("#cloud-config\nruncmd: [[sh, -c, 'echo planted']]\n");
    forge(&mut vm);
    vm
}

/// Points the template's user-data at `key` of Secret `secret`, instead of inline user-data.
fn user_data_from(pool: &mut Value, secret: &str, key: &str) {
    let spec = &mut pool["spec"]["template"]["spec"];
    if let Some(spec) = spec.as_object_mut() {
        spec.remove("userData");
    }
    spec["userDataSecretRef"] = json!({"name": secret, "key": key});
}

fn class(name: &str, edit: impl FnOnce(&mut Value)) -> Value {
    let mut class = serde_json::to_value(objects::class()).expect("class as JSON");
    class["metadata"]["name"] = json!(name);
    edit(&mut class);
    class
}

fn rows(hosts: &HostileHosts, libvirtd: &Libvirtd) -> Vec<Row> {
    let port = libvirtd.tls_port();
    vec![
        // Names.
        Row {
            attack: "a_claim_name_longer_than_any_object_name",
            input: Input::Create {
                user: objects::CLAIMANT,
                object: alices_claim(&"a".repeat(254)),
            },
            outcome: Outcome::Refused {
                code: 422,
                says: "must be no more than 253 characters",
            },
        },
        Row {
            attack: "a_claim_name_outside_ascii",
            input: Input::Create {
                user: objects::CLAIMANT,
                object: alices_claim("sandbox-für-alice"),
            },
            outcome: Outcome::Refused {
                code: 422,
                says: "a lowercase RFC 1123 subdomain",
            },
        },
        Row {
            attack: "a_claim_name_too_long_for_the_label_it_becomes",
            input: Input::Create {
                user: objects::CLAIMANT,
                object: alices_claim(&"c".repeat(64)),
            },
            outcome: Outcome::Refused {
                code: 422,
                says: "at most 63 characters",
            },
        },
        Row {
            attack: "a_pool_name_too_long_for_the_label_it_becomes",
            input: Input::Create {
                user: "admin",
                object: pool(&"p".repeat(64), |_| {}),
            },
            outcome: Outcome::Refused {
                code: 422,
                says: "at most 63 characters",
            },
        },
        Row {
            attack: "a_machine_name_too_long_for_the_files_it_becomes",
            input: Input::Create {
                user: "admin",
                object: machine(&"m".repeat(names::MAX_MACHINE_NAME_LEN + 1)),
            },
            outcome: Outcome::Refused {
                code: 422,
                says: "name is at most 180 characters",
            },
        },
        // Planted members (deploy/admission/reserved-metadata.yaml): a writer of VirtualMachines
        // who is not the controller makes one that looks like a member of the good pool, so
        // that a victim's claim would bind a VM of the attacker's shaping.
        Row {
            attack: "a_member_planted_by_its_pool_label",
            input: Input::Create {
                user: POOL_AUTHOR,
                object: planted(|vm| {
                    vm["metadata"]["labels"] = json!({(names::LABEL_POOL): objects::POOL});
                }),
            },
            outcome: Outcome::Refused {
                code: 403,
                says: "label banlieue.io/pool is written only by banlieue's controller: bob",
            },
        },
        Row {
            attack: "a_member_planted_as_already_bound",
            input: Input::Create {
                user: POOL_AUTHOR,
                object: planted(|vm| {
                    vm["metadata"]["labels"] = json!({(names::LABEL_CLAIM): "sandbox-for-alice"});
                }),
            },
            outcome: Outcome::Refused {
                code: 403,
                says: "label banlieue.io/claim is written only by banlieue's controller",
            },
        },
        Row {
            attack: "a_member_planted_with_a_forged_bound_at",
            input: Input::Create {
                user: POOL_AUTHOR,
                object: planted(|vm| {
                    vm["metadata"]["annotations"] =
                        json!({(names::ANNOTATION_BOUND_AT): "2099-01-01T00:00:00Z"});
                }),
            },
            outcome: Outcome::Refused {
                code: 403,
                says: "annotation banlieue.io/bound-at is written only by banlieue's controller",
            },
        },
        Row {
            attack: "a_member_planted_by_its_owner_reference",
            input: Input::Create {
                user: POOL_AUTHOR,
                object: planted(|vm| {
                    vm["metadata"]["ownerReferences"] = json!([{
                        "apiVersion": "banlieue.io/v1alpha1",
                        "kind": "VirtualMachinePool",
                        "name": objects::POOL,
                        "uid": "6f1d3c52-0000-4000-8000-000000000000",
                        "controller": true,
                    }]);
                }),
            },
            outcome: Outcome::Refused {
                code: 403,
                says: "ownerReferences to banlieue objects are written only by banlieue's controller",
            },
        },
        // Between subjects (deploy/admission/reserved-metadata.yaml,
        // virtualmachineclaim-subject-authorization.yaml, status-writers.yaml): a user of the
        // namespace with write grants on members, machines or claims reshapes, releases or
        // retargets what another subject gets.
        Row {
            attack: "a_warm_members_image_rewritten_before_placement",
            input: Input::Write {
                user: POOL_AUTHOR,
                write: Write::PatchAWarmMember(json!({"spec": {
                    "imageRef": {"name": "attackers-os"},
                    "userData": "#cloud-config\nruncmd: [exfiltrate]\n",
                }})),
            },
            outcome: Outcome::Refused {
                code: 403,
                says: "is written only by banlieue's controller: it is a member of a pool, so bob may not change it",
            },
        },
        Row {
            attack: "a_warm_members_machine_moved_to_another_network",
            input: Input::Write {
                user: POOL_AUTHOR,
                write: Write::PatchAWarmMembersMachine(json!({"spec": {"network": "default"}})),
            },
            outcome: Outcome::Refused {
                code: 403,
                says: "is written only by banlieue's controller: it belongs to a VirtualMachine",
            },
        },
        Row {
            // A member's egress is its class's (ADR-0078): widening it on the machine would
            // let the guest reach what its class denies, so it is the machine's spec again.
            attack: "a_warm_members_egress_widened",
            input: Input::Write {
                user: POOL_AUTHOR,
                write: Write::PatchAWarmMembersMachine(json!({"spec": {"egress": {
                    "allow": [{"cidr": "0.0.0.0/0"}],
                    "allowAlwaysDenied": ["LinkLocal", "HostAddresses", "GuestToGuest"]
                }}})),
            },
            outcome: Outcome::Refused {
                code: 403,
                says: "is written only by banlieue's controller: it belongs to a VirtualMachine",
            },
        },
        Row {
            attack: "a_warm_members_domain_protection_removed",
            input: Input::Write {
                user: POOL_AUTHOR,
                write: Write::PatchAWarmMembersMachine(json!({"metadata": {"finalizers": null}})),
            },
            outcome: Outcome::Refused {
                code: 403,
                says: "finalizer banlieue.io/domain-protection is written only by banlieue: bob",
            },
        },
        Row {
            attack: "a_machine_written_directly",
            input: Input::Write {
                user: POOL_AUTHOR,
                write: Write::CreateAMachine,
            },
            outcome: Outcome::Refused {
                code: 403,
                says: "a LibvirtMachine is made only by banlieue's controller",
            },
        },
        Row {
            attack: "another_claimant_releasing_alices_claim",
            input: Input::Write {
                user: NEIGHBOUR,
                write: Write::DeleteAlicesClaim,
            },
            outcome: Outcome::Refused {
                code: 403,
                says: "only its subject, a listed broker or an administrator may delete it, and you are broker",
            },
        },
        Row {
            attack: "another_claimant_relabelling_alices_claim",
            input: Input::Write {
                user: NEIGHBOUR,
                write: Write::PatchAlicesClaim(
                    json!({"metadata": {"labels": {"selected-by": "broker"}}}),
                ),
            },
            outcome: Outcome::Refused {
                code: 403,
                says: "may change it, and you are broker",
            },
        },
        Row {
            attack: "another_claimant_stretching_alices_ttl",
            input: Input::Write {
                user: NEIGHBOUR,
                write: Write::PatchAlicesClaimStatus(
                    json!({"status": {"expiresAt": "2099-01-01T00:00:00Z"}}),
                ),
            },
            outcome: Outcome::Refused {
                code: 403,
                says: "status of VirtualMachineClaim",
            },
        },
        Row {
            attack: "the_subject_removing_the_claim_protection",
            input: Input::Write {
                user: objects::CLAIMANT,
                write: Write::PatchAlicesClaim(json!({"metadata": {"finalizers": null}})),
            },
            outcome: Outcome::Refused {
                code: 403,
                says: "finalizer banlieue.io/claim-protection is written only by banlieue's controller: alice",
            },
        },
        // Images that name backend volumes (row 2 of the isolation review): a VMImage author
        // names another guest's seed or disk, or a volume the administrator did not declare,
        // to boot VMs with it attached.
        Row {
            attack: "a_backing_file_naming_another_machines_seed",
            input: Input::BackingFile {
                user: IMAGE_AUTHOR,
                volume: format!("{SYSTEM_NAMESPACE}-victim-cidata.iso"),
            },
            outcome: Outcome::ZoneFailed {
                says: "is a machine's own disk or seed",
            },
        },
        Row {
            attack: "a_backing_file_naming_another_machines_os_disk",
            input: Input::BackingFile {
                user: IMAGE_AUTHOR,
                volume: format!("{SYSTEM_NAMESPACE}-victim-os.qcow2"),
            },
            outcome: Outcome::ZoneFailed {
                says: "is a machine's own disk or seed",
            },
        },
        Row {
            attack: "a_backing_file_naming_an_undeclared_volume",
            input: Input::BackingFile {
                user: IMAGE_AUTHOR,
                volume: "someone-elses-disk.qcow2".to_owned(),
            },
            outcome: Outcome::ZoneFailed {
                says: "is not declared for BackingFile sources",
            },
        },
        // What banlieue's own identities may do, were one of them compromised: start a
        // workload that is node root (row 3 of the isolation review, deploy/admission/
        // workload-pins.yaml), rewrite the cluster's bindings (row 4, RBAC), read the registry
        // credentials or write another Provider's machines (row 8), or name credentials their
        // writer may not read (row 6, deploy/admission/pull-secret-authorization.yaml).
        Row {
            attack: "the_controller_starting_a_deployment_that_mounts_the_host",
            input: Input::AsAccount {
                account: CONTROLLER_ACCOUNT.to_owned(),
                request: Request::CopyOfProviderDeployment(|pod| {
                    pod["volumes"]
                        .as_array_mut()
                        .map(|v| v.push(json!({"name": "root", "hostPath": {"path": "/"}})))
                        .unwrap_or_else(|| {
                            pod["volumes"] = json!([{"name": "root", "hostPath": {"path": "/"}}])
                        });
                }),
            },
            outcome: Outcome::Refused {
                code: 403,
                says: "may not mount a hostPath volume (root)",
            },
        },
        Row {
            attack: "a_provider_starting_a_privileged_import_job",
            input: Input::AsAccount {
                account: workload_name(objects::PROVIDER),
                request: Request::Create(privileged_import_job()),
            },
            outcome: Outcome::Refused {
                code: 403,
                says: "unprivileged, non-root containers",
            },
        },
        Row {
            attack: "the_controller_deleting_the_providers_cluster_role_binding",
            input: Input::AsAccount {
                account: CONTROLLER_ACCOUNT.to_owned(),
                request: Request::Delete(json!({
                    "apiVersion": "rbac.authorization.k8s.io/v1",
                    "kind": "ClusterRoleBinding",
                    "metadata": {"name": "banlieue-providers"},
                })),
            },
            outcome: Outcome::Refused {
                code: 403,
                says: "cannot delete resource \"clusterrolebindings\"",
            },
        },
        Row {
            attack: "the_controller_binding_itself_to_cluster_admin",
            input: Input::AsAccount {
                account: CONTROLLER_ACCOUNT.to_owned(),
                request: Request::Create(json!({
                    "apiVersion": "rbac.authorization.k8s.io/v1",
                    "kind": "ClusterRoleBinding",
                    "metadata": {"name": "banlieue-controller-root"},
                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io",
                                "kind": "ClusterRole", "name": "cluster-admin"},
                    "subjects": [{"kind": "ServiceAccount", "name": CONTROLLER_ACCOUNT,
                                  "namespace": SYSTEM_NAMESPACE}],
                })),
            },
            outcome: Outcome::Refused {
                code: 403,
                says: "cannot create resource \"clusterrolebindings\"",
            },
        },
        // Delegation (deploy/admission/controller-rbac-writes.yaml, workload-pins.yaml): the
        // controller hands its rights to a subject no policy names, who then starts any image
        // as a credential-holding account.
        Row {
            attack: "the_controller_granting_its_rights_to_a_role",
            input: Input::AsAccount {
                account: CONTROLLER_ACCOUNT.to_owned(),
                request: Request::Create(json!({
                    "apiVersion": "rbac.authorization.k8s.io/v1",
                    "kind": "Role",
                    "metadata": {"name": "banlieue-provider-delegate",
                                 "namespace": SYSTEM_NAMESPACE},
                    "rules": [{"apiGroups": ["apps"], "resources": ["deployments"],
                               "verbs": ["create"]}],
                })),
            },
            outcome: Outcome::Refused {
                code: 403,
                says: "grants more than a Provider's own Lease and Provider",
            },
        },
        Row {
            attack: "the_controller_binding_a_class_role_to_a_user",
            input: Input::AsAccount {
                account: CONTROLLER_ACCOUNT.to_owned(),
                request: Request::Create(json!({
                    "apiVersion": "rbac.authorization.k8s.io/v1",
                    "kind": "RoleBinding",
                    "metadata": {"name": "delegate", "namespace": names::DEFAULT_BUILD_NAMESPACE},
                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                "name": "banlieue-provider-class-libvirt"},
                    "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                                  "name": POOL_AUTHOR}],
                })),
            },
            outcome: Outcome::Refused {
                code: 403,
                says: "binds User bob: banlieue's controller binds only Providers' and imports' own ServiceAccounts",
            },
        },
        Row {
            attack: "a_provider_reading_the_registry_credentials",
            input: Input::AsAccount {
                account: workload_name(objects::PROVIDER),
                request: Request::Get(json!({
                    "apiVersion": "v1",
                    "kind": "Secret",
                    "metadata": {"name": PULL_SECRET, "namespace": names::DEFAULT_BUILD_NAMESPACE},
                })),
            },
            outcome: Outcome::Refused {
                code: 403,
                says: "cannot get resource \"secrets\" in API group \"\" in the namespace \"banlieue-imagebuild\"",
            },
        },
        Row {
            attack: "a_provider_writing_another_providers_machine",
            input: Input::AsAccount {
                account: workload_name(OTHER_PROVIDER),
                request: Request::PatchAGoodMachinesStatus,
            },
            outcome: Outcome::Refused {
                code: 403,
                says: "may not write libvirtmachines/status",
            },
        },
        Row {
            attack: "an_image_naming_registry_credentials_its_author_may_not_read",
            input: Input::Create {
                user: IMAGE_AUTHOR,
                object: json!({
                    "apiVersion": "banlieue.io/v1alpha1",
                    "kind": "VMImage",
                    "metadata": {"name": "borrowed-credentials", "namespace": SYSTEM_NAMESPACE},
                    "spec": {"installMode": "Immediate", "sources": [{
                        "providerClass": objects::PROVIDER_CLASS,
                        "kind": "Url",
                        "url": "oci://registry.invalid/private/disk:1",
                        "pullSecretName": PULL_SECRET,
                    }]},
                }),
            },
            outcome: Outcome::Refused {
                code: 403,
                says: "pullSecretName names Secret registry-pull in namespace banlieue-imagebuild, which bob may not get",
            },
        },
        // Binding names (row 9): once `banlieue-provider-<namespace>-<provider>`, so that a
        // Provider `system-local` in namespace `banlieue` overwrote the good Provider's bindings,
        // and deleting it deleted them.
        Row {
            attack: "a_provider_whose_namespace_and_name_read_like_the_good_ones",
            input: Input::LookAlikeProvider {
                namespace: "banlieue",
                name: "system-local",
            },
            outcome: Outcome::KeepsItsGrants,
        },
        // Claims.
        Row {
            attack: "a_claim_for_someone_else",
            input: Input::Create {
                user: objects::CLAIMANT,
                object: claim("for-bob", "bob", objects::ISSUER, 600),
            },
            outcome: Outcome::Refused {
                code: 403,
                says: "spec.subject.id is bob but you are authenticated as alice",
            },
        },
        Row {
            attack: "a_claim_from_an_issuer_the_site_does_not_accept",
            input: Input::Create {
                user: objects::CLAIMANT,
                object: claim(
                    "from-elsewhere",
                    objects::CLAIMANT,
                    "https://evil.example",
                    600,
                ),
            },
            outcome: Outcome::Refused {
                code: 403,
                says: "is not an issuer this site accepts",
            },
        },
        Row {
            attack: "a_ttl_near_i64_max_that_would_overflow_the_deadline",
            input: Input::Create {
                user: objects::CLAIMANT,
                object: claim("forever", objects::CLAIMANT, objects::ISSUER, i64::MAX - 1),
            },
            outcome: Outcome::Refused {
                code: 422,
                says: "should be less than or equal to 315360000",
            },
        },
        Row {
            attack: "a_ttl_already_expired",
            input: Input::Create {
                user: objects::CLAIMANT,
                object: claim("expired", objects::CLAIMANT, objects::ISSUER, 0),
            },
            outcome: Outcome::Refused {
                code: 422,
                says: "should be greater than or equal to 1",
            },
        },
        // Pools.
        Row {
            attack: "a_pool_template_forging_a_claim_label",
            input: Input::Create {
                user: "admin",
                object: pool("forged-label", |p| {
                    p["spec"]["template"]["metadata"]["labels"] =
                        json!({"banlieue.io/claim": objects::CLAIM});
                }),
            },
            outcome: Outcome::Refused {
                code: 422,
                says: "label banlieue.io/claim is reserved",
            },
        },
        Row {
            attack: "a_pool_template_forging_a_subject_annotation",
            input: Input::Create {
                user: "admin",
                object: pool("forged-subject", |p| {
                    p["spec"]["template"]["metadata"]["annotations"] =
                        json!({"banlieue.io/subject-id": "alice"});
                }),
            },
            outcome: Outcome::Refused {
                code: 422,
                says: "annotation banlieue.io/subject-id is reserved",
            },
        },
        Row {
            attack: "a_pool_of_more_replicas_than_any_site_runs",
            input: Input::Create {
                user: "admin",
                object: pool("huge", |p| p["spec"]["replicas"] = json!(i32::MAX)),
            },
            outcome: Outcome::Refused {
                code: 422,
                says: "should be less than or equal to 10000",
            },
        },
        Row {
            attack: "user_data_larger_than_a_seed_carries",
            input: Input::Create {
                user: "admin",
                object: pool("huge-user-data", |p| {
                    p["spec"]["template"]["spec"]["userData"] = json!("x".repeat(65_537));
                }),
            },
            outcome: Outcome::Refused {
                code: 422,
                says: "Too long",
            },
        },
        Row {
            attack: "user_data_from_a_secret_its_author_may_not_read",
            input: Input::Create {
                user: POOL_AUTHOR,
                object: pool("steals-creds", |p| {
                    user_data_from(p, objects::CREDENTIALS_SECRET, "tls.key");
                }),
            },
            outcome: Outcome::Refused {
                code: 403,
                says: "which bob may not get",
            },
        },
        Row {
            attack: "user_data_from_a_secret_that_did_not_opt_in",
            input: Input::Pool {
                class: None,
                user_data_secret: Some((NOT_OPTED_IN_SECRET, "userdata")),
            },
            outcome: Outcome::MachineRefused {
                reason: "UserDataSecretRefused",
                says: "has not opted in to be user-data",
            },
        },
        Row {
            attack: "user_data_from_the_providers_own_credentials",
            input: Input::Pool {
                class: None,
                user_data_secret: Some((objects::CREDENTIALS_SECRET, "tls.key")),
            },
            outcome: Outcome::MachineRefused {
                reason: "UserDataSecretRefused",
                says: "is referenced by Provider local",
            },
        },
        // Sizes.
        Row {
            attack: "a_class_with_more_cpus_than_a_domain_takes",
            input: Input::Create {
                user: "admin",
                object: class("many-cpus", |c| c["spec"]["cpu"] = json!(u32::MAX)),
            },
            outcome: Outcome::Refused {
                code: 422,
                says: "should be less than or equal to 512",
            },
        },
        Row {
            attack: "memory_that_overflows_a_byte_count",
            input: Input::Pool {
                class: Some(class("overflowing-memory", |c| {
                    c["spec"]["memory"] = json!("17Ei");
                })),
                user_data_secret: None,
            },
            outcome: Outcome::MachineRefused {
                reason: "Provisioning",
                says: "memory \"17Ei\" is not a whole number of bytes",
            },
        },
        Row {
            attack: "a_disk_that_overflows_a_byte_count",
            input: Input::Pool {
                class: Some(class("overflowing-disk", |c| {
                    c["spec"]["diskSize"] = json!("99999999999Ei");
                })),
                user_data_secret: None,
            },
            outcome: Outcome::MachineRefused {
                reason: "Provisioning",
                says: "disk size \"99999999999Ei\" is not a whole number of bytes",
            },
        },
        // Provider endpoints.
        Row {
            attack: "a_password_in_the_endpoint",
            input: Input::Provider {
                endpoint: format!("qemu+tls://u:pw@127.0.0.1:{port}/system"),
                ca_configmap: objects::CA_CONFIGMAP,
            },
            outcome: Outcome::ProviderReady {
                status: "False",
                reason: "ConnectFailed",
                says: "user information",
                never: Some("pw"),
            },
        },
        Row {
            attack: "an_upper_case_scheme_still_means_tls",
            input: Input::Provider {
                endpoint: format!("QEMU+TLS://127.0.0.1:{port}/system"),
                ca_configmap: objects::CA_CONFIGMAP,
            },
            outcome: Outcome::ProviderReady {
                status: "True",
                reason: "Connected",
                says: "",
                never: None,
            },
        },
        Row {
            attack: "an_upper_case_ssh_scheme",
            input: Input::Provider {
                endpoint: "QEMU+SSH://root@127.0.0.1/system".into(),
                ca_configmap: objects::CA_CONFIGMAP,
            },
            outcome: Outcome::ProviderReady {
                status: "False",
                reason: "UnsupportedScheme",
                says: "scheme \"qemu+ssh\" is not supported",
                never: None,
            },
        },
        Row {
            attack: "a_plaintext_tcp_endpoint",
            input: Input::Provider {
                endpoint: format!("qemu+tcp://127.0.0.1:{port}/system"),
                ca_configmap: objects::CA_CONFIGMAP,
            },
            outcome: Outcome::ProviderReady {
                status: "False",
                reason: "UnsupportedScheme",
                says: "scheme \"qemu+tcp\" is not supported",
                never: None,
            },
        },
        Row {
            attack: "query_parameters_that_turn_off_verification_and_read_host_files",
            input: Input::Provider {
                endpoint: format!("qemu+tls://127.0.0.1:{port}/system?no_verify=1&pkipath=/etc"),
                ca_configmap: objects::CA_CONFIGMAP,
            },
            outcome: Outcome::ProviderReady {
                status: "False",
                reason: "ConnectFailed",
                says: "takes no query parameters",
                never: None,
            },
        },
        Row {
            attack: "an_ip_host_whose_certificate_has_no_ip_san",
            input: Input::Provider {
                endpoint: hosts.no_ip_san.uri(),
                ca_configmap: HOSTILE_CA,
            },
            outcome: Outcome::ProviderReady {
                status: "False",
                reason: "ConnectFailed",
                says: "no subject alternative name for IP address 127.0.0.1",
                never: None,
            },
        },
        Row {
            attack: "a_server_confirming_with_zero",
            input: Input::Provider {
                endpoint: hosts.zero_confirmation.uri(),
                ca_configmap: HOSTILE_CA,
            },
            outcome: Outcome::ProviderReady {
                status: "False",
                reason: "ConnectFailed",
                says: "the server sent 0x00 instead of its TLS confirmation byte",
                never: None,
            },
        },
        Row {
            attack: "a_server_closing_after_the_handshake",
            input: Input::Provider {
                endpoint: hosts.closes.uri(),
                ca_configmap: HOSTILE_CA,
            },
            outcome: Outcome::ProviderReady {
                status: "False",
                reason: "ConnectFailed",
                says: "ended the connection after the TLS handshake",
                never: None,
            },
        },
        Row {
            attack: "a_server_whose_ca_the_provider_does_not_name",
            input: Input::Provider {
                endpoint: hosts.zero_confirmation.uri(),
                ca_configmap: objects::CA_CONFIGMAP,
            },
            outcome: Outcome::ProviderReady {
                status: "False",
                reason: "ConnectFailed",
                says: "TLS handshake with 127.0.0.1",
                never: None,
            },
        },
    ]
}

/// A claimant of the namespace, as alice is: may create, change and delete claims and write
/// their status (a grant namespace-admin roles often carry), but is not their subject.
const NEIGHBOUR: &str = "broker";
/// The pool alice's victim claims name: none exists, so they stay Pending and bind no member.
const NO_POOL: &str = "no-such-pool";

/// A Secret that may be read as user-data only if it opted in, which it did not.
const NOT_OPTED_IN_SECRET: &str = "database-password";
/// The registry credentials, in the build namespace where only the image builder reads them.
const PULL_SECRET: &str = "registry-pull";
/// The controller's ServiceAccount in the system namespace (deploy/controller.yaml).
const CONTROLLER_ACCOUNT: &str = "banlieue-controller";
/// A second Provider of the namespace, whose account attacks the good Provider's machines. It
/// declares a storage class no pool asks for, so no member is ever placed on it.
const OTHER_PROVIDER: &str = "other-provider";

/// The ServiceAccount the operator makes for a Provider's workload.
fn workload_name(provider: &str) -> String {
    banlieue_operator::workloads::workload_name(provider)
}

/// The Job a provider would start for an import, as its own import account, made privileged.
fn privileged_import_job() -> Value {
    let settings = banlieue_imagebuilder::decide::BuildSettings::default();
    let mut job = serde_json::to_value(banlieue_imagebuilder::decide::build_job(
        &settings,
        SYSTEM_NAMESPACE,
        "probe",
        &format!("sha256:{}", "0".repeat(64)),
        "127.0.0.1:5000/probe@sha256:0",
        banlieue_api::artifacts::Sharing::OneNode,
    ))
    .unwrap_or_default();
    job["metadata"] = json!({"name": "import-probe", "namespace": names::DEFAULT_BUILD_NAMESPACE});
    let pod = &mut job["spec"]["template"]["spec"];
    pod["serviceAccountName"] = json!(banlieue_operator::workloads::import_account_name(
        SYSTEM_NAMESPACE,
        objects::PROVIDER
    ));
    // The API server itself refuses privileged without escalation.
    pod["containers"][0]["securityContext"]["privileged"] = json!(true);
    pod["containers"][0]["securityContext"]["allowPrivilegeEscalation"] = json!(true);
    job
}

// ---------------------------------------------------------------------------------------------
// The test.

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn after_each_hostile_input_the_system_still_binds_claims() {
    if std::env::var_os("BANLIEUE_ALLOW_MISSING_PEERS").is_some()
        && !Libvirtd::available().unwrap_or(false)
    {
        eprintln!("SKIPPED: libvirtd is not installed (BANLIEUE_ALLOW_MISSING_PEERS is set)");
        return;
    }
    let started = Instant::now();
    let (control_plane, libvirtd) = tokio::try_join!(
        async { ControlPlane::start().await.map_err(BoxError::from) },
        async {
            Libvirtd::start(LibvirtdOptions::default())
                .await
                .map_err(|e| BoxError::from(e.to_string()))
        },
    )
    .expect("start the control plane and libvirtd");
    let bridge = format!("bnh{}", std::process::id());
    let shutdown = CancellationToken::new();
    let mut workers = Vec::new();
    let hosts = HostileHosts::start().await;
    let outcome = run(
        &control_plane,
        &libvirtd,
        &bridge,
        &hosts,
        &shutdown,
        &mut workers,
    )
    .await;
    shutdown.cancel();
    banlieue::roles::join_all(workers).await;
    let released = dev::release_host(&libvirtd).await;
    if let Err(error) = outcome {
        panic!("{error}\n--- libvirtd ---\n{}", libvirtd.diagnostics());
    }
    released.expect("stop the test network");
    eprintln!(
        "hostile input: every row and check passed in {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

async fn run(
    control_plane: &ControlPlane,
    libvirtd: &Libvirtd,
    bridge: &str,
    hosts: &HostileHosts,
    shutdown: &CancellationToken,
    workers: &mut Vec<JoinHandle<()>>,
) -> Result<(), BoxError> {
    let admin = control_plane.client()?;
    // The shipped policies (who may make a VirtualMachine a member among them, as
    // docs/security.md has administrators apply them) are in force before anything runs.
    let mut registry = Registry::default();
    workers.extend(
        dev::start_stand_in_default(
            control_plane,
            libvirtd,
            bridge,
            DEADLINE,
            &mut registry,
            shutdown,
        )
        .await?,
    );
    let mut good_pool = objects::pool();
    good_pool.spec.replicas = REPLICAS;
    dev::apply(&admin, &good_pool).await?;
    set_up_attackers(&admin, &hosts.ca_pem).await?;
    // The second Provider's account exists once the operator made its Deployment, the last of
    // its objects (its workload never runs: only its account is used, by the attack rows).
    dev::apply(
        &admin,
        &hostile_provider(OTHER_PROVIDER, &libvirtd.tls_uri(), objects::CA_CONFIGMAP),
    )
    .await?;
    let deployments: Api<k8s_openapi::api::apps::v1::Deployment> =
        Api::namespaced(admin.clone(), SYSTEM_NAMESPACE);
    poll::until(
        "the second Provider's workload objects",
        DEADLINE,
        || async {
            Ok(deployments
                .get_opt(&workload_name(OTHER_PROVIDER))
                .await?
                .map(|_| ()))
        },
    )
    .await?;

    let mut checks = 0;
    still_binds(control_plane, &admin, shutdown, &mut checks, "the start").await?;
    for row in rows(hosts, libvirtd) {
        let row_started = Instant::now();
        play(control_plane, &admin, shutdown, &row)
            .await
            .map_err(|e| format!("row {}: {e}", row.attack))?;
        still_binds(control_plane, &admin, shutdown, &mut checks, row.attack).await?;
        eprintln!(
            "row {} held ({:.1} s)",
            row.attack,
            row_started.elapsed().as_secs_f64()
        );
    }
    // alice releases the pending claim the rows between subjects attacked: it was hers.
    let alices: Api<VirtualMachineClaim> = Api::namespaced(
        control_plane.client_as(objects::CLAIMANT).await?,
        SYSTEM_NAMESPACE,
    );
    if alices.get_opt("alices-pending-claim").await?.is_some() {
        alices
            .delete("alices-pending-claim", &DeleteParams::default())
            .await?;
    }
    // Release is deletion, and every claim the checks made is released completely.
    let claims: Api<VirtualMachineClaim> = Api::namespaced(admin.clone(), SYSTEM_NAMESPACE);
    poll::until("every checked claim to be released", DEADLINE, || async {
        Ok(claims
            .list(&Default::default())
            .await?
            .items
            .is_empty()
            .then_some(()))
    })
    .await?;
    Ok(())
}

/// The hostile CA, a user-data Secret that did not opt in, and a pool and image author who
/// may not read Secrets.
async fn set_up_attackers(admin: &Client, ca_pem: &str) -> Result<(), BoxError> {
    let meta = |name: &str| ObjectMeta {
        name: Some(name.to_owned()),
        namespace: Some(SYSTEM_NAMESPACE.to_owned()),
        ..ObjectMeta::default()
    };
    dev::apply(
        admin,
        &ConfigMap {
            metadata: meta(HOSTILE_CA),
            data: Some(BTreeMap::from([("ca.crt".to_owned(), ca_pem.to_owned())])),
            ..ConfigMap::default()
        },
    )
    .await?;
    dev::apply(
        admin,
        &Secret {
            metadata: meta(NOT_OPTED_IN_SECRET),
            data: Some(BTreeMap::from([(
                "userdata".to_owned(),
                ByteString(b"#cloud-config\npassword: hunter2\n".to_vec()),
            )])),
            ..Secret::default()
        },
    )
    .await?;
    dev::apply(
        admin,
        &Secret {
            metadata: ObjectMeta {
                name: Some(PULL_SECRET.to_owned()),
                namespace: Some(names::DEFAULT_BUILD_NAMESPACE.to_owned()),
                ..ObjectMeta::default()
            },
            type_: Some("kubernetes.io/dockerconfigjson".to_owned()),
            data: Some(BTreeMap::from([(
                ".dockerconfigjson".to_owned(),
                ByteString(
                    br#"{"auths":{"registry.invalid":{"auth":"cHJpdmF0ZTpzZWNyZXQ="}}}"#.to_vec(),
                ),
            )])),
            ..Secret::default()
        },
    )
    .await?;
    // Pools and VirtualMachines: what makes a VM a member is refused by admission, not by
    // RBAC, so the planted-member rows test the policy. VMImages: the BackingFile rows.
    // Members and machines: what makes a VM a member, and what its guest is built from, is
    // refused by admission, not by RBAC. Claims: the neighbour may write any claim of the
    // namespace, and admission keeps alice's hers.
    let grants: [(&str, &str, &[&str], &[&str]); 5] = [
        (
            "pool-author",
            POOL_AUTHOR,
            &["virtualmachinepools", "virtualmachines"],
            &["create"],
        ),
        ("image-author", IMAGE_AUTHOR, &["vmimages"], &["create"]),
        (
            "member-writer",
            POOL_AUTHOR,
            &["virtualmachines", "libvirtmachines"],
            &["get", "list", "patch", "update", "create"],
        ),
        (
            "claim-neighbour",
            NEIGHBOUR,
            &["virtualmachineclaims", "virtualmachineclaims/status"],
            &["get", "list", "patch", "update", "delete"],
        ),
        (
            "claim-finalizers",
            objects::CLAIMANT,
            &["virtualmachineclaims"],
            &["patch", "update"],
        ),
    ];
    for (role, user, resources, verbs) in grants {
        dev::apply(
            admin,
            &Role {
                metadata: meta(role),
                rules: Some(vec![PolicyRule {
                    api_groups: Some(vec!["banlieue.io".into()]),
                    resources: Some(resources.iter().map(|r| (*r).to_owned()).collect()),
                    verbs: verbs.iter().map(|v| (*v).to_owned()).collect(),
                    ..PolicyRule::default()
                }]),
            },
        )
        .await?;
        dev::apply(
            admin,
            &RoleBinding {
                metadata: meta(role),
                role_ref: RoleRef {
                    api_group: Some("rbac.authorization.k8s.io".into()),
                    kind: "Role".into(),
                    name: role.into(),
                },
                subjects: Some(vec![Subject {
                    api_group: Some("rbac.authorization.k8s.io".into()),
                    kind: "User".into(),
                    name: user.into(),
                    namespace: None,
                }]),
            },
        )
        .await?;
    }
    Ok(())
}

/// Feeds one row's input and asserts its outcome, then removes what it left.
async fn play(
    control_plane: &ControlPlane,
    admin: &Client,
    shutdown: &CancellationToken,
    row: &Row,
) -> Result<(), BoxError> {
    match (&row.input, &row.outcome) {
        (Input::Create { user, object }, Outcome::Refused { code, says }) => {
            let client = control_plane.client_as(user).await?;
            let api = dynamic_api(client, object)?;
            let object: DynamicObject = serde_json::from_value(object.clone())?;
            let created = api.create(&PostParams::default(), &object).await;
            expect_refused(created.map(|_| ()), *code, says)
        }
        (
            Input::Provider {
                endpoint,
                ca_configmap,
            },
            Outcome::ProviderReady {
                status,
                reason,
                says,
                never,
            },
        ) => {
            let name = format!("hostile-{}", row.attack.replace('_', "-"));
            let name = banlieue_api::names::shorten(&name);
            let provider = hostile_provider(&name, endpoint, ca_configmap);
            dev::apply(admin, &provider).await?;
            // The hostile Provider's workload runs as its own ServiceAccount, beside the good
            // one; a role of it that dies (a panic on hostile input) cancels only `workload`,
            // which the row then reports.
            let workload = shutdown.child_token();
            let mut registry = Registry::default();
            let tasks = dev::spawn_provider_workload(
                control_plane,
                &name,
                Some(DomainType::Qemu),
                DEADLINE,
                &mut registry,
                &workload,
            )
            .await?;
            let providers: Api<Provider> = Api::namespaced(admin.clone(), SYSTEM_NAMESPACE);
            let seen = poll::until(
                &format!("Provider {name} to report {reason}"),
                DEADLINE,
                || async {
                    let provider = providers.get(&name).await?;
                    let ready = provider
                        .status
                        .as_ref()
                        .and_then(|s| banlieue_api::conditions::find(&s.conditions, "Ready"))
                        .filter(|c| c.reason != "WorkloadStarting")
                        .cloned();
                    Ok(ready)
                },
            )
            .await;
            let died = workload.is_cancelled();
            workload.cancel();
            banlieue::roles::join_all(tasks).await;
            if died {
                return Err("a role of the hostile Provider's workload died".into());
            }
            let ready = seen?;
            if ready.status != *status
                || ready.reason != *reason
                || !ready.message.contains(says)
                || never.is_some_and(|n| ready.message.contains(n))
            {
                return Err(format!(
                    "Ready={} {}: {:?}; expected Ready={status} {reason} saying {says:?}{}",
                    ready.status,
                    ready.reason,
                    ready.message,
                    never
                        .map(|n| format!(" and never {n:?}"))
                        .unwrap_or_default()
                )
                .into());
            }
            providers.delete(&name, &DeleteParams::default()).await?;
            poll::until(&format!("Provider {name} to be gone"), DEADLINE, || async {
                Ok(providers.get_opt(&name).await?.is_none().then_some(()))
            })
            .await?;
            Ok(())
        }
        (
            Input::Pool {
                class,
                user_data_secret,
            },
            Outcome::MachineRefused { reason, says },
        ) => {
            let name = banlieue_api::names::shorten(&row.attack.replace('_', "-"));
            if let Some(class) = class {
                let class: VMClass = serde_json::from_value(class.clone())?;
                dev::apply(admin, &class).await?;
            }
            let object = pool(&name, |p| {
                if let Some(class) = class {
                    p["spec"]["template"]["spec"]["classRef"]["name"] =
                        class["metadata"]["name"].clone();
                }
                if let Some((secret, key)) = user_data_secret {
                    user_data_from(p, secret, key);
                }
            });
            let pool: VirtualMachinePool = serde_json::from_value(object)?;
            dev::apply(admin, &pool).await?;
            let machines: Api<LibvirtMachine> = Api::namespaced(admin.clone(), SYSTEM_NAMESPACE);
            let prefix = format!("{name}-");
            let refused = poll::until(
                &format!("a member of {name} to be refused"),
                DEADLINE,
                || async {
                    let found = machines.list(&Default::default()).await?.items;
                    Ok(found
                        .into_iter()
                        .filter(|m| m.name_any().starts_with(&prefix))
                        .find_map(|m| {
                            let conditions = m.status.as_ref()?.contract.conditions.clone();
                            banlieue_api::conditions::find(&conditions, "Ready")
                                .filter(|c| c.status == "False" && c.reason == *reason)
                                .cloned()
                                .map(|c| (m.name_any(), c))
                        }))
                },
            )
            .await;
            let (machine, ready) = match refused {
                Ok(refused) => refused,
                Err(error) => {
                    let state = json!({
                        "pool": Api::<DynamicObject>::namespaced_with(
                            admin.clone(),
                            SYSTEM_NAMESPACE,
                            &ApiResource::erase::<VirtualMachinePool>(&()),
                        ).get(&name).await.ok().map(|p| p.data["status"].clone()),
                        "machines": machines.list(&Default::default()).await?.items.iter()
                            .map(|m| json!([m.name_any(), m.status])).collect::<Vec<_>>(),
                        "vms": Api::<VirtualMachine>::namespaced(admin.clone(), SYSTEM_NAMESPACE)
                            .list(&Default::default()).await?.items.iter()
                            .map(|m| json!([m.name_any(), m.status])).collect::<Vec<_>>(),
                    });
                    return Err(format!("{error}; state: {state:#}").into());
                }
            };
            if !ready.message.contains(says) {
                return Err(format!(
                    "LibvirtMachine {machine}: {}: {:?}; expected it to say {says:?}",
                    ready.reason, ready.message
                )
                .into());
            }
            // The refused member goes with its pool, and nothing of it stays behind.
            let pools: Api<VirtualMachinePool> = Api::namespaced(admin.clone(), SYSTEM_NAMESPACE);
            pools.delete(&name, &DeleteParams::foreground()).await?;
            let vms: Api<VirtualMachine> = Api::namespaced(admin.clone(), SYSTEM_NAMESPACE);
            poll::until(
                &format!("pool {name} and its members to be gone"),
                DEADLINE,
                || async {
                    let pool_gone = pools.get_opt(&name).await?.is_none();
                    let members_left = vms
                        .list(&Default::default())
                        .await?
                        .items
                        .iter()
                        .any(|vm| vm.name_any().starts_with(&prefix));
                    let machines_left = machines
                        .list(&Default::default())
                        .await?
                        .items
                        .iter()
                        .any(|m| m.name_any().starts_with(&prefix));
                    Ok((pool_gone && !members_left && !machines_left).then_some(()))
                },
            )
            .await?;
            Ok(())
        }
        (Input::BackingFile { user, volume }, Outcome::ZoneFailed { says }) => {
            let name = banlieue_api::names::shorten(&row.attack.replace('_', "-"));
            let image = json!({
                "apiVersion": "banlieue.io/v1alpha1",
                "kind": "VMImage",
                "metadata": {"name": name, "namespace": SYSTEM_NAMESPACE},
                "spec": {"installMode": "Immediate", "sources": [{
                    "providerClass": objects::PROVIDER_CLASS,
                    "kind": "BackingFile",
                    "volume": volume,
                }]},
            });
            let api = dynamic_api(control_plane.client_as(user).await?, &image)?;
            api.create(&PostParams::default(), &serde_json::from_value(image)?)
                .await?;
            let images: Api<VMImage> = Api::namespaced(admin.clone(), SYSTEM_NAMESPACE);
            let zone =
                poll::until(
                    &format!("VMImage {name}'s zone on the good Provider"),
                    DEADLINE,
                    || async {
                        let image = images.get(&name).await?;
                        let zone = image
                            .status
                            .into_iter()
                            .flat_map(|s| s.per_provider)
                            .find(|p| p.provider == objects::PROVIDER)
                            .and_then(|p| p.zones.into_iter().next());
                        Ok(zone.filter(|z| {
                            z.phase == ZonePhase::Failed || z.phase == ZonePhase::Ready
                        }))
                    },
                )
                .await?;
            let message = zone.message.clone().unwrap_or_default();
            if zone.phase != ZonePhase::Failed || !message.contains(says) {
                return Err(format!(
                    "zone {:?} {message:?}; expected Failed saying {says:?}",
                    zone.phase
                )
                .into());
            }
            images.delete(&name, &DeleteParams::default()).await?;
            poll::until(&format!("VMImage {name} to be gone"), DEADLINE, || async {
                Ok(images.get_opt(&name).await?.is_none().then_some(()))
            })
            .await?;
            Ok(())
        }
        (Input::AsAccount { account, request }, Outcome::Refused { code, says }) => {
            let client = control_plane
                .client_as_service_account(SYSTEM_NAMESPACE, account)
                .await?;
            expect_refused(request_as(client, admin, request).await, *code, says)
        }
        (Input::Write { user, write }, Outcome::Refused { code, says }) => {
            let client = control_plane.client_as(user).await?;
            let alice = control_plane.client_as(objects::CLAIMANT).await?;
            let written = write_as(client, alice, admin, write).await?;
            expect_refused(written, *code, says)
        }
        (Input::LookAlikeProvider { namespace, name }, Outcome::KeepsItsGrants) => {
            look_alike_provider(admin, namespace, name).await
        }
        _ => Err("a row whose input and outcome do not go together".into()),
    }
}

/// Plays [`Input::LookAlikeProvider`]: the good Provider's grants are checked while the
/// look-alike exists and after it is gone.
async fn look_alike_provider(admin: &Client, namespace: &str, name: &str) -> Result<(), BoxError> {
    use banlieue_operator::workloads::PROVIDERS_CLUSTER_BINDING;
    use k8s_openapi::api::core::v1::Namespace;
    use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
    let namespaces: Api<Namespace> = Api::all(admin.clone());
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": namespace}}))?,
        )
        .await?;
    // Enabled as the system namespace is (deploy/rbac/controller-workloads-rolebindings.yaml).
    let enable: RoleBinding = serde_json::from_value(json!({
        "metadata": {"name": "banlieue-controller-workloads", "namespace": namespace},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                    "name": "banlieue-controller-workloads"},
        "subjects": [{"kind": "ServiceAccount", "name": CONTROLLER_ACCOUNT,
                      "namespace": SYSTEM_NAMESPACE}],
    }))?;
    dev::apply(admin, &enable).await?;
    let mut provider =
        hostile_provider(name, "qemu+tls://127.0.0.1:1/system", objects::CA_CONFIGMAP);
    provider.metadata.namespace = Some(namespace.to_owned());
    dev::apply(admin, &provider).await?;

    let bindings: Api<ClusterRoleBinding> = Api::all(admin.clone());
    let account = |ns: &str, provider: &str| (workload_name(provider), ns.to_owned());
    let good = account(SYSTEM_NAMESPACE, objects::PROVIDER);
    let look_alike = account(namespace, name);
    let subjects = || async {
        Ok::<_, kube::Error>(
            bindings
                .get(PROVIDERS_CLUSTER_BINDING)
                .await?
                .subjects
                .unwrap_or_default()
                .into_iter()
                .map(|s| (s.name, s.namespace.unwrap_or_default()))
                .collect::<Vec<_>>(),
        )
    };
    // The build namespace's RoleBindings of the good Provider, by name.
    let build_bindings: Api<RoleBinding> =
        Api::namespaced(admin.clone(), names::DEFAULT_BUILD_NAMESPACE);
    let goods_build_bindings = || async {
        let mut found: Vec<String> = build_bindings
            .list(&Default::default())
            .await?
            .items
            .into_iter()
            .filter(|b| {
                b.subjects
                    .iter()
                    .flatten()
                    .any(|s| s.name == good.0 && s.namespace.as_deref() == Some(SYSTEM_NAMESPACE))
            })
            .map(|b| b.name_any())
            .collect();
        found.sort();
        Ok::<_, kube::Error>(found)
    };
    let before = goods_build_bindings().await?;
    if before.is_empty() {
        return Err("the good Provider has no RoleBinding in the build namespace".into());
    }
    poll::until(
        "both accounts in the shared ClusterRoleBinding",
        DEADLINE,
        || async {
            let now = subjects().await?;
            Ok((now.contains(&good) && now.contains(&look_alike)).then_some(()))
        },
    )
    .await?;

    let providers: Api<Provider> = Api::namespaced(admin.clone(), namespace);
    providers.delete(name, &DeleteParams::default()).await?;
    poll::until(
        &format!("Provider {namespace}/{name} to be gone"),
        DEADLINE,
        || async { Ok(providers.get_opt(name).await?.is_none().then_some(())) },
    )
    .await?;
    let after = subjects().await?;
    if !after.contains(&good) || after.contains(&look_alike) {
        return Err(
            format!("after the look-alike's deletion the shared binding holds {after:?}").into(),
        );
    }
    let kept = goods_build_bindings().await?;
    if kept != before {
        return Err(format!(
            "the good Provider's build-namespace bindings were {before:?}, now {kept:?}"
        )
        .into());
    }
    namespaces
        .delete(namespace, &DeleteParams::default())
        .await?;
    Ok(())
}

/// The API server refused with `code`, saying `says`.
fn expect_refused(result: Result<(), kube::Error>, code: u16, says: &str) -> Result<(), BoxError> {
    match result {
        Ok(()) => Err("the API server accepted it".into()),
        Err(kube::Error::Api(status)) if status.code == code && status.message.contains(says) => {
            Ok(())
        }
        Err(kube::Error::Api(status)) => Err(format!(
            "refused with {} {:?}; expected {code} saying {says:?}",
            status.code, status.message
        )
        .into()),
        Err(other) => Err(other.into()),
    }
}

/// Sends `request` with `client`; `admin` only reads what the request is made from.
async fn request_as(client: Client, admin: &Client, request: &Request) -> Result<(), kube::Error> {
    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let object_of = |value: &Value| -> Result<DynamicObject, kube::Error> {
        serde_json::from_value(value.clone()).map_err(kube::Error::SerdeError)
    };
    match request {
        Request::Create(object) => {
            let api = any_api(client, object);
            api.create(&dry_run, &object_of(object)?).await.map(|_| ())
        }
        Request::CopyOfProviderDeployment(change) => {
            let shape = json!({"apiVersion": "apps/v1", "kind": "Deployment",
                               "metadata": {"namespace": SYSTEM_NAMESPACE}});
            let original = any_api(admin.clone(), &shape)
                .get(&workload_name(objects::PROVIDER))
                .await?;
            let mut copy = serde_json::to_value(original).map_err(kube::Error::SerdeError)?;
            copy["metadata"] = json!({"name": "copied-provider", "namespace": SYSTEM_NAMESPACE});
            copy["status"] = Value::Null;
            change(&mut copy["spec"]["template"]["spec"]);
            let api = any_api(client, &shape);
            api.create(&dry_run, &object_of(&copy)?).await.map(|_| ())
        }
        Request::Get(object) => {
            let name = object["metadata"]["name"].as_str().unwrap_or_default();
            any_api(client, object).get(name).await.map(|_| ())
        }
        Request::Delete(object) => {
            let name = object["metadata"]["name"].as_str().unwrap_or_default();
            let dry_run = DeleteParams {
                dry_run: true,
                ..DeleteParams::default()
            };
            any_api(client, object)
                .delete(name, &dry_run)
                .await
                .map(|_| ())
        }
        Request::PatchAGoodMachinesStatus => {
            let machines: Api<LibvirtMachine> = Api::namespaced(admin.clone(), SYSTEM_NAMESPACE);
            let prefix = format!("{}-", objects::POOL);
            let victim = machines
                .list(&Default::default())
                .await?
                .items
                .into_iter()
                .map(|m| m.name_any())
                .find(|name| name.starts_with(&prefix))
                .unwrap_or_default();
            let forged = json!({"status": {"addresses": [
                {"type": "InternalIP", "address": "203.0.113.66"}]}});
            Api::<LibvirtMachine>::namespaced(client, SYSTEM_NAMESPACE)
                .patch_status(
                    &victim,
                    &kube::api::PatchParams::default(),
                    &kube::api::Patch::Merge(&forged),
                )
                .await
                .map(|_| ())
        }
    }
}

/// Makes `write` with `client`: its target is found (or, for alice's claim, made) with
/// `alice` and `admin` first. The outer error is the test's own; the inner one the write's.
async fn write_as(
    client: Client,
    alice: Client,
    admin: &Client,
    write: &Write,
) -> Result<Result<(), kube::Error>, BoxError> {
    use kube::api::{Patch, PatchParams};
    let dry_run = PatchParams {
        dry_run: true,
        ..PatchParams::default()
    };
    let warm_member = || async {
        let vms: Api<VirtualMachine> = Api::namespaced(admin.clone(), SYSTEM_NAMESPACE);
        let selector = format!("{}={}", names::LABEL_POOL, objects::POOL);
        poll::until(
            "a warm member of the good pool with its machine",
            DEADLINE,
            || async {
                let listed = vms.list(&ListParams::default().labels(&selector)).await?;
                let machines: Api<LibvirtMachine> =
                    Api::namespaced(admin.clone(), SYSTEM_NAMESPACE);
                for vm in listed.items {
                    let name = vm.name_any();
                    if machines.get_opt(&name).await?.is_some() {
                        return Ok(Some(name));
                    }
                }
                Ok(None)
            },
        )
        .await
    };
    // alice's claim on a pool that does not exist: Pending, holding its finalizer, binding
    // nothing, so the rows cost no member.
    let alices_claim = || async {
        let claims: Api<VirtualMachineClaim> = Api::namespaced(alice.clone(), SYSTEM_NAMESPACE);
        let mut claim = objects::claim();
        claim.metadata.name = Some("alices-pending-claim".to_owned());
        claim.spec.pool_ref.name = NO_POOL.to_owned();
        if claims.get_opt("alices-pending-claim").await?.is_none() {
            claims.create(&PostParams::default(), &claim).await?;
        }
        poll::until(
            "alice's pending claim to hold its finalizer",
            DEADLINE,
            || async {
                let claim = claims.get("alices-pending-claim").await?;
                Ok(claim
                    .metadata
                    .finalizers
                    .unwrap_or_default()
                    .iter()
                    .any(|f| f == names::FINALIZER_CLAIM_PROTECTION)
                    .then_some(()))
            },
        )
        .await?;
        Ok::<_, BoxError>("alices-pending-claim")
    };
    let merge = |patch: &Value| Patch::Merge(patch.clone());
    Ok(match write {
        Write::PatchAWarmMember(patch) => {
            let name = warm_member().await?;
            Api::<VirtualMachine>::namespaced(client, SYSTEM_NAMESPACE)
                .patch(&name, &dry_run, &merge(patch))
                .await
                .map(|_| ())
        }
        Write::PatchAWarmMembersMachine(patch) => {
            let name = warm_member().await?;
            Api::<LibvirtMachine>::namespaced(client, SYSTEM_NAMESPACE)
                .patch(&name, &dry_run, &merge(patch))
                .await
                .map(|_| ())
        }
        Write::CreateAMachine => {
            let name = warm_member().await?;
            let good = Api::<LibvirtMachine>::namespaced(admin.clone(), SYSTEM_NAMESPACE)
                .get(&name)
                .await?;
            let direct = LibvirtMachine::new("written-directly", good.spec);
            let params = PostParams {
                dry_run: true,
                ..PostParams::default()
            };
            Api::<LibvirtMachine>::namespaced(client, SYSTEM_NAMESPACE)
                .create(&params, &direct)
                .await
                .map(|_| ())
        }
        Write::DeleteAlicesClaim => {
            let name = alices_claim().await?;
            let params = DeleteParams {
                dry_run: true,
                ..DeleteParams::default()
            };
            Api::<VirtualMachineClaim>::namespaced(client, SYSTEM_NAMESPACE)
                .delete(name, &params)
                .await
                .map(|_| ())
        }
        Write::PatchAlicesClaim(patch) => {
            let name = alices_claim().await?;
            Api::<VirtualMachineClaim>::namespaced(client, SYSTEM_NAMESPACE)
                .patch(name, &dry_run, &merge(patch))
                .await
                .map(|_| ())
        }
        Write::PatchAlicesClaimStatus(patch) => {
            let name = alices_claim().await?;
            Api::<VirtualMachineClaim>::namespaced(client, SYSTEM_NAMESPACE)
                .patch_status(name, &dry_run, &merge(patch))
                .await
                .map(|_| ())
        }
    })
}

/// An API for any kind by its `apiVersion` and `kind`, in the object's namespace, or
/// cluster-wide when it names none.
fn any_api(client: Client, object: &Value) -> Api<DynamicObject> {
    let api_version = object["apiVersion"].as_str().unwrap_or_default();
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    let kind = object["kind"].as_str().unwrap_or_default();
    let gvk = kube::api::GroupVersionKind::gvk(group, version, kind);
    let resource = ApiResource::from_gvk(&gvk);
    match object["metadata"]["namespace"].as_str() {
        Some(namespace) => Api::namespaced_with(client, namespace, &resource),
        None => Api::all_with(client, &resource),
    }
}

/// A fresh claim by alice on the good pool reaches Bound, and the good Provider is still
/// Ready; the claim is then released (deleted) and the pool refills behind it.
async fn still_binds(
    control_plane: &ControlPlane,
    admin: &Client,
    shutdown: &CancellationToken,
    checks: &mut usize,
    after: &str,
) -> Result<(), BoxError> {
    if shutdown.is_cancelled() {
        return Err(
            format!("after {after}: a role of the controller or the good Provider died").into(),
        );
    }
    *checks += 1;
    let name = format!("still-binds-{checks}");
    let alice = control_plane.client_as(objects::CLAIMANT).await?;
    let claims: Api<VirtualMachineClaim> = Api::namespaced(alice, SYSTEM_NAMESPACE);
    let mut claim = objects::claim();
    claim.metadata.name = Some(name.clone());
    claims.create(&PostParams::default(), &claim).await?;
    let bound = poll::until(
        &format!("claim {name} to be Bound after {after}"),
        DEADLINE,
        || async {
            let claim = claims.get(&name).await?;
            let status = claim.status.unwrap_or_default();
            Ok((status.phase == Some(banlieue_api::ClaimPhase::Bound)).then_some(status))
        },
    )
    .await;
    let bound = bound.map_err(|e| format!("after {after}: {e}"))?;
    if bound.virtual_machine_ref.is_none() {
        return Err(format!("after {after}: claim {name} is Bound to nothing").into());
    }
    let providers: Api<Provider> = Api::namespaced(admin.clone(), SYSTEM_NAMESPACE);
    let good = providers.get(objects::PROVIDER).await?;
    let conditions = good.status.map(|s| s.conditions).unwrap_or_default();
    if !banlieue_api::conditions::is_true(&conditions, "Ready") {
        return Err(format!(
            "after {after}: the good Provider is not Ready: {:?}",
            banlieue_api::conditions::find(&conditions, "Ready")
        )
        .into());
    }
    claims.delete(&name, &DeleteParams::default()).await?;
    Ok(())
}

/// The good Provider's twin, under another name, at `endpoint`, trusting `ca_configmap`. It
/// declares a storage class no pool asks for, so a hostile Provider that does become Ready is
/// never chosen for a member.
fn hostile_provider(name: &str, endpoint: &str, ca_configmap: &str) -> Provider {
    let mut provider = objects::provider(endpoint);
    provider.metadata.name = Some(name.to_owned());
    if let Some(source) = provider.spec.connection.ca_bundle.config_map_ref.as_mut() {
        source.name = ca_configmap.to_owned();
    }
    provider.spec.capabilities.storage_classes[0].name = "hostile-only".into();
    provider.spec.capabilities.network_classes.clear();
    provider
}

fn dynamic_api(client: Client, object: &Value) -> Result<Api<DynamicObject>, BoxError> {
    let kind = object["kind"].as_str().unwrap_or_default();
    let resource = match kind {
        "VirtualMachineClaim" => ApiResource::erase::<VirtualMachineClaim>(&()),
        "VirtualMachinePool" => ApiResource::erase::<VirtualMachinePool>(&()),
        "VMClass" => ApiResource::erase::<VMClass>(&()),
        "VirtualMachine" => ApiResource::erase::<banlieue_api::VirtualMachine>(&()),
        "VMImage" => ApiResource::erase::<VMImage>(&()),
        other => return Err(format!("no API for kind {other:?}").into()),
    };
    Ok(Api::namespaced_with(client, SYSTEM_NAMESPACE, &resource))
}

// ---------------------------------------------------------------------------------------------
// Hostile libvirt hosts.

/// What a hostile host does once the TLS handshake is done.
#[derive(Clone, Copy, Debug)]
enum Behaviour {
    /// Sends this byte where libvirtd sends its confirmation 0x01, then holds the connection.
    Confirm(u8),
    /// Closes the connection.
    Close,
}

struct HostileHosts {
    ca_pem: String,
    /// Presents a certificate for `localhost` only, at an IP address.
    no_ip_san: Host,
    zero_confirmation: Host,
    closes: Host,
}

impl HostileHosts {
    async fn start() -> HostileHosts {
        let ca_key = KeyPair::generate().expect("CA key");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params
            .distinguished_name
            .push(DnType::CommonName, "hostile libvirt hosts");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let ca_pem = params.self_signed(&ca_key).expect("self-signed CA").pem();
        let ca = Issuer::new(params, ca_key);
        let localhost = || SanType::DnsName("localhost".try_into().expect("DNS name"));
        let ip = || SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST));
        HostileHosts {
            no_ip_san: Host::start(server_config(&ca, vec![localhost()]), Behaviour::Close).await,
            zero_confirmation: Host::start(
                server_config(&ca, vec![ip(), localhost()]),
                Behaviour::Confirm(0),
            )
            .await,
            closes: Host::start(
                server_config(&ca, vec![ip(), localhost()]),
                Behaviour::Close,
            )
            .await,
            ca_pem,
        }
    }
}

/// A server configuration presenting a certificate of `ca` for `sans`. It asks for no client
/// certificate: a hostile host takes whatever the provider presents.
fn server_config(ca: &Issuer<'static, KeyPair>, sans: Vec<SanType>) -> Arc<rustls::ServerConfig> {
    let key = KeyPair::generate().expect("server key");
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("server params");
    params
        .distinguished_name
        .push(DnType::CommonName, "hostile libvirt host");
    params.subject_alt_names = sans;
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let cert = params
        .signed_by(&key, ca)
        .expect("signed server certificate");
    let chain = vec![CertificateDer::from_pem_slice(cert.pem().as_bytes()).expect("cert PEM")];
    let key =
        PrivateKeyDer::from_pem_slice(key.serialize_pem().as_bytes()).expect("server key PEM");
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("protocol versions")
    .with_no_client_auth()
    .with_single_cert(chain, key)
    .expect("server config");
    Arc::new(config)
}

/// A hostile host listening on 127.0.0.1; it stops when dropped.
struct Host {
    port: u16,
    task: JoinHandle<()>,
}

impl Drop for Host {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Host {
    async fn start(config: Arc<rustls::ServerConfig>, behaviour: Behaviour) -> Host {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("address").port();
        let acceptor = tokio_rustls::TlsAcceptor::from(config);
        let task = tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    // A client that refuses the certificate ends here, as it should.
                    let Ok(mut tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    match behaviour {
                        Behaviour::Close => drop(tls),
                        Behaviour::Confirm(byte) => {
                            let _ = tls.write_all(&[byte]).await;
                            let _ = tls.flush().await;
                            let _ = tls.read(&mut [0u8; 1]).await;
                        }
                    }
                });
            }
        });
        Host { port, task }
    }

    fn uri(&self) -> String {
        format!("qemu+tls://127.0.0.1:{}/system", self.port)
    }
}

//! VirtualMachinePool (warm, unclaimed capacity) and VirtualMachineClaim (one member, for one
//! identity, once).

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::common::{LocalObjectReference, MachineAddress, Standby};
use crate::conditions::Condition;
use crate::machine::VirtualMachineSpec;

/// The desired state of a VirtualMachinePool.
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "banlieue.io",
    version = "v1alpha1",
    kind = "VirtualMachinePool",
    doc = "Keeps `replicas` unclaimed, warm VirtualMachines. Members leave only through a claim.",
    namespaced,
    status = "VirtualMachinePoolStatus",
    shortname = "bvmpool",
    category = "banlieue",
    scale = r#"{"specReplicasPath":".spec.replicas","statusReplicasPath":".status.replicas","labelSelectorPath":".status.selector"}"#,
    printcolumn = r#"{"name":"Desired","type":"integer","jsonPath":".spec.replicas"}"#,
    printcolumn = r#"{"name":"Available","type":"integer","jsonPath":".status.availableReplicas"}"#,
    printcolumn = r#"{"name":"Claimed","type":"integer","jsonPath":".status.claimedReplicas"}"#,
    printcolumn = r#"{"name":"Readiness","type":"string","jsonPath":".spec.readiness"}"#,
    printcolumn = r#"{"name":"Reason","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].reason"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachinePoolSpec {
    /// Number of unclaimed members to keep. Claimed members do not count.
    #[schemars(range(min = 0, max = 10000))]
    pub replicas: i32,
    /// The VirtualMachine every member is created from.
    pub template: VirtualMachineTemplate,
    /// When a member counts as available to claims (ADR-0043).
    #[serde(default)]
    pub readiness: PoolReadiness,
    /// An unclaimed member available for longer than this is replaced, oldest first. Unset:
    /// members never go stale.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_idle_seconds: Option<i64>,
    /// How unclaimed members of an older revision are replaced. Stated explicitly, no default.
    pub update_strategy: PoolUpdateStrategy,
    /// A member not available this long after its creation failed to start: it is deleted and
    /// replaced, the pool reports `Degraded` (`StartupDeadlineExceeded`, naming it), and each
    /// further consecutive failure doubles the wait before the next create (10 s to 5 min).
    /// Unset: members may take as long as they take.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub startup_deadline_seconds: Option<i64>,
    /// The most members being built at once (created and not available yet): a burst of claims
    /// refills at this pace instead of asking the hosts for every replacement at once. Unset:
    /// no cap.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_provisioning: Option<i32>,
    /// How unclaimed members wait: `Running` (the default) or `Saved`, paused to disk once
    /// they reach the pool's readiness and resumed when a claim binds one (ADR-0073). Copied
    /// into each member's `spec.standby`; changing it is a new revision.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub standby: Option<Standby>,
    /// Who may claim from this pool: a claim must name one of `subjects`, or be created by a
    /// member of one of `groups` (Kubernetes groups of the claim's creator; a broker's groups
    /// are its own, not its subject's, so a broker's claim must name a listed subject).
    /// Checked by `deploy/admission/pool-claimants.yaml` when the claim is created. Unset:
    /// whoever RBAC lets create claims in the namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claimants: Option<PoolClaimants>,
    /// The most claims one subject (issuer and id) holds of this pool at once: a further claim
    /// stays Pending (`Bound=False`, `SubjectLimitReached`) until one of the subject's earlier
    /// claims is released, first created first served. Unset: no cap.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 10000))]
    pub max_claims_per_subject: Option<i32>,
}

/// Who may claim from a pool (`spec.claimants`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PoolClaimants {
    /// Subjects who may claim, by issuer and id, as a claim names them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 256))]
    pub subjects: Vec<ClaimSubject>,
    /// Kubernetes groups whose members may claim for themselves.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64), inner(length(min = 1, max = 253)))]
    pub groups: Vec<String>,
}

/// Template of pool members.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct VirtualMachineTemplate {
    /// Labels and annotations copied onto each member.
    #[serde(default)]
    pub metadata: TemplateMetadata,
    /// The member's VirtualMachine spec. No `access`: a member holds no consumer's key
    /// before its bind, which writes the claim's.
    // These rules replace the spec type's own, so its rule is restated first.
    #[schemars(extend("x-kubernetes-validations" = [{
        "rule": "!(has(self.userData) && has(self.userDataSecretRef))",
        "message": "set at most one of userData and userDataSecretRef"
    }, {
        "rule": "!has(self.access)",
        "message": "a pool's template carries no access: a claim brings its subject's keys at the bind"
    }]))]
    pub spec: VirtualMachineSpec,
}

/// The parts of object metadata a template may set. Keys under `banlieue.io/` are banlieue's own
/// and refused: a template carrying `banlieue.io/claim` would make
/// every member look bound to a claim, so none could be claimed and the pool would create
/// replacements without end. (The rules test a prefix only: the API server bounds a rule's
/// estimated cost, and a test over the whole of an unbounded key would exceed it.)
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct TemplateMetadata {
    /// Labels copied onto members. None under `banlieue.io/`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("x-kubernetes-validations" = [{
        "rule": "self.all(k, !k.startsWith('banlieue.io/'))",
        "message": "labels under banlieue.io/ are reserved: banlieue writes them itself",
        "messageExpression": "'label ' + self.filter(k, k.startsWith('banlieue.io/'))[0] + ' is reserved: banlieue writes banlieue.io/ labels itself'"
    }]))]
    pub labels: BTreeMap<String, String>,
    /// Annotations copied onto members. None under `banlieue.io/`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("x-kubernetes-validations" = [{
        "rule": "self.all(k, !k.startsWith('banlieue.io/'))",
        "message": "annotations under banlieue.io/ are reserved: banlieue writes them itself",
        "messageExpression": "'annotation ' + self.filter(k, k.startsWith('banlieue.io/'))[0] + ' is reserved: banlieue writes banlieue.io/ annotations itself'"
    }]))]
    pub annotations: BTreeMap<String, String>,
}

/// What makes a member available.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum PoolReadiness {
    /// The member's machine is ready. Right for Immediate images.
    #[default]
    InfrastructureReady,
    /// The member published the `GuestReady` condition. Right for Deferred images, where the
    /// machine is ready as soon as the install starts.
    GuestReady,
}

/// Replacement of unclaimed members of older revisions. Claimed members are never touched.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PoolUpdateStrategy {
    /// Replace: create current-revision members, then delete old unclaimed ones.
    /// OnDelete: old members stay until they are claimed, expire or are deleted.
    #[serde(rename = "type")]
    pub type_: PoolUpdateType,
    /// How many members above `replicas` may exist while replacing. Defaults to 1.
    #[serde(default = "default_max_surge")]
    #[schemars(range(min = 1, max = 1000))]
    pub max_surge: i32,
}

fn default_max_surge() -> i32 {
    1
}

/// Update strategy kinds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum PoolUpdateType {
    Replace,
    OnDelete,
}

/// Observed state of a VirtualMachinePool.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachinePoolStatus {
    /// Unclaimed members, in any state.
    #[serde(default)]
    pub replicas: i32,
    /// Unclaimed members whose machine is ready.
    #[serde(default)]
    pub ready_replicas: i32,
    /// Unclaimed members a claim can take now.
    #[serde(default)]
    pub available_replicas: i32,
    /// Members bound to claims and still existing.
    #[serde(default)]
    pub claimed_replicas: i32,
    /// Hash of the template and image revision new members are created from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_revision: Option<String>,
    /// Label selector of unclaimed members, for the scale subresource.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<String>,
    /// Ready with reasons Filling, ReadinessSignalAbsent, AtCapacity.
    #[serde(default)]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    /// The generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// The largest `ttlSeconds` a claim may ask for: ten years. No sandbox lives that long, and the
/// bound keeps `boundAt + ttlSeconds` far from the end of representable time, where an
/// overflowing sum would otherwise read as "already expired".
pub const MAX_TTL_SECONDS: i64 = 10 * 365 * 24 * 60 * 60;

/// The desired state of a VirtualMachineClaim.
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "banlieue.io",
    version = "v1alpha1",
    kind = "VirtualMachineClaim",
    doc = "One pool member, for one subject, once. Release is deletion.",
    namespaced,
    status = "VirtualMachineClaimStatus",
    shortname = "vmclaim",
    category = "banlieue",
    printcolumn = r#"{"name":"Pool","type":"string","jsonPath":".spec.poolRef.name"}"#,
    printcolumn = r#"{"name":"VM","type":"string","jsonPath":".status.virtualMachineRef.name"}"#,
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Expires","type":"string","jsonPath":".status.expiresAt"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
// Everything but `handover` is immutable: the subject writes a new challenge whenever it
// verifies its VM (ADR-0077). Spelt field by field: CEL has no "equal but for one field".
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "self.poolRef == oldSelf.poolRef && self.subject == oldSelf.subject && self.ttlSeconds == oldSelf.ttlSeconds && has(self.access) == has(oldSelf.access) && (!has(self.access) || self.access == oldSelf.access)",
    "message": "spec is immutable but for spec.handover: a claim records who a sandbox was handed to"
}]))]
pub struct VirtualMachineClaimSpec {
    /// The pool (same namespace) to take a member from.
    pub pool_ref: LocalObjectReference,
    /// Who the member is for. An identifier, never a credential.
    pub subject: ClaimSubject,
    /// Deadline in seconds, counted from binding. Required: at expiry the member is deleted,
    /// then the claim. At most ten years: a larger number is a mistake, not a deadline.
    #[schemars(range(min = 1, max = MAX_TTL_SECONDS))]
    pub ttl_seconds: i64,
    /// The subject's public keys and login, installed in the member's guest after the bind
    /// (`AccessReady`). Omitted: the claim binds as before and nothing is installed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access: Option<crate::access::ClaimAccess>,
    /// The subject's challenge to its VM's TPM (ADR-0077), written after the bind by
    /// `banlieue claim verify`: the member's provider relays it into the guest and the answer
    /// appears in `status.attestation`. Only the claim's subject may write it (admission);
    /// a new challenge replaces the last.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub handover: Option<crate::handover::HandoverChallenge>,
}

/// The identity a member is handed to. Recorded and mirrored, never interpreted.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ClaimSubject {
    /// Who authenticated the subject (an OIDC issuer URL). Must be in the site's allowlist.
    #[schemars(length(min = 1, max = 2048))]
    pub issuer: String,
    /// The subject's id at that issuer (`sub` or `oid`). Must equal the creator's username
    /// unless the creator is a broker. Never a token, password or session key.
    #[schemars(length(min = 1, max = 1024))]
    pub id: String,
}

/// Observed state of a VirtualMachineClaim.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachineClaimStatus {
    /// Pending → Bound → Releasing → gone; Bound → Failed (terminal). Never backwards.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<ClaimPhase>,
    /// The bound member.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub virtual_machine_ref: Option<LocalObjectReference>,
    /// The member's addresses, mirrored as they change.
    #[serde(default)]
    pub addresses: Vec<MachineAddress>,
    /// When the member was bound.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bound_at: Option<Time>,
    /// The absolute deadline: boundAt + ttlSeconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<Time>,
    /// The member's vTPM endorsement-key certificates (PEM), the anchor for attesting it.
    #[serde(default)]
    pub tpm_endorsement_certificates: Vec<String>,
    /// `sha256:<hex>` of each certificate's public key (its DER SubjectPublicKeyInfo), in the
    /// order of `tpmEndorsementCertificates`: what SPIRE's TPM attestor keys an agent on.
    #[serde(default)]
    pub tpm_endorsement_key_digests: Vec<String>,
    /// The member's SSH host public keys (`TYPE BASE64`), as its guest published them: what
    /// `banlieue claim ssh` pins, so no host is trusted on first use.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ssh_host_keys: Vec<String>,
    /// The login `spec.access` was installed for (AccessReady).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub login_user: Option<String>,
    /// The member's attestation key and its TPM's answer to `spec.handover`, as relayed:
    /// proof only once the subject has checked it (`banlieue claim verify`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attestation: Option<crate::handover::Attestation>,
    /// Deprecated: no longer minted (ADR-0049, amended). Kept so older claims still parse;
    /// removed in the next API version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nonce: Option<String>,
    /// Bound, with reasons NoMemberAvailable, PoolNotFound, MemberDeleted, Expired.
    #[serde(default)]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
}

/// Claim phases.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(transform = crate::common::without_description)]
pub enum ClaimPhase {
    /// No Ready, unclaimed member yet. Retries without limit.
    Pending,
    /// A member is held.
    Bound,
    /// Deleted or expired; the member is being destroyed.
    Releasing,
    /// The bound member vanished. Terminal.
    Failed,
}

//! Condition types and reasons, in the guides' words, and the one rule for updating a condition
//! list.

pub use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

/// Condition types.
pub mod types {
    /// Provider, LibvirtMachine, VirtualMachine, VirtualMachinePool: the object does its job.
    pub const READY: &str = "Ready";
    /// VirtualMachine: a failure domain was chosen and the machine created.
    pub const SCHEDULED: &str = "Scheduled";
    /// VirtualMachine: the backend machine exists and runs.
    pub const INFRASTRUCTURE_READY: &str = "InfrastructureReady";
    /// VirtualMachine: the guest itself reported it is ready (ADR-0043).
    pub const GUEST_READY: &str = "GuestReady";
    /// LibvirtMachine: the domain's guest agent answers now. Informational: losing the agent
    /// after the guest reported `ready` does not take GuestReady back (the phase is final for
    /// the boot), and nothing already bound is touched.
    pub const AGENT_CONNECTED: &str = "AgentConnected";
    /// VirtualMachineClaim: a member is held.
    pub const BOUND: &str = "Bound";
    /// VirtualMachinePool: fewer available members than replicas.
    pub const FILLING: &str = "Filling";
    /// VirtualMachinePool: members keep failing to start (True), or started again (False).
    pub const DEGRADED: &str = "Degraded";
    /// LibvirtMachine, VSphereMachine, VirtualMachine: the machine is saved to disk (a managed
    /// save, a suspended VM) and holds no host memory (ADR-0073).
    pub const SAVED: &str = "Saved";
    /// VirtualMachineClaim of a `standby: Saved` pool: its member runs again (restored, the
    /// guest's clock set, its addresses read again). `status.addresses` is filled only then.
    pub const RESUMED: &str = "Resumed";
    /// VirtualMachineClaim with `spec.access`, its VirtualMachine and machine: the subject's
    /// keys are installed in the guest, for the login `status.loginUser` names.
    pub const ACCESS_READY: &str = "AccessReady";
}

/// Condition reasons. A reason is CamelCase and stable; the message carries the detail.
pub mod reasons {
    // Provider
    pub const CONNECTED: &str = "Connected";
    pub const CREDENTIALS_UNAVAILABLE: &str = "CredentialsUnavailable";
    pub const CONNECT_FAILED: &str = "ConnectFailed";
    pub const UNSUPPORTED_SCHEME: &str = "UnsupportedScheme";
    pub const CAPABILITIES_INCOMPLETE: &str = "CapabilitiesIncomplete";
    pub const PROVIDER_CLASS_NOT_FOUND: &str = "ProviderClassNotFound";
    /// The ClusterRole an administrator grants a ProviderClass's providers is missing or does
    /// not cover the class's `additionalRules`.
    pub const PROVIDER_CLASS_ROLE_MISSING: &str = "ProviderClassRoleMissing";
    /// The operator applied the workload; its first probe of the host has not reported yet.
    pub const WORKLOAD_STARTING: &str = "WorkloadStarting";
    /// A Provider being deleted still has LibvirtMachines; deletion waits for them.
    pub const MACHINES_REMAIN: &str = "MachinesRemain";

    // VirtualMachine scheduling
    pub const SCHEDULED: &str = "Scheduled";
    pub const IMAGE_NOT_READY: &str = "ImageNotReady";
    pub const CLASS_NOT_FOUND: &str = "ClassNotFound";
    pub const NO_PROVIDER_WITH_FEATURE: &str = "NoProviderWithFeature";
    pub const NO_MATCHING_FAILURE_DOMAIN: &str = "NoMatchingFailureDomain";
    pub const NO_BUILDER_FOR_CLASS: &str = "NoBuilderForClass";
    /// Every satisfying failure domain would pass its memory limit (the host's memory times
    /// the Provider's memoryOvercommitPercent) with this VirtualMachine.
    pub const INSUFFICIENT_CAPACITY: &str = "InsufficientCapacity";
    pub const MACHINE_READY: &str = "MachineReady";
    pub const MACHINE_NOT_READY: &str = "MachineNotReady";
    /// InfrastructureReady=False: the machine runs, but its class is tpmEnabled and the vTPM's
    /// endorsement-key certificates are not recorded yet (ADR-0045).
    pub const ENDORSEMENT_CERTIFICATES_PENDING: &str = "EndorsementCertificatesPending";
    pub const DELETING: &str = "Deleting";

    // Image zones
    pub const BUILD_PENDING: &str = "BuildPending";

    // LibvirtMachine
    pub const DOMAIN_RUNNING: &str = "DomainRunning";
    pub const PROVISIONING: &str = "Provisioning";
    pub const VOLUME_NOT_IN_POOL: &str = "VolumeNotInPool";
    pub const STORAGE_POOL_NOT_FOUND: &str = "StoragePoolNotFound";
    pub const NETWORK_NOT_FOUND: &str = "NetworkNotFound";
    pub const DOMAIN_NAME_TAKEN: &str = "DomainNameTaken";
    pub const PROVIDER_NOT_READY: &str = "ProviderNotReady";
    pub const TEARDOWN_FAILED: &str = "TeardownFailed";
    pub const LIBVIRT_ERROR: &str = "LibvirtError";
    /// Saved=True: the domain is saved (managed save) and waits for a claim.
    pub const DOMAIN_SAVED: &str = "DomainSaved";
    /// Saved=False: the domain runs.
    pub const DOMAIN_NOT_SAVED: &str = "DomainNotSaved";
    /// Ready=False: restoring the saved domain failed; its image was removed and the member
    /// is replaced (ADR-0073).
    pub const RESTORE_FAILED: &str = "RestoreFailed";
    /// VSphereMachine Saved=True (and Ready=True): the VM is suspended and waits for a claim
    /// (ADR-0073).
    pub const VM_SUSPENDED: &str = "VMSuspended";
    /// VSphereMachine Saved=False: the VM is powered on.
    pub const VM_NOT_SUSPENDED: &str = "VMNotSuspended";

    // LibvirtMachine GuestReady (ADR-0043, ADR-0045). Unknown: the guest said nothing yet;
    // False: it said "not yet" or "failed"; True: it said "ready".
    /// Unknown: the domain's qemu-guest-agent does not answer (booting, not installed, stopped).
    pub const AGENT_NOT_CONNECTED: &str = "AgentNotConnected";
    /// AgentConnected=True.
    pub const AGENT_CONNECTED: &str = "AgentConnected";
    /// Unknown: the agent answers but the guest has no phase file: no guest-phase layer.
    pub const GUEST_PHASE_ABSENT: &str = "GuestPhaseAbsent";
    /// False: the guest reports a phase other than `ready` (`configuring`, `installing`, …).
    pub const GUEST_PHASE_PENDING: &str = "GuestPhasePending";
    /// False: the guest reports `failed: <why>`.
    pub const GUEST_PHASE_FAILED: &str = "GuestPhaseFailed";
    /// False: a tpmEnabled guest reports `ready` but its EK certificates cannot be read.
    pub const ENDORSEMENT_CERTIFICATES_MISSING: &str = "EndorsementCertificatesMissing";
    /// True: the guest reports `ready` (with its EK certificates when tpmEnabled).
    pub const GUEST_PHASE_READY: &str = "GuestPhaseReady";

    // VirtualMachinePool
    pub const FILLING: &str = "Filling";
    pub const READINESS_SIGNAL_ABSENT: &str = "ReadinessSignalAbsent";
    pub const AT_CAPACITY: &str = "AtCapacity";
    /// Degraded=True: members were not available within `startupDeadlineSeconds`; they were
    /// replaced, and the next is created after a backoff.
    pub const STARTUP_DEADLINE_EXCEEDED: &str = "StartupDeadlineExceeded";
    /// Degraded=False: a member started since.
    pub const MEMBERS_STARTING: &str = "MembersStarting";
    /// Ready=False: `standby: Saved` on a backend that cannot save machines.
    pub const STANDBY_NOT_SUPPORTED: &str = "StandbyNotSupported";
    /// Scheduled=False: the class declares egress and the placed Provider's backend cannot
    /// enforce it.
    pub const EGRESS_NOT_ENFORCED: &str = "EgressNotEnforced";
    /// Ready=False on a machine: its egress filter could not be made or defined on the host,
    /// so its domain is not defined (no guest runs with more access than declared).
    pub const EGRESS_FILTER_FAILED: &str = "EgressFilterFailed";

    // VirtualMachineClaim
    pub const BOUND: &str = "Bound";
    pub const NO_MEMBER_AVAILABLE: &str = "NoMemberAvailable";
    pub const POOL_NOT_FOUND: &str = "PoolNotFound";
    /// Bound=False: the subject holds the pool's `maxClaimsPerSubject` claims already.
    pub const SUBJECT_LIMIT_REACHED: &str = "SubjectLimitReached";
    pub const MEMBER_DELETED: &str = "MemberDeleted";
    pub const EXPIRED: &str = "Expired";
    pub const RELEASING: &str = "Releasing";
    /// AccessReady=True: the guest installed the subject's keys.
    pub const ACCESS_INSTALLED: &str = "AccessInstalled";
    /// AccessReady=False: the keys are on their way (the guest not ready yet, its agent not
    /// answering, or its layer still installing them); retried.
    pub const ACCESS_PENDING: &str = "AccessPending";
    /// AccessReady=False: the guest's layer refused the keys or could not install them (its
    /// reason in the message); final for the claim, whose member is single-use.
    pub const ACCESS_REFUSED: &str = "AccessRefused";
    /// AccessReady=False: the member's backend does not deliver access.
    pub const ACCESS_NOT_SUPPORTED: &str = "AccessNotSupported";
    /// Resumed=False: the bound member is saved, or its provider has not yet restored it.
    pub const RESUMING: &str = "Resuming";
    /// Resumed=True.
    pub const RESUMED: &str = "Resumed";
}

/// Condition status values.
pub mod status {
    pub const TRUE: &str = "True";
    pub const FALSE: &str = "False";
    pub const UNKNOWN: &str = "Unknown";
}

/// The condition of `type_` in `conditions`, if any.
pub fn find<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

/// Whether `conditions` holds `type_` with status True.
pub fn is_true(conditions: &[Condition], type_: &str) -> bool {
    find(conditions, type_).is_some_and(|c| c.status == status::TRUE)
}

/// A condition ready to be set with [`set`]; `last_transition_time` is filled by `set`. The
/// message is bounded by [`bounded_message`] to [`MAX_MESSAGE_BYTES`].
pub fn new(
    type_: &str,
    status: &str,
    reason: &str,
    message: impl Into<String>,
    observed_generation: Option<i64>,
) -> Condition {
    Condition {
        type_: type_.to_owned(),
        status: status.to_owned(),
        reason: reason.to_owned(),
        message: bounded_message(message, MAX_MESSAGE_BYTES),
        observed_generation,
        last_transition_time: Time(Default::default()),
    }
}

/// Sets `condition` in `conditions`, replacing one of the same type. The transition time moves
/// only when the status changes, so "since when" stays meaningful across re-reconciles.
/// Returns whether anything changed.
pub fn set(conditions: &mut Vec<Condition>, mut condition: Condition, now: Time) -> bool {
    match conditions.iter_mut().find(|c| c.type_ == condition.type_) {
        Some(existing) => {
            condition.last_transition_time = if existing.status == condition.status {
                existing.last_transition_time.clone()
            } else {
                now
            };
            let changed = *existing != condition;
            *existing = condition;
            changed
        }
        None => {
            condition.last_transition_time = now;
            conditions.push(condition);
            true
        }
    }
}

/// The most bytes a condition message keeps. A libvirt error can carry megabytes of text, and a
/// status write that large is refused (or bloats every watcher's cache), which would leave the
/// condition stuck at its previous, wrong message; a few KiB hold every useful diagnosis.
pub const MAX_MESSAGE_BYTES: usize = 4096;

/// The most bytes an Event's note keeps: the API server refuses an events.k8s.io/v1 Event whose
/// note is longer than 1 KiB.
pub const MAX_EVENT_NOTE_BYTES: usize = 1024;

/// What ends a message that [`bounded_message`] cut, so a reader knows the text goes on.
pub const TRUNCATION_MARKER: &str = " …[truncated]";

/// `message` cut to at most `max_bytes` bytes, on a character boundary, ending in
/// [`TRUNCATION_MARKER`] when anything was cut; unchanged when it fits. Every condition message
/// and Event note goes through this, whatever produced the text.
pub fn bounded_message(message: impl Into<String>, max_bytes: usize) -> String {
    let mut message = message.into();
    if message.len() <= max_bytes {
        return message;
    }
    let mut keep = max_bytes.saturating_sub(TRUNCATION_MARKER.len());
    while !message.is_char_boundary(keep) {
        keep -= 1;
    }
    message.truncate(keep);
    if TRUNCATION_MARKER.len() <= max_bytes {
        message.push_str(TRUNCATION_MARKER);
    }
    message
}

/// An error and its sources on one line, for condition messages and logs: the underlying cause
/// is what an operator acts on. A source whose text the line already holds (an error that
/// prints its cause itself) is not repeated, and line breaks become spaces.
pub fn error_message(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text.replace(['\r', '\n'], " ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: i64) -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(secs).unwrap())
    }

    #[test]
    fn transition_time_moves_only_on_status_change() {
        let mut list = Vec::new();
        assert!(set(
            &mut list,
            new("Ready", "False", "X", "a", Some(1)),
            at(10)
        ));
        assert!(set(
            &mut list,
            new("Ready", "False", "Y", "b", Some(2)),
            at(20)
        ));
        assert_eq!(list[0].last_transition_time, at(10));
        assert_eq!(list[0].reason, "Y");
        assert!(!set(
            &mut list,
            new("Ready", "False", "Y", "b", Some(2)),
            at(30)
        ));
        assert!(set(
            &mut list,
            new("Ready", "True", "Z", "", Some(2)),
            at(40)
        ));
        assert_eq!(list[0].last_transition_time, at(40));
        assert_eq!(list.len(), 1);
        assert!(is_true(&list, "Ready"));
        assert!(!is_true(&list, "Scheduled"));
    }

    #[test]
    fn a_megabytes_long_libvirt_error_is_cut_to_the_bound() {
        let huge = "x".repeat(4 << 20);
        let message = bounded_message(huge, MAX_MESSAGE_BYTES);
        assert_eq!(message.len(), MAX_MESSAGE_BYTES);
        assert!(message.ends_with(TRUNCATION_MARKER));
        let condition = new("Ready", "False", "LibvirtError", "y".repeat(1 << 20), None);
        assert!(condition.message.len() <= MAX_MESSAGE_BYTES);
        assert!(condition.message.ends_with(TRUNCATION_MARKER));
    }

    #[test]
    fn a_multibyte_character_at_the_bound_is_not_split() {
        for max in TRUNCATION_MARKER.len()..40 {
            for lead in 0..4 {
                let text = format!("{}{}", "a".repeat(lead), "é€😀".repeat(20));
                let message = bounded_message(text.clone(), max);
                assert!(message.len() <= max, "{max}: {message}");
                assert!(message.ends_with(TRUNCATION_MARKER), "{max}: {message}");
                let kept = message.strip_suffix(TRUNCATION_MARKER).unwrap();
                assert!(text.starts_with(kept));
            }
        }
        // A bound smaller than the marker still holds, and does not panic.
        assert!(bounded_message("ééééé", 3).len() <= 3);
    }

    #[test]
    fn a_message_that_fits_is_kept_whole() {
        assert_eq!(bounded_message("short", 5), "short");
        assert_eq!(bounded_message("", 0), "");
    }

    #[derive(Debug, thiserror::Error)]
    enum Layer {
        #[error("connect to qemu+tls://h/system")]
        Connect(#[source] Box<Layer>),
        #[error("TLS handshake: {0}")]
        SaysItsCause(#[source] Box<Layer>),
        #[error("certificate expired\non line two")]
        Leaf,
    }

    #[test]
    fn error_message_joins_sources_once_on_one_line() {
        let error = Layer::Connect(Box::new(Layer::SaysItsCause(Box::new(Layer::Leaf))));
        assert_eq!(
            error_message(&error),
            "connect to qemu+tls://h/system: TLS handshake: certificate expired on line two"
        );
        assert_eq!(
            error_message(&Layer::Leaf),
            "certificate expired on line two"
        );
    }
}

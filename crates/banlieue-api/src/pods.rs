//! The security settings of the pods banlieue creates (import and build Jobs): a fixed
//! non-root user, the runtime's default seccomp profile, no privilege escalation, a read-only
//! root file system and no capability. Both Jobs run the `banlieue` binary itself, which needs
//! nothing more.

use k8s_openapi::api::core::v1::{
    Capabilities, PodSecurityContext, SeccompProfile, SecurityContext,
};

/// The distroless `nonroot` user the image defines, owner of nothing on the node.
pub const NONROOT_UID: i64 = 65532;

/// The pod's security context: non-root as [`NONROOT_UID`], RuntimeDefault seccomp, and
/// `fs_group` for the volumes that honour it.
pub fn restricted_pod(fs_group: Option<i64>) -> PodSecurityContext {
    PodSecurityContext {
        run_as_non_root: Some(true),
        run_as_user: Some(NONROOT_UID),
        run_as_group: Some(NONROOT_UID),
        fs_group,
        seccomp_profile: Some(SeccompProfile {
            type_: "RuntimeDefault".into(),
            ..SeccompProfile::default()
        }),
        ..PodSecurityContext::default()
    }
}

/// The container's security context: no escalation, a read-only root, no capability.
pub fn restricted_container() -> SecurityContext {
    SecurityContext {
        allow_privilege_escalation: Some(false),
        read_only_root_filesystem: Some(true),
        run_as_non_root: Some(true),
        capabilities: Some(Capabilities {
            drop: Some(vec!["ALL".into()]),
            ..Capabilities::default()
        }),
        ..SecurityContext::default()
    }
}

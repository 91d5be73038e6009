//! The Kubernetes releases banlieue supports, and the check `banlieue bootstrap` makes against
//! the cluster's `/version` before it applies anything.
//!
//! The window is the four newest minors at the time of writing. Every API the product needs is
//! served by the oldest of them, or has a path without it: `deploy/claim-protection.yaml`, a
//! MutatingAdmissionPolicy at `admissionregistration.k8s.io/v1` (GA in v1.36), is an
//! optimisation that bootstrap skips where it is not served, and the controller adds the claim
//! finalizer itself (ADR-0072).

use k8s_openapi::apimachinery::pkg::version::Info;

/// The oldest supported minor of Kubernetes 1.
pub const OLDEST_MINOR: u32 = 34;
/// The newest minor at the time of writing, which the tests' control plane runs.
pub const NEWEST_MINOR: u32 = 37;

/// Why a cluster is not supported.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Unsupported {
    #[error(
        "this cluster runs Kubernetes v{major}.{minor}; banlieue needs v1.{OLDEST_MINOR} or newer \
         (it supports v1.{OLDEST_MINOR} to v1.{NEWEST_MINOR})"
    )]
    TooOld { major: u32, minor: u32 },
    #[error("the cluster's version {0:?} is not one of Kubernetes 1")]
    Unreadable(String),
}

/// The cluster's major and minor version. Managed clusters write the minor with a suffix
/// (`"34+"`), which is ignored.
pub fn version_of(info: &Info) -> Result<(u32, u32), Unsupported> {
    let number = |s: &str| -> Option<u32> {
        let digits: String = s.chars().take_while(char::is_ascii_digit).collect();
        digits.parse().ok()
    };
    match (number(&info.major), number(&info.minor)) {
        (Some(major), Some(minor)) => Ok((major, minor)),
        _ => Err(Unsupported::Unreadable(info.git_version.clone())),
    }
}

/// Whether banlieue supports the cluster that answered `info`. Newer minors than the newest
/// tested are accepted: Kubernetes keeps the APIs banlieue uses for the releases after it.
pub fn check(info: &Info) -> Result<(u32, u32), Unsupported> {
    match version_of(info)? {
        (1, minor) if minor >= OLDEST_MINOR => Ok((1, minor)),
        (1, minor) => Err(Unsupported::TooOld { major: 1, minor }),
        _ => Err(Unsupported::Unreadable(info.git_version.clone())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(major: &str, minor: &str) -> Info {
        Info {
            major: major.into(),
            minor: minor.into(),
            git_version: format!("v{major}.{minor}.0"),
            ..Info::default()
        }
    }

    #[test]
    fn the_window_starts_at_the_oldest_minor_and_later_ones_pass() {
        assert_eq!(check(&info("1", "34")), Ok((1, 34)));
        assert_eq!(check(&info("1", "37")), Ok((1, 37)));
        assert_eq!(check(&info("1", "40")), Ok((1, 40)));
        assert_eq!(
            check(&info("1", "33")),
            Err(Unsupported::TooOld {
                major: 1,
                minor: 33
            })
        );
    }

    #[test]
    fn a_managed_clusters_suffix_is_ignored_and_nonsense_is_refused() {
        assert_eq!(check(&info("1", "35+")), Ok((1, 35)));
        assert!(matches!(
            check(&info("1", "33+")),
            Err(Unsupported::TooOld { minor: 33, .. })
        ));
        assert!(matches!(
            check(&info("", "")),
            Err(Unsupported::Unreadable(_))
        ));
        assert!(matches!(
            check(&info("2", "0")),
            Err(Unsupported::Unreadable(_))
        ));
    }

    #[test]
    fn the_message_names_the_found_and_the_supported_versions() {
        let message = check(&info("1", "31")).unwrap_err().to_string();
        assert_eq!(
            message,
            "this cluster runs Kubernetes v1.31; banlieue needs v1.34 or newer \
             (it supports v1.34 to v1.37)"
        );
    }
}

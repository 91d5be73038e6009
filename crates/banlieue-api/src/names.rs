//! Names the guides fix: labels, annotations, finalizers, and the names derived for libvirt
//! objects and import Jobs.

use sha2::{Digest, Sha256};

/// The API group.
pub const GROUP: &str = "banlieue.io";
/// The API version.
pub const VERSION: &str = "v1alpha1";
/// `group/version`, as in `apiVersion`.
pub const API_VERSION: &str = "banlieue.io/v1alpha1";

/// Namespace the controller and the examples use.
pub const SYSTEM_NAMESPACE: &str = "banlieue-system";
/// Namespace where import Jobs run next to the artifacts PVC (ADR-0016).
pub const DEFAULT_BUILD_NAMESPACE: &str = "banlieue-imagebuild";
/// The ServiceAccount import Jobs run as in the build namespace when the ProviderClass names
/// none. The operator creates it; it is never the namespace's `default` account (ADR-0063).
pub const DEFAULT_IMPORT_SERVICE_ACCOUNT: &str = "banlieue-import";

/// Label on a pool member naming its pool. Removed at bind: a bound member belongs to its claim.
pub const LABEL_POOL: &str = "banlieue.io/pool";
/// Label on a pool member carrying the pool revision it was created from.
pub const LABEL_POOL_REVISION: &str = "banlieue.io/pool-revision";
/// Label on a bound member naming its claim.
pub const LABEL_CLAIM: &str = "banlieue.io/claim";
/// Label on import Jobs naming their VMImage.
pub const LABEL_VMIMAGE: &str = "banlieue.io/vmimage";
/// Label on per-Provider workloads naming their Provider.
pub const LABEL_PROVIDER: &str = "banlieue.io/provider";
/// Label on objects banlieue manages.
pub const LABEL_MANAGED_BY: &str = "app.kubernetes.io/managed-by";

/// Annotation on a bound member: the claim subject's issuer, copied verbatim.
pub const ANNOTATION_SUBJECT_ISSUER: &str = "banlieue.io/subject-issuer";
/// Annotation on a bound member: the claim subject's id, copied verbatim.
pub const ANNOTATION_SUBJECT_ID: &str = "banlieue.io/subject-id";
/// Annotation on a bound member: when it was bound (RFC 3339).
pub const ANNOTATION_BOUND_AT: &str = "banlieue.io/bound-at";

/// Finalizer a claim holds until its member is gone from the API server.
pub const FINALIZER_CLAIM_PROTECTION: &str = "banlieue.io/claim-protection";
/// Finalizer a VirtualMachine holds until its machine is gone.
pub const FINALIZER_MACHINE_PROTECTION: &str = "banlieue.io/machine-protection";
/// Finalizer a LibvirtMachine holds until its domain and volumes are gone.
pub const FINALIZER_DOMAIN_PROTECTION: &str = "banlieue.io/domain-protection";

/// Kubernetes object names (DNS-1123 labels) are at most this long.
pub const MAX_NAME_LEN: usize = 63;

/// The libvirt domain of a machine: `<namespace>-<name>`, because a libvirt host has one flat
/// domain namespace and DOMAIN_DEFINE_XML is an upsert.
pub fn domain_name(namespace: &str, name: &str) -> String {
    format!("{namespace}-{name}")
}

/// The machine's OS disk volume.
pub fn os_volume_name(domain: &str) -> String {
    format!("{domain}-os.qcow2")
}

/// The machine's cloud-init seed volume.
pub fn cidata_volume_name(domain: &str) -> String {
    format!("{domain}-cidata.iso")
}

/// The import Job of one image on one pool of one provider: `import-<image>-<provider>-<pool>`,
/// shortened to 63 characters with a hash of the full name when longer, so distinct triples
/// keep distinct names.
pub fn import_job_name(image: &str, provider: &str, pool: &str) -> String {
    shorten(&format!("import-{image}-{provider}-{pool}"))
}

/// `name` if it fits in [`MAX_NAME_LEN`], otherwise a prefix and 10 hex digits of its SHA-256.
/// The prefix never ends in `-` or `.`, so the result stays a valid DNS-1123 label.
pub fn shorten(name: &str) -> String {
    if name.len() <= MAX_NAME_LEN {
        return name.to_owned();
    }
    let digest = Sha256::digest(name.as_bytes());
    let hash: String = digest[..5].iter().map(|b| format!("{b:02x}")).collect();
    let keep = MAX_NAME_LEN - hash.len() - 1;
    let prefix = name[..keep].trim_end_matches(['-', '.']);
    format!("{prefix}-{hash}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_job_names_are_kept() {
        assert_eq!(
            import_job_name("ubuntu", "edge-7", "default"),
            "import-ubuntu-edge-7-default"
        );
    }

    #[test]
    fn long_job_names_are_shortened_distinctly() {
        let a = import_job_name(
            "kairos-ubuntu-2404-with-a-very-long-name",
            "libvirt-edge-host-7",
            "nvme-pool",
        );
        let b = import_job_name(
            "kairos-ubuntu-2404-with-a-very-long-name",
            "libvirt-edge-host-7",
            "nvme-pool2",
        );
        assert_eq!(a.len(), 63, "{a}");
        assert_eq!(b.len(), 63, "{b}");
        assert_ne!(a, b);
        assert!(a.starts_with("import-kairos-ubuntu-2404"));
        assert!(
            a.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        );
    }

    #[test]
    fn shortened_prefix_never_ends_in_a_dash() {
        // The cut falls right after a dash here.
        let name = format!("{}-{}", "a".repeat(51), "b".repeat(30));
        let short = shorten(&name);
        assert!(!short.contains("--"), "{short}");
        assert!(short.len() <= 63);
    }

    #[test]
    fn libvirt_names_follow_the_domain() {
        let d = domain_name("banlieue-system", "web-01");
        assert_eq!(d, "banlieue-system-web-01");
        assert_eq!(os_volume_name(&d), "banlieue-system-web-01-os.qcow2");
        assert_eq!(cidata_volume_name(&d), "banlieue-system-web-01-cidata.iso");
    }
}

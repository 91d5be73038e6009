//! Names the guides fix: labels, annotations, finalizers, a machine's backend object and import
//! Jobs. Names only one backend uses (libvirt's volumes) live in its provider crate (ADR-0070).

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

/// Annotation on a machine (of any kind) naming the failure domain it was scheduled into, so a
/// VirtualMachine that lost its status can adopt the machine without reading its kind's spec.
pub const ANNOTATION_FAILURE_DOMAIN: &str = "banlieue.io/failure-domain";

/// Finalizer a claim holds until its member is gone from the API server.
pub const FINALIZER_CLAIM_PROTECTION: &str = "banlieue.io/claim-protection";
/// Finalizer a VirtualMachine holds until its machine is gone.
pub const FINALIZER_MACHINE_PROTECTION: &str = "banlieue.io/machine-protection";
/// Finalizer a LibvirtMachine holds until its domain and volumes are gone.
pub const FINALIZER_DOMAIN_PROTECTION: &str = "banlieue.io/domain-protection";

/// Prefix of the label and annotation keys banlieue writes.
pub const RESERVED_KEY_PREFIX: &str = "banlieue.io/";

/// Whether a label or annotation key is banlieue's own (under [`RESERVED_KEY_PREFIX`]). Users may
/// not set these on what banlieue copies onto its objects (a pool template); the CRD refuses them
/// and the controller drops any that got past it.
pub fn is_reserved_key(key: &str) -> bool {
    key.starts_with(RESERVED_KEY_PREFIX)
}

/// Kubernetes object names (DNS-1123 labels) are at most this long.
pub const MAX_NAME_LEN: usize = 63;

/// The longest name of a VirtualMachine (and so of its machine, of any kind): with the longest
/// namespace, a libvirt machine's longest volume, `<namespace>-<name>-cidata.iso`, still fits
/// the 255 bytes a host's file system allows a file name (`banlieue_provider_libvirt::names`
/// checks it).
pub const MAX_MACHINE_NAME_LEN: usize = 180;

/// The backend's object of a machine (a libvirt domain, a vSphere VM): `<namespace>-<name>`,
/// because a host or a folder has one flat namespace of names and two Kubernetes namespaces may
/// each hold a `web-01` (on libvirt, DOMAIN_DEFINE_XML is an upsert that would replace the other).
pub fn domain_name(namespace: &str, name: &str) -> String {
    format!("{namespace}-{name}")
}

/// The import Job of one image on one pool of one provider: `import-<image>-<provider>-<pool>`,
/// shortened to 63 characters with a hash of the full name when longer, so distinct triples
/// keep distinct names.
pub fn import_job_name(image: &str, provider: &str, pool: &str) -> String {
    shorten(&format!("import-{image}-{provider}-{pool}"))
}

/// `name` itself if it is already a DNS-1123 subdomain of at most [`MAX_NAME_LEN`] characters;
/// otherwise a DNS-1123 label: a prefix of `name` with every character outside `[a-z0-9-]`
/// (after lower-casing ASCII) turned into `-`, then `-` and 10 hex digits of the SHA-256 of the
/// whole original `name`. The hash covers the original bytes, so two names that differ only in
/// what was replaced or cut still get distinct results (up to a 40-bit collision). The prefix
/// never starts or ends in `-`; when nothing of it survives the result is the hash alone.
///
/// Inputs reach this from user-chosen names (a libvirt storage pool may be named in any script),
/// so it works on characters, never on byte offsets that could split one.
pub fn shorten(name: &str) -> String {
    if name.len() <= MAX_NAME_LEN && is_dns_subdomain(name) {
        return name.to_owned();
    }
    let digest = Sha256::digest(name.as_bytes());
    let hash: String = digest[..5].iter().map(|b| format!("{b:02x}")).collect();
    let keep = MAX_NAME_LEN - hash.len() - 1;
    let sanitized: String = name
        .chars()
        .map(|c| match c.to_ascii_lowercase() {
            c @ ('a'..='z' | '0'..='9') => c,
            _ => '-',
        })
        .take(keep)
        .collect();
    let prefix = sanitized.trim_matches('-');
    if prefix.is_empty() {
        hash
    } else {
        format!("{prefix}-{hash}")
    }
}

/// Whether `name` is a DNS-1123 subdomain: dot-separated labels of `[a-z0-9-]` that start and
/// end alphanumeric.
fn is_dns_subdomain(name: &str) -> bool {
    !name.is_empty()
        && name.split('.').all(|label| {
            let bytes = label.as_bytes();
            !bytes.is_empty()
                && bytes
                    .iter()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
                && bytes[0] != b'-'
                && bytes[bytes.len() - 1] != b'-'
        })
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

    /// A DNS-1123 label: what every output of `shorten` that it changed must be.
    fn is_dns_label(name: &str) -> bool {
        !name.is_empty()
            && name.len() <= MAX_NAME_LEN
            && name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !name.starts_with('-')
            && !name.ends_with('-')
    }

    #[test]
    fn a_multibyte_character_across_the_cut_does_not_panic() {
        // 'é' is two bytes; at byte 52 (where the old code sliced) it straddles the cut.
        for lead in 40..60 {
            let name = format!("{}{}", "a".repeat(lead), "é".repeat(40));
            let short = shorten(&name);
            assert!(is_dns_label(&short), "{name} -> {short}");
        }
    }

    #[test]
    fn a_short_non_ascii_name_becomes_a_label() {
        let pool = "données";
        let short = import_job_name("ubuntu", "edge-7", pool);
        assert!(is_dns_label(&short), "{short}");
        assert!(short.starts_with("import-ubuntu-edge-7-donn"), "{short}");
        assert_ne!(short, import_job_name("ubuntu", "edge-7", "donnaes"));
    }

    #[test]
    fn names_that_differ_only_in_replaced_characters_stay_distinct() {
        let a = shorten("pool-ü");
        let b = shorten("pool-ö");
        assert_ne!(a, b);
        assert!(is_dns_label(&a) && is_dns_label(&b), "{a} {b}");
    }

    #[test]
    fn a_name_of_nothing_but_symbols_is_the_hash_alone() {
        let short = shorten("日本語のプール");
        assert_eq!(short.len(), 10, "{short}");
        assert!(is_dns_label(&short), "{short}");
    }

    #[test]
    fn valid_names_keep_their_existing_shortening() {
        // The shortening of a name that was already valid must not move: import Jobs and
        // provider workloads are found again by these names after an upgrade.
        let name = format!("{}-{}", "a".repeat(51), "b".repeat(30));
        let digest = Sha256::digest(name.as_bytes());
        let hash: String = digest[..5].iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(shorten(&name), format!("{}-{hash}", "a".repeat(51)));
        assert_eq!(shorten("web.example-1"), "web.example-1");
    }

    #[test]
    fn reserved_keys_are_those_banlieue_writes() {
        for key in [
            LABEL_CLAIM,
            LABEL_POOL,
            ANNOTATION_SUBJECT_ID,
            ANNOTATION_BOUND_AT,
        ] {
            assert!(is_reserved_key(key), "{key}");
        }
        for key in [
            "app",
            "example.com/banlieue.io",
            "notbanlieue.io/a",
            "banlieue.io",
        ] {
            assert!(!is_reserved_key(key), "{key}");
        }
    }
}

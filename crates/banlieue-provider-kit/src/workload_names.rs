//! The names of a Provider's workload objects, which the operator creates and the provider and
//! its import Jobs must find again (the import account, the Lease).

use banlieue_api::names;

/// The name of the Provider's namespaced objects: `banlieue-provider-<name>`.
pub fn workload_name(provider: &str) -> String {
    names::shorten(&format!("banlieue-provider-{provider}"))
}

/// The ClusterRole an administrator grants the Providers of `class` in the build namespace.
pub fn class_role_name(class: &str) -> String {
    names::shorten(&format!("banlieue-provider-class-{class}"))
}

/// The name of a Provider's objects outside its namespace (its RoleBinding in the build
/// namespace), where several namespaces meet. `<namespace>-<name>`
/// alone is ambiguous (`a-b`/`c` and `a`/`b-c` give the same), and the operator force-applies
/// and deletes these by name, so one Provider would take over and then delete the other's: a
/// digest of `<namespace>/<name>` (a `/` is in neither) makes the name unique.
pub fn outside_name(namespace: &str, provider: &str) -> String {
    names::shorten(&format!(
        "banlieue-provider-{namespace}-{provider}-{}",
        outside_hash(namespace, provider)
    ))
}

/// The ServiceAccount a Provider's import Jobs run as in the import namespace when its class
/// names none: `banlieue-import-<namespace>-<name>-<hash>`, unique per Provider for the reason
/// [`outside_name`] gives. `deploy/admission/workload-pins.yaml` lets a provider start Jobs as
/// the account that begins with this name's first 40 characters (CEL cannot compute the hash).
pub fn import_account_name(namespace: &str, provider: &str) -> String {
    names::shorten(&format!(
        "banlieue-import-{namespace}-{provider}-{}",
        outside_hash(namespace, provider)
    ))
}

/// 8 hex digits of the SHA-256 of `<namespace>/<name>` (a `/` is in neither).
fn outside_hash(namespace: &str, provider: &str) -> String {
    use sha2::{Digest, Sha256};
    let digest = Sha256::digest(format!("{namespace}/{provider}").as_bytes());
    digest[..4].iter().map(|b| format!("{b:02x}")).collect()
}

/// The RoleBinding granting the import ServiceAccount its reads in the Provider's namespace.
pub fn import_binding_name(provider: &str) -> String {
    names::shorten(&format!("banlieue-import-{provider}"))
}

/// The Role (and its RoleBinding) granting the import ServiceAccount the Provider's connection
/// Secrets by name. The `:` cannot appear in a Provider's name, so no Provider's
/// [`import_binding_name`] is ever this name.
pub fn import_role_name(provider: &str) -> String {
    format!("banlieue-import:{}", names::shorten(provider))
}

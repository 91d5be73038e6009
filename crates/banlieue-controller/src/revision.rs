//! A pool's revision: a hash of its member template and its image's revision, so that a
//! template edit or a rebuilt image both make a new revision.

use banlieue_api::{VirtualMachinePool, VirtualMachineTemplate};
use sha2::{Digest, Sha256};

/// What each new member of `pool` is made from: its template, with the pool's `standby`
/// (ADR-0073) in place of whatever the template says, so that changing it is a new revision.
pub fn member_template(pool: &VirtualMachinePool) -> VirtualMachineTemplate {
    let mut template = pool.spec.template.clone();
    template.spec.standby = pool.spec.standby;
    template
}

/// Ten hex digits of SHA-256 over the member template's JSON and the image revision. A pool
/// without `standby` hashes as it did before the field existed.
pub fn pool_revision(pool: &VirtualMachinePool, image_revision: Option<&str>) -> String {
    let mut hasher = Sha256::new();
    // serde_json writes struct fields in declaration order and maps sorted (BTreeMap), so the
    // encoding of one template is stable.
    hasher.update(serde_json::to_vec(&member_template(pool)).unwrap_or_default());
    hasher.update([0]);
    hasher.update(image_revision.unwrap_or("").as_bytes());
    hasher.finalize()[..5]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use banlieue_api::Standby;

    #[test]
    fn standby_is_part_of_the_revision_and_unset_hashes_as_before() {
        let pool = pool_of_two();
        let before = pool_revision(&pool, Some("sha256:1"));
        // The template alone, as revisions were computed before `standby` existed.
        let mut hasher = Sha256::new();
        hasher.update(serde_json::to_vec(&pool.spec.template).unwrap());
        hasher.update([0]);
        hasher.update(b"sha256:1");
        let legacy: String = hasher.finalize()[..5]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(before, legacy);

        let mut saved = pool.clone();
        saved.spec.standby = Some(Standby::Saved);
        assert_ne!(pool_revision(&saved, Some("sha256:1")), before);
        assert_eq!(member_template(&saved).spec.standby, Some(Standby::Saved));

        // The pool's field wins over a template that says otherwise.
        let mut template_says = pool.clone();
        template_says.spec.template.spec.standby = Some(Standby::Saved);
        assert_eq!(member_template(&template_says).spec.standby, None);
        assert_eq!(pool_revision(&template_says, Some("sha256:1")), before);
    }

    fn pool_of_two() -> VirtualMachinePool {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "banlieue.io/v1alpha1",
            "kind": "VirtualMachinePool",
            "metadata": {"name": "web", "namespace": "ns"},
            "spec": {
                "replicas": 2,
                "template": {"spec": {
                    "classRef": {"name": "small"},
                    "imageRef": {"name": "ubuntu"},
                    "storageClassName": "fast",
                    "networkClassName": "prod"
                }},
                "updateStrategy": {"type": "Replace"}
            }
        }))
        .unwrap()
    }
}

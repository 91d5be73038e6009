//! A pool's revision: a hash of its member template and its image's revision, so that a
//! template edit or a rebuilt image both make a new revision.

use banlieue_api::VirtualMachineTemplate;
use sha2::{Digest, Sha256};

/// Ten hex digits of SHA-256 over the template's JSON and the image revision.
pub fn pool_revision(template: &VirtualMachineTemplate, image_revision: Option<&str>) -> String {
    let mut hasher = Sha256::new();
    // serde_json writes struct fields in declaration order and maps sorted (BTreeMap), so the
    // encoding of one template is stable.
    hasher.update(serde_json::to_vec(template).unwrap_or_default());
    hasher.update([0]);
    hasher.update(image_revision.unwrap_or("").as_bytes());
    hasher.finalize()[..5]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

//! OpenSSH public key lines for tests that need a well-formed key and no login with it: an
//! ed25519 blob is its type and 32 key bytes, and any 32 bytes make a key nothing holds the
//! private half of. Tests that log in make real pairs with `ssh-keygen`.

use base64::Engine;

/// `ssh-ed25519 <base64> <comment>`, its 32 key bytes all `fill` (the comment left out when
/// empty).
pub fn ed25519_public_key(fill: u8, comment: &str) -> String {
    let mut blob = Vec::new();
    blob.extend_from_slice(&11u32.to_be_bytes());
    blob.extend_from_slice(b"ssh-ed25519");
    blob.extend_from_slice(&32u32.to_be_bytes());
    blob.extend_from_slice(&[fill; 32]);
    let key = base64::engine::general_purpose::STANDARD.encode(&blob);
    if comment.is_empty() {
        format!("ssh-ed25519 {key}")
    } else {
        format!("ssh-ed25519 {key} {comment}")
    }
}

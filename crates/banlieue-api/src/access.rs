//! A claim's access: the public keys of its subject and the login they are installed for
//! (`VirtualMachineClaim.spec.access`). Public material only: nothing here is a secret, so it
//! may sit in a spec every reader of the claim sees.
//!
//! The CRD refuses what a regular expression can tell apart (a key type banlieue does not
//! accept, text that is not base64, an invalid user name), naming the entry by its index (an
//! OpenAPI `pattern`, not a CEL rule: a rule over keys this long exceeds the API server's cost
//! budget);
//! [`parse_authorized_key`] also decodes each key and checks the type inside it, and is what the
//! consumer CLI and the provider use before a key goes anywhere.

use base64::Engine;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// The most keys one claim may carry: a subject has a few devices, not a directory.
pub const MAX_SSH_KEYS: usize = 16;

/// The longest key line accepted: an RSA key of 16384 bits is about 2.8 KiB in OpenSSH's form,
/// the comment included; anything longer is not one key.
pub const MAX_SSH_KEY_LENGTH: usize = 8192;

/// The key types accepted, as OpenSSH names them. DSA keys are refused (OpenSSH removed them).
pub const KEY_TYPES: [&str; 7] = [
    "ssh-ed25519",
    "ssh-rsa",
    "ecdsa-sha2-nistp256",
    "ecdsa-sha2-nistp384",
    "ecdsa-sha2-nistp521",
    "sk-ssh-ed25519@openssh.com",
    "sk-ecdsa-sha2-nistp256@openssh.com",
];

/// What the CRD accepts as one key line: a type, the key in base64, and an optional comment
/// without control characters (line breaks among them). No options (`command=`, `from=`): the guest installs the key alone.
pub const KEY_LINE_PATTERN: &str = "^(ssh-ed25519|ssh-rsa|ecdsa-sha2-nistp(256|384|521)|sk-ssh-ed25519@openssh[.]com|sk-ecdsa-sha2-nistp256@openssh[.]com) [A-Za-z0-9+/]+={0,2}( [^[:cntrl:]]*)?$";

/// A POSIX login name as useradd accepts it by default: a lower-case letter or underscore,
/// then up to 31 lower-case letters, digits, underscores or hyphens.
pub const USER_PATTERN: &str = "^[a-z_][a-z0-9_-]{0,31}$";

/// Who may log in to a claimed member, and as whom. Immutable with the rest of the spec.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClaimAccess {
    /// OpenSSH public keys (`ssh-ed25519 AAAA… comment`), installed in the member's guest after
    /// the bind for `user` alone. At most 16, each at most 8192 characters.
    #[serde(default)]
    #[schemars(
        length(max = MAX_SSH_KEYS),
        inner(length(min = 1, max = MAX_SSH_KEY_LENGTH), regex(pattern = KEY_LINE_PATTERN))
    )]
    pub ssh_authorized_keys: Vec<String>,
    /// The login the keys are installed for: a POSIX user name. Defaults to the image's
    /// default user (cloud-init's), created by the guest when missing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 32), regex(pattern = USER_PATTERN))]
    pub user: Option<String>,
}

/// One parsed key line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AuthorizedKey {
    /// Its type, one of [`KEY_TYPES`].
    pub key_type: String,
    /// The key blob, decoded.
    pub blob: Vec<u8>,
    /// Its comment, possibly empty.
    pub comment: String,
}

impl AuthorizedKey {
    /// `SHA256:<base64 without padding>` of the blob, as `ssh-keygen -l` prints it.
    pub fn fingerprint(&self) -> String {
        let digest = Sha256::digest(&self.blob);
        format!(
            "SHA256:{}",
            base64::engine::general_purpose::STANDARD_NO_PAD.encode(digest)
        )
    }

    /// The line as it is installed: type, base64, comment (when there is one).
    pub fn line(&self) -> String {
        let key = base64::engine::general_purpose::STANDARD.encode(&self.blob);
        if self.comment.is_empty() {
            format!("{} {key}", self.key_type)
        } else {
            format!("{} {key} {}", self.key_type, self.comment)
        }
    }
}

/// Why a key line is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    #[error("is longer than {MAX_SSH_KEY_LENGTH} characters")]
    TooLong,
    #[error("is empty")]
    Empty,
    #[error("holds a control character (a line break?): one key per entry")]
    ControlCharacter,
    #[error("has key type {0:?}, which is not accepted (one of {types})", types = KEY_TYPES.join(", "))]
    UnknownType(String),
    #[error("has no key after its type")]
    NoKey,
    #[error("is not base64 after its type")]
    NotBase64,
    #[error("decodes to no SSH public key: its base64 does not begin with a key type")]
    NoKeyType,
    #[error("holds a {inner:?} key under type {outer:?}")]
    TypeMismatch { outer: String, inner: String },
}

/// Parses one OpenSSH public key line (`type base64 [comment]`), checking that the key's
/// encoded type (the first string of its blob, RFC 4253 §6.6) is the type it is written under.
pub fn parse_authorized_key(line: &str) -> Result<AuthorizedKey, KeyError> {
    if line.len() > MAX_SSH_KEY_LENGTH {
        return Err(KeyError::TooLong);
    }
    let line = line.trim_end_matches(' ');
    if line.chars().any(|c| c.is_ascii_control()) {
        return Err(KeyError::ControlCharacter);
    }
    if line.is_empty() {
        return Err(KeyError::Empty);
    }
    let mut parts = line.splitn(3, ' ');
    let key_type = parts.next().unwrap_or_default();
    if !KEY_TYPES.contains(&key_type) {
        return Err(KeyError::UnknownType(key_type.chars().take(64).collect()));
    }
    let encoded = parts
        .next()
        .filter(|k| !k.is_empty())
        .ok_or(KeyError::NoKey)?;
    let blob = base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .map_err(|_| KeyError::NotBase64)?;
    let inner = blob_type(&blob).ok_or(KeyError::NoKeyType)?;
    if inner != key_type {
        return Err(KeyError::TypeMismatch {
            outer: key_type.to_owned(),
            inner: inner.chars().take(64).collect(),
        });
    }
    Ok(AuthorizedKey {
        key_type: key_type.to_owned(),
        blob,
        comment: parts.next().unwrap_or_default().to_owned(),
    })
}

/// The first string of an SSH wire-format blob: a big-endian u32 length, then that many bytes.
fn blob_type(blob: &[u8]) -> Option<String> {
    let length = u32::from_be_bytes(blob.get(..4)?.try_into().ok()?) as usize;
    let bytes = blob.get(4..4usize.checked_add(length)?)?;
    String::from_utf8(bytes.to_vec()).ok()
}

/// Parses every key of `access`, naming the first bad entry by its index as the CRD does.
pub fn parse_keys(access: &ClaimAccess) -> Result<Vec<AuthorizedKey>, String> {
    access
        .ssh_authorized_keys
        .iter()
        .enumerate()
        .map(|(index, line)| {
            parse_authorized_key(line)
                .map_err(|why| format!("sshAuthorizedKeys entry {index} {why}"))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An ed25519 public key in OpenSSH's form (a fixed test vector, no private half anywhere).
    fn ed25519_line(comment: &str) -> String {
        let mut blob = Vec::new();
        blob.extend_from_slice(&11u32.to_be_bytes());
        blob.extend_from_slice(b"ssh-ed25519");
        blob.extend_from_slice(&32u32.to_be_bytes());
        blob.extend_from_slice(&[7u8; 32]);
        let key = base64::engine::general_purpose::STANDARD.encode(&blob);
        format!("ssh-ed25519 {key} {comment}").trim_end().to_owned()
    }

    #[test]
    fn a_key_parses_with_its_comment_and_fingerprint() {
        let key = parse_authorized_key(&ed25519_line("alice@laptop")).unwrap();
        assert_eq!(key.key_type, "ssh-ed25519");
        assert_eq!(key.comment, "alice@laptop");
        assert_eq!(key.blob.len(), 4 + 11 + 4 + 32);
        assert_eq!(key.line(), ed25519_line("alice@laptop"));
        let fingerprint = key.fingerprint();
        assert!(fingerprint.starts_with("SHA256:"));
        assert_eq!(fingerprint.len(), "SHA256:".len() + 43);
        assert_eq!(parse_authorized_key(&ed25519_line("")).unwrap().comment, "");
    }

    #[test]
    fn malformed_keys_say_what_is_wrong() {
        let good = ed25519_line("c");
        let key = good.split(' ').nth(1).unwrap();
        assert_eq!(parse_authorized_key(""), Err(KeyError::Empty));
        assert_eq!(
            parse_authorized_key(&format!("ssh-dss {key}")),
            Err(KeyError::UnknownType("ssh-dss".into()))
        );
        assert_eq!(parse_authorized_key("ssh-ed25519"), Err(KeyError::NoKey));
        assert_eq!(
            parse_authorized_key("ssh-ed25519 not*base64"),
            Err(KeyError::NotBase64)
        );
        assert_eq!(
            parse_authorized_key(&format!("ssh-rsa {key}")),
            Err(KeyError::TypeMismatch {
                outer: "ssh-rsa".into(),
                inner: "ssh-ed25519".into()
            })
        );
        assert_eq!(
            parse_authorized_key(&format!("{good}\nssh-ed25519 {key}")),
            Err(KeyError::ControlCharacter)
        );
        assert_eq!(
            parse_authorized_key(&"a".repeat(MAX_SSH_KEY_LENGTH + 1)),
            Err(KeyError::TooLong)
        );
        // A blob whose length prefix runs past its end is no key, not a panic.
        let short = base64::engine::general_purpose::STANDARD.encode([0, 0, 0, 200, b's']);
        assert_eq!(
            parse_authorized_key(&format!("ssh-ed25519 {short}")),
            Err(KeyError::NoKeyType)
        );
    }

    #[test]
    fn parse_keys_names_the_entry() {
        let access = ClaimAccess {
            ssh_authorized_keys: vec![ed25519_line("a"), "ssh-ed25519 AAAA".into()],
            user: None,
        };
        let error = parse_keys(&access).unwrap_err();
        assert!(error.starts_with("sshAuthorizedKeys entry 1 "), "{error}");
    }
}

//! A claim's keys in its guest, the part every backend shares: the files of the guest-phase
//! layer's access contract (guest/README.md), what the host writes, what the guest answers
//! and the `AccessReady` condition that follows. A backend carries the bytes (libvirt: the
//! guest agent's file calls) and says what it saw; this says what it means.
//!
//! Everything read here comes from inside a guest, which the host does not trust: bounded,
//! parsed strictly, never a panic.

use banlieue_api::access::{self, ClaimAccess};
use banlieue_api::conditions::{self, Condition, reasons, status, types};
use sha2::{Digest, Sha256};

/// What the host writes: the keys and the login, in the layer's line format.
pub const WANTED_FILE: &str = "/run/banlieue/access/wanted";
/// What the layer answers: `installed <user> <sha256 of the wanted file>` or `failed: <why>`.
pub const STATE_FILE: &str = "/run/banlieue/access/state";
/// The guest's SSH host public keys, one `TYPE BASE64` per line, written before `ready`.
pub const HOST_KEYS_FILE: &str = "/run/banlieue/ssh/host_keys";

/// The most host keys recorded: sshd has one per key type.
pub const MAX_HOST_KEYS: usize = 8;

/// The bytes of [`WANTED_FILE`] for `access`: a header, the login when one is asked for,
/// one `key` line per key, then `end`: the agent creates, writes and closes the file in
/// separate calls, and the layer, which may see it between them, reads it as complete only
/// once it ends so.
pub fn wanted_file(access: &ClaimAccess) -> Vec<u8> {
    let mut text = String::from("banlieue-access 1\n");
    if let Some(user) = &access.user {
        text.push_str(&format!("user {user}\n"));
    }
    for key in &access.ssh_authorized_keys {
        text.push_str(&format!("key {key}\n"));
    }
    text.push_str("end\n");
    text.into_bytes()
}

/// Lower-case hex SHA-256 of `bytes`, as the layer writes it in its state.
pub fn digest(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// What the guest says of the keys, read from [`STATE_FILE`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GuestAccess {
    /// Installed for this login, from exactly the file the host wrote.
    Installed { user: String },
    /// The layer refused the keys or could not install them, and says why.
    Refused(String),
    /// No answer for this file yet (no state, or one about other bytes).
    NotYet,
}

/// Reads the layer's state against `wanted_digest`, the digest of what the host wrote. A
/// state the layer would not write is an answer too: the guest refused to speak the contract.
pub fn parse_state(bytes: &[u8], wanted_digest: &str) -> GuestAccess {
    let Ok(text) = std::str::from_utf8(bytes) else {
        return GuestAccess::Refused("the guest's access state is not UTF-8".into());
    };
    let line = text.strip_suffix('\n').unwrap_or(text);
    if let Some(why) = line.strip_prefix("failed: ") {
        return GuestAccess::Refused(conditions::bounded_message(
            why.to_owned(),
            conditions::MAX_MESSAGE_BYTES / 4,
        ));
    }
    let mut words = line.split(' ');
    match (words.next(), words.next(), words.next(), words.next()) {
        (Some("installed"), Some(user), Some(digest), None)
            if user_name_ok(user) && digest.len() == 64 =>
        {
            if digest == wanted_digest {
                GuestAccess::Installed {
                    user: user.to_owned(),
                }
            } else {
                GuestAccess::NotYet
            }
        }
        _ => GuestAccess::Refused(format!(
            "the guest's access state is not the layer's: {:?}",
            line.chars().take(80).collect::<String>()
        )),
    }
}

fn user_name_ok(user: &str) -> bool {
    let mut chars = user.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_lowercase() || c == '_')
        && user.len() <= 32
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-')
}

/// The host keys of [`HOST_KEYS_FILE`]: each line a public key `TYPE BASE64` whose blob is of
/// its type, at most [`MAX_HOST_KEYS`], sorted. `Err` says what is wrong with the file.
pub fn parse_host_keys(bytes: &[u8]) -> Result<Vec<String>, String> {
    let text = std::str::from_utf8(bytes).map_err(|_| "is not UTF-8".to_owned())?;
    let mut keys = Vec::new();
    for (index, line) in text.lines().filter(|l| !l.is_empty()).enumerate() {
        if index == MAX_HOST_KEYS {
            return Err(format!("holds more than {MAX_HOST_KEYS} keys"));
        }
        let key = access::parse_authorized_key(line)
            .map_err(|why| format!("line {} {why}", index + 1))?;
        // Recorded without a comment: the guest's words about its keys are not published.
        let bare = access::AuthorizedKey {
            comment: String::new(),
            ..key
        };
        keys.push(bare.line());
    }
    keys.sort();
    keys.dedup();
    Ok(keys)
}

/// What a reconcile saw of a machine's access.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AccessSight {
    /// The guest installed the keys for `user`.
    Installed { user: String },
    /// Not yet, and why (waiting for the guest, its agent, its layer).
    Pending(String),
    /// The guest's layer refused them.
    Refused(String),
    /// The backend does not deliver access.
    NotSupported(String),
}

/// `AccessReady` for `sight`.
pub fn condition(sight: &AccessSight, generation: Option<i64>) -> Condition {
    let (state, reason, message) = match sight {
        AccessSight::Installed { user } => (
            status::TRUE,
            reasons::ACCESS_INSTALLED,
            format!("the guest installed the claim's keys for {user}"),
        ),
        AccessSight::Pending(why) => (status::FALSE, reasons::ACCESS_PENDING, why.clone()),
        AccessSight::Refused(why) => (
            status::FALSE,
            reasons::ACCESS_REFUSED,
            format!("the guest did not install the claim's keys: {why}"),
        ),
        AccessSight::NotSupported(why) => {
            (status::FALSE, reasons::ACCESS_NOT_SUPPORTED, why.clone())
        }
    };
    conditions::new(types::ACCESS_READY, state, reason, message, generation)
}

/// Whether a machine's recorded status already says the keys are in, or refused for good:
/// nothing more is asked of its guest.
pub fn settled(recorded: &[Condition]) -> bool {
    conditions::find(recorded, types::ACCESS_READY).is_some_and(|c| {
        c.reason == reasons::ACCESS_INSTALLED || c.reason == reasons::ACCESS_REFUSED
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::Engine;

    fn key(fill: u8) -> String {
        let mut blob = Vec::new();
        blob.extend_from_slice(&11u32.to_be_bytes());
        blob.extend_from_slice(b"ssh-ed25519");
        blob.extend_from_slice(&32u32.to_be_bytes());
        blob.extend_from_slice(&[fill; 32]);
        format!(
            "ssh-ed25519 {}",
            base64::engine::general_purpose::STANDARD.encode(&blob)
        )
    }

    #[test]
    fn the_wanted_file_is_the_layers_line_format() {
        let access = ClaimAccess {
            ssh_authorized_keys: vec![format!("{} alice@laptop", key(1)), key(2)],
            user: Some("alice".into()),
        };
        let text = String::from_utf8(wanted_file(&access)).unwrap();
        assert_eq!(
            text,
            format!(
                "banlieue-access 1\nuser alice\nkey {} alice@laptop\nkey {}\nend\n",
                key(1),
                key(2)
            )
        );
        let without_user = ClaimAccess {
            user: None,
            ..access
        };
        assert!(
            !String::from_utf8(wanted_file(&without_user))
                .unwrap()
                .contains("user ")
        );
        assert_eq!(digest(b"").len(), 64);
    }

    #[test]
    fn the_state_is_matched_against_what_was_written() {
        let wanted = digest(b"x");
        let installed = format!("installed alice {wanted}\n");
        assert_eq!(
            parse_state(installed.as_bytes(), &wanted),
            GuestAccess::Installed {
                user: "alice".into()
            }
        );
        // Installed from other bytes: not an answer about these.
        let other = format!("installed alice {}\n", digest(b"y"));
        assert_eq!(parse_state(other.as_bytes(), &wanted), GuestAccess::NotYet);
        assert_eq!(
            parse_state(b"failed: no such user\n", &wanted),
            GuestAccess::Refused("no such user".into())
        );
        for junk in [
            &b"installed Alice x"[..],
            b"\xff",
            b"hello",
            b"installed a b c d",
        ] {
            assert!(
                matches!(parse_state(junk, &wanted), GuestAccess::Refused(_)),
                "{junk:?}"
            );
        }
    }

    #[test]
    fn host_keys_are_checked_sorted_and_bare() {
        let file = format!("{} root@guest\n{}\n", key(9), key(1));
        assert_eq!(
            parse_host_keys(file.as_bytes()).unwrap(),
            vec![key(1), key(9)]
        );
        assert!(
            parse_host_keys(b"ssh-ed25519 AAAA\n")
                .unwrap_err()
                .starts_with("line 1 ")
        );
        let many: String = (0..9).map(|i| format!("{}\n", key(i))).collect();
        assert!(parse_host_keys(many.as_bytes()).is_err());
        assert_eq!(parse_host_keys(b"").unwrap(), Vec::<String>::new());
    }

    #[test]
    fn installed_and_refused_are_settled() {
        let installed = condition(&AccessSight::Installed { user: "a".into() }, Some(1));
        assert_eq!(installed.status, status::TRUE);
        assert!(settled(std::slice::from_ref(&installed)));
        let refused = condition(&AccessSight::Refused("bad".into()), None);
        assert!(settled(&[refused]));
        assert!(!settled(&[condition(
            &AccessSight::Pending("x".into()),
            None
        )]));
        assert!(!settled(&[]));
    }
}

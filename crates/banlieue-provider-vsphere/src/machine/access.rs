//! A claim's keys in a vSphere guest (ADR-0076): the request travels as guestinfo, written by
//! a reconfigure once the guest says `ready`, and the guest-phase layer answers in guestinfo,
//! which the property wait sees. What the bytes are and what an answer means is the kit's
//! ([`banlieue_provider_kit::access`]), the same as on libvirt; this is only where they travel.
//! No I/O here.

use banlieue_api::access::ClaimAccess;
use banlieue_api::vsphere::{GUESTINFO_ACCESS, GUESTINFO_ACCESS_STATE, GUESTINFO_SSH_HOST_KEYS};
use banlieue_provider_kit::access::{self, AccessSight, GuestAccess};
use banlieue_provider_kit::guest::Phase;
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;

use super::status::Observed;

/// The longest host keys value read: the guest writes it, and eight keys of the longest
/// accepted kind fit with room to spare.
pub const MAX_HOST_KEYS_VALUE: usize = 96 * 1024;

/// The value of [`GUESTINFO_ACCESS`] for `access`: the layer's request, base64 as cloud-init's
/// guestinfo is, so that its lines survive as one extraConfig value.
pub fn wanted_value(access: &ClaimAccess) -> String {
    BASE64.encode(access::wanted_file(access))
}

/// Whether the guest is ready for its keys: powered on and its layer says `ready` (before
/// that, the layer may not be listening yet).
pub fn guest_ready(o: &Observed) -> bool {
    o.powered_on && o.phase.as_deref().map(|p| Phase::parse(p.as_bytes())) == Some(Phase::Ready)
}

/// The value to write to [`GUESTINFO_ACCESS`], when the machine has keys, its guest is ready
/// and the VM does not hold that very value yet.
pub fn to_write(access: Option<&ClaimAccess>, o: &Observed) -> Option<String> {
    let wanted = wanted_value(access?);
    (guest_ready(o) && o.access_written.as_deref() != Some(wanted.as_str())).then_some(wanted)
}

/// What became of the machine's keys, from what the reconcile read (`None`: it has none).
pub fn sight(access: Option<&ClaimAccess>, o: &Observed) -> Option<AccessSight> {
    let access = access?;
    if !guest_ready(o) {
        return Some(AccessSight::Pending(format!(
            "waiting for the guest to say ready before writing {GUESTINFO_ACCESS}"
        )));
    }
    let wanted = access::wanted_file(access);
    if o.access_written.as_deref() != Some(BASE64.encode(&wanted).as_str()) {
        return Some(AccessSight::Pending(format!(
            "{GUESTINFO_ACCESS} is not written yet"
        )));
    }
    let answer = o
        .access_state
        .as_deref()
        .map_or(GuestAccess::NotYet, |state| {
            access::parse_state(state.as_bytes(), &access::digest(&wanted))
        });
    Some(match answer {
        GuestAccess::Installed { user } => AccessSight::Installed { user },
        GuestAccess::Refused(why) => AccessSight::Refused(why),
        GuestAccess::NotYet => AccessSight::Pending(format!(
            "the keys are in {GUESTINFO_ACCESS}; the guest's layer has not answered in \
             {GUESTINFO_ACCESS_STATE} yet"
        )),
    })
}

/// The guest's SSH host keys from [`GUESTINFO_SSH_HOST_KEYS`]: `None` when it publishes none,
/// `Err` saying what is wrong with what it published.
pub fn host_keys(o: &Observed) -> Result<Option<Vec<String>>, String> {
    let Some(value) = o.host_keys.as_deref().filter(|v| !v.is_empty()) else {
        return Ok(None);
    };
    if value.len() > MAX_HOST_KEYS_VALUE {
        return Err(format!(
            "{GUESTINFO_SSH_HOST_KEYS} is longer than {MAX_HOST_KEYS_VALUE} bytes"
        ));
    }
    let bytes = BASE64
        .decode(value.trim())
        .map_err(|_| format!("{GUESTINFO_SSH_HOST_KEYS} is not base64"))?;
    let keys = access::parse_host_keys(&bytes)
        .map_err(|why| format!("{GUESTINFO_SSH_HOST_KEYS} {why}"))?;
    Ok((!keys.is_empty()).then_some(keys))
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::observed;
    use super::*;
    use banlieue_testenv::ssh_keys::ed25519_public_key;

    fn alice() -> ClaimAccess {
        ClaimAccess {
            ssh_authorized_keys: vec![ed25519_public_key(1, "")],
            user: Some("alice".into()),
        }
    }

    fn ready() -> Observed {
        Observed {
            phase: Some("ready".into()),
            ..observed()
        }
    }

    #[test]
    fn the_request_is_written_once_the_guest_is_ready_and_only_once() {
        let keys = alice();
        let booting = Observed {
            phase: Some("configuring".into()),
            ..observed()
        };
        assert_eq!(to_write(Some(&keys), &booting), None);
        assert_eq!(to_write(None, &ready()), None);
        let value = to_write(Some(&keys), &ready()).expect("written when ready");
        assert_eq!(
            BASE64.decode(&value).unwrap(),
            access::wanted_file(&keys),
            "the layer's request, base64"
        );
        let written = Observed {
            access_written: Some(value),
            ..ready()
        };
        assert_eq!(to_write(Some(&keys), &written), None);
        // Another value in its place (the guest may write guestinfo too) is written over.
        let overwritten = Observed {
            access_written: Some("bWluZQ==".into()),
            ..ready()
        };
        assert!(to_write(Some(&keys), &overwritten).is_some());
    }

    #[test]
    fn the_answer_counts_only_for_the_bytes_written() {
        let keys = alice();
        let digest = access::digest(&access::wanted_file(&keys));
        let with = |state: Option<&str>| Observed {
            access_written: Some(wanted_value(&keys)),
            access_state: state.map(str::to_owned),
            ..ready()
        };
        assert_eq!(sight(None, &with(None)), None);
        assert!(matches!(
            sight(Some(&keys), &Observed { phase: None, ..with(None) }),
            Some(AccessSight::Pending(why)) if why.contains("ready")
        ));
        assert!(matches!(
            sight(Some(&keys), &with(None)),
            Some(AccessSight::Pending(why)) if why.contains(GUESTINFO_ACCESS_STATE)
        ));
        assert_eq!(
            sight(
                Some(&keys),
                &with(Some(&format!("installed alice {digest}")))
            ),
            Some(AccessSight::Installed {
                user: "alice".into()
            })
        );
        // An answer about other bytes is no answer.
        let other = "0".repeat(64);
        assert!(matches!(
            sight(
                Some(&keys),
                &with(Some(&format!("installed alice {other}")))
            ),
            Some(AccessSight::Pending(_))
        ));
        assert_eq!(
            sight(Some(&keys), &with(Some("failed: line 2: no"))),
            Some(AccessSight::Refused("line 2: no".into()))
        );
        // Written, then not what the VM holds any more: not installed whatever the state says.
        let replaced = Observed {
            access_written: Some("bWluZQ==".into()),
            ..with(Some(&format!("installed alice {digest}")))
        };
        assert!(matches!(
            sight(Some(&keys), &replaced),
            Some(AccessSight::Pending(_))
        ));
    }

    #[test]
    fn host_keys_are_base64_of_the_layers_file_and_checked() {
        let with = |value: &str| Observed {
            host_keys: Some(value.to_owned()),
            ..ready()
        };
        assert_eq!(host_keys(&observed()), Ok(None));
        let file = format!(
            "{} root@guest\n{}\n",
            ed25519_public_key(2, ""),
            ed25519_public_key(1, "")
        );
        assert_eq!(
            host_keys(&with(&BASE64.encode(&file))),
            Ok(Some(vec![
                ed25519_public_key(1, ""),
                ed25519_public_key(2, "")
            ])),
            "sorted, without comments"
        );
        assert!(
            host_keys(&with("not base64!"))
                .unwrap_err()
                .contains("not base64")
        );
        assert!(
            host_keys(&with(&BASE64.encode("ssh-ed25519 AAAA\n")))
                .unwrap_err()
                .starts_with(GUESTINFO_SSH_HOST_KEYS)
        );
        assert!(
            host_keys(&with(&"A".repeat(MAX_HOST_KEYS_VALUE + 4)))
                .unwrap_err()
                .contains("longer")
        );
    }
}

//! The attested handover (ADR-0077): a claim's subject proves which VM it got. The subject
//! writes a challenge on its claim (`spec.handover`): a TPM credential made for the guest's
//! attestation key under the EK its certificate names, and the extra data a quote must carry.
//! The controller copies it to the member's machine, whose provider relays it into the guest;
//! the guest's TPM activates it and quotes (over the binding and its own SSH host keys), and
//! the answer comes back the same way
//! (`status.attestation`). Nothing here is trusted: the subject checks every byte itself
//! (`banlieue claim verify`, the `banlieue-attest` crate).
//!
//! The guest contract (guest/README.md, "Attestation"): the host writes the credential to
//! [`CHALLENGE_FILE`], then [`ACTIVATE_FILE`] naming its SHA-256 and the quote's extra data;
//! the layer answers in [`ANSWER_FILE`], one `key value` line each (see [`parse_answer`]).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// Where the guest layer publishes its attestation key's public area (TPM2B_PUBLIC).
pub const AK_PUBLIC_FILE: &str = "/run/banlieue/attest/ak.pub";
/// Where the host writes the credential (tpm2-tools' credential file).
pub const CHALLENGE_FILE: &str = "/run/banlieue/attest/challenge";
/// Written after the challenge: `<sha256 of the challenge> <extra data, hex>`; each close
/// starts the layer's activation.
pub const ACTIVATE_FILE: &str = "/run/banlieue/attest/activate";
/// The layer's answer.
pub const ANSWER_FILE: &str = "/run/banlieue/attest/answer";
/// Where the host writes a sealed payload, before the activate line that names its SHA-256.
pub const SEALED_FILE: &str = "/run/banlieue/attest/sealed";
/// Where the guest puts a payload it opened: readable by the claim's login alone (root when
/// the claim has no access).
pub const OPENED_FILE: &str = "/run/banlieue/sealed/payload";

/// The longest sealed payload, in base64: 32 KiB of payload and its IV and tag. A secret to
/// hand over (a token, a key), not a file system.
pub const MAX_SEALED_LENGTH: usize = 44_000;

/// The longest credential accepted, in base64: an RSA 4096 EK's encrypted seed (512 bytes)
/// and the identity object fit in well under half of it.
pub const MAX_CREDENTIAL_LENGTH: usize = 2048;
/// The longest quote, signature or PCR list an answer carries, in base64.
pub const MAX_ANSWER_FIELD_LENGTH: usize = 8192;
/// The longest firmware event log an answer carries, in base64: a 36 KiB log (OVMF's for the
/// test image is under 5 KiB; Secure Boot's key databases add a few more).
pub const MAX_EVENT_LOG_LENGTH: usize = 48 * 1024;
/// The longest attestation key public area, in base64 (an RSA 4096 key's is about 600 bytes).
pub const MAX_AK_PUBLIC_LENGTH: usize = 2048;

/// What the CRD accepts as a credential: standard base64.
pub const BASE64_PATTERN: &str = "^[A-Za-z0-9+/]+={0,2}$";
/// What the CRD accepts as a binding: a SHA-256, in lower-case hex.
pub const BINDING_PATTERN: &str = "^[0-9a-f]{64}$";

/// A subject's challenge to its claimed VM (`VirtualMachineClaim.spec.handover`), copied by
/// the controller to the member and its machine. Only the claim's subject may write it; it
/// may be replaced by a new challenge at any time.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HandoverChallenge {
    /// A TPM credential for the guest's attestation key, made under the endorsement key of
    /// the claim's EK certificate (TPM2_MakeCredential; tpm2-tools' credential file, base64).
    #[schemars(length(min = 1, max = MAX_CREDENTIAL_LENGTH), regex(pattern = BASE64_PATTERN))]
    pub credential: String,
    /// The verifier's binding of this challenge to its claim (hex SHA-256 of its nonce, the
    /// claim's UID and its subject: banlieue-attest's `binding`). The guest's quote carries
    /// a hash of it and the guest's own SSH host keys.
    #[schemars(length(min = 64, max = 64), regex(pattern = BINDING_PATTERN))]
    pub binding: String,
    /// A payload sealed to the credential's secret (`banlieue claim seal`: AES-256-CTR and
    /// HMAC-SHA256 under keys derived from it; base64 of IV, ciphertext and tag). Only the
    /// TPM that activates the credential can open it; the guest writes it to
    /// `/run/banlieue/sealed/payload` for the claim's login alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = MAX_SEALED_LENGTH), regex(pattern = BASE64_PATTERN))]
    pub sealed: Option<String>,
}

impl HandoverChallenge {
    /// This challenge as the value of a JSON merge patch that replaces the one before it
    /// whole: a field this one lacks (a sealed payload) is written as `null`, so that a
    /// challenge without one does not keep the last one's, which would be opened with this
    /// challenge's secret and fail.
    pub fn merge_patch_value(&self) -> serde_json::Value {
        serde_json::json!({
            "credential": self.credential,
            "binding": self.binding,
            "sealed": self.sealed,
        })
    }

    /// The credential's bytes, or why they are not base64.
    pub fn credential_bytes(&self) -> Result<Vec<u8>, String> {
        use base64::Engine;
        if self.credential.len() > MAX_CREDENTIAL_LENGTH {
            return Err(format!(
                "the credential is longer than {MAX_CREDENTIAL_LENGTH} characters"
            ));
        }
        base64::engine::general_purpose::STANDARD
            .decode(&self.credential)
            .map_err(|e| format!("the credential is not base64: {e}"))
    }

    /// The SHA-256 (hex) of the credential's bytes: what names this challenge in the
    /// guest's answer.
    pub fn digest(&self) -> Result<String, String> {
        Ok(hex(&Sha256::digest(self.credential_bytes()?)))
    }

    /// The sealed payload's bytes, if any, or why they are not base64.
    pub fn sealed_bytes(&self) -> Result<Option<Vec<u8>>, String> {
        use base64::Engine;
        let Some(sealed) = &self.sealed else {
            return Ok(None);
        };
        if sealed.len() > MAX_SEALED_LENGTH {
            return Err(format!(
                "the sealed payload is longer than {MAX_SEALED_LENGTH} characters"
            ));
        }
        base64::engine::general_purpose::STANDARD
            .decode(sealed)
            .map(Some)
            .map_err(|e| format!("the sealed payload is not base64: {e}"))
    }

    /// What the host writes to [`ACTIVATE_FILE`] once the credential (and the sealed payload,
    /// if any) is in place: `DIGEST BINDING`, then the payload's SHA-256 when there is one.
    pub fn activate_line(&self) -> Result<String, String> {
        if self.binding.len() != 64
            || !self
                .binding
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        {
            return Err("the binding is not a hex SHA-256".into());
        }
        let sealed = match self.sealed_bytes()? {
            Some(bytes) => format!(" {}", hex(&Sha256::digest(bytes))),
            None => String::new(),
        };
        Ok(format!("{} {}{sealed}\n", self.digest()?, self.binding))
    }
}

/// What the guest's TPM said, as relayed (status of the machine, the VirtualMachine and the
/// claim): the subject checks it, nothing else does.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Attestation {
    /// The guest's attestation key's public area (TPM2B_PUBLIC, base64), as its layer
    /// published it before `ready`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = MAX_AK_PUBLIC_LENGTH))]
    pub attestation_key: Option<String>,
    /// The guest's answer to the last challenge it was relayed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answer: Option<HandoverAnswer>,
}

/// The guest's answer to one challenge.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HandoverAnswer {
    /// The SHA-256 (hex) of the credential answered.
    #[schemars(length(max = 64))]
    pub challenge: String,
    /// Proof that the TPM released the credential's secret: SHA-256 (hex) of
    /// `banlieue handover proof` and the secret; absent when the activation failed. Never the
    /// secret itself, which may be a sealed payload's key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 128))]
    pub activated: Option<String>,
    /// Where the guest wrote the sealed payload it opened.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 256))]
    pub opened: Option<String>,
    /// The quote by the attestation key (TPMS_ATTEST, base64).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = MAX_ANSWER_FIELD_LENGTH))]
    pub quote: Option<String>,
    /// Its signature (TPMT_SIGNATURE, base64).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = MAX_ANSWER_FIELD_LENGTH))]
    pub signature: Option<String>,
    /// The quoted PCRs' SHA-256 values, concatenated in selection order (base64).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = MAX_ANSWER_FIELD_LENGTH))]
    pub pcr_values: Option<String>,
    /// The guest's SSH host-keys file, as it hashed it into the quote's extra data (base64).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = MAX_ANSWER_FIELD_LENGTH))]
    pub host_keys: Option<String>,
    /// The firmware's event log of the guest's boot (TCG crypto-agile format, base64), where
    /// the firmware keeps one: what was measured into each quoted PCR. The subject replays it
    /// against the quoted values; nothing else reads it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = MAX_EVENT_LOG_LENGTH))]
    pub event_log: Option<String>,
    /// Why the guest could not answer, in its own words.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 1024))]
    pub failure: Option<String>,
}

/// Why the guest's answer file was refused (it is the guest's: untrusted input).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AnswerError {
    #[error("the guest's answer is not UTF-8")]
    NotText,
    #[error("the guest's answer is longer than {0} bytes")]
    TooLong(usize),
    #[error("the guest's answer line {0:?} is not one this contract defines")]
    UnknownLine(String),
    #[error("the guest's answer has no `activated` or `failed` line")]
    NoVerdict,
}

/// The longest answer file read: its four quote fields and an event log, with room for the
/// rest.
pub const MAX_ANSWER_BYTES: usize = 5 * MAX_ANSWER_FIELD_LENGTH + MAX_EVENT_LOG_LENGTH;

/// Reads the guest's answer file: `activated DIGEST PROOF_HEX` or `failed DIGEST WHY` first,
/// then `quote B64`, `signature B64`, `pcrs B64`, `hostkeys B64` and (where the firmware keeps
/// one) `eventlog B64` lines, and `opened PATH` for a sealed payload. `None` when it answers another
/// challenge than `digest` (an older one: the guest has not got to this one yet). Fields are
/// kept as given (the verifier decodes and checks them), only bounded.
pub fn parse_answer(bytes: &[u8], digest: &str) -> Result<Option<HandoverAnswer>, AnswerError> {
    if bytes.len() > MAX_ANSWER_BYTES {
        return Err(AnswerError::TooLong(MAX_ANSWER_BYTES));
    }
    let text = std::str::from_utf8(bytes).map_err(|_| AnswerError::NotText)?;
    let mut answer = HandoverAnswer::default();
    let mut verdict = false;
    for line in text.lines().filter(|l| !l.is_empty()) {
        let (key, value) = line.split_once(' ').unwrap_or((line, ""));
        let longest = if key == "eventlog" {
            MAX_EVENT_LOG_LENGTH
        } else {
            MAX_ANSWER_FIELD_LENGTH
        };
        let field = |value: &str| -> Result<Option<String>, AnswerError> {
            if value.len() > longest || !value.bytes().all(is_base64_byte) {
                return Err(AnswerError::UnknownLine(bounded(line)));
            }
            Ok(Some(value.to_owned()))
        };
        match key {
            "activated" => {
                let (challenge, secret) = value
                    .split_once(' ')
                    .ok_or_else(|| AnswerError::UnknownLine(bounded(line)))?;
                if challenge != digest {
                    return Ok(None);
                }
                if secret.len() > 128 || !secret.bytes().all(|b| b.is_ascii_hexdigit()) {
                    return Err(AnswerError::UnknownLine(bounded(line)));
                }
                answer.challenge = challenge.to_owned();
                answer.activated = Some(secret.to_owned());
                verdict = true;
            }
            "failed" => {
                let (challenge, why) = value.split_once(' ').unwrap_or((value, ""));
                if challenge != digest {
                    return Ok(None);
                }
                answer.challenge = challenge.to_owned();
                answer.failure = Some(bounded(why));
                verdict = true;
            }
            "quote" => answer.quote = field(value)?,
            "signature" => answer.signature = field(value)?,
            "pcrs" => answer.pcr_values = field(value)?,
            "hostkeys" => answer.host_keys = field(value)?,
            "eventlog" => answer.event_log = field(value)?,
            "opened" if value.starts_with('/') && !value.contains(char::is_control) => {
                answer.opened = Some(bounded(value));
            }
            _ => return Err(AnswerError::UnknownLine(bounded(line))),
        }
    }
    if !verdict {
        return Err(AnswerError::NoVerdict);
    }
    Ok(Some(answer))
}

fn is_base64_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'+' | b'/' | b'=')
}

fn bounded(text: &str) -> String {
    let mut end = text.len().min(200);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].chars().filter(|c| !c.is_control()).collect()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn challenge() -> HandoverChallenge {
        HandoverChallenge {
            credential: "AAECAw==".into(),
            binding: "ab".repeat(32),
            sealed: None,
        }
    }

    #[test]
    fn the_activate_line_names_the_credential_and_the_extra_data() {
        let c = challenge();
        let digest = hex(&Sha256::digest([0u8, 1, 2, 3]));
        assert_eq!(c.digest().unwrap(), digest);
        assert_eq!(
            c.activate_line().unwrap(),
            format!("{digest} {}\n", "ab".repeat(32))
        );
        let bad = HandoverChallenge {
            binding: "AB".repeat(32),
            ..challenge()
        };
        assert!(bad.activate_line().is_err());
        let not_base64 = HandoverChallenge {
            credential: "!!".into(),
            ..challenge()
        };
        assert!(not_base64.digest().unwrap_err().contains("not base64"));
        let sealed = HandoverChallenge {
            sealed: Some("AAEC".into()),
            ..challenge()
        };
        assert_eq!(
            sealed.activate_line().unwrap(),
            format!(
                "{digest} {} {}\n",
                "ab".repeat(32),
                hex(&Sha256::digest([0u8, 1, 2]))
            )
        );
    }

    #[test]
    fn a_challenge_merged_over_a_sealing_one_leaves_no_payload() {
        let sealing = HandoverChallenge {
            sealed: Some("c2VhbGVk".into()),
            ..challenge()
        };
        let mut spec = serde_json::json!({ "handover": sealing.merge_patch_value() });
        let next = HandoverChallenge {
            credential: "bmV4dA==".into(),
            ..challenge()
        };
        merge(
            &mut spec,
            &serde_json::json!({ "handover": next.merge_patch_value() }),
        );
        let merged: HandoverChallenge = serde_json::from_value(spec["handover"].clone()).unwrap();
        assert_eq!(merged, next);
    }

    /// RFC 7396, as the API server applies a merge patch.
    fn merge(target: &mut serde_json::Value, patch: &serde_json::Value) {
        let serde_json::Value::Object(fields) = patch else {
            *target = patch.clone();
            return;
        };
        if !target.is_object() {
            *target = serde_json::json!({});
        }
        let object = target.as_object_mut().unwrap();
        for (key, value) in fields {
            if value.is_null() {
                object.remove(key);
            } else {
                merge(
                    object.entry(key.clone()).or_insert(serde_json::Value::Null),
                    value,
                );
            }
        }
    }

    #[test]
    fn an_answer_is_this_challenges_or_none() {
        let answer = b"activated d1 0a0b\nquote AAAA\nsignature BBBB\npcrs CCCC\nhostkeys DDDD\neventlog EEEE\nopened /run/banlieue/sealed/payload\n";
        let parsed = parse_answer(answer, "d1").unwrap().unwrap();
        assert_eq!(parsed.challenge, "d1");
        assert_eq!(parsed.activated.as_deref(), Some("0a0b"));
        assert_eq!(parsed.quote.as_deref(), Some("AAAA"));
        assert_eq!(parsed.signature.as_deref(), Some("BBBB"));
        assert_eq!(parsed.pcr_values.as_deref(), Some("CCCC"));
        assert_eq!(parsed.host_keys.as_deref(), Some("DDDD"));
        assert_eq!(parsed.event_log.as_deref(), Some("EEEE"));
        assert_eq!(parsed.opened.as_deref(), Some(OPENED_FILE));
        // An older challenge's answer is not this one's.
        assert_eq!(parse_answer(answer, "d2").unwrap(), None);
        let failed = parse_answer(b"failed d2 no TPM\n", "d2").unwrap().unwrap();
        assert_eq!(failed.failure.as_deref(), Some("no TPM"));
        assert_eq!(failed.activated, None);
        assert_eq!(parse_answer(b"failed d1 no TPM\n", "d2").unwrap(), None);
    }

    #[test]
    fn a_hostile_answer_is_refused_not_trusted() {
        assert_eq!(parse_answer(b"\xff", "d"), Err(AnswerError::NotText));
        assert_eq!(
            parse_answer(b"quote AAAA\n", "d"),
            Err(AnswerError::NoVerdict)
        );
        assert!(matches!(
            parse_answer(b"activated d 0a\nshell rm -rf /\n", "d"),
            Err(AnswerError::UnknownLine(_))
        ));
        assert!(matches!(
            parse_answer(b"activated d zz\n", "d"),
            Err(AnswerError::UnknownLine(_))
        ));
        assert!(matches!(
            parse_answer(b"activated d 0a\nquote {\"x\":1}\n", "d"),
            Err(AnswerError::UnknownLine(_))
        ));
        // An event log may be longer than a quote, to its own bound; no field is unbounded.
        let log = "A".repeat(MAX_EVENT_LOG_LENGTH);
        let answer = format!("activated d 0a\neventlog {log}\n");
        assert!(parse_answer(answer.as_bytes(), "d").unwrap().is_some());
        let answer = format!("activated d 0a\neventlog {log}A\n");
        assert!(matches!(
            parse_answer(answer.as_bytes(), "d"),
            Err(AnswerError::UnknownLine(_))
        ));
        let answer = format!(
            "activated d 0a\nquote {}\n",
            &log[..MAX_ANSWER_FIELD_LENGTH + 1]
        );
        assert!(matches!(
            parse_answer(answer.as_bytes(), "d"),
            Err(AnswerError::UnknownLine(_))
        ));
        let long = vec![b'a'; MAX_ANSWER_BYTES + 1];
        assert_eq!(
            parse_answer(&long, "d"),
            Err(AnswerError::TooLong(MAX_ANSWER_BYTES))
        );
    }
}

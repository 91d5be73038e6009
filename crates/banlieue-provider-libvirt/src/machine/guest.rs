//! The pure half of reading a guest through qemu-guest-agent: the agent commands that read the
//! guest-phase layer's files (guest/README.md, ADR-0043), their replies, and the status that
//! follows from what they yield. What a phase or an EK certificate means, and the GuestReady
//! condition it gives, is the provider kit's (`banlieue_provider_kit::guest`), shared with
//! every backend. The calls themselves are made by `agent`.
//!
//! Everything here comes from inside a guest, which the host must not trust: replies are
//! bounded, malformed ones are errors, and nothing a guest writes can panic the provider.

use banlieue_api::LibvirtMachineStatus;
use banlieue_api::conditions::{self, Condition, reasons, status, types};
pub use banlieue_provider_kit::guest::{EkCertificate, Phase, still_settling};
use banlieue_provider_kit::guest::{guest_not_connected, guest_phase_absent, guest_ready};
use base64::Engine;
use serde::Deserialize;

/// The phase file of the guest-phase layer.
pub const PHASE_FILE: &str = "/run/banlieue/phase";

/// The EK certificate files, in the order they are recorded: RSA (NV index 0x01c00002), then
/// ECC (0x01c00016).
pub const EK_FILES: [&str; 2] = ["/run/banlieue/ek/rsa.pem", "/run/banlieue/ek/ecc.pem"];

/// The most bytes read from one guest file: the largest the layer writes, a handover's
/// answer with its firmware event log (a phase is at most `failed: ` and 1024 bytes; an EK
/// certificate as PEM is 1–2 KiB). More is not the layer speaking.
pub const MAX_GUEST_FILE_BYTES: usize = banlieue_api::handover::MAX_ANSWER_BYTES;

/// The most bytes of an agent reply parsed: a base64 read of [`MAX_GUEST_FILE_BYTES`] plus
/// the JSON around it.
pub const MAX_REPLY_BYTES: usize = MAX_GUEST_FILE_BYTES * 2;

/// `guest-file-open` of `path` for reading.
pub fn file_open(path: &str) -> String {
    serde_json::json!({"execute": "guest-file-open", "arguments": {"path": path, "mode": "r"}})
        .to_string()
}

/// `guest-file-open` of `path` for writing, truncating it: the layer's access file, which
/// the guest's path unit reads once it is closed.
pub fn file_open_for_writing(path: &str) -> String {
    serde_json::json!({"execute": "guest-file-open", "arguments": {"path": path, "mode": "w"}})
        .to_string()
}

/// `guest-file-write` of `bytes` at the handle's position.
pub fn file_write(handle: i64, bytes: &[u8]) -> String {
    let encoded = base64::engine::general_purpose::STANDARD.encode(bytes);
    serde_json::json!({"execute": "guest-file-write", "arguments": {"handle": handle, "buf-b64": encoded}})
        .to_string()
}

/// The count `guest-file-write` says it wrote, which must be all of `wanted` bytes.
pub fn parse_write(reply: &str, wanted: usize) -> Result<(), ReplyError> {
    const COMMAND: &str = "guest-file-write";
    #[derive(Deserialize)]
    struct Written {
        count: usize,
    }
    let written: Written = parse(COMMAND, reply)?;
    if written.count != wanted {
        return Err(reply_error(
            COMMAND,
            format!("wrote {} of {wanted} bytes", written.count),
        ));
    }
    Ok(())
}

/// `guest-file-read` of up to `count` bytes.
pub fn file_read(handle: i64, count: usize) -> String {
    serde_json::json!({"execute": "guest-file-read", "arguments": {"handle": handle, "count": count}})
        .to_string()
}

/// `guest-file-close`.
pub fn file_close(handle: i64) -> String {
    serde_json::json!({"execute": "guest-file-close", "arguments": {"handle": handle}}).to_string()
}

/// An agent reply that is not what the command promises.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the guest agent's reply to {command} {problem}")]
pub struct ReplyError {
    pub command: &'static str,
    pub problem: String,
}

fn reply_error(command: &'static str, problem: impl Into<String>) -> ReplyError {
    ReplyError {
        command,
        problem: problem.into(),
    }
}

#[derive(Deserialize)]
struct Reply<T> {
    #[serde(rename = "return")]
    value: T,
}

fn parse<T: serde::de::DeserializeOwned>(
    command: &'static str,
    reply: &str,
) -> Result<T, ReplyError> {
    if reply.len() > MAX_REPLY_BYTES {
        return Err(reply_error(
            command,
            format!("is {} bytes, more than {MAX_REPLY_BYTES}", reply.len()),
        ));
    }
    serde_json::from_str::<Reply<T>>(reply)
        .map(|r| r.value)
        .map_err(|e| reply_error(command, format!("is not understood: {e}")))
}

/// The handle `guest-file-open` returned.
pub fn parse_open(reply: &str) -> Result<i64, ReplyError> {
    parse("guest-file-open", reply)
}

/// One `guest-file-read` result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadChunk {
    pub bytes: Vec<u8>,
    pub eof: bool,
}

/// The bytes `guest-file-read` returned, checked against the count it claims.
pub fn parse_read(reply: &str) -> Result<ReadChunk, ReplyError> {
    const COMMAND: &str = "guest-file-read";
    #[derive(Deserialize)]
    struct Read {
        count: usize,
        #[serde(rename = "buf-b64")]
        buf: String,
        eof: bool,
    }
    let read: Read = parse(COMMAND, reply)?;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(read.buf.as_bytes())
        .map_err(|e| reply_error(COMMAND, format!("holds invalid base64: {e}")))?;
    if bytes.len() != read.count {
        return Err(reply_error(
            COMMAND,
            format!("says {} bytes but holds {}", read.count, bytes.len()),
        ));
    }
    Ok(ReadChunk {
        bytes,
        eof: read.eof,
    })
}

/// What reading the guest gave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GuestSight {
    /// The domain is not running, so there is no guest to ask.
    NotRunning,
    /// The agent did not answer (the message says what libvirt said).
    AgentUnavailable(String),
    /// The agent answered but the guest has no phase file.
    NoPhaseFile,
    /// The guest's phase, and what became of its EK certificates (read only for a tpmEnabled
    /// machine whose guest is `ready` and has none recorded yet).
    Phase { phase: Phase, ek: EkReading },
}

/// The EK certificates of a tpmEnabled guest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EkReading {
    /// Not read this time: the class has no TPM, the guest is not ready, or they are recorded.
    NotRead,
    /// Every certificate file the guest has, in [`EK_FILES`] order.
    Read(Vec<EkCertificate>),
    /// The guest said `ready` but no certificate could be read (the message says why).
    Unreadable(String),
}

/// The guest-related part of a machine's status.
#[derive(Debug, Clone, PartialEq)]
pub struct GuestStatus {
    pub guest_phase: Option<String>,
    pub certificates: Vec<String>,
    pub key_digests: Vec<String>,
    pub guest_ready: Condition,
    pub agent_connected: Condition,
}

/// The status that follows from `sight`, given the machine's status as recorded so far.
/// Certificates once recorded stay: a domain's vTPM keeps its EK for its whole life. A final
/// GuestReady (`ready` or `failed`) stays through a lost agent: the phase is final for the boot.
pub fn guest_status(
    sight: &GuestSight,
    tpm_enabled: bool,
    recorded: &LibvirtMachineStatus,
    generation: Option<i64>,
) -> GuestStatus {
    let mut certificates = recorded.contract.tpm_endorsement_certificates.clone();
    let mut key_digests = recorded.contract.tpm_endorsement_key_digests.clone();
    if let GuestSight::Phase {
        ek: EkReading::Read(read),
        ..
    } = sight
        && certificates.is_empty()
    {
        certificates = read.iter().map(|c| c.pem.clone()).collect();
        key_digests = read.iter().map(|c| c.key_digest.clone()).collect();
    }
    let final_ready = conditions::find(&recorded.contract.conditions, types::GUEST_READY)
        .filter(|c| !still_settling(c))
        .cloned();
    let (guest_phase, guest_ready) = match sight {
        GuestSight::NotRunning => (
            None,
            guest_not_connected("the domain is not running".to_owned(), generation),
        ),
        GuestSight::AgentUnavailable(why) => (
            // The phase read last stays shown, and a final GuestReady with it: a guest that
            // said `ready` and then lost its agent is still ready for this boot.
            recorded.contract.guest_phase.clone(),
            final_ready.unwrap_or_else(|| {
                guest_not_connected(
                    format!("the guest agent does not answer: {why}"),
                    generation,
                )
            }),
        ),
        GuestSight::NoPhaseFile => (
            None,
            guest_phase_absent(
                format!(
                    "the guest agent answers but {PHASE_FILE} does not exist: the image \
                     carries no guest-phase layer (guest/README.md), or it has not run yet"
                ),
                generation,
            ),
        ),
        GuestSight::Phase { phase, ek } => {
            let missing = || match ek {
                EkReading::Unreadable(why) => format!(
                    "the guest reports ready, but its EK certificates cannot be read: {why}"
                ),
                _ => "the guest reports ready; its EK certificates are not read yet".to_owned(),
            };
            (
                Some(phase.as_status()),
                guest_ready(phase, tpm_enabled, certificates.len(), missing, generation),
            )
        }
    };
    let agent_connected = match sight {
        GuestSight::NotRunning | GuestSight::AgentUnavailable(_) => conditions::new(
            types::AGENT_CONNECTED,
            status::FALSE,
            reasons::AGENT_NOT_CONNECTED,
            match sight {
                GuestSight::AgentUnavailable(why) => why.clone(),
                _ => "the domain is not running".to_owned(),
            },
            generation,
        ),
        _ => conditions::new(
            types::AGENT_CONNECTED,
            status::TRUE,
            reasons::AGENT_CONNECTED,
            "the guest agent answers",
            generation,
        ),
    };
    GuestStatus {
        guest_phase,
        certificates,
        key_digests,
        guest_ready,
        agent_connected,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use banlieue_api::MachineStatusContract;
    use rcgen::PublicKeyData;

    // A real swtpm EK certificate layout is not needed to test the parser: any X.509 works.
    fn certificate() -> (String, Vec<u8>) {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["ek".into()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        (cert.pem(), key.subject_public_key_info())
    }

    #[test]
    fn commands_are_the_agent_protocol() {
        assert_eq!(
            file_open(PHASE_FILE),
            r#"{"arguments":{"mode":"r","path":"/run/banlieue/phase"},"execute":"guest-file-open"}"#
        );
        assert_eq!(
            file_read(7, 16),
            r#"{"arguments":{"count":16,"handle":7},"execute":"guest-file-read"}"#
        );
        assert_eq!(
            file_close(7),
            r#"{"arguments":{"handle":7},"execute":"guest-file-close"}"#
        );
        assert_eq!(
            file_open_for_writing("/run/banlieue/access/wanted"),
            r#"{"arguments":{"mode":"w","path":"/run/banlieue/access/wanted"},"execute":"guest-file-open"}"#
        );
        assert_eq!(
            file_write(7, b"ready\n"),
            r#"{"arguments":{"buf-b64":"cmVhZHkK","handle":7},"execute":"guest-file-write"}"#
        );
    }

    #[test]
    fn a_write_must_be_whole() {
        assert_eq!(
            parse_write(r#"{"return": {"count": 6, "eof": false}}"#, 6),
            Ok(())
        );
        let short = parse_write(r#"{"return": {"count": 2, "eof": false}}"#, 6).unwrap_err();
        assert_eq!(short.problem, "wrote 2 of 6 bytes");
        assert!(parse_write(r#"{"error": {"desc": "no"}}"#, 6).is_err());
    }

    #[test]
    fn replies_are_checked() {
        assert_eq!(parse_open(r#"{"return": 1000}"#), Ok(1000));
        assert!(parse_open(r#"{"return": "x"}"#).is_err());
        assert_eq!(
            parse_read(r#"{"return": {"count": 6, "buf-b64": "cmVhZHkK", "eof": true}}"#),
            Ok(ReadChunk {
                bytes: b"ready\n".to_vec(),
                eof: true
            })
        );
        let lying = parse_read(r#"{"return": {"count": 9, "buf-b64": "cmVhZHkK", "eof": true}}"#)
            .unwrap_err();
        assert_eq!(lying.problem, "says 9 bytes but holds 6");
        assert!(parse_read(r#"{"return": {"count": 1, "buf-b64": "!!", "eof": true}}"#).is_err());
        let huge = format!(r#"{{"return": "{}"}}"#, "a".repeat(MAX_REPLY_BYTES));
        assert!(parse_open(&huge).unwrap_err().problem.contains("more than"));
    }

    fn status_of(sight: &GuestSight, tpm: bool, recorded: &[String]) -> GuestStatus {
        let recorded = LibvirtMachineStatus {
            contract: MachineStatusContract {
                tpm_endorsement_certificates: recorded.to_vec(),
                guest_phase: Some("configuring".into()),
                ..Default::default()
            },
            ..Default::default()
        };
        guest_status(sight, tpm, &recorded, Some(3))
    }

    #[test]
    fn guest_ready_follows_the_phase() {
        let s = status_of(
            &GuestSight::AgentUnavailable("not connected".into()),
            false,
            &[],
        );
        assert_eq!(
            (s.guest_ready.status.as_str(), s.guest_ready.reason.as_str()),
            (status::UNKNOWN, reasons::AGENT_NOT_CONNECTED)
        );
        assert_eq!(s.agent_connected.status, status::FALSE);
        assert_eq!(s.guest_phase.as_deref(), Some("configuring"));
        assert!(still_settling(&s.guest_ready));

        let s = status_of(&GuestSight::NoPhaseFile, false, &[]);
        assert_eq!(s.guest_ready.reason, reasons::GUEST_PHASE_ABSENT);
        assert_eq!(s.guest_ready.status, status::UNKNOWN);
        assert_eq!(s.agent_connected.status, status::TRUE);

        let pending = GuestSight::Phase {
            phase: Phase::Pending("installing".into()),
            ek: EkReading::NotRead,
        };
        let s = status_of(&pending, false, &[]);
        assert_eq!(
            (s.guest_ready.status.as_str(), s.guest_ready.reason.as_str()),
            (status::FALSE, reasons::GUEST_PHASE_PENDING)
        );
        assert_eq!(s.guest_phase.as_deref(), Some("installing"));

        let failed = GuestSight::Phase {
            phase: Phase::Failed("cloud-init: boom".into()),
            ek: EkReading::NotRead,
        };
        let s = status_of(&failed, false, &[]);
        assert_eq!(s.guest_ready.reason, reasons::GUEST_PHASE_FAILED);
        assert_eq!(s.guest_phase.as_deref(), Some("failed: cloud-init: boom"));
        assert!(!still_settling(&s.guest_ready), "a failed boot is final");

        let ready = GuestSight::Phase {
            phase: Phase::Ready,
            ek: EkReading::NotRead,
        };
        let s = status_of(&ready, false, &[]);
        assert_eq!(
            (s.guest_ready.status.as_str(), s.guest_ready.reason.as_str()),
            (status::TRUE, reasons::GUEST_PHASE_READY)
        );
        assert!(!still_settling(&s.guest_ready));
    }

    #[test]
    fn a_tpm_guest_is_not_ready_before_its_certificates_are_recorded() {
        let (pem, _) = certificate();
        let ek = EkCertificate::from_pem(pem.as_bytes()).unwrap();
        let unreadable = GuestSight::Phase {
            phase: Phase::Ready,
            ek: EkReading::Unreadable("no file".into()),
        };
        let s = status_of(&unreadable, true, &[]);
        assert_eq!(
            (s.guest_ready.status.as_str(), s.guest_ready.reason.as_str()),
            (status::FALSE, reasons::ENDORSEMENT_CERTIFICATES_MISSING)
        );
        assert!(s.guest_ready.message.contains("no file"));
        assert!(still_settling(&s.guest_ready));

        let read = GuestSight::Phase {
            phase: Phase::Ready,
            ek: EkReading::Read(vec![ek.clone()]),
        };
        let s = status_of(&read, true, &[]);
        assert_eq!(s.guest_ready.status, status::TRUE);
        assert_eq!(s.certificates, vec![ek.pem.clone()]);
        assert_eq!(s.key_digests, vec![ek.key_digest.clone()]);

        // Recorded once, kept: a later reading (not read) does not clear them.
        let later = GuestSight::Phase {
            phase: Phase::Ready,
            ek: EkReading::NotRead,
        };
        let recorded = LibvirtMachineStatus {
            contract: MachineStatusContract {
                tpm_endorsement_certificates: vec![ek.pem.clone()],
                tpm_endorsement_key_digests: vec![ek.key_digest.clone()],
                ..Default::default()
            },
            ..Default::default()
        };
        let s = guest_status(&later, true, &recorded, None);
        assert_eq!(s.guest_ready.status, status::TRUE);
        assert_eq!(s.certificates, vec![ek.pem]);
    }

    #[test]
    fn a_final_guest_ready_outlives_the_agent() {
        let gone = GuestSight::AgentUnavailable("not connected".into());
        for (ready, phase) in [
            (
                status_of(
                    &GuestSight::Phase {
                        phase: Phase::Ready,
                        ek: EkReading::NotRead,
                    },
                    false,
                    &[],
                ),
                "ready",
            ),
            (
                status_of(
                    &GuestSight::Phase {
                        phase: Phase::Failed("boom".into()),
                        ek: EkReading::NotRead,
                    },
                    false,
                    &[],
                ),
                "failed: boom",
            ),
        ] {
            let mut recorded = LibvirtMachineStatus {
                contract: MachineStatusContract {
                    guest_phase: Some(phase.into()),
                    ..Default::default()
                },
                ..Default::default()
            };
            conditions::set(
                &mut recorded.contract.conditions,
                ready.guest_ready.clone(),
                now(),
            );
            let s = guest_status(&gone, false, &recorded, Some(4));
            assert_eq!(
                (&s.guest_ready.status, &s.guest_ready.reason),
                (&ready.guest_ready.status, &ready.guest_ready.reason),
                "{phase} stays"
            );
            assert_eq!(s.guest_phase.as_deref(), Some(phase));
            assert_eq!(s.agent_connected.status, status::FALSE);
            // A stopped domain is a new boot to come: nothing of the old one is claimed.
            let s = guest_status(&GuestSight::NotRunning, false, &recorded, Some(4));
            assert_eq!(s.guest_ready.status, status::UNKNOWN);
        }
    }

    fn now() -> k8s_openapi::apimachinery::pkg::apis::meta::v1::Time {
        k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::now())
    }
}

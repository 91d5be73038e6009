//! The guest-phase layer's contract as every backend reads it (guest/README.md, ADR-0043):
//! the phase a guest reports, the EK certificates of its vTPM, and the GuestReady condition
//! that follows. How a backend observes them (a file read through qemu-guest-agent, a
//! guestinfo variable, a vTPM device's certificates) is its own business; what they mean is
//! decided here, once.
//!
//! Everything here comes from inside a guest, which the host must not trust: input is bounded,
//! never assumed to be UTF-8 or one line, and nothing a guest writes can panic a provider.

use banlieue_api::conditions::{self, Condition, reasons, status, types};
use base64::Engine as _;
use sha2::{Digest, Sha256};

/// The most bytes of a phase kept: the guest writes it, so it is bounded before it reaches a
/// status.
pub const MAX_PHASE_BYTES: usize = 1024;

/// What the guest-phase layer says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Phase {
    /// `ready`: boot is over and, with a TPM, the EK certificates are in place.
    Ready,
    /// `failed: <why>`.
    Failed(String),
    /// Anything else (`configuring`, `installing`, an author's own): not yet.
    Pending(String),
}

impl Phase {
    /// Reads what the guest wrote: the first line of at most [`MAX_PHASE_BYTES`], control
    /// characters dropped, bytes that are not UTF-8 shown as U+FFFD.
    pub fn parse(bytes: &[u8]) -> Phase {
        // A character cut at the bound would show as U+FFFD: read a little past it, then cut
        // the text at a character boundary.
        let text = String::from_utf8_lossy(&bytes[..bytes.len().min(MAX_PHASE_BYTES + 3)]);
        let mut end = text.len().min(MAX_PHASE_BYTES);
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        let line = text[..end].lines().next().unwrap_or_default().trim();
        let line: String = line.chars().filter(|c| !c.is_control()).collect();
        if line == "ready" {
            Phase::Ready
        } else if let Some(why) = line.strip_prefix("failed:") {
            Phase::Failed(why.trim().to_owned())
        } else {
            Phase::Pending(line)
        }
    }

    /// How the phase is shown in `status.guestPhase`.
    pub fn as_status(&self) -> String {
        match self {
            Phase::Ready => "ready".to_owned(),
            Phase::Failed(why) => format!("failed: {why}"),
            Phase::Pending(phase) => phase.clone(),
        }
    }
}

/// An EK certificate as recorded in a machine's status: its PEM and the digest of its public
/// key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EkCertificate {
    /// One certificate, re-encoded from its DER with 64-column lines.
    pub pem: String,
    /// `sha256:<hex>` of the DER SubjectPublicKeyInfo.
    pub key_digest: String,
}

impl EkCertificate {
    /// Reads one EK certificate file a guest published: exactly one PEM certificate whose DER
    /// parses as X.509. The bytes are recorded as issued; swtpm's EK certificates carry a
    /// critical SubjectAltName (a TPM directory name) that X.509 path validators reject,
    /// which is the verifier's business, not a reason to refuse the certificate here.
    pub fn from_pem(bytes: &[u8]) -> Result<EkCertificate, String> {
        let (rest, pem) = x509_parser::pem::parse_x509_pem(bytes)
            .map_err(|e| format!("is not a PEM certificate: {e}"))?;
        if pem.label != "CERTIFICATE" {
            return Err(format!("holds a PEM {:?}, not a CERTIFICATE", pem.label));
        }
        if !String::from_utf8_lossy(rest).trim().is_empty() {
            return Err("holds more than one PEM block".to_owned());
        }
        EkCertificate::from_der(&pem.contents)
    }

    /// A DER certificate, as a hypervisor hands out its vTPM's.
    pub fn from_der(der: &[u8]) -> Result<EkCertificate, String> {
        let (_, cert) = x509_parser::parse_x509_certificate(der)
            .map_err(|e| format!("is not an X.509 certificate: {e}"))?;
        let key_digest = format!("sha256:{}", hex(&Sha256::digest(cert.public_key().raw)));
        let body = base64::engine::general_purpose::STANDARD.encode(der);
        let mut pem = String::from("-----BEGIN CERTIFICATE-----\n");
        for line in body.as_bytes().chunks(64) {
            pem.push_str(&String::from_utf8_lossy(line));
            pem.push('\n');
        }
        pem.push_str("-----END CERTIFICATE-----\n");
        Ok(EkCertificate { pem, key_digest })
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// GuestReady from the phase a running guest reports. `recorded` is how many EK certificates
/// the machine's status holds; a tpmEnabled guest is not ready before it holds one, and
/// `missing` says why in the backend's words (what it could not read, or where it looked).
pub fn guest_ready(
    phase: &Phase,
    tpm_enabled: bool,
    recorded: usize,
    missing: impl FnOnce() -> String,
    generation: Option<i64>,
) -> Condition {
    let condition = |status: &str, reason: &str, message: String| {
        conditions::new(types::GUEST_READY, status, reason, message, generation)
    };
    match phase {
        Phase::Failed(why) => condition(
            status::FALSE,
            reasons::GUEST_PHASE_FAILED,
            format!("the guest reports failed: {why}"),
        ),
        Phase::Pending(p) => condition(
            status::FALSE,
            reasons::GUEST_PHASE_PENDING,
            format!("the guest reports phase {p:?}, not ready yet"),
        ),
        Phase::Ready if tpm_enabled && recorded == 0 => condition(
            status::FALSE,
            reasons::ENDORSEMENT_CERTIFICATES_MISSING,
            missing(),
        ),
        Phase::Ready => condition(
            status::TRUE,
            reasons::GUEST_PHASE_READY,
            if tpm_enabled {
                format!("the guest reports ready; {recorded} EK certificate(s) recorded")
            } else {
                "the guest reports ready".to_owned()
            },
        ),
    }
}

/// GuestReady while there is no guest to ask: the machine does not run, or its agent does
/// not answer. `message` says which.
pub fn guest_not_connected(message: String, generation: Option<i64>) -> Condition {
    conditions::new(
        types::GUEST_READY,
        status::UNKNOWN,
        reasons::AGENT_NOT_CONNECTED,
        message,
        generation,
    )
}

/// GuestReady of a running guest that reports no phase. `message` says where the backend
/// looked.
pub fn guest_phase_absent(message: String, generation: Option<i64>) -> Condition {
    conditions::new(
        types::GUEST_READY,
        status::UNKNOWN,
        reasons::GUEST_PHASE_ABSENT,
        message,
        generation,
    )
}

/// Whether the guest must be looked at again soon: it has not reached a final phase for this
/// boot, or a tpmEnabled guest's certificates are still missing. Once it is ready (or failed)
/// only events and the resync read it again.
pub fn still_settling(guest_ready: &Condition) -> bool {
    guest_ready.status != status::TRUE && guest_ready.reason != reasons::GUEST_PHASE_FAILED
}

#[cfg(test)]
mod tests {
    use super::*;
    use rcgen::PublicKeyData;

    // Any X.509 certificate exercises the parser; a real swtpm layout is not needed.
    fn certificate() -> (String, Vec<u8>) {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["ek".into()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        (cert.pem(), key.subject_public_key_info())
    }

    #[test]
    fn phases_are_read_as_the_contract_says() {
        assert_eq!(Phase::parse(b"ready\n"), Phase::Ready);
        assert_eq!(
            Phase::parse(b"failed: cloud-init: boom\n"),
            Phase::Failed("cloud-init: boom".into())
        );
        assert_eq!(
            Phase::parse(b"configuring\n"),
            Phase::Pending("configuring".into())
        );
        assert_eq!(
            Phase::parse(b"installing\nready\n"),
            Phase::Pending("installing".into())
        );
        // Not UTF-8, control characters: shown, never trusted.
        assert_eq!(
            Phase::parse(b"\xffre\x1bady"),
            Phase::Pending("\u{fffd}ready".into())
        );
        assert_eq!(Phase::parse("re\u{1b}ady".as_bytes()), Phase::Ready);
        assert_eq!(Phase::parse(b""), Phase::Pending(String::new()));
    }

    #[test]
    fn a_long_phase_is_cut_at_a_character_boundary() {
        let long = "é".repeat(MAX_PHASE_BYTES);
        let shown = Phase::parse(long.as_bytes()).as_status();
        assert_eq!(shown, "é".repeat(MAX_PHASE_BYTES / 2));
        let odd = format!("x{long}");
        let shown = Phase::parse(odd.as_bytes()).as_status();
        assert!(shown.len() <= MAX_PHASE_BYTES && !shown.contains('\u{fffd}'));
        assert_eq!(
            Phase::parse(format!("failed: {}", "y".repeat(4096)).as_bytes()),
            Phase::Failed("y".repeat(MAX_PHASE_BYTES - "failed: ".len()))
        );
    }

    #[test]
    fn an_ek_certificate_is_recorded_with_its_key_digest() {
        let (pem, spki) = certificate();
        let ek = EkCertificate::from_pem(pem.as_bytes()).unwrap();
        assert_eq!(
            ek.key_digest,
            format!("sha256:{}", hex(&Sha256::digest(&spki)))
        );
        // Re-encoded with the same DER, and the same from the DER itself.
        let (_, a) = x509_parser::pem::parse_x509_pem(pem.as_bytes()).unwrap();
        let (_, b) = x509_parser::pem::parse_x509_pem(ek.pem.as_bytes()).unwrap();
        assert_eq!(a.contents, b.contents);
        assert_eq!(EkCertificate::from_der(&a.contents).unwrap(), ek);
    }

    #[test]
    fn bad_ek_files_are_refused_with_a_reason() {
        let (pem, _) = certificate();
        assert!(EkCertificate::from_pem(b"not pem").is_err());
        let twice = format!("{pem}{pem}");
        assert_eq!(
            EkCertificate::from_pem(twice.as_bytes()).unwrap_err(),
            "holds more than one PEM block"
        );
        let key = "-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n";
        assert!(
            EkCertificate::from_pem(key.as_bytes())
                .unwrap_err()
                .contains("PUBLIC KEY")
        );
        let garbage = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";
        assert!(
            EkCertificate::from_pem(garbage.as_bytes())
                .unwrap_err()
                .contains("not an X.509")
        );
        assert!(EkCertificate::from_der(b"\x30\x03\x02\x01\x01").is_err());
    }

    #[test]
    fn guest_ready_follows_the_phase_and_the_certificates() {
        let missing = || "no certificate".to_owned();
        let c = guest_ready(
            &Phase::Pending("installing".into()),
            false,
            0,
            missing,
            Some(3),
        );
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("False", reasons::GUEST_PHASE_PENDING)
        );
        assert_eq!(c.observed_generation, Some(3));
        let c = guest_ready(&Phase::Failed("boom".into()), false, 0, missing, None);
        assert_eq!(c.reason, reasons::GUEST_PHASE_FAILED);
        assert!(!still_settling(&c), "failed is final for the boot");
        let c = guest_ready(&Phase::Ready, true, 0, missing, None);
        assert_eq!(
            (c.status.as_str(), c.reason.as_str(), c.message.as_str()),
            (
                "False",
                reasons::ENDORSEMENT_CERTIFICATES_MISSING,
                "no certificate"
            )
        );
        assert!(still_settling(&c));
        let c = guest_ready(&Phase::Ready, true, 2, missing, None);
        assert_eq!(
            (c.status.as_str(), c.message.as_str()),
            (
                "True",
                "the guest reports ready; 2 EK certificate(s) recorded"
            )
        );
        assert!(!still_settling(&c));
        let c = guest_ready(&Phase::Ready, false, 0, missing, None);
        assert_eq!(c.message, "the guest reports ready");
        assert!(still_settling(&guest_not_connected("gone".into(), None)));
        assert!(still_settling(&guest_phase_absent("none".into(), None)));
    }
}

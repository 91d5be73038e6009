//! The subject's whole check of a handover, from what it reads on its claim and nothing else
//! (ADR-0077). Two steps, with the claim in between:
//!
//! 1. [`Challenge::new`]: the claim's EK certificate must chain to the trust bundle the
//!    subject holds; the endorsement key is taken from that certificate (never from the
//!    guest); the attestation key on the claim must be a TPM's restricted signing key; a
//!    credential is made for it under that EK, with a fresh secret, and a binding of a fresh
//!    nonce, the claim's UID and its subject. The subject writes both to the claim.
//! 2. [`Challenge::check`]: the answer relayed back must release that very secret (only the
//!    TPM holding the EK's private key could, and only to that AK), and carry a quote by the
//!    AK over the binding and the host keys the claim shows, over the PCR values it shows.
//!
//! Each step is recorded in words ([`Challenge::steps`], [`Verified::steps`]), and each
//! refusal names the check that failed ([`VerifyError`]).

use std::time::{SystemTime, UNIX_EPOCH};

use rsa::rand_core::CryptoRngCore;
use sha2::{Digest, Sha256};
use x509_parser::certificate::X509Certificate;
use x509_parser::public_key::PublicKey as SpkiKey;

use crate::event_log::{EventLog, EventLogError};
use crate::make_credential;
use crate::public::{Public, PublicKey};
use crate::quote::{QuoteError, binding, extra_data, hex, verify_quote};

/// The most certificates a trust bundle or a claim may hold, and the longest chain followed.
const MAX_CERTIFICATES: usize = 16;
const MAX_CHAIN: usize = 4;

/// What the subject read on its claim: the claim's identity and what its status shows.
#[derive(Clone, Debug, Default)]
pub struct ClaimView {
    /// `metadata.uid`.
    pub uid: String,
    /// `spec.subject`: its issuer and id.
    pub subject_issuer: String,
    pub subject_id: String,
    /// `status.tpmEndorsementCertificates` (PEM).
    pub ek_certificates: Vec<String>,
    /// `status.attestation.attestationKey` (base64 TPM2B_PUBLIC).
    pub attestation_key: Option<String>,
    /// `status.sshHostKeys` (`TYPE BASE64`).
    pub ssh_host_keys: Vec<String>,
}

/// The relayed answer, as the claim shows it (`status.attestation.answer`).
#[derive(Clone, Debug, Default)]
pub struct AnswerView {
    /// The SHA-256 (hex) of the credential answered.
    pub challenge: String,
    pub activated: Option<String>,
    pub quote: Option<String>,
    pub signature: Option<String>,
    pub pcr_values: Option<String>,
    pub host_keys: Option<String>,
    /// Where the guest wrote the sealed payload it opened.
    pub opened: Option<String>,
    /// The firmware's event log of the guest's boot (base64), where the firmware keeps one.
    pub event_log: Option<String>,
    pub failure: Option<String>,
}

/// Why a handover was not verified: the check that failed.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum VerifyError {
    #[error("the claim carries no EK certificate: its VM has no TPM to attest")]
    NoCertificate,
    #[error("the trust bundle holds no certificate: {0}")]
    EmptyBundle(String),
    #[error("EK certificate: {0}")]
    Certificate(String),
    #[error("EK certificate does not chain to the trust bundle: {0}")]
    Untrusted(String),
    #[error("the claim carries no attestation key: its guest published none")]
    NoAttestationKey,
    #[error("the attestation key on the claim is not a TPM's attestation key: {0}")]
    AttestationKey(String),
    #[error("the claim's subject cannot be bound: {0}")]
    Subject(String),
    #[error("the guest refused the challenge: {0}")]
    Refused(String),
    #[error("the answer is to another challenge ({0})")]
    OtherChallenge(String),
    #[error(
        "the secret released is not the credential's: the attestation key on the claim is not in the TPM whose EK certificate the claim carries"
    )]
    NotActivated,
    #[error("the guest did not say where it put the sealed payload")]
    NotOpened,
    #[error("the payload cannot be sealed: {0}")]
    Seal(crate::seal::SealError),
    #[error("the answer cannot be read: {0}")]
    Malformed(String),
    #[error("quote: {0}")]
    Quote(QuoteError),
    #[error("event log: {0}")]
    EventLog(EventLogError),
    #[error("PCR {pcr} is {quoted}, not the reference value {reference} declared for the image")]
    Reference {
        pcr: u32,
        quoted: String,
        reference: String,
    },
    #[error(
        "the guest's TPM quoted host keys other than the claim's: the claim shows [{claim}], the quoted guest holds [{quoted}]"
    )]
    HostKeys { claim: String, quoted: String },
}

/// PCR reference values (SHA-256 bank): what a boot of an image measures on its hosts, as
/// whoever publishes the image declares it. Written one PCR a line, `PCR HEX` (`#` begins a
/// comment), the form [`PcrReferences::render`] writes from a verified handover.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PcrReferences(pub Vec<(u32, [u8; 32])>);

impl PcrReferences {
    /// The most lines a reference file may have.
    const MAX_LINES: usize = 256;

    /// Parses the text form; a PCR named twice, out of 0-23 or a value not 64 hex digits is
    /// refused with its line number.
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut out: Vec<(u32, [u8; 32])> = Vec::new();
        for (number, line) in text.lines().enumerate().take(Self::MAX_LINES + 1) {
            if number == Self::MAX_LINES {
                return Err(format!("over {} lines", Self::MAX_LINES));
            }
            let line = line.split('#').next().unwrap_or_default().trim();
            if line.is_empty() {
                continue;
            }
            let at = number + 1;
            let mut fields = line.split_whitespace();
            let (Some(pcr), Some(value), None) = (fields.next(), fields.next(), fields.next())
            else {
                return Err(format!("line {at}: not `PCR SHA256-HEX`"));
            };
            let pcr: u32 = pcr
                .parse()
                .ok()
                .filter(|p| *p < 24)
                .ok_or_else(|| format!("line {at}: {pcr:?} is not a PCR 0-23"))?;
            let value = parse_hex32(value)
                .ok_or_else(|| format!("line {at}: the value is not 64 hex digits"))?;
            if out.iter().any(|(p, _)| *p == pcr) {
                return Err(format!("line {at}: PCR {pcr} is named twice"));
            }
            out.push((pcr, value));
        }
        Ok(PcrReferences(out))
    }

    /// The text form of `pcrs` (a verified handover's), as `parse` reads it.
    pub fn render(pcrs: &[(u32, Vec<u8>)]) -> String {
        pcrs.iter()
            .map(|(pcr, value)| format!("{pcr} {}\n", hex(value)))
            .collect()
    }

    /// Checks the quoted SHA-256 values (`(pcr, value)`) against these references: the step
    /// that says so, none without references, or the first PCR that differs.
    fn check(&self, quoted: &[(u32, &[u8])]) -> Result<Option<String>, VerifyError> {
        if self.0.is_empty() {
            return Ok(None);
        }
        for (pcr, reference) in &self.0 {
            let value = quoted.iter().find(|(p, _)| p == pcr).map(|(_, v)| *v);
            if value != Some(reference.as_slice()) {
                return Err(VerifyError::Reference {
                    pcr: *pcr,
                    quoted: value.map_or_else(|| "not quoted".into(), hex),
                    reference: hex(reference),
                });
            }
        }
        let list: Vec<String> = self.0.iter().map(|(p, _)| p.to_string()).collect();
        Ok(Some(format!(
            "reference values: PCRs {} hold the values declared for the image",
            list.join(",")
        )))
    }
}

/// The firmware's event log relayed with the answer (base64), replayed to the quoted SHA-256
/// values (`(pcr, value)`); the step that says what it showed, or that none came.
fn replay_event_log(
    log: Option<&str>,
    quoted: &[(u32, &[u8])],
    steps: &mut Vec<String>,
) -> Result<Option<EventLog>, VerifyError> {
    let Some(log) = log else {
        steps.push(
            "event log: none relayed (the guest's firmware keeps none): the PCR values stand as quoted".into(),
        );
        return Ok(None);
    };
    let bytes = decode(log).map_err(|why| VerifyError::Malformed(format!("event log: {why}")))?;
    let log = EventLog::parse(&bytes).map_err(VerifyError::EventLog)?;
    log.check(quoted).map_err(VerifyError::EventLog)?;
    let per_pcr: Vec<String> = quoted
        .iter()
        .map(|(pcr, _)| format!("{pcr}: {}", log.events_in(*pcr)))
        .collect();
    steps.push(format!(
        "event log: the firmware's {} events replay to the quoted values (events per PCR {})",
        log.events.len(),
        per_pcr.join(", ")
    ));
    Ok(Some(log))
}

fn parse_hex32(text: &str) -> Option<[u8; 32]> {
    if text.len() != 64 || !text.is_ascii() {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&text[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

/// A challenge made for one claim, kept by the subject until the answer comes.
pub struct Challenge {
    credential: Vec<u8>,
    binding: [u8; 32],
    secret: [u8; 32],
    /// A payload sealed to the secret, for the guest to open.
    sealed: Option<Vec<u8>>,
    ak: Public,
    host_keys: Vec<String>,
    /// The values the quoted PCRs must hold, where the subject has them for the image.
    references: PcrReferences,
    steps: Vec<String>,
}

/// Never the secret.
impl std::fmt::Debug for Challenge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Challenge")
            .field("digest", &self.digest())
            .field("binding", &self.binding_hex())
            .finish_non_exhaustive()
    }
}

/// What a verified handover proved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verified {
    /// The quoted SHA-256 PCRs (the guest quotes 0-7), each with its value, as checked
    /// against the quote.
    pub pcrs: Vec<(u32, Vec<u8>)>,
    /// The TPM's reset count at the quote: a verifier can tell a TPM reset between quotes.
    pub reset_count: u32,
    /// Where the guest put the sealed payload, for a sealing challenge.
    pub opened: Option<String>,
    /// The firmware's event log, replayed to the quoted values: what each PCR measured.
    pub event_log: Option<EventLog>,
    /// Each check, in words.
    pub steps: Vec<String>,
}

impl Challenge {
    /// Checks the claim's EK certificate against `trust_bundle` (PEM: the Provider's
    /// `ekTrustBundle`, as the subject obtained it) at `now`, and makes a challenge for the
    /// attestation key the claim shows.
    pub fn new(
        claim: &ClaimView,
        trust_bundle: &str,
        now: SystemTime,
        rng: &mut impl CryptoRngCore,
    ) -> Result<Challenge, VerifyError> {
        Challenge::make(claim, trust_bundle, now, None, rng)
    }

    /// As [`Challenge::new`], with `payload` sealed to the credential's secret: only the TPM
    /// that activates the credential, that of the certified EK holding the claimed AK, can
    /// give the guest the key that opens it.
    pub fn sealing(
        claim: &ClaimView,
        trust_bundle: &str,
        now: SystemTime,
        payload: &[u8],
        rng: &mut impl CryptoRngCore,
    ) -> Result<Challenge, VerifyError> {
        Challenge::make(claim, trust_bundle, now, Some(payload), rng)
    }

    fn make(
        claim: &ClaimView,
        trust_bundle: &str,
        now: SystemTime,
        payload: Option<&[u8]>,
        rng: &mut impl CryptoRngCore,
    ) -> Result<Challenge, VerifyError> {
        let mut steps = Vec::new();
        if claim.ek_certificates.is_empty() {
            return Err(VerifyError::NoCertificate);
        }
        let bundle = pem_certificates(trust_bundle.as_bytes())
            .map_err(|why| VerifyError::EmptyBundle(why.to_string()))?;
        if bundle.is_empty() {
            return Err(VerifyError::EmptyBundle("no PEM certificate in it".into()));
        }
        let at = now
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs() as i64)
            .unwrap_or_default();
        let ek = endorsement_key(claim, &bundle, at, &mut steps)?;

        let ak_bytes = decode(
            claim
                .attestation_key
                .as_deref()
                .ok_or(VerifyError::NoAttestationKey)?,
        )
        .map_err(VerifyError::AttestationKey)?;
        let ak = Public::from_tpm2b(&ak_bytes)
            .and_then(|ak| ak.check_attestation_key().map(|()| ak))
            .map_err(|e| VerifyError::AttestationKey(e.to_string()))?;
        steps.push(format!(
            "attestation key: a restricted signing key of a TPM, Name {}",
            hex(&ak.name())
        ));

        for part in [&claim.subject_issuer, &claim.subject_id, &claim.uid] {
            if part.contains(['\n', '\r']) {
                return Err(VerifyError::Subject("a line break in it".into()));
            }
        }
        let mut nonce = [0u8; 32];
        rng.fill_bytes(&mut nonce);
        let subject = format!("{}\n{}", claim.subject_issuer, claim.subject_id);
        let binding = binding(&nonce, &claim.uid, &subject);
        let mut secret = [0u8; 32];
        rng.fill_bytes(&mut secret);
        let sealed = match payload {
            None => None,
            Some(payload) => {
                let mut iv = [0u8; 16];
                rng.fill_bytes(&mut iv);
                let sealed = crate::seal::seal(&secret, payload, iv).map_err(VerifyError::Seal)?;
                steps.push(format!(
                    "sealed: {} bytes to the credential's secret (AES-256-CTR, HMAC-SHA256)",
                    payload.len()
                ));
                Some(sealed)
            }
        };
        let credential = make_credential(&ek, &ak.name(), &secret, rng)
            .map_err(|e| VerifyError::Certificate(format!("no credential for its key: {e}")))?
            .tpm2_tools_file();
        steps.push(format!(
            "challenge: a credential for that Name under the certified EK, and a fresh nonce bound to claim {} and subject {} at {}",
            claim.uid, claim.subject_id, claim.subject_issuer
        ));
        Ok(Challenge {
            credential,
            binding,
            secret,
            sealed,
            ak,
            host_keys: claim.ssh_host_keys.clone(),
            references: PcrReferences::default(),
            steps,
        })
    }

    /// The PCR values the quote must show (the image's reference values, as the subject
    /// obtained them): checked once the quote is, each refusal naming the PCR.
    pub fn with_references(mut self, references: PcrReferences) -> Self {
        self.references = references;
        self
    }

    /// The credential, base64, for `spec.handover.credential`.
    pub fn credential_base64(&self) -> String {
        use base64::Engine;
        base64::engine::general_purpose::STANDARD.encode(&self.credential)
    }

    /// The sealed payload, base64, for `spec.handover.sealed`.
    pub fn sealed_base64(&self) -> Option<String> {
        use base64::Engine;
        let sealed = self.sealed.as_ref()?;
        Some(base64::engine::general_purpose::STANDARD.encode(sealed))
    }

    /// The binding, hex, for `spec.handover.binding`.
    pub fn binding_hex(&self) -> String {
        hex(&self.binding)
    }

    /// The SHA-256 (hex) of the credential: what the answer to this challenge names.
    pub fn digest(&self) -> String {
        hex(&Sha256::digest(&self.credential))
    }

    /// The checks made so far.
    pub fn steps(&self) -> &[String] {
        &self.steps
    }

    /// Checks the answer relayed to this challenge.
    pub fn check(&self, answer: &AnswerView) -> Result<Verified, VerifyError> {
        let mut steps = self.steps.clone();
        if answer.challenge != self.digest() {
            return Err(VerifyError::OtherChallenge(answer.challenge.clone()));
        }
        if let Some(why) = &answer.failure {
            return Err(VerifyError::Refused(why.clone()));
        }
        let released = answer.activated.as_deref().unwrap_or_default();
        let proof = crate::seal::proof(&self.secret);
        // In time independent of where they differ (slices of other lengths are unequal).
        if !bool::from(subtle::ConstantTimeEq::ct_eq(
            released.as_bytes(),
            proof.as_bytes(),
        )) {
            return Err(VerifyError::NotActivated);
        }
        steps.push(
            "activation: the guest's TPM released the credential's secret to the attestation key: it holds the certified EK".into(),
        );

        let field = |value: &Option<String>, what: &str| -> Result<Vec<u8>, VerifyError> {
            decode(value.as_deref().unwrap_or_default())
                .map_err(|why| VerifyError::Malformed(format!("{what}: {why}")))
        };
        let attest = field(&answer.quote, "quote")?;
        let signature = field(&answer.signature, "signature")?;
        let pcr_bytes = field(&answer.pcr_values, "PCR values")?;
        if pcr_bytes.len() % 32 != 0 || pcr_bytes.len() > 24 * 32 {
            return Err(VerifyError::Malformed(format!(
                "{} bytes of PCR values",
                pcr_bytes.len()
            )));
        }
        let pcr_values: Vec<Vec<u8>> = pcr_bytes.chunks(32).map(<[u8]>::to_vec).collect();
        let quoted_keys = String::from_utf8(field(&answer.host_keys, "host keys")?)
            .map_err(|_| VerifyError::Malformed("the host keys are not text".into()))?;
        let quoted_keys: Vec<String> = quoted_keys.lines().map(str::to_owned).collect();

        // The quote over the host keys the guest says it hashed: it proves those are the
        // keys of the TPM's guest; then they must be the claim's.
        let expected = extra_data(&self.binding, &quoted_keys)
            .ok_or_else(|| VerifyError::Malformed("a host key spans lines".into()))?;
        let quote = verify_quote(&self.ak, &attest, &signature, &expected, Some(&pcr_values))
            .map_err(VerifyError::Quote)?;
        steps.push(format!(
            "quote: signed by the attestation key, carrying this challenge's binding, over PCRs {} (TPM resets {})",
            describe_selection(&quote.pcr_selection),
            quote.reset_count
        ));
        // The quoted SHA-256 values by PCR, in the selection's order.
        let mut pcrs: Vec<(u32, Vec<u8>)> = Vec::new();
        let mut values = pcr_values.into_iter();
        for (hash, indices) in &quote.pcr_selection {
            for pcr in indices {
                let Some(value) = values.next() else { break };
                if *hash == crate::public::ALG_SHA256 {
                    pcrs.push((u32::from(*pcr), value));
                }
            }
        }
        let quoted_pcrs: Vec<(u32, &[u8])> = pcrs
            .iter()
            .map(|(pcr, value)| (*pcr, value.as_slice()))
            .collect();
        let event_log = replay_event_log(answer.event_log.as_deref(), &quoted_pcrs, &mut steps)?;
        if let Some(step) = self.references.check(&quoted_pcrs)? {
            steps.push(step);
        }
        let mut claimed = self.host_keys.clone();
        claimed.sort();
        let mut quoted = quoted_keys;
        quoted.sort();
        if claimed != quoted {
            return Err(VerifyError::HostKeys {
                claim: claimed.join(", "),
                quoted: quoted.join(", "),
            });
        }
        steps.push(format!(
            "host keys: the claim's {} SSH host key(s) are those the quoted guest holds",
            claimed.len()
        ));
        let opened = match &self.sealed {
            None => None,
            Some(_) => {
                let opened = answer.opened.clone().ok_or(VerifyError::NotOpened)?;
                steps.push(format!(
                    "sealed payload: opened by the verified guest, at {opened}"
                ));
                Some(opened)
            }
        };
        Ok(Verified {
            pcrs,
            reset_count: quote.reset_count,
            opened,
            event_log,
            steps,
        })
    }
}

/// The EK of the claim's first RSA certificate that chains to `bundle`, as the TPM makes it
/// from the default template. (The guest's AK is made under its RSA EK; an ECC EK's
/// certificate is checked too but not used: see ADR-0077.)
fn endorsement_key(
    claim: &ClaimView,
    bundle: &[Vec<u8>],
    at: i64,
    steps: &mut Vec<String>,
) -> Result<Public, VerifyError> {
    let mut rsa = None;
    for (index, pem) in claim
        .ek_certificates
        .iter()
        .take(MAX_CERTIFICATES)
        .enumerate()
    {
        let ders = pem_certificates(pem.as_bytes())
            .map_err(|why| VerifyError::Certificate(format!("{index}: {why}")))?;
        let [der] = ders.as_slice() else {
            return Err(VerifyError::Certificate(format!(
                "{index} holds {} certificates, not one",
                ders.len()
            )));
        };
        let (_, cert) = x509_parser::parse_x509_certificate(der)
            .map_err(|e| VerifyError::Certificate(format!("{index}: {e}")))?;
        let chain = chain_to(&cert, bundle, at)?;
        steps.push(format!(
            "EK certificate {index} ({}): chains to the trust bundle through {chain}",
            cert.subject()
        ));
        if rsa.is_some() {
            continue;
        }
        if let Ok(SpkiKey::RSA(key)) = cert.public_key().parsed() {
            let exponent = key
                .exponent
                .iter()
                .skip_while(|b| **b == 0)
                .try_fold(0u32, |e, b| e.checked_mul(256).map(|e| e + u32::from(*b)))
                .ok_or_else(|| VerifyError::Certificate("an RSA exponent over 32 bits".into()))?;
            let ek = Public::rsa_endorsement_key(key.modulus, exponent)
                .and_then(|ek| ek.check_endorsement_key().map(|_| ek))
                .map_err(|e| VerifyError::Certificate(format!("{index}: {e}")))?;
            rsa = Some(ek);
        }
    }
    let ek = rsa.ok_or_else(|| {
        VerifyError::Certificate("none certifies an RSA 2048 endorsement key".into())
    })?;
    if let PublicKey::Rsa { modulus, .. } = &ek.key {
        steps.push(format!(
            "endorsement key: RSA 2048 from the certificate (modulus {}…), default EK template",
            hex(&modulus[..8])
        ));
    }
    Ok(ek)
}

/// Follows `cert`'s issuers through `bundle` to a self-signed certificate in it, checking each
/// signature and validity at `at`; returns the chain's subjects.
fn chain_to(
    cert: &X509Certificate<'_>,
    bundle: &[Vec<u8>],
    at: i64,
) -> Result<String, VerifyError> {
    let time = x509_parser::time::ASN1Time::from_timestamp(at)
        .map_err(|e| VerifyError::Untrusted(e.to_string()))?;
    let mut current = cert.clone();
    let mut names = Vec::new();
    for _ in 0..MAX_CHAIN {
        if !current.validity().is_valid_at(time) {
            return Err(VerifyError::Untrusted(format!(
                "{} is not valid now",
                current.subject()
            )));
        }
        let issuer = bundle
            .iter()
            .filter_map(|der| {
                x509_parser::parse_x509_certificate(der)
                    .ok()
                    .map(|(_, c)| c)
            })
            .find(|c| c.subject().as_raw() == current.issuer().as_raw() && c.is_ca())
            .ok_or_else(|| {
                VerifyError::Untrusted(format!(
                    "no CA certificate in the bundle is {}, the issuer of {}",
                    current.issuer(),
                    current.subject()
                ))
            })?;
        current
            .verify_signature(Some(issuer.public_key()))
            .map_err(|e| {
                VerifyError::Untrusted(format!(
                    "{}'s signature does not verify with {}: {e}",
                    current.subject(),
                    issuer.subject()
                ))
            })?;
        names.push(issuer.subject().to_string());
        if issuer.subject().as_raw() == issuer.issuer().as_raw() {
            if !issuer.validity().is_valid_at(time) {
                return Err(VerifyError::Untrusted(format!(
                    "{} is not valid now",
                    issuer.subject()
                )));
            }
            return Ok(names.join(" → "));
        }
        current = issuer;
    }
    Err(VerifyError::Untrusted(format!(
        "no self-signed certificate within {MAX_CHAIN} issuers"
    )))
}

/// The DER certificates of a PEM text, at most [`MAX_CERTIFICATES`].
fn pem_certificates(text: &[u8]) -> Result<Vec<Vec<u8>>, String> {
    let mut out = Vec::new();
    for pem in x509_parser::pem::Pem::iter_from_buffer(text) {
        let pem = pem.map_err(|e| e.to_string())?;
        if pem.label != "CERTIFICATE" {
            continue;
        }
        if out.len() == MAX_CERTIFICATES {
            return Err(format!("more than {MAX_CERTIFICATES} certificates"));
        }
        out.push(pem.contents);
    }
    Ok(out)
}

fn decode(text: &str) -> Result<Vec<u8>, String> {
    use base64::Engine;
    if text.len() > 16 * 1024 {
        return Err("longer than 16 KiB".into());
    }
    base64::engine::general_purpose::STANDARD
        .decode(text)
        .map_err(|e| format!("not base64: {e}"))
}

fn describe_selection(selection: &[(u16, Vec<u8>)]) -> String {
    selection
        .iter()
        .map(|(hash, pcrs)| {
            let bank = if *hash == crate::public::ALG_SHA256 {
                "sha256".to_owned()
            } else {
                format!("{hash:#06x}")
            };
            let list: Vec<String> = pcrs.iter().map(u8::to_string).collect();
            format!("{bank}:{}", list.join(","))
        })
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reference_values_round_trip_and_bad_lines_are_named() {
        let values = vec![(0, vec![0x11; 32]), (1, vec![0x22; 32])];
        let text = PcrReferences::render(&values);
        let parsed = PcrReferences::parse(&format!("# the test image\n{text}\n")).unwrap();
        assert_eq!(parsed.0, vec![(0, [0x11; 32]), (1, [0x22; 32])]);
        for (bad, why) in [
            (
                "24 ".to_owned() + &"00".repeat(32),
                "line 1: \"24\" is not a PCR 0-23",
            ),
            ("4 abc".into(), "line 1: the value is not 64 hex digits"),
            ("4".into(), "line 1: not `PCR SHA256-HEX`"),
            (
                format!("\n4 {0}\n4 {0}", "00".repeat(32)),
                "line 3: PCR 4 is named twice",
            ),
            (
                format!("4 {}", "zz".repeat(32)),
                "line 1: the value is not 64 hex digits",
            ),
        ] {
            assert_eq!(PcrReferences::parse(&bad).unwrap_err(), why, "{bad:?}");
        }
        assert!(
            PcrReferences::parse(&"\n".repeat(300))
                .unwrap_err()
                .contains("over 256 lines")
        );
    }
}

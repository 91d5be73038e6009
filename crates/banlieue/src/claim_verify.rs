//! `banlieue claim verify`: the subject proves which VM it got (ADR-0077). Everything is
//! checked here, by the subject, from what it reads on its claim and the EK trust bundle it
//! holds (banlieue-attest's [`Challenge`]); the controller and the provider only relay the
//! challenge written to `spec.handover` and the answer in `status.attestation`.

use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant, SystemTime};

use banlieue_api::handover::HandoverChallenge;
use banlieue_api::{ClaimPhase, VirtualMachineClaim};
use banlieue_attest::rand_core::OsRng;
use banlieue_attest::{AnswerView, Challenge, ClaimView, PcrReferences, Verified};
use kube::api::{Api, Patch, PatchParams};
use kube::{Client, ResourceExt};

use crate::claim_cli::CliError;

/// The longest trust bundle read: a few CA certificates, not a directory.
const MAX_BUNDLE_BYTES: u64 = 256 * 1024;

/// How often the claim is read while the answer is on its way.
const POLL: Duration = Duration::from_millis(50);

/// What the subject trusts, obtained from its administrator and the image's publisher, never
/// from the claim: the EK trust bundle, and the PCR values a boot of the image must show
/// (none: the quoted values are shown, not judged).
#[derive(Clone, Debug, Default)]
pub struct Trust {
    pub bundle: String,
    pub references: PcrReferences,
}

/// The trust bundle at `bundle` (PEM: the Provider's `ekTrustBundle`) and the PCR reference
/// values at `references` (`PCR HEX` lines, as `claim verify --write-pcrs` writes them).
pub fn read_trust(bundle: &Path, references: Option<&Path>) -> Result<Trust, CliError> {
    let bundle = read_bounded(bundle, "a certificate bundle")?;
    let references = match references {
        None => PcrReferences::default(),
        Some(path) => PcrReferences::parse(&read_bounded(path, "a PCR reference file")?)
            .map_err(|why| CliError::Invalid(format!("{}: {why}", path.display())))?,
    };
    Ok(Trust { bundle, references })
}

fn read_bounded(path: &Path, what: &str) -> Result<String, CliError> {
    let invalid = |why: String| CliError::Invalid(format!("{}: {why}", path.display()));
    let metadata = std::fs::metadata(path).map_err(|e| invalid(e.to_string()))?;
    if metadata.len() > MAX_BUNDLE_BYTES {
        return Err(invalid(format!("{} bytes is not {what}", metadata.len())));
    }
    std::fs::read_to_string(path).map_err(|e| invalid(e.to_string()))
}

/// `claim verify --write-pcrs`: the verified PCR values, in the reference form, for whoever
/// publishes the image's reference values from a boot they trust.
pub fn write_pcrs(path: &Path, verified: &Verified) -> Result<(), CliError> {
    std::fs::write(path, PcrReferences::render(&verified.pcrs))
        .map_err(|e| CliError::Invalid(format!("{}: {e}", path.display())))
}

/// The payload at `path`, for `seal`: at most banlieue-attest's limit.
pub fn read_payload(path: &Path) -> Result<Vec<u8>, CliError> {
    let invalid = |why: String| CliError::Invalid(format!("{}: {why}", path.display()));
    let metadata = std::fs::metadata(path).map_err(|e| invalid(e.to_string()))?;
    let limit = banlieue_attest::seal::MAX_PAYLOAD_BYTES;
    if metadata.len() > limit as u64 {
        return Err(invalid(format!(
            "{} bytes: a sealed payload is at most {limit} bytes",
            metadata.len()
        )));
    }
    std::fs::read(path).map_err(|e| invalid(e.to_string()))
}

/// What the claim shows, for the verifier.
pub fn claim_view(claim: &VirtualMachineClaim) -> ClaimView {
    let status = claim.status.clone().unwrap_or_default();
    ClaimView {
        uid: claim.uid().unwrap_or_default(),
        subject_issuer: claim.spec.subject.issuer.clone(),
        subject_id: claim.spec.subject.id.clone(),
        ek_certificates: status.tpm_endorsement_certificates,
        attestation_key: status.attestation.and_then(|a| a.attestation_key),
        ssh_host_keys: status.ssh_host_keys,
    }
}

/// The answer the claim shows, if any.
fn answer_view(claim: &VirtualMachineClaim) -> Option<AnswerView> {
    let answer = claim
        .status
        .as_ref()?
        .attestation
        .as_ref()?
        .answer
        .clone()?;
    Some(AnswerView {
        challenge: answer.challenge,
        activated: answer.activated,
        quote: answer.quote,
        signature: answer.signature,
        pcr_values: answer.pcr_values,
        host_keys: answer.host_keys,
        opened: answer.opened,
        event_log: answer.event_log,
        failure: answer.failure,
    })
}

/// Verifies claim `name`'s VM as its subject: makes a challenge from the claim, writes it
/// to `spec.handover`, waits up to `timeout` for the relayed answer, and checks it, printing
/// each step to `log`. Returns the claim as it was read for the challenge (the host keys it
/// shows are those the verified quote covers: pin these, not a later read's) and the proof.
pub async fn verify(
    client: &Client,
    namespace: &str,
    name: &str,
    trust: &Trust,
    timeout: Duration,
    log: &mut impl Write,
) -> Result<(VirtualMachineClaim, Verified), CliError> {
    hand_over(client, namespace, name, trust, None, timeout, log).await
}

/// `banlieue claim seal`: as [`verify`], with `payload` sealed to the challenge's secret, so
/// that only the verified VM's TPM can give its guest the key that opens it; the guest puts
/// it where the answer says (`/run/banlieue/sealed/payload`, for the claim's login alone).
pub async fn seal(
    client: &Client,
    namespace: &str,
    name: &str,
    trust: &Trust,
    payload: &[u8],
    timeout: Duration,
    log: &mut impl Write,
) -> Result<(VirtualMachineClaim, Verified), CliError> {
    hand_over(client, namespace, name, trust, Some(payload), timeout, log).await
}

async fn hand_over(
    client: &Client,
    namespace: &str,
    name: &str,
    trust: &Trust,
    payload: Option<&[u8]>,
    timeout: Duration,
    log: &mut impl Write,
) -> Result<(VirtualMachineClaim, Verified), CliError> {
    let claims: Api<VirtualMachineClaim> = Api::namespaced(client.clone(), namespace);
    let claim = claims.get(name).await.map_err(CliError::from_kube)?;
    let phase = claim.status.as_ref().and_then(|s| s.phase);
    if phase != Some(ClaimPhase::Bound) {
        return Err(CliError::Invalid(format!(
            "claim {name} is not Bound ({}): there is no VM to verify",
            phase.map_or("no phase".to_owned(), |p| format!("{p:?}"))
        )));
    }
    let started = Instant::now();
    let view = claim_view(&claim);
    let now = SystemTime::now();
    let challenge = match payload {
        None => Challenge::new(&view, &trust.bundle, now, &mut OsRng),
        Some(payload) => Challenge::sealing(&view, &trust.bundle, now, payload, &mut OsRng),
    }
    .map_err(|e| CliError::Refused(format!("claim {name}: not verified: {e}")))?
    .with_references(trust.references.clone());
    for step in challenge.steps() {
        writeln!(log, "  ok  {step}")?;
    }
    let handover = HandoverChallenge {
        credential: challenge.credential_base64(),
        binding: challenge.binding_hex(),
        sealed: challenge.sealed_base64(),
    };
    claims
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(
                &serde_json::json!({ "spec": { "handover": handover.merge_patch_value() } }),
            ),
        )
        .await
        .map_err(CliError::from_kube)?;
    writeln!(
        log,
        "  ..  challenge written to spec.handover; waiting for the VM's answer"
    )?;

    let digest = challenge.digest();
    loop {
        let now = claims.get(name).await.map_err(CliError::from_kube)?;
        match answer_view(&now) {
            Some(answer) if answer.challenge == digest => {
                let verified = challenge
                    .check(&answer)
                    .map_err(|e| CliError::Refused(format!("claim {name}: not verified: {e}")))?;
                for step in &verified.steps[challenge.steps().len()..] {
                    writeln!(log, "  ok  {step}")?;
                }
                writeln!(
                    log,
                    "claim {name}: verified in {:.2} s",
                    started.elapsed().as_secs_f64()
                )?;
                return Ok((claim, verified));
            }
            _ if started.elapsed() >= timeout => {
                return Err(CliError::TimedOut {
                    name: name.to_owned(),
                    after: timeout,
                    last: "no answer to this challenge on the claim yet".into(),
                });
            }
            _ => tokio::time::sleep(POLL).await,
        }
    }
}

//! The credential made in Rust against a real TPM: a host swtpm (the TPM emulator libvirt
//! gives guests), driven by tpm2-tools over a Unix socket. The TPM makes an EK and an AK;
//! this crate reads their public areas, computes the AK's Name (checked against the TPM's),
//! makes a credential, and `tpm2_activatecredential` must release the secret, for RSA and ECC
//! EKs alike. A credential for another key's Name, or one with a flipped byte, must not open.
//! Then the AK quotes PCRs with a challenge's extra data, and the quote is checked: a replay
//! for another challenge, another AK, a flipped byte or PCR values that were not quoted are
//! each refused by name. Last, the subject's whole verification (`verify`) against an EK
//! certificate from a CA of the test's own, with this TPM as the guest and the test as the
//! relay: honest, and then lying in each way a provider could, each lie refused by the check
//! it names. No guest boot: the TPM is the peer.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use banlieue_attest::rand_core::OsRng;
use banlieue_attest::{
    Credential, Public, QuoteError, binding, extra_data, make_credential, verify_quote,
};

type Result<T = ()> = std::result::Result<T, Box<dyn std::error::Error>>;

/// A swtpm on a Unix socket in a temp dir, stopped (by its PID, as our child) on drop.
struct Swtpm {
    dir: tempfile::TempDir,
    child: Child,
    /// The log of what [`Swtpm::boot`] measured, as firmware would hand it to the kernel.
    event_log: Option<Vec<u8>>,
}

impl Swtpm {
    fn start() -> Result<Swtpm> {
        let dir = tempfile::tempdir()?;
        let socket = dir.path().join("tpm.sock");
        // The swtpm TCTI finds the control channel beside the data socket, as `<path>.ctrl`.
        let ctrl = dir.path().join("tpm.sock.ctrl");
        let child = Command::new("swtpm")
            .args(["socket", "--tpm2", "--flags", "not-need-init,startup-clear"])
            .arg("--server")
            .arg(format!("type=unixio,path={}", socket.display()))
            .arg("--ctrl")
            .arg(format!("type=unixio,path={}", ctrl.display()))
            .arg("--tpmstate")
            .arg(format!("dir={}", dir.path().display()))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("start swtpm (scripts/setup part 30-libvirtd): {e}"))?;
        let tpm = Swtpm {
            dir,
            child,
            event_log: None,
        };
        let started = Instant::now();
        while !(socket.exists() && ctrl.exists()) {
            if started.elapsed() > Duration::from_secs(10) {
                return Err("swtpm made no socket within 10 s".into());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(tpm)
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Runs a tpm2-tools command against this TPM in its directory; its stdout, or why not.
    fn tool(&self, tool: &str, args: &[&str]) -> Result<String> {
        let out = Command::new(tool)
            .args(args)
            .current_dir(self.dir.path())
            .env(
                "TPM2TOOLS_TCTI",
                format!("swtpm:path={}", self.path("tpm.sock").display()),
            )
            .output()
            .map_err(|e| format!("run {tool} (tpm2-tools: scripts/setup part 30-libvirtd): {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "{tool} {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            )
            .into());
        }
        // Without a resource manager, transient objects stay loaded until flushed.
        if tool != "tpm2_flushcontext" {
            self.tool("tpm2_flushcontext", &["-t"])?;
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// An EK of `kind` (`rsa` or `ecc`) and an AK under it; their public areas and the AK's
    /// Name as the TPM reports it.
    fn keys(&self, kind: &str) -> Result<(Public, Public, Vec<u8>)> {
        self.tool(
            "tpm2_createek",
            &["-c", "ek.ctx", "-G", kind, "-u", "ek.pub"],
        )?;
        let scheme = if kind == "rsa" { "rsassa" } else { "ecdsa" };
        self.tool(
            "tpm2_createak",
            &[
                "-C", "ek.ctx", "-c", "ak.ctx", "-G", kind, "-g", "sha256", "-s", scheme, "-u",
                "ak.pub", "-n", "ak.name",
            ],
        )?;
        let ek = Public::from_tpm2b(&std::fs::read(self.path("ek.pub"))?)?;
        let ak = Public::from_tpm2b(&std::fs::read(self.path("ak.pub"))?)?;
        Ok((ek, ak, std::fs::read(self.path("ak.name"))?))
    }

    /// A quote by the AK of PCRs 0-7 (SHA-256) carrying `extra`: the TPMS_ATTEST, the
    /// TPMT_SIGNATURE and the PCR values, read separately.
    fn quote(&self, extra: &[u8]) -> Result<Quoted> {
        let hex: String = extra.iter().map(|b| format!("{b:02x}")).collect();
        self.tool(
            "tpm2_quote",
            &[
                "-c",
                "ak.ctx",
                "-l",
                "sha256:0,1,2,3,4,5,6,7",
                "-q",
                &hex,
                "-m",
                "quote.msg",
                "-s",
                "quote.sig",
                "-g",
                "sha256",
            ],
        )?;
        self.tool(
            "tpm2_pcrread",
            &["sha256:0,1,2,3,4,5,6,7", "-o", "pcrs.bin"],
        )?;
        let values = std::fs::read(self.path("pcrs.bin"))?
            .chunks(32)
            .map(<[u8]>::to_vec)
            .collect();
        Ok(Quoted {
            attest: std::fs::read(self.path("quote.msg"))?,
            signature: std::fs::read(self.path("quote.sig"))?,
            pcrs: values,
        })
    }

    /// Measures `events` (`pcr`, event type, data) as firmware does at boot, extending each
    /// PCR's SHA-256 bank with the hash of the data, and keeps their crypto-agile log.
    fn boot(&mut self, events: &[(u32, u32, &[u8])]) -> Result {
        use sha2::{Digest, Sha256};
        let hex = |bytes: &[u8]| -> String { bytes.iter().map(|b| format!("{b:02x}")).collect() };
        // The log's header: the Spec ID event (SHA-256 the one bank), in the SHA-1 form.
        let mut spec = b"Spec ID Event03\0".to_vec();
        spec.extend_from_slice(&[0, 0, 0, 0, 0, 2, 0, 2]);
        spec.extend_from_slice(&1u32.to_le_bytes());
        spec.extend_from_slice(&0x000bu16.to_le_bytes());
        spec.extend_from_slice(&32u16.to_le_bytes());
        spec.push(0);
        let mut log = Vec::new();
        log.extend_from_slice(&0u32.to_le_bytes());
        log.extend_from_slice(&3u32.to_le_bytes());
        log.extend_from_slice(&[0; 20]);
        log.extend_from_slice(&(spec.len() as u32).to_le_bytes());
        log.extend_from_slice(&spec);
        for (pcr, event_type, data) in events {
            let digest = Sha256::digest(data);
            self.tool(
                "tpm2_pcrextend",
                &[&format!("{pcr}:sha256={}", hex(&digest))],
            )?;
            log.extend_from_slice(&pcr.to_le_bytes());
            log.extend_from_slice(&event_type.to_le_bytes());
            log.extend_from_slice(&1u32.to_le_bytes());
            log.extend_from_slice(&0x000bu16.to_le_bytes());
            log.extend_from_slice(&digest);
            log.extend_from_slice(&(data.len() as u32).to_le_bytes());
            log.extend_from_slice(data);
        }
        self.event_log = Some(log);
        Ok(())
    }

    /// A second AK under the same EK: what a provider swapping keys would show.
    fn another_ak(&self, kind: &str) -> Result<Public> {
        let scheme = if kind == "rsa" { "rsassa" } else { "ecdsa" };
        self.tool(
            "tpm2_createak",
            &[
                "-C", "ek.ctx", "-c", "ak2.ctx", "-G", kind, "-g", "sha256", "-s", scheme, "-u",
                "ak2.pub",
            ],
        )?;
        Ok(Public::from_tpm2b(&std::fs::read(self.path("ak2.pub"))?)?)
    }

    /// `tpm2_activatecredential` of `credential` by the AK, through the EK's policy (its
    /// PolicySecret on the endorsement hierarchy): the secret, or the TPM's refusal.
    fn activate(&self, credential: &Credential) -> Result<Vec<u8>> {
        self.activate_file(&credential.tpm2_tools_file())
    }

    /// As [`Swtpm::activate`], of tpm2-tools' credential file.
    fn activate_file(&self, file: &[u8]) -> Result<Vec<u8>> {
        std::fs::write(self.path("cred.in"), file)?;
        let _ = std::fs::remove_file(self.path("secret.out"));
        self.tool(
            "tpm2_startauthsession",
            &["--policy-session", "-S", "session.ctx"],
        )?;
        let activated = self
            .tool("tpm2_policysecret", &["-S", "session.ctx", "-c", "e"])
            .and_then(|_| {
                self.tool(
                    "tpm2_activatecredential",
                    &[
                        "-c",
                        "ak.ctx",
                        "-C",
                        "ek.ctx",
                        "-i",
                        "cred.in",
                        "-o",
                        "secret.out",
                        "-P",
                        "session:session.ctx",
                    ],
                )
            });
        // A failed activation leaves the session loaded; flush it either way.
        let _ = self.tool("tpm2_flushcontext", &["session.ctx"]);
        activated?;
        Ok(std::fs::read(self.path("secret.out"))?)
    }
}

/// What `tpm2_quote` and `tpm2_pcrread` wrote.
struct Quoted {
    /// TPMS_ATTEST.
    attest: Vec<u8>,
    /// TPMT_SIGNATURE.
    signature: Vec<u8>,
    /// The SHA-256 PCRs 0-7.
    pcrs: Vec<Vec<u8>>,
}

impl Drop for Swtpm {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn handover(kind: &str) -> Result {
    let tpm = Swtpm::start()?;
    let (ek, ak, tpm_name) = tpm.keys(kind)?;
    ek.check_endorsement_key()?;
    ak.check_attestation_key()?;
    assert_eq!(ak.name(), tpm_name, "the AK's Name as the TPM computes it");
    if let banlieue_attest::PublicKey::Rsa { modulus, exponent } = &ek.key {
        // What a verifier builds from the EK certificate's key is the key the TPM made.
        let from_certificate = Public::rsa_endorsement_key(modulus, *exponent)?;
        assert_eq!(from_certificate, ek, "the default template, byte for byte");
        let padded = [&[0u8][..], modulus].concat();
        assert_eq!(Public::rsa_endorsement_key(&padded, 65_537)?, ek);
    }

    let secret = b"a challenge of 32 bytes, random!";
    let credential = make_credential(&ek, &ak.name(), secret, &mut OsRng)?;
    assert_eq!(tpm.activate(&credential)?, secret);

    // Made for another key's Name (here the EK's own): the TPM refuses it.
    let elsewhere = make_credential(&ek, &ek.name(), secret, &mut OsRng)?;
    let refused = tpm
        .activate(&elsewhere)
        .expect_err("activated for another Name");
    assert!(
        refused.to_string().contains("tpm2_activatecredential"),
        "{refused}"
    );

    // One flipped byte of the ciphertext: the HMAC no longer matches.
    let mut flipped = credential.clone();
    let last = flipped.id_object.len() - 1;
    flipped.id_object[last] ^= 0x01;
    assert!(tpm.activate(&flipped).is_err(), "a flipped byte activated");

    // A PCR changed before the quote, so that the digest is of values other than the start's.
    tpm.tool(
        "tpm2_pcrextend",
        &[&format!("7:sha256={}", "ab".repeat(32))],
    )?;
    let challenge = extra_data(
        &binding(b"nonce-1", "claim-uid", "alice"),
        &["ssh-ed25519 AAAA".into()],
    )
    .expect("one-line keys");
    let Quoted {
        attest,
        signature,
        pcrs,
    } = tpm.quote(&challenge)?;
    let quote = verify_quote(&ak, &attest, &signature, &challenge, Some(&pcrs))?;
    assert_eq!(quote.pcr_selection, vec![(0x000B, (0..8).collect())]);
    // A replay: the same quote for another challenge.
    let other = extra_data(
        &binding(b"nonce-2", "claim-uid", "alice"),
        &["ssh-ed25519 AAAA".into()],
    )
    .expect("one-line keys");
    assert_eq!(
        verify_quote(&ak, &attest, &signature, &other, None),
        Err(QuoteError::WrongExtraData)
    );
    // Another key (the provider swapped the AK): the signature does not verify.
    assert!(matches!(
        verify_quote(
            &tpm.another_ak(kind)?,
            &attest,
            &signature,
            &challenge,
            None
        ),
        Err(QuoteError::BadSignature(_))
    ));
    let mut flipped = attest.clone();
    flipped[10] ^= 1;
    assert!(matches!(
        verify_quote(&ak, &flipped, &signature, &challenge, None),
        Err(QuoteError::BadSignature(_))
    ));
    let mut shown = pcrs.clone();
    shown[7][0] ^= 1;
    assert_eq!(
        verify_quote(&ak, &attest, &signature, &challenge, Some(&shown)),
        Err(QuoteError::PcrMismatch)
    );
    Ok(())
}

#[test]
fn an_rsa_eks_tpm_releases_the_secret_only_to_the_named_ak() -> Result {
    handover("rsa")
}

#[test]
fn an_ecc_eks_tpm_releases_the_secret_only_to_the_named_ak() -> Result {
    handover("ecc")
}

/// Runs `openssl` in `dir`; its stdout, or why not.
fn openssl(dir: &std::path::Path, args: &[&str]) -> Result<String> {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()?;
    if !out.status.success() {
        return Err(format!(
            "openssl {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        )
        .into());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A CA of the test's own (`name`), in `dir`: its certificate (PEM), and an EK certificate it
/// issues for the TPM's RSA EK, as swtpm-localca does for a guest's.
fn ek_certificate(tpm: &Swtpm, dir: &std::path::Path, name: &str) -> Result<(String, String)> {
    tpm.tool(
        "tpm2_readpublic",
        &["-c", "ek.ctx", "-f", "pem", "-o", "ek.pem"],
    )?;
    std::fs::copy(tpm.path("ek.pem"), dir.join("ek.pem"))?;
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
            "-days",
            "2",
            "-subj",
            &format!("/CN={name}"),
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign",
        ],
    )?;
    // A request of any key: the certificate carries the EK's, as a TPM's EK certificate does.
    openssl(
        dir,
        &[
            "req",
            "-new",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "other.key",
            "-out",
            "ek.csr",
            "-subj",
            "/CN=ek",
        ],
    )?;
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            "ek.csr",
            "-force_pubkey",
            "ek.pem",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "2",
            "-out",
            "ek-cert.pem",
        ],
    )?;
    Ok((
        std::fs::read_to_string(dir.join("ca.pem"))?,
        std::fs::read_to_string(dir.join("ek-cert.pem"))?,
    ))
}

/// This TPM as an honest guest: activates the challenge, opens its sealed payload if any, and
/// quotes over the binding and its host keys, as the guest layer does; the answer as the claim
/// would show it, and the payload opened.
fn guest_answers(
    tpm: &Swtpm,
    challenge: &banlieue_attest::Challenge,
    guest_keys: &[String],
) -> Result<banlieue_attest::AnswerView> {
    Ok(guest_opens(tpm, challenge, guest_keys)?.0)
}

fn guest_opens(
    tpm: &Swtpm,
    challenge: &banlieue_attest::Challenge,
    guest_keys: &[String],
) -> Result<(banlieue_attest::AnswerView, Option<Vec<u8>>)> {
    use base64::Engine;
    let b64 = |bytes: &[u8]| base64::engine::general_purpose::STANDARD.encode(bytes);
    let file = base64::engine::general_purpose::STANDARD.decode(challenge.credential_base64())?;
    let secret = tpm.activate_file(&file)?;
    let binding: [u8; 32] = (0..32)
        .map(|i| u8::from_str_radix(&challenge.binding_hex()[2 * i..2 * i + 2], 16))
        .collect::<std::result::Result<Vec<u8>, _>>()?
        .try_into()
        .map_err(|_| "32 bytes")?;
    let extra = extra_data(&binding, guest_keys).ok_or("one-line keys")?;
    let quoted = tpm.quote(&extra)?;
    let mut keys = guest_keys.to_vec();
    keys.sort();
    let keys_file: String = keys.iter().map(|k| format!("{k}\n")).collect();
    let payload = match challenge.sealed_base64() {
        Some(sealed) => Some(banlieue_attest::seal::open(
            &secret,
            &base64::engine::general_purpose::STANDARD.decode(sealed)?,
        )?),
        None => None,
    };
    let answer = banlieue_attest::AnswerView {
        challenge: challenge.digest(),
        activated: Some(banlieue_attest::seal::proof(&secret)),
        quote: Some(b64(&quoted.attest)),
        signature: Some(b64(&quoted.signature)),
        pcr_values: Some(b64(&quoted.pcrs.concat())),
        host_keys: Some(b64(keys_file.as_bytes())),
        opened: payload
            .as_ref()
            .map(|_| "/run/banlieue/sealed/payload".to_owned()),
        event_log: tpm.event_log.as_deref().map(b64),
        failure: None,
    };
    Ok((answer, payload))
}

#[test]
fn the_subject_verifies_a_handover_and_refuses_each_lie_of_the_relay() -> Result {
    use banlieue_attest::event_log::EventLogError;
    use banlieue_attest::{Challenge, ClaimView, PcrReferences, VerifyError};
    use base64::Engine;
    let b64 = |bytes: &[u8]| base64::engine::general_purpose::STANDARD.encode(bytes);
    // A minute on: every certificate below is made after this line, and valid for days.
    let now = std::time::SystemTime::now() + Duration::from_secs(60);
    let mut tpm = Swtpm::start()?;
    // A boot's measurements: the firmware, an EFI application, the separators.
    tpm.boot(&[
        (0, 0x8000_0008, b"firmware volume"),
        (4, 0x8000_0007, b"Calling EFI Application from Boot Option"),
        (4, 0x8000_0003, b"shimx64.efi"),
        (7, 0x4, &[0; 4]),
    ])?;
    let (_, _, _) = tpm.keys("rsa")?;
    let ca_dir = tempfile::tempdir()?;
    let (bundle, certificate) = ek_certificate(&tpm, ca_dir.path(), "banlieue test EK CA")?;
    let host_keys = vec!["ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGuest".to_owned()];
    let claim = ClaimView {
        uid: "0b6f3c9e-claim".into(),
        subject_issuer: "https://issuer.example".into(),
        subject_id: "alice".into(),
        ek_certificates: vec![certificate.clone()],
        attestation_key: Some(b64(&std::fs::read(tpm.path("ak.pub"))?)),
        ssh_host_keys: host_keys.clone(),
    };

    // Honest: every step checks.
    let challenge = Challenge::new(&claim, &bundle, now, &mut OsRng)?;
    let answer = guest_answers(&tpm, &challenge, &host_keys)?;
    let verified = challenge.check(&answer)?;
    assert_eq!(
        verified
            .pcrs
            .iter()
            .map(|(pcr, _)| *pcr)
            .collect::<Vec<_>>(),
        (0..8).collect::<Vec<_>>()
    );
    assert!(
        verified.steps.iter().any(|s| s.starts_with("host keys:")),
        "{:?}",
        verified.steps
    );

    // The firmware's log replays to the quoted PCRs; one event rewritten (with its digest,
    // as a liar would) no longer does.
    let log = verified.event_log.as_ref().ok_or("no event log verified")?;
    assert_eq!(log.events.len(), 4);
    assert!(
        verified
            .steps
            .iter()
            .any(|s| s.starts_with("event log: the firmware's 4 events")),
        "{:?}",
        verified.steps
    );
    let mut lying_log = tpm.event_log.clone().ok_or("a log")?;
    let at = lying_log
        .windows(11)
        .position(|w| w == b"shimx64.efi")
        .ok_or("shim's event")?;
    lying_log[at..at + 4].copy_from_slice(b"evil");
    let digest_at = at - 4 - 32;
    use sha2::Digest;
    lying_log[digest_at..digest_at + 32].copy_from_slice(&sha2::Sha256::digest(b"evilx64.efi"));
    let challenge = Challenge::new(&claim, &bundle, now, &mut OsRng)?;
    let honest = guest_answers(&tpm, &challenge, &host_keys)?;
    let relogged = banlieue_attest::AnswerView {
        event_log: Some(b64(&lying_log)),
        ..honest.clone()
    };
    match challenge.check(&relogged) {
        Err(VerifyError::EventLog(EventLogError::Mismatch { pcr: 4, .. })) => {}
        other => panic!("a rewritten event log: {other:?}"),
    }
    // PCR reference values for the image: those of the boot pass; any other is refused
    // naming the PCR.
    let references = PcrReferences::render(&verified.pcrs);
    let challenge = Challenge::new(&claim, &bundle, now, &mut OsRng)?
        .with_references(PcrReferences::parse(&references)?);
    let answer_now = guest_answers(&tpm, &challenge, &host_keys)?;
    assert!(
        challenge
            .check(&answer_now)?
            .steps
            .iter()
            .any(|s| s.starts_with("reference values: PCRs 0,1,2,3,4,5,6,7"))
    );
    let other_boot = PcrReferences::parse(&format!("4 {}\n", "ab".repeat(32)))?;
    let challenge = Challenge::new(&claim, &bundle, now, &mut OsRng)?.with_references(other_boot);
    let answer_now = guest_answers(&tpm, &challenge, &host_keys)?;
    match challenge.check(&answer_now) {
        Err(VerifyError::Reference { pcr: 4, .. }) => {}
        other => panic!("a PCR 4 unlike the reference: {other:?}"),
    }

    // A certificate from a CA the subject does not trust.
    let other_dir = tempfile::tempdir()?;
    let (other_bundle, _) = ek_certificate(&tpm, other_dir.path(), "another CA")?;
    match Challenge::new(&claim, &other_bundle, now, &mut OsRng) {
        Err(VerifyError::Untrusted(why)) => assert!(why.contains("issuer"), "{why}"),
        other => panic!("{other:?}"),
    }

    // A replayed quote: the last challenge's, relayed as the answer to a new one whose
    // secret the relay did have the TPM release.
    let next = Challenge::new(&claim, &bundle, now, &mut OsRng)?;
    let fresh = guest_answers(&tpm, &next, &host_keys)?;
    let replayed = banlieue_attest::AnswerView {
        quote: answer.quote.clone(),
        signature: answer.signature.clone(),
        ..fresh.clone()
    };
    assert_eq!(
        next.check(&replayed),
        Err(VerifyError::Quote(QuoteError::WrongExtraData))
    );
    assert!(next.check(&fresh).is_ok());

    // The provider swaps the AK for a key of another TPM, which it controls: the credential
    // is for that key, which this guest's TPM does not hold; the relay invents a secret.
    let elsewhere = Swtpm::start()?;
    elsewhere.keys("rsa")?;
    let swapped = ClaimView {
        attestation_key: Some(b64(&std::fs::read(elsewhere.path("ak.pub"))?)),
        ..claim.clone()
    };
    let challenge = Challenge::new(&swapped, &bundle, now, &mut OsRng)?;
    let file = base64::engine::general_purpose::STANDARD.decode(challenge.credential_base64())?;
    assert!(
        tpm.activate_file(&file).is_err(),
        "the guest's TPM released a credential made for another TPM's key"
    );
    // Nor can the other TPM open it: it was made under this guest's EK.
    assert!(elsewhere.activate_file(&file).is_err());
    let invented = banlieue_attest::AnswerView {
        challenge: challenge.digest(),
        activated: Some("00".repeat(32)),
        ..Default::default()
    };
    assert_eq!(challenge.check(&invented), Err(VerifyError::NotActivated));

    // The blob relayed into another guest: its TPM refuses it, and says so.
    let challenge = Challenge::new(&claim, &bundle, now, &mut OsRng)?;
    let refused = banlieue_attest::AnswerView {
        challenge: challenge.digest(),
        failure: Some("tpm2_activatecredential: integrity check failed".into()),
        ..Default::default()
    };
    assert!(matches!(
        challenge.check(&refused),
        Err(VerifyError::Refused(_))
    ));

    // A forged host key on the claim: the guest quotes the keys it holds, and they are not
    // the claim's; relayed with the forged keys in place of the guest's, the quote no longer
    // matches.
    let forged = ClaimView {
        ssh_host_keys: vec!["ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIForged".into()],
        ..claim.clone()
    };
    let challenge = Challenge::new(&forged, &bundle, now, &mut OsRng)?;
    let honest = guest_answers(&tpm, &challenge, &host_keys)?;
    assert!(matches!(
        challenge.check(&honest),
        Err(VerifyError::HostKeys { .. })
    ));
    let doctored = banlieue_attest::AnswerView {
        host_keys: Some(b64(b"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIForged\n")),
        ..honest
    };
    assert_eq!(
        challenge.check(&doctored),
        Err(VerifyError::Quote(QuoteError::WrongExtraData))
    );

    // A sealed payload: only this TPM recovers the key that opens it; the answer proves the
    // activation without giving the key away; the sealed bytes show nothing of it.
    let token = b"deploy token 6f1c2e: for alice's sandbox alone";
    let sealing = Challenge::sealing(&claim, &bundle, now, token, &mut OsRng)?;
    let sealed = base64::engine::general_purpose::STANDARD
        .decode(sealing.sealed_base64().ok_or("sealed")?)?;
    assert!(!sealed.windows(11).any(|w| w == b"deploy toke"));
    let (answer, opened) = guest_opens(&tpm, &sealing, &host_keys)?;
    assert_eq!(opened.as_deref(), Some(&token[..]));
    assert!(
        sealing
            .check(&answer)?
            .steps
            .iter()
            .any(|s| s.starts_with("sealed payload: opened"))
    );
    let file = base64::engine::general_purpose::STANDARD.decode(sealing.credential_base64())?;
    assert!(
        elsewhere.activate_file(&file).is_err(),
        "another TPM opened the credential that carries the payload's key"
    );
    let silent = banlieue_attest::AnswerView {
        opened: None,
        ..answer
    };
    assert_eq!(sealing.check(&silent), Err(VerifyError::NotOpened));

    // An answer to another challenge is not this one's.
    let other = Challenge::new(&claim, &bundle, now, &mut OsRng)?;
    assert!(matches!(
        other.check(&fresh),
        Err(VerifyError::OtherChallenge(_))
    ));
    Ok(())
}

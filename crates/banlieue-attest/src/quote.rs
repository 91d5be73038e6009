//! A `TPM2_Quote` checked by its verifier (TPM 2.0 Part 2, "TPMS_ATTEST", "TPMT_SIGNATURE"):
//! signed by the attestation key the verifier made a credential for, carrying the verifier's
//! own extra data (so it is this challenge's, not a replay or another claim's), over the PCR
//! values the verifier is shown. Each check that fails says which.

use sha2::{Digest, Sha256};

use crate::public::{ALG_SHA256, Public, PublicKey, Reader};

/// TPM_GENERATED_VALUE: what only a TPM writes at the start of what it signs.
pub const TPM_GENERATED: u32 = 0xff54_4347;
/// TPM_ST_ATTEST_QUOTE.
pub const ST_ATTEST_QUOTE: u16 = 0x8018;
/// TPM_ALG_RSASSA.
pub const ALG_RSASSA: u16 = 0x0014;
/// TPM_ALG_ECDSA.
pub const ALG_ECDSA: u16 = 0x0018;
/// The most bytes a quote or its signature is read from.
pub const MAX_QUOTE_BYTES: usize = 4096;

/// Why a quote was refused: the check that failed, in words a person reads.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum QuoteError {
    #[error("the quote cannot be read: {0}")]
    Malformed(String),
    #[error("the quote is not TPM-generated (magic {0:#010x})")]
    NotTpmGenerated(u32),
    #[error("the attestation is not a quote (type {0:#06x})")]
    NotAQuote(u16),
    #[error("the signature does not verify with the attestation key: {0}")]
    BadSignature(String),
    #[error(
        "the quote's extra data is not this challenge's over the host keys shown: a replayed or another claim's quote, or host keys the guest does not hold"
    )]
    WrongExtraData,
    #[error("the PCR values shown do not match the quoted digest")]
    PcrMismatch,
}

/// What a verified quote says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Quote {
    /// The extra data, as checked.
    pub extra_data: Vec<u8>,
    /// The TPM's clock (ms), resets and restarts: a verifier can see a TPM reset between two
    /// quotes.
    pub clock: u64,
    pub reset_count: u32,
    pub restart_count: u32,
    /// The PCRs quoted: for each bank, its hash algorithm and the selected PCR indices.
    pub pcr_selection: Vec<(u16, Vec<u8>)>,
    /// SHA-256 of the selected PCRs' values, in selection order.
    pub pcr_digest: Vec<u8>,
}

/// The verifier's binding of a challenge to its claim: SHA-256 over the verifier's nonce, the
/// claim's UID and its subject, each preceded by its length (a u32, big-endian) so that no
/// two different inputs give the same bytes. Sent to the guest as is.
pub fn binding(nonce: &[u8], claim_uid: &str, subject: &str) -> [u8; 32] {
    let mut h = Sha256::new();
    for part in [nonce, claim_uid.as_bytes(), subject.as_bytes()] {
        h.update((part.len() as u32).to_be_bytes());
        h.update(part);
    }
    h.finalize().into()
}

/// The extra data the guest's quote carries: SHA-256 over a header line, the binding (hex) and
/// the guest's own SSH host public keys (`TYPE BASE64`, sorted bytewise, each ending in a line
/// feed), as the guest layer hashes its own host-keys file. The guest adds its keys itself,
/// so a quote over the keys a claim shows proves the guest holds those keys' TPM; a relay
/// that swapped them cannot make the quote match. `None` when a key holds a line break (no
/// guest writes one).
pub fn extra_data(binding: &[u8; 32], host_keys: &[String]) -> Option<Vec<u8>> {
    let mut keys: Vec<&String> = host_keys.iter().collect();
    keys.sort();
    let mut h = Sha256::new();
    h.update(b"banlieue handover v1\nbinding ");
    h.update(hex(binding));
    h.update(b"\n");
    for key in keys {
        if key.contains(['\n', '\r']) {
            return None;
        }
        h.update(key.as_bytes());
        h.update(b"\n");
    }
    Some(h.finalize().to_vec())
}

/// Lower-case hex.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Checks `attest` (a TPMS_ATTEST) and `signature` (a TPMT_SIGNATURE) as a quote by `ak`
/// carrying `expected_extra`; with `pcr_values` (the selected PCRs' SHA-256 values in
/// selection order), also that they are what was quoted.
pub fn verify_quote(
    ak: &Public,
    attest: &[u8],
    signature: &[u8],
    expected_extra: &[u8],
    pcr_values: Option<&[Vec<u8>]>,
) -> Result<Quote, QuoteError> {
    if attest.len() > MAX_QUOTE_BYTES || signature.len() > MAX_QUOTE_BYTES {
        return Err(QuoteError::Malformed(format!(
            "longer than {MAX_QUOTE_BYTES} bytes"
        )));
    }
    // The signature first: nothing in an unsigned attestation is worth reading.
    check_signature(ak, attest, signature)?;
    let quote = parse_attest(attest)?;
    if quote.extra_data != expected_extra {
        return Err(QuoteError::WrongExtraData);
    }
    if let Some(values) = pcr_values {
        let mut h = Sha256::new();
        for v in values {
            h.update(v);
        }
        if h.finalize()[..] != quote.pcr_digest[..] {
            return Err(QuoteError::PcrMismatch);
        }
    }
    Ok(quote)
}

fn malformed(e: crate::Error) -> QuoteError {
    QuoteError::Malformed(e.to_string())
}

fn parse_attest(attest: &[u8]) -> Result<Quote, QuoteError> {
    let mut r = Reader::new(attest, "TPMS_ATTEST");
    let magic = r.u32().map_err(malformed)?;
    if magic != TPM_GENERATED {
        return Err(QuoteError::NotTpmGenerated(magic));
    }
    let kind = r.u16().map_err(malformed)?;
    if kind != ST_ATTEST_QUOTE {
        return Err(QuoteError::NotAQuote(kind));
    }
    let _qualified_signer = r.sized().map_err(malformed)?;
    let extra_data = r.sized().map_err(malformed)?.to_vec();
    let clock = u64::from_be_bytes(
        r.take(8)
            .map_err(malformed)?
            .try_into()
            .map_err(|_| QuoteError::Malformed("clock".into()))?,
    );
    let reset_count = r.u32().map_err(malformed)?;
    let restart_count = r.u32().map_err(malformed)?;
    let _safe = r.take(1).map_err(malformed)?;
    let _firmware = r.take(8).map_err(malformed)?;
    let banks = r.u32().map_err(malformed)?;
    if banks > 16 {
        return Err(QuoteError::Malformed(format!("{banks} PCR banks")));
    }
    let mut pcr_selection = Vec::new();
    for _ in 0..banks {
        let hash = r.u16().map_err(malformed)?;
        let size = r.take(1).map_err(malformed)?[0];
        let bitmap = r.take(usize::from(size)).map_err(malformed)?;
        let indices = bitmap
            .iter()
            .enumerate()
            .flat_map(|(byte, bits)| {
                (0..8u8)
                    .filter(move |bit| bits & (1 << bit) != 0)
                    .map(move |bit| (byte as u8) * 8 + bit)
            })
            .collect();
        pcr_selection.push((hash, indices));
    }
    let pcr_digest = r.sized().map_err(malformed)?.to_vec();
    r.end().map_err(malformed)?;
    Ok(Quote {
        extra_data,
        clock,
        reset_count,
        restart_count,
        pcr_selection,
        pcr_digest,
    })
}

fn check_signature(ak: &Public, attest: &[u8], signature: &[u8]) -> Result<(), QuoteError> {
    let mut r = Reader::new(signature, "TPMT_SIGNATURE");
    let alg = r.u16().map_err(malformed)?;
    let hash = r.u16().map_err(malformed)?;
    if hash != ALG_SHA256 {
        return Err(QuoteError::BadSignature(format!(
            "hash {hash:#06x}, not SHA-256"
        )));
    }
    match (&ak.key, alg) {
        (PublicKey::Rsa { modulus, exponent }, ALG_RSASSA) => {
            use rsa::signature::Verifier;
            let sig = r.sized().map_err(malformed)?;
            r.end().map_err(malformed)?;
            let e = if *exponent == 0 { 65_537 } else { *exponent };
            let key =
                rsa::RsaPublicKey::new(rsa::BigUint::from_bytes_be(modulus), rsa::BigUint::from(e))
                    .map_err(|e| QuoteError::BadSignature(e.to_string()))?;
            let sig = rsa::pkcs1v15::Signature::try_from(sig)
                .map_err(|e| QuoteError::BadSignature(e.to_string()))?;
            rsa::pkcs1v15::VerifyingKey::<Sha256>::new(key)
                .verify(attest, &sig)
                .map_err(|_| QuoteError::BadSignature("RSASSA-PKCS1-v1_5 over SHA-256".into()))
        }
        (PublicKey::EccP256 { x, y }, ALG_ECDSA) => {
            use p256::ecdsa::signature::Verifier;
            let sig_r = r.sized().map_err(malformed)?;
            let sig_s = r.sized().map_err(malformed)?;
            r.end().map_err(malformed)?;
            let mut sec1 = vec![0x04];
            sec1.extend_from_slice(x);
            sec1.extend_from_slice(y);
            let key = p256::ecdsa::VerifyingKey::from_sec1_bytes(&sec1)
                .map_err(|_| QuoteError::BadSignature("the AK is not a P-256 point".into()))?;
            let sig = p256::ecdsa::Signature::from_scalars(scalar(sig_r)?, scalar(sig_s)?)
                .map_err(|_| QuoteError::BadSignature("r or s out of range".into()))?;
            key.verify(attest, &sig)
                .map_err(|_| QuoteError::BadSignature("ECDSA P-256 over SHA-256".into()))
        }
        (_, alg) => Err(QuoteError::BadSignature(format!(
            "scheme {alg:#06x} is not the attestation key's"
        ))),
    }
}

/// A P-256 scalar from the TPM's big-endian bytes (which may omit leading zeros).
fn scalar(bytes: &[u8]) -> Result<p256::FieldBytes, QuoteError> {
    if bytes.len() > 32 {
        return Err(QuoteError::BadSignature(
            "a scalar longer than 32 bytes".into(),
        ));
    }
    let mut out = p256::FieldBytes::default();
    out[32 - bytes.len()..].copy_from_slice(bytes);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_binding_tells_its_parts_apart() {
        let a = binding(b"n", "uid", "alice");
        assert_ne!(a, binding(b"n", "ui", "dalice"));
        assert_ne!(a, binding(b"nu", "id", "alice"));
        assert_eq!(a, binding(b"n", "uid", "alice"));
    }

    #[test]
    fn the_extra_data_is_the_guests_hash_of_its_own_host_keys_file() {
        let b = binding(b"n", "uid", "alice");
        let keys = ["ssh-rsa BBBB".to_owned(), "ssh-ed25519 AAAA".to_owned()];
        // What the layer hashes: the header, the binding, then its host-keys file (sorted
        // lines, each ending in a line feed).
        let text = format!(
            "banlieue handover v1\nbinding {}\nssh-ed25519 AAAA\nssh-rsa BBBB\n",
            hex(&b)
        );
        let expected = Sha256::digest(text.as_bytes()).to_vec();
        assert_eq!(extra_data(&b, &keys), Some(expected.clone()));
        let reversed = [keys[1].clone(), keys[0].clone()];
        assert_eq!(extra_data(&b, &reversed), Some(expected.clone()));
        assert_ne!(extra_data(&b, &keys[..1]), Some(expected.clone()));
        let no_keys = Sha256::digest(format!("banlieue handover v1\nbinding {}\n", hex(&b)));
        assert_eq!(extra_data(&b, &[]), Some(no_keys.to_vec()));
        assert_eq!(extra_data(&b, &["ssh-ed25519 A\nssh-rsa B".into()]), None);
    }

    #[test]
    fn an_unsigned_or_cut_quote_is_refused_by_name() {
        let ak = crate::Public::from_tpm2b(&crate::public::tests::rsa_ek(&[0xC5; 256])).unwrap();
        assert!(matches!(
            verify_quote(&ak, b"short", &[0, 0x14, 0, 0x0B, 0, 1, 0], b"", None),
            Err(QuoteError::BadSignature(_))
        ));
        assert!(matches!(
            verify_quote(&ak, &[0; MAX_QUOTE_BYTES + 1], &[], b"", None),
            Err(QuoteError::Malformed(_))
        ));
        assert!(matches!(
            verify_quote(&ak, b"x", &[0, 0x14], b"", None),
            Err(QuoteError::Malformed(_))
        ));
    }
}

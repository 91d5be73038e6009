//! A payload sealed to a credential's secret (`banlieue claim seal`, ADR-0077): only the TPM
//! that activates the credential recovers the secret, and only with it does the payload open.
//! Encrypt-then-MAC from what a minimal guest has (the `openssl` command): AES-256-CTR, then
//! HMAC-SHA256 over the IV and the ciphertext, under two keys derived from the secret by
//! SHA-256 with distinct labels. The sealed bytes: IV (16) ‖ ciphertext ‖ tag (32).

use aes::cipher::{BlockEncrypt, KeyInit};
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

/// The largest payload sealed: a secret to hand over, not a file system.
pub const MAX_PAYLOAD_BYTES: usize = 32 * 1024;
const IV_BYTES: usize = 16;
const TAG_BYTES: usize = 32;

/// Why a payload was not sealed or did not open.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SealError {
    #[error("the payload is larger than {MAX_PAYLOAD_BYTES} bytes")]
    TooLarge,
    #[error("the sealed payload is cut short")]
    Truncated,
    #[error("the sealed payload's MAC does not match: altered, or sealed to another secret")]
    BadTag,
}

/// SHA-256 of `label` then `secret`: a key, or the proof of activation, none of which tells
/// the others or the secret.
fn derive(label: &[u8], secret: &[u8]) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(label);
    h.update(secret);
    h.finalize().into()
}

/// What the guest returns for a secret its TPM released: `banlieue handover proof` and the
/// secret, hashed, in hex. The verifier compares it with its own; the relay learns nothing.
pub fn proof(secret: &[u8]) -> String {
    crate::quote::hex(&derive(b"banlieue handover proof", secret))
}

/// AES-256-CTR as OpenSSL runs it: the IV is the first counter block, incremented as one
/// 128-bit big-endian number.
fn ctr(key: &[u8; 32], iv: &[u8; IV_BYTES], data: &mut [u8]) {
    let cipher = aes::Aes256::new(key.into());
    let mut counter = u128::from_be_bytes(*iv);
    for chunk in data.chunks_mut(16) {
        let mut block = counter.to_be_bytes().into();
        cipher.encrypt_block(&mut block);
        for (byte, pad) in chunk.iter_mut().zip(block.iter()) {
            *byte ^= pad;
        }
        counter = counter.wrapping_add(1);
    }
}

fn tag(secret: &[u8], iv_and_ciphertext: &[u8]) -> [u8; TAG_BYTES] {
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&derive(b"banlieue seal mac", secret))
        .expect("HMAC takes any key length");
    mac.update(iv_and_ciphertext);
    mac.finalize().into_bytes().into()
}

/// Seals `payload` to `secret` with the fresh `iv`.
pub fn seal(secret: &[u8], payload: &[u8], iv: [u8; IV_BYTES]) -> Result<Vec<u8>, SealError> {
    if payload.len() > MAX_PAYLOAD_BYTES {
        return Err(SealError::TooLarge);
    }
    let mut out = iv.to_vec();
    let mut body = payload.to_vec();
    ctr(&derive(b"banlieue seal enc", secret), &iv, &mut body);
    out.extend_from_slice(&body);
    let tag = tag(secret, &out);
    out.extend_from_slice(&tag);
    Ok(out)
}

/// Opens what [`seal`] made, checking its tag first (in time independent of where it
/// differs).
pub fn open(secret: &[u8], sealed: &[u8]) -> Result<Vec<u8>, SealError> {
    use subtle::ConstantTimeEq;
    if sealed.len() < IV_BYTES + TAG_BYTES {
        return Err(SealError::Truncated);
    }
    let (body, given) = sealed.split_at(sealed.len() - TAG_BYTES);
    if !bool::from(tag(secret, body).ct_eq(given)) {
        return Err(SealError::BadTag);
    }
    let (iv, ciphertext) = body.split_at(IV_BYTES);
    let iv: [u8; IV_BYTES] = iv.try_into().map_err(|_| SealError::Truncated)?;
    let mut payload = ciphertext.to_vec();
    ctr(&derive(b"banlieue seal enc", secret), &iv, &mut payload);
    Ok(payload)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sealed_payload_opens_with_its_secret_only_and_unaltered() {
        let secret = [7u8; 32];
        let payload = b"deploy-token: 0123456789abcdef, longer than one block of AES";
        let sealed = seal(&secret, payload, [1u8; 16]).unwrap();
        assert_eq!(sealed.len(), 16 + payload.len() + 32);
        assert!(!sealed.windows(12).any(|w| w == b"deploy-token"));
        assert_eq!(open(&secret, &sealed).unwrap(), payload);
        assert_eq!(open(&[8u8; 32], &sealed), Err(SealError::BadTag));
        for at in [0, 20, sealed.len() - 1] {
            let mut flipped = sealed.clone();
            flipped[at] ^= 1;
            assert_eq!(open(&secret, &flipped), Err(SealError::BadTag), "byte {at}");
        }
        assert_eq!(open(&secret, &sealed[..40]), Err(SealError::Truncated));
        assert_eq!(
            seal(&secret, &vec![0; MAX_PAYLOAD_BYTES + 1], [0; 16]),
            Err(SealError::TooLarge)
        );
        // The proof names the secret without giving it, or either key, away.
        assert_ne!(proof(&secret), crate::quote::hex(&secret));
        assert_eq!(proof(&secret).len(), 64);
    }

    #[test]
    fn the_counter_runs_as_openssls_across_its_low_bytes() {
        // An IV whose low 64 bits are all ones: the carry goes into the high half, as
        // OpenSSL's 128-bit counter does (a 64-bit counter would wrap to the IV's top).
        let secret = [3u8; 32];
        let mut iv = [0u8; 16];
        iv[8..].fill(0xff);
        let payload = [0u8; 48];
        let sealed = seal(&secret, &payload, iv).unwrap();
        let key = derive(b"banlieue seal enc", &secret);
        let cipher = aes::Aes256::new((&key).into());
        let mut second = [0u8; 16];
        second[7] = 1;
        let mut block = second.into();
        cipher.encrypt_block(&mut block);
        assert_eq!(&sealed[16 + 16..16 + 32], block.as_slice());
    }
}

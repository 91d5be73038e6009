//! `TPM2_MakeCredential`'s computation (TPM 2.0 Part 1, "Credential Protection"), made by the
//! consumer instead of a TPM: a short secret wrapped so that only the TPM holding the
//! endorsement key's private half can unwrap it, and only through `TPM2_ActivateCredential`
//! with a loaded key of the given Name. A guest that answers with the secret proves its
//! attestation key sits in that TPM.
//!
//! The steps: a random seed is given to the EK (RSA: encrypted with RSA-OAEP, SHA-256, label
//! "IDENTITY"; ECC: an ephemeral ECDH on P-256, the seed derived by KDFe with label
//! "IDENTITY"); from the seed, KDFa derives an AES key ("STORAGE", bound to the AK's Name)
//! that encrypts the secret in CFB mode, and an HMAC key ("INTEGRITY") whose HMAC over the
//! ciphertext and the Name lets the TPM refuse a blob made for another key or altered.

use aes::cipher::{AsyncStreamCipher, KeyIvInit};
use hmac::{Hmac, Mac};
use rsa::rand_core::CryptoRngCore;
use rsa::{BigUint, Oaep, RsaPublicKey};
use sha2::Sha256;

use crate::kdf::{kdfa, kdfe};
use crate::public::{Public, PublicKey, Symmetric};
use crate::{Error, Result};

/// The longest secret: a SHA-256 digest's size, the name algorithm's.
pub const MAX_SECRET_BYTES: usize = 32;

/// The magic and version of the file `tpm2_makecredential` writes and
/// `tpm2_activatecredential -i` reads.
const TPM2_TOOLS_MAGIC: u32 = 0xBADC_C0DE;
const TPM2_TOOLS_VERSION: u32 = 1;

/// What `TPM2_ActivateCredential` takes, marshalled as the TPM reads them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Credential {
    /// TPM2B_ID_OBJECT: the HMAC and the encrypted secret.
    pub id_object: Vec<u8>,
    /// TPM2B_ENCRYPTED_SECRET: the seed, for the EK.
    pub encrypted_secret: Vec<u8>,
}

impl Credential {
    /// The file `tpm2_activatecredential -i` reads: a magic, a version, then both parts.
    pub fn tpm2_tools_file(&self) -> Vec<u8> {
        let mut out = TPM2_TOOLS_MAGIC.to_be_bytes().to_vec();
        out.extend_from_slice(&TPM2_TOOLS_VERSION.to_be_bytes());
        out.extend_from_slice(&self.id_object);
        out.extend_from_slice(&self.encrypted_secret);
        out
    }
}

/// Wraps `secret` for the TPM whose endorsement key is `ek` (TPM2B_PUBLIC bytes), to be
/// released only to the key named `ak_name`. `ek` must be an endorsement key by its
/// attributes; its symmetric algorithm sets the AES key's size.
pub fn make_credential(
    ek: &Public,
    ak_name: &[u8],
    secret: &[u8],
    rng: &mut impl CryptoRngCore,
) -> Result<Credential> {
    if secret.is_empty() || secret.len() > MAX_SECRET_BYTES {
        return Err(Error::Unsupported {
            what: "secret",
            why: format!("{} bytes, not 1 to {MAX_SECRET_BYTES}", secret.len()),
        });
    }
    let Symmetric { key_bits } = ek.check_endorsement_key()?;
    let (seed, encrypted) = seed_for(&ek.key, rng)?;

    let sym_key = kdfa(&seed, "STORAGE", ak_name, &[], u32::from(key_bits));
    let mut enc_identity = tpm2b(secret);
    let iv = [0u8; 16];
    match key_bits {
        128 => cfb_mode::Encryptor::<aes::Aes128>::new_from_slices(&sym_key, &iv)
            .map_err(|e| Error::Crypto(format!("AES-128 key: {e}")))?
            .encrypt(&mut enc_identity),
        _ => cfb_mode::Encryptor::<aes::Aes256>::new_from_slices(&sym_key, &iv)
            .map_err(|e| Error::Crypto(format!("AES-256 key: {e}")))?
            .encrypt(&mut enc_identity),
    }

    let hmac_key = kdfa(&seed, "INTEGRITY", &[], &[], 256);
    let mut mac =
        Hmac::<Sha256>::new_from_slice(&hmac_key).expect("HMAC takes a key of any length");
    mac.update(&enc_identity);
    mac.update(ak_name);
    let outer_hmac = mac.finalize().into_bytes();

    let mut id = tpm2b(&outer_hmac);
    id.extend_from_slice(&enc_identity);
    Ok(Credential {
        id_object: tpm2b(&id),
        encrypted_secret: tpm2b(&encrypted),
    })
}

/// The seed and what carries it to the EK: RSA-OAEP's ciphertext, or the ephemeral ECC point.
fn seed_for(ek: &PublicKey, rng: &mut impl CryptoRngCore) -> Result<(Vec<u8>, Vec<u8>)> {
    match ek {
        PublicKey::Rsa { modulus, exponent } => {
            let e = if *exponent == 0 { 65_537 } else { *exponent };
            let key = RsaPublicKey::new(BigUint::from_bytes_be(modulus), BigUint::from(e))
                .map_err(|e| Error::Crypto(format!("the EK's RSA key: {e}")))?;
            let mut seed = vec![0u8; 32];
            rng.fill_bytes(&mut seed);
            // The label is "IDENTITY" with its terminating zero octet, as the TPM checks it.
            let encrypted = key
                .encrypt(rng, Oaep::new_with_label::<Sha256, _>("IDENTITY\0"), &seed)
                .map_err(|e| Error::Crypto(format!("RSA-OAEP to the EK: {e}")))?;
            Ok((seed, encrypted))
        }
        PublicKey::EccP256 { x, y } => {
            let mut sec1 = vec![0x04];
            sec1.extend_from_slice(x);
            sec1.extend_from_slice(y);
            let ek = p256::PublicKey::from_sec1_bytes(&sec1)
                .map_err(|_| Error::Crypto("the EK's point is not on P-256".into()))?;
            let ephemeral = p256::ecdh::EphemeralSecret::random(rng);
            let shared = ephemeral.diffie_hellman(&ek);
            let point = p256::EncodedPoint::from(ephemeral.public_key());
            let (Some(ex), Some(ey)) = (point.x(), point.y()) else {
                return Err(Error::Crypto(
                    "an ephemeral point without coordinates".into(),
                ));
            };
            let seed = kdfe(shared.raw_secret_bytes(), "IDENTITY", ex, x, 256);
            // TPMS_ECC_POINT: the ephemeral key's coordinates, each a TPM2B.
            let mut encrypted = tpm2b(ex);
            encrypted.extend_from_slice(&tpm2b(ey));
            Ok((seed, encrypted))
        }
    }
}

/// A TPM2B: a big-endian u16 size, then the bytes (every caller's is short).
fn tpm2b(bytes: &[u8]) -> Vec<u8> {
    let size = u16::try_from(bytes.len()).unwrap_or(u16::MAX);
    let mut out = size.to_be_bytes().to_vec();
    out.extend_from_slice(bytes);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::public::tests::rsa_ek;
    use rsa::rand_core::OsRng;
    use rsa::traits::PublicKeyParts;

    fn test_ek() -> (rsa::RsaPrivateKey, Public) {
        let private = rsa::RsaPrivateKey::new(&mut OsRng, 2048).unwrap();
        let modulus = private.to_public_key().n().to_bytes_be();
        (private, Public::from_tpm2b(&rsa_ek(&modulus)).unwrap())
    }

    /// The TPM's side, done with the EK's private key: what `TPM2_ActivateCredential` checks.
    fn activate(private: &rsa::RsaPrivateKey, name: &[u8], c: &Credential) -> Option<Vec<u8>> {
        let encrypted = &c.encrypted_secret[2..];
        let seed = private
            .decrypt(Oaep::new_with_label::<Sha256, _>("IDENTITY\0"), encrypted)
            .ok()?;
        let id = &c.id_object[2..];
        let (hmac_size, rest) = id.split_at(2);
        let size = usize::from(u16::from_be_bytes([hmac_size[0], hmac_size[1]]));
        let (outer, enc_identity) = rest.split_at(size);
        let mut mac =
            Hmac::<Sha256>::new_from_slice(&kdfa(&seed, "INTEGRITY", &[], &[], 256)).unwrap();
        mac.update(enc_identity);
        mac.update(name);
        mac.verify_slice(outer).ok()?;
        let mut plain = enc_identity.to_vec();
        cfb_mode::Decryptor::<aes::Aes128>::new_from_slices(
            &kdfa(&seed, "STORAGE", name, &[], 128),
            &[0; 16],
        )
        .unwrap()
        .decrypt(&mut plain);
        Some(plain[2..].to_vec())
    }

    #[test]
    fn only_the_named_key_and_the_untouched_blob_release_the_secret() {
        let (private, ek) = test_ek();
        let name = [0x00, 0x0B]
            .iter()
            .chain(&[7u8; 32])
            .copied()
            .collect::<Vec<_>>();
        let c = make_credential(&ek, &name, b"sixteen byte key", &mut OsRng).unwrap();
        assert_eq!(
            activate(&private, &name, &c).as_deref(),
            Some(&b"sixteen byte key"[..])
        );
        let mut other = name.clone();
        other[5] ^= 1;
        assert_eq!(activate(&private, &other, &c), None, "another key's Name");
        let mut flipped = c.clone();
        let last = flipped.id_object.len() - 1;
        flipped.id_object[last] ^= 1;
        assert_eq!(activate(&private, &name, &flipped), None, "a flipped byte");
        assert_eq!(
            c.tpm2_tools_file()[..8],
            [0xBA, 0xDC, 0xC0, 0xDE, 0, 0, 0, 1]
        );
    }

    #[test]
    fn secrets_are_bounded_and_a_signing_key_is_no_ek() {
        let (_, ek) = test_ek();
        assert!(make_credential(&ek, b"n", b"", &mut OsRng).is_err());
        assert!(make_credential(&ek, b"n", &[1; 33], &mut OsRng).is_err());
        let mut signing = ek.clone();
        signing.attributes = crate::public::attributes::SIGN;
        assert!(matches!(
            make_credential(&signing, b"n", b"s", &mut OsRng),
            Err(Error::Attributes(_))
        ));
    }
}

//! TPM 2.0 public areas (TPM2B_PUBLIC, TPM 2.0 Part 2 "TPMT_PUBLIC"), parsed from the bytes a
//! guest publishes: the endorsement key's, to make a credential for it, and the attestation
//! key's, whose Name the credential is bound to and whose attributes say it is a TPM's own
//! restricted signing key. Only what banlieue's guests use is accepted: RSA 2048 and NIST
//! P-256 keys with SHA-256 as their name algorithm; anything else is refused by name.

use sha2::{Digest, Sha256};

use crate::{Error, Result};

/// TPM_ALG_RSA.
pub const ALG_RSA: u16 = 0x0001;
/// TPM_ALG_SHA256.
pub const ALG_SHA256: u16 = 0x000B;
/// TPM_ALG_NULL.
pub const ALG_NULL: u16 = 0x0010;
/// TPM_ALG_ECC.
pub const ALG_ECC: u16 = 0x0023;
/// TPM_ALG_AES.
pub const ALG_AES: u16 = 0x0006;
/// TPM_ALG_CFB.
pub const ALG_CFB: u16 = 0x0043;
/// TPM_ECC_NIST_P256.
pub const ECC_NIST_P256: u16 = 0x0003;

/// TPMA_OBJECT bits (Part 2, "TPMA_OBJECT").
pub mod attributes {
    pub const FIXED_TPM: u32 = 1 << 1;
    pub const FIXED_PARENT: u32 = 1 << 4;
    pub const SENSITIVE_DATA_ORIGIN: u32 = 1 << 5;
    pub const USER_WITH_AUTH: u32 = 1 << 6;
    pub const ADMIN_WITH_POLICY: u32 = 1 << 7;
    pub const RESTRICTED: u32 = 1 << 16;
    pub const DECRYPT: u32 = 1 << 17;
    pub const SIGN: u32 = 1 << 18;
}

/// The most bytes a public area is read from: an RSA 4096 key with a long policy fits.
pub const MAX_PUBLIC_BYTES: usize = 1024;

/// A symmetric algorithm of a storage key (its `parameters.symmetric`): AES in CFB mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Symmetric {
    /// 128 or 256.
    pub key_bits: u16,
}

/// The key in a public area.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PublicKey {
    /// An RSA key: its modulus (big-endian) and exponent (0 means 65537, as the TPM writes it).
    Rsa { modulus: Vec<u8>, exponent: u32 },
    /// A NIST P-256 point.
    EccP256 { x: Vec<u8>, y: Vec<u8> },
}

/// A parsed public area.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Public {
    /// TPMA_OBJECT.
    pub attributes: u32,
    /// The authorization policy digest (an EK's is the TCG's PolicySecret(endorsement)).
    pub auth_policy: Vec<u8>,
    /// For a storage key (an EK): the symmetric algorithm of its protections; `None` for a
    /// signing key.
    pub symmetric: Option<Symmetric>,
    /// The key.
    pub key: PublicKey,
    /// The TPMT_PUBLIC bytes, as hashed for the Name.
    tpmt: Vec<u8>,
}

impl Public {
    /// Parses a TPM2B_PUBLIC (a size, then the TPMT_PUBLIC), refusing trailing bytes.
    pub fn from_tpm2b(bytes: &[u8]) -> Result<Public> {
        if bytes.len() > MAX_PUBLIC_BYTES {
            return Err(Error::Unsupported {
                what: "TPM2B_PUBLIC",
                why: format!("{} bytes, more than {MAX_PUBLIC_BYTES}", bytes.len()),
            });
        }
        let mut r = Reader::new(bytes, "TPM2B_PUBLIC");
        let tpmt = r.sized()?;
        r.end()?;
        Public::from_tpmt(tpmt)
    }

    /// Parses a TPMT_PUBLIC.
    pub fn from_tpmt(bytes: &[u8]) -> Result<Public> {
        let mut r = Reader::new(bytes, "TPMT_PUBLIC");
        let kind = r.u16()?;
        let name_alg = r.u16()?;
        if name_alg != ALG_SHA256 {
            return Err(Error::Unsupported {
                what: "nameAlg",
                why: format!("{name_alg:#06x}, not SHA-256 ({ALG_SHA256:#06x})"),
            });
        }
        let attributes = r.u32()?;
        let auth_policy = r.sized()?.to_vec();
        let symmetric = symmetric(&mut r)?;
        let key = match kind {
            ALG_RSA => {
                scheme(&mut r, "RSA scheme")?;
                let key_bits = r.u16()?;
                let exponent = r.u32()?;
                let modulus = r.sized()?.to_vec();
                if key_bits != 2048 || modulus.len() != 256 {
                    return Err(Error::Unsupported {
                        what: "RSA key",
                        why: format!(
                            "{key_bits} bits with a {}-byte modulus, not RSA 2048",
                            modulus.len()
                        ),
                    });
                }
                PublicKey::Rsa { modulus, exponent }
            }
            ALG_ECC => {
                scheme(&mut r, "ECC scheme")?;
                let curve = r.u16()?;
                if curve != ECC_NIST_P256 {
                    return Err(Error::Unsupported {
                        what: "ECC curve",
                        why: format!("{curve:#06x}, not NIST P-256 ({ECC_NIST_P256:#06x})"),
                    });
                }
                scheme(&mut r, "ECC KDF")?;
                let x = r.sized()?.to_vec();
                let y = r.sized()?.to_vec();
                if x.len() != 32 || y.len() != 32 {
                    return Err(Error::Unsupported {
                        what: "ECC point",
                        why: format!("{}- and {}-byte coordinates, not 32", x.len(), y.len()),
                    });
                }
                PublicKey::EccP256 { x, y }
            }
            other => {
                return Err(Error::Unsupported {
                    what: "type",
                    why: format!("{other:#06x}, neither RSA nor ECC"),
                });
            }
        };
        r.end()?;
        Ok(Public {
            attributes,
            auth_policy,
            symmetric,
            key,
            tpmt: bytes.to_vec(),
        })
    }

    /// The endorsement key an RSA 2048 EK certificate certifies, as the TPM makes it from the
    /// TCG's default template (EK Credential Profile, template L-1: a restricted decryption
    /// key under PolicySecret(endorsement), AES-128 CFB), given the certificate's modulus and
    /// exponent: what a credential for the TPM holding it is made under. A verifier takes the
    /// key from the certificate, never from what the guest says.
    pub fn rsa_endorsement_key(modulus: &[u8], exponent: u32) -> Result<Public> {
        /// PolicySecret(TPM_RH_ENDORSEMENT), the default EK's authPolicy.
        const EK_POLICY: [u8; 32] = [
            0x83, 0x71, 0x97, 0x67, 0x44, 0x84, 0xb3, 0xf8, 0x1a, 0x90, 0xcc, 0x8d, 0x46, 0xa5,
            0xd7, 0x24, 0xfd, 0x52, 0xd7, 0x6e, 0x06, 0x52, 0x0b, 0x64, 0xf2, 0xa1, 0xda, 0x1b,
            0x33, 0x14, 0x69, 0xaa,
        ];
        use attributes::*;
        let attributes = FIXED_TPM
            | FIXED_PARENT
            | SENSITIVE_DATA_ORIGIN
            | ADMIN_WITH_POLICY
            | RESTRICTED
            | DECRYPT;
        // The template writes 0 for the default exponent, as the TPM reports it.
        let exponent = if exponent == 65_537 { 0 } else { exponent };
        let mut t = Vec::with_capacity(320);
        t.extend_from_slice(&ALG_RSA.to_be_bytes());
        t.extend_from_slice(&ALG_SHA256.to_be_bytes());
        t.extend_from_slice(&attributes.to_be_bytes());
        t.extend_from_slice(&(EK_POLICY.len() as u16).to_be_bytes());
        t.extend_from_slice(&EK_POLICY);
        t.extend_from_slice(&ALG_AES.to_be_bytes());
        t.extend_from_slice(&128u16.to_be_bytes());
        t.extend_from_slice(&ALG_CFB.to_be_bytes());
        t.extend_from_slice(&ALG_NULL.to_be_bytes());
        t.extend_from_slice(&2048u16.to_be_bytes());
        t.extend_from_slice(&exponent.to_be_bytes());
        let modulus = match modulus {
            [0, rest @ ..] => rest,
            all => all,
        };
        t.extend_from_slice(&(modulus.len() as u16).to_be_bytes());
        t.extend_from_slice(modulus);
        Public::from_tpmt(&t)
    }

    /// The key's Name: its name algorithm, then the SHA-256 of its TPMT_PUBLIC.
    pub fn name(&self) -> Vec<u8> {
        let mut name = ALG_SHA256.to_be_bytes().to_vec();
        name.extend_from_slice(&Sha256::digest(&self.tpmt));
        name
    }

    /// Checks the attributes of an endorsement key as TCG's EK credential profile makes it: a
    /// restricted decryption key of this TPM, with a symmetric algorithm for its protections.
    pub fn check_endorsement_key(&self) -> Result<Symmetric> {
        use attributes::*;
        let required = FIXED_TPM | FIXED_PARENT | SENSITIVE_DATA_ORIGIN | RESTRICTED | DECRYPT;
        self.require("an endorsement key", required, SIGN)?;
        self.symmetric.ok_or_else(|| {
            Error::Attributes("an endorsement key without a symmetric algorithm".into())
        })
    }

    /// Checks the attributes of an attestation key: a restricted signing key, generated in
    /// and bound to this TPM, that decrypts nothing.
    pub fn check_attestation_key(&self) -> Result<()> {
        use attributes::*;
        let required = FIXED_TPM | FIXED_PARENT | SENSITIVE_DATA_ORIGIN | RESTRICTED | SIGN;
        self.require("an attestation key", required, DECRYPT)
    }

    fn require(&self, role: &str, required: u32, forbidden: u32) -> Result<()> {
        let missing = required & !self.attributes;
        let extra = forbidden & self.attributes;
        if missing != 0 || extra != 0 {
            return Err(Error::Attributes(format!(
                "not {role}: attributes {:#010x} lack {missing:#010x} or have {extra:#010x}",
                self.attributes
            )));
        }
        Ok(())
    }
}

/// TPMT_SYM_DEF_OBJECT: AES-128 or -256 in CFB mode, or NULL.
fn symmetric(r: &mut Reader<'_>) -> Result<Option<Symmetric>> {
    match r.u16()? {
        ALG_NULL => Ok(None),
        ALG_AES => {
            let key_bits = r.u16()?;
            let mode = r.u16()?;
            if !matches!(key_bits, 128 | 256) || mode != ALG_CFB {
                return Err(Error::Unsupported {
                    what: "symmetric",
                    why: format!("AES-{key_bits} in mode {mode:#06x}, not AES-128/256 CFB"),
                });
            }
            Ok(Some(Symmetric { key_bits }))
        }
        other => Err(Error::Unsupported {
            what: "symmetric",
            why: format!("algorithm {other:#06x}, not AES"),
        }),
    }
}

/// A scheme (TPMT_RSA_SCHEME, TPMT_ECC_SCHEME, TPMT_KDF_SCHEME): NULL, or an algorithm and
/// its hash.
fn scheme(r: &mut Reader<'_>, _what: &'static str) -> Result<()> {
    if r.u16()? != ALG_NULL {
        r.u16()?;
    }
    Ok(())
}

/// Big-endian fields of a TPM structure, every read bounded.
pub(crate) struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
    what: &'static str,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(bytes: &'a [u8], what: &'static str) -> Self {
        Reader { bytes, at: 0, what }
    }

    pub(crate) fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.bytes.len());
        let Some(end) = end else {
            return Err(Error::Truncated {
                what: self.what,
                at: self.at,
            });
        };
        let out = &self.bytes[self.at..end];
        self.at = end;
        Ok(out)
    }

    pub(crate) fn u16(&mut self) -> Result<u16> {
        let b = self.take(2)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }

    pub(crate) fn u32(&mut self) -> Result<u32> {
        let b = self.take(4)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    /// Little-endian, as firmware writes its event log.
    pub(crate) fn u16_le(&mut self) -> Result<u16> {
        let b = self.take(2)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }

    pub(crate) fn u32_le(&mut self) -> Result<u32> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.at == self.bytes.len()
    }

    /// A TPM2B: a u16 size, then that many bytes.
    pub(crate) fn sized(&mut self) -> Result<&'a [u8]> {
        let n = self.u16()?;
        self.take(usize::from(n))
    }

    pub(crate) fn end(&self) -> Result<()> {
        match self.bytes.len() - self.at {
            0 => Ok(()),
            extra => Err(Error::Trailing {
                what: self.what,
                extra,
            }),
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The TCG's default RSA 2048 EK template (EK credential profile, template L-1) with
    /// `modulus` in its unique field, as a TPM2B_PUBLIC.
    pub(crate) fn rsa_ek(modulus: &[u8]) -> Vec<u8> {
        let mut t = Vec::new();
        t.extend_from_slice(&ALG_RSA.to_be_bytes());
        t.extend_from_slice(&ALG_SHA256.to_be_bytes());
        t.extend_from_slice(&0x0003_00b2u32.to_be_bytes());
        t.extend_from_slice(&32u16.to_be_bytes());
        t.extend_from_slice(&[0x83; 32]);
        t.extend_from_slice(&ALG_AES.to_be_bytes());
        t.extend_from_slice(&128u16.to_be_bytes());
        t.extend_from_slice(&ALG_CFB.to_be_bytes());
        t.extend_from_slice(&ALG_NULL.to_be_bytes());
        t.extend_from_slice(&2048u16.to_be_bytes());
        t.extend_from_slice(&0u32.to_be_bytes());
        t.extend_from_slice(&(modulus.len() as u16).to_be_bytes());
        t.extend_from_slice(modulus);
        let mut b = (t.len() as u16).to_be_bytes().to_vec();
        b.extend(t);
        b
    }

    #[test]
    fn an_ek_template_parses_and_names_itself() {
        let bytes = rsa_ek(&[0xC5; 256]);
        let ek = Public::from_tpm2b(&bytes).unwrap();
        assert_eq!(ek.check_endorsement_key(), Ok(Symmetric { key_bits: 128 }));
        assert!(ek.check_attestation_key().is_err(), "an EK decrypts");
        let name = ek.name();
        assert_eq!(name[..2], [0x00, 0x0B]);
        assert_eq!(name[2..], Sha256::digest(&bytes[2..])[..]);
    }

    #[test]
    fn malformed_public_areas_are_refused_without_panic() {
        let good = rsa_ek(&[0xC5; 256]);
        for cut in 0..good.len() {
            assert!(Public::from_tpm2b(&good[..cut]).is_err(), "cut at {cut}");
        }
        let mut trailing = good.clone();
        trailing.push(0);
        assert!(matches!(
            Public::from_tpm2b(&trailing),
            Err(Error::Trailing { .. })
        ));
        let mut sha1 = good.clone();
        sha1[4..6].copy_from_slice(&0x0004u16.to_be_bytes());
        assert!(
            Public::from_tpm2b(&sha1)
                .unwrap_err()
                .to_string()
                .starts_with("nameAlg")
        );
        let short = rsa_ek(&[0xC5; 128]);
        assert!(matches!(
            Public::from_tpm2b(&short),
            Err(Error::Unsupported {
                what: "RSA key",
                ..
            })
        ));
        assert!(Public::from_tpm2b(&vec![0; MAX_PUBLIC_BYTES + 1]).is_err());
    }
}

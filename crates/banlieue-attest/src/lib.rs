//! The consumer's side of banlieue's attested handover (issue: the subject proves which VM it
//! got): everything here runs where the claim's subject runs, trusts nothing banlieue's
//! controller or provider says, and depends on no part of the operator.
//!
//! - [`public`]: TPM 2.0 public areas as a guest's TPM marshals them (TPM2B_PUBLIC), parsed
//!   strictly: an endorsement key's, an attestation key's, and the Name that identifies each.
//! - [`kdf`]: the TPM's key derivation functions, KDFa (HMAC counter mode) and KDFe (the
//!   ECDH one).
//! - [`credential`]: `TPM2_MakeCredential`'s computation, done here rather than by a TPM: a
//!   secret only the TPM holding the endorsement key can release, and only to the attestation
//!   key named. The proof that an AK lives in the TPM whose EK certificate was vouched for.
//! - [`quote`]: a `TPM2_Quote` by that AK checked: its signature, the verifier's own extra
//!   data in it (fresh, this claim's), and the PCR values it covers.
//! - [`seal`]: a payload sealed to a credential's secret, so that only the VM whose TPM
//!   activates it can open it.
//! - [`boot`]: PCR 4 and PCR 5 computed from a disk image before any boot (its boot chain's
//!   Authenticode digests and its partition table), the reference values a quote of a boot
//!   of that image must show.
//! - [`verify`]: the whole handover as the subject checks it from its claim: the EK
//!   certificate's chain to the trust bundle, the challenge, and the answer.
//!
//! Sans-io: bytes in, bytes out; the randomness is the caller's.

pub mod boot;
pub mod credential;
pub mod event_log;
pub mod kdf;
pub mod public;
pub mod quote;
pub mod seal;
pub mod verify;

pub use credential::{Credential, make_credential};
pub use public::{Public, PublicKey};
pub use quote::{Quote, QuoteError, binding, extra_data, verify_quote};
/// The randomness [`make_credential`] takes (`rand_core::OsRng`).
pub use rsa::rand_core;
pub use verify::{AnswerView, Challenge, ClaimView, PcrReferences, Verified, VerifyError};

/// Why an input was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Error {
    /// The bytes end before the structure does.
    #[error("{what} is cut short at byte {at}")]
    Truncated { what: &'static str, at: usize },
    /// Bytes follow a complete structure.
    #[error("{what} has {extra} bytes after its end")]
    Trailing { what: &'static str, extra: usize },
    /// A field holds a value this crate does not handle (an algorithm, a curve, a size).
    #[error("{what}: {why}")]
    Unsupported { what: &'static str, why: String },
    /// The key's attributes are not those its role requires.
    #[error("{0}")]
    Attributes(String),
    /// A cryptographic operation failed (a key that does not encrypt).
    #[error("{0}")]
    Crypto(String),
}

/// Results of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

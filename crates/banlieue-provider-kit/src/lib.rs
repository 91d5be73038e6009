//! The provider kit: what every backend of banlieue (libvirt, vSphere, the next one) shares, so
//! that a contract or a security check is written once (ADR-0071).
//!
//! - [`descriptor`]: a backend as one value, which the binary lists;
//! - [`error`]: the failures every backend shares ([`error::Core`]) and their reasons;
//! - [`guest`]: the guest-phase layer's contract (the phase a guest reports, its EK
//!   certificates) and the GuestReady condition that follows from it;
//! - [`user_data`]: which Secret a machine's `userDataSecretRef` may name, and reading it;
//! - [`credentials`]: reading the Secret keys and CA bundle a Provider names, bounded;
//! - [`machine`]: the one machine reconcile (finalizer, realise, status, deadline, backoff)
//!   around what a backend implements ([`machine::Backend`]);
//! - [`machine_status`]: the contract half of a machine's status after a reconcile, from what
//!   a backend observed;
//! - [`provider_status`]: a Provider's status loop (probe, Ready condition and failure
//!   domains, published only when they change) around what a backend probes
//!   ([`provider_status::Probe`]);
//! - [`narrow`]: narrowing a declaration to the targets a failure domain has;
//! - [`import_settings`]: where a ProviderClass's image imports run;
//! - [`image_zones`]: a provider's entry of a VMImage's per-provider status;
//! - [`workload_names`]: the names of a Provider's workload objects;
//! - [`standby`]: what a machine's status says of a saved or running machine (ADR-0073);
//! - [`session`]: a backend's one connection, opened on first use and replaced once lost;
//! - [`pump`]: following a backend's change feed into wake-ups of the machine reconcile,
//!   resubscribing on a [`backoff::Backoff`].
//!
//! Everything here is backend-neutral: a backend says how it observes a guest (an agent
//! channel, guestinfo variables) and the kit says what the observation means.

// A function longer than clippy.toml's threshold does two things; tests may be long.
#![cfg_attr(not(test), deny(clippy::too_many_lines))]

pub mod access;
pub mod backoff;
pub mod credentials;
pub mod descriptor;
pub mod error;
pub mod guest;
pub mod handover;
pub mod image_zones;
pub mod import_settings;
pub mod machine;
pub mod machine_status;
pub mod narrow;
pub mod provider_status;
pub mod pump;
pub mod session;
pub mod standby;
pub mod user_data;
pub mod workload_names;

/// The first retry of an object after a failed reconcile, in every provider reconciler (the
/// machine reconcile, the operator, a backend's probe); each further failure doubles it up to
/// [`MAX_ERROR_BACKOFF`], and a success starts over.
pub const MIN_ERROR_BACKOFF: std::time::Duration = std::time::Duration::from_secs(5);
/// The longest wait before retrying a failing object.
pub const MAX_ERROR_BACKOFF: std::time::Duration = std::time::Duration::from_secs(60);

pub use banlieue_runtime::reconcile::ErrorBackoff;

/// The per-object error backoff of a provider reconciler.
pub fn error_backoff() -> ErrorBackoff {
    ErrorBackoff::new(MIN_ERROR_BACKOFF, MAX_ERROR_BACKOFF)
}

/// Condition reasons every provider reports the same way, beside the shared ones in
/// `banlieue_api::conditions::reasons`.
pub mod reasons {
    /// `userDataSecretRef` names a Secret that may not be read for user-data: it does not opt
    /// in, its Provider references it (credentials or CA source), or it holds credentials.
    pub const USER_DATA_SECRET_REFUSED: &str = "UserDataSecretRefused";
    /// The Provider's class realises a machine kind no provider of this build runs.
    pub const UNSUPPORTED_MACHINE_KIND: &str = "UnsupportedMachineKind";
}

//! VirtualMachineClaims: [`decide`] orders bind candidates and words the claim's messages,
//! `reconcile` binds, renews and releases.

pub mod decide;
pub(crate) mod reconcile;

//! VMImage import on libvirt (the guide's section 4, ADR-0010, ADR-0016, ADR-0060).
//!
//! Two roles share this module:
//! - [`jobs`]: inside the per-Provider workload, a reconcile that creates one import Job per
//!   storage pool once the build artifact is Ready, mirrors the Jobs into
//!   `status.perProvider[]`, and checks BackingFile volumes;
//! - [`import`]: the command those Jobs run, which streams the artifact into a volume.
//!
//! The decisions are pure functions in [`decide`] and [`marker`]; libvirt calls go through
//! `banlieue-libvirt`'s handles. TLS material comes from [`crate::connection`], shared with the
//! Provider reconcile.

pub mod decide;
pub mod error;
pub mod import;
pub mod jobs;
pub mod marker;
pub mod progress;

pub use error::{Error, Result};
pub use import::{ImportArgs, ImportOutcome, run_import};
pub use jobs::{ImageReconcilerConfig, run_image_reconciler};

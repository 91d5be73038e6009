//! The banlieue binary's subcommands, as a library so integration tests drive them directly.

// A product function stays under clippy.toml's line limit (tests may be longer).
#![cfg_attr(not(test), deny(clippy::too_many_lines))]

pub mod apply;
pub mod artifacts_volume;
pub mod backends;
pub mod bootstrap;
pub mod cidata;
pub mod claim_cli;
pub mod claim_verify;
pub mod image_pcrs;
#[cfg(feature = "libvirt")]
pub mod libvirt;
pub mod login;
pub mod manifests;
pub mod observe;
pub mod roles;
pub mod supported_kubernetes;

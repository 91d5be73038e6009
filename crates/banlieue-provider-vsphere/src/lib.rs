//! banlieue's vSphere provider, the workload of one vSphere Provider: its readiness and
//! failure domains ([`provider_status`]) and the realisation of VSphereMachines as VMs cloned
//! from a template ([`machine`]).
//!
//! It speaks to vCenter only through `banlieue-vsphere` and to the controller only through the
//! VSphereMachine object (ADR-0050, ADR-0069).

// A function longer than clippy.toml's threshold does two things; tests may be long.
#![cfg_attr(not(test), deny(clippy::too_many_lines))]

pub mod backend;
pub mod connection;
pub mod error;
pub mod image_status;
pub mod machine;
pub mod narrow;
pub mod provider_status;
pub mod session;
pub mod template;

pub use error::{Error, Result};

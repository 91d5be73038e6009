//! banlieue's libvirt provider: the workload the Provider operator (in
//! `banlieue-provider-kit`) runs for a libvirt Provider: the Provider's readiness
//! ([`provider_status`]), the realisation of LibvirtMachines as libvirt domains ([`machine`]),
//! image imports ([`image`]) and the network filter that holds a machine to its egress policy
//! ([`egress_filter`]).
//!
//! It speaks to libvirt only through `banlieue-libvirt` and to the controller only through
//! the LibvirtMachine object.

// A function longer than clippy.toml's threshold does two things; tests may be long.
#![cfg_attr(not(test), deny(clippy::too_many_lines))]

pub mod backend;
pub mod connection;
pub mod domain_type;
pub mod domain_xml;
pub mod egress_filter;
pub mod error;
pub mod image;
pub mod machine;
pub mod metrics;
pub mod names;
pub mod provider_status;
pub use banlieue_api::quantity;
pub mod volume_xml;

pub use error::{Error, Result};

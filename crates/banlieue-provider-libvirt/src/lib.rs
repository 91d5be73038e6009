//! banlieue's libvirt provider: the workload the Provider operator (in
//! `banlieue-provider-kit`) runs for a libvirt Provider: the Provider's readiness
//! ([`provider_status`]), the realisation of LibvirtMachines as libvirt domains ([`machine`])
//! and image imports ([`image`]).
//!
//! It speaks to libvirt only through `banlieue-libvirt` and to the controller only through
//! the LibvirtMachine object.

pub mod backend;
pub mod connection;
pub mod domain_type;
pub mod domain_xml;
pub mod error;
pub mod image;
pub mod machine;
pub mod metrics;
pub mod names;
pub mod provider_status;
pub use banlieue_api::quantity;
pub mod volume_xml;

pub use error::{Error, Result};

//! A vSphere client speaking vim25 SOAP over HTTPS: the typed subset banlieue's vSphere
//! provider needs (session, PropertyCollector, inventory, clone / reconfigure / power /
//! destroy tasks, the VM properties a provider reads). See docs/vsphere-client.md.
//!
//! The core is pure: [`methods`] builds each request's envelope, [`xml`] parses a response
//! into a bounded tree, and the types decode from it. [`Client`] is a thin async shell
//! that POSTs to `/sdk` with the session cookie.
//!
//! ```no_run
//! # async fn demo(ca_pem: &str) -> banlieue_vsphere::Result<()> {
//! use banlieue_vsphere::{Client, Credentials};
//! let client = Client::connect("https://vcenter.example/sdk", ca_pem,
//!     Credentials::new("administrator@vsphere.local", "secret")).await?;
//! for dc in client.datacenters().await? {
//!     for cluster in client.clusters(&dc.moref).await? {
//!         println!("{} / {}", dc.name, cluster.name);
//!     }
//! }
//! # Ok(()) }
//! ```

// A product function stays under clippy.toml's line limit (tests may be longer).
#![cfg_attr(not(test), deny(clippy::too_many_lines))]
#![deny(missing_docs)]

mod client;
#[cfg(test)]
mod decode_tests;
mod error;
pub mod methods;
mod moref;
pub mod property;
pub mod soap;
pub mod types;
pub mod xml;

pub use client::{BODY_LIMIT, CLIENT_API_VERSION, Client, Credentials, KeepAlive, SESSION_COOKIE};
pub use error::{Error, Fault, Result};
pub use moref::ManagedObjectRef;
pub use property::{
    ChangeOp, ObjectContent, ObjectSpec, ObjectUpdate, ObjectUpdateKind, PropertyChange,
    PropertyFilterSpec, PropertySpec, PropertyValue, UpdateSet, extra_config_path,
};
pub use types::{
    About, CloneSpec, Cluster, Datacenter, GuestNic, PowerState, ReconfigSpec, ServiceContent,
    TaskInfo, TaskState, UserSession, VmInfo,
};

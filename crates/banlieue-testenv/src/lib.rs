//! Real peers for tests: a kube control plane (optionally with a node that runs pods), a
//! libvirtd, started on loopback and stopped by PID, and the guest image they boot. The
//! tests' dev-dependency, and `banlieue-dev`'s (`dev up`): the product crate never links it
//! (docs/guides/image.md). Its `local-cluster` binary runs the same peers for a person
//! (`scripts/control-plane start`).

use std::path::{Path, PathBuf};

pub mod access;
pub mod agent_sandbox;
pub mod claim_load;
pub mod control_plane;
pub mod egress_world;
pub mod guest_agent;
pub mod guest_image;
pub mod guest_network;
mod janitor;
pub mod libvirtd;
pub mod manifests;
pub mod node;
pub mod oidc;
mod pki;
pub mod poll;
mod ports;
pub mod registry;
mod spawner;
pub mod ssh_keys;
pub mod vcsim;

/// Whether `pid` is a live process. A zombie awaiting its reaper does not count: it holds
/// nothing, and for a daemonized process its reaper is not ours.
pub fn is_running(pid: u32) -> bool {
    libvirtd::process::is_running(pid, 0)
}

/// `relative` inside the repository (manifests, docs, scripts), for tests in any crate.
pub fn repo_path(relative: impl AsRef<Path>) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(relative)
}

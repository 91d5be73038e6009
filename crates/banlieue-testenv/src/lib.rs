//! Real peers for tests: a kube control plane (optionally with a node that runs pods) and a
//! libvirtd, started on loopback and stopped by PID. A dev-dependency only; nothing in the
//! product links it.

pub mod access;
pub mod control_plane;
pub mod libvirtd;
pub mod node;

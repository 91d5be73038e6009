//! VirtualMachinePools: [`decide`] is the pure decision over a pool's snapshot (ADR-0058),
//! `reconcile` reads the snapshot and carries the decision out.

pub mod decide;
pub(crate) mod reconcile;
